"""What every benchmark reports the same way: the run's environment, number formats, tables,
targets, the repetitions of one cell, progress, failures and the JSON file."""
from __future__ import annotations

import contextlib
import datetime
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

import shmpool

from ._timing import Case, Record, Summary, run_interleaved, summarize

RESULTS = Path(__file__).resolve().parent / "results"   # bench/results: the default home of every results file

# --- the run's environment ---------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """Versions, cpu, affinity, memory policy and date: what a reader needs to compare two runs."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "mujoco": version_of("mujoco"),
        "shmpool": shmpool.__version__,
        "git_commit": git_commit(),
        "platform": platform.platform(),
        "cpu_model": proc_field("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "sched_getaffinity": sorted(os.sched_getaffinity(0)),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        # What numactl --membind/--cpunodebind left in force (inherited by the workers).
        "mems_allowed": proc_field("/proc/self/status", "Mems_allowed_list"),
        "numa_policy": numa_policy(),
        "start_method": mp.get_start_method(),
    }


BUSY_ABOVE = 0.2   # other processes' share of the allowed cores that makes every ratio move


def busy_machine(sample_s: float = 1.0) -> str | None:
    """What other processes take of this run's allowed cores, said before any table when it is more
    than ``BUSY_ABOVE`` (a neighbour's tests, a build): measured over ``sample_s`` while this process
    sleeps, so all of it is theirs.  None on a quiet machine."""
    cpus = sorted(os.sched_getaffinity(0))
    per_cpu = psutil.cpu_percent(interval=sample_s, percpu=True)
    used = [per_cpu[c] / 100 for c in cpus if c < len(per_cpu)]
    share = sum(used) / max(len(used), 1)
    if share <= BUSY_ABOVE:
        return None
    return (f"the machine is busy: other processes used {share:.0%} of cpus {cpus} over {sample_s:g} s before the "
            f"run (load average {os.getloadavg()[0]:.1f}); shmpool's ratios need its cores free and fall with that "
            "share, so read MISS lines below as this machine's, not the library's (bench/README.md)")


def git_commit() -> str | None:
    """HEAD of the checkout this package runs from, ``+dirty`` when tracked files differ from it."""
    root = Path(__file__).resolve().parent.parent

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def proc_field(path: str, name: str) -> str | None:
    """The first ``name: value`` line's value in a /proc file (``/proc/cpuinfo``'s ``model name``,
    ``/proc/self/status``'s ``Mems_allowed_list``: the NUMA nodes memory may come from), or None."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    return next((v.strip() for k, _, v in (line.partition(":") for line in lines) if k.strip() == name), None)


def numa_policy() -> str | None:
    """This process's memory policy as ``numactl --show`` prints it (``policy: bind; membind: 0``
    after ``numactl --membind=0``), or None when numactl is not installed."""
    try:
        out = subprocess.run(["numactl", "--show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return "; ".join(f"{k}: {fields[k].strip()}" for k in ("policy", "membind") if k in fields) or None


def version_of(module: str) -> str | None:
    """``module.__version__`` if it imports, else None."""
    try:
        return __import__(module).__version__
    except Exception:   # ImportError, or a broken binary wheel
        return None


# --- numbers and tables ------------------------------------------------------------------------


def fmt_rate(v: float) -> str:
    """Three significant digits with a k/M suffix: 176k, 17.7k, 4.44k."""
    div, suffix = next((d, s) for d, s in ((1e6, "M"), (1e3, "k"), (1.0, "")) if v >= d or d == 1.0)
    return f"{v / div:.{max(0, 3 - len(str(int(v / div))))}f}{suffix}"


def fmt_summary(s: Summary | None, fmt: Callable[[float], str] = fmt_rate) -> str:
    """``median (min–max)``; ``error`` when nothing was measured."""
    if s is None:
        return "error"
    if s.n == 1:
        return fmt(s.median)
    return f"{fmt(s.median)} ({fmt(s.lo)}–{fmt(s.hi)})"


def fmt_ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}×"


def fmt_us(v: float) -> str:
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def stderr_console() -> Any:
    """A rich console on stderr, for progress, skips and failures (reports go to stdout with ``print``)."""
    from rich.console import Console
    return Console(stderr=True)


@contextlib.contextmanager
def progress(err: Any, total: int) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr; yields ``update(description=None, advance=0, last=None)``.

    No auto-refresh: a refresh thread would compete for the GIL and the cores being measured."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[last]}"))
    with Progress(*columns, console=err, auto_refresh=False) as bar:
        task = bar.add_task("starting", total=total, last="")

        def update(description: str | None = None, advance: int = 0, last: str | None = None) -> None:
            fields: dict[str, Any] = {"advance": advance}
            if description is not None:
                fields["description"] = description
            if last is not None:
                fields["last"] = last
            bar.update(task, **fields)
            bar.refresh()

        yield update


def write_results(path: str | Path, data: dict[str, Any], text: str, err: Any) -> None:
    """The raw measurements as indented JSON at ``path`` (its directory created) and the report beside it
    (``.md``), said on ``err``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    md = Path(path).with_suffix(".md")
    md.write_text(text + "\n")
    err.print(f"raw measurements written to {path}, the report to {md}")


def header(title: str, args: Any, env: dict[str, Any], *details: str) -> str:
    """A report's title and the line under it: the command, the machine and its load, ``details``
    (versions, settings), and the repetitions (``args.seconds`` each when the command has it)."""
    reps = f"{args.repeats} interleaved repetitions" + (
        f" × {args.seconds:g} s (warm-up {args.warmup:g} s)" if getattr(args, "seconds", None) else "")
    return (f"## {title} — {env['date']}\n\n" + " · ".join([
        f"`{args.command}`", env["cpu_model"], f"cpus {env['sched_getaffinity']}",
        f"load average {env['loadavg_at_start'][0]:.2f} at start", *details, reps]))


