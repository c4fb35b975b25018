"""Latency percentiles: how long one ``pool.step`` / ``pool.recv`` round takes, batch vs no batch, locally or
through RayPool.

    python -m bench latency                                   # CartPole-v1, N=8,32,128 × batch 1,8,32
    python -m bench latency --task Ant-v5 --num-envs 8,32 --batch-size 1,4
    python -m bench latency --ray 2 --task Pong --num-envs 16 --batch-size 8 --repeats 3   # RayPool beside Pool
    sudo python -m bench latency --ray 2 --task Pong --num-envs 16 --batch-size 8 --netem 100us,1ms   # over a link

Agent latency: one trainer call (sync step over N, or async recv of a batch + send), percentiles over
every call; agent throughput: batch / latency.  Observer latency: one env step, from the call that sent
its action to the recv that returned it.  Each cell opens a fresh pool.  ``--ray NODES`` starts a local
Ray cluster (1 CPU a node) and runs every cell also through RayPool (one pool of one pinned worker per
node) beside a local Pool with as many workers on the same cores: overhead = RayPool's p50 minus the
local Pool's.  ``--netem DELAYS`` (root) adds, per delay, the RayPool cells again with its direct connections
over a link between two network namespaces with that delay each way (a veth pair with ``tc netem``, or TAP devices
joined by a delaying relay where the kernel has no netem: bench/netem.py).  Tasks:
gymnasium ids, ``empty`` (a step that does nothing) and ``Pong`` (gymnasium's
Pong-v5 with EnvPool's preprocessing).  How to read it: bench/README.md, "latency".
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from . import cli, envs, netem, netns, report, subjects
from ._timing import Case, Record, percentiles_of, run_interleaved

DEFAULT_TASK = "CartPole-v1"
DEFAULT_NUM_ENVS = (8, 32, 128)
DEFAULT_BATCH_SIZES = (1, 8, 32)
DEFAULT_JSON = str(report.RESULTS / "latency.json")
MODES = ("sync", "async")
REPORTED = (50, 75, 90, 95, 99)                   # the percentiles in the table and the JSON
MEASURED = (1, 5, 10, 25, *REPORTED)              # low ones too: throughput p90 = batch / latency p10


def throughput_percentiles(latency_us: dict[str, float], units: int) -> dict[str, float]:
    """Seed 004's throughput percentiles: ``units / latency`` per call, so throughput pQ is latency p(100-Q)."""
    return {f"p{q}": units * 1e6 / lat for q in REPORTED if (lat := latency_us.get(f"p{100 - q}"))}


def reported(latency_us: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in latency_us.items() if k == "max" or int(k[1:]) in REPORTED}


# --- the cells --------------------------------------------------------------------------------

def env_spec(task: str) -> Any:
    """What the pools step: a gymnasium id, or bench.envs' constructor for ``empty`` and ``Pong``."""
    return {"empty": envs.EmptyEnv, "Pong": functools.partial(envs.gym_atari, "Pong-v5")}.get(task, task)


def plan_cells(num_envs: Sequence[int], batch_sizes: Sequence[int], modes: Sequence[str]
               ) -> tuple[list[tuple[str, int, int]], list[dict[str, Any]]]:
    """``(mode, N, batch)`` for every cell, and the skipped async combinations (batch > N)."""
    cells, skipped = [], []
    for n in num_envs:
        if "sync" in modes:
            cells.append(("sync", n, n))
        for b in batch_sizes if "async" in modes else ():
            if b > n:
                skipped.append({"num_envs": n, "batch_size": b, "reason": "batch_size > num_envs"})
            else:
                cells.append(("async", n, b))
    return cells, skipped


def open_cell(task: str, mode: str, n: int, batch: int, wait_policy: str | None, system: str = "local",
              cpus: list[int] | None = None, route: str | None = None) -> subjects.Latency:
    """A fresh pool of ``n`` envs, ``batch`` per call, every call timed.  With ``cpus`` (the Ray runs): the
    local pool has a pinned worker per listed core, RayPool one pool of one worker per core's node; ``route``:
    the RayPool's direct connections cross that netem link (:attr:`bench.netem.Link.route`)."""
    options: dict[str, Any] = {} if wait_policy is None else {"wait_policy": wait_policy}
    ray = system.startswith("ray")
    if ray:
        options.update(num_workers=1, per_pool_kwargs=[{"cpus": [c]} for c in cpus])
    elif cpus is not None:
        options.update(num_workers=len(cpus), cpus=cpus)
    with routed(route):
        vec = subjects.open_vec(subjects.RAY if ray else subjects.POOL, env_spec(task), n, batch=batch,
                                asynchronous=mode == "async", **options)
    space = vec.action_space   # the Ray runs step no-op zeros (as they always did), the others fixed actions
    actions = np.zeros((n, *space.shape), space.dtype) if cpus is not None else subjects.fixed_actions(space, n)
    return subjects.Latency(vec, actions, MEASURED)


