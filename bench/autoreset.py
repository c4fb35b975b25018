"""SAME_STEP autoreset at full speed: SB3's ShmVecEnv and gymnasium's SAME_STEP face vs the NEXT_STEP pool.

    python -m bench autoreset                                  # CartPole-v1, N=32, 3 × 2 s
    python -m bench autoreset --tasks CartPole-v1,Acrobot-v1 --num-envs 8,32 --repeats 5
    python -m bench autoreset --quick                          # N=8, 0.2 s, 1 repeat (the tests)

Env-only, seeded random actions: Pool NEXT_STEP (the anchor), Pool SAME_STEP, VectorEnv SAME_STEP,
ShmVecEnv, and SyncVectorEnv SAME_STEP / SB3 DummyVecEnv for scale; steps/s and transitions/s (NEXT_STEP's
reset slots left out).  Target: ShmVecEnv within 5 % of the NEXT_STEP pool.  How to read it:
bench/README.md, "autoreset".
"""
from __future__ import annotations

import argparse
import functools
import itertools
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from . import cli, report, subjects
from ._timing import Case, Sample, Summary, timed_loop

POOL_NEXT, POOL_SAME, VECTOR_SAME = "Pool NEXT_STEP", "Pool SAME_STEP", "VectorEnv SAME_STEP"
SYNC_SAME, DUMMY = "SyncVectorEnv SAME_STEP", subjects.SB3_DUMMY
SYSTEMS = (POOL_NEXT, POOL_SAME, VECTOR_SAME, subjects.SHM_VEC, SYNC_SAME, DUMMY)
DEFAULT_JSON = None
ACTION_SETS = 64


class Stepping:
    """Any of the systems, stepped with the run's actions.  Every system does the same
    bookkeeping per step (which envs ended): NEXT_STEP's autoreset slots (the step after an
    end, which resets instead of stepping) are counted so transitions can be told from slots."""

    def __init__(self, vec: subjects.Vec, next_step: bool, actions: list[np.ndarray]) -> None:
        self.vec, self.n, self.info = vec, vec.num_envs, dict(vec.info)
        self.ended = self.reset_slots = 0
        done = np.zeros(self.n, dtype=bool)
        cycle, step, sb3 = itertools.cycle(actions), vec.env.step, vec.sb3

        def one() -> None:
            out = step(next(cycle))
            ended = out[2] if sb3 else out[2] | out[3]
            if next_step:
                self.reset_slots += int(np.count_nonzero(done))
            self.ended += int(np.count_nonzero(ended))
            done[:] = ended
        self._step = one

    def measure(self, seconds: float, warmup: float) -> Sample:
        if warmup > 0:
            timed_loop(self._step, self.n, warmup)
        self.ended = self.reset_slots = 0
        sample = timed_loop(self._step, self.n, seconds)
        self.info = {**self.info, "ended": self.ended, "reset_slots": self.reset_slots,
                     "transitions": sample.count - self.reset_slots}
        return sample

    def close(self) -> None:
        self.vec.close()


def _actions(space: gym.Space, n: int, kind: str) -> list[np.ndarray]:
    """``fixed``: one seeded batch, every step (CartPole: episodes of ~10 steps); ``random``:
    ``ACTION_SETS`` seeded batches drawn before timing and cycled (CartPole: ~22 steps)."""
    if kind == "fixed":
        return [subjects.fixed_random_actions(space, n)]
    batched = batch_space(space, n)
    batched.seed(subjects.ACTION_SEED)
    return [batched.sample() for _ in range(ACTION_SETS)]


def _open(system: str, task: str, n: int, action_kind: str) -> Stepping:
    same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    kind, options = {POOL_NEXT: (subjects.POOL, {"autoreset_mode": "next_step"}),
                     POOL_SAME: (subjects.POOL, {"autoreset_mode": "same_step"}),
                     VECTOR_SAME: (subjects.VECTOR, same_step),
                     subjects.SHM_VEC: (subjects.SHM_VEC, {}), SYNC_SAME: (subjects.SYNC_VEC, same_step),
                     DUMMY: (subjects.SB3_DUMMY, {})}[system]
    vec = subjects.open_vec(kind, task, n, **options)
    try:
        actions = _actions(vec.action_space, n, action_kind)
        vec.reset()
    except BaseException:
        vec.close()
        raise
    return Stepping(vec, system == POOL_NEXT, actions)


