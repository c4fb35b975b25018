"""bench cleanrl: the one-line swap and the gymnasium 1.x patches, on a script shaped like CleanRL's
(its real scripts are not part of this repository)."""
import pytest

from bench import cleanrl as C

SCRIPT = ("import gymnasium as gym\nimport numpy as np\nimport torch\n\n\nif __name__ == '__main__':\n"
          f"    {C.VEC_LINE}[make_env() for i in range(4)])\n"
          "    for step in range(3):\n"
          "        if True:\n"
          f"{C.EPISODE_LOG_OLD}"
          f"    env = {C.CLIP_OLD}\n"
          f"{C.RESULT_ANCHOR}")


@pytest.mark.parametrize("system, line", [
    ("sync", "gym.vector.SyncVectorEnv("), ("async", "gym.vector.AsyncVectorEnv("),
    ("shmpool", "shmpool.VectorEnv("), ("shmpool-optout", "shmpool.VectorEnv("),
])
def test_only_the_vector_env_line_differs_between_systems(system, line):
    text = C.patch(SCRIPT, "ppo_continuous_action", system)
    assert f"envs = {line}" in text
    assert ("import shmpool\n" in text) == system.startswith("shmpool")
    # shmpool comes before torch, as a user who adds the import beside gymnasium's has it
    if system.startswith("shmpool"):
        assert text.index("import shmpool") < text.index("import torch")
    assert C.EPISODE_LOG_NEW in text and C.CLIP_NEW in text
    assert text.index(C.MARK) < text.rindex("envs.close()")
    sync = C.patch(SCRIPT, "ppo_continuous_action", "sync")
    assert sync.replace("gym.vector.SyncVectorEnv(", line).replace("import shmpool\n", "") == \
        text.replace("import shmpool\n", "")


def test_a_script_of_another_revision_is_refused_by_name():
    with pytest.raises(C.PatchError, match="episode logging"):
        C.patch(SCRIPT.replace('if "final_info" in infos:', 'if "final_info" in info:'), "ppo", "sync")
    with pytest.raises(C.PatchError, match="vector env"):
        C.patch(SCRIPT.replace(C.VEC_LINE, ""), "ppo", "shmpool")


def test_the_layout_shmpool_chose_is_kept_and_a_layout_that_changed_between_runs_is_said(monkeypatch):
    import json
    case = C.Case("ppo", "CartPole-v1", 32, timesteps=4096)
    runs = []
    for rep, workers in enumerate((0, 1)):
        run = C.Run(case.name, C.SHMPOOL, rep)
        C.parse_output(run, "SPS: 900\n" + C.MARK + " " + json.dumps(
            {"global_step": 4096, "seconds": 4.5, "param_sum": 1.0, "param_sha256": "ab", "worker_processes": workers}))
        runs.append(run)
    assert [r.worker_processes for r in runs] == [0, 1]
    summary = C.case_summary(case, [C.SHMPOOL], runs)
    assert summary["systems"][C.SHMPOOL]["worker_processes"] == [0, 1]
    env = {"torch": "2", "gymnasium": "1", "scripts_sha256": {}}
    args = type("A", (), {"env": [], "command": "x"})()
    monkeypatch.setattr(C.report, "header", lambda *a, **k: "header")
    assert "**shmpool's layout differed between runs**: [0, 1] worker processes." in C.markdown(args, env, [summary])
