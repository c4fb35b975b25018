"""Actions checked in the parent, as a local :class:`~shmpool.Pool` checks them, before a
:class:`~shmpool.distributed.RayPool` sends anything or moves its bookkeeping: a bad action raises
on the call that made it, not one call later from a node."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from gymnasium import spaces

from .. import layout
from ..actions import ActionWriter


class ActionCheck:
    """Checks batches of actions for ``num_envs`` envs of ``space`` (shapes, dtypes, bounds) with
    the local pool's own :class:`~shmpool.actions.ActionWriter`, writing into a private scratch
    array (``num_envs`` actions) instead of shared memory.  ``strict``: the pools' own (``Pool(strict=...)``)."""

    def __init__(self, space: spaces.Space, num_envs: int, strict: bool = True) -> None:
        leaves = layout.leaves(space)
        plan = layout.Layout(num_envs, [num_envs], [], leaves)
        scratch = SimpleNamespace(act=[np.empty((num_envs, *leaf.shape), dtype=leaf.dtype) for leaf in leaves])
        self._writer = ActionWriter(space, plan, scratch, strict)

    def check(self, actions: Any, env_ids: np.ndarray | None = None) -> None:
        """ValueError naming the env ids (global) if ``actions`` for ``env_ids`` (all envs when None)
        do not fit the action space."""
        if env_ids is None and self._writer.checked_whole(actions):
            return   # the common step: checked without the copy into the scratch array
        self._writer.write(actions, env_ids)
