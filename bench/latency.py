"""Latency percentiles: how long one ``pool.step`` / ``pool.recv`` round takes, batch vs no batch.

    python -m bench latency                                   # CartPole-v1, N=8,32,128 × batch 1,8,32
    python -m bench latency --task Ant-v5 --num-envs 8,32 --batch-size 1,4
    python -m bench latency --quick --json /tmp/l.json --png /tmp/l.png  # a few seconds, for tests

The terms are those of agent/observer latency studies: the trainer is the
agent and every env (stepped in a worker) is an observer:

- **agent latency**: one trainer call — ``pool.step(actions)`` over all N envs
  (sync), or ``pool.recv()`` of the first ``batch_size`` envs to finish plus
  ``pool.send()`` of their next actions (async).  Percentiles over every call.
- **agent throughput**: env steps per second of one call, ``batch / latency``
  (the usual definition), so its p90 is the batch over the latency's p10.
- **observer latency**: per env step, from the trainer sending that env's
  action to the ``recv()`` that returns its result — dispatch, the env's step
  and the wait for the rest of its batch.  In sync mode every env of a step
  sees the whole ``step`` call.
- **observer throughput**: ``1 / observer latency`` (steps/s of one env).

"No batch" is ``batch_size=1`` (each env answered as soon as it finishes),
"batch" is ``batch_size=N`` (the sync row, and async with batch = N); the
sweep fills in between.  Each cell opens a fresh pool (not timed), warms it
up, times it for ``--seconds`` and closes it, so no idle pool competes with
the one being measured.  The overall rate (env steps / elapsed) is the
``steps/s`` column.
"""
from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from . import cli
from ._timing import Case, Record, run_interleaved
from .report import RESULTS, consoles, environment, fmt_rate, fmt_us, markdown_table, progress, write_json
from .subjects import POOL, Latency, fixed_actions, open_vec

DEFAULT_TASK = "CartPole-v1"
DEFAULT_NUM_ENVS = (8, 32, 128)
DEFAULT_BATCH_SIZES = (1, 8, 32)
DEFAULT_JSON = str(RESULTS / "latency.json")
MODES = ("sync", "async")
REPORTED = (50, 75, 90, 95, 99)                   # the percentiles in the table and the JSON
MEASURED = (1, 5, 10, 25, *REPORTED)              # low ones too: throughput p90 = batch / latency p10


# --- percentiles ------------------------------------------------------------------------------

def throughput_percentiles(latency_us: dict[str, float], units: int) -> dict[str, float]:
    """Seed 004's throughput percentiles: ``units / latency`` per call, so throughput pQ is latency p(100-Q)."""
    out = {}
    for q in REPORTED:
        lat = latency_us.get(f"p{100 - q}")
        if lat:
            out[f"p{q}"] = units * 1e6 / lat
    return out


def reported(latency_us: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in latency_us.items() if k == "max" or int(k[1:]) in REPORTED}


def open_cell(task: str, mode: str, n: int, batch: int, wait_policy: str | None) -> Latency:
    """A fresh pool of ``n`` envs, ``batch`` per call, every call timed."""
    vec = open_vec(POOL, task, n, batch=batch, asynchronous=mode == "async",
                   **({} if wait_policy is None else {"wait_policy": wait_policy}))
    return Latency(vec, fixed_actions(vec.action_space, n), MEASURED)


# --- the plan ---------------------------------------------------------------------------------

def plan_cells(num_envs: Sequence[int], batch_sizes: Sequence[int], modes: Sequence[str]
               ) -> tuple[list[tuple[str, int, int]], list[dict[str, Any]]]:
    """``(mode, N, batch)`` for every cell, and the skipped async combinations (batch > N)."""
    cells, skipped = [], []
    for n in num_envs:
        if "sync" in modes:
            cells.append(("sync", n, n))
        if "async" in modes:
            for b in batch_sizes:
                if b > n:
                    skipped.append({"num_envs": n, "batch_size": b, "reason": "batch_size > num_envs"})
                else:
                    cells.append(("async", n, b))
    return cells, skipped


def cell_case(task: str, mode: str, n: int, b: int, wait_policy: str | None) -> Case:
    return Case(f"{mode} N={n} batch={b}", functools.partial(open_cell, task, mode, n, b, wait_policy))


def cell_json(task: str, mode: str, n: int, b: int, record: Record) -> dict[str, Any]:
    """One cell: agent (trainer) and observer (env) latency and throughput."""
    out: dict[str, Any] = {"task": task, "mode": mode, "num_envs": n, "batch_size": b}
    info = dict(record.info)
    observer = info.pop("observer_latency_us", None)
    note = info.pop("observer_note", None)
    observer_steps = info.pop("observer_steps", None)
    info.pop("driver_cpu_us_per_call", None)
    out["pool"] = info
    s = record.sample
    if s is not None:
        agent = reported(s.latency_us)
        out.update(
            calls=s.count, env_steps=s.count * b, seconds=s.seconds,
            throughput=s.rate * b, mean_us_per_call=s.us_per_unit,
            agent_latency_us=agent,
            agent_throughput=throughput_percentiles(s.latency_us, b),
            observer_latency_us=reported(observer or {}),
            observer_throughput=throughput_percentiles(observer or {}, 1),
        )
        if observer_steps is not None:
            out["observer_steps"] = observer_steps
        if note:
            out["observer_note"] = note
    out["setup_s"] = round(record.setup_s, 4)
    if record.error is not None:
        out["error"] = record.error
    return out


