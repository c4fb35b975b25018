"""bench recipe-cost: every side of a recipe's step is timed and printed (not a timing test)."""
import pytest

pytest.importorskip("mujoco")

from bench import recipe_cost  # noqa: E402


def test_ant_costs_every_side(capsys):
    assert recipe_cost.main(["--task", "Ant-v5", "--steps", "40", "--repeats", "1", "--block", "10"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Ant-v5"))
    assert len(row.split()) >= 8, row
    costs = recipe_cost.measure("Ant-v5", 40, 1, 10)
    for side in ("recipe", "physics", "gymnasium", "gym unwrapped", "recipe overhead", "gym overhead"):
        assert costs[side] > 0, (side, costs)
    assert costs["physics"] < costs["recipe"]   # the floor is a part of the recipe's own step
