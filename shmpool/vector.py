"""shmpool's gymnasium face: ``VectorEnv``, ``make_vec``, EnvPool-style ``make``.

Importing this module registers gymnasium's Atari ids when ale-py is installed
(:func:`register_ale_ids`: every face then knows ``ALE/Pong-v5`` on its first call,
whatever was called before), then a ``shmpool/<id>`` twin of every gymnasium id
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
    register_ale_ids,
    register_envs,
    register_recipes,
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
    "register_ale_ids",
    "register_envs",
    "register_recipes",
    "register_task",
    "twin_id",
    "vector_entry_point",
]

register_ale_ids()   # first: their twins are registered below with every other id
register_envs()
register_recipes()   # after the twins: a recipe takes shmpool/<id> only where gymnasium has no <id>
