"""Per-env info dicts: numeric scalars through shared memory, the rest aside.

Workers register each numeric info key once in a small registry in the shared
region (claimed with a compare-and-swap, so any worker may be first) and then
write values into that key's column; a per-env 64-bit mask says which columns
the latest result set.  Anything else (strings, arrays, nested dicts, a 65th
key) travels on the worker's side channel and is merged by ``add_info``, which
follows gymnasium's ``VectorEnv._add_info`` layout: a dict of batched arrays,
each with a boolean ``_key`` mask.

SAME_STEP autoreset adds ``final_obs``/``final_info`` for the envs whose episode
ended.  A final observation that fits the region's ``final_obs`` arrays is
written there by the worker, which marks the result with the ``_final_obs``
column; numeric leaves of its final info (nested dicts too) get columns named
``_final_info<SEP>key<SEP>...``.  The numeric leaves of an env's own nested dicts
(``RecordEpisodeStatistics``' ``episode``) get columns named ``_info<SEP>key<SEP>...``:
an ending episode then costs no pickling.  Env keys never start with ``_`` (such keys are
never given a column), so these names cannot clash with an env's.
"""
from __future__ import annotations

import os
import time

import numpy as np

from . import _core
from .gym_compat import FINAL_OBS_AS_OBJECTS, KEEP_NESTED_VALUES
from .info_rows import info_element
from .layout import INFO_COLUMNS, INFO_ENTRY, INFO_NAME_BYTES, Views
from .pids import alive
from .spacetree import tree_of

