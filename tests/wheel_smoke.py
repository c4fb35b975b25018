"""Smoke test for an installed shmpool wheel: ``python tests/wheel_smoke.py``, run from a folder outside the
checkout (``.ci/wheel``, and cibuildwheel's test command).

A script, not a pytest module (its name does not match ``test_*.py``, so the suite never collects it): it runs
in a venv that holds the wheel and its dependencies only, without pytest or the suite's helpers, and must say
plainly what it checked.  It exits non-zero on the first failed check.

Checks: shmpool is imported from the installed wheel (not a source tree), its compiled extensions load, and a
``Pool`` of 2 workers on CartPole-v1 steps a seeded trajectory whose observations, rewards and done flags equal
gymnasium's ``SyncVectorEnv``'s, across autoresets.
"""
from __future__ import annotations

import importlib
import os
import sys

NUM_ENVS = 4
STEPS = 200


def check(ok: bool, what: str) -> None:
    """Prints ``what`` as checked, or exits 1 naming it."""
    if not ok:
        print(f"wheel smoke: FAILED: {what}", file=sys.stderr)
        raise SystemExit(1)
    print(f"wheel smoke: ok: {what}")


def check_installed() -> None:
    import numpy as np

    import shmpool

    where = os.path.dirname(os.path.abspath(shmpool.__file__))
    check("site-packages" in where, f"shmpool imported from an installed package ({where})")
    compiled = ["shmpool._core", "shmpool._spin", "shmpool._lead", "shmpool._elapsed", "shmpool._batch_check",
                "shmpool.workers._rows", "shmpool.workers.recipes._frames"]
    for name in compiled:
        module = importlib.import_module(name)
        check(module.__file__.endswith(".so"), f"{name} is compiled ({os.path.basename(module.__file__)})")
    print(f"wheel smoke: python {sys.version.split()[0]}, numpy {np.__version__}")


def check_trajectory() -> None:
    import gymnasium as gym
    import numpy as np

    import shmpool

    def cartpole():
        return gym.make("CartPole-v1")

    reference = gym.vector.SyncVectorEnv([cartpole] * NUM_ENVS)
    actions = np.random.default_rng(123).integers(0, 2, size=(STEPS, NUM_ENVS))
    ends = 0
    with shmpool.Pool(cartpole, NUM_ENVS, num_workers=2) as pool:
        check(pool.num_workers == 2, f"a Pool of {NUM_ENVS} CartPole-v1 envs on 2 workers")
        obs, _ = pool.reset(seed=7)
        ref_obs, _ = reference.reset(seed=7)
        check(obs.shape == (NUM_ENVS, 4) and obs.dtype == np.float32,
              f"reset observations are ({NUM_ENVS}, 4) float32 (got {obs.shape} {obs.dtype})")
        check(np.array_equal(obs, ref_obs), "reset(seed=7) observations equal SyncVectorEnv's")
        for t, action in enumerate(actions):
            got, want = pool.step(action), reference.step(action)
            for field, a, b in zip(("observations", "rewards", "terminated", "truncated"), got[:4], want[:4]):
                if a.dtype != b.dtype or not np.array_equal(a, b):
                    check(False, f"step {t}: {field} differ from SyncVectorEnv's: {a!r} vs {b!r}")
            ends += int(np.sum(want[2] | want[3]))
    reference.close()
    check(ends > 0, f"{STEPS} seeded steps equal SyncVectorEnv's (observations, rewards, terminated, truncated), "
                    f"across {ends} autoresets")


if __name__ == "__main__":
    check_installed()
    check_trajectory()
    print("wheel smoke: passed")
