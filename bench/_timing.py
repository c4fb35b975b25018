"""The one timing spine of the benchmarks: timed loops, interleaved repetitions, percentiles, summaries.

The machines are noisy (VMs with host steal), so a comparison between systems
is only fair when drift hits them alike: :func:`run_interleaved` runs
repetition 1 of every case, then repetition 2, and so on, and callers report
the median with the min/max of the repetitions.
"""
from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

clock = time.perf_counter


@dataclass(frozen=True)
class Sample:
    """One timed repetition: ``count`` units of work (env steps, round trips) in ``seconds``."""

    count: int
    seconds: float
    latency_us: dict[str, float] | None = None  # per-call percentiles, from latency_loop
    parts_s: dict[str, float] | None = None     # seconds of ``seconds`` spent in named parts of the work

    @property
    def rate(self) -> float:
        """Units per second."""
        return self.count / self.seconds

    @property
    def us_per_unit(self) -> float:
        """Microseconds per unit."""
        return 1e6 * self.seconds / self.count


class Subject(Protocol):
    """Something to time: opened by a :class:`Case`, measured, then closed.

    A subject may carry an ``info`` dict (resolved settings worth recording)."""

    def measure(self, seconds: float, warmup: float) -> Sample:
        """Run untimed for ``warmup`` seconds, then return a sample of about ``seconds``."""
        ...

    def close(self) -> None:
        ...


@dataclass(frozen=True)
class Case:
    """A named way to open a subject; ``open`` is not timed."""

    name: str
    open: Callable[[], Subject]


@dataclass
class Record:
    """One repetition of one case: its sample, or the error that stopped it."""

    case: str
    rep: int
    sample: Sample | None
    setup_s: float
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"case": self.case, "rep": self.rep, "setup_s": round(self.setup_s, 4)}
        if self.sample is not None:
            s = self.sample
            out.update(count=s.count, seconds=s.seconds, rate=s.rate, us_per_unit=s.us_per_unit)
            if s.latency_us is not None:
                out["latency_us"] = s.latency_us
            if s.parts_s is not None:
                out["parts_s"] = s.parts_s
        if self.info:
            out["info"] = self.info
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class DeviceShape:
    """A policy on a GPU as the host sees it: each forward pass or minibatch step is ``wait_s`` of
    sleep for the device and ``cpu_s`` of host CPU (copies, kernel launches)."""

    wait_s: float = 0.003
    cpu_s: float = 0.0005

    def call(self) -> None:
        time.sleep(self.wait_s)
        end = clock() + self.cpu_s
        while clock() < end:
            pass


def timed_loop(step: Callable[[], object], units_per_call: int, seconds: float, warmup: float = 0.0) -> Sample:
    """Call ``step`` for ``warmup`` seconds untimed, then for ``seconds`` timed.

    Every call does ``units_per_call`` units of work.  The clock is read after
    every call: even the fastest step timed here (a ~µs round trip) dwarfs it."""
    end = clock() + warmup
    while clock() < end:
        step()
    calls = 0
    start = now = clock()
    end = start + seconds
    while now < end:
        step()
        calls += 1
        now = clock()
    return Sample(calls * units_per_call, now - start)


def latency_loop(step: Callable[[], object], seconds: float, warmup: float = 0.0,
                 percentiles: Sequence[int] = (50, 90, 99)) -> Sample:
    """:func:`timed_loop` with one unit per call that also keeps every call's latency.

    On a VM with host steal a few millisecond stalls can dominate the mean;
    the percentiles (``p50``... in µs, plus ``max``) tell the cost of a call
    apart from the stalls."""
    ns = time.perf_counter_ns
    end = ns() + int(warmup * 1e9)
    while ns() < end:
        step()
    lat: list[int] = []
    start = now = ns()
    end = start + int(seconds * 1e9)
    while now < end:
        step()
        t = ns()
        lat.append(t - now)
        now = t
    return Sample(len(lat), (now - start) / 1e9, percentiles_of(np.asarray(lat) / 1e3, percentiles))


