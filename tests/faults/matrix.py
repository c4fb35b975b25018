"""The fault matrix: every way an env, a worker or the parent can fail, in sync and async mode.

Each case builds a small pool (4 envs, 2 workers; env 3 on worker 1 is the faulty one unless
said otherwise), makes it fail, and returns an :class:`Outcome`: which exception came out,
its message, how long the failing call took, and what state the pool is in afterwards
(probed, not assumed).  ``test_matrix.py`` asserts every cell against :data:`EXPECTED`;
``python tests/faults/matrix.py`` prints the table kept in ``tests/faults/README.md``.
"""
from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: envs.py, conftest helpers

from envs import FaultyEnv  # noqa: E402

import shmpool  # noqa: E402
from shmpool import PoolClosedError  # noqa: E402

ZEROS = np.zeros(4, dtype=np.int64)
MODES = ("sync", "async")
DEATH_MODES = (*MODES, "sync restart", "async restart")   # on_worker_error="raise" (default) / "restart"


# What the time bounds check.  Every fault here, undetected, blocks the failing call for good (a dead
# worker never finishes its step; a hung one sleeps 3600 s) or, for Ctrl-C, for the 3 s step it lands in,
# so a call that returns at all (before that step's end),
# with the error and state expected, shows the detection happened: the bounds only say it happened within
# a few wait slices, not at some later check.  Idle, on 2 vCPUs (README.md's table): an env error ~6 ms, a
# dead worker ~100 ms (two 50 ms slices), a hang step_timeout + ~50 ms.  DETECTED_WITHIN (1 s) leaves 10x
# for a loaded CI; a hang's bounds add ~1 s to its 0.3 s.
DETECTED_WITHIN = 1.0
# With on_worker_error="restart" the failing call also forks the replacement worker and waits for its
# start-up handshake: ~30 ms idle, but 1.2 s was seen on a loaded 2-core CI (a "hang in step ... sync
# restart" row took 1.6 s against its 1.5 s bound).  2 s on top of the detection bound leaves ~2x over that.
RESPAWN_S = 2.0
# The env step a KeyboardInterrupt lands in (FaultyEnv's "sleep"); the call must end before it would.
SLOW_STEP_S = 3.0


@dataclass
class Outcome:
    error: str          # exception type name, or "none"
    message: str
    seconds: float      # duration of the call that failed (detection time)
    state: str          # what the pool does afterwards


@dataclass(frozen=True)
class Expected:
    error: str
    message: str        # regex searched in the message
    state: str
    limit: float = DETECTED_WITHIN  # seconds the failing call may take
    at_least: float = 0.0


def faulty(fail_in: str = "never", at: int = 2, how: str = "raise"):
    return functools.partial(FaultyEnv, fail_in, at, how)


def pool_with(last, **kwargs) -> shmpool.Pool:
    """Envs 0-2 healthy, env 3 (worker 1) built by ``last``."""
    return shmpool.Pool([faulty()] * 3 + [last], num_workers=2, **kwargs)


def step_all(pool: shmpool.Pool, mode: str):
    if mode == "sync":
        return pool.step(ZEROS)
    pool.send(ZEROS)
    return pool.recv()


def timed(call: Callable[[], object]) -> tuple[BaseException | None, float, object]:
    """(the exception raised or None, seconds taken, what the call returned)."""
    t0 = time.monotonic()
    try:
        result = call()
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt is one of the cases
        return exc, time.monotonic() - t0, None
    return None, time.monotonic() - t0, result


def restart_kwargs(mode: str) -> dict:
    return {"on_worker_error": "restart"} if mode.endswith("restart") else {}


def base(mode: str) -> str:
    return mode.split()[0]


def after_restart(pool: shmpool.Pool, mode: str, result) -> str:
    """After a step that replaced a worker: which envs came back truncated and marked, then
    whether the pool steps on."""
    *_, trunc, infos = result
    ids = infos.get("env_id", np.arange(4))
    marked = sorted(int(ids[i]) for i in np.flatnonzero(infos.get("_worker_restarted", np.zeros(len(ids), bool))))
    cut = sorted(int(ids[i]) for i in np.flatnonzero(trunc))
    *_, trunc, infos = step_all(pool, base(mode))
    ids = infos.get("env_id", np.arange(4))
    late = sorted(int(ids[i]) for i in np.flatnonzero(infos.get("_worker_restarted", np.zeros(len(ids), bool))))
    return (f"usable; envs {cut} truncated, {marked} worker_restarted"
            + (f", then {late}" if late else "") + f"; restarts={pool.restarts}")


