# cython: language_level=3, boundscheck=False, wraparound=False
"""EnvPool's ``info["elapsed_step"]``: how far each env is into the episode its observation belongs to.

Kept by the parent for the EnvPool face, one pass per result batch: the numpy version of the same
bookkeeping was eight fancy-index operations (~10 us per step or recv, on a core the workers share).
Arguments are taken as ndarrays (raw data pointers) rather than typed memoryviews, whose set-up
costs more than this loop does for a batch of a few envs.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, uint8_t

cnp.import_array()


cdef inline bint _is(cnp.ndarray a, int typenum, Py_ssize_t n):
    return (cnp.PyArray_TYPE(a) == typenum and cnp.PyArray_NDIM(a) == 1
            and cnp.PyArray_DIM(a, 0) == n and cnp.PyArray_IS_C_CONTIGUOUS(a))


cdef class ElapsedSteps:
    """Per-env step counts since the episode began.

    ``advance(ids, terminated, truncated)`` takes one batch of step results (``ids`` int32, the
    flags bool, all ``(n,)``) and returns the ``(n,)`` int32 counts of those rows.  Under NEXT_STEP
    (``same_step`` False) the result after an ended one is the reset, counted 0; under SAME_STEP
    the ending step's row already holds the reset observation, so it counts 0 itself."""
    cdef readonly cnp.ndarray count     # int32 (num_envs,)
    cdef readonly cnp.ndarray ended     # bool (num_envs,): the next result of this env is a reset
    cdef readonly bint same_step
    cdef Py_ssize_t num_envs

    def __init__(self, Py_ssize_t num_envs, bint same_step):
        self.num_envs = num_envs
        self.same_step = same_step
        self.count = np.zeros(num_envs, dtype=np.int32)
        self.ended = np.ones(num_envs, dtype=np.bool_)   # nothing has been reset yet

    def advance(self, cnp.ndarray ids, cnp.ndarray terminated, cnp.ndarray truncated) -> np.ndarray:
        cdef Py_ssize_t n = cnp.PyArray_SIZE(ids), k
        if not (_is(ids, cnp.NPY_INT32, n) and _is(terminated, cnp.NPY_BOOL, n) and _is(truncated, cnp.NPY_BOOL, n)):
            raise TypeError("advance() takes (n,) C-contiguous int32 ids and bool flags of the same length")
        cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, cnp.PyArray_DIMS(ids), cnp.NPY_INT32, 0)
        cdef int32_t *e = <int32_t *>cnp.PyArray_DATA(ids)
        cdef uint8_t *term = <uint8_t *>cnp.PyArray_DATA(terminated)
        cdef uint8_t *trunc = <uint8_t *>cnp.PyArray_DATA(truncated)
        cdef int32_t *count = <int32_t *>cnp.PyArray_DATA(self.count)
        cdef uint8_t *ended = <uint8_t *>cnp.PyArray_DATA(self.ended)
        cdef int32_t *res = <int32_t *>cnp.PyArray_DATA(out)
        cdef int32_t i, c
        cdef bint done
        for k in range(n):
            if e[k] < 0 or e[k] >= self.num_envs:
                raise IndexError(f"env id {e[k]} is out of range for {self.num_envs} envs")
        for k in range(n):
            i = e[k]
            done = term[k] or trunc[k]
            c = 0 if ended[i] or (done and self.same_step) else count[i] + 1
            count[i] = c
            ended[i] = done and not self.same_step
            res[k] = c
        return out

    def restart(self, ids) -> None:
        """``ids`` were reset (None: every env): their counts start again at 0."""
        sel = slice(None) if ids is None else ids
        self.count[sel] = 0
        self.ended[sel] = False

    def end_all(self) -> None:
        """Every env's next result is its reset (``async_reset``)."""
        self.ended[:] = True

    def rows(self, ids) -> np.ndarray:
        """The current counts of ``ids``, a new int32 array."""
        return self.count[ids]
