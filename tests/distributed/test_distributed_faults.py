"""RayPool's waits (shmpool.distributed.faults) against a scripted stand-in for Ray's wait/get/nodes:
no cluster, so the timing rules are checked in well under a second each."""
from __future__ import annotations

import math
import time

import heavy_imports
import pytest

from shmpool.errors import PoolClosedError

heavy_imports.require("ray")
pytestmark = pytest.mark.heavy_imports   # shmpool.distributed.faults imports Ray
ray = heavy_imports.module("ray")
faults = heavy_imports.module("shmpool.distributed.faults")


class ScriptedRay:
    """``ray.wait``/``ray.get``/``ray.nodes`` over futures that finish at set times (never: None)."""

    @property
    def exceptions(self):
        return ray.exceptions

    def __init__(self, finish_at: dict, answers: dict, alive: set[str]) -> None:
        self.t0 = time.monotonic()
        self.finish_at = finish_at
        self.answers = answers
        self.alive = alive

    def _done(self, ref) -> bool:
        at = self.finish_at[ref]
        return at is not None and time.monotonic() - self.t0 >= at

    def wait(self, refs, num_returns, timeout):
        deadline = time.monotonic() + timeout
        while True:
            done = [r for r in refs if self._done(r)]
            if len(done) >= num_returns or time.monotonic() >= deadline:
                return done, [r for r in refs if r not in done]
            time.sleep(0.01)

    def get(self, ref, timeout=None):
        answer = self.answers[ref]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def nodes(self):
        return [{"NodeID": n, "Alive": n in self.alive} for n in ("n0", "n1", "n2")]


def watch(step_timeout=None, timeout=None, cancelled=lambda: False) -> faults.Watch:
    return faults.Watch("step", timeout, step_timeout, lambda k: f"n{k}", lambda ks: f"envs of {ks}",
                        cancelled=cancelled)


def counting_looks(monkeypatch) -> list[int]:
    """How many looks between two slices (``Watch.after_slice``) the waits make from now on: a wait's bound is a
    count of slices, which a loaded machine cannot stretch as it stretches seconds (issue 70)."""
    looks = [0]
    real = faults.Watch.after_slice

    def counted(self, waiting_on):
        looks[0] += 1
        return real(self, waiting_on)
    monkeypatch.setattr(faults.Watch, "after_slice", counted)
    return looks


def test_an_error_in_one_pool_still_waits_for_the_others_and_sees_their_death(monkeypatch):
    """The old code waited for the others blind (``ray.get(other, timeout=None)``) and dropped what
    they raised; here pool 1's death after pool 0's error is an outcome of its own."""
    boom = ray.exceptions.RayTaskError("step", "tb", ValueError("boom"))
    fake = ScriptedRay({"a": 0.0, "b": 0.3, "c": 0.0},
                       {"a": boom, "b": ray.exceptions.ActorDiedError(), "c": 7}, {"n0", "n1", "n2"})
    monkeypatch.setattr(faults, "ray", fake)
    out = faults.gather(["a", "b", "c"], [0, 1, 2], watch())
    assert [o.pool for o in out] == [0, 1, 2]
    assert isinstance(out[0].error, ValueError) and out[0].death is None
    assert isinstance(out[1].death, ray.exceptions.ActorDiedError) and not out[1].node_gone
    assert out[2].value == 7 and out[2].error is None and out[2].death is None


def test_a_pool_that_never_answers_ends_the_wait_at_step_timeout(monkeypatch):
    boom = ray.exceptions.RayTaskError("step", "tb", ValueError("boom"))
    fake = ScriptedRay({"a": 0.0, "b": None}, {"a": boom}, {"n0", "n1"})
    monkeypatch.setattr(faults, "ray", fake)
    looks = counting_looks(monkeypatch)
    t0 = time.monotonic()
    with pytest.raises(faults.StepTimeoutError, match=r"step_timeout=0.5 s: pools \[1\] \(envs of \[1\]\)"):
        faults.gather(["a", "b"], [0, 1], watch(step_timeout=0.5))
    # Pool 1 never answers: the StepTimeoutError is the event; it waited its 0.5 s (a lower bound: no load makes
    # it flaky) and fired at the look that found 0.5 s passed: 0.5 s holds two full 0.25 s slices, so the third
    # look at the latest, or the fourth should the first slice end early.
    assert time.monotonic() - t0 >= 0.5
    assert 1 <= looks[0] <= math.ceil(0.5 / faults.SLICE_S) + 2, looks