def probe_state(pool: shmpool.Pool, mode: str, result=None) -> str:
    """What the pool does now: closed, refuses until reset, or steps on."""
    if mode.endswith("restart") and not pool.closed:
        return after_restart(pool, mode, result)
    mode = base(mode)
    if pool.closed:
        try:
            pool.step(ZEROS)
        except PoolClosedError:
            return "closed (PoolClosedError after)"
        return "closed but still stepped"
    try:
        step_all(pool, mode)
        return "usable"
    except RuntimeError as exc:
        if "reset()" not in str(exc):
            raise
    pool.reset()
    step_all(pool, mode)
    return "usable after reset()"


def outcome(exc: BaseException | None, seconds: float, state: str, pool: shmpool.Pool | None = None) -> Outcome:
    """What came out.  With no exception the message is what ``pool.restart_log`` says
    happened (``worker 1 was killed by SIGKILL during step``), or empty."""
    if exc is None:
        log = [] if pool is None else pool.restart_log
        said = "; ".join(f"worker {e['worker']} {e['cause']} during {e['op']}" for e in log)
        return Outcome("none", said, seconds, state)
    # Notes count as message: KeyboardInterrupt has no text, only the pool's note.
    said = "\n".join([str(exc).split("\n--- remote traceback")[0], *getattr(exc, "__notes__", ())])
    return Outcome(type(exc).__name__, said, seconds, state)


# --- the cases ------------------------------------------------------------------------------

def env_fails(fail_in: str, how: str = "raise", at: int = 2, **kwargs) -> Callable[[str], Outcome]:
    """The env fails inside a step, a reset or a call the pool makes."""
    def run(mode: str) -> Outcome:
        with pool_with(faulty(fail_in, at, how), **kwargs, **restart_kwargs(mode)) as pool:
            if fail_in == "reset":
                if mode == "sync":
                    exc, dt, _ = timed(pool.reset)
                else:
                    pool.async_reset()
                    exc, dt, _ = timed(lambda: (pool.recv(), pool.recv()) if pool.batch_size < 4 else pool.recv())
                return outcome(exc, dt, "closed" if pool.closed else refuses_then(pool, mode))
            pool.reset()
            pool.step(ZEROS)  # step 1: fine
            exc, dt, result = timed(lambda: step_all(pool, base(mode)))
            return outcome(exc, dt, probe_state(pool, mode, result), pool)
    return run


def env_forks(mode: str) -> Outcome:
    """Env 3 forks a child inside every step from step 2 on, and the child returns from ``step``:
    three more steps, whose rows must be the envs' own (each env's observation is its step count)."""
    with pool_with(faulty("step", 2, "fork")) as pool:
        pool.reset()
        pool.step(ZEROS)
        start = time.perf_counter()
        wrong = 0
        for t in range(2, 5):
            obs = step_all(pool, mode)[0]   # async: all 4 (batch_size 4), in completion order
            wrong += int((obs[:, 0] != t).sum())
        state = "usable, every row the env's own" if not wrong else f"usable, {wrong} rows wrong"
        return outcome(None, time.perf_counter() - start, state, pool)


def refuses_then(pool: shmpool.Pool, mode: str) -> str:
    """After a failed reset: stepping is refused with an error that asks for reset()."""
    try:
        step_all(pool, mode)
    except RuntimeError as exc:
        return "refuses to step: " + re.sub(r"env \d+ ", "env N ", str(exc))
    return "steps an env whose reset failed"


def constructor_fails(mode: str) -> Outcome:
    exc, dt, _ = timed(lambda: pool_with(faulty("make")))
    return outcome(exc, dt, "no pool (workers reaped)")


def message_fails(name: str) -> Callable[[str], Outcome]:
    """``call(name)`` (render, a method) raises in env 3; async: while a batch is in flight."""
    def run(mode: str) -> Outcome:
        with pool_with(faulty(name if name == "render" else "call")) as pool:
            pool.reset()
            if mode == "async":
                pool.send(ZEROS)
            exc, dt, _ = timed(lambda: pool.call("render" if name == "render" else "probe"))
            if mode == "async":
                obs, rew, *_ = pool.recv()      # the batch in flight is not lost
                assert len(rew) == 4
            return outcome(exc, dt, probe_state(pool, mode))
    return run


