"""Single-core cost of one ``env.step``: shmpool's MuJoCo/Atari recipe vs gymnasium's env.

``python -m bench.recipe_cost --task Ant-v5 [--steps 5000 --repeats 3]`` (``--task all``
for every MuJoCo recipe; ``--task Pong-v5`` or any Atari ``<Game>-v5`` for the Atari recipe).
Every side gets the same float32 actions (Atari: the same action indices).  The machine is a noisy
VM, so the sides are interleaved finely: blocks of ``--block`` steps alternate between
them (recipe, gymnasium, gymnasium unwrapped, bare mj_step, recipe, ...), and the whole
run is repeated ``--repeats`` times; the median µs/step is printed.  Resets at episode
ends are not timed.

Columns: ``recipe``; ``physics`` (the part of the recipe's step spent in ``data.ctrl[:] =
a``, ``mj_step(nstep=frame_skip)`` and, for contact-force tasks, ``mj_rnePostConstraint``:
the floor); ``gymnasium`` (``gym.make``: TimeLimit, OrderEnforcing, PassiveEnvChecker);
``ratio`` = gymnasium / recipe; ``gym unwrapped`` (the bare v5 env under a TimeLimit);
and, with physics stubbed out (``mj_step`` and ``mj_rnePostConstraint`` replaced by
no-ops, so physics cost and its drift drop out), the Python overhead per step of the
recipe and of gymnasium.

Atari (``measure_atari``): ``recipe`` is ``AtariEnv`` with EnvPool's defaults, ``gymnasium``
is ``ALE/<Game>-v5`` (frameskip=1, no sticky actions) + ``AtariPreprocessing`` +
``FrameStackObservation(4)``; ``physics`` is the native floor of one agent step measured
in a bare loop on its own ALE (``frame_skip`` ``ale.act`` calls, two screen reads, the
max-pool and the ``cv2.resize``); the overheads are recipe/gymnasium minus that floor.
``gym unwrapped`` has no Atari counterpart (``None``).

``python -m bench.recipe_cost --pieces`` prints where each microsecond of a Pong-v5 and an
Ant-v5 step goes instead, before and after issue 14 (``atari_pieces``, ``mujoco_pieces``):
the ALE frames, screen reads, max-pool, stack shift and ``cv2.resize`` against the fused
frame kernel; the ctrl write, ``mj_step``, ``mj_rnePostConstraint`` and the recipe's Python
with MuJoCo's island discovery on (gymnasium's model) and off (the recipe's).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from bench.envs import gym_atari

try:
    import mujoco
    from shmpool.workers.recipes.mujoco import TASKS
except ImportError:   # Atari only
    mujoco, TASKS = None, {}

Runner = Callable[[np.ndarray], int]   # steps a block of actions, returns elapsed ns


def _stepper(env: gym.Env, seed: int) -> Runner:
    """Times ``env.step`` over a block of actions; resets (untimed) at episode ends."""
    env.reset(seed=seed)
    step, clock = env.step, time.perf_counter_ns

    def run(actions: np.ndarray) -> int:
        total = 0
        for a in actions:
            t0 = clock()
            _, _, terminated, truncated, _ = step(a)
            total += clock() - t0
            if terminated or truncated:
                env.reset()
        return total
    return run


def _time_physics(env) -> list[int]:
    """Accumulates ``[ns, calls]`` spent in the recipe's ``_simulate`` (ctrl write, ``mj_step``,
    ``mj_rnePostConstraint`` where needed), i.e. the physics share of its own steps."""
    acc, simulate, clock = [0, 0], env._simulate, time.perf_counter_ns

    def timed(action: np.ndarray) -> None:
        t0 = clock()
        simulate(action)
        acc[0] += clock() - t0
        acc[1] += 1
    env._simulate = timed
    return acc


def _interleaved(runners: dict[str, Runner], actions: np.ndarray, block: int, repeats: int) -> dict[str, float]:
    """Median over ``repeats`` of µs/step per runner, blocks of ``block`` steps alternating."""
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for run in runners.values():   # warm-up: caches, lazy imports, the env checker's first call
        run(actions[:block])
    for _ in range(repeats):
        totals = dict.fromkeys(runners, 0)
        for start in range(0, len(actions), block):
            chunk = actions[start:start + block]
            for name, run in runners.items():
                totals[name] += run(chunk)
        for name in runners:
            samples[name].append(totals[name] / 1e3 / len(actions))
    return {name: statistics.median(v) for name, v in samples.items()}


def _is_atari(task: str) -> bool:
    if task in TASKS:
        return False
    try:
        from shmpool.workers.recipes.atari import GAMES
    except ImportError:
        return False
    return task in GAMES


def _native_atari_floor(env, seed: int) -> Runner:
    """Times the native work of one agent step of ``env`` (an ``AtariEnv``) without its Python
    around it: ``frame_skip`` ALE frames, two screen reads, the fused max-pool + resize + push."""
    from shmpool.workers.recipes.atari import AreaPush
    env.reset(seed=seed)
    ale, acts, clock = env.ale, env._action_set, time.perf_counter_ns
    f0, f1 = env._frames
    stack = np.zeros(env.observation_space.shape, np.uint8)
    kernel, skip = AreaPush(f0.shape, stack.shape[1:]), env.frame_skip

    def run(actions: np.ndarray) -> int:
        total = 0
        for a in actions:
            act = acts[a]
            t0 = clock()
            for _ in range(skip - 2):
                ale.act(act)
            ale.act(act)
            ale.getScreenGrayscale(f0)
            ale.act(act)
            ale.getScreenGrayscale(f1)
            kernel.push(f1, f0, stack, False)
            total += clock() - t0
            if ale.game_over():
                env.reset()
        return total
    return run


def measure_atari(task: str, steps: int, repeats: int, block: int) -> dict[str, float | None]:
    """Median µs/step of the Atari recipe, gymnasium's wrapped env and the native floor."""
    from shmpool.workers.recipes.atari import GAMES, AtariEnv

    recipe, reference, floor = AtariEnv(GAMES[task]), gym_atari(task), AtariEnv(GAMES[task])
    actions = np.random.default_rng(0).integers(0, recipe.action_space.n, size=steps)
    result = _interleaved({"recipe": _stepper(recipe, 0), "gymnasium": _stepper(reference, 0),
                           "physics": _native_atari_floor(floor, 0)}, actions, block, repeats)
    return {**result, "gym unwrapped": None, "recipe overhead": result["recipe"] - result["physics"],
            "gym overhead": result["gymnasium"] - result["physics"]}


