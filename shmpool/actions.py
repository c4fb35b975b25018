"""Actions: checked in the parent, then copied into their shared-memory slots.

Nothing that the shared slots cannot hold reaches a worker.  Always, per leaf
of the action space:

- shape must be ``(rows, *space.shape)`` (without ``strict``, ``(rows,)`` too for a
  one-element space); the dtype must cast to the space's
  dtype under numpy's ``same_kind`` rule (float64 policy outputs into a
  float32 Box are fine, floats into a Discrete are not);
- integers must fit the space's dtype (no silent wrap-around).

With ``strict`` (what ``Pool`` does by default) the values are checked too:

- Discrete, MultiDiscrete and MultiBinary values must lie in the space;
- Box values may not be NaN, nor infinite where that side's bound is finite
  (element by element: ``+inf`` where ``high`` is ``inf``, ``-inf`` where ``low``
  is ``-inf``), nor finite values the action dtype cannot hold (float64 ``1e39``
  into a float32 Box would reach the env as ``inf``).  Finite values outside a
  Box's bounds pass through, as with gymnasium's vector envs: envs clip them
  (or wrap with ``ClipAction``).

Without it the env decides, as with gymnasium's vector envs (an out-of-range
Discrete action or a NaN reaches the env).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from . import layout as L
from ._batch_check import (
    CHECK_IN_PYTHON,
    FINITE,
    INT_RANGE,
    NO_NAN,
    NOT_WHOLE,
    SHAPE_ONLY,
    UNSCANNED,
    BatchCheck,
)
from .pickled import PickledLeaves, path_name, per_env_values
from .spacetree import MissingItems, tree_of


class _Slot:
    """One leaf: its shared array, its space, and how to check values for it."""

    def __init__(self, dst: np.ndarray, space: spaces.Space, what: str, strict: bool) -> None:
        self.dst = dst
        self.strict = strict
        self.space = space
        self.what = what
        self.shape = dst.shape[1:]
        self.dtype = dst.dtype
        self.lo = self.hi = None
        if isinstance(space, spaces.Discrete):
            self.lo, self.hi = int(space.start), int(space.start + space.n)  # [lo, hi)
        elif isinstance(space, spaces.MultiDiscrete):
            self.lo, self.hi = space.start, space.start + space.nvec
        elif isinstance(space, spaces.MultiBinary):
            self.lo, self.hi = 0, 2
        elif isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
            # inf is allowed only where that side's bound itself is infinite, element by element
            self.pos_inf_ok = np.broadcast_to(np.isposinf(space.high), space.shape)
            self.neg_inf_ok = np.broadcast_to(np.isneginf(space.low), space.shape)
            self.inf_ok = bool(self.pos_inf_ok.all() and self.neg_inf_ok.all())
        self.whole = BatchCheck(self.dtype, dst.shape, self._scan(), *(
            (self.lo, self.hi) if isinstance(self.lo, int) else ()))

    def _scan(self) -> int:
        """Which values :meth:`check_values` refuses, as :class:`~shmpool._batch_check.BatchCheck` scans them."""
        if not self.strict:
            return SHAPE_ONLY
        if isinstance(self.lo, int):
            return INT_RANGE
        if self.lo is not None:
            return UNSCANNED   # per-element bounds (MultiDiscrete)
        if isinstance(self.space, spaces.Box) and self.dtype.kind == "f":
            return NO_NAN if self.inf_ok else FINITE
        return SHAPE_ONLY      # nothing to refuse (an integer Box)

    def write(self, value, ids: np.ndarray | None, rows: int) -> None:
        a = value if type(value) is np.ndarray else np.asarray(value)
        if not self.strict and a.shape == (rows,) and self.dst[0].size == 1:
            # One number per env for a one-element action (Box(..., (1,))): gymnasium's vector
            # envs hand each env its number, so it is that env's action.
            a = a.reshape(rows, *self.shape)
        if a.shape != (rows, *self.shape):
            raise ValueError(
                f"{self.what} have shape {a.shape}; expected {(rows, *self.shape)} "
                f"({rows} envs x action shape {self.shape})")
        if a.dtype != self.dtype and not np.can_cast(a.dtype, self.dtype, "same_kind"):
            raise ValueError(
                f"{self.what} have dtype {a.dtype}, which cannot be cast to the action dtype {self.dtype}")
        if self.strict:
            self.check_values(a, ids)
        elif a.dtype != self.dtype and a.dtype.kind in "iub" and self.dtype.kind in "iu":
            self.check_fits(a, ids)
        if ids is None:
            np.copyto(self.dst, a, casting="same_kind")
        else:
            self.dst[ids] = a

    def check_values(self, a: np.ndarray, ids: np.ndarray | None) -> None:
        if self.whole.values_pass(a):
            return   # the common case, one C pass (any rows: send's too)
        if self.lo is not None:
            bad = (a < self.lo) | (a >= self.hi)
            if bad.any():
                self._refuse(a, ids, bad, f"outside {self.space}")
        elif isinstance(self.space, spaces.Box) and a.dtype.kind == "f":
            bad = np.isnan(a)
            if not self.inf_ok:
                bad |= ((a == np.inf) & ~self.pos_inf_ok) | ((a == -np.inf) & ~self.neg_inf_ok)
            if bad.any():
                self._refuse(a, ids, bad, "NaN" if self.inf_ok else
                             f"NaN or infinite where the bound is finite (the space is {self.space})")
            if self.dtype.kind == "f" and a.dtype.itemsize > self.dtype.itemsize:
                big = np.isfinite(a) & (np.abs(a) > np.finfo(self.dtype).max)
                if big.any():
                    self._refuse(a, ids, big, f"do not fit the action dtype {self.dtype} (they would become "
                                 "infinite)")

    def check_fits(self, a: np.ndarray, ids: np.ndarray | None) -> None:
        """Integers narrowed to the slot's dtype must keep their value (numpy would wrap them)."""
        info = np.iinfo(self.dtype)
        bad = (a < info.min) | (a > info.max)
        if bad.any():
            self._refuse(a, ids, bad, f"do not fit the action dtype {self.dtype}")

    def _refuse(self, a, ids, bad, why: str) -> None:
        rows = np.flatnonzero(bad.reshape(len(a), -1).any(axis=1))
        envs = rows if ids is None else np.asarray(ids)[rows]
        shown = ", ".join(f"env {e}: {a[r].tolist()}" for e, r in zip(envs[:4], rows[:4]))
        more = f" and {len(rows) - 4} more" if len(rows) > 4 else ""
        raise ValueError(f"{self.what} {why} for {shown}{more}")


