"""``BatchPong`` and ``PongEnv`` under their first import path; they live with the other
built-in tasks in ``shmpool.workers.recipes.batch_pong``."""
from shmpool.workers.recipes.batch_pong import BatchPong, PongEnv

__all__ = ["BatchPong", "PongEnv"]
