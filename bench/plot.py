"""Plot a ``python -m bench latency`` JSON file: latency percentiles and throughput against the swept value.

    python -m bench plot bench/results/latency.json                  # -> bench/results/latency.png
    python -m bench plot latency.json --x batch_size --out by_batch.png

One panel per series (sync, and async at each value of the variable not on
the x axis).  In each panel the lines are the trainer call's latency
percentiles (p50 ... p99, µs, log scale, left axis), the grey dash-dot line
is the env step's p50 (send → recv), and the thick black line is the
throughput in env steps/s (right axis).
"""
from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

X_AXES = ("num_envs", "batch_size")
PERCENTILES = ("p50", "p75", "p90", "p95", "p99")


def series(cells: Sequence[dict[str, Any]], x: str) -> dict[str, list[dict[str, Any]]]:
    """Cells grouped into lines along ``x``, each sorted by ``x``; cells without a measurement are left out.

    Sync cells always have batch = N, so they make one series whatever the x axis."""
    other = "batch_size" if x == "num_envs" else "num_envs"
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        if "agent_latency_us" not in c:
            continue
        label = "sync (pool.step, batch = N)" if c["mode"] == "sync" else f"async, {_short(other)}={c[other]}"
        groups.setdefault(label, []).append(c)
    for pts in groups.values():
        pts.sort(key=lambda c: c[x])

    def order(label: str) -> tuple[int, int]:
        first = groups[label][0]
        return (0, 0) if first["mode"] == "sync" else (1, first[other])

    return {label: groups[label] for label in sorted(groups, key=order)}


def _short(name: str) -> str:
    return "N" if name == "num_envs" else "batch"


def plot(data: dict[str, Any], x: str, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    groups = series(data["cells"], x)
    if not groups:
        raise ValueError("no measured cells to plot")
    cols = min(2, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.2 * rows), squeeze=False)
    colors = plt.get_cmap("viridis")([0.9, 0.7, 0.5, 0.3, 0.05])
    xs_all = sorted({c[x] for pts in groups.values() for c in pts})
    ymin = min(c["agent_latency_us"]["p50"] for pts in groups.values() for c in pts)
    ymax = max(max(c["agent_latency_us"]["p99"], c.get("observer_latency_us", {}).get("p50", 0))
               for pts in groups.values() for c in pts)
    rate = FuncFormatter(lambda v, _: _fmt_rate(v))

    for ax, (label, pts) in zip(axes.flat, groups.items()):
        xs = [c[x] for c in pts]
        for p, color in zip(PERCENTILES, colors):
            ax.plot(xs, [c["agent_latency_us"][p] for c in pts], "o-", color=color, lw=1.6, ms=4,
                    label=f"call {p}")
        env = [c.get("observer_latency_us", {}).get("p50") for c in pts]
        if all(v is not None for v in env):
            ax.plot(xs, env, "-.", color="0.55", lw=1.3, label="env step p50")
        ax.set_yscale("log")
        ax.set_ylim(ymin / 1.5, ymax * 1.5)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs_all)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(min(xs_all) / 1.4, max(xs_all) * 1.4)
        ax.set_xlabel(x)
        ax.set_ylabel("latency, µs (log)")
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(label)
        tp = ax.twinx()
        tp.plot(xs, [c["throughput"] for c in pts], "s-", color="black", lw=2.4, ms=6, label="env steps/s")
        tp.set_ylim(0, 1.15 * max(c["throughput"] for pts2 in groups.values() for c in pts2))
        tp.yaxis.set_major_formatter(rate)
        tp.set_ylabel("throughput, env steps/s")
        handles, labels = (a + b for a, b in zip(ax.get_legend_handles_labels(), tp.get_legend_handles_labels()))
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)

    env = data.get("environment", {})
    task = data["cells"][0].get("task", "?")
    fig.suptitle(f"shmpool latency — {task} · {env.get('cpu_model', '?')} · cpus {env.get('sched_getaffinity', '?')}"
                 f" · {env.get('date', '')}\nper trainer call: sync pool.step over all N, async recv(batch) + send",
                 fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05 if rows > 1 else 0.08, 1, 1))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _fmt_rate(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench plot", description=__doc__.split("\n\n")[0])
    p.add_argument("json", help="a JSON file written by `python -m bench latency`")
    p.add_argument("--x", choices=X_AXES, help="the swept value on the x axis (default: the file's x_axis_name)")
    p.add_argument("--out", help="PNG path (default: the JSON path with .png)")
    args = p.parse_args(argv)
    try:
        data = json.loads(Path(args.json).read_text())
    except (OSError, ValueError) as exc:
        p.error(f"cannot read {args.json}: {exc}")
    if not isinstance(data, dict) or "cells" not in data:
        p.error(f"{args.json} is not a `python -m bench latency` result (no 'cells')")
    x = args.x or data.get("x_axis_name") or "num_envs"
    out = args.out or str(Path(args.json).with_suffix(".png"))
    try:
        plot(data, x, out)
    except (KeyError, ValueError) as exc:
        p.error(f"cannot plot {args.json}: {type(exc).__name__}: {exc}")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
