"""shmpool's gymnasium face: ``VectorEnv``, ``make_vec``, EnvPool-style ``make``.

Importing this module registers a ``shmpool/<id>`` twin of every gymnasium id
(see :func:`register_envs`), so that ``gymnasium.make_vec("shmpool/CartPole-v1",
num_envs=8)`` builds a shmpool :class:`VectorEnv`; gymnasium's "module:id" form,
``gymnasium.make_vec("shmpool.vector:shmpool/CartPole-v1", 8)``, works without
importing shmpool first.
"""
from .gymnasium_face import VectorEnv, WaitTimeoutError
from .registration import (
    TWIN_NAMESPACE,
    list_tasks,
    make,
    make_vec,
    register_envs,
    register_task,
    twin_id,
    vector_entry_point,
)

__all__ = [
    "TWIN_NAMESPACE",
    "VectorEnv",
    "WaitTimeoutError",
    "list_tasks",
    "make",
    "make_vec",
    "register_envs",
    "register_task",
    "twin_id",
    "vector_entry_point",
]

register_envs()
