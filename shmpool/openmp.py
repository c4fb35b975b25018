"""The trainer's OpenMP threads: how long they spin after each parallel region.

torch's CPU build runs its ops on a libgomp team; after each op its helper threads spin for
``GOMP_SPINCOUNT`` iterations (libgomp's default: 300,000 with ``OMP_WAIT_POLICY`` unset, a few
milliseconds here) before they sleep.  Beside a pool those threads sit on the cores the workers
need, and they spin through every step of the envs.  libgomp reads the setting once, when it
loads (``import torch``), so the pool can only choose it if it is imported first.

``tune_at_import`` (run by ``import shmpool``) sets ``GOMP_SPINCOUNT`` when nothing has loaded an
OpenMP runtime yet and the user has set none of the settings below: the count that spins
``SPIN_TIME_S`` on this CPU, whose spin-wait hint it times (the measured time and why are in
docs/performance.md).  ``SHMPOOL_NO_OMP_TUNING=1`` turns it off.  When it could not act
(OpenMP was loaded first), ``advice`` words the one line that fixes it, for the pool to say once.
"""
from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from . import _spin
from .errors import PerformanceWarning

OPT_OUT = "SHMPOOL_NO_OMP_TUNING"
SPIN_VARIABLE = "GOMP_SPINCOUNT"
MARK = "SHMPOOL_SET_GOMP_SPINCOUNT"   # set beside it, so a child process knows the value was ours
# How long libgomp's threads should spin before they sleep.  Swept as GOMP_SPINCOUNT on AMD EPYC
# vCPUs (a spin-wait hint, x86 ``pause``, timed at 24-28 ns there) in CleanRL's ppo.py and
# ppo_continuous_action.py on 2 cores (docs/performance.md): 10,000 (~0.25 ms) and less slow torch's
# own ops where the envs run in this process (CartPole); 100,000 (~2.5 ms) outlasts an Ant-v5 step,
# so torch's helper spins on the worker's core through it (Ant N=8 0.76-0.92x SyncVectorEnv).
# 30,000 (~0.75 ms): Ant N=8 1.08-1.17x, N=32 1.50x, CartPole N=8 0.99-1.19x, but CartPole N=32
# 0.81-0.94x (it prefers 50,000-100,000): no one value serves every cell.  A count is a time only
# on one CPU (a ``pause`` takes a few ns on older Intel, ~40 on newer), so the count is worked out
# here from the time.
SPIN_TIME_S = 0.75e-3
SPIN_BOUNDS = (3_000, 300_000)   # a clamp for a timing gone wrong; never past libgomp's own default
# Settings that say the user chose how OpenMP waits: any of them, and the pool sets nothing.
USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "KMP_BLOCKTIME")
RUNTIMES = ("libgomp", "libiomp", "libomp")   # GNU, Intel and LLVM OpenMP as they appear in /proc/self/maps


@dataclass(frozen=True)
class OpenMPTuning:
    """What ``import shmpool`` did about the trainer's OpenMP spin, and why."""

    action: str        # "set", "opted out", "user setting", "too late"
    detail: str        # a sentence for ``repr(pool)`` and the docs

    @property
    def too_late(self) -> bool:
        return self.action == "too late"


def loaded_runtime(maps_path: str = "/proc/self/maps") -> str | None:
    """The OpenMP runtime this process has mapped (its file name), or None."""
    try:
        with open(maps_path) as f:
            for line in f:
                name = line.rsplit("/", 1)[-1].strip()
                if name.startswith(RUNTIMES):
                    return name
    except OSError:   # no /proc: nothing can be told, so nothing is claimed
        return None
    return None


@functools.cache
def _relax_s() -> float:
    # The least of 40 short timings: ~1 ms once per process, and one unpreempted timing is enough.
    return _spin.relax_ns(1_000, 40) * 1e-9


def spin_count_for(relax_s: float, seconds: float = SPIN_TIME_S) -> int:
    """The ``GOMP_SPINCOUNT`` that spins ``seconds`` on a CPU whose spin-wait hint takes ``relax_s``
    seconds, in thousands (a value a user can read and repeat), within ``SPIN_BOUNDS``."""
    lo, hi = SPIN_BOUNDS
    if relax_s <= 0:   # a clock too coarse to time it: libgomp's own count
        return hi
    return max(lo, min(hi, 1000 * round(seconds / relax_s / 1000)))


def chosen_spin_count() -> int:
    """The count ``import shmpool`` sets on this CPU (it times the CPU's spin-wait hint once)."""
    return spin_count_for(_relax_s())


def tune_at_import(environ=os.environ, maps_path: str = "/proc/self/maps",
                   count: Callable[[], int] = chosen_spin_count) -> OpenMPTuning:
    """Set ``GOMP_SPINCOUNT`` for an OpenMP runtime loaded later, unless the user said otherwise."""
    if environ.get(OPT_OUT, "").strip() not in ("", "0"):
        return OpenMPTuning("opted out", f"{OPT_OUT} is set: OpenMP's spin left at its default")
    if MARK in environ and environ.get(SPIN_VARIABLE) == environ[MARK]:
        return OpenMPTuning("set", f"{SPIN_VARIABLE}={environ[MARK]} set by shmpool in a parent process "
                                   f"({OPT_OUT}=1 turns this off)")
    chosen = [f"{name}={environ[name]}" for name in USER_SETTINGS if name in environ]
    if chosen:
        return OpenMPTuning("user setting", f"{', '.join(chosen)} as the user set it")
    runtime = loaded_runtime(maps_path)
    if runtime is not None:
        return OpenMPTuning("too late", f"{runtime} was loaded before shmpool: its spin count stays at the default")
    value = count()
    environ[SPIN_VARIABLE] = environ[MARK] = str(value)
    return OpenMPTuning("set", f"{SPIN_VARIABLE}={value} (~{SPIN_TIME_S * 1e3:.2g} ms on this CPU) set for OpenMP "
                               f"runtimes loaded after shmpool ({OPT_OUT}=1 turns this off)")


TUNING = tune_at_import()


def advice(torch_threads: int | None, tuning: OpenMPTuning = TUNING) -> str | None:
    """What to tell a user whose torch threads spin beside the pool's workers, or None when
    nothing is wrong (the pool set the spin count, the user chose one, or torch runs one thread)."""
    if not tuning.too_late or torch_threads is None or torch_threads < 2:
        return None
    return (f"torch runs {torch_threads} OpenMP threads that keep spinning for milliseconds after every op, on "
            f"the cores this pool's workers step envs on ({tuning.detail}); in CleanRL's PPO on 2 cores that "
            f"cost the pool about a third of its speed (docs/performance.md). Fix: `import shmpool` before "
            f"`import torch`, or start Python with {SPIN_VARIABLE}={chosen_spin_count()} in the environment "
            f"({OPT_OUT}=1 silences this).")


_ADVISED = False   # advise_once gave its advice in this process


def advise_once(torch_threads: int | None, has_processes: bool, stacklevel: int = 2) -> None:
    """Once per process, when a pool with worker processes is built: torch's threads spin on the
    workers' cores and the spin count could not be set; say what it costs and the line that fixes it."""
    global _ADVISED
    text = advice(torch_threads) if has_processes else None
    if text is not None and not _ADVISED:
        _ADVISED = True
        warnings.warn(text, PerformanceWarning, stacklevel=stacklevel + 1)
