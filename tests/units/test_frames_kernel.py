"""The Atari frame kernel (``shmpool.workers.recipes._frames``): max-pool + INTER_AREA resize +
frame-stack push, bit for bit ``cv2.resize(np.maximum(a, b), ..., interpolation=cv2.INTER_AREA)``.

Checked on random frames, every constant grey level, extreme patterns (0/255 edges, lone
pixels at the borders) and real ALE frames of several games; plus the stack push rules and
the recipe's stale-buffer case (a step that reads no frame)."""
from __future__ import annotations

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")
ale_py = pytest.importorskip("ale_py")

from shmpool.workers.recipes._frames import AreaPush, area_is_generic, area_taps  # noqa: E402
from shmpool.workers.recipes.atari import AtariEnv  # noqa: E402

RAW = (210, 160)
# (src, dst) pairs on OpenCV's generic area path: Atari's 84x84 and a few other ratios
SIZES = [(RAW, (84, 84)), (RAW, (64, 48)), (RAW, (100, 150)), ((97, 131), (31, 40)), (RAW, (210, 84))]


def reference(a: np.ndarray, b: np.ndarray | None, dst_hw: tuple[int, int]) -> np.ndarray:
    src = a if b is None else np.maximum(a, b)
    return cv2.resize(src, (dst_hw[1], dst_hw[0]), interpolation=cv2.INTER_AREA)


def resized(kernel: AreaPush, a: np.ndarray, b: np.ndarray | None, dst_hw: tuple[int, int]) -> np.ndarray:
    out = np.full(dst_hw, 77, np.uint8)
    kernel.resize(a, b, out)
    return out


@pytest.mark.parametrize(("src_hw", "dst_hw"), SIZES)
def test_random_frames_match_opencv(src_hw, dst_hw):
    kernel = AreaPush(src_hw, dst_hw)
    rng = np.random.default_rng(sum(src_hw) * 1000 + sum(dst_hw))
    for i in range(60):
        a = rng.integers(0, 256, src_hw, dtype=np.uint8)
        b = rng.integers(0, 256, src_hw, dtype=np.uint8)
        if i % 3 == 2:   # sparse frames: mostly black with a few bright pixels, as Atari screens
            a = np.where(rng.random(src_hw) < 0.05, a, 0).astype(np.uint8)
            b = np.where(rng.random(src_hw) < 0.05, b, 0).astype(np.uint8)
        np.testing.assert_array_equal(resized(kernel, a, b, dst_hw), reference(a, b, dst_hw))
        np.testing.assert_array_equal(resized(kernel, a, None, dst_hw), reference(a, None, dst_hw))