def run_interleaved(
    cases: Sequence[Case],
    *,
    repeats: int,
    seconds: float,
    warmup: float,
    on_start: Callable[[Case, int], None] | None = None,
    on_done: Callable[[Record], None] | None = None,
) -> list[Record]:
    """Measure every case ``repeats`` times, interleaved: rep 0 of all cases, then rep 1, ...

    Each repetition opens a fresh subject and closes it right after, so no idle subject (workers
    waiting, possibly spinning) runs while another is timed.  An exception in one case is recorded
    (with its traceback) and the run goes on."""
    records: list[Record] = []
    for rep in range(repeats):
        for case in cases:
            if on_start is not None:
                on_start(case, rep)
            record = _measure_once(case, rep, seconds, warmup)
            records.append(record)
            if on_done is not None:
                on_done(record)
    return records


def _measure_once(case: Case, rep: int, seconds: float, warmup: float) -> Record:
    """Open the subject of ``case``, take one sample, close it."""
    t0 = clock()
    subject = None
    try:
        subject = case.open()
        setup_s = clock() - t0
        sample = subject.measure(seconds, warmup)
        info = dict(getattr(subject, "info", {}))
    except Exception:
        # A subject that failed is not trusted again: close it, record why.
        if subject is not None:
            _close_quietly(subject)
        return Record(case.name, rep, None, clock() - t0, error=traceback.format_exc())
    except BaseException:
        if subject is not None:
            _close_quietly(subject)
        raise
    record = Record(case.name, rep, sample, setup_s, info)
    try:
        subject.close()
    except Exception:
        record.error = "while closing:\n" + traceback.format_exc()
    return record


def _close_quietly(subject: Subject) -> None:
    try:
        subject.close()
    except Exception:
        traceback.print_exc()


@dataclass(frozen=True)
class Summary:
    """Median and range of a few repetitions."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Summary | None:
        vals = list(values)
        if not vals:
            return None
        return cls(statistics.median(vals), min(vals), max(vals), len(vals))


def summarize(records: Iterable[Record], case: str, value: Callable[[Sample], float]) -> Summary | None:
    """Summary of ``value(sample)`` over the successful repetitions of ``case``."""
    return Summary.of(value(r.sample) for r in records if r.case == case and r.sample is not None)


# --- per-call and per-env-step latency ---------------------------------------------------------

def percentiles_of(values: Sequence[float] | np.ndarray, qs: Sequence[int]) -> dict[str, float]:
    """``{"p50": ..., "max": ...}``, nearest rank (what :func:`latency_loop` reports, in µs)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    if v.size == 0:
        return {}
    out = {f"p{q}": float(v[min(v.size - 1, v.size * q // 100)]) for q in qs}
    out["max"] = float(v[-1])
    return out


class RecvLog:
    """Which envs each async ``recv()`` returned, and when it returned: two list appends per call."""

    def __init__(self) -> None:
        self.clear()

    def add(self, ids: np.ndarray) -> None:
        self.times.append(time.perf_counter_ns())
        self.ids.append(ids)

    def clear(self) -> None:
        self.ids: list[np.ndarray] = []
        self.times: list[int] = []

    def observer_latencies(self, n: int, timed: int) -> np.ndarray:
        """:func:`observer_latencies` of the calls logged (``n`` envs, the last ``timed`` calls timed)."""
        return observer_latencies(self.ids, self.times, n, timed)


def observer_latencies(ids: Sequence[np.ndarray], times: Sequence[int], n: int, timed: int) -> np.ndarray:
    """µs from the call that sent each env's action to the call that received its result.

    ``ids[k]``/``times[k]``: the envs call k received and when its ``recv()``
    returned (its ``send()`` follows at once).  Only the last ``timed`` calls
    count; an env first seen in them (sent by ``async_reset``) is skipped."""
    sent = np.full(n, -1, dtype=np.int64)
    first_timed = len(ids) - timed
    out = []
    for k, (got, t) in enumerate(zip(ids, times)):
        if k >= first_timed:
            prev = sent[got]
            out.append((t - prev[prev >= 0]) / 1e3)
        sent[got] = t
    return np.concatenate(out) if out else np.zeros(0)
