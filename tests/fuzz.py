"""Differential fuzzer: shmpool's faces against gymnasium's ``SyncVectorEnv`` (and SB3's ``DummyVecEnv``).

One generated env class, ``FuzzEnv``, driven by a ``Plan``: random observation spaces within what
the pool accepts (Box float32/float64/uint8/int64 of small shapes, Discrete, MultiDiscrete,
MultiBinary, Dict/Tuple nesting of those), a Discrete or Box action space, info dicts whose keys
change type between steps (float, int, bool, numpy scalars, None, str, arrays, nested dicts,
lists, huge ints, missing), and failures planned at (env, state) points: ValueError in the
constructor, reset, step, close or a call; ``obs=None``; an info that is not a dict.  Everything an
env returns is a pure function of its seed, its step count and the actions it got, so two copies
given the same seeds and actions agree exactly.

A case is a plan plus a few face configurations; each face runs the same stream of operations
(steps, seeded and partial resets, ``call``/``get_attr``/``set_attr`` with per-env payloads,
unpicklable payloads and results) against its own oracle and compares every result exactly:

==============  ===========================================================================
face            oracle
==============  ===========================================================================
vector          ``shmpool.VectorEnv(fns, ...)`` vs ``SyncVectorEnv`` (NEXT_STEP, SAME_STEP, DISABLED)
pool            ``shmpool.Pool(fns, ...)`` vs ``SyncVectorEnv``
envpool         ``EnvPoolEnv`` (what ``shmpool.make`` returns) vs ``SyncVectorEnv``, EnvPool's
                info layout (masks stripped, float32 rewards, ``elapsed_step``, ``env_id``)
sb3             ``shmpool.sb3.ShmVecEnv`` vs SB3's ``DummyVecEnv``
pool_async      ``Pool.send``/``recv`` with ``batch_size < num_envs`` vs one env per row
envpool_async   ``EnvPoolEnv.send``/``recv`` the same way
==============  ===========================================================================

each with ``parent_shard`` True/False and ``num_workers`` 1/2.

Run it (from the repository root)::

    python -m tests.fuzz --minutes 30          # the long run; a summary of findings at the end
    python tests/fuzz.py --minutes 30          # the same
    python -m tests.fuzz --seed 123 -v         # one case again, every op printed

``tests/project/test_fuzz.py`` is the bounded run in the suite: ``SHMPOOL_FUZZ_CASES`` cases (default 16) from
``SHMPOOL_FUZZ_SEED`` (random unless set, printed), case ``i`` being ``--seed SHMPOOL_FUZZ_SEED + i``.

Tolerated (docs/porting/*.md, shmpool/sb3.py, or no data at stake):

- the error types: ``EnvError`` (``EnvError[ValueError]`` from the VectorEnv; the env's own exception
  chained from ``ShmVecEnv``) where the oracle raises the env's ``ValueError``; ``remote_type`` and
  the env's message must match;
- payloads and results that cannot be pickled raise in shmpool (they cross a process boundary, as
  with ``AsyncVectorEnv``); later calls must still be right;
- after a failed step/reset/call shmpool has run the other envs too (the oracle stops at the first
  failing env), so both sides are reset with a new seed (and their attributes set again);
- when the oracle raises an env's exception and shmpool raises gymnasium's batching error for
  another env's info (or the other way round): shmpool reads every env before it batches;
- the order of info keys;
- ``ShmVecEnv``'s infos cross a gymnasium batch (a key's dtype is set by the first env reporting it
  in the step; ``np.float64``/``np.int64``/``np.bool_`` come back as python scalars), and its
  ``TimeLimit.truncated`` is a bool where DummyVecEnv passes an env's int flags through;
- where the oracle itself raises in gymnasium's batching (``_add_info``, ``concatenate``: a key that
  is a float in env 0 and a string in env 1, a big int, ...) the comparison is skipped, and shmpool
  may raise too (it must not hang, die or close); where gymnasium's batching silently garbles a key
  (a scalar stored inside an earlier env's dict under the env's index) that key is not compared;
- an info that is ``None`` is taken as ``{}`` by shmpool (gymnasium raises); other non-dict infos
  must be refused by both; ``obs=None`` refused by ``ShmVecEnv`` where DummyVecEnv writes NaN into its
  float buffer (SyncVectorEnv refuses it too); ``strict=True`` only on plans whose observations and
  rewards it accepts.

Async (``*_async``) runs depend on completion order, so a seed replays the same plan and actions
but not always the same batches.  Findings are grouped into families: the known bugs K1-K4 and
the ones this fuzzer found (N1-N5, see ``NEW_FAMILIES``); anything else is listed as UNCLASSIFIED.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import hashlib
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

if __package__ in (None, ""):   # python tests/fuzz.py: the repository root on the path, last
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import shmpool  # noqa: E402
from shmpool.envpool_env import EnvPoolEnv  # noqa: E402
from shmpool.errors import EnvError, PoolClosedError, ShmpoolError, WorkerDiedError  # noqa: E402

INJECTED = "fuzz-injected"
MODES = {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP,
         "disabled": AutoresetMode.DISABLED}


# ============================================================================================
# deterministic helpers
# ============================================================================================

def mix(*parts: Any) -> int:
    """A 64-bit hash of ints/strings, the same in every process."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def frac(*parts: Any) -> float:
    return mix(*parts) / 2.0 ** 64


# ============================================================================================
# the chooser: one plan generator, driven by a seed (the CLI and tests/project/test_fuzz.py alike)
# ============================================================================================

class SeedChooser:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def int(self, lo: int, hi: int) -> int:          # inclusive
        return int(self.rng.integers(lo, hi + 1))

    def pick(self, options: list | tuple) -> Any:
        return options[self.int(0, len(options) - 1)]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)


# ============================================================================================
# plans
# ============================================================================================

INFO_KINDS = ("float", "int", "bool", "f32", "i32", "u8", "f64", "i64", "bool_", "none", "str_num", "str",
              "arr", "arr2", "dict", "dict_num", "list", "bigint", "nan", "missing")
NUMERIC_KINDS = ("float", "int", "bool", "f32", "i32", "u8", "f64", "i64", "bool_", "nan")
STYLES = ("stable", "step", "episode", "chaos")
FAULTS = ("ctor", "reset", "step", "close", "obs_none", "info_nondict")


@dataclasses.dataclass(frozen=True)
class Plan:
    seed: int                       # the op stream and every env value derive from it
    num_envs: int
    obs: tuple                      # space spec, see build_space
    act: tuple
    max_len: tuple                  # per env: truncation length
    p_term: int                     # per mille, per step
    info_keys: tuple                # ((name, style, kinds), ...)
    many_keys: int                  # extra numeric keys m0..: more than the 64 shared-memory columns
    faults: tuple                   # ((where, env, per mille), ...)
    loose: bool                     # obs not always exactly the space's dtype, odd reward types, NaN
    flag_forms: bool                # terminated/truncated as np.bool_ / int
    ops: int                        # how many operations per face

    def fault(self, where: str, idx: int) -> int:
        for w, i, p in self.faults:
            if w == where and i == idx:
                return p
        return 0

    @property
    def clean(self) -> bool:
        """What ``strict=True`` accepts: observations exactly of the space, finite rewards."""
        return not self.loose and not any(w == "obs_none" for w, _, _ in self.faults)


@dataclasses.dataclass(frozen=True)
class FaceCfg:
    face: str                       # vector, pool, envpool, sb3, pool_async, envpool_async
    mode: str                       # next_step, same_step, disabled
    parent_shard: bool
    num_workers: int
    copy: bool = True
    strict: bool = False
    batch_size: int | None = None
    max_lead: Any = "auto"


@dataclasses.dataclass(frozen=True)
class Case:
    plan: Plan
    faces: tuple


def draw_space(ch, depth: int = 0, flat: bool = False) -> tuple:
    kinds = ["box", "discrete", "mdisc", "mbin"] + ([] if depth >= 2 or (flat and depth >= 1) else ["dict", "tuple"])
    kind = ch.pick(kinds)
    if kind == "box":
        dtype = ch.pick(["float32", "float64", "uint8", "int64"])
        shape = ch.pick([(), (1,), (3,), (2, 2), (2, 3, 1)])
        if dtype.startswith("float"):
            low, high = ch.pick([(-1.0, 1.0), (-math.inf, math.inf), (0.0, 10.0)])
        elif dtype == "uint8":
            low, high = 0, 255
        else:
            low, high = ch.pick([(-5, 5), (-10 ** 12, 10 ** 12)])
        return ("box", dtype, shape, low, high)
    if kind == "discrete":
        return ("discrete", ch.int(1, 7), ch.pick([0, 0, -2, 3]))
    if kind == "mdisc":
        return ("mdisc", tuple(ch.int(1, 5) for _ in range(ch.int(1, 3))))
    if kind == "mbin":
        return ("mbin", ch.int(1, 4))
    n = ch.int(1, 3)
    subs = tuple(draw_space(ch, depth + 1, flat) for _ in range(n))
    if kind == "dict":
        return ("dict", tuple((f"o{i}", s) for i, s in enumerate(subs)))
    return ("tuple", subs)


def is_flat(spec: tuple) -> bool:
    if spec[0] in ("dict", "tuple"):
        subs = [s for _, s in spec[1]] if spec[0] == "dict" else spec[1]
        return all(s[0] not in ("dict", "tuple") for s in subs)
    return True


def build_space(spec: tuple) -> gym.Space:
    kind = spec[0]
    if kind == "box":
        _, dtype, shape, low, high = spec
        return spaces.Box(low, high, shape, np.dtype(dtype))
    if kind == "discrete":
        return spaces.Discrete(spec[1], start=spec[2])
    if kind == "mdisc":
        return spaces.MultiDiscrete(list(spec[1]))
    if kind == "mbin":
        return spaces.MultiBinary(spec[1])
    if kind == "dict":
        return spaces.Dict({k: build_space(s) for k, s in spec[1]})
    if kind == "tuple":
        return spaces.Tuple(tuple(build_space(s) for s in spec[1]))
    if kind == "act_discrete":
        return spaces.Discrete(spec[1])
    if kind == "act_box":
        return spaces.Box(-1.0, 1.0, spec[1], np.dtype(spec[2]))
    raise ValueError(spec)