def close_fails(mode: str) -> Outcome:
    pool = pool_with(faulty("close"))
    pool.reset()
    if mode == "async":
        pool.send(ZEROS)
    exc, dt, _ = timed(pool.close)
    return outcome(exc, dt, probe_state(pool, mode))


def worker_dies(how: str) -> Callable[[str], Outcome]:
    """The worker of env 3 dies inside ``step`` (SIGKILL or ``os._exit(3)``)."""
    return env_fails("step", how)


def killed_while_idle(mode: str) -> Outcome:
    with pool_with(faulty(), **restart_kwargs(mode)) as pool:
        pool.reset()
        pid = pool.worker_pids[1]
        os.kill(pid, signal.SIGKILL)
        # Dead but not reaped: the pool finds out at its next call (reaping it here, e.g. with
        # psutil's wait(), would hide the exit code from multiprocessing).
        while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.005)
        exc, dt, result = timed(lambda: step_all(pool, base(mode)))
        return outcome(exc, dt, probe_state(pool, mode, result), pool)


def reaped_elsewhere(mode: str) -> Outcome:
    """The worker is killed and reaped by someone else (a SIGCHLD handler, ``os.wait()``),
    so multiprocessing never learns its exit code: the pool must still notice."""
    with pool_with(faulty()) as pool:
        pool.reset()
        pid = pool.worker_pids[1]
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        exc, dt, _ = timed(lambda: step_all(pool, mode))
        return outcome(exc, dt, probe_state(pool, mode))


def hangs(with_timeout: bool) -> Callable[[str], Outcome]:
    """Env 3 hangs in ``step``: ``step_timeout`` fires, or (without one) someone kills the
    hung worker after 0.3 s and the pool must notice that."""
    def run(mode: str) -> Outcome:
        kwargs = {"step_timeout": 0.3} if with_timeout else {}
        with pool_with(faulty("step", 2, "hang"), **kwargs, **restart_kwargs(mode)) as pool:
            pool.reset()
            pool.step(ZEROS)
            if not with_timeout:
                pid = pool.worker_pids[1]
                threading.Timer(0.3, lambda: os.kill(pid, signal.SIGKILL)).start()
            exc, dt, result = timed(lambda: step_all(pool, base(mode)))
            return outcome(exc, dt, probe_state(pool, mode, result), pool)
    return run


def keyboard_interrupt(after: float) -> Callable[[str], Outcome]:
    """Ctrl-C (SIGINT to the parent) ``after`` seconds into a step/recv that takes ``SLOW_STEP_S``
    (0.01 s: inside the wait's first slice; 0.1 s: a later one)."""
    def run(mode: str) -> Outcome:
        pool = pool_with(faulty("step", 2, "sleep"))
        pool.reset()
        pool.step(ZEROS)
        # Python's own Ctrl-C handler, as in a terminal: a runner started in the background
        # (no job control) hands its children SIGINT ignored, and then no Ctrl-C arrives.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            threading.Timer(after, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            exc, dt, _ = timed(lambda: step_all(pool, mode))
        finally:
            signal.signal(signal.SIGINT, previous)
        return outcome(exc, dt, probe_state(pool, mode))
    return run


PARENT_SCRIPT = """
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np, shmpool
    pool = shmpool.Pool("CartPole-v1", 4, num_workers=2, batch_size={batch})
    pool.reset()
    print(*pool.worker_pids, flush=True)
    acts = np.zeros(4, dtype=np.int64)
    if {batch} == 4:
        while True:
            pool.step(acts)
    pool.async_reset()
    while True:
        *_, info = pool.recv()
        pool.send(acts[:{batch}], info["env_id"])
"""


def parent_killed(mode: str) -> Outcome:
    """The trainer process gets SIGKILL mid-run: its workers must follow within 2 s and
    nothing may be left in /dev/shm."""
    before = set(os.listdir("/dev/shm"))
    script = textwrap.dedent(PARENT_SCRIPT).format(tests=os.path.dirname(HERE), batch=4 if mode == "sync" else 2)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        if time.monotonic() - t0 > 2.0:
            break
        time.sleep(0.01)
    dt = time.monotonic() - t0
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    left = set(os.listdir("/dev/shm")) - before
    state = f"workers left: {alive}, /dev/shm left: {sorted(left)}" if alive or left else "workers gone, /dev/shm clean"
    return Outcome("none", "", dt, state)


