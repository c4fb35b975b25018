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
        # Rebuilt by one call; the fields' order is the frame's buffers' (the driver maps each buffer to its leaf by
        # where it lies: StepOutput's Plan.learn, so any order lands).
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
    def join(parts: list[Rows]) -> Rows:
        """Blocks of rows one after the other, as one block."""
        if len(parts) == 1:
            return parts[0]
        return Rows(np.concatenate([p.ids for p in parts]), concat([p.obs for p in parts]),
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
    """A sync step's answers read straight into the step's output.  After a step whose pools all answered directly
    with rows of one layout (the same keys, each leaf a whole array of one dtype and row shape in every pool, as
    :meth:`Rows.join` would concatenate them), the next step's output is made, leaf by leaf, before its answers
    come, and each pool's reply is aimed (:meth:`~.channel.Reply.aim`) with the layout of its last answer's frame and
    its rows of each leaf as the places of that frame's buffers.  When every answer landed there, the output is the
    step's rows: nothing was unpickled, nothing is joined.  Otherwise (a pool answered through Ray or was rebuilt,
    its layout changed: an info key came or went, a dtype or shape changed; an error) the answers were decoded and
    are joined by copying, and the layout is learnt again from them.  ``rows[k]``: pool ``k``'s rows.  Every
    output is made fresh for its step: no later step writes one already returned."""

    def __init__(self, rows: list[slice]) -> None:
        self.rows = rows
        self.plan: Plan | None = None   # learnt from the last step that was joined by copying
        self.replies: list | None = None
        self.out: Rows | None = None     # the aimed step's output

    def aim(self, replies: list) -> None:
        """Aim each reply (a :class:`~.channel.Reply`; None for a pool answered otherwise) at its rows of a new
        output."""
        self.replies = replies
        self.out = None
        plan = self.plan
        if plan is None or None in replies:
            return
        leaves = [np.empty(shape, dtype) for shape, dtype in plan.leaves]
        flat = [memoryview(leaf).cast("B") for leaf in leaves]
        self.out = out = plan.build(leaves)
        for reply, rows, shape, cuts in zip(replies, self.rows, plan.shapes, plan.cuts):
            reply.aim(shape, [flat[i][a:b] for i, a, b in cuts], Landed(out, rows))

    def join(self, parts: list) -> Rows:
        """The step's rows from every pool's (pool order; :class:`Landed` for those read into the output): the
        output when every answer landed in it."""
        out, self.out = self.out, None
        replies, self.replies = self.replies, None
        if out is not None and all(r.landed() is p for r, p in zip(replies, parts)):
            return out
        parts = [p.select() if type(p) is Landed else p for p in parts]
        joined = Rows.join(parts)
        self.plan = Plan.learn(parts, joined, replies, self.rows)
        return joined


class Landed:
    """A pool's answer read into its rows ``rows`` of a step's output ``out`` (:meth:`StepOutput.aim`): what the
    answer's frame decodes to then, the rows themselves made only when asked (:meth:`select`), as the step's output
    holds them already."""

    __slots__ = ("out", "rows")

    def __init__(self, out: Rows, rows: slice) -> None:
        self.out, self.rows = out, rows

    def select(self) -> Rows:
        return self.out.select(self.rows)


def _spec(x: Any, leaves: list) -> Any:
    """The structure of a batched value (``None`` for an array leaf, appended to ``leaves``; a key tuple for a
    dict, a length for a tuple), or ``False`` when a leaf is no array."""
    if type(x) is np.ndarray:
        leaves.append(x)
        return None
    if type(x) is dict:
        specs = tuple(_spec(v, leaves) for v in x.values())
        return False if False in specs else (tuple(x), specs)
    if type(x) is tuple:
        specs = tuple(_spec(v, leaves) for v in x)
        return False if False in specs else (len(x), specs)
    return False


def _built(spec: Any, leaves: Any) -> Any:
    """The value of structure ``spec`` over the next leaves of the iterator ``leaves``."""
    if spec is None:
        return next(leaves)
    size, specs = spec
    if isinstance(size, int):
        return tuple(_built(s, leaves) for s in specs)
    return {key: _built(s, leaves) for key, s in zip(size, specs)}


class Plan:
    """What a step's output is made of: its leaves' ``(shape, dtype)`` in :meth:`build`'s order, and for each pool
    the layout of its answers' frames (``shapes[k]``) and where each of that frame's buffers goes (``cuts[k][j]``:
    a leaf's index and the pool's bytes of it)."""

    def __init__(self, spec: tuple, leaves: list, shapes: list, cuts: list) -> None:
        self.spec, self.leaves, self.shapes, self.cuts = spec, leaves, shapes, cuts
        obs, infos = spec
        # the common case built without walking the structure: one observation array, flat infos
        self.flat_infos = infos[0] if obs is None and not any(infos[1]) else None

    def build(self, leaves: list) -> Rows:
        """Rows over ``leaves`` (one per leaf, in order: observations', then ids, rewards, flags, infos')."""
        if self.flat_infos is not None:
            return Rows(leaves[1], leaves[0], leaves[2], leaves[3], leaves[4], dict(zip(self.flat_infos, leaves[5:])))
        it = iter(leaves)
        obs = _built(self.spec[0], it)
        ids, rew, term, trunc = next(it), next(it), next(it), next(it)
        return Rows(ids, obs, rew, term, trunc, _built(self.spec[1], it))

    @staticmethod
    def _leaves(rows: Rows) -> tuple[Any, list]:
        leaves: list = []
        obs = _spec(rows.obs, leaves)
        leaves += [rows.ids, rows.rew, rows.term, rows.trunc]
        infos = _spec(rows.infos, leaves)
        return (False if obs is False or infos is False else (obs, infos)), leaves

    @classmethod
    def learn(cls, parts: list[Rows], joined: Rows, replies: list | None, rows: list[slice]) -> Plan | None:
        """The plan of a step joined by copying, or None when its answers cannot land: a pool's answer came
        otherwise than decoded from a direct frame, or its layout is not ``joined``'s in rows (a leaf not a
        whole non-empty array of one of its frame's buffers, a dtype or row shape ``joined`` does not keep)."""
        if replies is None or len(replies) != len(parts):
            return None
        spec, out = cls._leaves(joined)
        # numeric leaves only: a memoryview cannot take a datetime's bytes
        if spec is False or any(type(x) is not np.ndarray or x.ndim == 0 or x.dtype.kind not in "biufc" for x in out):
            return None
        shapes, cuts = [], []
        for reply, part, r in zip(replies, parts, rows):
            answer = None if reply is None else reply.answer
            if answer is None or answer.failed or answer.value is not part or reply.frame is None:
                return None
            part_spec, leaves = cls._leaves(part)
            frame = reply.frame
            if part_spec != spec or len(leaves) != len(frame.buffers):
                return None
            where = {}
            for j, buffer in enumerate(frame.buffers):
                if buffer.nbytes:
                    where[np.frombuffer(buffer, np.uint8).__array_interface__["data"][0], buffer.nbytes] = j
            order = [None] * len(leaves)
            for i, (leaf, whole) in enumerate(zip(leaves, out)):
                if (type(leaf) is not np.ndarray or not leaf.flags.c_contiguous or leaf.ndim == 0
                        or len(leaf) != r.stop - r.start or leaf.dtype != whole.dtype
                        or leaf.shape[1:] != whole.shape[1:]):
                    return None
                j = where.pop((leaf.__array_interface__["data"][0], leaf.nbytes), None)
                if j is None:
                    return None
                order[j] = i
            if where:
                return None
            shapes.append(frame.shape())
            cuts.append([(i, r.start * out[i][0].nbytes, r.stop * out[i][0].nbytes) for i in order])
        return cls(spec, [(x.shape, x.dtype) for x in out], shapes, cuts)


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
