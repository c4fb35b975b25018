"""Built-in tasks: lean reimplementations of well-known envs, and shmpool's own.

A recipe is a ``gymnasium.Env`` (or a natively batched env, ``batch_pong``) that does only
what its task needs, so the Python around the native simulator (the part a worker pays for
on every step) stays small.  Each recipe module has a ``tasks()`` giving
``{task id: builder}``; ``shmpool.registration`` imports the modules whose extras are
installed and registers those (the recipes never import the registry: no cycle).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MUJOCO_TASK_IDS", "atari_games", "atari_task_id"]

# The ids of the recipe modules, known without importing their extras (mujoco, ale-py): the
# registry lists them in gymnasium's registry at ``import shmpool``, and builds them on first use.

#: ``mujoco.TASKS``'s ids (tests/faces/test_recipes_mujoco.py checks the two agree).
MUJOCO_TASK_IDS = ("Ant-v5", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Swimmer-v5", "InvertedPendulum-v5",
                   "InvertedDoublePendulum-v5", "Reacher-v5", "Humanoid-v5", "HumanoidStandup-v5")

# ROMs without a single-player mode: gymnasium and EnvPool register no env for them.
_MULTIPLAYER_ONLY = frozenset({"combat", "joust", "maze_craze", "warlords"})


def atari_task_id(rom: str) -> str:
    """``"space_invaders"`` -> ``"SpaceInvaders-v5"``: gymnasium's ``ALE/<Name>-v5`` name."""
    return rom.title().replace("_", "") + "-v5"


def atari_games(rom_ids: Iterable[str]) -> dict[str, str]:
    """Task id (``"Pong-v5"``) -> ALE ROM id (``"pong"``) for ale-py's ROM ids
    (``ale_py.roms.get_all_rom_ids()``)."""
    games = {}
    for rom in sorted(rom_ids):
        if rom in _MULTIPLAYER_ONLY:
            continue
        games[atari_task_id(rom)] = rom
        # EnvPool capitalizes each word (``TicTacToe3d-v5``); keep its spelling working too.
        games.setdefault("".join(w.capitalize() for w in rom.split("_")) + "-v5", rom)
    return games
