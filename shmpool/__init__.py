"""shmpool: many RL environments in pinned worker processes, batched through shared memory."""
# Started in the repository root, Python finds the source folder first: say so rather than a bare
# "No module named 'shmpool._core'" or 'shmpool.workers' (shmpool/source_tree.py).
try:
    from ._core import WaitPolicy
    from .batched import Batched, BatchEnv
    from .errors import (
        EnvError,
        PoolClosedError,
        PoolResourceError,
        ShmpoolError,
        SpacesDifferError,
        WorkerDiedError,
        WorkerRestartedError,
    )
    from .pool import Pool
    from .topology import allowed_cpus, parse_cpu_list
    from .vector import VectorEnv, list_tasks, make, make_vec
except ModuleNotFoundError as exc:
    from pathlib import Path

    from .source_tree import explain

    explain(exc, Path(__file__).parent)   # raises when this folder is the source tree
    raise

__version__ = "0.1.0"

# The optional faces load on first use, so ``shmpool.sb3.ShmVecEnv`` works after ``import shmpool``
# without making SB3 or Ray a dependency of ``import shmpool``.
_OPTIONAL_FACES = ("sb3", "distributed")
# Names the docs use at the top level whose module needs an extra: loaded on first read, never by `import *`.
_OPTIONAL_NAMES = {"ShmVecEnv": ("sb3", "sb3")}   # name -> (module, extra)


def __getattr__(name: str):
    import importlib

    if name in _OPTIONAL_FACES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _OPTIONAL_NAMES:
        module, extra = _OPTIONAL_NAMES[name]
        try:
            face = importlib.import_module(f"{__name__}.{module}")
        except ImportError as exc:
            raise ImportError(f"shmpool.{name} (shmpool.{module}.{name}) needs the [{extra}] extra: "
                              f'pip install "shmpool[{extra}]"', name=f"{__name__}.{module}") from exc
        return getattr(face, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BatchEnv",
    "Batched",
    "EnvError",
    "Pool",
    "PoolClosedError",
    "PoolResourceError",
    "ShmpoolError",
    "SpacesDifferError",
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
