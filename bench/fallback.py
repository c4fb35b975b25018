"""What the fallback lane costs: a Dict observation of Boxes, then the same with a Text leaf.

    python -m bench fallback                    # N=8,32, every system, 3 interleaved repetitions
    python -m bench fallback --quick            # a few seconds, for tests

Two tiny envs whose step returns a prebuilt observation; the Text leaf travels pickled per env through
each worker's pipe.  ``Box+Text ÷ Box only`` is the price of the pickled leaf per system.
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from . import cli, report, subjects
from ._timing import Case

BOX_ONLY, WITH_TEXT = "Box only", "Box+Text"


class DictObsEnv(gym.Env):
    """Returns one prebuilt Dict observation; never ends.  ``text``: a Text leaf instead of ``pos``."""

    action_space = spaces.Discrete(2)

    def __init__(self, text: bool = False) -> None:
        box = spaces.Box(-1.0, 1.0, (16,), np.float32)
        if text:
            self.observation_space = spaces.Dict({"box": box, "text": spaces.Text(16)})
            self._obs = {"box": np.zeros(16, np.float32), "text": "hellofallback123"}
        else:
            self.observation_space = spaces.Dict({"box": box, "pos": spaces.Box(-1.0, 1.0, (2,), np.float32)})
            self._obs = {"box": np.zeros(16, np.float32), "pos": np.zeros(2, np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs, {}

    def step(self, action):
        return self._obs, 0.0, False, False, {}


def cases(kind: str, n: int) -> list[Case]:
    make_env = functools.partial(DictObsEnv, text=kind == WITH_TEXT)
    return subjects.headline_cases(make_env, make_env, n, np.zeros(n, np.int64), suffix=f" · {kind}")


def parse_args(argv: Sequence[str] | None):
    p = cli.parser("python -m bench fallback", __doc__)
    p.add_argument("--num-envs", help="comma list of N (default 8,32; --quick 8)")
    cli.add_run_options(p, cli.RunDefaults(), quick="N=8, 0.2 s, 1 repeat")
    args = cli.parse(p, argv, num_envs=("8,32", "8"))
    args.num_envs = cli.positive_ints(p, "--num-envs", args.num_envs)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    err = report.stderr_console()
    env = report.environment()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # the lane's own warning, expected here
        groups = report.run_cells([("Dict obs", n) for n in args.num_envs],
                                  lambda _, n: cases(BOX_ONLY, n) + cases(WITH_TEXT, n), args, err,
                                  2 * len(subjects.SYSTEMS))
    rows = [[str(g.num_envs), system, report.fmt_summary(g.rate(f"{system} · {BOX_ONLY}")),
             report.fmt_summary(g.rate(f"{system} · {WITH_TEXT}")),
             report.fmt_ratio(g.ratio(f"{system} · {WITH_TEXT}", f"{system} · {BOX_ONLY}")),
             report.fmt_ratio(g.ratio(f"{system} · {WITH_TEXT}", f"{subjects.ASYNC_VEC} · {WITH_TEXT}"))]
            for g in groups for system in subjects.SYSTEMS]
    header = ["N", "system", "Box only steps/s", "Box+Text steps/s", "Box+Text ÷ Box only",
              "Box+Text ÷ AsyncVectorEnv Box+Text"]
    text = "Env-only steps/s, median (min–max) over repetitions:\n\n" + report.markdown_table(header, rows)
    return report.finish(args, "bench.fallback", env, text, err, groups, throughput=[g.to_json() for g in groups])


if __name__ == "__main__":
    raise SystemExit(main())