def draw_plan(ch, seed: int) -> Plan:
    n = ch.int(1, 5)
    obs = draw_space(ch)
    act = ch.pick([("act_discrete", ch.int(1, 4)),
                   ("act_box", ch.pick([(1,), (2,), ()]), ch.pick(["float32", "float64"]))])
    max_len = tuple(ch.int(1, 9) for _ in range(n))
    p_term = ch.pick([0, 50, 200, 500])
    names = ["k0", "k1", "k2", "k3", "k4"]
    if ch.chance(0.1):
        names.append("a_rather_long_info_key_name_that_does_not_fit_one_column_x")
    if ch.chance(0.1):
        names.append("ключ")
    if ch.chance(0.05):
        names.append("_under")
    info_keys = []
    for name in names[:ch.int(0, len(names))]:
        style = ch.pick(STYLES)
        if ch.chance(0.4):
            kinds = tuple(ch.pick(NUMERIC_KINDS + ("missing",)) for _ in range(ch.int(1, 3)))
        else:
            kinds = tuple(ch.pick(INFO_KINDS) for _ in range(ch.int(1, 4)))
        info_keys.append((name, style, kinds))
    many = ch.pick([0, 0, 0, 70]) if ch.chance(0.15) else 0
    faults = []
    if ch.chance(0.05):
        faults.append(("ctor", ch.int(0, n - 1), 1000))
    for where, p in (("reset", 0.15), ("step", 0.35), ("close", 0.1), ("obs_none", 0.06), ("info_nondict", 0.06)):
        if ch.chance(p):
            faults.append((where, ch.int(0, n - 1), 1000 if where == "close" else ch.pick([30, 100, 300])))
    return Plan(seed=seed, num_envs=n, obs=obs, act=act, max_len=max_len, p_term=p_term,
                info_keys=tuple(info_keys), many_keys=many, faults=tuple(faults), loose=ch.chance(0.3),
                flag_forms=ch.chance(0.15), ops=ch.int(8, 40))


def draw_face(ch, plan: Plan) -> FaceCfg:
    n = plan.num_envs
    face = ch.pick(["vector", "vector", "pool", "envpool", "sb3", "pool_async", "envpool_async"])
    if face == "sb3" and not is_flat(plan.obs):
        face = "vector"     # DummyVecEnv refuses nested Dict/Tuple observation spaces
    if face.endswith("_async") and n < 2:
        face = face[:-6]
    mode = {"sb3": "same_step"}.get(face) or ch.pick(["next_step", "same_step"] + (
        [] if face.endswith("_async") else ["disabled"]))
    nw = ch.int(1, min(2, n))
    ps = ch.chance(0.5)
    batch = ch.int(1, n - 1) if face.endswith("_async") else None
    max_lead = ch.pick(["auto", None, 1, 2]) if face.endswith("_async") else "auto"
    strict = plan.clean and face in ("vector", "pool", "sb3") and ch.chance(0.5)
    return FaceCfg(face=face, mode=mode, parent_shard=ps, num_workers=nw, copy=ch.chance(0.7), strict=strict,
                   batch_size=batch, max_lead=max_lead)


def draw_case(ch, seed: int | None = None) -> Case:
    if seed is None:
        seed = ch.int(0, 2 ** 31 - 1)
    plan = draw_plan(ch, seed)
    faces = tuple(draw_face(ch, plan) for _ in range(ch.int(1, 3)))
    return Case(plan, faces)


def case_from_seed(seed: int) -> Case:
    return draw_case(SeedChooser(seed), seed)


# ============================================================================================
# the env
# ============================================================================================

class FuzzEnv(gym.Env):
    """Everything it returns is a function of (plan, idx, the seeds it was reset with, its steps,
    the actions it got)."""

    metadata = {"render_modes": []}

    def __init__(self, plan: Plan, idx: int) -> None:
        self.plan, self.idx = plan, idx
        self.last_fault = None
        if plan.fault("ctor", idx):
            raise ValueError(f"{INJECTED}: ctor of env {idx}")
        self.observation_space = build_space(plan.obs)
        self.action_space = build_space(plan.act)
        self.key = mix(plan.seed, idx, "init")
        self.t = 0
        self.episode = 0
        self.tag = None
        self.closed_count = 0

    # --- faults ---------------------------------------------------------------------------
    def _hit(self, where: str) -> bool:
        p = self.plan.fault(where, self.idx)
        return bool(p) and frac(where, self.key, self.t) < p / 1000

    # --- gymnasium API --------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.last_fault = None
        if seed is not None:           # a seeded reset determines everything that follows
            self.key = mix("seed", seed, self.idx)
            self.episode = 0
        else:
            self.key = mix("auto", self.key, self.episode)
        self.episode += 1
        self.t = 0
        if self._hit("reset"):
            self.last_fault = "reset"
            raise ValueError(f"{INJECTED}: reset of env {self.idx}")
        info = self._info("reset", 0)
        info["opts"] = repr(options)
        return self._obs(0), info

    def step(self, action):
        self.last_fault = None
        self.t += 1
        a = action_code(action)
        if self._hit("step"):
            self.last_fault = "step"
            raise ValueError(f"{INJECTED}: step of env {self.idx} at t={self.t}")
        obs = self._obs(a)
        reward = self._reward(a)
        terminated = frac("term", self.key, self.t) < self.plan.p_term / 1000
        truncated = self.t >= self.plan.max_len[self.idx]
        if self.plan.flag_forms:
            form = mix("flags", self.key, self.t) % 3
            if form == 1:
                terminated, truncated = np.bool_(terminated), np.bool_(truncated)
            elif form == 2:
                terminated, truncated = int(terminated), int(truncated)
        info = self._info("step", a)
        if self._hit("obs_none"):
            self.last_fault = "obs_none"
            obs = None
        if self._hit("info_nondict"):
            info = [None, [1, 2], "info", (3,)][mix("nd", self.key, self.t) % 4]
            # None is taken as {} by shmpool (tolerated: no data is lost); the others gymnasium and
            # shmpool must both refuse
            self.last_fault = "info_none" if info is None else "info_nondict"
        return obs, reward, terminated, truncated, info

    def close(self):
        self.closed_count += 1
        if self.plan.fault("close", self.idx) and self.closed_count == 1:
            raise ValueError(f"{INJECTED}: close of env {self.idx}")

    # --- what calls reach -----------------------------------------------------------------
    def echo(self, payload=None):
        if (isinstance(payload, str) and payload == "raise") or (isinstance(self.tag, str) and self.tag == "raise"):
            raise ValueError(f"{INJECTED}: echo of env {self.idx}")
        return {"idx": self.idx, "t": self.t, "episode": self.episode, "key": self.key % 1000003,
                "payload": payload, "tag": self.tag}

    def make_lock(self):
        return threading.Lock()

    # --- values ---------------------------------------------------------------------------
    def _rng(self, *parts) -> np.random.Generator:
        return np.random.default_rng([mix(self.key, self.t, *parts)])

    def _obs(self, a: int):
        return sample_obs(self.plan.obs, self._rng("obs", a), self.plan.loose)

    def _reward(self, a: int):
        r = self._rng("rew", a)
        x = float(np.round(r.normal() * 3, 3))
        if not self.plan.loose:
            return x
        form = int(r.integers(0, 10))
        return [x, np.float32(x), int(x), np.float64(x), np.int64(int(x)), x,
                float("nan"), -0.0, float("inf"), 1e300][form]

    def _info(self, phase: str, a: int) -> dict:
        info: dict = {}
        r = self._rng("info", phase, a)
        for name, style, kinds in self.plan.info_keys:
            if style == "stable":
                kind = kinds[0]
            elif style == "step":
                kind = kinds[mix(name, self.t, phase) % len(kinds)]
            elif style == "episode":
                kind = kinds[mix(name, self.key) % len(kinds)]
            else:
                kind = kinds[mix(name, self.key, self.t, phase) % len(kinds)]
            if kind != "missing":
                info[name] = info_value(kind, r)
        for j in range(self.plan.many_keys):
            info[f"m{j}"] = int(r.integers(0, 100)) if j % 2 else float(r.normal())
        return info


def action_code(action) -> int:
    """The action, hashed with its type, dtype and shape: a difference in what reaches the env
    changes everything it returns afterwards."""
    arr = np.asarray(action)
    return mix(type(action).__name__, arr.dtype.str, arr.shape, arr.tobytes()) % (2 ** 62)


def sample_obs(spec: tuple, r: np.random.Generator, loose: bool):
    kind = spec[0]
    if kind == "box":
        _, dtype, shape, low, high = spec
        if dtype.startswith("float"):
            if math.isinf(low):
                x = np.round(r.normal(size=shape) * 10, 4)
                if loose and r.random() < 0.2:
                    x = np.array(x, dtype=np.float64)
                    x.flat[0] = [np.nan, np.inf, -np.inf, -0.0][int(r.integers(0, 4))]
            else:
                x = np.round(r.uniform(low, high, size=shape), 4)
            out = np.asarray(x, dtype=dtype)
            if loose and dtype == "float32" and r.random() < 0.3:
                return np.asarray(x, dtype=np.float64)     # cast on the way in, as gymnasium does
        else:
            out = r.integers(low, high, size=shape, endpoint=True, dtype=np.int64).astype(dtype)
        if loose and r.random() < 0.1:
            return out.tolist()
        return out
    if kind == "discrete":
        v = spec[2] + int(r.integers(0, spec[1]))
        return v if loose and r.random() < 0.3 else np.int64(v)
    if kind == "mdisc":
        return r.integers(0, np.array(spec[1])).astype(np.int64)
    if kind == "mbin":
        return r.integers(0, 2, size=spec[1]).astype(np.int8)
    if kind == "dict":
        return {k: sample_obs(s, r, loose) for k, s in spec[1]}
    return tuple(sample_obs(s, r, loose) for s in spec[1])


