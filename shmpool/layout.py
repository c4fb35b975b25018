"""Where everything lives in the pool's one shared-memory region.

The region is laid out once from the single-env spaces: the wire's control
region first (see ``_core``), then one array per leaf of the action and
observation spaces, rewards, flags, per-env status and the numeric info table.
Every array is cache-line aligned so no two of them share a line.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from . import _core
from .errors import SpacesDifferError
from .gym_compat import is_space_dtype_shape_equiv
from .spacetree import tree_of

ALIGN = _core.LINE

INFO_COLUMNS = 64         # numeric info keys that fit in shared memory
INFO_NAME_BYTES = 56      # utf-8 bytes of a key name
INFO_ENTRY = 64           # registry entry: state u32, dtype code u32, name


@dataclass(frozen=True)
class Leaf:
    """One array-valued leaf of a (possibly nested) space."""

    path: tuple[Any, ...]     # keys/indices from the root space
    shape: tuple[int, ...]    # single-env shape
    dtype: np.dtype


# Leaf spaces with a fixed shape and dtype: these get shared-memory arrays.
SHARED_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def leaves(space: spaces.Space, allow_pickled: bool = False) -> list[Leaf]:
    """The space's array leaves, in ``spacetree`` order (the wire's order).

    Any other leaf (Text, Sequence, Graph, OneOf, custom spaces) is refused, or
    with ``allow_pickled`` left out: it travels pickled (``shmpool.pickled``)."""
    out = []
    for leaf in tree_of(space).leaves:
        if isinstance(leaf.space, SHARED_SPACES):
            out.append(Leaf(leaf.path, tuple(leaf.space.shape), np.dtype(leaf.space.dtype)))
        elif not allow_pickled:
            raise TypeError(
                f"shmpool cannot lay out a {type(leaf.space).__name__} space in shared memory "
                "(supported: Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of them)")
    return out


def all_shared(space: spaces.Space) -> bool:
    """Whether every leaf of ``space`` lives in shared memory (nothing travels pickled)."""
    return all(isinstance(leaf.space, SHARED_SPACES) for leaf in tree_of(space).leaves)


def same_space(a: spaces.Space, b: spaces.Space) -> bool:
    """Whether two spaces are equal as gymnasium judges them (``a == b``), the exact cases first:
    the same object, or Boxes of one shape and dtype whose bounds are equal element for element.
    Box equality runs ``allclose`` over the bounds, whose float temporaries cost ~25 bytes per
    element: gigabytes, for one image-sized space compared once per env."""
    if a is b:
        return True
    if (type(a) is spaces.Box and type(b) is spaces.Box and a.shape == b.shape and a.dtype == b.dtype
            and np.array_equal(a.low, b.low) and np.array_equal(a.high, b.high)):
        return True
    return a == b


def same_layout(a: spaces.Space, b: spaces.Space) -> bool:
    """Whether two spaces share type, shapes and dtypes (gymnasium's ``is_space_dtype_shape_equiv``):
    envs with such spaces can share one layout although their bounds differ."""
    if a is b:
        return True
    try:
        return bool(is_space_dtype_shape_equiv(a, b))
    except (NotImplementedError, TypeError):   # spaces gymnasium has no rule for
        return a == b


def assemble(space: spaces.Space, arrays: Sequence) -> Any:
    """The space's structure (dicts/tuples) around its leaf arrays in leaf order (``Views.obs``)."""
    return tree_of(space).assemble(arrays)


def _leaf_bytes(leaf: Leaf) -> int:
    # Python ints: a shape whose element count overflows int64 is a size the memory check refuses
    # by name, not a wrapped count that fails later in a reshape.
    return leaf.dtype.itemsize * math.prod(leaf.shape)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Layout:
    """Byte offsets of every array in the region. Picklable; sent to workers."""

    num_envs: int
    shard_sizes: list[int]
    obs_leaves: list[Leaf]
    act_leaves: list[Leaf]
    offsets: dict[str, int] = field(default_factory=dict)
    size: int = 0
    has_pickled_actions: bool = False   # action leaves that travel pickled: a version word per env
    final_obs: bool = False   # SAME_STEP: a second obs-shaped array per leaf for ended episodes' last obs

    @classmethod
    def build(cls, num_envs: int, shard_sizes: list[int], obs_space, act_space, *,
              final_obs: bool = False) -> Layout:
        """``final_obs``: also lay out ``final_obs{i}`` (like ``obs{i}``), where a worker in
        SAME_STEP mode writes the last observation of an episode that ended in this step
        (only when every observation leaf lives in shared memory; else final observations
        travel pickled)."""
        final_obs = final_obs and all_shared(obs_space)
        lay = cls(num_envs, list(shard_sizes), leaves(obs_space, allow_pickled=True),
                  leaves(act_space, allow_pickled=True), final_obs=final_obs)
        lay.has_pickled_actions = not all_shared(act_space)
        off = _align(_core.control_size(num_envs, shard_sizes))

        def put(name: str, nbytes: int) -> None:
            nonlocal off
            lay.offsets[name] = off
            off += _align(max(nbytes, 1))

        for i, leaf in enumerate(lay.act_leaves):
            put(f"act{i}", num_envs * _leaf_bytes(leaf))
        for i, leaf in enumerate(lay.obs_leaves):
            put(f"obs{i}", num_envs * _leaf_bytes(leaf))
        for i, leaf in enumerate(lay.obs_leaves if final_obs else []):
            put(f"final_obs{i}", num_envs * _leaf_bytes(leaf))
        put("reward", num_envs * 8)
        put("terminated", num_envs)
        put("truncated", num_envs)
        put("status", num_envs)
        put("info_mask", num_envs * 8)
        put("info_registry", INFO_COLUMNS * INFO_ENTRY)
        put("info_values", INFO_COLUMNS * num_envs * 8)
        if lay.has_pickled_actions:
            put("act_version", num_envs * 4)
        lay.size = off
        return lay


class Views:
    """Numpy views of a mapped region, laid out by ``Layout``."""

    def __init__(self, layout: Layout, buf) -> None:
        n = layout.num_envs
        o = layout.offsets

        def arr(name, dtype, shape):
            count = math.prod(shape)
            return np.frombuffer(buf, dtype=dtype, count=count, offset=o[name]).reshape(shape)

        self.act = [arr(f"act{i}", lf.dtype, (n, *lf.shape)) for i, lf in enumerate(layout.act_leaves)]
        self.obs = [arr(f"obs{i}", lf.dtype, (n, *lf.shape)) for i, lf in enumerate(layout.obs_leaves)]
        # Empty unless the layout has them (SAME_STEP).
        self.final_obs = [arr(f"final_obs{i}", lf.dtype, (n, *lf.shape))
                          for i, lf in enumerate(layout.obs_leaves) if layout.final_obs]
        self.reward = arr("reward", np.float64, (n,))
        self.terminated = arr("terminated", np.bool_, (n,))
        self.truncated = arr("truncated", np.bool_, (n,))
        self.status = arr("status", np.uint8, (n,))
        self.info_mask = arr("info_mask", np.uint64, (n,))
        self.info_registry = arr("info_registry", np.uint8, (INFO_COLUMNS * INFO_ENTRY,))
        self.info_values = arr("info_values", np.uint8, (INFO_COLUMNS, n, 8))
        self.registry_offset = o["info_registry"]
        # Per env, how many pickled actions the parent has sent it (``shmpool.pickled``).
        self.act_version = arr("act_version", np.uint32, (n,)) if layout.has_pickled_actions else None


def observation_spaces(bounds: list[tuple[int, int]], described: list, mode: str) -> tuple:
    """Each env's observation space, from each worker's ``protocol.Spaces`` (``described``) and
    its envs ``bounds``, judged against ``observation_mode``: ``"same"`` wants them equal,
    ``"different"`` of one type, shape and dtype (bounds may differ).  ``SpacesDifferError``
    names the first env that breaks it."""
    spaces: list = []
    for (a, b), d in zip(bounds, described):
        spaces += d.observation_spaces or [d.observation_space] * (b - a)
    first, different = spaces[0], mode == "different"
    # Each distinct object once: a worker's unchanged spaces are one object (and workers' equal
    # spaces one object too: protocol.DecodedOnce).
    accepted = {id(first)}
    for i, space in enumerate(spaces):
        if id(space) in accepted:
            continue
        if same_space(space, first) or (different and same_layout(space, first)):
            accepted.add(id(space))
            continue
        allowed = ("spaces of one type, shape and dtype" if different else
                   "one space (observation_mode='different' accepts spaces that differ in bounds only)")
        raise SpacesDifferError(f"env {i} has observation space {space}; env 0 has {first}: all envs of a pool "
                                f"must share their spaces: {allowed}", tuple(spaces))
    return tuple(spaces)
