"""Envs that ship with shmpool: ``BatchPong`` (a numpy-batched Pong) and its one-env twin ``PongEnv``."""
from .batch_pong import BatchPong, PongEnv

__all__ = ["BatchPong", "PongEnv"]