@contextlib.contextmanager
def routed(route: str | None) -> Iterator[None]:
    """While a RayPool is built: its connections over ``route`` (None: the node's own address), read by its fleet."""
    from shmpool.distributed.fleet import ROUTE
    if route is None:
        yield
        return
    token = ROUTE.set(netns.route(route))
    try:
        yield
    finally:
        ROUTE.reset(token)


def cell_json(task: str, mode: str, system: str, n: int, b: int, records: list[Record]) -> dict[str, Any]:
    """One cell: agent (trainer) and observer (env) latency and throughput, medians over the repetitions."""
    out: dict[str, Any] = {"task": task, "mode": mode, "system": system, "num_envs": n, "batch_size": b}
    ok = [r for r in records if r.sample is not None]
    out["reps"] = len(ok)
    if ok:
        def median(value: Any) -> float:
            return float(np.median([value(r) for r in ok]))
        info = {k: v for k, v in ok[0].info.items() if not k.startswith(("observer_", "driver_"))}
        agent = {k: median(lambda r, k=k: r.sample.latency_us[k]) for k in ok[0].sample.latency_us}
        observer = {k: median(lambda r, k=k: r.info["observer_latency_us"][k])
                    for k in ok[0].info.get("observer_latency_us", {})}
        calls = sum(r.sample.count for r in ok)
        out.update(pool=info, calls=calls, env_steps=calls * b, seconds=sum(r.sample.seconds for r in ok),
                   throughput=median(lambda r: r.sample.rate * b),
                   mean_us_per_call=median(lambda r: r.sample.us_per_unit),
                   rep_p50_us={r.rep: r.sample.latency_us["p50"] for r in ok},
                   agent_latency_us=reported(agent), agent_throughput=throughput_percentiles(agent, b),
                   observer_latency_us=reported(observer), observer_throughput=throughput_percentiles(observer, 1),
                   driver_cpu_us_per_call=median(lambda r: r.info["driver_cpu_us_per_call"]),
                   setup_s=round(median(lambda r: r.setup_s), 4))
        for key in ("observer_note", "observer_steps"):
            if key in ok[0].info:
                out[key] = ok[0].info[key]
    errors = [r.error for r in records if r.error]
    if errors:
        out["error"] = errors[0]
    return out


