"""bench sb3-ppo: SB3's PPO really learns over each system, with the zoo's settings, and the JSON says so."""
import json

import pytest

pytest.importorskip("stable_baselines3")

from bench import sb3_ppo  # noqa: E402


def test_zoo_settings_for_cartpole_and_mujoco():
    kwargs, normalize = sb3_ppo.hyperparameters("CartPole-v1")
    assert (kwargs["n_steps"], kwargs["batch_size"], kwargs["n_epochs"], normalize) == (32, 256, 20, False)
    assert kwargs["learning_rate"](1.0) == pytest.approx(1e-3) and kwargs["learning_rate"](0.5) == pytest.approx(5e-4)
    assert sb3_ppo.hyperparameters("Ant-v5") == ({}, True)
    assert sb3_ppo.default_timesteps("CartPole-v1", 32) == 8192        # at least 8,192 steps
    assert sb3_ppo.default_timesteps("Ant-v5", 8) == 2 * 2048 * 8     # two rollouts of SB3's n_steps


def test_every_system_learns_and_the_rollouts_are_timed(tmp_path, no_leaks):
    out = tmp_path / "sb3.json"
    assert sb3_ppo.main(["--tasks", "CartPole-v1", "--num-envs", "2", "--timesteps", "128", "--repeats", "1",
                         "--json", str(out)]) == 0
    (group,) = json.loads(out.read_text())["groups"]
    assert list(group["runs"]) == list(sb3_ppo.SYSTEMS)
    for system, (run,) in group["runs"].items():
        assert run["timesteps"] >= 128, system            # learn() ran whole rollouts
        assert 0 < run["rollout_s"] < run["wall_s"], system   # the update is outside the rollout clock


def test_unknown_system_is_named():
    with pytest.raises(SystemExit):
        sb3_ppo.main(["--systems", "DummyVecEnv,Nope"])
