"""Libraries kept out of the test process until the tests that need them run (issue 60's fast suite).

A pool forks its workers from the process that builds it, and ``fork`` copies that process's page
tables: on these machines a fork costs ~2.5 ms beside numpy and gymnasium, ~6 ms once envpool or Ray is
imported and ~10 ms once torch is (SB3 imports it), and every worker then takes copy-on-write faults on
that heap.  About a thousand fast tests start pools, so a test module that imported torch at collection
made every one of them dearer (a third of the suite ran 19 % slower, its system time up by half).

So:

- a module whose tests need one of ``HEAVY`` skips without importing it (``require``) and reaches its
  names through ``names`` or ``module`` (imported on first use), never at module level;
- the tests that do import one carry the ``heavy_imports`` mark, and ``conftest.py`` runs them after
  the rest (``run_last``);
- ``conftest.py`` fails a test without the mark that leaves one of them loaded (``loaded``), and
  ``tests/project/test_structure.py`` fails when collecting the suite loaded one.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

# The libraries, by top-level module, whose weight in the test process makes its forks dearer.
HEAVY = ("torch", "ray", "stable_baselines3", "envpool", "tensorflow", "jax")

MARK = "heavy_imports"
# What collection found loaded, for tests/project/test_structure.py (set by conftest.py).
AT_COLLECTION = pytest.StashKey[tuple]()


def loaded() -> tuple[str, ...]:
    """Which of ``HEAVY`` this process has imported."""
    return tuple(name for name in HEAVY if name in sys.modules)


def newly_loaded(nodeid: str, before: tuple[str, ...]) -> str | None:
    """What to say when a test without the mark left one of ``HEAVY`` loaded that was not before it."""
    new = [name for name in loaded() if name not in before]
    if not new:
        return None
    return (f"{nodeid} imported {', '.join(new)} into the test process: mark it @pytest.mark.{MARK} so that "
            "it runs after the tests that fork pools (tests/heavy_imports.py)")


def require(name: str) -> None:
    """Skip the calling test module when ``name`` (a top-level module) is not installed, as
    ``pytest.importorskip`` does, but without importing it."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"could not import {name!r}: not installed", allow_module_level=True)


class names:
    """Names from heavy modules, imported on first use: ``sb3 = names(DummyVecEnv="stable_baselines3.common.vec_env")``
    then ``sb3.DummyVecEnv`` inside a test."""

    def __init__(self, **modules: str) -> None:
        self._modules = modules

    def __getattr__(self, name: str):
        try:
            module = self.__dict__["_modules"][name]
        except KeyError:
            raise AttributeError(name) from None
        value = getattr(importlib.import_module(module), name)
        setattr(self, name, value)   # found once; later lookups never reach __getattr__
        return value


class module:
    """A module imported on its first attribute read or write: ``ray = module("ray")`` then ``ray.get``
    inside a test; ``monkeypatch.setattr`` on it patches the module itself."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _module(self):
        name = object.__getattribute__(self, "_name")
        try:
            return importlib.import_module(name)
        except AttributeError as exc:
            # getattr(proxy, attr, default) (monkeypatch.setattr's read of the old value) and hasattr take any
            # AttributeError for a missing name: one raised by the import would read "has no attribute 'attr'"
            raise ImportError(f"importing {name} failed: {exc!r}", name=name) from exc

    @property
    def __dict__(self):
        # The module's namespace: pytest 9.2's monkeypatch reads the old value from the target's ``__dict__``
        # (and restores it from there); the proxy's own would hold no name, so undo deleted the module's.
        return vars(self._module())

    def __getattr__(self, attr: str):
        if attr.startswith("_"):   # pytest's probes of a module's names at collection (``__test__``...)
            raise AttributeError(attr)
        return getattr(self._module(), attr)

    def __setattr__(self, attr: str, value) -> None:
        setattr(self._module(), attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self._module(), attr)


def run_last(items: list) -> None:
    """Move the items marked ``heavy_imports`` after the others, each group in its own order."""
    items.sort(key=lambda item: item.get_closest_marker(MARK) is not None)