HEADER = ["task", "N", "system", "env steps/s: median (min–max)", f"÷ {POOL_NEXT}",
          "transitions/s: median (min–max)", f"÷ {POOL_NEXT}", "steps per episode"]
TITLE = "Env-only throughput, SAME_STEP systems against the NEXT_STEP pool (same run)"


def transitions(g: report.Group, system: str) -> Summary | None:
    """env.step calls per second: NEXT_STEP's autoreset slots (a reset, no transition) left out."""
    return Summary.of(r.info["transitions"] / r.sample.seconds for r in g.records
                      if r.case == system and r.sample is not None and "transitions" in r.info)


def transition_ratio(g: report.Group, system: str) -> float | None:
    a, b = transitions(g, system), transitions(g, POOL_NEXT)
    return None if a is None or b is None else a.median / b.median


def episode_length(g: report.Group, system: str) -> str:
    recs = [r for r in g.records if r.case == system and r.sample is not None and r.info.get("ended")]
    if not recs:
        return "—"
    return f"{sum(r.info['transitions'] for r in recs) / sum(r.info['ended'] for r in recs):.1f}"


def rows(groups: Sequence[report.Group]) -> list[list[str]]:
    return [[g.task, str(g.num_envs), c.name, report.fmt_summary(g.rate(c.name)),
             report.fmt_ratio(g.ratio(c.name, POOL_NEXT)),
             report.fmt_summary(transitions(g, c.name)), report.fmt_ratio(transition_ratio(g, c.name)),
             episode_length(g, c.name)]
            for g in groups for c in g.cases]


def targets(groups: Sequence[report.Group]) -> list[report.Target]:
    moves = ("what SAME_STEP adds per ended episode (final observation and info) and SB3's face per step "
             "(observation copy, a list of info dicts)")
    out = []
    for g in groups:
        if g.ran(subjects.SHM_VEC):
            out.append(report.Target(f"{g.task} N={g.num_envs}: ShmVecEnv ≥ 0.95× the NEXT_STEP pool, env steps/s",
                                     0.95, g.ratio(subjects.SHM_VEC, POOL_NEXT),
                                     moves=moves + "; and the episode length: NEXT_STEP spends one slot per episode on "
                                     "a reset, SAME_STEP does that reset inside a step"))
            out.append(report.Target(f"{g.task} N={g.num_envs}: ShmVecEnv ≥ 0.95× the NEXT_STEP pool, transitions/s",
                                     0.95,
                                     transition_ratio(g, subjects.SHM_VEC), moves=moves))
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = cli.parser("python -m bench autoreset", __doc__)
    p.add_argument("--tasks", help="comma list of gymnasium ids (default CartPole-v1)")
    p.add_argument("--num-envs", help="comma list of N (default 32; --quick 8)")
    p.add_argument("--actions", choices=("random", "fixed"), default="random",
                   help=f"random: {ACTION_SETS} seeded batches cycled (default); fixed: one batch every step "
                        "(CartPole: shorter episodes, SAME_STEP's worst case)")
    cli.add_run_options(p, cli.RunDefaults(json=DEFAULT_JSON), quick="CartPole-v1 N=8, 0.2 s, 1 repeat")
    args = cli.parse(p, argv)
    args.tasks = cli.comma_list(args.tasks) if args.tasks else ["CartPole-v1"]
    args.num_envs = cli.positive_ints(p, "--num-envs", args.num_envs) if args.num_envs else (
        [8] if args.quick else [32])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err = report.stderr_console()
    env = report.environment()
    systems = [s for s in SYSTEMS if report.version_of("stable_baselines3") or s not in (subjects.SHM_VEC, DUMMY)]
    groups = report.run_cells([(t, n) for t in args.tasks for n in args.num_envs],
                              lambda task, n: [Case(s, functools.partial(_open, s, task, n, args.actions))
                                               for s in systems],
                              args, err, len(systems))
    goals = targets(groups)
    text = "\n".join([report.header("shmpool autoreset benchmark", args, env, f"{args.actions} actions"), "",
                      TITLE + ":", "", report.markdown_table(HEADER, rows(groups)), "",
                      "### Targets (medians of this run)", "", *(t.line() for t in goals)])
    return report.finish(args, "bench.autoreset", env, text, err, groups,
                         throughput=[g.to_json() for g in groups], targets=[t.to_json() for t in goals])


if __name__ == "__main__":
    raise SystemExit(main())