def info_value(kind: str, r: np.random.Generator):
    x = float(np.round(r.normal() * 5, 3))
    i = int(r.integers(-1000, 1000))
    return {
        "float": lambda: x, "int": lambda: i, "bool": lambda: bool(i % 2), "f32": lambda: np.float32(x),
        "i32": lambda: np.int32(i), "u8": lambda: np.uint8(abs(i) % 256), "f64": lambda: np.float64(x),
        "i64": lambda: np.int64(i), "bool_": lambda: np.bool_(i % 2), "none": lambda: None,
        "str_num": lambda: "3.5", "str": lambda: "abc", "arr": lambda: np.arange(3, dtype=np.float32) * x,
        "arr2": lambda: np.full((2, 2), i, dtype=np.int64), "dict": lambda: {"a": x, "b": "s" if i % 2 else i},
        "dict_num": lambda: {"a": x, "b": i}, "list": lambda: [i, x], "bigint": lambda: 2 ** 70 + i,
        "nan": lambda: float("nan"),
    }[kind]()


def env_fns(plan: Plan) -> list:
    return [functools.partial(FuzzEnv, plan, i) for i in range(plan.num_envs)]


# ============================================================================================
# the op stream (the same for every face of a case)
# ============================================================================================

def random_payload(r: np.random.Generator, depth: int = 0):
    k = int(r.integers(0, 11 if depth < 2 else 7))
    if depth == 0 and r.random() < 0.02:
        k = 11
    if k == 0:
        return int(r.integers(-10 ** 6, 10 ** 6))
    if k == 1:
        return float(r.normal())
    if k == 2:
        return "payload-" + str(int(r.integers(0, 99)))
    if k == 3:
        return None
    if k == 4:
        return bool(r.integers(0, 2))
    if k == 5:
        return np.arange(int(r.integers(0, 5)), dtype=["float32", "int64", "uint8"][int(r.integers(0, 3))])
    if k == 6:
        return b"\x00bytes"
    if k == 7:
        return [random_payload(r, depth + 1) for _ in range(int(r.integers(0, 3)))]
    if k == 8:
        return tuple(random_payload(r, depth + 1) for _ in range(int(r.integers(0, 3))))
    if k == 9:
        return {f"p{j}": random_payload(r, depth + 1) for j in range(int(r.integers(0, 3)))}
    if k == 10:
        return 2 ** 80
    return np.zeros(int(r.integers(10 ** 4, 3 * 10 ** 5)), dtype=np.uint8)    # a large one


def sample_actions(plan: Plan, r: np.random.Generator, n: int) -> np.ndarray:
    act = plan.act
    if act[0] == "act_discrete":
        return r.integers(0, act[1], size=n).astype(np.int64)
    return np.round(r.uniform(-1, 1, size=(n, *act[1])), 3).astype(act[2])


def op_stream(plan: Plan):
    """An endless stream of operations; the driver takes ``plan.ops`` of them (and more
    resets when it must)."""
    r = np.random.default_rng([plan.seed, 7])
    n = plan.num_envs
    weights = {"step": 60, "reset": 5, "reset_mask": 4, "echo": 6, "set_tag": 5, "get": 4,
               "lock_arg": 1, "lock_ret": 1}
    names, p = list(weights), np.array(list(weights.values()), float)
    p /= p.sum()
    while True:
        op = names[int(r.choice(len(names), p=p))]
        if op == "step":
            yield ("step", sample_actions(plan, r, n), r)
        elif op == "reset":
            yield ("reset", int(r.integers(0, 10 ** 6)))
        elif op == "reset_mask":
            mask = r.random(n) < 0.5
            mask[int(r.integers(0, n))] = True
            yield ("reset_mask", mask, None if r.random() < 0.5 else int(r.integers(0, 10 ** 6)))
        elif op == "echo":
            yield ("echo", "raise" if r.random() < 0.05 else random_payload(r))
        elif op == "set_tag":
            if r.random() < 0.6:
                vals = [("raise" if r.random() < 0.1 else random_payload(r)) for _ in range(n)]
            else:
                vals = random_payload(r)
                if isinstance(vals, (list, tuple)):
                    vals = {"shared": vals}
            yield ("set_tag", vals)
        elif op == "get":
            yield ("get", ["tag", "t", "episode", "idx"][int(r.integers(0, 4))])
        else:
            yield (op,)


# ============================================================================================
# comparing
# ============================================================================================

def same(a, b, path: str, out: list, limit: int = 8) -> None:
    """Exact equality (types, dtypes, NaN == NaN, the sign of zero) of nested results; each
    difference appended to ``out`` as text."""
    if len(out) >= limit:
        return
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            out.append(f"{path}: expected {_short(a)} got {_short(b)}")
            return
        if set(a) != set(b):
            out.append(f"{path}: keys expected {sorted(map(str, a))} got {sorted(map(str, b))}")
        for k in a:
            if k in b:
                same(a[k], b[k], f"{path}[{k!r}]", out, limit)
        return
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if type(a) is not type(b):
            out.append(f"{path}: expected {_short(a)} got {_short(b)}")
            return
        if a.dtype != b.dtype or a.shape != b.shape:
            out.append(f"{path}: expected {a.dtype}{a.shape} {_short(a)} got {b.dtype}{b.shape} {_short(b)}")
            return
        if a.dtype == object:
            for idx in np.ndindex(a.shape):
                same(a[idx], b[idx], f"{path}[{idx[0] if len(idx) == 1 else idx}]", out, limit)
            return
        if not _arrays_equal(a, b):
            out.append(f"{path}: expected {_short(a)} got {_short(b)}")
        return
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            out.append(f"{path}: expected {_short(a)} got {_short(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]", out, limit)
        return
    if type(a) is not type(b):
        out.append(f"{path}: expected {type(a).__name__} {_short(a)} got {type(b).__name__} {_short(b)}")
        return
    if isinstance(a, (float, np.floating, np.number, np.bool_)):
        if not _arrays_equal(np.asarray(a), np.asarray(b)):
            out.append(f"{path}: expected {a!r} got {b!r}")
        return
    if isinstance(a, (int, str, bytes, bool, type(None))):
        if a != b:
            out.append(f"{path}: expected {_short(a)} got {_short(b)}")
        return
    # other objects (locks...): the type is all there is to compare


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "fc":
        if not np.array_equal(a, b, equal_nan=True):
            return False
        real = ~np.isnan(a)
        return bool(np.array_equal(np.signbit(a[real]), np.signbit(b[real])))
    return bool(np.array_equal(a, b))


def _short(x, n: int = 160) -> str:
    s = repr(x)
    return s if len(s) <= n else s[:n] + "..."


# ============================================================================================
# watchdog: a hang becomes an exception in the main thread
# ============================================================================================

class FuzzHang(KeyboardInterrupt):
    """Raised in the main thread when an operation overran its time (a KeyboardInterrupt, so the
    pool kills its workers on the way out, and nothing catches it as an env error)."""


