# cython: boundscheck=False, wraparound=False
"""A whole batch of actions checked in one C call (``check``: the fast path of every sync step's action check),
and the same value scan for a batch of any rows (``values_pass``: ``send``'s env ids).

Beside busy workers every Python call of a step is paid cold: the checks of one batch (its type, dtype and
shape, its contiguity, then one scan of its values) cost a RayPool's driver ~30 µs of each Pong step, and its
node's pool the same again (issue 34).  This does them in one call; a batch it cannot judge alone (another
dtype or shape, values it refuses, a space whose values it does not scan) goes back to the Python check, which
names the envs."""
from libc.math cimport HUGE_VAL, fabs, isfinite, isnan
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t

import numpy as np

cimport numpy as cnp
from cpython.object cimport PyObject

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    bint PyArray_EquivTypes(cnp.dtype, cnp.dtype)

cdef enum:
    C_NOT_WHOLE = 0
    C_PASSED = 1
    C_CHECK_IN_PYTHON = 2
    C_SHAPE_ONLY = 0
    C_INT_RANGE = 1
    C_NO_NAN = 2
    C_FINITE = 3
    C_UNSCANNED = 4
    MAX_DIMS = 64   # numpy's NPY_MAXDIMS

# What check() says of a batch
NOT_WHOLE = C_NOT_WHOLE               # not one array of exactly the slot's dtype and shape: the general path
PASSED = C_PASSED                     # the whole batch, its values passed (or are not checked)
CHECK_IN_PYTHON = C_CHECK_IN_PYTHON   # the whole batch, its values for the Python check (refused, or not scanned)

# Which values a check scans
SHAPE_ONLY = C_SHAPE_ONLY   # none (strict=False)
INT_RANGE = C_INT_RANGE     # integers in [lo, hi) (Discrete, MultiBinary)
NO_NAN = C_NO_NAN           # floats not NaN (a Box with no finite bound)
FINITE = C_FINITE           # floats finite (a Box with a finite bound: the Python check judges inf per element)
UNSCANNED = C_UNSCANNED     # the Python check scans them (MultiDiscrete's per-element bounds, other spaces)


cdef inline int64_t _int_at(const char* p, int size, bint signed) noexcept:
    if size == 8:   # int64 (uint64 is not scanned here)
        return (<const int64_t*>p)[0]
    if size == 4:
        return (<const int32_t*>p)[0] if signed else (<const uint32_t*>p)[0]
    if size == 2:
        return (<const int16_t*>p)[0] if signed else (<const uint16_t*>p)[0]
    return (<const int8_t*>p)[0] if signed else (<const uint8_t*>p)[0]


cdef inline double _float_at(const char* p, int size) noexcept:
    return (<const double*>p)[0] if size == 8 else (<const float*>p)[0]


cdef int _scan(cnp.ndarray a, int scan, int64_t lo, int64_t hi, double limit) noexcept:
    """C_PASSED, or C_CHECK_IN_PYTHON for a value refused or a dtype not scanned here (``a``: C-contiguous, native
    byte order).  ``limit``: the largest magnitude the slot's float dtype holds; a finite value beyond it would
    become infinite in the slot (float64 1e39 into float32)."""
    cdef const char* data = <const char*>cnp.PyArray_DATA(a)
    cdef Py_ssize_t i, n = cnp.PyArray_SIZE(a)
    cdef int size = cnp.PyArray_ITEMSIZE(a)
    cdef char kind = (<cnp.dtype><PyObject*>cnp.PyArray_DESCR(a)).kind
    cdef int64_t v
    cdef double x
    cdef bint integer = kind == b'i' or (kind == b'u' and size < 8)   # uint64 may not fit int64
    if scan == C_INT_RANGE and integer and (size == 1 or size == 2 or size == 4 or size == 8):
        for i in range(n):
            v = _int_at(data + i * size, size, kind == b'i')
            if v < lo or v >= hi:
                return C_CHECK_IN_PYTHON
        return C_PASSED
    if (scan == C_NO_NAN or scan == C_FINITE) and kind == b'f' and (size == 4 or size == 8):
        for i in range(n):
            x = _float_at(data + i * size, size)
            if isnan(x) or (scan == C_FINITE and not isfinite(x)) or (isfinite(x) and fabs(x) > limit):
                return C_CHECK_IN_PYTHON
        return C_PASSED
    return C_CHECK_IN_PYTHON


cdef class BatchCheck:
    """The check of a whole batch for one action slot: an array of exactly ``dtype`` and ``shape`` (the slot's,
    rows first) whose values pass ``scan`` (one of the constants above; ``lo``/``hi``: INT_RANGE's bounds)."""

    # its fields are declared in _batch_check.pxd

    def __init__(self, cnp.dtype dtype, tuple shape, int scan, int64_t lo=0, int64_t hi=0):
        if len(shape) > MAX_DIMS:
            raise ValueError(f"{len(shape)} dimensions; numpy has at most {MAX_DIMS}")
        self.ndim = len(shape)
        for i, n in enumerate(shape):
            self.dims[i] = n
        self.dtype, self.scan, self.lo, self.hi = dtype, scan, lo, hi
        self.limit = float(np.finfo(dtype).max) if dtype.kind == "f" else HUGE_VAL

    def check(self, object actions) -> int:
        """NOT_WHOLE, PASSED or CHECK_IN_PYTHON for ``actions`` (see above)."""
        return self.whole(actions)

    cdef int whole(self, object actions):
        cdef cnp.ndarray a
        cdef int i
        cdef cnp.dtype dtype
        if type(actions) is not cnp.ndarray:
            return C_NOT_WHOLE
        a = <cnp.ndarray>actions
        if cnp.PyArray_NDIM(a) != self.ndim:
            return C_NOT_WHOLE
        for i in range(self.ndim):
            if cnp.PyArray_DIM(a, i) != self.dims[i]:
                return C_NOT_WHOLE
        dtype = <cnp.dtype><PyObject*>cnp.PyArray_DESCR(a)
        if dtype is not self.dtype and not PyArray_EquivTypes(dtype, self.dtype):
            return C_NOT_WHOLE
        return C_PASSED if self._values_pass(a) else C_CHECK_IN_PYTHON

    def values_pass(self, object actions) -> bool:
        """Whether the values of ``actions`` (an ndarray of any rows and dtype) pass this check's scan in C; False
        when the Python check must judge them (refused, not scanned here, not C-contiguous in native order)."""
        return type(actions) is cnp.ndarray and self._values_pass(<cnp.ndarray>actions)

    cdef bint _values_pass(self, cnp.ndarray a):
        if self.scan == C_SHAPE_ONLY:
            return True
        if self.scan == C_UNSCANNED or not cnp.PyArray_ISCARRAY_RO(a) or cnp.PyArray_ISBYTESWAPPED(a):
            return False
        return _scan(a, self.scan, self.lo, self.hi, self.limit) == C_PASSED
