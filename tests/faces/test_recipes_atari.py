"""The Atari recipes (``shmpool.workers.recipes.atari``): EnvPool's ``<Game>-v5`` semantics.

- frame for frame equal to gymnasium's ``AtariEnv`` + ``AtariPreprocessing`` +
  ``FrameStackObservation`` (fire reset off: gymnasium's wrappers have none), alone and
  through ``shmpool.make``, with and without no-ops (the no-op counts come from the same
  seeded Generator);
- frame for frame equal to EnvPool's C++ env where its reset is deterministic
  (``noop_max=1``: no no-op, just FIRE), and the same episode statistics under a random
  policy with the default ``noop_max=30``;
- the rules: shapes, infos, max-pool, time limit, fire reset, life loss, reward clip, errors.
"""
from __future__ import annotations

import math
import re

import gymnasium as gym
import numpy as np
import pytest

ale_py = pytest.importorskip("ale_py")
cv2 = pytest.importorskip("cv2")

from shmpool.workers.recipes.atari import GAMES, AtariEnv  # noqa: E402

import shmpool  # noqa: E402

gym.register_envs(ale_py)


def reference(game: str, noop_max: int) -> gym.Env:
    """gymnasium's preprocessing stack, as the DQN papers (and EnvPool) describe it."""
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=4, screen_size=84)
    return gym.wrappers.FrameStackObservation(env, 4)   # padding_type="reset": EnvPool's padding


def _actions(n: int, size: int | tuple, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size)


# --- equivalence with gymnasium ---------------------------------------------------------------

@pytest.mark.slow   # hundreds of frames against ale-py's envs and gymnasium's wrappers: 1.5-2 s each, quiet
@pytest.mark.parametrize(("game", "noop_max", "steps"), [("Pong", 0, 300), ("Pong", 30, 200), ("Breakout", 0, 500)])
def test_matches_gymnasium_wrappers(game, noop_max, steps):
    ref = reference(game, noop_max)
    env = AtariEnv(f"{game}-v5", noop_max=noop_max, use_fire_reset=False)
    o1, _ = ref.reset(seed=5)
    o2, _ = env.reset(seed=5)
    np.testing.assert_array_equal(o1, o2)
    ends = 0
    for a in _actions(env.action_space.n, steps):
        o1, r1, te1, tr1, i1 = ref.step(a)
        o2, r2, te2, tr2, i2 = env.step(a)
        assert (r1, te1, tr1) == (r2, te2, tr2)
        assert i1["lives"] == i2["lives"]
        assert o2.dtype == np.uint8 and o2.shape == (4, 84, 84)
        if te1 or tr1:
            # AtariPreprocessing stops reading frames once the game is over and returns the stale
            # previous ones; EnvPool (and the recipe) push the last frames read.  The older three
            # stacked frames agree.
            ends += 1
            np.testing.assert_array_equal(o1[:-1], o2[:-1])
            o1, _ = ref.reset()
            o2, _ = env.reset()
        np.testing.assert_array_equal(o1, o2)
    if game == "Breakout":
        assert ends >= 1   # the random policy loses its five lives: resets were compared too


@pytest.mark.slow   # ale-py's envs and the recipe's in a pool side by side: ~5 s each on 2 loaded cores
@pytest.mark.parametrize(("game", "steps"), [("Pong", 250), ("Breakout", 250)])
def test_matches_gymnasium_through_pool(game, steps):
    n, seed = 4, 10
    refs = [reference(game, 0) for _ in range(n)]
    pool = shmpool.make(f"{game}-v5", num_envs=n, num_threads=2, seed=seed, noop_max=0, use_fire_reset=False)
    try:
        obs, infos = pool.reset()
        assert obs.shape == (n, 4, 84, 84) and obs.dtype == np.uint8
        for i, ref in enumerate(refs):
            np.testing.assert_array_equal(obs[i], ref.reset(seed=seed + i)[0])
        ended = np.zeros(n, bool)
        actions = _actions(refs[0].action_space.n, (steps, n))
        for acts in actions:
            obs, rewards, terminated, truncated, infos = pool.step(acts)
            for i, ref in enumerate(refs):
                if ended[i]:   # NEXT_STEP autoreset: this step reset the env
                    o, _ = ref.reset()
                    r, te, tr = 0.0, False, False
                else:
                    o, r, te, tr, _ = ref.step(acts[i])
                assert (rewards[i], terminated[i], truncated[i]) == (r, te, tr)
                if te or tr:
                    np.testing.assert_array_equal(obs[i][:-1], o[:-1])   # see test_matches_gymnasium_wrappers
                else:
                    np.testing.assert_array_equal(obs[i], o)
            ended = terminated | truncated
    finally:
        pool.close()