def measure(task: str, steps: int, repeats: int, block: int) -> dict[str, float | None]:
    """Median µs/step of each side for ``task`` (keys as in the printed columns)."""
    if _is_atari(task):
        return measure_atari(task, steps, repeats, block)
    def sides() -> tuple[gym.Env, gym.Env, gym.Env]:
        reference = gym.make(task)
        unwrapped = gym.wrappers.TimeLimit(gym.make(task).unwrapped, reference.spec.max_episode_steps)
        return TASKS[task](), reference, unwrapped

    recipe, reference, unwrapped = sides()
    space = reference.action_space
    rng = np.random.default_rng(0)
    actions = rng.uniform(space.low, space.high, size=(steps, *space.shape)).astype(np.float32)
    physics = _time_physics(recipe)
    result = _interleaved({"recipe": _stepper(recipe, 0), "gymnasium": _stepper(reference, 0),
                           "gym unwrapped": _stepper(unwrapped, 0)}, actions, block, repeats)
    result["physics"] = physics[0] / 1e3 / physics[1]
    real = mujoco.mj_step, mujoco.mj_rnePostConstraint
    mujoco.mj_step = lambda m, d, nstep=1: None
    mujoco.mj_rnePostConstraint = lambda m, d: None
    try:
        recipe, reference, _ = sides()
        overhead = _interleaved({"recipe overhead": _stepper(recipe, 0), "gym overhead": _stepper(reference, 0)},
                                actions, block, repeats)
    finally:
        mujoco.mj_step, mujoco.mj_rnePostConstraint = real
    return {**result, **overhead}


# --- per-piece costs ---------------------------------------------------------------------------

Pieces = dict[str, tuple[float | None, float | None]]   # piece -> (before µs, after µs) per agent step


def _medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in samples.items()}


