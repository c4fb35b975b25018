"""bench tasks --costs-only: every side of a recipe's step is timed and printed (not a timing test)."""
import pytest

pytest.importorskip("mujoco")

from bench import recipe_cost, tasks  # noqa: E402

pytestmark = [pytest.mark.slow,             # bench recipe_cost steps MuJoCo/Atari recipes every way
              pytest.mark.heavy_imports]    # envpool among them, in this process


def test_ant_costs_every_side(capsys):
    assert tasks.main(["--costs-only", "--tasks", "Ant-v5", "--cost-steps", "40", "--cost-repeats", "1",
                       "--no-envpool"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| Ant-v5 |"))
    assert len(row.strip("|").split("|")) == len(tasks.COST_HEADER), row
    assert "Throughput" not in out and "### Targets" not in out   # the cost table alone
    costs = recipe_cost.measure("Ant-v5", 40, 1, 10)
    for side in ("recipe", "physics", "gymnasium", "gym unwrapped", "recipe overhead", "gym overhead"):
        assert costs[side] > 0, (side, costs)
    assert costs["physics"] < costs["recipe"]   # the floor is a part of the recipe's own step


def test_all_means_every_mujoco_recipe():
    assert tasks.parse_args(["--costs-only", "--tasks", "all"]).tasks == list(recipe_cost.TASKS)
