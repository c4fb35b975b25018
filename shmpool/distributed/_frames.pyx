# cython: language_level=3, boundscheck=False, wraparound=False
"""The arrays of a direct connection's frames, in C: what every step pays on both ends.

A step's request and answer are a few plain arrays (a Pong answer: 12 of them).  In Python,
checking them, naming their layout and making byte views to send cost ~1 µs an array on the
sending side, and rebuilding them from the received bytes as much again on the other
(``np.frombuffer`` + ``reshape``): ~80 µs of every Pong call on a quiet machine, twice that
under load, all of it between the trainer's action and its observation.  Here each is a
fraction of a microsecond.  The frame's format is unchanged (see channel.py).
"""
import numpy as np

cimport numpy as cnp
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    PyTypeObject PyArray_Type
    bint PyDataType_REFCHK(cnp.dtype)
    object PyArray_NewFromDescr(PyTypeObject* subtype, cnp.dtype descr, int nd, cnp.npy_intp* dims,
                                cnp.npy_intp* strides, void* data, int flags, object obj)

cdef enum:
    ALIGN = 16   # channel.ALIGN: each array's offset in a frame's body

cdef cnp.dtype BYTE = np.dtype(np.uint8)
cdef tuple ZEROS = tuple(bytes(n) for n in range(ALIGN))


cdef inline bint _plain(object a):
    """An ndarray of exactly that type, C-contiguous, whose dtype has no fields and holds no objects."""
    if type(a) is not np.ndarray:
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>a
    cdef cnp.dtype d = <cnp.dtype><PyObject*>cnp.PyArray_DESCR(arr)
    return cnp.PyArray_IS_C_CONTIGUOUS(arr) and not cnp.PyDataType_HASFIELDS(d) and not PyDataType_REFCHK(d)


def plain_layout(list arrays):
    """A key for the arrays' dtypes and shapes when every one is plain (see ``_plain``), else None.

    Equal keys mean equal layouts: a dtype is named by its identity, so whoever keeps a key must
    keep its arrays' dtypes alive too."""
    cdef list key = []
    cdef cnp.ndarray arr
    cdef int i
    for a in arrays:
        if not _plain(a):
            return None
        arr = <cnp.ndarray>a
        key.append(<Py_ssize_t>cnp.PyArray_DESCR(arr))
        key.append(cnp.PyArray_NDIM(arr))
        for i in range(cnp.PyArray_NDIM(arr)):
            key.append(cnp.PyArray_DIM(arr, i))
    return tuple(key)


cdef cnp.ndarray _bytes_of(cnp.ndarray arr):
    """A 1-D uint8 array over ``arr``'s memory, holding ``arr``."""
    cdef cnp.npy_intp n = cnp.PyArray_NBYTES(arr)
    Py_INCREF(BYTE)   # PyArray_NewFromDescr steals it
    cdef cnp.ndarray view = PyArray_NewFromDescr(&PyArray_Type, BYTE, 1, &n, NULL, cnp.PyArray_DATA(arr),
                                                 cnp.NPY_ARRAY_C_CONTIGUOUS, None)
    cnp.set_array_base(view, arr)
    return view


def frame_parts(bytes prefix, tuple pads, list arrays):
    """A frame's parts to send: ``prefix`` (header, array sizes, pickle), then each plain array's bytes
    after ``pads[i]`` zero bytes (``pads[i] < 16``).  Every part is a 1-D buffer of bytes."""
    cdef list parts = [prefix]
    cdef Py_ssize_t i
    for i in range(len(arrays)):
        if pads[i]:
            parts.append(ZEROS[pads[i]])
        parts.append(_bytes_of(<cnp.ndarray>arrays[i]))
    return parts


def arrays_at(object body, Py_ssize_t start, tuple layout):
    """The arrays of ``layout`` (``(dtype, shape)`` pairs) laid in ``body`` from ``start``, each at the next
    16-aligned offset: writable arrays over ``body``'s memory, which they keep alive.  ValueError
    when ``body`` is not exactly that long."""
    cdef cnp.ndarray flat = np.frombuffer(body, np.uint8)   # holds an export: ``body`` cannot be resized
    cdef char* data = <char*>cnp.PyArray_DATA(flat)
    cdef Py_ssize_t size = cnp.PyArray_DIM(flat, 0), at = start, n
    cdef cnp.npy_intp dims[64]   # NPY_MAXDIMS is 64 since numpy 2
    cdef cnp.dtype dtype
    cdef tuple shape
    cdef int ndim, i
    cdef list out = []
    cdef cnp.ndarray arr
    for dtype, shape in layout:
        ndim = len(shape)
        if ndim > 64:
            raise ValueError(f"an array of {ndim} dimensions")
        n = dtype.itemsize
        for i in range(ndim):
            dims[i] = shape[i]
            n *= dims[i]
        at += (ALIGN - at % ALIGN) % ALIGN
        if n < 0 or at + n > size:
            raise ValueError(f"a frame of {size} bytes is shorter than its arrays' layout")
        Py_INCREF(dtype)   # PyArray_NewFromDescr steals it
        arr = PyArray_NewFromDescr(&PyArray_Type, dtype, ndim, dims, NULL, data + at,
                                   cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_WRITEABLE, None)
        cnp.set_array_base(arr, flat)
        out.append(arr)
        at += n
    if at != size:
        raise ValueError(f"a frame of {size} bytes is longer than its arrays' layout ({at} bytes)")
    return out