class ActionWriter:
    """Checks a batch of actions (batched like the action space) and writes it to the slots."""

    def __init__(self, space: spaces.Space, layout: L.Layout, views: L.Views, strict: bool = True) -> None:
        self.space = space
        self.num_envs = layout.num_envs
        self.strict = strict
        tree = tree_of(space)
        self.is_leaf = tree.is_leaf
        self.split = tree.split
        # The shared leaves, in the order of ``layout.act_leaves`` (both are the tree's order).
        shared = [leaf for leaf in tree.leaves if isinstance(leaf.space, L.SHARED_SPACES)]
        self.slots = [_Slot(dst, leaf.space, path_name("actions", leaf.path), strict)
                      for dst, leaf in zip(views.act, shared)]
        # Leaves that travel pickled (shmpool.pickled), or None.
        self.pickled = PickledLeaves.of(space)
        # The fast path of a sync step: one array of exactly the slots' shape and dtype.
        self.fast = self.slots[0] if self.is_leaf and self.pickled is None else None

    def write(self, actions, ids: np.ndarray | None = None) -> list[tuple] | None:
        """``actions`` for every env (``ids`` None) or for ``ids``, in their order.

        Returns the values of the leaves that travel pickled, one tuple per env
        (None when there are none): the caller sends them (``shmpool.pickled``)."""
        if self.pickled is not None:
            return self._write_with_pickled(actions, ids)
        if ids is None and self.checked_whole(actions):
            self.fast.dst[...] = actions
            return
        rows = len(self.slots[0].dst) if ids is None else len(ids)
        if self.is_leaf:
            self.slots[0].write(actions, ids, rows)
            return
        # A leaf refused after others were written leaves stale slots behind,
        # which is harmless: slots are only read for envs that get dispatched.
        try:
            parts = self.split(actions)
        except MissingItems as exc:
            raise ValueError(f"actions: {exc}") from None
        except TypeError:
            self.refuse_per_env_dicts(actions, rows)
            raise
        for slot, part in zip(self.slots, parts):
            slot.write(part, ids, rows)
        return None

    def checked_whole(self, actions) -> bool:
        """True when ``actions`` for every env take a sync step's fast path (one array of exactly the slots'
        shape and dtype, the space a single shared leaf) and their values pass (ValueError when they do not);
        False when they must be checked the general way, by :meth:`write`."""
        fast = self.fast
        if fast is None:
            return False
        verdict = fast.whole.check(actions)   # one C call (issue 34)
        if verdict == NOT_WHOLE:
            return False
        if verdict == CHECK_IN_PYTHON:   # values C refuses (this names the envs) or does not scan
            fast.check_values(actions, None)
        return True

    def refuse_per_env_dicts(self, actions, rows: int) -> None:
        """Raise a TypeError saying what a Dict space's actions look like when ``actions`` are one dict per env
        (a list of them): a Dict action is one dict of batched values, as gymnasium's vector envs take it."""
        if not isinstance(self.space, spaces.Dict) or not isinstance(actions, (list, tuple)):
            return
        if not actions or not all(isinstance(item, dict) for item in actions):
            return
        keys = list(self.space.spaces)
        shapes = ", ".join(f"{key!r}: shape {(rows, *sub.shape)}" if sub.shape is not None
                           else f"{key!r}: {rows} values" for key, sub in self.space.spaces.items())
        raise TypeError(
            f"actions for a Dict action space are one dict of batched arrays, one entry per key with the envs "
            f"along its first axis ({{{shapes}}}), as gymnasium's vector envs take them; got a "
            f"{type(actions).__name__} of {len(actions)} per-env dicts. Batch them first: "
            f"{{key: np.stack([a[key] for a in actions]) for key in {keys!r}}}")

    def _write_with_pickled(self, actions, ids: np.ndarray | None) -> list[tuple]:
        rows = self.num_envs if ids is None else len(ids)
        try:
            shared, pickled = self.pickled.split(actions)
        except MissingItems as exc:
            raise ValueError(f"actions: {exc}") from None
        except TypeError:
            self.refuse_per_env_dicts(actions, rows)
            raise
        values = per_env_values(self.pickled, pickled, rows)   # checked before any slot is written
        for slot, part in zip(self.slots, shared):
            slot.write(part, ids, rows)
        return values
