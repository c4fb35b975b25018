# cython: language_level=3, boundscheck=False, wraparound=False
"""The arrays of a direct connection's frames, and the driver's join of the pools' rows, in C: what every
step pays on both ends.

A step's request and answer are a few plain arrays (a Pong answer: 12 of them).  In Python,
checking them, naming their layout and making byte views to send cost ~1 µs an array on the
sending side, and rebuilding them from the received bytes as much again on the other
(``np.frombuffer`` + ``reshape``): ~80 µs of every Pong call on a quiet machine, twice that
under load, all of it between the trainer's action and its observation.  Here each is a
fraction of a microsecond.  The frame's format is unchanged (see channel.py).
"""
import numpy as np

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from libc.string cimport memcpy, memset

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    PyTypeObject PyArray_Type
    bint PyDataType_REFCHK(cnp.dtype)
    object PyArray_NewFromDescr(PyTypeObject* subtype, cnp.dtype descr, int nd, cnp.npy_intp* dims,
                                cnp.npy_intp* strides, void* data, int flags, object obj)

cdef enum:
    ALIGN = 16   # channel.ALIGN: each array's offset in a frame's body
    SMALL_BYTES = 4096   # an array below this is copied into its neighbours' part instead of sent as its own

cdef cnp.dtype BYTE = np.dtype(np.uint8)


cdef inline bint _plain(object a):
    """An ndarray of exactly that type, C-contiguous, whose dtype has no fields and holds no objects."""
    if type(a) is not np.ndarray:
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>a
    cdef cnp.dtype d = <cnp.dtype><PyObject*>cnp.PyArray_DESCR(arr)
    return cnp.PyArray_IS_C_CONTIGUOUS(arr) and not cnp.PyDataType_HASFIELDS(d) and not PyDataType_REFCHK(d)


def is_plain(obj) -> bool:
    """Whether ``obj`` can travel as its raw bytes: an ndarray of exactly that type, C-contiguous, whose dtype has
    no fields and holds no objects (structured and object arrays are pickled whole)."""
    return _plain(obj)


def plain_layout(list arrays):
    """A key for the arrays' dtypes and shapes when every one is plain (see ``_plain``), else None.

    Equal keys mean equal layouts: a dtype is named by its identity, so whoever keeps a key must
    keep its arrays' dtypes alive too."""
    return _layout_key(arrays)


cdef object _layout_key(list arrays):
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