# case name -> (runner, modes)
CASES: dict[str, tuple[Callable[[str], Outcome], tuple[str, ...]]] = {
    "exception in constructor": (constructor_fails, ("-",)),
    "exception in reset": (env_fails("reset"), MODES),
    "exception in step": (env_fails("step"), MODES),
    "exception in close": (close_fails, MODES),
    "exception in render": (message_fails("render"), MODES),
    "exception in call": (message_fails("call"), MODES),
    "SIGKILL while stepping": (worker_dies("kill"), DEATH_MODES),
    "SIGKILL while idle": (killed_while_idle, DEATH_MODES),
    "os._exit(3) in step": (worker_dies("exit"), DEATH_MODES),
    "worker reaped by someone else": (reaped_elsewhere, MODES),
    "hang in step, step_timeout=0.3": (hangs(True), DEATH_MODES),
    "hang in step, no timeout, worker killed": (hangs(False), DEATH_MODES),
    "observation of the wrong shape": (env_fails("step", "bad_obs"), MODES),
    "observation of the wrong dtype": (env_fails("step", "bad_dtype"), MODES),
    "non-finite reward": (env_fails("step", "nan_reward"), MODES),
    "KeyboardInterrupt in step/recv": (keyboard_interrupt(0.1), MODES),
    "KeyboardInterrupt early in step/recv": (keyboard_interrupt(0.01), MODES),
    "parent killed (SIGKILL)": (parent_killed, MODES),
    "a child forked in step returns": (env_forks, MODES),
}

ENV3 = r"env 3 \(worker 1, pid \d+\)"
WORKER1 = r"worker 1 \(pid \d+, cpu \d+, envs 2..3\)"
USABLE_AFTER_RESET = "usable after reset()"
CLOSED = "closed (PoolClosedError after)"
REFUSES = "refuses to step: env N raised ValueError in reset; call reset() before stepping again"

EXPECTED: dict[str, Expected] = {
    "exception in constructor": Expected(
        "EnvError", ENV3 + r" raised in make: ValueError: injected failure in make; the pool was not created",
        "no pool (workers reaped)"),
    "exception in reset": Expected("EnvError", ENV3 + r" raised in reset: ValueError: injected failure in reset",
                                   REFUSES),
    "exception in step": Expected("EnvError", ENV3 + r" raised in step: ValueError: injected failure in step; "
                                  r"call reset\(\) before stepping again", USABLE_AFTER_RESET),
    "exception in close": Expected("EnvError", ENV3 + r" raised in close: ValueError: injected failure in close",
                                   CLOSED),
    "exception in render": Expected("EnvError", ENV3 + r" raised in call 'render': ValueError: injected failure "
                                    r"in render", "usable"),
    "exception in call": Expected("EnvError", ENV3 + r" raised in call 'probe': ValueError: injected failure in call",
                                  "usable"),
    "SIGKILL while stepping": Expected("WorkerDiedError", WORKER1 + r" was killed by SIGKILL during (step|recv)",
                                       CLOSED),
    "SIGKILL while idle": Expected("WorkerDiedError", WORKER1 + r" was killed by SIGKILL during (step|send|recv)",
                                   CLOSED),
    "os._exit(3) in step": Expected("WorkerDiedError", WORKER1 + r" exited with code 3 during (step|recv)", CLOSED),
    "worker reaped by someone else": Expected(
        "WorkerDiedError", WORKER1 + r" is gone \(reaped outside shmpool, exit status unknown\) during (step|recv)",
        CLOSED),
    # The timeout (or the kill) at 0.3 s, then the kill and the detection: ~50 ms idle.  The at_least shows the
    # timeout did wait; the message, that it was the timeout (or the death) that ended the call.
    "hang in step, step_timeout=0.3": Expected(
        "TimeoutError", r"did not finish within step_timeout=0.3 s: workers \[1\] \(envs 2..3\)", CLOSED,
        limit=1.5, at_least=0.3),
    "hang in step, no timeout, worker killed": Expected(
        "WorkerDiedError", WORKER1 + r" was killed by SIGKILL during (step|recv)", CLOSED, limit=1.3, at_least=0.3),
    "observation of the wrong shape": Expected(
        "EnvError", ENV3 + r" raised in step: shmpool.workers.shard.ResultError: observation has shape \(5,\), "
        r"the space says \(4,\)",
        USABLE_AFTER_RESET),
    "observation of the wrong dtype": Expected(
        "EnvError", ENV3 + r" raised in step: shmpool.workers.shard.ResultError: observation has dtype complex64, "
        r"which the space's float32 cannot hold", USABLE_AFTER_RESET),
    "non-finite reward": Expected(
        "EnvError", ENV3 + r" raised in step: shmpool.workers.shard.ResultError: reward is nan: rewards must be finite",
        USABLE_AFTER_RESET),
    # Idle: the signal's time + one 50 ms slice + the kill (~100 ms).  Half the env's 3 s step: a call that
    # waited for the step to end, and only then saw the interrupt, fails; 10x the idle time for a loaded CI.
    "KeyboardInterrupt in step/recv": Expected(
        "KeyboardInterrupt", r"^\nshmpool: the pool was closed and its workers killed \((step|recv) was interrupted\)$",
        CLOSED, limit=SLOW_STEP_S / 2),
    "KeyboardInterrupt early in step/recv": Expected(
        "KeyboardInterrupt", r"^\nshmpool: the pool was closed and its workers killed \((step|recv) was interrupted\)$",
        CLOSED, limit=SLOW_STEP_S / 2),
    # parent_killed polls for 2 s and its state names any worker still alive: the bound restates that.
    "parent killed (SIGKILL)": Expected("none", "", "workers gone, /dev/shm clean", limit=2.0),
    # Three steps, ~40 ms idle: a step stuck on the forked child would never end; 2 s is 50x for a loaded CI.
    "a child forked in step returns": Expected("none", "", "usable, every row the env's own", limit=2.0),
}


