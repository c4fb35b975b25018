"""CleanRL's own PPO scripts, run as users run them, over SyncVectorEnv and over ``shmpool.VectorEnv``.

Only the vector-env line differs between systems; bench/README.md (cleanrl) says where to get the scripts,
which patches make them run on gymnasium 1.x, what the SPS column is and when training counts as identical.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cli, report

SCRIPTS = ("ppo", "ppo_continuous_action")
SYNC, ASYNC, SHMPOOL, SHMPOOL_OPTOUT = "sync", "async", "shmpool", "shmpool-optout"
SYSTEMS = (SYNC, ASYNC, SHMPOOL, SHMPOOL_OPTOUT)
DEFAULT_SYSTEMS = (SYNC, SHMPOOL)
DEFAULT_CASES = "ppo:CartPole-v1:8,ppo:CartPole-v1:32,ppo_continuous_action:Ant-v5:8,ppo_continuous_action:Ant-v5:32"
# Default total timesteps per script (rounded up to whole iterations): CartPole 32 or 128 iterations, about
# 15-25 s per run on a 2-vCPU VM; Ant one iteration (its batch is N x 2048): ~20 s at N=8, ~1 min at N=32.
DEFAULT_TIMESTEPS = {"ppo": 131_072, "ppo_continuous_action": 16_384}
SCRIPTS_ENV = "CLEANRL_SCRIPTS"
OPTOUT_ENV = {"SHMPOOL_NO_OMP_TUNING": "1"}
DROPPED_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "SHMPOOL_")
MARK = "CLEANRL_BENCH"
DEFAULT_JSON = str(report.RESULTS / "cleanrl.json")


# --- the scripts and their patches -----------------------------------------------------------------

VEC_LINE = "envs = gym.vector.SyncVectorEnv("
VEC_BY_SYSTEM = {SYNC: VEC_LINE, ASYNC: "envs = gym.vector.AsyncVectorEnv(",
                 SHMPOOL: "envs = shmpool.VectorEnv(", SHMPOOL_OPTOUT: "envs = shmpool.VectorEnv("}

EPISODE_LOG_OLD = """\
            if "final_info" in infos:
                for info in infos["final_info"]:
                    if info and "episode" in info:
                        print(f"global_step={global_step}, episodic_return={info['episode']['r']}")
                        writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)
                        writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)
"""
EPISODE_LOG_NEW = """\
            if "_episode" in infos:  # bench.cleanrl: gymnasium 1.x's vector info layout
                for i in np.flatnonzero(infos["_episode"]):
                    print(f"global_step={global_step}, episodic_return={infos['episode']['r'][i]}")
                    writer.add_scalar("charts/episodic_return", infos["episode"]["r"][i], global_step)
                    writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], global_step)
