"""Calls out of order on the gymnasium face, against gymnasium's ``AsyncVectorEnv`` (1.x or 0.29 alike).

Every test runs on both classes and asserts the same literal facts: with each of ``reset_async``,
``step_async`` and ``call_async`` pending (or nothing), each entry either works or is refused with
``AsyncVectorEnv``'s exception type, message and ``.name``; the pending call survives a refusal and
its ``*_wait`` still collects it; ``close()`` while a call is pending warns as gymnasium warns and
leaves every entry refused with ``ClosedEnvironmentError``.  The expected outcome of each pair comes
from :func:`expected`, a model of ``AsyncVectorEnv``'s rules, so the reference checks the model too.
"""
from __future__ import annotations

import functools
import multiprocessing
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
from envs import FaultyEnv
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.utils import colorize

import shmpool
from shmpool.gym_compat import LEGACY

N = 2
ACTIONS = np.array([1, 2])


class CountEnv(gym.Env):
    """Observes ``[steps since reset, last action]``; ``value``/``get_value`` for call and set_attr;
    renders a 1x1 frame."""

    metadata = {"render_modes": ["rgb_array"]}
    observation_space = spaces.Box(0, 1000, (2,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self):
        self.render_mode = "rgb_array"
        self.t, self.last, self.value = 0, 0, 7

    def _obs(self):
        return np.array([self.t, self.last], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.last = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.t, self.last = self.t + 1, int(action)
        return self._obs(), 1.0, False, False, {}

    def get_value(self, k=1):
        return self.value * k

    def render(self):
        return np.zeros((1, 1, 3), np.uint8)


def build(kind, fns=(CountEnv,) * N):
    if kind == "shmpool":
        return shmpool.VectorEnv(list(fns), num_workers=2)
    return gym.vector.AsyncVectorEnv(list(fns))


KINDS = ["AsyncVectorEnv", "shmpool"]

# The calls that start each kind of pending call, and the wait that collects it.
START = {"reset": lambda e: e.reset_async(seed=0), "step": lambda e: e.step_async(ACTIONS),
         "call": lambda e: e.call_async("get_value")}
WAIT = {"reset": lambda e: e.reset_wait(), "step": lambda e: e.step_wait(), "call": lambda e: e.call_wait()}



@dataclass(frozen=True)
class Entry:
    """A call a caller can make: ``starts`` is the async call it is (or is refused as), ``collects``
    the kind of pending call it is the wait of, ``returns`` what it gives back (see :func:`check_result`)."""

    call: Callable
    starts: str | None = None
    collects: str | None = None
    returns: str | None = None


ENTRIES = {
    "reset_async": Entry(START["reset"], starts="reset_async"),
    "reset": Entry(lambda e: e.reset(seed=0), starts="reset_async", returns="reset"),
    "reset_wait": Entry(WAIT["reset"], collects="reset", returns="reset"),
    "step_async": Entry(START["step"], starts="step_async"),
    "step": Entry(lambda e: e.step(ACTIONS), starts="step_async", returns="step"),
    "step_wait": Entry(WAIT["step"], collects="step", returns="step"),
    "call_async": Entry(START["call"], starts="call_async"),
    "call": Entry(lambda e: e.call("get_value", 2), starts="call_async", returns="call twice"),
    "call_wait": Entry(WAIT["call"], collects="call", returns="call"),
    "get_attr": Entry(lambda e: e.get_attr("value"), starts="call_async", returns="call"),
    "set_attr": Entry(lambda e: e.set_attr("value", 7), starts="set_attr"),
    # The length of the values is checked before any pending call.
    "set_attr, wrong length": Entry(lambda e: e.set_attr("value", [7]), starts="set_attr"),
    "render": Entry(lambda e: e.render(), starts="call_async", returns="render"),
}
if LEGACY:
    # 0.29's AsyncVectorEnv.render is gym.Env's (NotImplementedError whatever the state), not call("render").
    del ENTRIES["render"]


def outcome(fn, envs):
    """``fn(envs)``'s result, or its error's type, message and ``.name``."""
    try:
        return ("returned", fn(envs))
    except Exception as exc:  # noqa: BLE001 - the error is the result being compared
        return (type(exc), str(exc), getattr(exc, "name", None))


def already_pending(call, pending):
    end = "" if call == "reset_async" else "."   # AsyncVectorEnv's reset_async message has no full stop
    return (AlreadyPendingCallError,
            f"Calling `{call}` while waiting for a pending call to `{pending}` to complete{end}", pending)


def expected(pending, entry):
    """AsyncVectorEnv's answer to ``entry`` with ``pending`` (None: nothing) started: a refusal
    (type, message, name), or "returned"; and what is pending afterwards."""
    starts, collects = ENTRIES[entry].starts, ENTRIES[entry].collects
    if entry == "set_attr, wrong length":
        return (ValueError, "Values must be a list or tuple with length equal to the number of environments. "
                            f"Got `1` values for {N} environments.", None), pending
    if collects is not None:
        if pending != collects:
            return (NoAsyncCallError, f"Calling `{collects}_wait` without any prior call to `{collects}_async`.",
                    collects), pending
        return "returned", None
    if pending is not None:
        return already_pending(starts, pending), pending
    return "returned", (starts.split("_")[0] if entry.endswith("_async") else None)


def check_result(returns, value):
    """What a call that works gives back: ``returns`` names it (None: nothing)."""
    if returns == "reset":
        obs, infos = value
        np.testing.assert_array_equal(obs, np.zeros((N, 2), np.float32))
    elif returns == "step":
        obs, rewards, terminated, truncated, infos = value
        np.testing.assert_array_equal(obs[:, 1], ACTIONS)
        assert rewards.tolist() == [1.0] * N and not terminated.any() and not truncated.any()
    elif returns == "call":
        assert tuple(value) == (7,) * N
    elif returns == "call twice":
        assert tuple(value) == (14,) * N
    elif returns == "render":
        assert len(value) == N and all(frame.shape == (1, 1, 3) for frame in value)
    else:
        assert value is None, returns


@pytest.mark.parametrize("pending", [None, "reset", "step", "call"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_entry_with_each_call_pending(no_leaks, kind, pending):
    """Each entry with ``pending`` started: refused or not as AsyncVectorEnv refuses, word for word;
    after a refusal the pending call is still there and collects normally, and the envs step on."""
    envs = build(kind)
    try:
        for entry, spec in ENTRIES.items():
            envs.reset(seed=0)
            if pending is not None:
                START[pending](envs)
            want, left = expected(pending, entry)
            got = outcome(spec.call, envs)
            if want == "returned":
                assert got[0] == "returned", f"{entry} with {pending} pending: {got}"
                check_result(spec.returns, got[1])
            else:
                assert got == want, f"{entry} with {pending} pending"
            if left is not None:   # still pending (or just started): its wait collects it
                check_result(ENTRIES[f"{left}_wait"].returns, WAIT[left](envs))
            # Nothing is pending now: every wait says so, and the envs step on.
            for kind_, wait in WAIT.items():
                assert outcome(wait, envs) == expected(None, f"{kind_}_wait")[0]
            envs.reset(seed=0)
            obs = envs.step(ACTIONS)[0]
            np.testing.assert_array_equal(obs, np.array([[1, 1], [1, 2]], np.float32))
    finally:
        envs.close(terminate=True)


def closed_message(envs):
    return f"Trying to operate on `{type(envs).__name__}`, after a call to `close()`."


@pytest.mark.parametrize("terminate", [False, True])
@pytest.mark.parametrize("pending", [None, "reset", "step", "call"])
@pytest.mark.parametrize("kind", KINDS)
def test_close_with_each_call_pending(no_leaks, kind, pending, terminate):
    """close() with ``pending`` started warns (only then) with gymnasium's words, closes, and
    leaves every entry refused with ClosedEnvironmentError; a second close() does nothing."""
    envs = build(kind)
    envs.reset(seed=0)
    if pending is not None:
        START[pending](envs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs.close(terminate=terminate)
    said = [str(w.message) for w in caught if "Calling `close`" in str(w.message)]
    if pending is None:
        assert said == []
    else:
        assert said == [colorize(f"WARN: Calling `close` while waiting for a pending call to `{pending}` to "
                                 "complete.", "yellow")]
    assert envs.closed
    for entry, spec in ENTRIES.items():
        assert outcome(spec.call, envs) == (ClosedEnvironmentError, closed_message(envs), None), entry
    assert envs.close() is None and envs.closed


@pytest.mark.parametrize("kind", KINDS)
def test_an_env_error_ends_the_pending_step(no_leaks, kind):
    """The env's error comes out of step_wait, and nothing is pending afterwards (as in gymnasium,
    whose AsyncVectorEnv goes back to its default state)."""
    envs = build(kind, [lambda: FaultyEnv("step", at=1)] * N)
    try:
        envs.reset(seed=0)
        envs.step_async(np.array([0, 1]))
        with pytest.raises(ValueError, match="injected failure in step"):
            envs.step_wait()
        if LEGACY and kind == "AsyncVectorEnv":
            pytest.skip("0.29's AsyncVectorEnv stays waiting for the step after an env's error, with the failed "
                        "workers' pipes gone (step_wait then raises AttributeError); the face follows 1.x")
        for kind_, wait in WAIT.items():
            assert outcome(wait, envs) == expected(None, f"{kind_}_wait")[0]
    finally:
        envs.close(terminate=True)


# --- shmpool only: the EnvPool-style entries the face adds ------------------------------------


@pytest.mark.parametrize("pending", ["reset", "step", "call"])
def test_envpool_entries_are_refused_while_a_call_is_pending(no_leaks, pending):
    with shmpool.VectorEnv([CountEnv] * N, num_workers=2) as envs:
        envs.reset(seed=0)
        START[pending](envs)
        for op, call in (("async_reset", lambda e: e.async_reset()), ("recv", lambda e: e.recv()),
                         ("send", lambda e: e.send(ACTIONS, np.arange(N)))):
            assert outcome(call, envs) == already_pending(op, pending), op
        check_result(ENTRIES[f"{pending}_wait"].returns, WAIT[pending](envs))
        envs.async_reset()
        assert envs.recv()[0].shape == (N, 2)


class HeldEnv(CountEnv):
    """A reset with options, a step and get_value wait at the test's gate (a plain reset does not)."""

    def __init__(self, gate):
        super().__init__()
        self.gate = gate

    def reset(self, *, seed=None, options=None):
        if options:
            self.gate.hold()
        return super().reset(seed=seed)

    def step(self, action):
        self.gate.hold()
        return super().step(action)

    def get_value(self, k=1):
        self.gate.hold()
        return super().get_value(k)


@pytest.mark.parametrize("pending", ["reset", "step", "call"])
def test_a_timed_out_wait_leaves_its_call_pending(no_leaks, gate, pending):
    """Unlike AsyncVectorEnv (whose pipes are out of step after a timeout) the call stays pending:
    other entries are refused until its wait collects it."""
    with shmpool.VectorEnv([functools.partial(HeldEnv, gate)] * N, num_workers=2) as envs:
        envs.reset(seed=0)
        if pending == "reset":
            envs.reset_async(seed=0, options={"slow": True})
        else:
            START[pending](envs)
        wait = getattr(envs, f"{pending}_wait")
        with pytest.raises(multiprocessing.TimeoutError) as info:
            wait(timeout=0.05)
        assert isinstance(info.value, TimeoutError)   # the builtin too: WaitTimeoutError is both
        assert str(info.value) == f"The call to `{pending}_wait` has timed out after 0.05 second(s)."
        assert outcome(lambda e: e.set_attr("value", 7), envs) == already_pending("set_attr", pending)
        gate.open()
        check_result(ENTRIES[f"{pending}_wait"].returns, wait(timeout=30))