# --- EnvPool -------------------------------------------------------------------------------------

def _envpool(task: str, **kwargs):
    envpool = pytest.importorskip("envpool")
    try:
        return envpool.make(task, env_type="gymnasium", **kwargs)
    except Exception as exc:   # no ROMs, a broken wheel, ...
        pytest.skip(f"EnvPool cannot make {task}: {type(exc).__name__}: {exc}")


@pytest.mark.slow   # frame by frame against envpool itself: 2-4 s each, quiet
@pytest.mark.parametrize(("game", "options"), [
    ("Pong", {}),
    ("Breakout", {"gray_scale": False}),
    ("Breakout", {"episodic_life": True, "reward_clip": True}),
    ("Pong", {"frame_skip": 3, "stack_num": 2, "img_height": 64, "img_width": 48, "use_inter_area_resize": False}),
])
@pytest.mark.heavy_imports
def test_matches_envpool_exactly_without_noops(game, options):
    """``noop_max=1`` makes EnvPool's reset deterministic (zero no-ops, then FIRE), and with
    ``repeat_action_probability=0`` the ALE is too: every frame, reward and flag must agree."""
    ep = _envpool(f"{game}-v5", num_envs=1, seed=3, noop_max=1, **options)
    env = AtariEnv(f"{game}-v5", noop_max=1, info_ram=True, **options)
    o1, i1 = ep.reset()
    o2, i2 = env.reset(seed=123)
    np.testing.assert_array_equal(o1[0], o2)
    np.testing.assert_array_equal(i1["ram"][0], i2["ram"])
    assert i1["lives"][0] == i2["lives"] and i1["elapsed_step"][0] == i2["elapsed_step"]
    ends = 0
    for a in _actions(env.action_space.n, 400):
        o1, r1, te1, tr1, i1 = ep.step(np.array([a]))
        o2, r2, te2, tr2, i2 = env.step(a)
        np.testing.assert_array_equal(o1[0], o2)
        assert (r1[0], te1[0], tr1[0]) == (r2, te2, tr2)
        assert (i1["lives"][0], i1["reward"][0], bool(i1["terminated"][0]), i1["elapsed_step"][0]) == \
            (i2["lives"], i2["reward"], i2["terminated"], i2["elapsed_step"])
        np.testing.assert_array_equal(i1["ram"][0], i2["ram"])       # info_ram=True: EnvPool's RAM bytes
        if te2 or tr2:   # EnvPool resets on the next step (its action is ignored)
            ends += 1
            np.testing.assert_array_equal(ep.step(np.array([0]))[0][0], env.reset()[0])
    if options.get("episodic_life"):
        assert ends >= 1


