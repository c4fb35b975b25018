"""Why ``import shmpool`` failed when the folder Python found is the repository's source tree.

The repository keeps ``workers/`` beside ``shmpool/`` (an install maps it to ``shmpool.workers``) and builds
the compiled modules (``shmpool._core``...) at install time.  So Python started in the repository root, whose
``shmpool/`` folder comes first on ``sys.path``, imports the bare source tree: it shadows an installed
shmpool, has no ``shmpool.workers`` and, in a fresh clone, no built extension.  An editable install
(``pip install -e .``) maps and builds both in place, so the tree then imports from anywhere.
"""
from __future__ import annotations

import sys
from importlib.machinery import PathFinder
from pathlib import Path

# What marks a folder as the repository root rather than an installed package's site-packages.
_ROOT_MARKS = ("pyproject.toml", "setup.py", "workers")


def source_root(package_dir: Path) -> Path | None:
    """The repository root when ``package_dir`` (the imported ``shmpool/`` folder) is its source tree."""
    root = package_dir.resolve().parent
    return root if all((root / mark).exists() for mark in _ROOT_MARKS) else None


def _installed_elsewhere(root: Path) -> str | None:
    """Where another shmpool on ``sys.path`` (the installed one this tree shadows) lives, if there is one."""
    others = [entry for entry in sys.path if Path(entry or ".").resolve() != root]
    spec = PathFinder.find_spec("shmpool", others)
    return spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None


def explain(exc: ModuleNotFoundError, package_dir: Path) -> None:
    """Raise an ImportError naming the cause and the fix when ``exc`` (a module of shmpool not found
    while importing it) comes from importing the source tree; return otherwise (the caller re-raises)."""
    root = source_root(package_dir)
    if root is None or not (exc.name or "").startswith("shmpool."):
        return
    if exc.name.startswith("shmpool.workers"):
        missing = (f"it has no {exc.name} (that package is the folder {root / 'workers'}, which only an "
                   "installed shmpool maps there)")
    else:
        missing = f"it has no built extension ({exc.name}: the compiled modules are built by pip install)"
    installed = _installed_elsewhere(root)
    shadows = f"; it shadows the installed shmpool at {installed}" if installed else ""
    raise ModuleNotFoundError(
        f"import shmpool found the folder {package_dir}, the source tree of the repository at {root} (that folder "
        f"is on sys.path, as the current directory is), not an installed shmpool: {missing}{shadows}. "
        f"Run Python from another folder, or install this tree in place with `pip install -e {root}`, which "
        "builds the extensions here and maps shmpool.workers.", name=exc.name) from exc