def atari_pieces(task: str, steps: int, repeats: int, block: int) -> Pieces:
    """Each native piece of one Pong-style agent step, timed inside a real step sequence (EnvPool's
    defaults: 4 frames, the last two read and max-pooled), before (``np.maximum`` in place,
    the stack shift, ``cv2.resize`` INTER_AREA) and after (the fused ``AreaPush`` kernel) on
    the same frames, plus the whole recipe step; "Python and the rest" is the step minus its
    pieces.  Both paths' outputs are checked equal on every step."""
    import cv2
    from shmpool.workers.recipes.atari import GAMES, AreaPush, AtariEnv
    env, recipe = AtariEnv(GAMES[task]), AtariEnv(GAMES[task])
    env.reset(seed=0)
    ale, acts, skip, clock = env.ale, env._action_set, env.frame_skip, time.perf_counter_ns
    f0, f1 = (np.zeros((210, 160), np.uint8) for _ in range(2))
    shape = env.observation_space.shape
    old_stack, new_stack = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
    kernel, size = AreaPush(f0.shape, shape[1:]), (shape[2], shape[1])
    names = ("ALE frames (act x4)", "screen reads (getScreenGrayscale x2)", "max-pool (np.maximum)",
             "stack shift", "resize (cv2 INTER_AREA)", "fused kernel (pool+resize+push)")
    acc = dict.fromkeys(names, 0)

    def pieces(actions: np.ndarray) -> int:
        for a in actions:
            act = acts[a]
            t0 = clock()
            for _ in range(skip):
                ale.act(act)
            t1 = clock()
            ale.getScreenGrayscale(f1)
            t2 = clock()
            acc[names[0]] += t1 - t0
            acc[names[1]] += 2 * (t2 - t1)   # the other read is the same call on an earlier frame
            t0 = clock()
            kernel.push(f1, f0, new_stack, False)
            t1 = clock()
            np.maximum(f1, f0, out=f0)
            t2 = clock()
            old_stack[:-1] = old_stack[1:]
            t3 = clock()
            cv2.resize(f0, size, dst=old_stack[-1], interpolation=cv2.INTER_AREA)
            t4 = clock()
            for name, dt in zip(names[2:], (t2 - t1, t3 - t2, t4 - t3, t1 - t0)):
                acc[name] += dt
            if not np.array_equal(old_stack, new_stack):
                raise AssertionError("the fused kernel and cv2 disagree")
            f0[...] = f1   # the next step pools with this frame (any frame will do for timing)
            if ale.game_over():
                env.reset()
        return 0

    samples: dict[str, list[float]] = {n: [] for n in (*names, "recipe step")}
    actions = np.random.default_rng(0).integers(0, env.action_space.n, size=steps)
    step = _stepper(recipe, 0)
    pieces(actions[:block])
    step(actions[:block])
    for _ in range(repeats):
        acc.update(dict.fromkeys(names, 0))
        total = 0
        for start in range(0, steps, block):
            pieces(actions[start:start + block])
            total += step(actions[start:start + block])
        for name in names:
            samples[name].append(acc[name] / 1e3 / steps)
        samples["recipe step"].append(total / 1e3 / steps)
    m = _medians(samples)
    ale_us, reads = m[names[0]], m[names[1]]
    before_frame = m[names[2]] + m[names[3]] + m[names[4]]
    after_frame = m[names[5]]
    after_step = m["recipe step"]
    rest = after_step - ale_us - reads - after_frame
    return {names[0]: (ale_us, ale_us), names[1]: (reads, reads),
            names[2]: (m[names[2]], None), names[3]: (m[names[3]], None), names[4]: (m[names[4]], None),
            names[5]: (None, after_frame), "Python and the rest": (rest, rest),
            "recipe step (before = after - kernel + old pieces)": (after_step - after_frame + before_frame,
                                                                   after_step)}


