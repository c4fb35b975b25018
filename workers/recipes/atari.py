"""Lean Atari recipes with EnvPool's ``<Game>-v5`` semantics, built on ``ale_py.ALEInterface``.

Every env here drives one ``ALEInterface`` directly (no gymnasium ``AtariEnv`` and no
wrappers) and does what EnvPool's ``atari_env.h`` does, with EnvPool's option names
and defaults: ``stack_num=4``, ``frame_skip=4`` with a max-pool over the last two
frames, ``noop_max=30`` no-ops at reset, FIRE at reset for games whose action set has
FIRE (``use_fire_reset=True``), ``img_height``/``img_width`` 84, ``gray_scale=True``,
``cv2.INTER_AREA`` resize (``use_inter_area_resize=True``; ``False`` is bilinear),
``episodic_life=False``, ``reward_clip=False``, ``repeat_action_probability=0``,
``max_episode_steps=27000`` agent steps, ``full_action_space=False``.

- Observations: uint8 ``(stack_num, img_height, img_width)`` (gray) or
  ``(3 * stack_num, img_height, img_width)`` (RGB, channels first per frame), oldest
  frame first; at a game reset every slot holds the first frame (EnvPool's stack
  padding, gymnasium ``FrameStackObservation``'s ``padding_type="reset"``).
- Rewards: the frame-skipped sum (clipped to its sign with ``reward_clip=True``).
- Infos: ``lives`` (int), ``reward`` (the unclipped reward, float), ``terminated``
  (the ALE's game over, bool: with ``episodic_life`` a lost life ends the episode but
  not the game) and ``elapsed_step`` (agent steps since the game was reset); with
  ``info_ram=True`` also EnvPool's ``ram``, the ALE's 128 bytes (uint8 ``(128,)``).  It is
  asked for, not always there as in EnvPool: an array info leaves the shared-memory info
  table for the pickled side channel, which cost 20-25 % of Pong-v5's steps/s (N=8).
- ``terminated``/``truncated`` are EnvPool's: ``truncated`` once ``max_episode_steps``
  agent steps are done, ``terminated`` when the game is over (or a life was lost with
  ``episodic_life``) and the episode was not truncated on the same step.
- Reset: ``U{1..noop_max}`` actions, all NOOP except a final FIRE under fire reset
  (EnvPool's count), then the first observation.  With ``episodic_life`` a reset after
  a lost life continues the game (no-ops and FIRE again; ``elapsed_step`` goes on).
  ``noop_max=0`` means no no-ops at all (gymnasium's meaning; EnvPool needs >= 1).
- Seeding follows gymnasium's ``AtariEnv``: ``reset(seed=s)`` splits ``s`` with a
  ``SeedSequence`` into the ALE's ``random_seed`` (then reloads the ROM) and the numpy
  Generator the no-op counts come from, so with fire reset off a seeded recipe replays
  ``AtariPreprocessing(noop_max=...) + FrameStackObservation`` exactly, frame for frame
  (EnvPool's own C++ generator cannot be replayed from Python; only the distributions match).

Grey frames with an INTER_AREA downscale (the default 210x160 -> 84x84) skip OpenCV: the
``_frames.AreaPush`` kernel max-pools the two reads, resizes with OpenCV's own float weights
and rounding (bit for bit ``cv2.resize``; ``tests/units/test_frames_kernel.py``) and writes into the
stack's newest slot in one pass.  Other sizes, bilinear and RGB frames use ``cv2.resize``.

Checked frame for frame against EnvPool 1.2.5 (``tests/faces/test_recipes_atari.py``, with
``noop_max=1`` so that its reset is deterministic).  Differences from EnvPool:
``zero_discount_on_life_loss`` is accepted but changes nothing (it only sets the dm_env
discount, which the gymnasium API has no place for); infos carry no ``ram`` (128 bytes per
env would leave the shared-memory info table for the pickled side channel).
Gymnasium's ``AtariPreprocessing`` differs from both on the last observation of a game
that ends inside the frame skip: it returns the stale previous frames where EnvPool (and
this recipe) push the last frames read.

Call :func:`register` to make every ``<Game>-v5`` buildable with ``shmpool.make``.
"""
from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable
from typing import Any, ClassVar

