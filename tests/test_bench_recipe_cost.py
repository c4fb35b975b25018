"""bench.recipe_cost --pieces: every piece of a Pong and an Ant step is timed, before and after."""
import pytest

pytest.importorskip("mujoco")
pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from bench import recipe_cost  # noqa: E402


def test_pieces_cover_both_steps(capsys):
    assert recipe_cost.main(["--pieces", "--steps", "20", "--repeats", "1", "--block", "10"]) == 0
    out = capsys.readouterr().out
    assert "Pong-v5" in out and "Ant-v5" in out and "fused kernel" in out and "mj_step x5" in out

    pong = recipe_cost.atari_pieces("Pong-v5", 20, 1, 10)
    before, after = pong["recipe step (before = after - kernel + old pieces)"]
    assert pong["fused kernel (pool+resize+push)"][0] is None and pong["resize (cv2 INTER_AREA)"][1] is None
    assert before > 0 and after > 0 and pong["ALE frames (act x4)"][1] > 0
    ant = recipe_cost.mujoco_pieces("Ant-v5", 20, 1, 10)
    assert all(b > 0 and a > 0 for name, (b, a) in ant.items() if not name.startswith("Python"))