def test_only_a_passed_step_timeout_runs_the_pool_s_shut_down_before_it_raises():
    """RayPool hands its watches ``on_step_timeout`` (kill the actors): it runs once, before the StepTimeoutError
    leaves the wait, and never for the caller's own ``timeout``, which leaves the call pending."""
    calls = []
    own = faults.Watch("step", 1.0, None, lambda k: f"n{k}", lambda ks: "", start=time.monotonic() - 2.0,
                       on_step_timeout=lambda: calls.append("own"))
    with pytest.raises(TimeoutError, match="it is still pending"):
        own.after_slice([0])
    assert calls == []
    fatal = faults.Watch("step", None, 1.0, lambda k: f"n{k}", lambda ks: "", start=time.monotonic() - 2.0,
                         on_step_timeout=lambda: calls.append("fatal"))
    with pytest.raises(faults.StepTimeoutError):
        fatal.after_slice([0])
    assert calls == ["fatal"]


def test_a_watch_counts_its_limits_from_the_start_it_is_given():
    """RayPool's sync step waits one slice before it builds its watch: the limits still count from the call."""
    late = faults.Watch("step", 1.0, None, lambda k: f"n{k}", lambda ks: "", start=time.monotonic() - 2.0)
    with pytest.raises(TimeoutError, match=r"step did not finish within 1.0 s"):
        late.after_slice([0])
    fresh = faults.Watch("step", 1.0, None, lambda k: f"n{k}", lambda ks: "")
    fresh.last_liveness = time.monotonic()   # no GCS here: only the limits are checked
    assert fresh.after_slice([0]) == []


def test_the_callers_timeout_leaves_the_call_pending(monkeypatch):
    fake = ScriptedRay({"a": None}, {}, {"n0"})
    monkeypatch.setattr(faults, "ray", fake)
    with pytest.raises(TimeoutError, match="still pending") as info:
        faults.gather(["a"], [0], watch(timeout=0.3, step_timeout=60))
    assert not isinstance(info.value, faults.StepTimeoutError)


def test_a_pool_whose_node_left_is_a_death_without_waiting_for_ray(monkeypatch):
    fake = ScriptedRay({"a": 0.0, "b": None}, {"a": 1}, {"n0"})   # n1 is gone; Ray would keep b pending
    monkeypatch.setattr(faults, "ray", fake)
    looks = counting_looks(monkeypatch)
    out = faults.gather(["a", "b"], [0, 1], watch())
    # b stays pending for good and there is no timeout: returning at all is the event (the node_gone checked
    # below), at the first look (its liveness check runs at once).
    assert looks == [1]
    assert out[0].value == 1
    assert out[1].node_gone and isinstance(out[1].death, ray.exceptions.ActorDiedError)


def test_a_close_requested_meanwhile_stops_the_wait(monkeypatch):
    fake = ScriptedRay({"a": None}, {}, {"n0"})
    monkeypatch.setattr(faults, "ray", fake)
    looks = counting_looks(monkeypatch)
    asked = []

    def cancelled() -> bool:
        asked.append(looks[0])
        return looks[0] >= 2   # close() requested during the second slice

    with pytest.raises(PoolClosedError, match="while this call was in progress"):
        faults.gather(["a"], [0], watch(cancelled=cancelled))
    # a stays pending for good: the PoolClosedError is the event; the close is seen at the first look after it.
    assert asked == [1, 2] and looks == [2]


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_a_raypool_refuses_to_be_copied(how):
    import copy
    import pickle

    from shmpool.distributed import RayPool

    pool = RayPool.__new__(RayPool)   # no cluster needed: the refusal comes before any state is read
    do = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": pickle.dumps}[how]
    with pytest.raises(TypeError, match="a RayPool cannot be copied or pickled"):
        do(pool)