cdef class RowsFramer:
    """The frame parts of a step's answer (rows: ids, obs, rew, term, trunc and flat infos of plain arrays) in the
    layout of the last one remembered, without naming the layout again in Python: its info keys (each exactly a
    ``str``) and its arrays' :func:`plain_layout` are compared with the remembered ones, and the remembered prefix
    and pads frame it (:func:`frame_parts`).

    An actor answers every step in the same layout; finding it in :class:`~.channel.Layouts`' map took ~30 µs of
    the actor's serial path a Pong step beside its busy worker (issue 34)."""

    cdef tuple fixed   # (keys, layout key, prefix, pads, dtypes kept alive for the key): swapped whole

    def remember(self, tuple keys, tuple key, bytes prefix, tuple pads, tuple dtypes):
        """Frame answers of info keys ``keys`` and arrays of layout ``key`` with ``prefix`` and ``pads``;
        ``dtypes``: the arrays' dtypes, which ``key`` names by identity."""
        self.fixed = (keys, key, prefix, pads, dtypes)

    def parts(self, rows):
        """``rows``' frame parts when they are in the remembered layout; None otherwise."""
        cdef tuple fixed = self.fixed
        if fixed is None:
            return None
        cdef tuple keys = <tuple>fixed[0]
        cdef object infos = rows.infos
        if type(infos) is not dict or len(<dict>infos) != len(keys):
            return None
        cdef list arrays = [rows.ids, rows.obs, rows.rew, rows.term, rows.trunc]
        cdef Py_ssize_t i = 0
        for k, v in (<dict>infos).items():
            if type(k) is not str or (k is not keys[i] and k != keys[i]):
                return None
            arrays.append(v)
            i += 1
        if _layout_key(arrays) != fixed[1]:
            return None
        return frame_parts(<bytes>fixed[2], <tuple>fixed[3], arrays)


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
    after ``pads[i]`` zero bytes (``pads[i] < 16``).  Every part is a 1-D buffer of bytes.

    An array of at least SMALL_BYTES is its own part, a view of its memory; everything between two such
    arrays (the prefix, pads, small arrays) is copied into one ``bytes``.  A Pong answer is then 3 parts
    instead of 32: a ``sendmsg`` of many small pieces cost more than copying them (44 against 38 µs for
    the answer's send and receive on a quiet machine, issue 34)."""
    cdef Py_ssize_t n = len(arrays), i, start = 0, size = len(prefix), nbytes
    if len(pads) != n:
        raise ValueError(f"{len(pads)} pads for {n} arrays")
    cdef list parts = []
    cdef bytes head = prefix   # the prefix starts the first run of small pieces
    for i in range(n):
        nbytes = cnp.PyArray_NBYTES(<cnp.ndarray>arrays[i])
        size += <Py_ssize_t>pads[i]
        if nbytes < SMALL_BYTES:
            size += nbytes
            continue
        parts.append(_run(head, pads, arrays, start, i, size))   # the pieces before it, its own pad included
        parts.append(_bytes_of(<cnp.ndarray>arrays[i]))
        head, start, size = None, i + 1, 0
    if size or not parts:
        parts.append(_run(head, pads, arrays, start, n, size))
    return parts


cdef bytes _run(bytes head, tuple pads, list arrays, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t size):
    """``size`` bytes: ``head`` (or nothing), each of ``arrays[start:stop]`` after its pad, then the pad of
    ``arrays[stop]`` when there is one (the big array that ends the run)."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef char* to = PyBytes_AS_STRING(out)
    cdef char* end = to + size
    cdef Py_ssize_t i, k
    cdef cnp.ndarray arr
    if head is not None:
        memcpy(to, PyBytes_AS_STRING(head), len(head))
        to += len(head)
    for i in range(start, stop):
        k = pads[i]
        memset(to, 0, k)
        to += k
        arr = <cnp.ndarray>arrays[i]
        k = cnp.PyArray_NBYTES(arr)
        memcpy(to, cnp.PyArray_DATA(arr), k)
        to += k
    if stop < len(arrays):
        k = pads[stop]
        memset(to, 0, k)
        to += k
    if to != end:
        raise AssertionError(f"a run of {size} bytes filled {size - (end - to)}")
    return out


cdef Py_ssize_t _spans(Py_ssize_t start, tuple layout, list out) except -1:
    """Where the arrays of ``layout`` (``(dtype, shape)`` pairs) lie when laid from ``start``, each at the next
    16-aligned offset: ``(offset, bytes)`` of each appended to ``out`` (unless None).  Returns the offset past the
    last one: the length of a body of that layout."""
    cdef Py_ssize_t at = start, n
    cdef cnp.dtype dtype
    cdef tuple shape
    for dtype, shape in layout:
        if len(shape) > 64:   # NPY_MAXDIMS is 64 since numpy 2
            raise ValueError(f"an array of {len(shape)} dimensions")
        n = dtype.itemsize
        for d in shape:
            if d < 0:
                raise ValueError(f"an array of shape {shape}")
            n *= <Py_ssize_t>d
        at += (ALIGN - at % ALIGN) % ALIGN
        if out is not None:
            out.append((at, n))
        at += n
    return at


def layout_end(Py_ssize_t start, tuple layout) -> int:
    """The length of a body whose arrays (``layout``: ``(dtype, shape)`` pairs) are laid from ``start``, each at the
    next 16-aligned offset."""
    return _spans(start, layout, None)


def array_offsets(Py_ssize_t start, tuple layout) -> list:
    """Where each array of ``layout`` lies in a body whose arrays are laid from ``start`` (see :func:`layout_end`)."""
    cdef list spans = []
    _spans(start, layout, spans)
    return [at for at, _ in spans]


cpdef check_length(Py_ssize_t size, Py_ssize_t expected):
    """ValueError unless a frame's body of ``size`` bytes is as long as its layout says (``expected``)."""
    if size != expected:
        raise ValueError(f"a frame of {size} bytes is {'shorter' if size < expected else 'longer'} than its "
                         f"arrays' layout ({expected} bytes)")


cdef inline bint _is_bytes_array(object a):
    """A 1-D C-contiguous ndarray (exactly) of bytes."""
    if type(a) is not np.ndarray:
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>a
    return (cnp.PyArray_NDIM(arr) == 1 and cnp.PyArray_IS_C_CONTIGUOUS(arr)
            and cnp.PyArray_TYPE(arr) == cnp.NPY_UINT8)


def frame_meta(object body, Py_ssize_t count, Py_ssize_t meta_len) -> bytes:
    """The pickle of a frame's ``body`` (array sizes, pickle, arrays: a 1-D uint8 array, or any buffer of bytes),
    whose header gave ``count`` arrays and ``meta_len`` pickle bytes.  ValueError when the body is too short to
    hold it."""
    cdef Py_ssize_t at = 8 * count
    if not _is_bytes_array(body):
        body = np.frombuffer(body, np.uint8)
    if count < 0 or meta_len < 0 or at + meta_len > cnp.PyArray_DIM(<cnp.ndarray>body, 0):
        raise ValueError(f"a frame of {len(body)} bytes cannot hold {count} array sizes and a pickle of "
                         f"{meta_len} bytes")
    return PyBytes_FromStringAndSize(<char*>cnp.PyArray_DATA(<cnp.ndarray>body) + at, meta_len)


def arrays_at(object body, Py_ssize_t start, tuple layout):
    """The arrays of ``layout`` (``(dtype, shape)`` pairs) laid in ``body`` from ``start``, each at the next
    16-aligned offset: writable arrays over ``body``'s memory, which they keep alive.  ValueError
    when ``body`` is not exactly that long."""
    cdef cnp.ndarray flat
    if _is_bytes_array(body):
        flat = <cnp.ndarray>body   # a body from FrameInbox: already what np.frombuffer would make
    else:
        flat = np.frombuffer(body, np.uint8)   # holds an export: ``body`` cannot be resized
    cdef char* data = <char*>cnp.PyArray_DATA(flat)
    cdef list spans = []
    check_length(cnp.PyArray_DIM(flat, 0), _spans(start, layout, spans))
    cdef cnp.npy_intp dims[64]
    cdef cnp.dtype dtype
    cdef tuple shape
    cdef int ndim, i
    cdef Py_ssize_t k
    cdef list out = []
    cdef cnp.ndarray arr
    for k in range(len(layout)):
        dtype, shape = layout[k]
        ndim = len(shape)
        for i in range(ndim):
            dims[i] = shape[i]
        Py_INCREF(dtype)   # PyArray_NewFromDescr steals it
        arr = PyArray_NewFromDescr(&PyArray_Type, dtype, ndim, dims, NULL, data + <Py_ssize_t>spans[k][0],
                                   cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_WRITEABLE, None)
        cnp.set_array_base(arr, flat)
        out.append(arr)
    return out


cdef extern from "numpy/arrayobject.h":
    bint PyArray_EquivTypes(cnp.dtype, cnp.dtype)
    bint PyArray_ISNOTSWAPPED(cnp.ndarray)


def concat_rows(list blocks):
    """Blocks of rows joined column by column: ``blocks[b][c]`` is block ``b``'s array of column ``c``, and the
    result's column ``c`` is those arrays one after the other along axis 0, as ``np.concatenate`` would give.

    Only for columns of plain arrays (see ``_plain``), native byte order, at least one dimension, one dtype and
    one row shape in every block; None when any column is otherwise (``np.concatenate`` takes those).  Joining
    two blocks of a Pong answer this way costs the copies and little else, against ~2 µs a column in numpy's
    own call and ~15 µs of checks around them."""
    cdef list first = blocks[0], out = []
    cdef Py_ssize_t c, b, i, rows, nblocks = len(blocks)
    cdef cnp.ndarray a, f, joined
    cdef cnp.npy_intp dims[64]
    cdef int ndim
    cdef char* at
    for b in range(1, nblocks):
        if len(<list>blocks[b]) != len(first):
            return None
    for c in range(len(first)):
        if not _plain(first[c]):
            return None
        f = <cnp.ndarray>first[c]
        ndim = cnp.PyArray_NDIM(f)
        if ndim == 0 or not PyArray_ISNOTSWAPPED(f):
            return None
        rows = 0
        for b in range(nblocks):
            obj = (<list>blocks[b])[c]
            if not _plain(obj):
                return None
            a = <cnp.ndarray>obj
            if cnp.PyArray_NDIM(a) != ndim or not PyArray_ISNOTSWAPPED(a):
                return None
            if cnp.PyArray_DESCR(a) != cnp.PyArray_DESCR(f) and not PyArray_EquivTypes(
                    <cnp.dtype><PyObject*>cnp.PyArray_DESCR(a), <cnp.dtype><PyObject*>cnp.PyArray_DESCR(f)):
                return None
            for i in range(1, ndim):
                if cnp.PyArray_DIM(a, i) != cnp.PyArray_DIM(f, i):
                    return None
            rows += cnp.PyArray_DIM(a, 0)
        dims[0] = rows
        for i in range(1, ndim):
            dims[i] = cnp.PyArray_DIM(f, i)
        dtype = <cnp.dtype><PyObject*>cnp.PyArray_DESCR(f)
        Py_INCREF(dtype)   # PyArray_NewFromDescr steals it
        joined = PyArray_NewFromDescr(&PyArray_Type, dtype, ndim, dims, NULL, NULL, 0, None)
        at = <char*>cnp.PyArray_DATA(joined)
        for b in range(nblocks):
            a = <cnp.ndarray>(<list>blocks[b])[c]
            memcpy(at, cnp.PyArray_DATA(a), cnp.PyArray_NBYTES(a))
            at += cnp.PyArray_NBYTES(a)
        out.append(joined)
    return out


def join_frames(list frames, Py_ssize_t skip=-1):
    """The columns of several frames' arrays joined straight from the frames, without making each frame's arrays:
    ``frames[f]`` is ``(body, start, layout)`` as :func:`arrays_at` takes them, and column ``c`` of the result is
    the frames' ``c``-th arrays one after the other along axis 0.  Column ``skip`` (when given) is not read: it
    is None in the result (the caller has it already, read straight into place).

    None when the layouts do not agree (see :class:`JoinPlan`; the caller joins the arrays instead).  ValueError
    when a body is not exactly as long as its layout says.  Beside two busy workers, making two Pong answers' 24
    arrays and their ``Rows`` before joining them cost the driver 35–50 µs more (issue 34)."""
    plan = JoinPlan.of([(<tuple>f)[1:] for f in frames], skip)
    return None if plan is None else plan.join([(<tuple>f)[0] for f in frames])


cdef class JoinPlan:
    """How the arrays of frames laid out as ``places`` join, column by column: ``places[f]`` is ``(start,
    layout)`` of frame ``f`` (as :func:`arrays_at` takes them), and column ``c`` of a join is the frames' ``c``-th
    arrays one after the other along axis 0.  Column ``skip`` (when given) is not joined.

    Made once for a run of frames in the same layouts (a sync step's answers, step after step): then a join
    only checks each body's length and copies, instead of checking and placing every frame's arrays again
    (issue 34: beside busy workers every check is paid cold)."""

    cdef Py_ssize_t nf, ncol, skip
    cdef list sizes     # each frame's body length
    cdef list spans     # spans[f * ncol + c]: (offset, bytes) of frame f's c-th array in its body
    cdef list columns   # (dtype, shape) of each joined column

    @staticmethod
    def of(list places, Py_ssize_t skip=-1):
        """The plan for frames laid out as ``places``, or None when their layouts do not agree: each frame must
        have as many arrays, and its ``c``-th array the same dtype, the same number of dimensions (at least one)
        and the same row shape as every other frame's."""
        cdef JoinPlan plan = JoinPlan.__new__(JoinPlan)
        cdef tuple first = <tuple>(<tuple>places[0])[1], layout, shape, fshape
        cdef cnp.dtype dtype, fdtype
        cdef Py_ssize_t f, c, rows, start
        plan.nf, plan.ncol, plan.skip = len(places), len(first), skip
        plan.sizes, plan.spans, plan.columns = [], [], []
        for f in range(plan.nf):
            start, layout = places[f]
            if len(layout) != plan.ncol:
                return None
            for c in range(plan.ncol):
                dtype, shape = layout[c]
                fdtype, fshape = first[c]
                if len(shape) == 0 or len(shape) != len(fshape) or shape[1:] != fshape[1:]:
                    return None
                if dtype is not fdtype and not PyArray_EquivTypes(dtype, fdtype):
                    return None
            plan.sizes.append(_spans(start, layout, plan.spans))
        for c in range(plan.ncol):
            fdtype, fshape = first[c]
            rows = 0
            for f in range(plan.nf):
                rows += <Py_ssize_t>(<tuple>(<tuple>(<tuple>(<tuple>places[f])[1])[c])[1])[0]
            plan.columns.append((fdtype, (rows, *fshape[1:])))
        return plan

    def join(self, list bodies):
        """The joined columns of ``bodies`` (one per frame, 1-D uint8 arrays), column ``skip`` None.  ValueError
        when a body is not exactly as long as its layout says."""
        cdef Py_ssize_t f, c, at, n, i
        cdef cnp.ndarray body, joined
        cdef cnp.dtype dtype
        cdef tuple shape
        cdef int ndim
        cdef cnp.npy_intp dims[64]
        cdef char* to
        cdef list out = []
        if len(bodies) != self.nf:
            raise ValueError(f"{len(bodies)} bodies for a plan of {self.nf} frames")
        for f in range(self.nf):
            check_length(cnp.PyArray_DIM(<cnp.ndarray?>bodies[f], 0), self.sizes[f])
        for c in range(self.ncol):
            if c == self.skip:
                out.append(None)
                continue
            dtype, shape = self.columns[c]
            ndim = len(shape)
            for i in range(ndim):
                dims[i] = shape[i]
            Py_INCREF(dtype)   # PyArray_NewFromDescr steals it
            joined = PyArray_NewFromDescr(&PyArray_Type, dtype, ndim, dims, NULL, NULL, 0, None)
            to = <char*>cnp.PyArray_DATA(joined)
            for f in range(self.nf):
                body = <cnp.ndarray>bodies[f]
                at, n = self.spans[f * self.ncol + c]
                memcpy(to, <char*>cnp.PyArray_DATA(body) + at, n)
                to += n
            out.append(joined)
        return out