import ale_py
import gymnasium
import numpy as np
from ale_py import roms
from gymnasium.spaces import Box, Discrete
from gymnasium.utils import seeding

try:
    import cv2
except ImportError:   # registering the ids needs only ale-py; building an env needs OpenCV
    cv2 = None

from . import atari_games, atari_task_id
from ._frames import AreaPush, area_is_generic

__all__ = ["GAMES", "AreaPush", "AtariEnv", "check_options", "task_id", "tasks"]

_RAW_HEIGHT, _RAW_WIDTH = 210, 160
task_id = atari_task_id   # the name this module has always exported


#: Task id (``"Pong-v5"``) -> ALE ROM id (``"pong"``), every game ale-py ships.
GAMES: dict[str, str] = atari_games(roms.get_all_rom_ids())


def _type_error(name: str, value: Any, kind: str) -> TypeError:
    return TypeError(f"Atari option {name} must be {kind}, got {value!r} ({type(value).__name__})")


def _check_type(name: str, value: Any, default: Any) -> None:
    """TypeError for a value of a type EnvPool 1.2.5 refuses for option ``name`` (whose default says its type):
    a bool option takes a bool, a number or None (any truthy value did, so "no" turned it on); an integer one
    anything with ``__index__`` (a bool too, never a float or a string); a float one any real number."""
    if isinstance(default, bool):
        if value is not None and not isinstance(value, (bool, int, float, np.bool_, np.number)):
            raise _type_error(name, value, "a bool")
    elif isinstance(default, float):
        if not isinstance(value, (int, float, np.number)) or isinstance(value, np.complexfloating):
            raise _type_error(name, value, "a number")
    elif isinstance(default, int) or default is None:   # mode and difficulty: None is the ROM's default
        if value is None and default is None:
            return
        try:
            operator.index(value)
        except TypeError:
            raise _type_error(name, value, "an integer" if default is not None else "an integer or None") from None


def check_options(**options: Any) -> None:
    """Raise ``ValueError`` naming the option for an unknown name or an out-of-range value, ``TypeError`` for a
    value of a type EnvPool refuses (as EnvPool raises it)."""
    known = AtariEnv.OPTIONS
    for name in options:
        if name not in known:
            raise ValueError(f"unknown Atari option {name!r}; options are {', '.join(known)}")
    for name, value in options.items():
        _check_type(name, value, known[name].default)
    o = {**{k: v.default for k, v in known.items()}, **options}
    at_least = {"stack_num": 1, "frame_skip": 1, "noop_max": 0, "img_height": 1, "img_width": 1,
                "max_episode_steps": 1}
    for name, low in at_least.items():
        value = o[name]
        if value < low:
            raise ValueError(f"Atari option {name} must be an integer >= {low}, got {value!r}")
    p = o["repeat_action_probability"]
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"Atari option repeat_action_probability must be in [0, 1], got {p!r}")