class Watchdog:
    SIG = signal.SIGUSR2

    def __init__(self) -> None:
        self.armed = False
        self.what = ""
        self._timer: threading.Timer | None = None
        self._main = threading.main_thread().ident
        self._usable = threading.current_thread() is threading.main_thread()
        self._old = None

    def __enter__(self) -> Watchdog:
        if self._usable:
            self._old = signal.signal(self.SIG, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        self.disarm()
        if self._usable:
            signal.signal(self.SIG, self._old or signal.SIG_DFL)

    def _handler(self, signum, frame) -> None:
        if self.armed:
            self.armed = False
            raise FuzzHang(f"{self.what} did not return within its time")

    def arm(self, seconds: float, what: str) -> None:
        self.disarm()
        if not self._usable:
            return
        self.what = what
        self.armed = True
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        if self.armed:
            signal.pthread_kill(self._main, self.SIG)

    def disarm(self) -> None:
        self.armed = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# ============================================================================================
# outcomes
# ============================================================================================

@dataclasses.dataclass
class Outcome:
    value: Any = None
    exc: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.exc is None


def attempt(fn: Callable, *args, **kwargs) -> Outcome:
    try:
        return Outcome(fn(*args, **kwargs))
    except FuzzHang:
        raise
    except Exception as exc:   # noqa: BLE001 - every exception is an outcome to judge
        return Outcome(exc=exc)


def is_injected(exc: BaseException | None) -> bool:
    return exc is not None and INJECTED in str(exc)


def in_gymnasium_batching(exc: BaseException) -> bool:
    """The oracle raised inside gymnasium's batching (``_add_info``, ``concatenate``) or its
    autoreset bookkeeping, not in env code."""
    frames = traceback.extract_tb(exc.__traceback__)
    names = {f.name for f in frames}
    files = " ".join(f.filename for f in frames)
    if names & {"_add_info", "concatenate", "_concatenate_base", "_concatenate_dict", "_concatenate_tuple",
                "_save_obs", "_obs_from_buf"}:
        return True
    return isinstance(exc, AssertionError) and "sync_vector_env" in files


BATCHING_ERRORS = (OverflowError, TypeError, ValueError, AttributeError)


def raised_in_info_reading(exc: BaseException) -> bool:
    """shmpool's parent raised while reading a batch's infos from shared memory (before the
    batch's side messages were read)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return any(f.name == "read" and f.filename.endswith(os.path.join("shmpool", "infos.py")) for f in frames)


def from_batching(exc: BaseException) -> bool:
    """shmpool raised from its gymnasium-style info batching (shmpool/infos.py) or gymnasium's."""
    if not isinstance(exc, BATCHING_ERRORS) or isinstance(exc, ShmpoolError):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    return any(f.filename.endswith(os.path.join("shmpool", "infos.py")) for f in frames) or in_gymnasium_batching(exc)


def face_error_ok(exc: BaseException, expected: BaseException) -> str | None:
    """None when shmpool's error stands for the oracle's injected env exception; else what is wrong.

    Also accepted: an error of gymnasium's batching (shmpool collects every env's result before
    it batches them; the oracle stops at the first env that raises, so it may not have reached
    the env whose info cannot be batched) and a payload that cannot be pickled."""
    if from_batching(exc):
        return None
    if "pickle" in str(exc).lower():
        return None
    if isinstance(exc, EnvError):
        if exc.remote_type != type(expected).__name__:
            return f"EnvError.remote_type={exc.remote_type!r}, the env raised {type(expected).__name__}"
        if INJECTED not in str(exc):
            return f"EnvError without the env's message: {str(exc)[:200]}"
        return None
    if type(exc) is type(expected) and str(exc) == str(expected):
        return None                 # ShmVecEnv re-raises the env's own exception
    return (f"raised {type(exc).__name__}: {str(exc)[:300]} where the oracle raised "
            f"{type(expected).__name__}: {expected}")


# ============================================================================================
# findings
# ============================================================================================

@dataclasses.dataclass
class Finding:
    category: str                   # what kind of discrepancy
    face: FaceCfg
    seed: int
    op_index: int
    op: str
    detail: str
    context: str = ""               # faults seen at this op, earlier tolerated errors
    known: str = ""                 # which known bug it looks like

    def signature(self) -> tuple:
        return (self.known or self.category, self.face.face, self.face.mode, self.category)

    def describe(self) -> str:
        f = self.face
        where = (f"{f.face} mode={f.mode} parent_shard={f.parent_shard} num_workers={f.num_workers} copy={f.copy} "
                 f"strict={f.strict}" + (f" batch_size={f.batch_size} max_lead={f.max_lead}" if f.batch_size else ""))
        known = f" [{self.known}]" if self.known else ""
        return (f"{self.category}{known}: seed={self.seed} op#{self.op_index} {self.op} on {where}\n"
                f"    {self.detail}" + (f"\n    context: {self.context}" if self.context else ""))


KNOWN = {
    "K1": "known (1): info key whose column dtype wins over gymnasium's batching (None/'3.5' coerced, "
          "'abc'/list/dict/array kill or fail the worker; also numeric types mixed across envs)",
    "K2": "known (2): side replies one call behind (after an unpicklable payload, or a failed call)",
    "K3": "known (3): parent_shard + exception while writing a result (non-dict info)",
    "K4": "known (4): obs=None not caught",
}


NEW_FAMILIES = {
    "N1": "NEW: numpy scalar infos lose their type (np.bool_ batched as a bool array where gymnasium makes an "
          "object array; np.int64/np.float64/np.bool_ inside object arrays come back as python scalars)",
    "N2": "NEW: call/set_attr payload of a few hundred KB hangs (parent blocks writing the pipe)",
    "N4": "NEW: reset() with envs still in flight (after send) raises the info-batching error of the dropped "
          "in-flight results (Pool._drain_in_flight catches only EnvError)",
    "N5": "NEW: a non-dict info on an episode's last step under SAME_STEP, final obs in shared memory: gymnasium "
          "keeps it (final_info an object array of the values), shmpool 7c36d1b returns {0: value}",
    "N3": "NEW: an error while reading a batch's shared-memory infos (InfoReader.read) leaves its side messages "
          "unread: every later call gets the previous call's non-numeric infos",
}


def payload_bytes(x) -> int:
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, dict):
        return sum(payload_bytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(payload_bytes(v) for v in x)
    return 0


# what gymnasium's batching (or numpy under it) says when a value does not fit a batch's dtype
BATCH_MESSAGES = r"(could not convert|invalid literal|cannot convert float NaN|setting an array element with a " \
                 r"sequence|Python int too large|argument must be a string or a real number|int\(\) argument|" \
                 r"out of bounds for|only 0-dimensional arrays|only length-1 arrays)"


def classify(f: Finding) -> str:
    ctx, det = f.context, " ".join(f.detail.split())
    if f.category == "hang" and "big-payload" in ctx:
        return "N2"
    if f.category == "hang" and f.face.parent_shard:
        return "K3"      # likely: the hosted shard wedged after an exception while writing a result
    if "'NoneType' object has no attribute 'copy'" in det or "observation is None" in det:
        return "K4"      # obs=None on an episode's last step under SAME_STEP
    if "info must be a dict" in det or re.search(r"infos\['final_info'\]: expected array\(\[(list|tuple|None|')", det):
        return "N5"
    if "after-info-read-error" in ctx or (f.category == "face raised" and "only integers, slices" in det):
        return "N3"
    if f.face.face.endswith("_async") and f.op == "reset" and f.category in ("face raised", "wrong error") and (
            re.search(BATCH_MESSAGES, det) or "has no attribute" in det):
        return "N4"
    if f.category == "mismatch" and (
            re.search(r"expected (bool|int64|float64) np\.\w+\(?[-\w.]*\)? got (bool|int|float) ", det)
            or re.search(r"expected object\(\d+,?\) array\(\[np\.(True|False)_", det)
            or re.search(r"expected object\(\d+,?\) array\(\[[^]]*np\.(True|False)_[^]]*\], "
                         r"dtype=object\) got bool", det)):
        return "N1"
    if "obs_none" in ctx and f.category in ("face returned where oracle raised", "mismatch", "hang",
                                            "face closed", "worker died"):
        return "K4"
    if "info_nondict" in ctx and (f.face.parent_shard or f.category in ("hang", "worker died")):
        return "K3"
    if "after-unpicklable" in ctx and f.op in ("echo", "get", "set_tag", "lock_arg", "lock_ret"):
        return "K2"
    if "side channel out of order" in det:
        return "K2"      # the variant: replies of an earlier failed call read by a later one
    if "a step_async() is pending" in det and f.face.parent_shard:
        return "K3"      # the pool wedged after a result could not be written
    if "np.bool_-info" in ctx and f.category in ("mismatch", "face raised"):
        return "N1"      # likely: an np.bool_ got a bool column, and the rest of the batch was cast into it
    if re.search(r"Python integer -?\d+ out of bounds for", det):
        return "N1"      # a numpy integer replayed as a python int: numpy raises where it would have cast
    if f.category == "mismatch" and (
            re.search(r"expected object\(\d+,?\) array\(\[(None|'3\.5'|'abc'|\[|\{)", det)
            or re.search(r"expected (str '3\.5'|NoneType None) got", det)):
        return "K1"
    if f.category == "mismatch" and re.search(r"expected (u?int|float|bool)\w* \S+ got (u?int|float|bool)\d* np\.",
                                              det):
        return "K1"      # the variant, seen through ShmVecEnv's per-env dicts
    if f.category in ("face raised", "worker died", "wrong error") and re.search(BATCH_MESSAGES, det):
        return "K1"      # a value that gymnasium batches fine meets the column's dtype
    if f.category == "mismatch" and re.search(r"infos(\[[^]]*\])+: expected (float|int|uint|bool)\w*\(\d+,?\) .* got "
                                              r"(float|int|uint|bool)\w*\(\d+,?\)", det):
        return "K1"      # the variant: numeric types mixed across envs, the column's dtype wins
    if f.category in ("worker died", "face closed", "hang") and re.search(r"info|abc|could not convert", det):
        return "K1"
    return ""


# ============================================================================================
# faces: the system under test and its oracle behind one interface
# ============================================================================================

def pool_kwargs(cfg: FaceCfg) -> dict:
    return dict(parent_shard=cfg.parent_shard, num_workers=cfg.num_workers)


class SyncRun:
    """One face against ``SyncVectorEnv`` (or DummyVecEnv for sb3) under one plan."""

    OP_TIME = 6.0                   # an op takes milliseconds; this is a hang

    def __init__(self, plan: Plan, cfg: FaceCfg, dog: Watchdog, verbose: bool = False) -> None:
        self.plan, self.cfg, self.dog, self.verbose = plan, cfg, dog, verbose
        self.n = plan.num_envs
        self.findings: list[Finding] = []
        self.oracle = None
        self.face = None
        self.op_index = -1
        self.op_name = "ctor"
        self.context: set[str] = set()
        self.elapsed = np.zeros(self.n, np.int64)       # EnvPool's elapsed_step
        self.ended = np.zeros(self.n, bool)            # NEXT_STEP/DISABLED: which envs ended last step
        self.sb3_resets: list | None = None            # ShmVecEnv's reset_infos as expected
        self.raw_infos: list = []                       # the oracle envs' infos of the current op

    # --- bookkeeping ------------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.verbose:
            print(f"  [{self.cfg.face}/{self.cfg.mode} ps={self.cfg.parent_shard} nw={self.cfg.num_workers}] "
                  f"#{self.op_index} {msg}", flush=True)

    def judge_error(self, f, o, what: str = "") -> None:
        """The face failed where the oracle raised an injected error: is it the same error?"""
        problem = face_error_ok(f.exc, o.exc)
        if problem:
            self.find("wrong error", f"{what}{problem}")

    def find(self, category: str, detail: str) -> None:
        if any(has_numpy_bool(i) for i in self.raw_infos):
            self.context.add("np.bool_-info")
        if len(detail) > 1200:                 # a remote traceback: its end says the most
            detail = detail[:400] + " [...] " + detail[-800:]
        f = Finding(category, self.cfg, self.plan.seed, self.op_index, self.op_name, detail,
                    ", ".join(sorted(self.context)))
        f.known = classify(f)
        self.findings.append(f)
        self.log(f"FINDING {f.category}: {detail[:300]}")

    def oracle_faults(self) -> set:
        envs = getattr(self.oracle, "envs", None) or []
        return {f"{e.unwrapped.last_fault}" for e in envs if getattr(e.unwrapped, "last_fault", None)}

    # --- building ---------------------------------------------------------------------
    def build_oracle(self):
        fns = [functools.partial(_recording, fn, self.raw_infos) for fn in env_fns(self.plan)]
        if self.cfg.face == "sb3":
            from stable_baselines3.common.vec_env import DummyVecEnv
            return DummyVecEnv(fns)
        return SyncVectorEnv(fns, autoreset_mode=MODES[self.cfg.mode])

    def build_face(self):
        cfg, fns = self.cfg, env_fns(self.plan)
        mode = MODES[cfg.mode]
        if cfg.face == "vector":
            return shmpool.VectorEnv(fns, autoreset_mode=mode, copy=cfg.copy, strict=cfg.strict, **pool_kwargs(cfg))
        if cfg.face == "pool":
            return shmpool.Pool(fns, autoreset_mode=mode, copy=cfg.copy, strict=cfg.strict, **pool_kwargs(cfg))
        if cfg.face == "envpool":
            return EnvPoolEnv(fns, env_type="gymnasium", autoreset_mode=mode, **pool_kwargs(cfg))
        if cfg.face == "sb3":
            from shmpool.sb3 import ShmVecEnv
            return ShmVecEnv(fns, strict=cfg.strict, **pool_kwargs(cfg))
        raise ValueError(cfg.face)

    # --- one operation on both sides --------------------------------------------------
    def clear_faults(self) -> None:
        for e in getattr(self.oracle, "envs", None) or []:
            e.unwrapped.last_fault = None
        self.raw_infos.clear()

    def both(self, what: str, on_oracle: Callable, on_face: Callable) -> tuple[Outcome, Outcome]:
        self.clear_faults()
        o = attempt(on_oracle)
        self.dog.arm(self.OP_TIME, f"{self.cfg.face}.{what}")
        try:
            f = attempt(on_face)
        finally:
            self.dog.disarm()
        return o, f

    def run(self) -> list[Finding]:
        try:
            self._run()
        except FuzzHang as exc:
            self.context |= self.oracle_faults()
            self.find("hang", str(exc))
        finally:
            self._close_quietly()
        return self.findings

    def _close_quietly(self) -> None:
        if self.face is not None:
            self.dog.arm(30, "closing after the run")
            try:
                self.face.close()
            except FuzzHang:
                pass
            except Exception:
                pass
            finally:
                self.dog.disarm()
            self.face = None
        if self.oracle is not None:
            try:
                self.oracle.close()
            except Exception:
                pass
            self.oracle.closed = True
            self.oracle = None

    def _run(self) -> None:
        o, f = self.both("ctor", self.build_oracle, self.build_face)
        if not o.ok:
            if f.ok:
                self.face = f.value
                if is_injected(o.exc):
                    self.find("face built where the oracle raised", f"oracle: {o.exc!r}")
                return
            if is_injected(o.exc):
                self.judge_error(f, o, "ctor: ")
            return                      # the oracle refuses the plan (e.g. nested spaces): nothing to compare
        self.oracle = o.value
        if not f.ok:
            self.find("face raised", f"ctor: {type(f.exc).__name__}: {f.exc}")
            return
        self.face = f.value
        ops = op_stream(self.plan)
        need_reset = True
        taken = 0
        resets_in_a_row = 0
        while taken < self.plan.ops:
            self.op_index += 1
            if need_reset:
                op = ("reset", 10 ** 6 + self.op_index * 7919 + self.plan.seed % 1000)
                resets_in_a_row += 1
                if resets_in_a_row > 6:
                    return          # the plan fails every reset it is given
            else:
                op = next(ops)
                taken += 1
                if op[0] == "reset_mask" and self.cfg.face == "sb3":
                    op = ("reset", op[2] or 1)
            self.op_name = op[0]
            self.context = {c for c in self.context if c.startswith("after-")}
            result = self.do(op)
            if result == "stop":
                return
            need_reset = result == "reset"
            if not need_reset:
                resets_in_a_row = 0
            if self.cfg.mode == "disabled" and not need_reset and self.ended.any():
                self.op_index += 1
                self.op_name = "reset_mask(ended)"
                result = self.do(("reset_mask", self.ended.copy(), None))
                if result == "stop":
                    return
                need_reset = result == "reset"
        self.op_index += 1
        self.op_name = "close"
        self.do_close()

    # --- judging ------------------------------------------------------------------------
    def judge(self, o: Outcome, f: Outcome, compare: Callable[[Any, Any], list], resync_attrs: bool = False) -> str:
        """'ok', 'reset' (both must be reset before going on) or 'stop'."""
        self.context |= self.oracle_faults()
        if f.exc is not None and (isinstance(f.exc, (WorkerDiedError, PoolClosedError))
                                  or getattr(self.face, "closed", False) is True):
            if not o.ok and not is_injected(o.exc):
                self.context.add("oracle: " + type(o.exc).__name__)
            self.find("worker died" if isinstance(f.exc, WorkerDiedError) else "face closed",
                      f"{type(f.exc).__name__}: {f.exc}")
            return "stop"
        if not o.ok and f.exc is not None and raised_in_info_reading(f.exc):
            self.context.add("after-info-read-error")
        if o.ok and f.ok:
            diffs = compare(o.value, f.value)
            if diffs and self.cfg.face != "sb3" and self.unreliable(o.value):
                # gymnasium garbled some keys (a scalar stored inside a dict): compare the others
                bad = garbled_keys(o.value[-1])
                self.log(f"garbled by gymnasium, not compared: {sorted(map(str, bad))}")
                diffs = compare(without(o.value, bad), without(f.value, bad))
            if diffs:
                self.find("mismatch", "; ".join(diffs))
                return "reset"
            return "ok"
        if not o.ok and is_injected(o.exc):
            if f.ok:
                self.find("face returned where oracle raised", f"oracle raised {o.exc!r}")
            else:
                self.judge_error(f, o)
            self.resync_attrs()
            return "reset"
        if not o.ok:
            # gymnasium refused what an env returned (obs=None, an info that is not a dict): the
            # face must refuse it too.  A conflict between the envs' info types inside one batch
            # (gymnasium's _add_info): skipped.
            refused = self.context & {"obs_none", "info_nondict"} or not in_gymnasium_batching(o.exc)
            if "info_none" in self.context and not self.context & {"obs_none", "info_nondict"}:
                refused = False         # shmpool takes an info of None as {} (tolerated)
            if not self.cfg.strict and "Cannot cast" in str(o.exc):
                # strict=False casts observations as AsyncVectorEnv's shared-memory write does (unsafe
                # casts included, Pool's docstring); SyncVectorEnv's concatenate refuses them
                refused = False
            self.context.add(f"oracle raised {type(o.exc).__name__}")
            if refused and f.ok:
                self.find("face returned where oracle raised",
                          f"oracle raised {type(o.exc).__name__}: {str(o.exc)[:300]}")
            self.resync_attrs()
            return "reset"
        if f.exc is not None and raised_in_info_reading(f.exc):
            self.context.add("after-info-read-error")
        # the oracle returned, the face raised
        if not isinstance(f.exc, ShmpoolError) and self.unreliable(o.value):
            self.context.add(f"gymnasium's batching fails too ({type(f.exc).__name__})")
            self.resync_attrs()
            return "reset"
        if self.cfg.face == "sb3" and "obs_none" in self.context and "observation is None" in str(f.exc):
            # DummyVecEnv writes None into its float buffer (NaN) where gymnasium and shmpool refuse it
            self.resync_attrs()
            return "reset"
        if self.tolerated(f.exc):
            self.context.add("after-unpicklable")
            self.log(f"tolerated: {type(f.exc).__name__}: {str(f.exc)[:160]}")
            if resync_attrs:
                self.resync_attrs()
            return "ok"
        self.find("face raised", f"{type(f.exc).__name__}: {f.exc}")
        self.resync_attrs()
        return "reset"

    def unreliable(self, value) -> bool:
        """Whether the oracle's infos for this op come out of gymnasium's batching garbled (a key
        that is a dict in one env and a scalar in a later one: gymnasium stores the scalar under
        the env's index inside the dict) or, for DummyVecEnv, whether gymnasium's batching (which
        ShmVecEnv's infos cross) raises on them."""
        if self.cfg.face == "sb3":
            if isinstance(value, tuple) and len(value) == 4:
                return sb3_expected_step_infos(value[3], value[2], self.oracle.reset_infos)[0] is None
            if isinstance(value, tuple) and len(value) == 2:
                return sb3_expected_infos(value[1]) is None
            return False
        if isinstance(value, tuple) and len(value) in (2, 5) and isinstance(value[-1], dict):
            return garbled(value[-1])
        return False

    def tolerated(self, exc: BaseException) -> bool:
        """Payloads and results that cannot be pickled (they cross a process boundary)."""
        text = f"{type(exc).__name__}: {exc}"
        remote = getattr(exc, "remote_type", "") or ""
        cause = exc.__cause__
        return ("pickle" in text.lower() or "PicklingError" in remote
                or (cause is not None and "pickle" in str(cause).lower())) and self.op_name in (
                    "lock_arg", "lock_ret")

    def resync_attrs(self) -> None:
        """After an error the two sides may hold different tags (the oracle stops at the first
        failing env): set the same one everywhere."""
        value = f"resync-{self.op_index}"
        self.dog.arm(self.OP_TIME, "resync set_attr")
        try:
            if self.cfg.face == "sb3":
                self.oracle.set_attr("tag", value)
                attempt(self.face.set_attr, "tag", value)
            else:
                self.oracle.set_attr("tag", value)
                attempt(self.face.set_attr, "tag", value)
        finally:
            self.dog.disarm()

    # --- operations ---------------------------------------------------------------------
    def do(self, op: tuple) -> str:
        kind = op[0]
        self.log(f"{kind} {_short(op[1:], 100)}")
        self.context.discard("big-payload")
        if kind in ("echo", "set_tag") and payload_bytes(op[1]) > 100_000:
            self.context.add("big-payload")
        sb3 = self.cfg.face == "sb3"
        if kind == "reset":
            seed = op[1]
            if sb3:
                def on_o():
                    self.oracle.seed(seed)
                    obs = self.oracle.reset()
                    return obs, [dict(i) for i in self.oracle.reset_infos]

                def on_f():
                    self.face.seed(seed)
                    obs = self.face.reset()
                    return obs, [dict(i) for i in self.face.reset_infos]
            else:
                def on_o():
                    return self.oracle.reset(seed=seed)

                def on_f():
                    return self.face.reset(seed=seed)
            o, f = self.both("reset", on_o, on_f)
            result = self.judge(o, f, self.compare_reset)
            if result == "ok":
                self.elapsed[:] = 0
                self.ended[:] = False
            return result
        if kind == "reset_mask":
            mask, seed = op[1], op[2]
            ids = np.flatnonzero(mask)
            if self.cfg.face == "envpool":
                o, f = self.both("reset(env_id)",
                                 lambda: self.oracle.reset(seed=seed, options={"reset_mask": mask.copy()}),
                                 lambda: self.face.reset(ids, seed=seed))
                result = self.judge(o, f, lambda a, b: self.compare_reset(a, b, ids))
            else:
                o, f = self.both("reset(mask)",
                                 lambda: self.oracle.reset(seed=seed, options={"reset_mask": mask.copy()}),
                                 lambda: self.face.reset(seed=seed, options={"reset_mask": mask.copy()}))
                result = self.judge(o, f, self.compare_reset)
            if result == "ok":
                self.elapsed[ids] = 0
                self.ended[ids] = False
            return result
        if kind == "step":
            actions = op[1]
            o, f = self.both("step", lambda: self.oracle.step(actions.copy()), lambda: self.face.step(actions.copy()))
            result = self.judge(o, f, self.compare_step)
            return result
        if kind == "echo":
            payload = op[1]
            if sb3:
                idx = list(range(self.n))[::-1]
                o, f = self.both("env_method", lambda: self.oracle.env_method("echo", payload, indices=idx),
                                 lambda: self.face.env_method("echo", payload, indices=idx))
            else:
                o, f = self.both("call", lambda: self.oracle.call("echo", payload),
                                 lambda: self.face.call("echo", payload))
            return self.judge(o, f, self.compare_plain)
        if kind == "set_tag":
            vals = op[1]
            if sb3:
                vals = vals if not isinstance(vals, list) else {"per-env": vals}
                idx = list(range(0, self.n, 2))
                o, f = self.both("set_attr", lambda: self.oracle.set_attr("tag", vals, indices=idx),
                                 lambda: self.face.set_attr("tag", vals, indices=idx))
            else:
                o, f = self.both("set_attr", lambda: self.oracle.set_attr("tag", vals),
                                 lambda: self.face.set_attr("tag", vals))
            return self.judge(o, f, self.compare_plain, resync_attrs=True)
        if kind == "get":
            name = op[1]
            if sb3:
                o, f = self.both("get_attr", lambda: self.oracle.get_attr(name), lambda: self.face.get_attr(name))
            elif self.cfg.face == "pool":
                o, f = self.both("get_attr", lambda: self.oracle.get_attr(name),
                                 lambda: self.face.get_attr(name))
            else:
                o, f = self.both("get_attr", lambda: self.oracle.get_attr(name), lambda: self.face.get_attr(name))
            return self.judge(o, f, self.compare_plain)
        if kind == "lock_arg":
            lock = threading.Lock()
            if sb3:
                o, f = self.both("env_method(lock)", lambda: self.oracle.env_method("echo", lock),
                                 lambda: self.face.env_method("echo", lock))
            else:
                o, f = self.both("call(lock)", lambda: self.oracle.call("echo", lock),
                                 lambda: self.face.call("echo", lock))
            return self.judge(o, f, self.compare_plain)
        if kind == "lock_ret":
            if sb3:
                o, f = self.both("env_method(make_lock)", lambda: self.oracle.env_method("make_lock"),
                                 lambda: self.face.env_method("make_lock"))
            else:
                o, f = self.both("call(make_lock)", lambda: self.oracle.call("make_lock"),
                                 lambda: self.face.call("make_lock"))
            return self.judge(o, f, self.compare_plain)
        raise ValueError(kind)

    def do_close(self) -> None:
        self.log("close")
        o, f = self.both("close", self.oracle.close, self.face.close)
        self.oracle.closed = True
        self.context |= self.oracle_faults()
        if not o.ok and is_injected(o.exc):
            if f.ok:
                self.find("face returned where oracle raised", f"close: oracle raised {o.exc!r}")
            else:
                self.judge_error(f, o, "close: ")
        elif not f.ok:
            self.find("face raised", f"close: {type(f.exc).__name__}: {str(f.exc)[:400]}")
        self.face = None
        self.oracle = None

    # --- comparisons --------------------------------------------------------------------
    def compare_plain(self, a, b) -> list:
        out: list = []
        same(_listify(a), _listify(b), "result", out)
        return out

    def compare_reset(self, a, b, ids: np.ndarray | None = None) -> list:
        out: list = []
        if self.cfg.face == "sb3":
            (obs_a, infos_a), (obs_b, infos_b) = a, b
            same(obs_a, obs_b, "obs", out)
            self.sb3_resets = sb3_expected_infos(infos_a)
            if self.sb3_resets is not None:
                same(self.sb3_resets, infos_b, "reset_infos", out)
            return out
        (obs_a, info_a), (obs_b, info_b) = a, b
        if ids is not None:                 # envpool's reset(env_id): those rows, in that order
            obs_a, info_a = rows(obs_a, ids), rows(info_a, ids)
        same(obs_a, obs_b, "obs", out)
        if self.cfg.face == "envpool":
            n = self.n if ids is None else len(ids)
            env_ids = np.arange(self.n, dtype=np.int32) if ids is None else ids.astype(np.int32)
            same(envpool_infos(info_a, np.zeros(n, np.int32), env_ids), info_b, "infos", out)
        else:
            same(info_a, info_b, "infos", out)
        return out

    def compare_step(self, a, b) -> list:
        out: list = []
        if self.cfg.face == "sb3":
            return self.compare_sb3_step(a, b)
        obs_a, rew_a, term_a, trunc_a, info_a = a
        obs_b, rew_b, term_b, trunc_b, info_b = b
        same(obs_a, obs_b, "obs", out)
        same(term_a, np.asarray(term_b), "terminated", out)
        same(trunc_a, np.asarray(trunc_b), "truncated", out)
        ended = term_a | trunc_a
        if self.cfg.face == "envpool":
            same(rew_a.astype(np.float32), rew_b, "rewards", out)
            mode = self.cfg.mode
            if mode == "next_step":
                self.elapsed = np.where(self.ended, 0, self.elapsed + 1)
            elif mode == "same_step":
                self.elapsed = np.where(ended, 0, self.elapsed + 1)
            else:
                self.elapsed = self.elapsed + 1
            same(envpool_infos(info_a, self.elapsed.astype(np.int32), np.arange(self.n, dtype=np.int32)),
                 info_b, "infos", out)
        else:
            same(rew_a, np.asarray(rew_b), "rewards", out)
            same(info_a, info_b, "infos", out)
        self.ended = ended.copy()
        return out

    def compare_sb3_step(self, a, b) -> list:
        out: list = []
        obs_a, rew_a, done_a, infos_a = a
        obs_b, rew_b, done_b, infos_b = b
        same(obs_a, obs_b, "obs", out)
        same(rew_a, rew_b, "rewards", out)
        same(done_a, done_b, "dones", out)
        expected_infos, expected_resets = sb3_expected_step_infos(infos_a, done_a, self.oracle.reset_infos)
        if expected_infos is None:
            self.sb3_resets = None       # gymnasium's batching refuses this step's infos: skipped
            return out
        same(expected_infos, infos_b, "infos", out)
        if self.sb3_resets is not None:
            for i, r in enumerate(expected_resets):
                if r is not None:
                    self.sb3_resets[i] = r
            same(self.sb3_resets, [dict(i) for i in self.face.reset_infos], "reset_infos", out)
        return out


def garbled_keys(infos: dict) -> set:
    """Top-level keys (and ``final_info``) whose batch gymnasium garbled."""
    return {k for k, v in infos.items() if isinstance(v, dict) and garbled(v)}


def without(value: tuple, keys: set) -> tuple:
    """A reset/step result with those info keys (and their masks) left out."""
    infos = {k: v for k, v in value[-1].items() if k not in keys and not (isinstance(k, str) and k[1:] in keys
                                                                           and k.startswith("_"))}
    return (*value[:-1], infos)


def garbled(infos: dict) -> bool:
    """Non-string keys in batched infos: gymnasium's _add_info put a later env's scalar into an
    earlier env's dict (the env never uses such keys)."""
    return any(not isinstance(k, str) or (isinstance(v, dict) and garbled(v)) for k, v in infos.items())


def _recording(fn: Callable, sink: list) -> gym.Env:
    """The oracle's env, its infos recorded (to name what a finding involved)."""
    env = fn()
    step, reset = env.step, env.reset

    def recorded_step(action):
        out = step(action)
        sink.append(out[-1])
        return out

    def recorded_reset(**kwargs):
        out = reset(**kwargs)
        sink.append(out[-1])
        return out

    env.step, env.reset = recorded_step, recorded_reset
    return env


def has_numpy_bool(info) -> bool:
    if isinstance(info, dict):
        return any(has_numpy_bool(v) for v in info.values())
    return isinstance(info, np.bool_)


def _listify(x):
    return list(x) if isinstance(x, tuple) else x


def rows(batch, ids: np.ndarray):
    if isinstance(batch, dict):
        return {k: rows(v, ids) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(rows(v, ids) for v in batch)
    return batch[ids]


def strip_masks(infos: dict) -> dict:
    return {k: strip_masks(v) if isinstance(v, dict) else v
            for k, v in infos.items() if not (isinstance(k, str) and k.startswith("_") and k[1:] in infos)}


def envpool_infos(infos: dict, elapsed: np.ndarray, env_ids: np.ndarray) -> dict:
    out = strip_masks(infos)
    # An env's own elapsed_step where it reported one, the count in every other row.
    out["elapsed_step"] = (np.where(infos["_elapsed_step"], infos["elapsed_step"], elapsed)
                           if "elapsed_step" in infos else elapsed)
    out["env_id"] = env_ids
    out["players"] = {"env_id": env_ids.copy()}
    return out


# --- SB3: what ShmVecEnv documents its infos to be ------------------------------------------

class _Batcher:
    """gymnasium's ``VectorEnv._add_info`` over ``n`` rows."""

    _add_info = gym.vector.VectorEnv._add_info      # it recurses through self._add_info

    def __init__(self, n: int) -> None:
        self.num_envs = n

    def add(self, infos: dict, info: dict, i: int) -> dict:
        return self._add_info(infos, info, i)


_PYTHON_DTYPES = (np.dtype(bool), np.dtype(np.int64), np.dtype(np.float64))


def _element(batch: np.ndarray, i: int):
    item = batch[i]
    if batch.dtype == object:
        return item
    if batch.ndim > 1:
        return item.copy()
    if batch.dtype in _PYTHON_DTYPES:
        return item.item()
    return item


def _unbatch(infos: dict, i: int) -> dict:
    out = {}
    for key, value in infos.items():
        if isinstance(key, str) and key.startswith("_") and key[1:] in infos:
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        out[key] = _unbatch(value, i) if isinstance(value, dict) else _element(value, i)
    return out


def _raw(info: dict) -> dict:
    return {k: v for k, v in info.items() if k not in ("TimeLimit.truncated", "terminal_observation")}


def sb3_expected_infos(reset_infos: list) -> list | None:
    n = len(reset_infos)
    b = _Batcher(n)
    try:
        batch: dict = {}
        for i, info in enumerate(reset_infos):
            batch = b.add(batch, info, i)
        if garbled(batch):              # gymnasium garbled a key: what ShmVecEnv should say is undefined
            return None
        return [_unbatch(batch, i) for i in range(n)]
    except Exception:
        return None


def sb3_expected_step_infos(infos: list, dones: np.ndarray, reset_infos: list) -> tuple:
    """DummyVecEnv's raw per-env infos as they come out of ShmVecEnv: one gymnasium SAME_STEP
    batch (top level: an ended env's reset info, else its step info; ``final_info``: the ended
    envs' step infos), unbatched per env (shmpool/sb3.py's documented rule)."""
    n = len(infos)
    b = _Batcher(n)
    try:
        top: dict = {}
        final: dict = {}
        for i in range(n):
            if dones[i]:
                final = b.add(final, _raw(infos[i]), i)
                top = b.add(top, reset_infos[i], i)
            else:
                top = b.add(top, _raw(infos[i]), i)
        if garbled(top) or garbled(final):
            return None, None
    except Exception:
        return None, None
    out, resets = [], []
    for i in range(n):
        if dones[i]:
            info = _unbatch(final, i)
            # DummyVecEnv passes `truncated and not terminated` through: an int when the env's flags
            # are ints; ShmVecEnv's is a bool (tolerated)
            info["TimeLimit.truncated"] = bool(infos[i]["TimeLimit.truncated"])
            info["terminal_observation"] = infos[i]["terminal_observation"]
            out.append(info)
            resets.append(_unbatch(top, i))
        else:
            info = _unbatch(top, i)
            info["TimeLimit.truncated"] = False
            out.append(info)
            resets.append(None)
    return out, resets


# ============================================================================================
# async: send/recv against one oracle env per row
# ============================================================================================

class RowOracle:
    """One env with a vector env's autoreset, stepped eagerly when an action is sent."""

    def __init__(self, env: FuzzEnv, mode: str) -> None:
        self.env, self.mode = env, mode
        self.needs_reset = False
        self.elapsed = 0

    def reset(self, seed):
        self.needs_reset = False
        self.elapsed = 0
        obs, info = self.env.reset(seed=seed)
        return obs, 0.0, False, False, [info]

    def step(self, action):
        """(obs, reward, terminated, truncated, [info pieces for _add_info]) or raises."""
        if self.mode == "next_step" and self.needs_reset:
            self.needs_reset = False
            self.elapsed = 0
            obs, info = self.env.reset()
            return obs, 0.0, False, False, [info]
        obs, rew, term, trunc, info = self.env.step(action)
        self.elapsed += 1
        pieces = []
        if self.mode == "same_step" and (term or trunc):
            pieces.append({"final_obs": obs, "final_info": info})
            obs, info = self.env.reset()
            self.elapsed = 0
        else:
            self.needs_reset = bool(term or trunc)
        pieces.append(info)
        return obs, rew, term, trunc, pieces


class AsyncRun(SyncRun):
    """``send``/``recv`` with ``batch_size < num_envs`` (Pool or EnvPoolEnv) against one
    RowOracle per env; each received row is compared with what its env's oracle gave for the
    same action, the batch's infos with gymnasium's batching of those rows in that order."""

    def build_oracle(self):
        return [RowOracle(fn(), self.cfg.mode) for fn in env_fns(self.plan)]

    def build_face(self):
        cfg, fns = self.cfg, env_fns(self.plan)
        mode = MODES[cfg.mode]
        if cfg.face == "pool_async":
            return shmpool.Pool(fns, autoreset_mode=mode, batch_size=cfg.batch_size, max_lead=cfg.max_lead,
                                strict=False, **pool_kwargs(cfg))
        return EnvPoolEnv(fns, env_type="gymnasium", autoreset_mode=mode, batch_size=cfg.batch_size,
                          max_lead=cfg.max_lead, **pool_kwargs(cfg))

    def oracle_faults(self) -> set:
        return {f"{o.env.last_fault}" for o in (self.oracle or []) if o.env.last_fault}

    def _close_quietly(self) -> None:
        oracle, self.oracle = self.oracle, None
        super()._close_quietly()
        for o in oracle or []:
            try:
                o.env.close()
            except Exception:
                pass

    def resync_attrs(self) -> None:
        pass

    def _run(self) -> None:
        o, f = self.both("ctor", self.build_oracle, self.build_face)
        if not o.ok:
            if f.ok:
                self.face = f.value
                self.find("face built where the oracle raised", f"oracle: {o.exc!r}")
            elif is_injected(o.exc):
                self.judge_error(f, o, "ctor: ")
            return
        self.oracle = o.value
        if not f.ok:
            self.find("face raised", f"ctor: {type(f.exc).__name__}: {f.exc}")
            return
        self.face = f.value
        r = np.random.default_rng([self.plan.seed, 11])
        recvs = 0
        resets = 0
        need_reset = True
        expected: dict[int, collections.deque] = {}
        held: list[int] = []
        while recvs < self.plan.ops:
            self.op_index += 1
            if need_reset:
                resets += 1
                if resets > 8:
                    return
                seed = int(r.integers(0, 10 ** 6))
                self.op_name = "reset"
                self.log(f"reset seed={seed}")
                o = attempt(self.oracle_reset, seed)
                self.dog.arm(self.OP_TIME, "reset")
                try:
                    f = attempt(self.face.reset, seed=seed)
                finally:
                    self.dog.disarm()
                result = self.judge(o, f, self.compare_async_reset)
                if result == "stop":
                    return
                if result == "reset":
                    continue
                need_reset = False
                expected = {i: collections.deque() for i in range(self.n)}
                held = list(range(self.n))
            # send what the caller holds (sometimes keep a few back)
            if held:
                # keep some back, as long as batch_size envs stay in flight
                room = self.n - self.cfg.batch_size
                keep = [] if r.random() < 0.7 or room <= 0 else held[: int(r.integers(0, min(room, len(held)) + 1))]
                send = [i for i in held if i not in keep]
                if not send:
                    send, keep = held, []
                actions = sample_actions(self.plan, r, len(send))
                for i, a in zip(send, actions):
                    expected[i].append(attempt(self.oracle[i].step, a.copy() if isinstance(a, np.ndarray) else a))
                self.op_name = "send"
                self.dog.arm(self.OP_TIME, "send")
                try:
                    sent = attempt(self.face.send, actions.copy(), np.array(send, dtype=np.int32))
                finally:
                    self.dog.disarm()
                if not sent.ok:
                    self.find("face raised", f"send: {type(sent.exc).__name__}: {str(sent.exc)[:400]}")
                    return
                held = keep
            self.op_index += 1
            self.op_name = "recv"
            recvs += 1
            self.dog.arm(self.OP_TIME, "recv")
            try:
                got = attempt(self.face.recv)
            finally:
                self.dog.disarm()
            self.context = {c for c in self.context if c.startswith("after-")}
            pending = {i: q[0] for i, q in expected.items() if q}
            if not got.ok:
                exc = got.exc
                self.log(f"recv raised {type(exc).__name__}: {str(exc)[:200]}")
                if raised_in_info_reading(exc):
                    self.context.add("after-info-read-error")
                if isinstance(exc, (WorkerDiedError, PoolClosedError)) or getattr(self.face, "closed", False) is True:
                    self.find("worker died" if isinstance(exc, WorkerDiedError) else "face closed",
                              f"{type(exc).__name__}: {exc}")
                    return
                env_id = getattr(exc, "env_id", None)
                exp = pending.get(env_id)
                if exp is None and env_id is None:
                    # not about one env: right only if some env's result is one gymnasium refuses
                    if not (any(not p.ok or self.row_refused(p.value) for p in pending.values())
                            or self.batching_refused(pending)):
                        self.find("face raised", f"recv: {type(exc).__name__}: {str(exc)[:500]}")
                elif exp is None:
                    self.find("face raised", f"recv: {type(exc).__name__} about env {env_id}, which had "
                              f"nothing in flight: {str(exc)[:400]}")
                elif not isinstance(exc, ShmpoolError) and self.batching_refused(pending):
                    self.context.add(f"gymnasium's batching raises too ({type(exc).__name__})")
                elif exp.ok:
                    if not self.row_refused(exp.value):
                        self.find("face raised", f"recv: {type(exc).__name__}: {str(exc)[:500]}"
                                  f" (the oracle of env {env_id} returned)")
                elif is_injected(exp.exc):
                    problem = face_error_ok(exc, exp.exc)
                    if problem:
                        self.find("wrong error", f"recv: {problem}")
                need_reset = True
                continue
            obs, rew, term, trunc, infos = got.value
            ids = [int(i) for i in np.asarray(infos["env_id"])]
            rows_expected = []
            bad = False
            for i in ids:
                if not expected.get(i):
                    self.find("mismatch", f"recv returned env {i}, which had nothing in flight")
                    bad = True
                    break
                rows_expected.append(expected[i].popleft())
            if bad:
                need_reset = True
                continue
            failed = [(i, e) for i, e in zip(ids, rows_expected) if not e.ok or self.row_refused(e.value)]
            if failed:
                i, e = failed[0]
                if not e.ok:
                    self.find("face returned where oracle raised", f"recv: env {i}'s oracle raised {e.exc!r}")
                else:
                    # gymnasium cannot take this row (obs=None, an info that is not a dict): the face
                    # had to refuse it
                    self.find("face returned where oracle raised",
                              f"recv: env {i} returned obs={_short(e.value[0], 60)} info pieces="
                              f"{_short(e.value[4], 80)}, which gymnasium refuses")
                need_reset = True
                continue
            diffs = self.compare_rows(ids, rows_expected, got.value)
            if diffs:
                self.find("mismatch", f"rows {ids}: " + "; ".join(diffs))
                need_reset = True
                continue
            held.extend(ids)
        self.op_index += 1
        self.op_name = "close"
        self.dog.arm(30, "close")
        try:
            f = attempt(self.face.close)
        finally:
            self.dog.disarm()
        closes = [attempt(o.env.close) for o in self.oracle]
        self.context |= self.oracle_faults()
        failing = [c for c in closes if not c.ok]
        if failing and f.ok:
            self.find("face returned where oracle raised", f"close: oracle raised {failing[0].exc!r}")
        elif failing:
            problem = face_error_ok(f.exc, failing[0].exc)
            if problem:
                self.find("wrong error", f"close: {problem}")
        elif not f.ok:
            self.find("face raised", f"close: {type(f.exc).__name__}: {str(f.exc)[:400]}")
        self.face = None
        self.oracle = None

    def batching_refused(self, pending: dict) -> bool:
        """Whether gymnasium's _add_info could raise on these rows' infos in the batch recv was
        building (its order is unknown: each row alone, every ordered pair, all in env order)."""
        values = [p.value for _, p in sorted(pending.items()) if p.ok]
        pairs = [[a, b] for i, a in enumerate(values) for j, b in enumerate(values) if i != j]
        for group in [[v] for v in values] + pairs + [values]:
            try:
                infos: dict = {}
                b = _Batcher(len(group))
                for row, v in enumerate(group):
                    for piece in v[4]:
                        infos = b.add(infos, piece, row)
            except Exception:
                return True
        return False

    def row_refused(self, value: tuple) -> bool:
        """Whether gymnasium's vector env would raise on this row (obs it cannot batch, an info
        that is not a dict); the env's fault is in the context then."""
        obs, pieces = value[0], value[4]
        bad = False
        if not all(isinstance(p, dict) or p is None for p in pieces):
            self.context.add("info_nondict")
            bad = True
        if contains_none(obs):
            self.context.add("obs_none")
            bad = True
        return bad

    def oracle_reset(self, seed: int) -> tuple:
        """What SyncVectorEnv.reset(seed=seed) does: env by env, each info batched as it comes."""
        b = _Batcher(self.n)
        infos: dict = {}
        results = []
        for i, o in enumerate(self.oracle):
            results.append(o.reset(seed + i))
            for piece in results[-1][4]:
                infos = b.add(infos, piece, i)
        return batch_obs(self.plan.obs, [x[0] for x in results]), infos

    def compare_async_reset(self, a, b) -> list:
        out: list = []
        b_obs, b_info = b
        n = self.n
        expected_obs, infos = a
        same(expected_obs, b_obs, "obs", out)
        if self.cfg.face == "envpool_async":
            infos = envpool_infos(infos, np.zeros(n, np.int32), np.arange(n, dtype=np.int32))
        same(infos, b_info, "infos", out)
        for o in self.oracle:
            o.elapsed = 0
        return out

    def compare_rows(self, ids: list, exp: list, got: tuple) -> list:
        out: list = []
        obs, rew, term, trunc, infos = got
        values = [e.value for e in exp]
        try:
            expected_obs = batch_obs(self.plan.obs, [v[0] for v in values])
        except Exception:
            # SyncVectorEnv's concatenate refuses a value its same_kind cast cannot take (a python
            # int list into uint8); shmpool casts as AsyncVectorEnv's shared-memory write does
            expected_obs = batch_obs_cast(self.plan.obs, [v[0] for v in values])
        same(expected_obs, obs, "obs", out)
        rew_dtype = np.float32 if self.cfg.face == "envpool_async" else np.float64
        same(np.array([v[1] for v in values], dtype=np.float64).astype(rew_dtype), rew, "rewards", out)
        same(np.array([bool(v[2]) for v in values]), term, "terminated", out)
        same(np.array([bool(v[3]) for v in values]), trunc, "truncated", out)
        b = _Batcher(len(ids))
        try:
            expected_infos: dict = {}
            for row, v in enumerate(values):
                for piece in v[4]:
                    expected_infos = b.add(expected_infos, piece, row)
        except Exception:
            return out                      # gymnasium's batching refuses these rows: skipped
        env_ids = np.array(ids, dtype=np.int32)
        if self.cfg.face == "envpool_async":
            elapsed = np.array([self.oracle[i].elapsed for i in ids], dtype=np.int32)
            expected_infos = envpool_infos(expected_infos, elapsed, env_ids)
        else:
            expected_infos["env_id"] = env_ids
        same(expected_infos, infos, "infos", out)
        return out


def contains_none(obs) -> bool:
    if obs is None:
        return True
    if isinstance(obs, dict):
        return any(contains_none(v) for v in obs.values())
    if isinstance(obs, tuple):
        return any(contains_none(v) for v in obs)
    return False


def batch_obs_cast(spec: tuple, items: list):
    """A batch as AsyncVectorEnv's shared-memory write makes it: each value ``np.asarray(value,
    dtype=space.dtype)``."""
    kind = spec[0]
    if kind == "dict":
        return {k: batch_obs_cast(sub, [x[k] for x in items]) for k, sub in spec[1]}
    if kind == "tuple":
        return tuple(batch_obs_cast(sub, [x[j] for x in items]) for j, sub in enumerate(spec[1]))
    space = build_space(spec)
    return np.stack([np.asarray(x, dtype=space.dtype).reshape(space.shape) for x in items])


def batch_obs(spec: tuple, items: list):
    """gymnasium's ``concatenate`` of single observations into a fresh batch."""
    from gymnasium.vector.utils import concatenate, create_empty_array
    space = build_space(spec)
    return concatenate(space, items, create_empty_array(space, len(items)))


# ============================================================================================
# running cases
# ============================================================================================

def run_case(case: Case, verbose: bool = False, dog: Watchdog | None = None) -> list[Finding]:
    findings: list[Finding] = []
    own = dog is None
    dog = dog or Watchdog()
    if own:
        dog.__enter__()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for cfg in case.faces:
                runner = AsyncRun if cfg.face.endswith("_async") else SyncRun
                findings += runner(case.plan, cfg, dog, verbose).run()
    finally:
        if own:
            dog.__exit__(None, None, None)
    return findings


def describe_case(case: Case) -> str:
    p = case.plan
    lines = [f"seed={p.seed} num_envs={p.num_envs} ops={p.ops} loose={p.loose} flag_forms={p.flag_forms}",
             f"  obs={p.obs}", f"  act={p.act} max_len={p.max_len} p_term={p.p_term}/1000",
             f"  info_keys={p.info_keys} many_keys={p.many_keys}", f"  faults={p.faults}"]
    lines += [f"  face: {dataclasses.asdict(f)}" for f in case.faces]
    return "\n".join(lines)


def parse_case(text: str) -> Case:
    """A ``repr(case)`` back into a Case."""
    return eval(text, {"__builtins__": {}}, {"Case": Case, "Plan": Plan, "FaceCfg": FaceCfg, "inf": math.inf})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0, help="how long to fuzz (default 5)")
    ap.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    ap.add_argument("--seed", type=int, default=None, help="run this one case (printed per op with -v)")
    ap.add_argument("--case", default=None,
                    help="run this case: the Case(...) text a failure of tests/project/test_fuzz.py prints")
    ap.add_argument("--base-seed", type=int, default=None, help="first case seed (default: from the clock)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--show", type=int, default=3, help="examples printed per distinct finding (default 3)")
    args = ap.parse_args(argv)

    if args.seed is not None or args.case is not None:
        case = case_from_seed(args.seed) if args.case is None else parse_case(args.case)
        print(describe_case(case))
        findings = run_case(case, verbose=args.verbose)
        for f in findings:
            print(f.describe())
        print(f"{len(findings)} finding(s)")
        return 1 if findings else 0

    base = args.base_seed if args.base_seed is not None else int(time.time()) % 10 ** 6 * 1000
    deadline = time.monotonic() + args.minutes * 60
    start = time.monotonic()
    groups: dict[tuple, list[Finding]] = collections.OrderedDict()
    faces_run = collections.Counter()
    cases = 0
    seed = base
    print(f"fuzzing for {args.minutes} min from seed {base} (python -m tests.fuzz --seed N -v replays case N)",
          flush=True)
    with Watchdog() as dog:
        while time.monotonic() < deadline and (args.cases is None or cases < args.cases):
            case = case_from_seed(seed)
            for cfg in case.faces:
                faces_run[cfg.face] += 1
            try:
                found = run_case(case, verbose=args.verbose, dog=dog)
            except Exception as exc:         # a bug in the fuzzer itself: say so, go on
                found = [Finding("fuzzer error", case.faces[0], seed, -1, "?",
                                 "".join(traceback.format_exception(exc))[-1500:])]
            for f in found:
                key = f.signature()
                first = key not in groups
                groups.setdefault(key, []).append(f)
                if first:
                    print(f"NEW {f.describe()}", flush=True)
            cases += 1
            seed += 1
            if cases % 50 == 0:
                print(f"... {cases} cases, {time.monotonic() - start:.0f} s, "
                      f"{sum(len(v) for v in groups.values())} findings in {len(groups)} groups", flush=True)
    took = time.monotonic() - start
    print(f"\n{cases} cases ({dict(faces_run)}) in {took:.0f} s, seeds {base}..{seed - 1}")
    print(summary(groups, args.show))
    return 1 if groups else 0


def summary(groups: dict, show: int) -> str:
    """Findings by family (known bugs, new ones, unclassified), then by face, mode and kind."""
    total = sum(len(v) for v in groups.values())
    lines = [f"{total} findings in {len(groups)} groups"]
    families: dict[str, list] = collections.OrderedDict()
    for key in sorted(groups, key=lambda k: (k[0] == k[3], k[0])):
        families.setdefault(key[0] if key[0] != key[3] else "UNCLASSIFIED", []).append(key)
    for fam, keys in families.items():
        label = KNOWN.get(fam) or NEW_FAMILIES.get(fam) or "UNCLASSIFIED (look at these)"
        n = sum(len(groups[k]) for k in keys)
        seeds = sorted({f.seed for k in keys for f in groups[k]})
        lines.append(f"\n== {label}: {n} finding(s) in {len(seeds)} case(s), seeds {seeds[:12]}")
        for k in keys:
            items = groups[k]
            lines.append(f"   {k[1]:14} {k[2]:10} {k[3]:36} x{len(items)}")
        shown = [f for k in keys for f in groups[k][:1]][:show]
        for f in shown:
            lines.append("   e.g. " + f.describe().replace("\n", "\n   "))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
