"""What a new user meets on import: the optional faces load on first use, missing extras are named."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(importlib.util.find_spec("stable_baselines3") is None,
                    reason="needs stable-baselines3 (the [sb3] extra; gymnasium 0.29's CI run has no torch)")
@pytest.mark.slow   # a fresh interpreter imports SB3 and torch: ~5 s on 2 cores
def test_sb3_face_reachable_after_import_shmpool():
    done = run("import shmpool; print(shmpool.sb3.ShmVecEnv.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ShmVecEnv"


def test_unknown_attribute_is_still_an_attribute_error():
    done = run("import shmpool\ntry:\n    shmpool.nope\nexcept AttributeError as e:\n    print(e)")
    assert done.stdout.strip() == "module 'shmpool' has no attribute 'nope'"


@pytest.mark.parametrize("module,face,missing,extra", [("shmpool.sb3", "ShmVecEnv", "stable_baselines3", "sb3"),
                                                       ("shmpool.distributed", "RayPool", "ray", "ray")])
def test_missing_extra_is_named(module, face, missing, extra):
    # sys.modules[name] = None makes ``import name`` raise ImportError, as if it were not installed.
    # shmpool.distributed imports without ray (its pure-numpy parts); RayPool names the extra.
    done = run(f"import sys; sys.modules[{missing!r}] = None\nimport {module}\n{module}.{face}")
    assert done.returncode != 0
    assert f"pip install 'shmpool[{extra}]'" in done.stderr, done.stderr[-500:]


def test_builtin_task_without_its_extra_names_the_extra():
    # As if ale-py were not installed: gymnasium alone does not know Pong-v5.
    done = run("import sys; sys.modules['ale_py'] = None\nimport shmpool\n"
               "try:\n    shmpool.make('Pong-v5', num_envs=2)\nexcept Exception as e:\n    print(type(e).__name__, e)")
    assert "pip install 'shmpool[atari]'" in done.stdout, done.stdout + done.stderr[-500:]
    assert done.stdout.startswith("NameNotFound"), done.stdout


def test_list_tasks_says_which_extras_are_missing():
    done = run("import sys, warnings; sys.modules['mujoco'] = None\nimport shmpool\n"
               "with warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n"
               "    tasks = shmpool.list_tasks()\nprint('Ant-v5' in tasks)\nprint(*[str(x.message) for x in w])")
    lines = done.stdout.splitlines()
    assert lines[0] == "False", done.stdout + done.stderr[-500:]
    assert "pip install 'shmpool[mujoco]'" in lines[1]


def test_builtin_tasks_have_one_home_and_no_import_cycle():
    """Every built-in task lives in shmpool.workers.recipes and is registered by
    shmpool.registration; no recipe imports the registry back."""
    import ast
    import pathlib

    import shmpool.workers.recipes as recipes

    import shmpool
    for path in pathlib.Path(recipes.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [f"{node.module}"] if isinstance(node, ast.ImportFrom) and node.module else [])
            assert not any(n.endswith("registration") for n in names), f"{path.name} imports {names}"
    from shmpool.workers.recipes.batch_pong import BatchPong

    import shmpool.envs
    assert shmpool.envs.BatchPong is BatchPong   # the old import path still works
    assert "BatchPong-v0" in shmpool.list_tasks()


def _source_tree_copy(tmp_path, built: bool):
    """The repository's layout in ``tmp_path``: ``shmpool/`` (with its compiled modules when ``built``, as after
    an earlier build in place; without, as a fresh clone), ``workers/`` beside it, pyproject.toml and setup.py."""
    import pathlib
    import shutil

    root = pathlib.Path(__file__).resolve().parents[2]
    skip = shutil.ignore_patterns("__pycache__", *([] if built else ["*.so"]))
    shutil.copytree(root / "shmpool", tmp_path / "shmpool", ignore=skip)
    shutil.copytree(root / "workers", tmp_path / "workers", ignore=skip)
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy(root / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("built,missing", [(False, r"has no built extension \(shmpool\._\w+"),
                                           (True, r"has no shmpool\.workers")])
def test_import_from_the_repository_root_names_the_source_tree_and_the_fix(tmp_path, built, missing):
    """Python started in the repository root after a plain ``pip install .`` imports the source folder, not the
    installed package: without a build it has no ``shmpool._core``, with one no ``shmpool.workers`` (``workers/``
    is mapped there by the install).  The error says so and what to do.  The editable install this suite runs
    under maps ``shmpool.workers`` through a finder on ``sys.meta_path``; it is taken out, as a plain install
    has none."""
    root = _source_tree_copy(tmp_path, built)
    code = ("import sys\nsys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
            "import shmpool")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: import shmpool found the folder "), done.stderr[-2000:]
    assert f"the source tree of the repository at {root}" in last
    assert re.search(missing, last), last
    assert "Run Python from another folder, or install this tree in place with `pip install -e" in last