# With on_worker_error="restart" the same faults raise nothing: worker 1 is replaced and only
# its envs (2 and 3) come back truncated with info["worker_restarted"].  Async, env 2's step
# result published before env 3 killed the worker is delivered as it is, and env 2 (rebuilt
# too) reports the restart at its next step.
RESTARTED = "usable; envs [2, 3] truncated, [2, 3] worker_restarted; restarts=1"
RESTARTED_LATE = "usable; envs [3] truncated, [3] worker_restarted, then [2]; restarts=1"


# What restart_log says for each restart cell (the raise-mode message of the same fault, the
# worker's words without its pid, since the replacement says nothing).
RESTART_CAUSE = {
    "SIGKILL while stepping": r"worker 1 was killed by SIGKILL during (step|recv)",
    "SIGKILL while idle": r"worker 1 was killed by SIGKILL during (step|send|recv)",
    "os._exit(3) in step": r"worker 1 exited with code 3 during (step|recv)",
    "hang in step, step_timeout=0.3": r"worker 1 did not finish (step|recv) within step_timeout=0.3 s and was killed "
                                      r"during (step|recv)",
    "hang in step, no timeout, worker killed": r"worker 1 was killed by SIGKILL during (step|recv)",
}


def expected(name: str, mode: str) -> Expected:
    if not mode.endswith("restart"):
        return EXPECTED[name]
    state = RESTARTED if mode.startswith("sync") or name == "SIGKILL while idle" else RESTARTED_LATE
    limit, at_least = EXPECTED[name].limit + RESPAWN_S, EXPECTED[name].at_least
    return Expected("none", RESTART_CAUSE[name], state, limit=limit, at_least=at_least)


def run_case(name: str, mode: str) -> Outcome:
    runner, _ = CASES[name]
    return runner(mode)


def cells() -> list[tuple[str, str]]:
    return [(name, mode) for name, (_, modes) in CASES.items() for mode in modes]


def markdown(results: dict[tuple[str, str], Outcome]) -> str:
    lines = ["| case | mode | raises | detected in | afterwards |", "| --- | --- | --- | --- | --- |"]
    for (name, mode), out in results.items():
        lines.append(f"| {name} | {mode} | {out.error} | {out.seconds * 1000:.0f} ms | {out.state} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown({cell: run_case(*cell) for cell in cells()}))