# A registry entry's state word: FREE, READY, or claiming: ``pid << 2 | CLAIMING`` while the
# worker ``pid`` writes the name.  The pid lets the others free a claim whose writer died.
FREE, CLAIMING, READY = 0, 1, 2
_STATE_BITS = 3
_CHECK_CLAIMANT_S = 0.001     # a claim held this long: is its writer still alive?
DTYPES = [np.dtype(c) for c in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8")]
_CODE = {dt: i for i, dt in enumerate(DTYPES)}
# A column's kind (its registry code): a numpy scalar type (the codes of DTYPES), or a python bool,
# int or float, stored as bool/int64/float64.  Kept apart because gymnasium keeps them apart: a
# batch that mixes them (None and floats: an object array) holds each value as the env gave it.
PY_BOOL, PY_INT, PY_FLOAT = len(DTYPES), len(DTYPES) + 1, len(DTYPES) + 2
STORAGE = [*DTYPES, np.dtype(bool), np.dtype(np.int64), np.dtype(np.float64)]
_PY_KIND = {bool: PY_BOOL, int: PY_INT, float: PY_FLOAT}

FINAL_OBS_COLUMN = "_final_obs"     # bool column: this result's final observation is in the final_obs arrays
FINAL_INFO_COLUMN = "_final_info"   # first part of the names of final-info columns
NESTED_INFO_COLUMN = "_info"        # first part of the names of columns inside an env's own nested dicts
SEP = "\x1f"                         # joins the parts of a nested column's name
_FEW_ROWS = 4   # at most this many envs reporting infos: ``InfoReader.read`` copies their rows one by one
# Own keys whose dicts always go aside: gymnasium's SAME_STEP names (their columns are the final-info ones).
_NOT_NESTED = ("final_info", "final_obs")


class _InSlot:
    __slots__ = ()

    def __repr__(self) -> str:
        return "IN_SLOT"


# What a worker's shard puts as an info's ``final_obs`` when it wrote the final observation into the
# region's final_obs arrays; ``InfoWriter.write`` turns it into the ``_final_obs`` column's bit.
IN_SLOT = _InSlot()


def column_kind(value) -> int | None:
    """The column kind of this value (its type's), if gymnasium batches it as a number that fits
    an 8-byte column; None otherwise."""
    t = type(value)
    kind = _PY_KIND.get(t)
    if kind is not None:
        return kind
    # np.bool_ is no np.number: gymnasium batches it as an object array, so it never gets a column.
    if issubclass(t, np.number):
        return _CODE.get(np.dtype(t))
    return None


def column_dtype(value) -> np.dtype | None:
    """The batch dtype gymnasium would give this value, if it fits an 8-byte column."""
    kind = column_kind(value)
    return None if kind is None else STORAGE[kind]


class _Column:
    __slots__ = ("bit", "kind", "dtype", "values", "types")

    def __init__(self, col: int, kind: int, views: Views) -> None:
        self.bit = 1 << col
        self.kind = kind
        self.dtype = dtype = STORAGE[kind]
        raw = views.info_values[col]
        self.values = np.ndarray(raw.shape[:1], dtype=dtype, buffer=raw, strides=(8,))
        # The python types whose values ``column_dtype`` maps to this column's dtype (it
        # depends on the type alone): a value of one of them is stored without asking again.
        self.types: set[type] = set()


class InfoWriter:
    """Worker side: writes one env's info dict, returns what did not fit."""

    def __init__(self, views: Views, buf) -> None:
        self._views = views
        self._buf = buf
        self._mask = views.info_mask
        self._cols: dict = {}   # key -> _Column, or None when the key cannot use shm
        self._nested_cols: dict = {}   # (name prefix, *key path) -> _Column or None
        self._final_bit = 0

    def write(self, env_id: int, info: dict) -> dict | None:
        """Write ``info`` of env ``env_id``'s latest result; returns what needs the side channel.

        ``{"final_obs": IN_SLOT, "final_info": {...}, ...}`` (SAME_STEP, in that order): the
        final observation is in the final_obs arrays; the final info's numeric leaves get
        final-info columns, the rest is returned under ``"final_info"``."""
        if not info:
            self._mask[env_id] = 0
            return None
        if not isinstance(info, dict):
            raise TypeError(f"info must be a dict, got {type(info).__name__}")
        bits = 0
        extra = None
        in_slot = False
        cols = self._cols
        for key, value in info.items():
            col = cols.get(key)
            # Every step of every env comes here: a known key's value goes straight to its column.
            if col is not None:
                bit = _store(col, env_id, value)
                if bit:
                    bits |= bit
                    continue
            if value is IN_SLOT:
                bits |= self._final_bit
                in_slot = True
                continue
            prefix = _nested_prefix(key, value, in_slot)
            if prefix is not None:
                more, rest = self._write_nested(env_id, value, prefix)
                bits |= more
                if rest is not None:
                    if extra is None:
                        extra = {}
                    extra[key] = rest
                continue
            bit = _store(self.column(key, value), env_id, value)
            if bit:
                bits |= bit
                continue
            if extra is None:
                extra = {}
            extra[key] = value
        self._mask[env_id] = bits
        return extra

    def reserve_final_obs(self) -> None:
        """SAME_STEP: claim the ``_final_obs`` column at start-up, before any env key can fill
        the registry, so a final observation in the slot can always be announced."""
        col = self._claim(FINAL_OBS_COLUMN, PY_BOOL)
        if col is None:
            raise RuntimeError("the info registry has no room for the _final_obs column")
        self._final_bit = col.bit

    def _write_nested(self, env_id: int, info: dict, path: tuple) -> tuple[int, dict | None]:
        """The numeric leaves of a nested dict (``path``: its column names' prefix and keys) into
        their columns: returns their bits and what is left for the side channel (None: nothing).
        A non-empty dict is recursed into; an empty one goes aside (its ``_key`` mask needs it)."""
        bits = 0
        rest = None
        for key, value in info.items():
            if type(value) is dict and value and _column_part(key):
                more, left = self._write_nested(env_id, value, (*path, key))
                bits |= more
                if left is None:
                    continue
                value = left
            else:
                where = (*path, key)
                col = self._nested_cols.get(where, False)
                if col is False:
                    col = self._nested_cols[where] = self._register_nested(where, value)
                bit = _store(col, env_id, value)
                if bit:
                    bits |= bit
                    continue
            if rest is None:
                rest = {}
            rest[key] = value
        return bits, rest

    def _register_nested(self, where: tuple, value) -> _Column | None:
        kind = column_kind(value)
        if kind is None or not all(_column_part(k) for k in where[1:]):
            return None
        return self._claim(SEP.join(where), kind)

    def column(self, key, value) -> _Column | None:
        """The shared-memory column of ``key`` (registered at its first value, whose type
        gives the dtype), or None when the key cannot use shared memory."""
        col = self._cols.get(key, False)
        if col is False:
            col = self._cols[key] = self._register(key, value)
        return col

    def _register(self, key, value) -> _Column | None:
        kind = column_kind(value)
        # "final_obs" never: gymnasium keeps it an object array of per-env values whatever they are.
        if kind is None or not _column_name(key) or key == "final_obs":
            return None
        return self._claim(key, kind)

    def _claim(self, key: str, kind: int) -> _Column | None:
        """The column named ``key`` of ``kind``: found in the registry or claimed there;
        None when the name is too long, the registry is full or the name has another kind."""
        name = key.encode("utf-8")
        if len(name) > INFO_NAME_BYTES:
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
                entry[4:8] = np.frombuffer(np.uint32(kind).tobytes(), np.uint8)
                entry[8:] = 0
                entry[8:8 + len(name)] = np.frombuffer(name, np.uint8)
                _core.store_word(self._buf, off, READY)
                return _Column(col, kind, self._views)
            if _core.load_word(self._buf, off) & _STATE_BITS == CLAIMING and not self._await_claim(off):
                continue  # its writer died mid-claim and the entry is free again: try it ourselves
            got_name, got_kind = read_entry(self._views, col)
            if got_name == key:
                return _Column(col, got_kind, self._views) if got_kind == kind else None
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


def _nested_prefix(key, value, in_slot: bool) -> tuple | None:
    """The column-name prefix of a dict value whose numeric leaves get columns: SAME_STEP's final
    info once its observation is in the slot, or an env's own non-empty dict; None otherwise."""
    if type(value) is not dict:
        return None
    if key == "final_info":
        return (FINAL_INFO_COLUMN,) if in_slot else None
    return (NESTED_INFO_COLUMN, key) if value and _column_part(key) and key not in _NOT_NESTED else None


def _store(col: _Column | None, env_id: int, value) -> int:
    """``value`` into env ``env_id``'s row of ``col``: the column's bit, or 0 when there is no
    column or the value does not fit it (another dtype, out of range)."""
    if col is None:
        return 0
    kind = type(value)
    if kind not in col.types:
        # Only a value of exactly this column's kind: anything else (None, a string, another
        # number type, np.float64 in a float's column) goes aside whole, never cast into it.
        if column_kind(value) != col.kind:
            return 0
        col.types.add(kind)
    try:
        col.values[env_id] = value
        return col.bit
    except OverflowError:
        return 0


def _column_name(key) -> bool:
    """Whether an env's info key can name a column: a str that is not a mask's name, and whose
    name survives the registry (utf-8, and no NUL, which pads the names there)."""
    if type(key) is not str or key.startswith("_") or "\x00" in key:
        return False
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:   # a lone surrogate: gymnasium keeps it as it is, so must we
        return False
    return True


def _column_part(key) -> bool:
    """Whether a key can be part of a final-info column's name."""
    return _column_name(key) and SEP not in key


def read_entry(views: Views, col: int) -> tuple[str, int]:
    """A registry entry: the column's name and kind."""
    entry = views.info_registry[col * INFO_ENTRY:(col + 1) * INFO_ENTRY]
    code = int(entry[4:8].view(np.uint32)[0])
    raw = entry[8:].tobytes().rstrip(b"\0")
    return raw.decode("utf-8"), code


class InfoReader:
    """Parent side: builds gymnasium-style batched infos for a set of envs.

    ``obs_space``: the single-env observation space, needed to hand back final
    observations from the region's final_obs arrays (SAME_STEP)."""

    def __init__(self, views: Views, buf, obs_space=None) -> None:
        self._views = views
        self._buf = buf
        self._obs_tree = None if obs_space is None else tree_of(obs_space)
        # col -> (name, column, path): path None for an env's own key, () for the final-obs
        # column, else the key path from the top of the infos (``("final_info", ...)`` for a
        # final-info column, ``(key, ...)`` inside an env's own nested dict).
        self._cols: dict[int, tuple[str, _Column, tuple | None]] = {}
        # A mask of columns -> their (name, column) when all are an env's own keys, else None.
        self._plain: dict[int, list[tuple[str, _Column]] | None] = {}
        self._final_obs_bit = 0   # the final-obs column's bit, once a result has set it
        # A mask of columns -> read's plan for them (its general path), or None when their paths
        # nest (_paths_nest: the batch is then built env by env).
        self._general: dict[int, list | None] = {}

    def read(self, env_ids: np.ndarray | None) -> dict:
        """Infos of ``env_ids`` (all envs in order when None) from shared memory."""
        masks = self._views.info_mask if env_ids is None else self._views.info_mask.take(env_ids)
        bits, common, reporting = _core.mask_summary(masks, _FEW_ROWS)
        if not bits:
            return {}
        if bits == self._final_obs_bit:
            # SAME_STEP's common case: some episodes ended and no env reported an info.
            infos: dict = {}
            self._final_obs(infos, masks.astype(bool), env_ids)
            return infos
        if bits == common:
            # The common case (every env set the same keys): nothing to mask or zero.
            plain = self._plain.get(bits, False)
            if plain is False:
                plain = self._plain[bits] = self._plain_columns(bits)
            if plain is not None:
                return self._read_present(plain, env_ids, len(masks))
        plan = self._general.get(bits, False)
        if plan is False:
            plan = self._general[bits] = None if self._paths_nest(bits) else [
                (name, column, path, np.uint64(column.bit), column.dtype.type(0))
                for name, column, path in self._columns_of(bits)]
        if plan is None:
            return self._read_in_env_order(bits, masks, env_ids)
        infos = {}
        ended = None
        # Usually a few envs report (their episodes ended): building each column's batch from
        # those rows costs a third of masking all of them, column by column.
        if reporting is not None:
            reporting = [(pos, m, pos if env_ids is None else int(env_ids[pos])) for pos, m in reporting]
        for name, column, path, bit, zero in plan:
            if reporting is not None:
                present, values = _from_rows(column, reporting, len(masks))
            else:
                present, values = (masks & bit) != 0, None
            if path == ():
                ended = present
                continue
            if values is None:
                # Zero where absent, as gymnasium's batch: one new array, never a view of the column.
                values = np.where(present, column.values if env_ids is None else column.values[env_ids], zero)
            if path is None:
                infos[name] = values
                infos["_" + name] = present
            elif path[0] == "final_info":   # SAME_STEP's: _final_info is the final-obs mask
                _put_nested(infos.setdefault("final_info", {}), path[1:], values, present)
            else:
                _put_nested(infos, path, values, present)
        if ended is not None:
            self._final_obs(infos, ended, env_ids)
        return infos

    def _columns_of(self, bits: int) -> list:
        out = []
        col = 0
        while bits:
            if bits & 1:
                out.append(self._column(col))
            bits >>= 1
            col += 1
        return out

    def _paths_nest(self, bits: int) -> bool:
        """Whether one column's key path lies inside another's (a key that is a dict in some envs'
        infos and a number in others'): ``read`` then builds the batch env by env."""
        paths = [(name,) if path is None else path for name, _, path in self._columns_of(bits) if path != ()]
        return any(a != b and b[:len(a)] == a for a in paths for b in paths)

    def _read_in_env_order(self, bits: int, masks: np.ndarray, env_ids: np.ndarray | None) -> dict:
        """gymnasium's batching of each env's own info, added env by env (``add_info``): where a key
        is a dict for one env and a number for another, the order of the envs decides the batch, as
        in ``VectorEnv._add_info``."""
        infos: dict = {}
        for pos, own in enumerate(self._each(bits, masks, env_ids)):
            if own:
                add_info(infos, own, pos, len(masks))
        return infos

    def read_each(self, env_ids: np.ndarray | None) -> list[dict]:
        """Each env's own info dict (``env_ids``' order, all envs when None) from shared memory, as
        the env gave it: a column's numbers come back python's or numpy's as the column holds them;
        SAME_STEP's ``final_obs`` and ``final_info`` come first, as gymnasium adds them."""
        masks = self._views.info_mask if env_ids is None else self._views.info_mask.take(env_ids)
        bits = int(np.bitwise_or.reduce(masks)) if len(masks) else 0
        return self._each(bits, masks, env_ids)

    def _each(self, bits: int, masks: np.ndarray, env_ids: np.ndarray | None) -> list[dict]:
        own: list[dict] = [{} for _ in range(len(masks))]
        columns = self._columns_of(bits)
        for _, column, path in columns:
            if path == ():   # the final-obs column: SAME_STEP's keys first
                for pos in np.flatnonzero(masks & np.uint64(column.bit)).tolist():
                    own[pos]["final_obs"] = self._final_obs_of(pos if env_ids is None else int(env_ids[pos]))
                    own[pos]["final_info"] = {}
        for name, column, path in columns:
            if path == ():
                continue
            values = column.values if env_ids is None else column.values[env_ids]
            for pos in np.flatnonzero(masks & np.uint64(column.bit)).tolist():
                value = values[pos] if column.kind < PY_BOOL else values[pos].item()
                if path is None:
                    own[pos][name] = value
                    continue
                where = own[pos]
                for key in path[:-1]:
                    where = where.setdefault(key, {})
                where[path[-1]] = value
        return own

    def _plain_columns(self, bits: int) -> list[tuple[str, _Column]] | None:
        """The (name, column) of every column in ``bits``, in column order; None when one of
        them is the final-obs column or a nested one (those need ``read``'s general path)."""
        columns = self._columns_of(bits)
        if any(path is not None for _, _, path in columns):
            return None
        return [(name, column) for name, column, _ in columns]

    @staticmethod
    def _read_present(plain: list[tuple[str, _Column]], env_ids: np.ndarray | None, n: int) -> dict:
        """``read`` when every env of the batch set exactly the columns of ``plain``."""
        infos: dict = {}
        every = np.ones(n, dtype=bool)
        for name, column in plain:
            infos[name] = column.values.copy() if env_ids is None else column.values.take(env_ids)
            infos["_" + name] = every.copy()   # each key its own mask, as gymnasium's
        return infos

    def _final_obs(self, infos: dict, ended: np.ndarray, env_ids: np.ndarray | None) -> None:
        """gymnasium's SAME_STEP layout for the envs whose final observation is in the slot:
        ``final_obs`` an object array (None elsewhere) of fresh copies, ``final_info`` a dict
        (``{}`` when their final infos were empty), each with its bool mask."""
        out = np.empty(len(ended), dtype=object)   # all None
        for pos in ended.nonzero()[0].tolist():   # np.flatnonzero costs 1 µs more
            out[pos] = self._final_obs_of(pos if env_ids is None else int(env_ids[pos]))
        infos["final_obs"], infos["_final_obs"] = out, ended
        infos.setdefault("final_info", {})
        infos["_final_info"] = ended.copy()

    def _final_obs_of(self, env: int):
        """Env ``env``'s final observation from the slot, a fresh copy."""
        leaves = self._views.final_obs
        if len(leaves) == 1 and leaves[0].ndim > 1 and self._obs_tree.is_leaf:
            return leaves[0][env].copy()
        return self._obs_tree.assemble([np.array(leaf[env]) for leaf in leaves])   # a 0-d leaf stays an array

    def _column(self, col: int):
        hit = self._cols.get(col)
        if hit is None:
            name, kind = read_entry(self._views, col)
            if name == FINAL_OBS_COLUMN:
                path = ()
                self._final_obs_bit = 1 << col
            elif name.startswith(FINAL_INFO_COLUMN + SEP):
                path = ("final_info", *name.split(SEP)[1:])
            elif name.startswith(NESTED_INFO_COLUMN + SEP):
                path = tuple(name.split(SEP)[1:])
            else:
                path = None
            hit = self._cols[col] = (name, _Column(col, kind, self._views), path)
        return hit


def _from_rows(column: _Column, reporting: list[tuple[int, int, int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """A column's batch of ``n`` (its present mask and its values, zero where absent) from the
    ``(position, mask, env id)`` of the few envs that reported infos."""
    present = np.zeros(n, dtype=bool)
    values = np.zeros(n, dtype=column.dtype)
    src, bit = column.values, column.bit
    for pos, mask, env in reporting:
        if mask & bit:
            present[pos] = True
            values[pos] = src[env]
    return present, values


def _put_nested(infos: dict, path: tuple, values: np.ndarray, present: np.ndarray) -> None:
    """``values`` at ``path`` inside nested batched ``infos``; every dict on the way gets its
    ``_key`` mask or'ed with ``present`` (gymnasium marks a dict for every env that has it)."""
    for key in path[:-1]:
        mask = infos.get("_" + key)
        infos["_" + key] = present.copy() if mask is None else mask | present
        infos = infos.setdefault(key, {})
    infos[path[-1]] = values
    infos["_" + path[-1]] = present


def add_info(infos: dict, info: dict, index: int, size: int, nested: bool = False) -> dict:
    """Merge one env's info into batched ``infos`` at ``index`` (gymnasium's rules); ``nested``: ``info`` is a dict
    inside an env's info.  Where ``KEEP_NESTED_VALUES`` says so, its leaves, and arrays of another shape or dtype
    than the batch's, keep the env's values (one object per env; 1.x raises numpy's broadcast error there)."""
    for key, value in info.items():
        if key == "final_obs" and FINAL_OBS_AS_OBJECTS:  # gymnasium keeps final observations unbatched
            array = infos.get(key)
            if array is None:
                array = np.full(size, fill_value=None, dtype=object)
            array[index] = value
        elif isinstance(value, dict):
            array = add_info(infos.get(key, {}), value, index, size, nested=True)
        else:
            array = infos.get(key)
            if array is None:
                if type(value) in (int, float, bool) or issubclass(type(value), np.number):
                    array = np.zeros(size, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((size, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(size, fill_value=None, dtype=object)
            elif KEEP_NESTED_VALUES and (nested or getattr(array, "ndim", 0) > 1) and not _holds(array, value):
                # 0.29 keeps such a value (inside a dict, or an array of another shape or dtype) as the env gave it
                array = _as_objects(array)
            array[index] = value
        mask = infos.get(f"_{key}")
        if mask is None:
            mask = np.zeros(size, dtype=np.bool_)
        mask[index] = True
        infos[key], infos[f"_{key}"] = array, mask
    return infos


def _holds(array: np.ndarray | dict, value) -> bool:
    """Whether ``array`` stores ``value`` unchanged: any value in an object array, an array of the row's shape and
    dtype, a scalar of the array's own dtype.  ``array`` may be a dict (the key was a dict in an earlier env):
    gymnasium then stores the value in it under the env's index, and so does :func:`add_info`."""
    if not isinstance(array, np.ndarray) or array.dtype == object:
        return True
    if isinstance(value, np.ndarray):
        return value.shape == array.shape[1:] and value.dtype == array.dtype
    if type(value) in (int, float, bool) or isinstance(value, np.generic):
        return np.dtype(type(value)) == array.dtype
    return False


def _as_objects(array: np.ndarray) -> np.ndarray:
    """``array``'s rows as one object each, of the type each env gave (:func:`~.info_rows.info_element`)."""
    out = np.empty(len(array), dtype=object)
    for i in range(len(array)):
        out[i] = info_element(array, i)
    return out


def collides(infos: dict, extra: dict) -> bool:
    """Whether an env's side-channel ``extra`` holds a key that shared-memory ``infos`` already
    batched (a value that changed type, or did not fit its column): nested dicts are followed,
    ``final_obs`` is an object array that takes anything."""
    for key, value in extra.items():
        have = infos.get(key)
        if have is None or key == "final_obs":
            continue
        if type(have) is dict and type(value) is dict:
            if collides(have, value):
                return True
            continue
        return True
    return False


def merge_in_env_order(own: list[dict], extras: list[tuple[int, dict]]) -> dict:
    """gymnasium's batched infos, rebuilt env by env in order from each env's own info in shared
    memory (``InfoReader.read_each``) and its side-channel ``extras`` (position, dict): the first env
    to hold a key decides its array (``add_info``), as in ``VectorEnv._add_info``."""
    aside = dict(extras)
    out: dict = {}
    for pos, info in enumerate(own):
        more = aside.get(pos)
        if more:
            info = _merged(info, more)
        if info:
            add_info(out, info, pos, len(own))
    return out


def _merged(own: dict, more: dict) -> dict:
    """One env's info from its two halves (columns, side channel); dicts in both are merged."""
    out = dict(own)
    for key, value in more.items():
        have = out.get(key)
        out[key] = _merged(have, value) if type(have) is dict and type(value) is dict else value
    return out