def with_overheads(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``overhead_us`` (Ray p50/p95 − local p50/p95 of the same cell; ``paired_p50``: the median over
    repetitions of Ray's p50 − local's p50 in that repetition, which cancels the host's drift between repetitions,
    and ``paired_p50_ci95``) and ``throughput_ratio`` to the Ray cells."""
    local = {(c["mode"], c["num_envs"], c["batch_size"]): c for c in cells if c["system"] == "local"}
    for c in cells:
        twin = local.get((c["mode"], c["num_envs"], c["batch_size"]))
        if c["system"].startswith("ray") and twin and "agent_latency_us" in c and "agent_latency_us" in twin:
            c["overhead_us"] = {q: c["agent_latency_us"][q] - twin["agent_latency_us"][q] for q in ("p50", "p95")}
            pairs = [p50 - twin["rep_p50_us"][rep] for rep, p50 in c["rep_p50_us"].items() if rep in twin["rep_p50_us"]]
            c["overhead_us"]["paired_p50"] = float(np.median(pairs)) if pairs else None
            # Whether a bound is met by the run, not by the host's drift: a 95 % interval for that median, the k-th
            # smallest and largest pairs, k the most that P(Binomial(n, 1/2) < k) <= 2.5 % allows (0 under 6 pairs).
            pairs, n = sorted(pairs), len(pairs)
            k = sum(tail <= 0.025 for tail in itertools.accumulate(math.comb(n, j) / 2**n for j in range(n // 2)))
            c["overhead_us"]["paired_p50_ci95"] = [float(pairs[k - 1]), float(pairs[-k])] if k else None
            c["throughput_ratio"] = c["throughput"] / twin["throughput"]
    return cells


# --- a local Ray cluster ----------------------------------------------------------------------

class RayCluster:
    """A local Ray cluster of ``nodes`` nodes (1 CPU, ``store_mb`` of object store each), a driver connected to
    it, and Ray's floor: one actor call's round trip.  The nodes need not import this package: bench.envs and
    this module go to them by value."""

    def __init__(self, nodes: int, store_mb: int) -> None:
        import cloudpickle
        import ray
        from ray import cloudpickle as ray_cloudpickle
        from ray.cluster_utils import Cluster
        for module in (sys.modules[__name__], envs, netns):
            cloudpickle.register_pickle_by_value(module)
            ray_cloudpickle.register_pickle_by_value(module)
        t0, config = time.monotonic(), {"num_cpus": 1, "object_store_memory": store_mb * 2**20}
        self.cluster = Cluster(initialize_head=True, head_node_args={**config, "include_dashboard": False})
        for _ in range(nodes - 1):
            self.cluster.add_node(**config)
        ray.init(address=self.cluster.address, include_dashboard=False, log_to_driver=False)
        self.info: dict[str, Any] = {"nodes": nodes, "store_mb": store_mb, "startup_s": time.monotonic() - t0}
        pong_obs = 4 * 84 * 84   # bytes of one Pong observation (uint8)
        self.info["round_trip_us"] = {"empty": self.round_trip_us(0),
                                      "8 Pong obs (221 KiB)": self.round_trip_us(8 * pong_obs)}

    @staticmethod
    def round_trip_us(payload_bytes: int, calls: int = 300) -> dict[str, float]:
        """p50/p95 µs of ``ray.get(actor.echo.remote(x))`` to an actor on the last node: Ray's floor per call."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        node = [n["NodeID"] for n in ray.nodes() if n["Alive"]][-1]
        strategy = NodeAffinitySchedulingStrategy(node, soft=False)
        actor = ray.remote(Echo).options(num_cpus=0, scheduling_strategy=strategy).remote()
        x, lat = np.zeros(payload_bytes, dtype=np.uint8), []
        try:
            for k in range(20 + calls):
                t = time.perf_counter_ns()
                ray.get(actor.echo.remote(x))
                if k >= 20:   # the first 20: warm-up
                    lat.append((time.perf_counter_ns() - t) / 1e3)
        finally:
            ray.kill(actor)
        return percentiles_of(lat, (50, 95))

    def close(self) -> None:
        import ray
        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()


class Echo:
    """The actor of Ray's floor: returns what it is given."""

    def echo(self, x: Any) -> Any:
        return x


# --- the report ---------------------------------------------------------------------------------

HEADER = ("mode", "N", "batch", "calls", "p50 µs", "p75 µs", "p90 µs", "p95 µs", "p99 µs", "max µs",
          "env p50 µs", "env p99 µs", "env steps/s")
RAY_HEADER = ("system", "driver CPU µs", "overhead p50 µs", "paired overhead µs", "Ray / local")


def table_rows(cells: Sequence[dict[str, Any]], ray: bool) -> list[list[str]]:
    rows = []
    for c in cells:
        row = [c["mode"], str(c["num_envs"]), str(c["batch_size"])]
        if "agent_latency_us" not in c:
            row += ["error", *("—" for _ in HEADER[4:])]
        else:
            a, o = c["agent_latency_us"], c["observer_latency_us"]
            row += [str(c["calls"]), *(report.fmt_us(a[f"p{q}"]) for q in REPORTED), report.fmt_us(a["max"]),
                    report.fmt_us(o["p50"]) if "p50" in o else "—", report.fmt_us(o["p99"]) if "p99" in o else "—",
                    report.fmt_rate(c["throughput"])]
        if ray:
            over, ratio = c.get("overhead_us", {}), c.get("throughput_ratio")
            paired, interval = over.get("paired_p50"), over.get("paired_p50_ci95")
            paired = ("—" if paired is None else report.fmt_us(paired)) + (
                "" if interval is None else f" ({report.fmt_us(interval[0])} – {report.fmt_us(interval[1])})")
            row += [c["system"], *("—" if v is None else report.fmt_us(v) for v in (
                c.get("driver_cpu_us_per_call"), over.get("p50"))), paired,
                "—" if ratio is None else f"{ratio:.2f}"]
        rows.append(row)
    return rows


def x_axis_name(args: argparse.Namespace) -> str:
    """The swept variable (``x_axis_name`` in the JSON): the one with more values, num_envs on a tie."""
    return "batch_size" if len(args.batch_size) > len(args.num_envs) else "num_envs"


def write_report(args: argparse.Namespace, env: dict[str, Any], cells: list[dict[str, Any]],
                 skipped: list[dict[str, Any]], ray: dict[str, Any] | None) -> str:
    """The table once, as markdown, with what its columns mean (printed, and returned)."""
    lines = [report.header("shmpool latency benchmark", args, env, f"python {env['python']}, numpy {env['numpy']}, "
                           f"gymnasium {env['gymnasium']} · medians"), "",
             f"{args.task}: per trainer call (sync: `step` over all N; async: `recv` of `batch` envs + `send` back), "
             "percentiles in µs; env = one env step from its `send` to the `recv` that returns it; env steps/s = "
             "all env steps / elapsed."]
    if ray:
        lines += ["", f"Ray: {ray['nodes']} local nodes (1 CPU, {ray['store_mb']} MB store each) on cpus {args.cpus}, "
                  f"start-up {ray['startup_s']:.1f} s; Ray's floor, one actor call (`ray.get(actor.echo.remote(x))`, "
                  "p50 / p95 µs): " + "; ".join(f"{k} {report.fmt_us(v['p50'])} / {report.fmt_us(v['p95'])}"
                                                for k, v in ray["round_trip_us"].items())
                  + ". Driver CPU = this process's CPU per call (all threads); overhead = Ray p50 − local p50; paired: "
                  "the median over repetitions of Ray p50 − local p50 in the same repetition (in parentheses, a 95 % "
                  "interval for it from 6 repetitions on)."]
    if ray and ray.get("netem"):
        trips = "; ".join(f"{label} ({v.get('link', netem.NETEM)}) {report.fmt_us(v['round_trip_us']['p50'])} / "
                          f"{report.fmt_us(v['round_trip_us']['p95'])}" for label, v in ray["netem"].items())
        lines += ["", "Over a link: `ray <delay>` rows run the RayPool's direct connections over a link between two "
                  "network namespaces with that delay each way (Ray itself on loopback); each link, what it is made "
                  f"of, and its own TCP round trip (64 bytes, p50 / p95 µs): {trips}. Overhead p50 − round trip p50 "
                  "is what the data plane adds to the link per call."]
    lines += ["", report.markdown_table(HEADER + (RAY_HEADER if ray else ()), table_rows(cells, bool(ray)))]
    if skipped:
        combos = ", ".join(f"N={s['num_envs']} batch={s['batch_size']}" for s in skipped)
        lines += ["", f"Skipped (batch_size > num_envs): {combos}."]
    print(text := "\n".join(lines), flush=True)
    return text


DEFINITIONS = {
    "agent_latency_us": "one trainer call: step over all N (sync) or recv of batch_size + send (async)",
    "agent_throughput": "env steps/s of one call, batch_size / agent latency (pQ from latency p(100-Q))",
    "observer_latency_us": "one env step, from the trainer sending its action to the recv returning it",
    "observer_throughput": "steps/s of one env, 1 / observer latency",
    "throughput": "env steps / elapsed over the whole cell",
    "overhead_us": "RayPool's agent latency minus the local Pool's, same cell (--ray); paired_p50: by repetition; "
                   "paired_p50_ci95: a 95 % interval for it (6 repetitions or more)",
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
        ax.set(yscale="log", xlabel=x, ylabel="latency, µs (log)", title=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs_all)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="major", alpha=0.3)
        tp = ax.twinx()
        tp.plot(xs, [c["throughput"] for c in pts], "s-", color="black", lw=2.4, ms=6, label="env steps/s")
        tp.set(ylim=(0, 1.15 * top), ylabel="throughput, env steps/s")
        tp.yaxis.set_major_formatter(FuncFormatter(lambda v, _: report.fmt_rate(v)))
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
    p.add_argument("--task", default=DEFAULT_TASK, help=f"gymnasium id, empty or Pong (default {DEFAULT_TASK})")
    p.add_argument("--num-envs", help="comma list of N (default 8,32,128)")
    p.add_argument("--batch-size", help="comma list of async batch sizes; those > N are skipped (default 1,8,32)")
    p.add_argument("--modes", default="sync,async", help="comma list of sync, async (default both)")
    p.add_argument("--wait-policy", help="the pool's wait_policy (default: the pool's automatic choice)")
    p.add_argument("--png", metavar="PATH", help="plot percentiles and throughput here (--save: beside the JSON)")
    p.add_argument("--ray", type=int, metavar="NODES", help="also through RayPool on a local Ray cluster of NODES "
                                                            "nodes, beside a local Pool on the same cores")
    p.add_argument("--store-mb", type=int, default=80, help="--ray: object store per node, MB (default 80)")
    p.add_argument("--netem", metavar="DELAYS", help="--ray: also over a link between two network namespaces with "
                                                     "each delay (e.g. 100us,1ms; 0: none); root only")
    cli.add_run_options(p, cli.RunDefaults(repeats=(1, 1), json=DEFAULT_JSON), quick="0.2 s, N=8, batch 1,8",
                        seconds_help="timed seconds per cell")
    args = cli.parse(p, argv)
    quick = args.quick
    args.num_envs = (cli.positive_ints(p, "--num-envs", args.num_envs) if args.num_envs is not None
                     else ([8] if quick else list(DEFAULT_NUM_ENVS)))
    args.batch_size = (cli.positive_ints(p, "--batch-size", args.batch_size) if args.batch_size is not None
                       else ([1, 8] if quick else list(DEFAULT_BATCH_SIZES)))
    args.modes = cli.choice_list(p, "--modes", args.modes, MODES)
    if not plan_cells(args.num_envs, args.batch_size, args.modes)[0]:
        p.error(f"nothing to run: every --batch-size {args.batch_size} is larger than every --num-envs {args.num_envs}")
    try:
        env = env_spec(args.task)
        (gym.make(env) if isinstance(env, str) else env()).close()
    except Exception as exc:   # an unknown id, ale_py or mujoco missing
        p.error(f"--task {args.task!r} cannot be made here: {type(exc).__name__}: {exc}")
    if args.ray is not None:
        if args.ray < 1:
            p.error("--ray must be >= 1")
        try:
            import ray  # noqa: F401
        except ImportError:
            p.error("--ray needs ray: pip install 'ray>=2.9'")
        cpus = sorted(os.sched_getaffinity(0))
        args.cpus = [cpus[k % len(cpus)] for k in range(args.ray)]
    if args.netem is not None:
        if args.ray is None:
            p.error("--netem needs --ray: it measures RayPool's connections over a link")
        try:
            args.netem = netem.parse_delays(args.netem)
        except ValueError as exc:
            p.error(f"--netem: {exc}")
        why = netem.refusal()
        if why:
            p.error(why)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err = report.stderr_console()
    cells, skipped = plan_cells(args.num_envs, args.batch_size, args.modes)
    for s in skipped:
        err.print(f"[yellow]skipped[/yellow] N={s['num_envs']} batch={s['batch_size']}: {s['reason']}",
                  highlight=False)
    env = report.environment()
    with contextlib.ExitStack() as stack:
        made, measured = stack.enter_context(netem.links(args.netem)) if args.netem else ([], {})
        routes = {"local": None, **({"ray": None} if args.ray else {}), **{f"ray {x.label}": x.route for x in made}}
        systems = tuple(routes)
        cpus = args.cpus if args.ray else None
        cases = [Case(f"{mode} N={n} batch={b} {system}",
                      functools.partial(open_cell, args.task, mode, n, b, args.wait_policy, system, cpus,
                                        routes[system]))
                 for mode, n, b in cells for system in systems]
        cluster = RayCluster(args.ray, args.store_mb) if args.ray else None
        try:
            with report.progress(err, len(cases) * args.repeats) as update:
                records = run_interleaved(cases, repeats=args.repeats, seconds=args.seconds, warmup=args.warmup,
                                          on_start=lambda case, rep: update(description=f"{args.task} · {case.name}"),
                                          on_done=lambda _: update(advance=1))
        finally:
            ray = cluster.info if cluster else None
            if ray is not None and measured:
                ray["netem"] = measured
            if cluster:
                cluster.close()
    results = with_overheads([cell_json(args.task, mode, system, n, b, [r for r in records if r.case == case.name])
                              for (mode, n, b, system), case in zip(((*c, s) for c in cells for s in systems), cases)])
    text = write_report(args, env, results, skipped, ray)
    data = {"benchmark": "bench.latency", "environment": env, "config": report.config_of(args),
            "x_axis_name": x_axis_name(args), "definitions": DEFINITIONS, "ray": ray, "skipped": skipped,
            "cells": results}
    if args.json:
        report.write_results(args.json, data, text, err)
    png = args.png or (str(Path(args.json).with_suffix(".png")) if args.json and getattr(args, "save", False) else None)
    if png and any("agent_latency_us" in c for c in results):
        plot({**data, "cells": [c for c in results if c["system"] == "local"]}, png)
        err.print(f"plot written to {png}")
    failed = [r for r in records if r.error is not None]
    for r in failed:
        err.print(f"{args.task} · {r.case} failed:", style="red", markup=False, highlight=False)
        sys.stderr.write(r.error.rstrip() + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