def mujoco_pieces(task: str, steps: int, repeats: int, block: int) -> Pieces:
    """Each piece of one MuJoCo recipe step, timed inside a real trajectory: the ctrl write,
    ``mj_step(nstep=frame_skip)``, ``mj_rnePostConstraint`` and the recipe's Python (the step
    minus those).  "before" steps a twin env with MuJoCo's default island discovery on
    (gymnasium's configuration), "after" the recipe's; both follow the same (bit-identical)
    trajectory, so each piece is timed on the same states."""
    after, before = TASKS[task](), TASKS[task]()
    before.model.opt.disableflags = gym.make(task).unwrapped.model.opt.disableflags
    names = ("ctrl write", f"mj_step x{after.frame_skip}", "mj_rnePostConstraint")
    clock = time.perf_counter_ns
    accs = {"before": dict.fromkeys(names, 0), "after": dict.fromkeys(names, 0)}

    def instrument(env, acc: dict[str, int]) -> None:
        model, data, ctrl, n, rne = env.model, env.data, env._ctrl, env.frame_skip, env.needs_rne

        def simulate(action: np.ndarray) -> None:
            t0 = clock()
            ctrl[:] = action
            t1 = clock()
            mujoco.mj_step(model, data, nstep=n)
            t2 = clock()
            if rne:
                mujoco.mj_rnePostConstraint(model, data)
            t3 = clock()
            acc[names[0]] += t1 - t0
            acc[names[1]] += t2 - t1
            acc[names[2]] += t3 - t2
        env._simulate = simulate

    instrument(before, accs["before"])
    instrument(after, accs["after"])
    space = after.action_space
    actions = np.random.default_rng(0).uniform(space.low, space.high, size=(steps, *space.shape)).astype(np.float32)
    runners = {"before": _stepper(before, 0), "after": _stepper(after, 0)}
    samples: dict[str, list[float]] = {f"{side} {n}": [] for side in runners for n in (*names, "step")}
    for run in runners.values():
        run(actions[:block])
    for _ in range(repeats):
        for acc in accs.values():
            acc.update(dict.fromkeys(names, 0))
        totals = dict.fromkeys(runners, 0)
        for start in range(0, steps, block):
            for side, run in runners.items():
                totals[side] += run(actions[start:start + block])
        for side in runners:
            for n in names:
                samples[f"{side} {n}"].append(accs[side][n] / 1e3 / steps)
            samples[f"{side} step"].append(totals[side] / 1e3 / steps)
    m = _medians(samples)
    out: Pieces = {n: (m[f"before {n}"], m[f"after {n}"]) for n in names}
    rest = {side: m[f"{side} step"] - sum(m[f"{side} {n}"] for n in names) for side in runners}
    out["Python (obs, reward, infos)"] = (rest["before"], rest["after"])
    out["recipe step"] = (m["before step"], m["after step"])
    return out


def print_pieces(task: str, pieces: Pieces) -> None:
    def us(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}"
    print(f"\n{task}: µs per agent step, before -> after")
    print(f"{'piece':52s} {'before':>8s} {'after':>8s}")
    for name, (b, a) in pieces.items():
        print(f"{name:52s} {us(b):>8s} {us(a):>8s}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="Ant-v5",
                        help=f"one of {sorted(TASKS)}, an Atari <Game>-v5 (e.g. Pong-v5) or 'all' (MuJoCo)")
    parser.add_argument("--steps", type=int, default=5000, help="timed steps per repetition")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions (median reported)")
    parser.add_argument("--block", type=int, default=50, help="steps per side before switching sides")
    parser.add_argument("--pieces", action="store_true",
                        help="instead: each piece of a Pong-v5 and an Ant-v5 step (or of --task), before/after")
    args = parser.parse_args(argv)
    if args.pieces:
        chosen = ["Pong-v5", "Ant-v5"] if "--task" not in (argv if argv is not None else sys.argv) else [args.task]
        print("median of", args.repeats, "interleaved runs of", args.steps, "steps")
        for task in chosen:
            measure_pieces = atari_pieces if _is_atari(task) else mujoco_pieces
            print_pieces(task, measure_pieces(task, args.steps, args.repeats, args.block))
        return 0
    tasks = list(TASKS) if args.task == "all" else [args.task]
    print("µs/step, median of", args.repeats, "interleaved runs of", args.steps, "steps")
    print(f"{'task':26s} {'recipe':>8s} {'physics':>8s} {'gymnasium':>9s} {'ratio':>6s} {'gym unwr.':>9s}"
          f" | python overhead: {'recipe':>6s} {'gym':>6s}")
    for task in tasks:
        r = measure(task, args.steps, args.repeats, args.block)
        unwrapped = "—" if r["gym unwrapped"] is None else f"{r['gym unwrapped']:.1f}"
        print(f"{task:26s} {r['recipe']:8.1f} {r['physics']:8.1f} {r['gymnasium']:9.1f}"
              f" {r['gymnasium'] / r['recipe']:5.2f}x {unwrapped:>9s} | {'':16s}"
              f" {r['recipe overhead']:6.1f} {r['gym overhead']:6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
