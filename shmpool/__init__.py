"""shmpool: many RL environments in pinned worker processes, batched through shared memory."""
from ._core import WaitPolicy
from .errors import EnvError, PoolClosedError, ShmpoolError, WorkerDiedError
from .pool import Pool
from .topology import allowed_cpus, parse_cpu_list
from .vector import VectorEnv, list_tasks, make, make_vec

__version__ = "0.1.0"

__all__ = [
    "EnvError",
    "Pool",
    "PoolClosedError",
    "ShmpoolError",
    "WaitPolicy",
    "VectorEnv",
    "WorkerDiedError",
    "__version__",
    "allowed_cpus",
    "list_tasks",
    "make",
    "make_vec",
    "parse_cpu_list",
]