# --- the run ------------------------------------------------------------------------------------

def run(args: argparse.Namespace, cells: list[tuple[str, int, int]], err: Any) -> list[Record]:
    cases = [cell_case(args.task, mode, n, b, args.wait_policy) for mode, n, b in cells]
    with progress(err, len(cases)) as update:
        return run_interleaved(cases, repeats=1, seconds=args.seconds, warmup=args.warmup,
                               on_start=lambda case, rep: update(description=f"{args.task} · {case.name}"),
                               on_done=lambda _: update(advance=1))


# --- the report ---------------------------------------------------------------------------------

HEADER = ("mode", "N", "batch", "calls", "p50 µs", "p75 µs", "p90 µs", "p95 µs", "p99 µs", "max µs",
          "env p50 µs", "env p99 µs", "env steps/s")


def table_rows(cells: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for c in cells:
        head = [c["mode"], str(c["num_envs"]), str(c["batch_size"])]
        if "agent_latency_us" not in c:
            rows.append([*head, "error", *("—" for _ in HEADER[4:])])
            continue
        a, o = c["agent_latency_us"], c["observer_latency_us"]
        rows.append([*head, str(c["calls"]), *(fmt_us(a[f"p{q}"]) for q in REPORTED), fmt_us(a["max"]),
                     fmt_us(o["p50"]) if "p50" in o else "—", fmt_us(o["p99"]) if "p99" in o else "—",
                     fmt_rate(c["throughput"])])
    return rows


def x_axis_name(args: argparse.Namespace) -> str:
    """The swept variable (``x_axis_name`` in the JSON): the one with more values, num_envs on a tie."""
    return "batch_size" if len(args.batch_size) > len(args.num_envs) else "num_envs"


def report(args: argparse.Namespace, env: dict[str, Any], cells: list[dict[str, Any]],
           skipped: list[dict[str, Any]]) -> None:
    """The table once, as markdown, with what its columns mean."""
    rows = table_rows(cells)
    lines = [
        f"## shmpool latency benchmark — {env['date']}",
        "",
        f"`{args.command}` · {env['cpu_model']} · cpus {env['sched_getaffinity']} · "
        f"python {env['python']}, numpy {env['numpy']}, gymnasium {env['gymnasium']} · "
        f"{args.seconds:g} s per cell (warm-up {args.warmup:g} s) · load average at start "
        f"{' '.join(str(x) for x in env.get('loadavg_at_start', []))}",
        "",
        f"{args.task}: per trainer call (sync: `pool.step` over all N; async: `recv` of `batch` envs + "
        "`send` back), percentiles in µs; env = one env step from its `send` to the `recv` that returns it; "
        "env steps/s = all env steps / elapsed.",
        "",
        markdown_table(HEADER, rows),
    ]
    if skipped:
        combos = ", ".join(f"N={s['num_envs']} batch={s['batch_size']}" for s in skipped)
        lines += ["", f"Skipped (batch_size > num_envs): {combos}."]
    print("\n".join(lines), flush=True)


def json_data(args: argparse.Namespace, env: dict[str, Any], cells: list[dict[str, Any]],
              skipped: list[dict[str, Any]]) -> dict[str, Any]:
    config = {k: v for k, v in vars(args).items() if k != "json"}
    return {
        "benchmark": "bench.latency",
        "environment": env,
        "config": config,
        "x_axis_name": x_axis_name(args),
        "definitions": {
            "agent_latency_us": "one trainer call: pool.step over all N (sync) or recv of batch_size + send (async)",
            "agent_throughput": "env steps/s of one call, batch_size / agent latency (pQ from latency p(100-Q))",
            "observer_latency_us": "one env step, from the trainer sending its action to the recv returning it",
            "observer_throughput": "steps/s of one env, 1 / observer latency",
            "throughput": "env steps / elapsed over the whole cell",
        },
        "skipped": skipped,
        "cells": cells,
    }


# --- the plot ---------------------------------------------------------------------------------

PLOTTED = ("p50", "p75", "p90", "p95", "p99")


def series(cells: Sequence[dict[str, Any]], x: str) -> dict[str, list[dict[str, Any]]]:
    """Cells grouped into lines along ``x``, each sorted by ``x``; cells without a measurement are left out.

    Sync cells always have batch = N, so they make one series whatever the x axis."""
    other = "batch_size" if x == "num_envs" else "num_envs"
    short = "N" if other == "num_envs" else "batch"
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in sorted((c for c in cells if "agent_latency_us" in c), key=lambda c: (c["mode"] != "sync", c[other], c[x])):
        label = "sync (pool.step, batch = N)" if c["mode"] == "sync" else f"async, {short}={c[other]}"
        groups.setdefault(label, []).append(c)
    return groups


def plot(data: dict[str, Any], path: str) -> None:
    """One panel per series: the call's latency percentiles (µs, log, left axis), the env step's p50
    (grey dash-dot) and the throughput in env steps/s (thick black, right axis) along the swept value."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    x = data.get("x_axis_name") or "num_envs"
    groups = series(data["cells"], x)
    if not groups:
        raise ValueError("no measured cells to plot")
    cols = min(2, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.2 * rows), squeeze=False)
    colors = plt.get_cmap("viridis")([0.9, 0.7, 0.5, 0.3, 0.05])
    xs_all = sorted({c[x] for pts in groups.values() for c in pts})
    top = max(c["throughput"] for pts in groups.values() for c in pts)
    for ax, (label, pts) in zip(axes.flat, groups.items()):
        xs = [c[x] for c in pts]
        for p, color in zip(PLOTTED, colors):
            ax.plot(xs, [c["agent_latency_us"][p] for c in pts], "o-", color=color, lw=1.6, ms=4, label=f"call {p}")
        env = [c.get("observer_latency_us", {}).get("p50") for c in pts]
        if all(v is not None for v in env):
            ax.plot(xs, env, "-.", color="0.55", lw=1.3, label="env step p50")
        ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs_all)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(x)
        ax.set_ylabel("latency, µs (log)")
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(label)
        tp = ax.twinx()
        tp.plot(xs, [c["throughput"] for c in pts], "s-", color="black", lw=2.4, ms=6, label="env steps/s")
        tp.set_ylim(0, 1.15 * top)
        tp.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_rate(v)))
        tp.set_ylabel("throughput, env steps/s")
        handles, labels = (a + b for a, b in zip(ax.get_legend_handles_labels(), tp.get_legend_handles_labels()))
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    env = data.get("environment", {})
    fig.suptitle(f"shmpool latency — {data['cells'][0].get('task', '?')} · {env.get('cpu_model', '?')} · cpus "
                 f"{env.get('sched_getaffinity', '?')} · {env.get('date', '')}\nper trainer call: sync pool.step over "
                 "all N, async recv(batch) + send", fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05 if rows > 1 else 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- command line ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench latency", __doc__)
    p.add_argument("--task", default=DEFAULT_TASK, help=f"gymnasium id (default {DEFAULT_TASK})")
    p.add_argument("--num-envs", help="comma list of N (default 8,32,128)")
    p.add_argument("--batch-size", help="comma list of async batch sizes; those > N are skipped (default 1,8,32)")
    p.add_argument("--modes", default="sync,async", help="comma list of sync, async (default both)")
    p.add_argument("--wait-policy", help="the pool's wait_policy (default: the pool's automatic choice)")
    p.add_argument("--png", metavar="PATH", help="plot latency percentiles and throughput along the swept value here "
                                                 "(with --save: beside the tracked JSON)")
    cli.add_run_options(p, cli.RunDefaults(repeats=None, json=DEFAULT_JSON), quick="0.2 s, N=8, batch 1,8",
                        seconds_help="timed seconds per cell")
    args = cli.parse(p, argv)
    quick = args.quick
    args.num_envs = (cli.positive_ints(p, "--num-envs", args.num_envs) if args.num_envs is not None
                     else ([8] if quick else list(DEFAULT_NUM_ENVS)))
    args.batch_size = (cli.positive_ints(p, "--batch-size", args.batch_size) if args.batch_size is not None
                       else ([1, 8] if quick else list(DEFAULT_BATCH_SIZES)))
    args.modes = cli.comma_list(args.modes)
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"--modes must be a comma list of {', '.join(MODES)}, got {','.join(bad) or 'nothing'}")
    cells, _ = plan_cells(args.num_envs, args.batch_size, args.modes)
    if not cells:
        p.error(f"nothing to run: every --batch-size {args.batch_size} is larger than every "
                f"--num-envs {args.num_envs}")
    try:
        gym.make(args.task).close()
    except (gym.error.Error, ImportError) as exc:
        p.error(f"--task {args.task!r} cannot be made here: {type(exc).__name__}: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _, err = consoles()
    cells, skipped = plan_cells(args.num_envs, args.batch_size, args.modes)
    for s in skipped:
        err.print(f"[yellow]skipped[/yellow] N={s['num_envs']} batch={s['batch_size']}: {s['reason']}",
                  highlight=False)
    env = environment()
    records = run(args, cells, err)
    results = [cell_json(args.task, mode, n, b, r) for (mode, n, b), r in zip(cells, records)]
    report(args, env, results, skipped)
    data = json_data(args, env, results, skipped)
    if args.json:
        write_json(args.json, data)
        err.print(f"cells written to {args.json}")
    png = args.png or (str(Path(args.json).with_suffix(".png")) if args.json and getattr(args, "save", False) else None)
    if png and any("agent_latency_us" in c for c in results):
        plot(data, png)
        err.print(f"plot written to {png}")
    failed = [r for r in records if r.error is not None]
    for r in failed:
        err.print(f"{args.task} · {r.case} failed:", style="red", markup=False, highlight=False)
        sys.stderr.write(r.error.rstrip() + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
