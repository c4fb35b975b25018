"""The trainer's OpenMP spin (issue 31): set by ``import shmpool`` when it still can, left alone
when the user chose, and said once, with the fix, when torch was imported first."""
import subprocess
import sys
import textwrap

import pytest

from shmpool import _spin, openmp


def _maps(tmp_path, *libs):
    path = tmp_path / "maps"
    path.write_text("".join(f"7f00-7f01 r-xp 0 08:01 1 /usr/lib/{lib}\n" for lib in libs))
    return str(path)


def test_sets_the_spin_count_when_no_openmp_is_loaded_and_nothing_was_chosen(tmp_path):
    env = {}
    tuning = openmp.tune_at_import(env, _maps(tmp_path, "libc.so.6", "libm.so.6"), count=lambda: 31000)
    assert tuning.action == "set" and "GOMP_SPINCOUNT=31000 (~0.75 ms on this CPU) set" in tuning.detail
    assert env == {"GOMP_SPINCOUNT": "31000", openmp.MARK: "31000"}
    # A child process inherits both: still the pool's choice, not the user's.
    assert openmp.tune_at_import(dict(env), _maps(tmp_path)).action == "set"
    env["GOMP_SPINCOUNT"] = "5"
    assert openmp.tune_at_import(env, _maps(tmp_path)).action == "user setting"


@pytest.mark.parametrize("name", openmp.USER_SETTINGS)
def test_a_user_setting_is_left_as_it_is(tmp_path, name):
    env = {name: "7"}
    tuning = openmp.tune_at_import(env, _maps(tmp_path))
    assert tuning.action == "user setting" and f"{name}=7" in tuning.detail
    assert env == {name: "7"}


@pytest.mark.parametrize("lib", ["libgomp-a34b3233.so.1", "libiomp5.so", "libomp.so.5"])
def test_too_late_once_a_runtime_is_loaded(tmp_path, lib):
    env = {}
    tuning = openmp.tune_at_import(env, _maps(tmp_path, "libc.so.6", lib))
    assert tuning.too_late and lib in tuning.detail
    assert env == {}


@pytest.mark.parametrize("relax_s, count", [
    (25e-9, 30_000),      # AMD EPYC: the count the CleanRL sweep chose there
    (24.4e-9, 31_000),    # rounded to thousands
    (3e-9, 250_000),      # a short pause (older Intel): more spins for the same time
    (1e-9, 300_000),      # never above libgomp's own default
    (1e-6, 3_000),        # a timing gone wrong (a trapped pause) is clamped
    (0.0, 300_000),       # a clock too coarse to time it: libgomp's own count
])
def test_the_count_spins_the_chosen_time_on_this_cpu(relax_s, count):
    assert openmp.spin_count_for(relax_s) == count


def test_the_spin_wait_hint_is_timed_in_nanoseconds():
    assert 0.1 < _spin.relax_ns(1000, 5) < 1000


@pytest.mark.parametrize("value, action", [("1", "opted out"), ("yes", "opted out"), ("0", "set"), ("", "set")])
def test_the_opt_out(tmp_path, value, action):
    env = {openmp.OPT_OUT: value}
    assert openmp.tune_at_import(env, _maps(tmp_path)).action == action
    assert ("GOMP_SPINCOUNT" in env) == (action == "set")


def test_advice_only_when_too_late_and_torch_runs_threads():
    late = openmp.OpenMPTuning("too late", "libgomp.so.1 was loaded before shmpool")
    assert openmp.advice(2, late) is not None
    assert "import shmpool` before `import torch`" in openmp.advice(2, late)
    assert f"GOMP_SPINCOUNT={openmp.chosen_spin_count()}" in openmp.advice(4, late)
    assert openmp.advice(1, late) is None
    assert openmp.advice(None, late) is None
    assert openmp.advice(2, openmp.OpenMPTuning("set", "")) is None
    assert openmp.advice(2, openmp.OpenMPTuning("user setting", "")) is None


def _run(code: str, **env) -> subprocess.CompletedProcess:
    import os
    environ = {k: v for k, v in os.environ.items() if k not in (*openmp.USER_SETTINGS, openmp.OPT_OUT, openmp.MARK)}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environ, timeout=120)


POOL = """
    import os, warnings
    {imports}
    torch.set_num_threads(2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            pool = shmpool.Pool("CartPole-v1", 4, num_workers=2, parent_shard=False)
            pool.close()
    print("GOMP_SPINCOUNT", os.environ.get("GOMP_SPINCOUNT"))
    print("warnings", sum(issubclass(w.category, shmpool.PerformanceWarning) for w in seen))
    print("repr", repr(pool))
"""


def test_in_a_real_process_shmpool_first_sets_it_and_says_nothing():
    pytest.importorskip("torch")
    out = _run(POOL.format(imports="import shmpool\n    import torch")).stdout
    count = int(out.split("GOMP_SPINCOUNT ", 1)[1].split()[0])   # that process timed its own CPU
    assert openmp.SPIN_BOUNDS[0] <= count <= openmp.SPIN_BOUNDS[1] and count % 1000 == 0
    assert "warnings 0" in out
    assert f"OpenMP: GOMP_SPINCOUNT={count} (~0.75 ms on this CPU) set" in out


def test_in_a_real_process_torch_first_is_said_once_with_the_fix():
    pytest.importorskip("torch")
    done = _run(POOL.format(imports="import torch\n    import shmpool"))
    assert "GOMP_SPINCOUNT None" in done.stdout
    assert "warnings 1" in done.stdout, done.stderr
    assert "was loaded before shmpool" in done.stdout


def test_in_a_real_process_the_opt_out_sets_nothing_and_says_nothing():
    pytest.importorskip("torch")
    out = _run(POOL.format(imports="import torch\n    import shmpool"), SHMPOOL_NO_OMP_TUNING="1").stdout
    assert "GOMP_SPINCOUNT None" in out and "warnings 0" in out