"""

CLIP_OLD = "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10))"
CLIP_NEW = "gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)"

RESULT_ANCHOR = "\n    envs.close()\n    writer.close()\n"
RESULT_LINE = (
    "\n    _bench_elapsed = time.time() - start_time  # bench.cleanrl: the run's result, one line\n"
    "    _bench_params = [p.detach().cpu() for p in agent.parameters()]\n"
    f"    print('{MARK}', __import__('json').dumps({{'global_step': global_step, 'seconds': _bench_elapsed,\n"
    "        'worker_processes': len(envs.pool.plan.process_cpus) if hasattr(envs, 'pool') else None,\n"
    "        'param_sum': float(sum(p.double().sum() for p in _bench_params)),\n"
    "        'param_sha256': __import__('hashlib').sha256(b''.join(p.numpy().tobytes() for p in _bench_params))"
    ".hexdigest()}), flush=True)"
)


def replace_once(text: str, old: str, new: str, what: str, script: str) -> str:
    """``text`` with its single ``old`` replaced by ``new``; a clear error when ``old`` is not there once."""
    count = text.count(old)
    if count != 1:
        raise PatchError(f"{script}.py: patch {what!r} expects its text once, found it {count} times "
                         f"(another CleanRL revision?):\n{old}")
    return text.replace(old, new)


class PatchError(RuntimeError):
    pass


def patch(source: str, script: str, system: str) -> str:
    """CleanRL's ``script`` source, patched for gymnasium 1.x, the result line and ``system``'s vector env."""
    text = replace_once(source, VEC_LINE, VEC_BY_SYSTEM[system], "vector env", script)
    if system in (SHMPOOL, SHMPOOL_OPTOUT):
        text = replace_once(text, "import gymnasium as gym\n", "import gymnasium as gym\nimport shmpool\n",
                            "import shmpool", script)
    text = replace_once(text, EPISODE_LOG_OLD, EPISODE_LOG_NEW, "episode logging (gymnasium 1.x)", script)
    if script == "ppo_continuous_action":
        text = replace_once(text, CLIP_OLD, CLIP_NEW, "TransformObservation space (gymnasium 1.x)", script)
    last = text.rfind(RESULT_ANCHOR)
    if last < 0:
        raise PatchError(f"{script}.py: no {RESULT_ANCHOR.strip()!r} at the end to put the result line before")
    return text[:last] + RESULT_LINE + text[last:]


def default_num_steps(source: str, script: str) -> int:
    m = re.search(r"^    num_steps: int = (\d+)$", source, re.M)
    if not m:
        raise PatchError(f"{script}.py: no 'num_steps: int = ...' default in Args")
    return int(m.group(1))


# --- cases and runs --------------------------------------------------------------------------------

@dataclass
class Case:
    script: str
    env_id: str
    num_envs: int
    timesteps: int = 0          # what CleanRL is given: whole iterations
    requested: int | None = None

    @property
    def name(self) -> str:
        return f"{self.script}:{self.env_id}:{self.num_envs}"


@dataclass
class Run:
    case: str
    system: str
    rep: int
    returncode: int | None = None
    wall_s: float = 0.0
    sps: int | None = None               # CleanRL's last "SPS:" line (global)
    sps_lines: int = 0
    global_step: int | None = None
    seconds: float | None = None         # time.time() - start_time after the loop (patch 3)
    param_sum: float | None = None
    param_sha256: str | None = None
    worker_processes: int | None = None   # shmpool: the layout it chose (0: every env in the script's process)
    episodes: int = 0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        if self.global_step and self.seconds:
            d["sps_exact"] = self.global_step / self.seconds
        return d


def parse_output(run: Run, out: str) -> None:
    sps = re.findall(r"^SPS: (\d+)\s*$", out, re.M)
    run.sps_lines = len(sps)
    run.sps = int(sps[-1]) if sps else None
    run.episodes = len(re.findall(r"^global_step=\d+, episodic_return=", out, re.M))
    for line in out.splitlines():
        if line.startswith(MARK + " "):
            result = json.loads(line[len(MARK) + 1:])
            run.global_step, run.seconds = result["global_step"], result["seconds"]
            run.param_sum, run.param_sha256 = result["param_sum"], result["param_sha256"]
            run.worker_processes = result.get("worker_processes")


def child_env(system: str, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_ENV_PREFIXES)}
    env.update(extra)
    if system == SHMPOOL_OPTOUT:
        env.update(OPTOUT_ENV)
    return env


def run_one(case: Case, system: str, rep: int, script_path: Path, workdir: Path, extra_env: dict[str, str],
            script_args: list[str], timeout: float) -> Run:
    cmd = [sys.executable, str(script_path), "--env-id", case.env_id, "--num-envs", str(case.num_envs),
           "--seed", "1", "--no-track", "--no-capture-video", "--total-timesteps", str(case.timesteps),
           *script_args]
    run = Run(case.name, system, rep)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=child_env(system, extra_env), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        run.wall_s = time.perf_counter() - t0
        run.error = f"timed out after {timeout:g} s"
        return run
    run.wall_s = time.perf_counter() - t0
    run.returncode = proc.returncode
    parse_output(run, proc.stdout)
    if proc.returncode != 0 or run.sps is None or run.param_sha256 is None:
        tail = "\n".join((proc.stdout + "\n" + proc.stderr).strip().splitlines()[-25:])
        run.error = f"exit {proc.returncode}, SPS lines {run.sps_lines}, result line " \
                    f"{'yes' if run.param_sha256 else 'no'}:\n{tail}"
    return run


# --- the report ------------------------------------------------------------------------------------

def case_summary(case: Case, systems: Sequence[str], runs: Sequence[Run]) -> dict[str, Any]:
    per: dict[str, Any] = {}
    for s in systems:
        ok = [r for r in runs if r.system == s and r.error is None]
        sps = [r.sps for r in ok]
        per[s] = {"sps_median": statistics.median(sps) if ok else None, "sps_min": min(sps, default=None),
                  "sps_max": max(sps, default=None),
                  "wall_s_median": statistics.median([r.wall_s for r in ok]) if ok else None, "runs": len(ok),
                  "failed": sum(1 for r in runs if r.system == s and r.error is not None),
                  "param_sha256": sorted({r.param_sha256 for r in ok}),
                  "episodes": sorted({r.episodes for r in ok}),
                  "worker_processes": sorted({r.worker_processes for r in ok if r.worker_processes is not None})}
    base = per.get(SYNC, {}).get("sps_median")
    for s in systems:
        m = per[s]["sps_median"]
        per[s]["ratio_to_sync"] = m / base if m and base else None
    hashes = {h for s in systems for h in per[s]["param_sha256"]}
    return {"case": case.name, "script": case.script, "env_id": case.env_id, "num_envs": case.num_envs,
            "total_timesteps": case.timesteps, "requested_timesteps": case.requested, "systems": per,
            "identical": len(hashes) == 1 if hashes else None, "distinct_param_sha256": len(hashes)}


def fmt_sps(lo: int | None, m: float | None, hi: int | None) -> str:
    return "—" if m is None else f"{m:,.0f} ({lo:,}–{hi:,})"


def markdown(args: argparse.Namespace, env: dict[str, Any], summaries: Sequence[dict[str, Any]]) -> str:
    lines = [report.header("CleanRL PPO scripts: SyncVectorEnv vs shmpool.VectorEnv", args, env,
                           f"torch {env['torch']} (default threads) · gymnasium {env['gymnasium']}",
                           f"extra env: {args.env or 'none'}", "scripts sha256 " + ", ".join(
                               f"{k}.py {v[:12]}" for k, v in env["scripts_sha256"].items())), "",
             "SPS: CleanRL's last `SPS:` line of each run = global_step / seconds since just before "
             "`envs.reset` (rollouts and PPO updates; not imports, env construction or teardown). "
             "Median (min–max) over repetitions; ratio of medians to `sync`.", ""]
    header = ("system", "SPS median (min–max)", "÷ sync", "wall s per run (median)", "runs ok", "param sha256")
    for s in summaries:
        lines += [f"### {s['case']} (total_timesteps {s['total_timesteps']:,})", ""]
        rows = []
        for system, p in s["systems"].items():
            ratio = "—" if p["ratio_to_sync"] is None else f"{p['ratio_to_sync']:.2f}×"
            wall = "—" if p["wall_s_median"] is None else f"{p['wall_s_median']:.1f}"
            rows.append([system, fmt_sps(p["sps_min"], p["sps_median"], p["sps_max"]), ratio, wall,
                         f"{p['runs']}" + (f" ({p['failed']} failed)" if p["failed"] else ""),
                         ", ".join(h[:12] for h in p["param_sha256"]) or "—"])
        lines.append(report.markdown_table(header, rows))
        verdict = {True: "identical on every system and repetition", None: "no result to compare",
                   False: f"**DIFFER** ({s['distinct_param_sha256']} distinct checksums)"}[s["identical"]]
        lines += ["", f"Final agent parameters: {verdict}.", ""]
        lines += [f"**{system}'s layout differed between runs**: {p['worker_processes']} worker processes.\n"
                  for system, p in s["systems"].items() if len(p["worker_processes"]) > 1]
    return "\n".join(lines).rstrip() + "\n"


# --- command line ------------------------------------------------------------------------------------

def parse_cases(p: argparse.ArgumentParser, text: str) -> list[Case]:
    cases = []
    for item in cli.comma_list(text):
        parts = item.split(":")
        if len(parts) not in (3, 4) or parts[0] not in SCRIPTS:
            p.error(f"--cases: {item!r} is not SCRIPT:ENV_ID:N[:TOTAL_TIMESTEPS] with SCRIPT one of {SCRIPTS}")
        try:
            n = int(parts[2])
            total = int(parts[3]) if len(parts) == 4 else None
        except ValueError:
            p.error(f"--cases: {item!r}: N and TOTAL_TIMESTEPS must be integers")
        if n < 1 or (total is not None and total < 1):
            p.error(f"--cases: {item!r}: N and TOTAL_TIMESTEPS must be positive")
        cases.append(Case(parts[0], parts[1], n, requested=total))
    if not cases:
        p.error("--cases is empty")
    return cases


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench cleanrl", __doc__)
    p.add_argument("--scripts", default=os.environ.get(SCRIPTS_ENV),
                   help=f"folder with CleanRL's ppo.py and ppo_continuous_action.py (default ${SCRIPTS_ENV})")
    p.add_argument("--cases", default=DEFAULT_CASES,
                   help=f"comma list of SCRIPT:ENV_ID:N[:TOTAL_TIMESTEPS] (default {DEFAULT_CASES})")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help=f"comma list of {', '.join(SYSTEMS)} (default {','.join(DEFAULT_SYSTEMS)})")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions per case (default 3)")
    p.add_argument("--total-timesteps", type=int,
                   help="CleanRL's --total-timesteps for every case without its own, rounded up to whole "
                        "iterations (default: " + ", ".join(f"{k}.py {v:,}" for k, v in DEFAULT_TIMESTEPS.items())
                        + ")")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL",
                   help="set in every child's environment (repeatable), e.g. --env OMP_NUM_THREADS=1")
    p.add_argument("--script-args", default="", help="more arguments for every script, e.g. \"--num-steps 512\"")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder (patched scripts, tensorboard runs)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before a run is killed (default 1800)")
    p.add_argument("--json", metavar="PATH", help="write every run and the configuration here, the report beside "
                                                  "it (.md)")
    p.add_argument("--save", action="store_true", help=f"write them to the tracked {DEFAULT_JSON}")
    args = p.parse_args(argv)
    args.command = " ".join(["python -m bench cleanrl", *(sys.argv[1:] if argv is None else argv)])
    if not args.scripts:
        p.error(f"give --scripts DIR or set {SCRIPTS_ENV}: a folder with CleanRL's ppo.py and "
                "ppo_continuous_action.py (bench/README.md, cleanrl, says how to get them)")
    args.scripts = Path(args.scripts).expanduser().resolve()
    args.cases = parse_cases(p, args.cases)
    args.systems = cli.choice_list(p, "--systems", args.systems, SYSTEMS)
    if args.repeats < 1 or (args.total_timesteps is not None and args.total_timesteps < 1):
        p.error("--repeats and --total-timesteps must be positive")
    extra = {}
    for item in args.env:
        key, eq, value = item.partition("=")
        if not eq or not key:
            p.error(f"--env {item!r} is not KEY=VAL")
        extra[key] = value
    args.extra_env = extra
    args.script_args = args.script_args.split()
    args.json = args.json or (DEFAULT_JSON if args.save else None)
    return args


def load_scripts(args: argparse.Namespace) -> dict[str, str]:
    sources = {}
    for script in dict.fromkeys(c.script for c in args.cases):
        path = args.scripts / f"{script}.py"
        if not path.is_file():
            raise SystemExit(f"no {path}: --scripts must hold CleanRL's {script}.py (see --help)")
        sources[script] = path.read_text()
    return sources


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sources = load_scripts(args)
    try:
        patched = {(s, sys_): patch(src, s, sys_) for s, src in sources.items() for sys_ in args.systems}
    except PatchError as exc:
        print(exc, file=sys.stderr)
        return 2
    num_steps = {s: default_num_steps(src, s) for s, src in sources.items()}
    override = re.search(r"--num-steps[= ](\d+)", " ".join(args.script_args))
    if override:
        num_steps = dict.fromkeys(num_steps, int(override.group(1)))
    for case in args.cases:
        batch = case.num_envs * num_steps[case.script]
        want = case.requested or args.total_timesteps or DEFAULT_TIMESTEPS[case.script]
        case.timesteps = max(1, -(-want // batch)) * batch

    workdir = Path(tempfile.mkdtemp(prefix="bench_cleanrl_"))
    paths = {}
    for (script, system), text in patched.items():
        folder = workdir / system.replace("-", "_")   # the file keeps CleanRL's name: exp_name is its stem
        folder.mkdir(exist_ok=True)
        (folder / f"{script}.py").write_text(text)
        paths[script, system] = folder / f"{script}.py"
    print(f"scratch folder: {workdir}", file=sys.stderr)

    from importlib.metadata import version
    env = {**report.environment(), **{m: version(m) for m in ("torch", "tyro", "tensorboard")},
           "scripts_dir": str(args.scripts),
           "scripts_sha256": {s: hashlib.sha256(src.encode()).hexdigest() for s, src in sources.items()},
           "child_env_added": args.extra_env, "child_env_dropped_prefixes": list(DROPPED_ENV_PREFIXES),
           "optout_env": OPTOUT_ENV}
    runs: list[Run] = []
    summaries = []
    try:
        for case in args.cases:
            case_runs = []
            for rep in range(args.repeats):
                for system in args.systems:
                    run = run_one(case, system, rep, paths[case.script, system], paths[case.script, system].parent,
                                  args.extra_env, args.script_args, args.timeout)
                    case_runs.append(run)
                    state = run.error.splitlines()[0] if run.error else f"SPS {run.sps:,}"
                    if run.worker_processes is not None:
                        state += f", {run.worker_processes} worker process{'' if run.worker_processes == 1 else 'es'}"
                    print(f"{case.name} T={case.timesteps:,} · {system} · rep {rep + 1}/{args.repeats}: {state} "
                          f"({run.wall_s:.1f} s wall, params {str(run.param_sha256)[:12]})", file=sys.stderr,
                          flush=True)
            runs += case_runs
            summaries.append(case_summary(case, args.systems, case_runs))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    text = markdown(args, env, summaries)
    print(text, flush=True)
    if args.json:
        config = {**report.config_of(args, "cases", "scripts"), "scripts": str(args.scripts),
                  "cases": [c.__dict__ for c in args.cases]}
        report.write_results(args.json, {"benchmark": "bench.cleanrl", "environment": env, "config": config,
                                         "cases": summaries, "runs": [r.to_json() for r in runs]},
                             text, report.stderr_console())
    failed = [r for r in runs if r.error]
    for r in failed:
        print(f"{r.case} · {r.system} · rep {r.rep + 1} failed: {r.error}", file=sys.stderr)
    differ = [s["case"] for s in summaries if s["identical"] is False]
    if differ:
        print(f"final parameters differ between runs in: {', '.join(differ)}", file=sys.stderr)
    return 1 if failed or differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
