"""The `bench train` loop trains the same with every system that steps the same envs."""
from __future__ import annotations

import json

import heavy_imports
import pytest

from bench import subjects

heavy_imports.require("torch")
pytestmark = [pytest.mark.slow,             # torch training loops (bench train)
              pytest.mark.heavy_imports]    # torch in the test process
torch = heavy_imports.module("torch")
train = heavy_imports.module("bench.train")
ppo = heavy_imports.module("bench.ppo")


def trained(system: str, n: int = 4, iterations: int = 3) -> tuple[ppo.Trainer, int]:
    """A seeded CartPole run of ``iterations`` rollouts and updates; the trainer and its episode ends."""
    env = subjects.open_stepper(system, "CartPole-v1", n, seed=3)
    try:
        trainer = ppo.Trainer(env, ppo.PPOConfig(rollout_steps=32, epochs=2, minibatches=2), seed=7)
        ends = 0
        for _ in range(iterations):
            trainer.collect()
            ends += int(trainer.dones.sum())
            trainer.update()
        return trainer, ends
    finally:
        env.close()


def tensors(state: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a (nested) state dict, by path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        return {k: v for key, sub in state.items() for k, v in tensors(sub, f"{prefix}/{key}").items()}
    if isinstance(state, (list, tuple)):
        return {k: v for i, sub in enumerate(state) for k, v in tensors(sub, f"{prefix}/{i}").items()}
    return {}


def test_syncvectorenv_and_shmpool_train_to_the_same_parameters():
    reference, ends = trained(subjects.SYNC_VEC)
    candidate, _ = trained(subjects.POOL_SYNC)
    assert ends > 0, "the run must cross episode ends, where autoreset semantics could differ"
    assert reference.steps == candidate.steps == 3 * 32 * 4
    want, got = tensors(reference.state()), tensors(candidate.state())
    assert want.keys() == got.keys() and len(want) > 10
    different = [k for k in want if not torch.equal(want[k], got[k])]
    assert not different, f"tensors that differ: {different}"


def test_a_different_seed_trains_differently():
    """The comparison above can fail: the parameters depend on the env's observations."""
    reference, _ = trained(subjects.SYNC_VEC)
    env = subjects.open_stepper(subjects.SYNC_VEC, "CartPole-v1", 4, seed=4)
    try:
        other = ppo.Trainer(env, ppo.PPOConfig(rollout_steps=32, epochs=2, minibatches=2), seed=7)
        for _ in range(3):
            other.collect()
            other.update()
    finally:
        env.close()
    want, got = tensors(reference.state()), tensors(other.state())
    assert any(not torch.equal(want[k], got[k]) for k in want)


def test_quick_run_reports_every_system_it_ran(capsys, monkeypatch):
    import os
    import warnings
    monkeypatch.setenv("PYTHONWARNINGS", "")
    assert train.main(["--quick", "--seconds", "0.2"]) == 0
    # Box bounds' precision warnings stay out of the table, here and in the processes the run starts
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("Box low's precision lowered by casting to float32, current low.dtype=float64", UserWarning,
                      stacklevel=1)
    assert caught == [] and "ignore:Box high's precision lowered" in os.environ["PYTHONWARNINGS"]
    out = capsys.readouterr().out
    assert "| CartPole-v1 | 8 | SyncVectorEnv |" in out
    assert "| CartPole-v1 | 8 | shmpool sync |" in out
    assert "÷ best gymnasium vector env" in out
    # the last column: the share of the loop's wall time inside env.step, a percentage of it
    row = next(line for line in out.splitlines() if line.startswith("| CartPole-v1 | 8 | shmpool sync |"))
    share = row.strip(" |").split(" | ")[-1]
    assert share.endswith("%") and 0 < int(share[:-1]) < 100, row


@pytest.mark.parametrize("system,batch,hosted", [
    (subjects.POOL_SYNC_PROCESSES, 4, None), (subjects.POOL_ASYNC_PARENT, 2, 1)])
def test_opt_in_layouts_build_the_pool_they_name(system, batch, hosted):
    env = subjects.open_stepper(system, "CartPole-v1", 4, seed=3)
    try:
        pool = env.env.pool
        assert (env.batch, pool.batch_size, pool.parent_shard) == (batch, batch, hosted)
    finally:
        env.close()


def test_zoo_settings_for_cartpole_and_mujoco():
    kwargs, normalize = train.zoo_hyperparameters("CartPole-v1")
    assert (kwargs["n_steps"], kwargs["batch_size"], kwargs["n_epochs"], normalize) == (32, 256, 20, False)
    assert kwargs["learning_rate"](1.0) == pytest.approx(1e-3) and kwargs["learning_rate"](0.5) == pytest.approx(5e-4)
    assert train.zoo_hyperparameters("Ant-v5") == ({}, True)


def test_sb3_ppo_systems_learn_in_whole_iterations(tmp_path, capsys, no_leaks):
    pytest.importorskip("stable_baselines3")
    path = tmp_path / "train.json"
    systems = "SB3 PPO DummyVecEnv,SB3 PPO ShmVecEnv"
    assert train.main(["--quick", "--seconds", "0.2", "--num-envs", "2", "--systems", systems,
                       "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert "÷ SB3 PPO DummyVecEnv" in captured.out   # no SyncVectorEnv: the first system
    (cell,) = json.loads(path.read_text())["cells"]
    for system in systems.split(","):
        (sample,) = cell["systems"][system]["samples"]
        assert "error" not in sample, sample.get("error")
        assert sample["count"] % (2 * 32) == 0 and sample["count"] > 0   # whole rollouts of n_steps=32 × N=2
        assert 0 < sample["parts_s"]["rollouts"] < sample["seconds"]     # the update is outside the rollouts


def test_gpu_device_without_a_gpu_runs_the_gpu_shaped_loop(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU: --device gpu runs the real policy on cuda")
    path = tmp_path / "train.json"
    assert train.main(["--quick", "--seconds", "0.3", "--device", "gpu", "--json", str(path),
                       "--systems", "SyncVectorEnv,shmpool sync,SB3 PPO DummyVecEnv"]) == 0
    out = capsys.readouterr().out
    assert "policy on gpu-shaped (no GPU here: bench/README.md, train)" in out
    assert "CartPole-v1 · SB3 PPO DummyVecEnv skipped — SB3's PPO has no GPU-shaped form" in out
    (cell,) = json.loads(path.read_text())["cells"]
    for system in ("SyncVectorEnv", "shmpool sync"):
        (sample,) = cell["systems"][system]["samples"]
        # Each loop step waits 3 ms for the "device", so 8 envs make at most ~2,300 steps/s (the CPU loop
        # makes ~10-20k); the update's 16 waits are outside env.step.
        assert sample["count"] / sample["seconds"] < 8 / 0.003, sample
        assert 0 < sample["parts_s"]["env.step"] < 0.5 * sample["seconds"], sample
