"""Reset arguments, checked as gymnasium's vector envs check them (same types and messages)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def seed_list(seed: int | Sequence[int | None] | None, num_envs: int) -> list:
    """One seed per env: None for all, ``seed + i`` for an int, or the list itself."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)):   # bool too: gymnasium's vector envs take True as 1
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(
            f"If seeds are passed as a list the length must match num_envs={num_envs} "
            f"but got length={len(seeds)}.")
    return seeds


def check_reset_mask(mask, num_envs: int) -> np.ndarray:
    """``options["reset_mask"]``: a bool numpy array, one per env, at least one True."""
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (num_envs,):
        raise ValueError(f"`options['reset_mask']` must have shape `({num_envs},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not np.any(mask):
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True value, "
            f"got reset_mask={mask}")
    return mask
