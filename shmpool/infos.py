"""Per-env info dicts: numeric scalars through shared memory, the rest aside.

Workers register each numeric info key once in a small registry in the shared
region (claimed with a compare-and-swap, so any worker may be first) and then
write values into that key's column; a per-env 64-bit mask says which columns
the latest result set.  Anything else (strings, arrays, nested dicts, a 65th
key) travels on the worker's side channel and is merged by ``add_info``, which
follows gymnasium's ``VectorEnv._add_info`` layout: a dict of batched arrays,
each with a boolean ``_key`` mask.
"""
from __future__ import annotations

import os
import time

import numpy as np

from . import _core
from .layout import INFO_COLUMNS, INFO_ENTRY, INFO_NAME_BYTES, Views
from .pids import alive

# A registry entry's state word: FREE, READY, or claiming: ``pid << 2 | CLAIMING`` while the
# worker ``pid`` writes the name.  The pid lets the others free a claim whose writer died.
FREE, CLAIMING, READY = 0, 1, 2
_STATE_BITS = 3
_CHECK_CLAIMANT_S = 0.001     # a claim held this long: is its writer still alive?
DTYPES = [np.dtype(c) for c in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8")]
_CODE = {dt: i for i, dt in enumerate(DTYPES)}


def column_dtype(value) -> np.dtype | None:
    """The batch dtype gymnasium would give this value, if it fits an 8-byte column."""
    t = type(value)
    if t is bool:
        return DTYPES[0]
    if t is int:
        return DTYPES[4]
    if t is float:
        return DTYPES[11]
    if issubclass(t, (np.bool_, np.number)):
        dt = np.dtype(t)
        return dt if dt in _CODE else None
    return None


class _Column:
    __slots__ = ("bit", "dtype", "values")

    def __init__(self, col: int, dtype: np.dtype, views: Views) -> None:
        self.bit = 1 << col
        self.dtype = dtype
        raw = views.info_values[col]
        self.values = np.ndarray(raw.shape[:1], dtype=dtype, buffer=raw, strides=(8,))


class InfoWriter:
    """Worker side: writes one env's info dict, returns what did not fit."""

    def __init__(self, views: Views, buf) -> None:
        self._views = views
        self._buf = buf
        self._mask = views.info_mask
        self._cols: dict = {}   # key -> _Column, or None when the key cannot use shm

    def write(self, env_id: int, info: dict) -> dict | None:
        if not info:
            self._mask[env_id] = 0
            return None
        bits = 0
        extra = None
        for key, value in info.items():
            col = self.column(key, value)
            if col is not None and column_dtype(value) == col.dtype:
                try:
                    col.values[env_id] = value
                    bits |= col.bit
                    continue
                except OverflowError:
                    pass
            if extra is None:
                extra = {}
            extra[key] = value
        self._mask[env_id] = bits
        return extra

    def column(self, key, value) -> _Column | None:
        """The shared-memory column of ``key`` (registered at its first value, whose type
        gives the dtype), or None when the key cannot use shared memory."""
        col = self._cols.get(key, False)
        if col is False:
            col = self._cols[key] = self._register(key, value)
        return col

    def _register(self, key, value) -> _Column | None:
        dtype = column_dtype(value)
        if dtype is None or not isinstance(key, str):
            return None
        name = key.encode("utf-8")
        if len(name) > INFO_NAME_BYTES or key.startswith("_"):
            return None
        reg = self._views.info_registry
        base = self._views.registry_offset
        claim = (os.getpid() << 2) | CLAIMING
        col = 0
        while col < INFO_COLUMNS:
            off = base + col * INFO_ENTRY
            state = _core.load_word(self._buf, off)
            if state == FREE and _core.cas_word(self._buf, off, FREE, claim):
                entry = reg[col * INFO_ENTRY:(col + 1) * INFO_ENTRY]
                entry[4:8] = np.frombuffer(np.uint32(_CODE[dtype]).tobytes(), np.uint8)
                entry[8:] = 0
                entry[8:8 + len(name)] = np.frombuffer(name, np.uint8)
                _core.store_word(self._buf, off, READY)
                return _Column(col, dtype, self._views)
            if _core.load_word(self._buf, off) & _STATE_BITS == CLAIMING and not self._await_claim(off):
                continue  # its writer died mid-claim and the entry is free again: try it ourselves
            got_name, got_dtype = read_entry(self._views, col)
            if got_name == key:
                return _Column(col, got_dtype, self._views) if got_dtype == dtype else None
            col += 1
        return None

    def _await_claim(self, off: int) -> bool:
        """Wait while another worker writes an entry's name (it takes nanoseconds).  If
        that worker died between claiming and finishing (killed, or replaced), free the
        entry: False.  True once the entry is READY."""
        since = time.monotonic()
        while True:
            state = _core.load_word(self._buf, off)
            if state & _STATE_BITS != CLAIMING:
                return True
            if time.monotonic() - since > _CHECK_CLAIMANT_S:
                if not alive(state >> 2):
                    _core.cas_word(self._buf, off, state, FREE)
                    return False
                since = time.monotonic()
                time.sleep(0)   # let a descheduled writer run


def read_entry(views: Views, col: int) -> tuple[str, np.dtype]:
    entry = views.info_registry[col * INFO_ENTRY:(col + 1) * INFO_ENTRY]
    code = int(entry[4:8].view(np.uint32)[0])
    raw = entry[8:].tobytes().rstrip(b"\0")
    return raw.decode("utf-8"), DTYPES[code]


class InfoReader:
    """Parent side: builds gymnasium-style batched infos for a set of envs."""

    def __init__(self, views: Views, buf) -> None:
        self._views = views
        self._buf = buf
        self._cols: dict[int, tuple[str, _Column]] = {}

    def read(self, env_ids: np.ndarray | None) -> dict:
        """Infos of ``env_ids`` (all envs in order when None) from shared memory."""
        masks = self._views.info_mask if env_ids is None else self._views.info_mask[env_ids]
        bits = int(np.bitwise_or.reduce(masks)) if len(masks) else 0
        infos: dict = {}
        col = 0
        while bits:
            if bits & 1:
                name, column = self._column(col)
                present = (masks & np.uint64(column.bit)).astype(bool)
                values = column.values.copy() if env_ids is None else column.values[env_ids]
                values[~present] = 0
                infos[name] = values
                infos["_" + name] = present
            bits >>= 1
            col += 1
        return infos

    def _column(self, col: int):
        hit = self._cols.get(col)
        if hit is None:
            name, dtype = read_entry(self._views, col)
            hit = self._cols[col] = (name, _Column(col, dtype, self._views))
        return hit


def add_info(infos: dict, info: dict, index: int, size: int) -> dict:
    """Merge one env's info into batched ``infos`` at ``index`` (gymnasium's rules)."""
    for key, value in info.items():
        if key == "final_obs":  # gymnasium keeps final observations unbatched, one object per env
            array = infos.get(key)
            if array is None:
                array = np.full(size, fill_value=None, dtype=object)
            array[index] = value
        elif isinstance(value, dict):
            array = add_info(infos.get(key, {}), value, index, size)
        else:
            array = infos.get(key)
            if array is None:
                if type(value) in (int, float, bool) or issubclass(type(value), np.number):
                    array = np.zeros(size, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((size, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(size, fill_value=None, dtype=object)
            array[index] = value
        mask = infos.get(f"_{key}")
        if mask is None:
            mask = np.zeros(size, dtype=np.bool_)
        mask[index] = True
        infos[key], infos[f"_{key}"] = array, mask
    return infos


# Batch dtypes gymnasium gives python bool/int/float infos: their elements go back to
# python scalars, so an env's python scalar comes back equal and of its own type.
PYTHON_DTYPES = frozenset({np.dtype(bool), np.dtype(np.int64), np.dtype(np.float64)})


def info_element(batch: np.ndarray, i: int):
    """Env ``i``'s value of one batched info array: a python scalar for bool/int64/float64
    batches, a numpy scalar of the batch dtype otherwise, an array's own copy (not a view of
    the batch) for array infos, the object itself for object batches."""
    item = batch[i]
    if batch.dtype == object:
        return item
    if batch.ndim > 1:
        return item.copy()
    if batch.dtype in PYTHON_DTYPES:
        return item.item()
    return item


def unbatch_info(infos: dict, i: int) -> dict:
    """Env ``i``'s own info dict from gymnasium's vector layout (the inverse of ``add_info``).

    A key with a ``_key`` mask belongs to the envs the mask marks; a key without one (a
    batched env's own infos may have none) to every env; masks are not copied.  Nested
    dicts are recursed: kept when their mask marks env ``i``, or, with no mask, when they
    hold something for it."""
    out: dict = {}
    for key, value in infos.items():
        if isinstance(key, str) and key.startswith("_") and key[1:] in infos:
            continue   # a mask
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        if isinstance(value, dict):
            sub = unbatch_info(value, i)
            if sub or mask is not None:
                out[key] = sub
        else:
            out[key] = info_element(value, i)
    return out
