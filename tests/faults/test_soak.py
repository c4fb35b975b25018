"""A short soak: random usage patterns and injected failures leave nothing behind.

Random pools go through send/recv/step/reset/call patterns and injected env failures for a few
seconds (and, with ``kill_every``, a worker SIGKILLed every that many operations under
``on_worker_error="restart"``); then RSS, open file descriptors, threads, child processes and
/dev/shm entries are compared with a baseline taken after a warm-up pool.  Bounded: 6 s a test.
(Formerly ``python -m bench.soak``; a longer run is ``soak(seconds=600)`` from this module.)
"""
from __future__ import annotations

import gc
import os
import signal
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import psutil
import pytest
from gymnasium import spaces

import shmpool

pytestmark = pytest.mark.slow   # soak runs: pools built, stepped and killed for many seconds

RSS_SLACK_MB = 32.0   # allocator caches and numpy's pools; a leak per step grows far past it


class SoakEnv(gym.Env):
    """Random episodes, mixed infos, and a failure rate that can be set through set_attr."""

    observation_space = spaces.Dict({"x": spaces.Box(-1, 1, (6,), np.float32), "k": spaces.Discrete(9)})
    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self):
        self.fail_rate = 0.0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"start": float(self.np_random.uniform())}

    def _obs(self):
        return {"x": self.np_random.uniform(-1, 1, 6).astype(np.float32), "k": int(self.t % 9)}

    def step(self, action):
        self.t += 1
        if self.np_random.uniform() < self.fail_rate:
            raise RuntimeError(f"injected failure at step {self.t}")
        info = {"t": self.t}
        if self.t % 7 == 0:
            info["note"] = "seventh"
        return self._obs(), float(np.sum(action)), self.np_random.uniform() < 0.05, self.t >= 40, info


@dataclass
class Resources:
    rss_mb: float
    fds: int
    threads: int
    children: int
    shm: int

    @classmethod
    def now(cls) -> Resources:
        me = psutil.Process()
        kids = [c for c in me.children(recursive=True) if not _mp_helper(c)]
        shm = len(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else 0
        return cls(me.memory_info().rss / 2**20, me.num_fds(), me.num_threads(), len(kids), shm)


def _mp_helper(proc: psutil.Process) -> bool:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return True
    return "resource_tracker" in cmd or "forkserver" in cmd


@dataclass
class Report:
    seconds: float
    pools: int
    env_steps: int
    env_errors: int
    kills: int
    restarts: int
    baseline: Resources
    final: Resources
    problems: list[str]


def _one_pool(rng: np.random.Generator, deadline: float, counts: dict, kill_every: int | None = None) -> None:
    n = int(rng.integers(2, 9))
    batch = int(rng.integers(1, n + 1))
    workers = int(rng.integers(1, 3))
    with shmpool.Pool(SoakEnv, n, num_workers=workers, batch_size=batch,
                      seed=int(rng.integers(2**31)), step_timeout=30,
                      on_worker_error="raise" if kill_every is None else "restart") as pool:
        pool.reset(seed=int(rng.integers(2**31)))
        for i in range(int(rng.integers(20, 200))):
            if time.monotonic() > deadline:
                break
            if kill_every is not None and i % kill_every == kill_every - 1:
                os.kill(pool.worker_pids[int(rng.integers(workers))], signal.SIGKILL)
                counts["kills"] += 1
            op = rng.choice(["step", "async", "reset", "call", "fail"], p=[0.5, 0.3, 0.05, 0.1, 0.05])
            try:
                if op == "step":
                    pool.step(rng.uniform(-1, 1, (n, 2)).astype(np.float32))
                    counts["steps"] += n
                elif op == "async":
                    _async_round(pool, rng, n, batch, counts)
                elif op == "reset":
                    pool.reset(seed=int(rng.integers(2**31)))
                elif op == "call":
                    assert len(pool.get_attr("t")) == n
                    pool.set_attr("fail_rate", 0.0)
                else:
                    pool.set_attr("fail_rate", float(rng.uniform(0, 0.2)))
            except shmpool.EnvError:
                counts["errors"] += 1
                _recover(pool)
            except shmpool.WorkerRestartedError:
                pass  # a call/get_attr/set_attr met a killed worker: it was replaced, not retried
        # A kill not noticed before close() is not restarted: count what was.
        counts["restarts"] = counts.get("restarts", 0) + pool.restarts


def _recover(pool) -> None:
    """After an injected env error: stop injecting, reset. A worker killed meanwhile makes the
    set_attr raise WorkerRestartedError (it may or may not have run): do it again."""
    for _ in range(3):
        try:
            pool.set_attr("fail_rate", 0.0)
            break
        except shmpool.WorkerRestartedError:
            continue
    pool.reset()


def _async_round(pool, rng, n: int, batch: int, counts: dict) -> None:
    pool.async_reset()
    for _ in range(int(rng.integers(1, 20))):
        *_, infos = pool.recv()
        ids = infos["env_id"]
        counts["steps"] += len(ids)
        pool.send(rng.uniform(-1, 1, (len(ids), 2)).astype(np.float32), ids)
    while pool.in_flight >= batch:
        pool.recv()
    if pool.in_flight:
        pool.reset()  # fewer than a batch left: reset() drops them


def soak(seconds: float, seed: int = 0, kill_every: int | None = None) -> Report:
    """Run random pools for ``seconds``; return what was measured and any resource not back.

    ``kill_every``: SIGKILL a random worker every that many operations (the pools
    then run with ``on_worker_error="restart"``)."""
    rng = np.random.default_rng(seed)
    _one_pool(np.random.default_rng(seed + 1), time.monotonic() + 1.0,  # warm-up
              {"steps": 0, "errors": 0, "kills": 0}, kill_every)
    gc.collect()
    baseline = Resources.now()
    counts = {"steps": 0, "errors": 0, "pools": 0, "kills": 0, "restarts": 0}
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        _one_pool(rng, deadline, counts, kill_every)
        counts["pools"] += 1
    gc.collect()
    time.sleep(0.2)
    final = Resources.now()
    problems = []
    if final.children:
        problems.append(f"{final.children} child processes left")
    if final.shm > baseline.shm:
        problems.append(f"/dev/shm has {final.shm - baseline.shm} more entries")
    if final.fds > baseline.fds:
        problems.append(f"{final.fds - baseline.fds} more open file descriptors")
    if final.threads > baseline.threads:
        problems.append(f"{final.threads - baseline.threads} more threads")
    if final.rss_mb > baseline.rss_mb + RSS_SLACK_MB:
        problems.append(f"RSS grew {final.rss_mb - baseline.rss_mb:.1f} MB (slack {RSS_SLACK_MB} MB)")
    return Report(time.monotonic() - start, counts["pools"], counts["steps"], counts["errors"], counts["kills"],
                  counts["restarts"], baseline, final, problems)


def test_short_soak_leaves_nothing_behind(no_leaks):
    report = soak(seconds=6.0, seed=1)
    assert report.pools >= 3 and report.env_steps > 1000, report
    assert report.env_errors > 0, "the soak must exercise env failures"
    assert report.problems == [], report.problems


def test_short_soak_with_killed_workers_leaves_nothing_behind(no_leaks):
    report = soak(seconds=6.0, seed=2, kill_every=15)
    assert report.kills >= 5 and report.restarts >= report.kills // 2, report
    assert report.env_steps > 500, report
    assert report.problems == [], report.problems
