"""Reset arguments, checked as gymnasium's vector envs check them (same types and messages)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import protocol as P
from .arguments import check_options_list


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


@dataclass(frozen=True)
class ResetRequest:
    """One ``reset()`` of every env, checked and with its options packed (``protocol.pack``):
    ``options`` is one blob for every env, or a list of one blob per env; ``mask`` (bool, one
    per env) or None."""

    seeds: list
    options: bytes | list[bytes]
    mask: np.ndarray | None

    def for_shard(self, start: int, end: int) -> tuple[list, bytes | list[bytes], list[bool] | None]:
        """The seeds, options and mask of envs ``start..end-1``."""
        options = self.options[start:end] if isinstance(self.options, list) else self.options
        return self.seeds[start:end], options, None if self.mask is None else self.mask[start:end].tolist()


def reset_request(seed, options, num_envs: int) -> ResetRequest:
    """``reset(seed, options)``'s arguments checked as gymnasium checks them; options that cannot
    be pickled are a ``TypeError`` naming the env, raised before anything is sent."""
    seeds = seed_list(seed, num_envs)
    mask = None
    if isinstance(options, (list, tuple)):
        options = check_options_list(options, num_envs)
    elif options is not None and "reset_mask" in options:
        options = dict(options)
        mask = check_reset_mask(options.pop("reset_mask"), num_envs)
    if isinstance(options, list):
        packed = P.pack_each(options, range(num_envs), lambda i: f"reset: the options for env {i}")
    else:
        packed = P.pack_each([options], [0], lambda i: "reset: the options")[0]
    return ResetRequest(seeds, packed, mask)