@pytest.mark.parametrize(("src_hw", "dst_hw"), SIZES[:2])
def test_every_grey_level_and_edge_patterns(src_hw, dst_hw):
    kernel = AreaPush(src_hw, dst_hw)
    for v in range(256):   # constant frames: the weights of each cell must sum to exactly v
        a = np.full(src_hw, v, np.uint8)
        np.testing.assert_array_equal(resized(kernel, a, None, dst_hw), reference(a, None, dst_hw))
    h, w = src_hw
    patterns = [np.indices(src_hw).sum(0) % 2 * 255, np.indices(src_hw)[0] % 2 * 255,
                np.indices(src_hw)[1] % 2 * 255, np.indices(src_hw)[1] * 255 // (w - 1)]
    for y, x in [(0, 0), (0, w - 1), (h - 1, 0), (h - 1, w - 1), (h // 2, w // 2), (1, 1), (h - 2, w - 2)]:
        lone = np.zeros(src_hw, np.uint8)
        lone[y, x] = 255
        patterns += [lone, 255 - lone]
    for p in patterns:
        a = np.ascontiguousarray(p.astype(np.uint8))
        b = np.ascontiguousarray(a[::-1, ::-1])
        np.testing.assert_array_equal(resized(kernel, a, None, dst_hw), reference(a, None, dst_hw))
        np.testing.assert_array_equal(resized(kernel, a, b, dst_hw), reference(a, b, dst_hw))


@pytest.mark.parametrize("game", ["pong", "breakout", "space_invaders", "ms_pacman"])
def test_real_frames_match_opencv(game):
    """Consecutive ALE grey screens under random play, pooled in pairs as the recipe pools them."""
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", 7)
    ale.loadROM(ale_py.roms.get_rom_path(game))
    actions = ale.getMinimalActionSet()
    rng = np.random.default_rng(3)
    kernel = AreaPush(RAW, (84, 84))
    distinct = set()
    for _ in range(150):
        act = actions[rng.integers(len(actions))]
        for _ in range(3):
            ale.act(act)
        older = ale.getScreenGrayscale()
        ale.act(act)
        newer = ale.getScreenGrayscale()
        out = resized(kernel, newer, older, (84, 84))
        np.testing.assert_array_equal(out, reference(newer, older, (84, 84)))
        distinct.add(out.tobytes())
        if ale.game_over():
            ale.reset_game()
    assert len(distinct) > 20   # the frames moved: many different observations were compared


def test_push_shifts_or_fills_the_stack():
    kernel = AreaPush(RAW, (84, 84))
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, RAW, dtype=np.uint8) for _ in range(6)]
    stack = np.zeros((4, 84, 84), np.uint8)
    kernel.push(frames[0], None, stack, True)   # a new game: every slot holds the first frame
    first = reference(frames[0], None, (84, 84))
    for slot in stack:
        np.testing.assert_array_equal(slot, first)
    expected = [first] * 4
    for k in range(1, 6):
        kernel.push(frames[k], frames[k - 1], stack, False)
        expected = expected[1:] + [reference(frames[k], frames[k - 1], (84, 84))]
        np.testing.assert_array_equal(stack, np.stack(expected))
    single = np.zeros((1, 84, 84), np.uint8)
    kernel.push(frames[2], None, single, False)
    np.testing.assert_array_equal(single[0], reference(frames[2], None, (84, 84)))


def test_rejects_wrong_shapes_and_non_generic_ratios():
    kernel = AreaPush(RAW, (84, 84))
    frame = np.zeros(RAW, np.uint8)
    with pytest.raises(ValueError, match="frame must be"):
        kernel.resize(np.zeros((200, 160), np.uint8), None, np.zeros((84, 84), np.uint8))
    with pytest.raises(ValueError, match="frame must be"):
        kernel.resize(frame, np.zeros((210, 150), np.uint8), np.zeros((84, 84), np.uint8))
    with pytest.raises(ValueError, match="output must be"):
        kernel.push(frame, None, np.zeros((4, 84, 83), np.uint8), False)
    # integer ratios (OpenCV's fast area path) and upscales are not the generic path
    assert area_is_generic(RAW, (84, 84)) and area_is_generic((97, 131), (31, 40))
    assert not area_is_generic(RAW, (105, 80)) and not area_is_generic(RAW, (210, 160))
    assert not area_is_generic(RAW, (420, 80)) and not area_is_generic(RAW, (84, 200))
    with pytest.raises(ValueError, match="generic INTER_AREA"):
        AreaPush(RAW, (105, 80))


def test_taps_are_opencv_tables():
    """Each output's weights sum to ~1 and cover the source cells in order (160 -> 84)."""
    first, weights = area_taps(160, 84)
    assert weights.shape == (84, 3) and first.dtype == np.int32 and weights.dtype == np.float32
    np.testing.assert_allclose(weights.sum(1), 1.0, rtol=1e-6)
    assert first[0] == 0 and first[-1] + weights.shape[1] <= 160 and (np.diff(first) >= 1).all()


def test_recipe_step_without_a_frame_read_resizes_the_stale_pooled_buffer():
    """EnvPool max-pools into its buffer [0] in place; a step whose game ends before frame
    ``frame_skip - 1`` reads no screen and pushes that pooled buffer again."""
    env = AtariEnv("Pong-v5", noop_max=0)
    env.reset(seed=0)
    for a in (2, 3, 2):
        env.step(a)
    f0, f1 = (f.copy() for f in env._frames)   # the last step's two reads
    env._push(False, False)   # what step() does when the game ended within the first two frames
    np.testing.assert_array_equal(env._obs[-1], reference(f0, f1, (84, 84)))
    env._push(False, False)   # and again: the buffer stays pooled
    np.testing.assert_array_equal(env._obs[-1], reference(f0, f1, (84, 84)))
