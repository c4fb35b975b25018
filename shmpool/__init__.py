"""shmpool: many RL environments in pinned worker processes, batched through shared memory."""
from ._core import WaitPolicy
from .batched import Batched, BatchEnv
from .errors import EnvError, PoolClosedError, ShmpoolError, WorkerDiedError, WorkerRestartedError
from .pool import Pool
from .topology import allowed_cpus, parse_cpu_list
from .vector import VectorEnv, list_tasks, make, make_vec

__version__ = "0.1.0"

__all__ = [
    "BatchEnv",
    "Batched",
    "EnvError",
    "Pool",
    "PoolClosedError",
    "ShmpoolError",
    "WaitPolicy",
    "VectorEnv",
    "WorkerDiedError",
    "WorkerRestartedError",
    "__version__",
    "allowed_cpus",
    "list_tasks",
    "make",
    "make_vec",
    "parse_cpu_list",
]
