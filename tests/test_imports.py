"""What a new user meets on import: the optional faces load on first use, missing extras are named."""
from __future__ import annotations

import subprocess
import sys

import pytest


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_sb3_face_reachable_after_import_shmpool():
    done = run("import shmpool; print(shmpool.sb3.ShmVecEnv.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ShmVecEnv"


def test_unknown_attribute_is_still_an_attribute_error():
    done = run("import shmpool\ntry:\n    shmpool.nope\nexcept AttributeError as e:\n    print(e)")
    assert done.stdout.strip() == "module 'shmpool' has no attribute 'nope'"


@pytest.mark.parametrize("module,missing,extra", [("shmpool.sb3", "stable_baselines3", "sb3"),
                                                  ("shmpool.distributed", "ray", "ray")])
def test_missing_extra_is_named(module, missing, extra):
    # sys.modules[name] = None makes ``import name`` raise ImportError, as if it were not installed.
    done = run(f"import sys; sys.modules[{missing!r}] = None\nimport {module}")
    assert done.returncode != 0
    assert f"pip install 'shmpool[{extra}]'" in done.stderr, done.stderr[-500:]