def say_skipped(skipped: dict[str, str], err: Any) -> None:
    """One line on ``err`` per task left out of the run, with why."""
    for task, reason in skipped.items():
        err.print(f"[yellow]{task} skipped[/yellow] — {reason}", highlight=False)


def config_of(args: Any, *leave_out: str) -> dict[str, Any]:
    """The parsed options worth recording (output paths left out)."""
    return {k: v for k, v in vars(args).items() if k not in ("json", "md", "png", *leave_out)}


# --- the repetitions of one cell ---------------------------------------------------------------


@dataclass
class Group:
    """The repetitions of one (task, N) cell: every case (system) of the cell, interleaved."""

    task: str
    num_envs: int
    cases: list[Case]
    records: list[Record]

    def rate(self, system: str) -> Summary | None:
        return summarize(self.records, system, lambda s: s.rate)

    def us(self, system: str) -> Summary | None:
        return summarize(self.records, system, lambda s: s.us_per_unit)

    def latency(self, system: str, key: str) -> Summary | None:
        return summarize((r for r in self.records if r.sample is not None and r.sample.latency_us),
                         system, lambda s: s.latency_us[key])

    def ratio(self, num: str, den: str) -> float | None:
        """Median rate of ``num`` ÷ median rate of ``den`` (None if either did not run)."""
        a, b = self.rate(num), self.rate(den)
        return None if a is None or b is None else a.median / b.median

    def ran(self, system: str) -> bool:
        return any(c.name == system for c in self.cases)

    def errors(self) -> list[Record]:
        return [r for r in self.records if r.error is not None]

    def where(self) -> str:
        return f"{self.task} N={self.num_envs}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task": self.task, "num_envs": self.num_envs, "systems": {}}
        for case in self.cases:
            rate, us = self.rate(case.name), self.us(case.name)
            out["systems"][case.name] = {
                "samples": [r.to_json() for r in self.records if r.case == case.name],
                "median_rate": rate and rate.median, "min_rate": rate and rate.lo, "max_rate": rate and rate.hi,
                "median_us": us and us.median,
            }
        return out


def run_cells(cells: Sequence[tuple[str, int]], cases_of: Callable[[str, int], list[Case]], args: Any, err: Any,
              per_cell: int) -> list[Group]:
    """Every (task, N) cell's cases (``cases_of``, about ``per_cell`` of them), ``args.repeats`` interleaved
    repetitions of ``args.seconds`` (``args.warmup`` untimed) each, with a progress bar on stderr."""
    groups = []
    with progress(err, len(cells) * per_cell * args.repeats) as update:
        for task, n in cells:
            def on_start(case: Case, rep: int, where: str = f"{task} N={n}") -> None:
                update(description=f"{where} · {case.name} · rep {rep + 1}/{args.repeats}")

            def on_done(r: Record) -> None:
                update(advance=1, last="failed" if r.sample is None else f"{r.case}: {fmt_rate(r.sample.rate)}/s")

            cases = cases_of(task, n)
            records = run_interleaved(cases, repeats=args.repeats, seconds=args.seconds, warmup=args.warmup,
                                      on_start=on_start, on_done=on_done)
            groups.append(Group(task, n, cases, records))
    return groups


def print_failures(groups: Iterable[Any], err: Any) -> int:
    """Every recorded failure of ``groups`` (each with ``records`` and ``where()``) with its traceback, on
    stderr; returns how many there were."""
    failed = [(g, r) for g in groups for r in g.records if r.error is not None]
    for g, r in failed:
        err.print(f"{g.where()} · {r.case} · rep {r.rep + 1} failed:", style="red", markup=False, highlight=False)
        sys.stderr.write(r.error.rstrip() + "\n")  # not through rich: no markup, no re-wrapping
    return len(failed)


def finish(args: Any, benchmark: str, env: dict[str, Any], text: str, err: Any, groups: Iterable[Any],
           **fields: Any) -> int:
    """Print the report ``text``; with ``--json`` write it and the raw measurements (``benchmark``, ``env``,
    the options, then ``fields``); say every failure.  Returns the exit status: 1 if a cell failed."""
    print(text, flush=True)
    if args.json:
        write_results(args.json, {"benchmark": benchmark, "environment": env, "config": config_of(args), **fields},
                      text, err)
    return 1 if print_failures(groups, err) else 0


# --- targets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A ratio a benchmark is expected to reach; ``at_most`` for "within N×" targets.

    ``moves`` says what the ratio depends on, printed with a MISS so that a reader knows
    whether the miss is the code's or the machine's.  ``informational``: a figure to watch that
    no code change can reach (its own ``moves`` says why): shown, never a PASS or a MISS."""

    label: str
    goal: float
    value: float | None
    at_most: bool = False
    note: str = ""
    moves: str = ""
    informational: bool = False

    @property
    def status(self) -> str:
        if self.value is None:
            return "not measured"
        if self.informational:
            return "informational"
        ok = self.value <= self.goal if self.at_most else self.value >= self.goal
        return "PASS" if ok else "MISS"

    def line(self) -> str:
        if self.value is None:
            return f"- {self.label}: not measured"
        text = f"- {self.label}: {fmt_ratio(self.value)} — {self.status}" + (f" ({self.note})" if self.note else "")
        if self.status in ("MISS", "informational") and self.moves:
            text += f". What moves it: {self.moves}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"target": self.label, "goal": self.goal, "at_most": self.at_most, "value": self.value,
                "status": self.status}