class AtariEnv(gymnasium.Env):
    """One Atari game with EnvPool's preprocessing (see the module docstring).

    ``task`` is the ALE ROM id (``"pong"``) or a task id (``"Pong-v5"``); the other
    keywords are EnvPool's options.  ``reset``/``step`` return a fresh observation array
    unless :meth:`bind_obs` gave the env a buffer to write into."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"]}
    OPTIONS: ClassVar[dict[str, inspect.Parameter]]

    def __init__(self, task: str = "pong", *, stack_num: int = 4, frame_skip: int = 4, noop_max: int = 30,
                 zero_discount_on_life_loss: bool = False, episodic_life: bool = False, reward_clip: bool = False,
                 use_fire_reset: bool = True, img_height: int = 84, img_width: int = 84,
                 full_action_space: bool = False, repeat_action_probability: float = 0.0,
                 use_inter_area_resize: bool = True, gray_scale: bool = True, max_episode_steps: int = 27000,
                 mode: int | None = None, difficulty: int | None = None, info_ram: bool = False,
                 render_mode: str | None = None) -> None:
        if cv2 is None:
            raise gymnasium.error.DependencyNotInstalled(
                "the Atari recipes resize frames with OpenCV: pip install opencv-python-headless")
        rom = GAMES.get(task, task)
        if rom not in roms.get_all_rom_ids():
            raise ValueError(f"unknown Atari game {task!r}: not a ROM ale-py ships (e.g. 'pong', 'Pong-v5')")
        given = locals()   # every option, by its name
        check_options(**{name: given[name] for name in self.OPTIONS})
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        self.task = rom
        self.stack_num, self.frame_skip, self.noop_max = int(stack_num), int(frame_skip), int(noop_max)
        self.episodic_life, self.reward_clip = bool(episodic_life), bool(reward_clip)
        self.zero_discount_on_life_loss = bool(zero_discount_on_life_loss)
        self.gray_scale = bool(gray_scale)
        self.info_ram = bool(info_ram)
        self.max_episode_steps = int(max_episode_steps)
        # EnvPool's -1 means "the ROM's default", as None does.
        self._mode = None if mode is None or mode < 0 else int(mode)
        self._difficulty = None if difficulty is None or difficulty < 0 else int(difficulty)
        self._rom_path = roms.get_rom_path(rom)

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        self.ale = ale = ale_py.ALEInterface()
        ale.setFloat("repeat_action_probability", float(repeat_action_probability))
        self._seed_game(None)
        actions = ale.getLegalActionSet() if full_action_space else ale.getMinimalActionSet()
        self._action_set = list(actions)
        self._fire_reset = bool(use_fire_reset) and ale_py.Action.FIRE in self._action_set
        self.action_space = Discrete(len(self._action_set))

        channels = 1 if self.gray_scale else 3
        self._channels = channels
        self._size = (int(img_width), int(img_height))   # cv2's (width, height)
        self._interp = cv2.INTER_AREA if use_inter_area_resize else cv2.INTER_LINEAR
        shape = (self.stack_num * channels, int(img_height), int(img_width))
        self.observation_space = Box(0, 255, shape=shape, dtype=np.uint8)
        raw = (_RAW_HEIGHT, _RAW_WIDTH) if self.gray_scale else (_RAW_HEIGHT, _RAW_WIDTH, 3)
        # EnvPool's two max-pool buffers: [0] <- frame frame_skip-1, [1] <- frame frame_skip.
        self._frames = (np.zeros(raw, np.uint8), np.zeros(raw, np.uint8))
        self._grab = ale.getScreenGrayscale if self.gray_scale else ale.getScreenRGB
        self._resized = None if self.gray_scale else np.zeros((int(img_height), int(img_width), 3), np.uint8)
        # Grey INTER_AREA downscales go through the fused kernel (max-pool + OpenCV's exact
        # area resize + stack push in one pass); everything else through cv2.resize.
        dst_hw = (int(img_height), int(img_width))
        use_kernel = self.gray_scale and use_inter_area_resize and area_is_generic((_RAW_HEIGHT, _RAW_WIDTH), dst_hw)
        self._area = AreaPush((_RAW_HEIGHT, _RAW_WIDTH), dst_hw) if use_kernel else None
        # EnvPool max-pools into buffer [0] in place; the kernel leaves it as read and keeps
        # "buffer [0] is max([0], [1])" here, so a step that reads no frame (the game ended
        # within the first frame_skip - 2 frames) resizes the same stale frame EnvPool does.
        self._pooled = False
        self._obs = np.zeros(shape, np.uint8)
        self._copy_obs = True
        self._bind_views()
        self._elapsed = 0
        self._lives = 0
        self._new_game = True   # the next reset starts a new game (also after seeding)

    # --- buffers -----------------------------------------------------------------------
    # The frame stack lives in the observation buffer: a pool must not hand its shared
    # row to bind_obs, since a trainer may write into the views a step returns.
    obs_buffer_is_state: ClassVar[bool] = True

    def bind_obs(self, out: np.ndarray | None = None) -> np.ndarray:
        """Write observations straight into ``out`` (uint8, ``observation_space.shape``);
        returns the buffer in use.  While bound, ``reset``/``step`` return ``out`` itself,
        valid until the next call; ``bind_obs(None)`` goes back to fresh copies.  The
        frame stack lives in the buffer, so a bound buffer must not be written by others."""
        shape = self.observation_space.shape
        if out is None:
            out, self._copy_obs = self._obs.copy(), True
        else:
            if out.shape != shape or out.dtype != np.uint8 or not out.flags.c_contiguous:
                raise ValueError(f"obs buffer must be C-contiguous uint8 {shape}, got {out.dtype} {out.shape}")
            out[...] = self._obs
            self._copy_obs = False
        self._obs = out
        self._bind_views()
        return out

    def _bind_views(self) -> None:
        c = self._channels
        self._older, self._newer = self._obs[:-c], self._obs[c:]   # the shift: older <- newer
        self._last = self._obs[-c:]
        self._frames_view = self._obs.reshape(self.stack_num, c, *self._obs.shape[1:])
        self._last_gray = self._obs[-1] if self.gray_scale else None

    def _push(self, maxpool: bool, push_all: bool) -> None:
        """EnvPool's ``PushStack``: max-pool the two raw frames into ``_frames[0]`` if asked,
        resize it into the newest stack slot after shifting the older ones down, and with
        ``push_all`` copy it into every slot."""
        f0 = self._frames[0]
        if self._area is not None:
            pooled = maxpool or self._pooled
            self._area.push(f0, self._frames[1] if pooled else None, self._obs, push_all)
            self._pooled = pooled
            return
        if maxpool:
            np.maximum(f0, self._frames[1], out=f0)
        if not push_all and self.stack_num > 1:
            self._older[...] = self._newer
        if self.gray_scale:
            cv2.resize(f0, self._size, dst=self._last_gray, interpolation=self._interp)
        else:
            cv2.resize(f0, self._size, dst=self._resized, interpolation=self._interp)
            self._last[...] = self._resized.transpose(2, 0, 1)
        if push_all and self.stack_num > 1:
            self._frames_view[:-1] = self._frames_view[-1]

    def _out(self) -> np.ndarray:
        return self._obs.copy() if self._copy_obs else self._obs

    # --- seeding, as gymnasium's AtariEnv ----------------------------------------------
    def _seed_game(self, seed: int | None) -> None:
        ss = np.random.SeedSequence(seed)
        np_seed, ale_seed = ss.generate_state(n_words=2)
        self._np_random, _ = seeding.np_random(int(np_seed))
        self.ale.setInt("random_seed", np.int32(ale_seed))
        self.ale.loadROM(self._rom_path)
        if self._mode is not None:
            self.ale.setMode(self._mode)
        if self._difficulty is not None:
            self.ale.setDifficulty(self._difficulty)

    # --- gymnasium API -----------------------------------------------------------------
    def render(self) -> np.ndarray | None:
        """The ALE screen, uint8 ``(210, 160, 3)`` RGB, with ``render_mode="rgb_array"`` (EnvPool's frame)."""
        return self.ale.getScreenRGB() if self.render_mode == "rgb_array" else None

    def get_action_meanings(self) -> list[str]:
        return [a.name for a in self._action_set]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """EnvPool's ``Reset``: a new game (unless ``episodic_life`` continues one after a lost
        life), ``U{1..noop_max}`` NOOP/FIRE frames, and the stack filled with the first frame."""
        if seed is not None:
            super().reset(seed=seed)
            self._seed_game(seed)
            self._new_game = True
        ale = self.ale
        push_all = False
        if (self._new_game or not self.episodic_life or ale.game_over()
                or self._elapsed >= self.max_episode_steps):
            ale.reset_game()
            self._elapsed = 0
            self._new_game = False
            push_all = True
        noops = int(self._np_random.integers(1, self.noop_max + 1)) - self._fire_reset if self.noop_max > 0 else 0
        noop = ale_py.Action.NOOP
        for _ in range(noops):
            ale.act(noop)
            if ale.game_over():
                ale.reset_game()
                push_all = True
        if self._fire_reset:
            ale.act(ale_py.Action.FIRE)
        self._grab(self._frames[0])
        self._pooled = False
        self._push(False, push_all)
        self._lives = ale.lives()
        info = {"lives": self._lives, "reward": 0.0, "terminated": ale.game_over(), "elapsed_step": self._elapsed}
        if self.info_ram:
            info["ram"] = ale.getRAM()
        return self._out(), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """EnvPool's ``Step``: ``frame_skip`` frames (fewer if the game ends), the last two
        max-pooled; returns gymnasium's 5-tuple with EnvPool's infos."""
        ale = self.ale
        act = self._action_set[action]
        grab, frames = self._grab, self._frames
        reward = 0
        game_over = False
        skip = self.frame_skip
        while skip > 0 and not game_over:
            reward += ale.act(act)
            game_over = ale.game_over()
            if skip <= 2:
                grab(frames[2 - skip])
            skip -= 1
        if self.frame_skip == 1:
            frames[0][...] = frames[1]   # one frame, nothing to pool with (EnvPool 1.2.5 gives the same)
            self._pooled = False
            self._push(False, False)
        else:
            if skip <= 1:   # frame frame_skip - 1 was read into [0] this step
                self._pooled = False
            self._push(skip == 0, False)
        self._elapsed += 1
        truncated = self._elapsed >= self.max_episode_steps
        lives = ale.lives()
        done = game_over or (self.episodic_life and 0 < lives < self._lives)
        self._lives = lives
        info_reward = float(reward)
        if self.reward_clip:
            reward = float((reward > 0) - (reward < 0))
        else:
            reward = info_reward
        info = {"lives": lives, "reward": info_reward, "terminated": game_over, "elapsed_step": self._elapsed}
        if self.info_ram:
            info["ram"] = ale.getRAM()
        return self._out(), reward, done and not truncated, truncated, info

    def close(self) -> None:
        self.ale = None


# EnvPool's options and shmpool's info_ram (render_mode is gymnasium's, not an option of the task).
AtariEnv.OPTIONS = {name: p for name, p in inspect.signature(AtariEnv.__init__).parameters.items()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "render_mode"}


def envpool_config(rom: str) -> dict[str, Any]:
    """A task's options as EnvPool 1.2.5's ``config`` lists them (its order; -1 for the ROM's
    default mode/difficulty; ``base_path`` where the ROMs are)."""
    o = {name: p.default for name, p in AtariEnv.OPTIONS.items()}
    for name in ("mode", "difficulty"):
        o[name] = -1 if o[name] is None else o[name]
    order = ("max_episode_steps", "stack_num", "frame_skip", "noop_max", "zero_discount_on_life_loss",
             "episodic_life", "reward_clip", "use_fire_reset", "img_height", "img_width", "task", "mode",
             "difficulty", "full_action_space", "repeat_action_probability", "use_inter_area_resize", "gray_scale")
    o["task"] = rom
    return {"base_path": str(roms.get_rom_path(rom).parent), **{k: o[k] for k in order}}


# --- registration ---------------------------------------------------------------------

def _builder(rom: str) -> Callable[..., list[Callable[[], gymnasium.Env]]]:
    def build(num_envs: int = 1, render_mode: str | None = None, **kwargs: Any) -> list[Callable[[], gymnasium.Env]]:
        """``num_envs`` constructors of ``AtariEnv(rom, **kwargs)``; options are checked here,
        before any worker starts."""
        check_options(**kwargs)
        return [functools.partial(AtariEnv, rom, render_mode=render_mode, **kwargs)] * num_envs
    return build


def tasks() -> dict[str, Callable[..., list[Callable[[], gymnasium.Env]]]]:
    """``{task id: builder}`` for every ``<Game>-v5`` (``shmpool.registration`` registers them).

    Ids are gymnasium's ``ALE/<Game>-v5`` names without the namespace (EnvPool's ids), so
    ``shmpool.make("Pong-v5", num_envs=8)`` builds these recipes."""
    return {tid: _builder(rom) for tid, rom in GAMES.items()}


def configs() -> dict[str, dict]:
    """``{task id: EnvPool's config defaults}`` for :func:`tasks` (``env.spec.config`` of the EnvPool face)."""
    return {tid: envpool_config(rom) for tid, rom in GAMES.items()}
