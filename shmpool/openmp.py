"""The trainer's OpenMP threads beside a pool's worker processes.

torch's CPU build runs its ops on a libgomp team; after each op its helper threads spin
(``GOMP_SPINCOUNT``, 300,000 rounds by default: ~8 ms on these vCPUs) before they sleep.  Where
every env steps in the trainer's process, that long spin is what torch's own ops want: a shorter
one makes each op pay a wake-up.  Where worker processes step the envs on the same cores, the
spinning helpers take the cores the workers need.  So the right spin depends on the pool, which
exists only after torch has loaded libgomp and read its setting.

libgomp has one rule it checks at every wait, though: while it manages more threads than the CPUs
it saw when it loaded, every wait spins only a few rounds (100) before it sleeps.  While a pool
with worker processes is being stepped, :class:`QuietSpin` keeps one parked thread that owns a
team of ``cpus + 1`` idle libgomp threads: libgomp counts more threads than CPUs, and torch's
helpers go to sleep right after each op.  When no step came for ``IDLE_S`` (the trainer's update)
or the last such pool closes, the thread ends, its team goes, and libgomp's own spin is back.
This works whatever was imported first.

It acts only on GNU OpenMP already loaded (loading one itself could bind torch to another copy),
never when the user set any of ``USER_SETTINGS``, and ``SHMPOOL_NO_OMP_TUNING=1`` turns it off.
Intel's runtime has no such rule, and measured, needs none: in CleanRL's Ant-v5 N=32 with it preloaded,
``KMP_BLOCKTIME=0`` changed nothing (1.51k, 1.59k, 1.60k SPS against 1.46k, 1.62k, 1.69k without; its
waiting threads give way).  So the pool leaves it alone, and LLVM's (the same runtime's open form,
not measured) likewise, and says so in its repr.
Measured in CleanRL's scripts, and why not a count set at import: docs/performance.md.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

OPT_OUT = "SHMPOOL_NO_OMP_TUNING"
# Settings that say the user chose how OpenMP waits: any of them, and the pool changes nothing.
USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "KMP_BLOCKTIME")
RUNTIMES = ("libgomp", "libiomp", "libomp")   # GNU, Intel and LLVM OpenMP as they appear in /proc/self/maps
GNU = "libgomp"
# How long the trainer may go without a step before the spin is libgomp's own again: longer than a
# rollout's gap between steps (a policy's forward pass), far shorter than a PPO update.
IDLE_S = 0.05


def loaded_runtime(maps_path: str = "/proc/self/maps", serving: Callable[[], int | None] | None = None) -> str | None:
    """The path of the OpenMP runtime this process's OpenMP calls go to, or None.

    One runtime mapped: that one.  Several (Intel's libiomp5 in ``LD_PRELOAD`` beside torch's
    libgomp, as Intel's tuning guides advise): the one holding the address ``serving()`` gives, where
    the dynamic linker's global lookup finds ``GOMP_parallel`` (a preloaded library is searched first,
    so torch's calls go there); the first mapped when that address is in none of them."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    try:
        with open(maps_path) as f:
            for line in f:
                fields = line.split(maxsplit=5)   # address, perms, offset, device, inode, path
                path = fields[5].strip() if len(fields) == 6 else ""
                if os.path.basename(path).startswith(RUNTIMES):
                    lo, _, hi = fields[0].partition("-")
                    ranges.setdefault(path, []).append((int(lo, 16), int(hi, 16)))
    except OSError:   # no /proc: nothing can be told, so nothing is claimed
        return None
    if len(ranges) > 1:
        address = (serving or global_gomp_parallel)()
        for path, spans in ranges.items():
            if address is not None and any(lo <= address < hi for lo, hi in spans):
                return path
    return next(iter(ranges), None)


def global_gomp_parallel() -> int | None:
    """Where the process's global symbol lookup finds ``GOMP_parallel`` (None: nowhere)."""
    try:
        return ctypes.cast(ctypes.CDLL(None).GOMP_parallel, ctypes.c_void_p).value
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class OpenMPChoice:
    """What a pool does about the trainer's OpenMP spin, and why (``repr(pool)`` shows ``detail``)."""

    action: str   # "quiet", "none", "opted out", "user setting", "no runtime", "other runtime", "unsupported"
    detail: str
    runtime: str | None = None   # the runtime's path, for "quiet" and "other runtime"


LEAVE_OPENMP = OpenMPChoice("none", "every env steps in this process: OpenMP's spin left as it is")


def choose(has_processes: bool, environ=os.environ, maps_path: str = "/proc/self/maps") -> OpenMPChoice:
    """What a pool about to start (``has_processes``: with worker processes) does about OpenMP's spin."""
    if not has_processes:
        return LEAVE_OPENMP
    if environ.get(OPT_OUT, "").strip() not in ("", "0"):
        return OpenMPChoice("opted out", f"{OPT_OUT} is set: OpenMP's spin left as it is")
    chosen = [f"{name}={environ[name]}" for name in USER_SETTINGS if name in environ]
    if chosen:
        return OpenMPChoice("user setting", f"{', '.join(chosen)} as the user set it")
    runtime = loaded_runtime(maps_path)
    if runtime is None:
        return OpenMPChoice("no runtime", "no OpenMP runtime loaded")
    name = os.path.basename(runtime)
    if not name.startswith(GNU):
        return OpenMPChoice("other runtime", f"{name}: its waiting threads give way; left as it is", runtime)
    try:
        parallel = gomp_parallel(runtime)
    except OSError as exc:
        return OpenMPChoice("unsupported", f"{name}: cannot park a team with it ({exc})")
    if parallel is None:
        return OpenMPChoice("unsupported", f"{name}: cannot park a team with it (no GOMP_parallel)")
    return OpenMPChoice("quiet", f"{name}'s threads sleep right after each op while this pool is stepped, "
                                 f"spin as libgomp's own after {IDLE_S * 1e3:g} ms without a step "
                                 f"({OPT_OUT}=1 turns this off)", runtime)


class QuietSpin:
    """Quiets libgomp's spin (module docstring) while the trainer steps a pool: held by every open pool
    with worker processes (:meth:`hold`/:meth:`drop`, counted), engaged at :meth:`stepped` and let go
    after ``idle_s`` without a step, so the trainer's update, which leaves no env waiting for a core,
    keeps libgomp's own spin (with none, each of its ops pays a wake-up: docs/performance.md)."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self.engaged = False                    # a team is parked now
        self._lock = threading.RLock()   # a signal handler's close() may come in while it is held
        self._holders = 0
        self._runtime: str | None = None
        self._steps = 0                         # stepped() calls: the watcher compares them across idle_s
        self._wake = threading.Event()          # set by stepped() while not engaged, and by drop() to end
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def hold(self, runtime: str) -> None:
        """Quiet the GNU OpenMP runtime at path ``runtime`` (already loaded) while stepped, until :meth:`drop`."""
        with self._lock:
            self._holders += 1
            if self._watcher is None:
                self._runtime = runtime
                # Each watcher its own events: one still ending after a drop() never sees the next one's.
                self._wake, self._stop = threading.Event(), threading.Event()
                self._watcher = threading.Thread(target=self._watch, args=(self._wake, self._stop),
                                                 name="shmpool-quiet-openmp", daemon=True)
                self._watcher.start()

    def drop(self) -> None:
        with self._lock:
            self._holders = max(0, self._holders - 1)
            if self._holders or self._watcher is None:
                return
            watcher, self._watcher = self._watcher, None
            self._stop.set()
            self._wake.set()
        watcher.join()

    def stepped(self) -> None:
        """A pool was stepped: on its hot path, a counter and a flag."""
        self._steps += 1
        if not self.engaged:
            self._wake.set()

    def _watch(self, wake: threading.Event, stop: threading.Event) -> None:
        while True:
            wake.wait()
            wake.clear()
            if stop.is_set():
                return
            release = _park_team(self._runtime)
            self.engaged = True
            seen = self._steps
            while not stop.wait(self.idle_s) and self._steps != seen:
                seen = self._steps
            self.engaged = False
            release()


@functools.cache
def gomp_parallel(runtime: str):
    """``GOMP_parallel`` of the libgomp at path ``runtime``, typed; None when it has none (before
    GCC 4.9).  The library is already mapped: this is the one torch uses, not a second copy."""
    try:
        parallel = ctypes.CDLL(runtime).GOMP_parallel
    except AttributeError:
        return None
    parallel.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)
    parallel.restype = None
    return parallel


def _park_team(runtime: str) -> Callable[[], None]:
    """Start a thread that owns a team of more libgomp threads than this machine has CPUs, parked;
    the function returned ends it (its team goes with it)."""
    parallel = gomp_parallel(runtime)
    noop = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p)   # free(NULL): nothing, in C, without the GIL
    team = (os.cpu_count() or 1) + 1   # more threads than any CPU count libgomp can have seen at load
    release, ready = threading.Event(), threading.Event()

    def park() -> None:
        parallel(noop, None, team, 0)   # the team stays docked with this thread until it ends
        ready.set()
        release.wait()

    thread = threading.Thread(target=park, name="shmpool-openmp-team", daemon=True)
    thread.start()
    ready.wait()

    def end() -> None:
        release.set()
        thread.join()
    return end


QUIET = QuietSpin()


class SpinHold:
    """One pool's share of ``QUIET`` (none for a pool that does not quiet the spin)."""

    def __init__(self, quiet: QuietSpin | None) -> None:
        self._quiet = quiet

    def stepped(self) -> None:
        if self._quiet is not None:
            self._quiet.stepped()

    def end(self) -> None:
        """The pool closed: its share ends (once)."""
        quiet, self._quiet = self._quiet, None
        if quiet is not None:
            quiet.drop()


NOT_HELD = SpinHold(None)


def hold(choice: OpenMPChoice) -> SpinHold:
    """A started pool's share of ``QUIET``, as its ``choice`` says."""
    if choice.action != "quiet":
        return NOT_HELD
    QUIET.hold(choice.runtime)
    return SpinHold(QUIET)
# A forked child has none of the parent's threads: its libgomp counts a team that is not there.
os.register_at_fork(after_in_child=lambda: QUIET.__init__())