def _random_episodes(env, n: int, episodes_per_env: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Lengths and returns of the first ``episodes_per_env`` episodes of each of ``n`` envs under
    uniform random actions (NEXT_STEP autoreset on both sides)."""
    rng = np.random.default_rng(seed)
    env.reset()
    lengths, returns = [], []
    length, ret = np.zeros(n, int), np.zeros(n)
    counted = np.zeros(n, int)
    ended = np.zeros(n, bool)
    while (counted < episodes_per_env).any():
        _, r, te, tr, _ = env.step(rng.integers(0, 6, n))
        live = ~ended
        length[live] += 1
        ret[live] += r[live]
        ended = te | tr
        for i in np.flatnonzero(ended & live):
            if counted[i] < episodes_per_env:
                lengths.append(length[i])
                returns.append(ret[i])
            counted[i] += 1
            length[i], ret[i] = 0, 0.0
    return np.array(lengths), np.array(returns)


def _close_means(a: np.ndarray, b: np.ndarray, floor: float) -> None:
    """Means within 4 standard errors of their difference (a false alarm about once in 16,000
    runs for near-normal means), or ``floor`` when both samples barely vary."""
    se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    assert abs(a.mean() - b.mean()) <= max(4 * se, floor), (a.mean(), b.mean(), se)


@pytest.mark.slow   # many random episodes in the recipe and in envpool: ~13 s on 2 loaded cores
@pytest.mark.heavy_imports
def test_random_policy_statistics_match_envpool():
    """Pong-v5 with the defaults (30 no-ops, FIRE, 4 frames, ...) under a random policy: EnvPool
    and the recipe must give the same distributions of episode length and return.  8 envs x 1
    episode (about 800 agent steps each) per side; a random Pong episode is 21 lost points, so
    returns sit in [-21, -18] and lengths spread by about 10%."""
    n = 8
    ep = _envpool("Pong-v5", num_envs=n, seed=100)
    ep_len, ep_ret = _random_episodes(ep, n, 1, seed=1)
    pool = shmpool.make("Pong-v5", num_envs=n, num_threads=2, seed=200)
    try:
        our_len, our_ret = _random_episodes(pool, n, 1, seed=2)
    finally:
        pool.close()
    assert (ep_ret <= -15).all() and (our_ret <= -15).all()
    print(f"EnvPool: lengths {ep_len.mean():.0f} ± {ep_len.std(ddof=1):.0f}, returns {ep_ret.mean():.2f}; "
          f"recipe: lengths {our_len.mean():.0f} ± {our_len.std(ddof=1):.0f}, returns {our_ret.mean():.2f}")
    _close_means(ep_len, our_len, floor=40)
    _close_means(ep_ret, our_ret, floor=1.0)


# --- rules ---------------------------------------------------------------------------------------

def test_spaces_and_infos():
    env = AtariEnv("Pong-v5")
    assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert env.action_space == gym.spaces.Discrete(6)
    obs, info = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert (obs == obs[-1]).all()   # a new game: every slot holds the first frame
    assert set(info) == {"lives", "reward", "terminated", "elapsed_step"} and info["elapsed_step"] == 0
    obs2, reward, terminated, truncated, info = env.step(0)
    assert obs2 is not obs and (obs2[:-1] == obs[1:]).all()   # fresh arrays; the stack shifted by one
    assert isinstance(reward, float) and terminated is False and truncated is False
    assert type(info["lives"]) is int and type(info["reward"]) is float
    assert type(info["terminated"]) is bool and info["elapsed_step"] == 1

    rgb = AtariEnv("Breakout-v5", gray_scale=False, stack_num=2, img_height=50, img_width=40)
    assert rgb.observation_space.shape == (6, 50, 40)
    obs, _ = rgb.reset(seed=0)
    raw = rgb.ale.getScreenRGB()
    np.testing.assert_array_equal(obs[3:], cv2.resize(raw, (40, 50), interpolation=cv2.INTER_AREA).transpose(2, 0, 1))
    assert rgb.step(0)[0].shape == (6, 50, 40)


def test_bind_obs_writes_in_place():
    env, twin = AtariEnv("Pong-v5"), AtariEnv("Pong-v5")
    twin.reset(seed=4)
    env.reset(seed=4)
    buf = env.bind_obs(np.zeros((4, 84, 84), np.uint8))
    for a in (2, 3, 2):
        out = env.step(a)[0]
        assert out is buf
        np.testing.assert_array_equal(out, twin.step(a)[0])
    with pytest.raises(ValueError, match="obs buffer"):
        env.bind_obs(np.zeros((4, 84, 83), np.uint8))


def test_frame_skip_max_pools_the_last_two_frames():
    env = AtariEnv("Pong-v5", noop_max=0)
    env.reset(seed=0)
    ale = env.ale
    pooled_differs = 0
    for a in _actions(6, 40):
        state = ale.cloneState()
        obs = env.step(a)[0]
        ale.restoreState(state)
        act = env._action_set[a]
        for _ in range(3):
            ale.act(act)
        third = ale.getScreenGrayscale()
        ale.act(act)
        fourth = ale.getScreenGrayscale()
        expected = cv2.resize(np.maximum(third, fourth), (84, 84), interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(obs[-1], expected)
        pooled_differs += not np.array_equal(expected, cv2.resize(fourth, (84, 84), interpolation=cv2.INTER_AREA))
    assert pooled_differs > 0   # the max-pool mattered (Pong's frames alternate)


def test_time_limit_counts_agent_steps():
    env = AtariEnv("Breakout-v5", max_episode_steps=10, episodic_life=True, noop_max=0)
    env.reset(seed=0)
    for k in range(1, 11):
        _, _, terminated, truncated, info = env.step(0)   # NOOP: no life is lost in 10 steps
        assert info["elapsed_step"] == k and not terminated and truncated == (k == 10)
    assert env.ale.getEpisodeFrameNumber() == 1 + 40   # FIRE at reset, then 4 frames per step
    _, info = env.reset()   # past the limit even episodic_life starts a new game
    assert info["elapsed_step"] == 0 and env.ale.getEpisodeFrameNumber() == 1


@pytest.mark.parametrize(("game", "options", "fire"), [
    ("Breakout", {}, True), ("Pong", {}, True), ("Breakout", {"use_fire_reset": False}, False),
    ("Freeway", {}, False), ("Freeway", {"full_action_space": True}, True),   # EnvPool: FIRE in the action set
])
def test_fire_reset(game, options, fire):
    env = AtariEnv(f"{game}-v5", noop_max=0, **options)
    env.reset(seed=0)
    assert env.ale.getEpisodeFrameNumber() == int(fire)
    env = AtariEnv(f"{game}-v5", noop_max=30, **options)
    env.reset(seed=0)
    frames = set()
    for _ in range(12):   # U{1..30} actions in all, the last one FIRE under fire reset
        env.reset()
        frames.add(env.ale.getEpisodeFrameNumber())
    assert min(frames) >= 1 and max(frames) <= 30 and len(frames) > 3


def test_noops_are_seeded():
    a, b = AtariEnv("Breakout-v5"), AtariEnv("Breakout-v5")
    for seed in (0, 1, 2):
        np.testing.assert_array_equal(a.reset(seed=seed)[0], b.reset(seed=seed)[0])
        assert a.ale.getEpisodeFrameNumber() == b.ale.getEpisodeFrameNumber()
        for act in (1, 2, 3):
            np.testing.assert_array_equal(a.step(act)[0], b.step(act)[0])


def test_episodic_life():
    env = AtariEnv("Breakout-v5", episodic_life=True, noop_max=0)
    obs, info = env.reset(seed=0)
    lives, life_losses, steps = info["lives"], 0, 0
    assert lives == 5
    rng = np.random.default_rng(0)
    while True:
        obs, _, terminated, truncated, info = env.step(int(rng.integers(0, 4)))
        steps += 1
        if not terminated:
            continue
        if info["terminated"]:   # the game is over: the next reset starts a new one
            assert info["lives"] == 0 and life_losses == 4
            obs, info = env.reset()
            assert info["lives"] == 5 and info["elapsed_step"] == 0
            break
        life_losses += 1
        assert info["lives"] == lives - 1
        lives = info["lives"]
        previous = obs
        obs, info = env.reset()   # continues the game: same lives, steps go on, stack not refilled
        assert info["lives"] == lives and info["elapsed_step"] == steps
        np.testing.assert_array_equal(obs[:-1], previous[1:])


def test_reward_clip():
    clipped, plain = AtariEnv("SpaceInvaders-v5", reward_clip=True), AtariEnv("SpaceInvaders-v5")
    clipped.reset(seed=0)
    plain.reset(seed=0)
    big = 0
    for a in _actions(6, 300):
        _, rc, *_, ic = clipped.step(a)
        _, rp, *_, ip = plain.step(a)
        assert rc == np.sign(rp) and ic["reward"] == ip["reward"] == rp
        big += abs(rp) > 1
    assert big > 0


def test_errors_name_the_option():
    with pytest.raises(ValueError, match="unknown Atari game 'NoSuchGame-v5'"):
        AtariEnv("NoSuchGame-v5")
    with pytest.raises(ValueError, match="'stak_num'"):
        shmpool.make("Pong-v5", num_envs=2, stak_num=4)
    with pytest.raises(ValueError, match="frame_skip"):
        shmpool.make("Pong-v5", num_envs=2, frame_skip=0)
    with pytest.raises(ValueError, match="repeat_action_probability"):
        AtariEnv("Pong-v5", repeat_action_probability=1.5)
    with pytest.raises(TypeError):
        AtariEnv("Pong-v5", 4)   # options are keyword-only


# Issue 69: options of the wrong type, as EnvPool 1.2.5's own checks take or refuse them (TypeError), beside it in
# tests/faces/test_envpool_parity.py.  A bool option given "no" was truthy, so it turned the option on.
WRONG_TYPE = [
    ("zero_discount_on_life_loss", "no", "a bool"), ("episodic_life", "yes", "a bool"),
    ("reward_clip", [0], "a bool"), ("use_fire_reset", "no", "a bool"), ("full_action_space", "False", "a bool"),
    ("gray_scale", b"", "a bool"), ("use_inter_area_resize", "no", "a bool"), ("info_ram", "no", "a bool"),
    ("frame_skip", "4", "an integer"), ("frame_skip", 4.0, "an integer"), ("noop_max", 3.5, "an integer"),
    ("stack_num", "4", "an integer"), ("img_height", 84.0, "an integer"), ("max_episode_steps", 100.0, "an integer"),
    ("mode", 1.5, "an integer or None"), ("difficulty", "0", "an integer or None"),
    ("repeat_action_probability", "0.25", "a number"), ("repeat_action_probability", None, "a number"),
]
# Of other types, what EnvPool takes (a bool option takes a number or None, an integer one a bool).
TAKEN = [("zero_discount_on_life_loss", 1, True), ("episodic_life", 0.0, False), ("reward_clip", None, False),
         ("gray_scale", np.bool_(True), True), ("noop_max", True, 1), ("frame_skip", np.int64(3), 3),
         ("repeat_action_probability", 1, 1.0)]


@pytest.mark.parametrize(("name", "value", "kind"), WRONG_TYPE, ids=[f"{n}={v!r}" for n, v, _ in WRONG_TYPE])
def test_an_option_of_the_wrong_type_is_a_type_error_naming_it(name, value, kind):
    said = rf"^Atari option {name} must be {kind}, got {re.escape(repr(value))} \({type(value).__name__}\)$"
    with pytest.raises(TypeError, match=said):
        shmpool.make("Pong-v5", num_envs=2, **{name: value})   # before any worker starts
    with pytest.raises(TypeError, match=said):
        AtariEnv("Pong-v5", **{name: value})


@pytest.mark.parametrize(("name", "value", "taken_as"), TAKEN, ids=[f"{n}={v!r}" for n, v, _ in TAKEN])
def test_an_option_envpool_converts_is_taken_as_it_takes_it(name, value, taken_as):
    env = AtariEnv("Pong-v5", **{name: value})
    try:
        assert getattr(env, name, taken_as) == taken_as
        if name == "episodic_life":
            assert env.episodic_life is False
    finally:
        env.close()


def test_registered_tasks():
    tasks = shmpool.list_tasks()
    assert {"Pong-v5", "Breakout-v5", "SpaceInvaders-v5", "MontezumaRevenge-v5"} <= set(tasks)
    assert len(GAMES) >= 100 and set(GAMES) <= set(tasks)
    # the ids are gymnasium's ALE ids without the namespace
    ale_ids = {s.id.removeprefix("ALE/") for s in gym.registry.values() if s.id.startswith("ALE/")
               and s.id.endswith("-v5")}
    assert ale_ids <= set(GAMES)
