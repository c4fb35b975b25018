"""Batch assembly for :class:`~shmpool.distributed.RayPool`: the pools' answers gathered into one
batch with global env ids.  Pure numpy; nothing here needs Ray.

A batch is "rows": observations batched like the observation space (an array, or dicts/tuples of
arrays for Dict/Tuple spaces), ``(n,)`` float64 rewards, ``(n,)`` bool terminated/truncated, and
infos in gymnasium's vector layout (``key`` plus a ``_key`` bool mask, nested dicts).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import numpy as np

RESTARTED = "worker_restarted"   # the info key that flags a row answered by a rebuilt pool


def joined(arrays: list) -> np.ndarray:
    """``np.concatenate(arrays)``, in the dtype they share when they share one: numpy 2 makes a byte-swapped dtype
    native (two pools' Box of ``'>f4'`` joined as float32), where a local Pool keeps the space's dtype."""
    out = np.concatenate(arrays)
    first = getattr(arrays[0], "dtype", None)
    if first is None or out.dtype == first:   # the common case: nothing was changed
        return out
    dtypes = {getattr(a, "dtype", None) for a in arrays}
    return out.astype(first) if len(dtypes) == 1 else out


def concat(parts: list) -> Any:
    """Concatenate batched values (arrays, or dicts/tuples of them) along axis 0."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: concat([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(concat([p[i] for p in parts]) for i in range(len(first)))
    return joined(parts) if len(parts) > 1 else np.asarray(first)


def take_rows(x: Any, index: Any) -> Any:
    """Rows ``index`` (a slice, an index array or a bool mask) of a batched value."""
    if isinstance(x, dict):
        return {k: take_rows(v, index) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(take_rows(v, index) for v in x)
    return np.asarray(x)[index]


def batch_len(x: Any) -> int:
    """Rows of a batched value (of its first leaf)."""
    if isinstance(x, dict):
        return batch_len(next(iter(x.values())))
    if isinstance(x, tuple):
        return batch_len(x[0])
    return len(x)


def _column(values: list, sizes: list[int]) -> np.ndarray:
    """One info key over consecutive blocks; ``None`` where a block lacks it (zeros / None there)."""
    ref = next(v for v in values if v is not None)
    filled = []
    for v, n in zip(values, sizes):
        if v is None:
            v = (np.full(n, None, dtype=object) if ref.dtype == object
                 else np.zeros((n, *ref.shape[1:]), dtype=ref.dtype))
        filled.append(v)
    try:
        return joined(filled)
    except ValueError:  # shapes differ between blocks: one object per row, as gymnasium does
        out = np.empty(sum(sizes), dtype=object)
        for i, row in enumerate(row for v in filled for row in v):
            out[i] = row   # one by one: a list of arrays would be broadcast, not stored
        return out


def _same_columns(parts: list[dict]) -> bool:
    """Whether every block has the same keys, each an array of one dtype and row shape in every block, and every
    ``_key`` mask is bool: then merging is plain concatenation, ~4x cheaper than the general path (50 µs for a
    Pong step's two blocks here, a cost the driver pays every call)."""
    first = parts[0]
    if any(p.keys() != first.keys() for p in parts[1:]):
        return False
    for key, v in first.items():
        if type(v) is not np.ndarray or v.ndim == 0:
            return False
        if isinstance(key, str) and key.startswith("_") and key[1:] in first and v.dtype != np.bool_:
            return False   # merge_infos makes such a mask bool
        for p in parts[1:]:
            w = p[key]
            if type(w) is not np.ndarray or w.dtype != v.dtype or w.shape[1:] != v.shape[1:]:
                return False
    return True


def merge_infos(parts: list[dict], sizes: list[int]) -> dict:
    """gymnasium vector infos of consecutive row blocks (``sizes[i]`` rows in ``parts[i]``) as one.

    A key missing from a block gets zeros (or None for object columns) there, and ``False`` in its
    ``_key`` mask."""
    if len(parts) == 1:
        return parts[0]
    if _same_columns(parts):   # every step of a homogeneous pool: no filling to do, one concatenation a key
        return {key: joined([p[key] for p in parts]) for key in parts[0]}
    keys: dict[str, None] = {}
    for p in parts:
        keys.update(dict.fromkeys(p))
    out: dict = {}
    for key in keys:
        values = [p.get(key) for p in parts]
        sample = next((v for v in values if v is not None), None)
        if sample is None:   # gymnasium's own batching can store a bare None ({1: None}): keep it
            out[key] = None
        elif isinstance(sample, dict):
            out[key] = merge_infos([v if v is not None else {} for v in values], sizes)
        elif isinstance(key, str) and key.startswith("_") and key[1:] in keys:
            out[key] = np.concatenate([np.asarray(v, dtype=bool) if v is not None else np.zeros(n, dtype=bool)
                                       for v, n in zip(values, sizes)])
        else:
            out[key] = _column([None if v is None else np.asarray(v) for v in values], sizes)
    return out


def mark_restarted(infos: dict, size: int, rows: Any) -> dict:
    """Set ``infos["worker_restarted"]`` and its mask (``(size,)`` bool) for ``rows``; returns ``infos``."""
    flag = np.zeros(size, dtype=bool)
    flag[rows] = True
    if RESTARTED in infos:
        flag |= infos[RESTARTED]
    infos[RESTARTED] = flag
    infos["_" + RESTARTED] = flag.copy()
    return infos


@dataclass
class Rows:
    """Finished rows of some envs: ``ids`` ``(n,)`` int64 (local to a pool on a node, global in the
    parent), ``obs``, ``rew`` ``(n,)`` float64, ``term``/``trunc`` ``(n,)`` bool, ``infos`` (vector layout)."""

    ids: np.ndarray
    obs: Any
    rew: np.ndarray
    term: np.ndarray
    trunc: np.ndarray
    infos: dict

    def __len__(self) -> int:
        return len(self.ids)

    def __reduce__(self) -> tuple:
        # Observations first: in a step answer's frame they are then the first out-of-band buffer, the one the
        # driver may read straight into its batch (StepOutput, wire.FrameReader).
        return rows_from_obs_first, (self.obs, self.ids, self.rew, self.term, self.trunc, self.infos)

    @classmethod
    def restarted(cls, ids: np.ndarray, obs: Any, infos: dict) -> Rows:
        """Rows of rebuilt envs: their reset observation, reward 0, truncated, ``worker_restarted`` set."""
        n = len(ids)
        infos = mark_restarted(dict(infos), n, np.arange(n))
        return cls(np.asarray(ids, dtype=np.int64), obs, np.zeros(n), np.zeros(n, dtype=bool),
                   np.ones(n, dtype=bool), infos)

    @classmethod
    def autoreset(cls, ids: np.ndarray, obs: Any) -> Rows:
        """The NEXT_STEP autoreset rows after a truncation: the reset observation again, reward 0, no flags."""
        n = len(ids)
        return cls(np.asarray(ids, dtype=np.int64), obs, np.zeros(n), np.zeros(n, dtype=bool),
                   np.zeros(n, dtype=bool), {})

    def shifted(self, offset: int) -> Rows:
        """The same rows with ``offset`` added to the ids (a pool's local ids made global)."""
        return Rows(self.ids + offset, self.obs, self.rew, self.term, self.trunc, self.infos)

    def select(self, index: Any) -> Rows:
        """The rows picked by a bool mask, an index array or a slice."""
        return Rows(self.ids[index], take_rows(self.obs, index), self.rew[index], self.term[index],
                    self.trunc[index], take_rows(self.infos, index))

    @staticmethod
    def join(parts: list[Rows], obs: Any = None) -> Rows:
        """Blocks of rows one after the other, as one block; ``obs``: the blocks' observations already joined."""
        if len(parts) == 1 and obs is None:
            return parts[0]
        return Rows(np.concatenate([p.ids for p in parts]), concat([p.obs for p in parts]) if obs is None else obs,
                    np.concatenate([p.rew for p in parts]), np.concatenate([p.term for p in parts]),
                    np.concatenate([p.trunc for p in parts]), merge_infos([p.infos for p in parts],
                                                                          [len(p) for p in parts]))

    def as_step(self) -> tuple:
        """``(obs, rewards, terminated, truncated, infos)`` as a pool's ``step`` returns them."""
        return self.obs, self.rew, self.term, self.trunc, self.infos

    def as_recv(self) -> tuple:
        """Like :meth:`as_step`, with ``infos["env_id"]`` (``(n,)`` int32) added, as ``recv`` returns them."""
        infos = dict(self.infos)
        infos["env_id"] = self.ids.astype(np.int32)
        return self.obs, self.rew, self.term, self.trunc, infos


def rows_from_obs_first(obs: Any, ids: np.ndarray, rew: np.ndarray, term: np.ndarray, trunc: np.ndarray,
                        infos: dict) -> Rows:
    """:class:`Rows` from its fields in pickling order (observations first)."""
    return Rows(ids, obs, rew, term, trunc, infos)


class StepOutput:
    """A sync step's observations read straight into the step's output.  After a step whose pools all answered
    with plain arrays of one dtype and row shape, the next step's output ``(num_envs, *row_shape)`` is made before
    its answers come, and each pool's rows of it are handed to that pool's reply as the target of its first buffer
    (:class:`~.wire.FrameReader`); when every answer's observations landed there, the output is the step's
    observations and nothing is copied.  Otherwise (a pool answered through Ray, its layout changed, an error)
    the answers are joined by copying, as :meth:`Rows.join` joins them.  ``rows[k]``: pool ``k``'s rows."""

    def __init__(self, rows: list[slice]) -> None:
        self.rows = rows
        self.layout: tuple[np.dtype, tuple] | None = None   # the last step's observations' dtype and row shape
        self.out: np.ndarray | None = None

    def aim(self, replies: list) -> None:
        """Give each reply (a :class:`~.channel.Reply`; None for a pool answered otherwise) its rows of a new output
        as its target."""
        self.out = None
        if self.layout is None:
            return
        dtype, shape = self.layout
        self.out = np.empty((self.rows[-1].stop, *shape), dtype)
        for reply, rows in zip(replies, self.rows):
            if reply is not None:
                reply.target = memoryview(self.out[rows]).cast("B")

    def join(self, parts: list[Rows]) -> Rows:
        """The step's rows from every pool's (pool order), its observations the output when all were read into it."""
        out, self.out = self.out, None
        obs = [p.obs for p in parts]
        self.layout = None
        if all(type(o) is np.ndarray for o in obs) and len({(o.dtype, o.shape[1:]) for o in obs}) == 1:
            self.layout = obs[0].dtype, obs[0].shape[1:]
        if out is None or not all(_is_rows_of(o, out, rows) for o, rows in zip(obs, self.rows)):
            return Rows.join(parts)
        return Rows.join(parts, obs=out)


def _is_rows_of(obs: Any, out: np.ndarray, rows: slice) -> bool:
    """Whether ``obs`` is exactly ``out[rows]``'s memory, dtype and shape."""
    want = out[rows]
    return (type(obs) is np.ndarray and obs.dtype == want.dtype and obs.shape == want.shape
            and obs.__array_interface__["data"][0] == want.__array_interface__["data"][0])


class ReadyRows:
    """Finished rows waiting to be returned by ``recv``, oldest first."""

    def __init__(self) -> None:
        self._blocks: collections.deque[Rows] = collections.deque()
        self.count = 0   # rows held

    def add(self, rows: Rows) -> None:
        if len(rows):
            self._blocks.append(rows)
            self.count += len(rows)

    def clear(self) -> None:
        self._blocks.clear()
        self.count = 0

    def drop_envs(self, envs: range) -> None:
        """Forget the rows of envs ``envs`` (their pool was rebuilt: its restart rows replace them)."""
        kept = [b.select(~((b.ids >= envs.start) & (b.ids < envs.stop))) for b in self._blocks]
        self._blocks = collections.deque(b for b in kept if len(b))
        self.count = sum(len(b) for b in self._blocks)

    def take(self, n: int) -> Rows:
        """The oldest ``n`` rows as one block (a block beyond ``n`` is split: its tail stays first in line)."""
        if n > self.count:
            raise ValueError(f"{n} rows asked for, {self.count} ready")
        parts: list[Rows] = []
        got = 0
        while got < n:
            block = self._blocks.popleft()
            if got + len(block) > n:
                block, rest = block.select(slice(0, n - got)), block.select(slice(n - got, None))
                self._blocks.appendleft(rest)
            parts.append(block)
            got += len(block)
        self.count -= n
        return Rows.join(parts)
