"""One env's row of gymnasium's batched infos: ``unbatch_info``, the inverse of ``VectorEnv._add_info``.

Apart from ``infos.py`` (the shared-memory columns) because the SB3 face, the worker's batched
shards and ``gym_compat`` (which rebuilds gymnasium 0.29's layout from an env's own info) read rows
too, and ``gym_compat`` sits below ``layout``, which ``infos`` imports."""
from __future__ import annotations

import numpy as np

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
