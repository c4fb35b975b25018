"""How workers wait: they answer fast while commands come soon, and sleep while nobody waits on them."""
import mmap
import pickle
import threading
import time

import numpy as np
import psutil

import shmpool
from shmpool import _core
from shmpool.topology import WAIT_POLICIES


def _wire():
    buf = mmap.mmap(-1, _core.control_size(2, [2]))
    wire = _core.Wire(buf, [2], num_envs=2)
    wire.init_header()
    return wire


def _fresh_adaptive():
    p = WAIT_POLICIES["adaptive"]
    return _core.WaitPolicy(p.name, p.spin_ns, p.yield_ns, p.adaptive)


def test_adaptive_policy_learns_the_gap_between_commands():
    wire, pol = _wire(), _fresh_adaptive()
    budget = pol.spin_ns + pol.yield_ns
    seen = 0
    # Commands that come late (5 ms, like a trainer's forward pass): the learnt gap grows past the budget.
    for _ in range(4):
        timer = threading.Timer(0.005, wire.post, (0, _core.CMD_STEP))
        timer.start()
        assert wire.wait_command(0, seen, pol, 1_000_000_000)
        timer.join()
        seen = wire.cmd_seq(0)
    assert pol.gap_ns > budget
    # Commands already there when the worker looks: it learns they come at once, and spins again.
    for _ in range(12):
        wire.post(0, _core.CMD_STEP)
        assert wire.wait_command(0, seen, pol, 1_000_000_000)
        seen = wire.cmd_seq(0)
    assert pol.gap_ns < budget


def test_adaptive_wait_still_times_out_in_slices():
    wire, pol = _wire(), _fresh_adaptive()
    t = time.perf_counter()
    assert not wire.wait_command(0, 0, pol, 20_000_000)
    # It returned unmet at its 20 ms slice: a wait that ignored its timeout would block for good (nothing
    # posts); 1 s is 50x the slice, room for a loaded CI.
    assert time.perf_counter() - t < 1.0
    assert pol.gap_ns > pol.spin_ns + pol.yield_ns  # a slice without a command: sleep at once next time


def test_wait_policy_pickles_with_its_kind():
    pol = pickle.loads(pickle.dumps(_fresh_adaptive()))
    assert pol.adaptive and pol.name == "adaptive"
    assert not pickle.loads(pickle.dumps(WAIT_POLICIES["yield"])).adaptive


def _worker_cpu(pool) -> float:
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pool.worker_pids)


def test_workers_sleep_while_the_trainer_is_busy_elsewhere(no_leaks):
    """A trainer-shaped loop (3 ms away per step, as a GPU wait): workers must not burn
    the cores while nobody waits on them (they burnt 185 % of a core with 10 ms yield spins)."""
    with shmpool.Pool("CartPole-v1", 8, num_workers=2, seed=0) as pool:
        pool.reset()
        actions = np.zeros(8, dtype=np.int64)
        for _ in range(20):
            pool.step(actions)
            time.sleep(0.003)
        c0, t0 = _worker_cpu(pool), time.perf_counter()
        for _ in range(150):
            pool.step(actions)
            time.sleep(0.003)
        share = (_worker_cpu(pool) - c0) / (time.perf_counter() - t0)
        assert share < 0.25, f"workers used {share:.2f} cores while the parent slept between steps"
        # And after one step, a whole second of parent sleep costs them next to nothing.
        pool.step(actions)
        c0 = _worker_cpu(pool)
        time.sleep(1.0)
        assert _worker_cpu(pool) - c0 < 0.2


def test_auto_says_what_it_chose(no_leaks):
    with shmpool.Pool("CartPole-v1", 4, num_workers=2) as pool:
        choice = pool.wait_choice
        assert choice.parent is pool.wait_policy and choice.worker is pool.worker_wait_policy
        assert choice.worker.adaptive
        assert "+ parent on" in choice.reason and str(choice) in repr(pool)
    with shmpool.Pool("CartPole-v1", 4, num_workers=2, wait_policy="yield") as pool:
        assert pool.wait_choice.reason.startswith("as asked") and not pool.worker_wait_policy.adaptive
