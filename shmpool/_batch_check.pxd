# What other extensions cimport of _batch_check.pyx: a whole batch's check as a C call.
cimport numpy as cnp
from libc.stdint cimport int64_t


cdef class BatchCheck:
    cdef cnp.dtype dtype
    cdef int ndim
    cdef cnp.npy_intp dims[64]   # numpy's NPY_MAXDIMS
    cdef int scan
    cdef int64_t lo, hi
    cdef double limit   # the largest magnitude the slot's float dtype holds (HUGE_VAL otherwise)

    cdef int whole(self, object actions)   # check(), as a C call
    cdef bint _values_pass(self, cnp.ndarray a)
