# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Atari frame kernel: max-pool of two grey frames, OpenCV's INTER_AREA resize and the
frame-stack push, in one pass and without the GIL.

:class:`AreaPush` reproduces ``cv2.resize(np.maximum(a, b), (dw, dh),
interpolation=cv2.INTER_AREA)`` bit for bit wherever OpenCV takes its generic area
path (both ratios >= 1, not both integers: see :func:`area_is_generic`), and writes
the result straight into the newest slot of a ``(stack, dh, dw)`` uint8 frame stack.
"""
import math

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, uint8_t
from libc.string cimport memcpy, memmove

cnp.import_array()

cdef extern from "_area.h" nogil:
    void area_pool_resize(const uint8_t *a, const uint8_t *b, int sh, int sw,
                          uint8_t *dst, int dh, int dw,
                          const int32_t *xs, const float *xw, const float *xw4, int kx,
                          const int32_t *ys, const float *yw, int ky,
                          float *m, float *hbuf, float *sum)


def area_is_generic(src_hw, dst_hw) -> bool:
    """Whether ``cv2.resize(INTER_AREA)`` from ``src_hw`` to ``dst_hw`` (``(height, width)``)
    takes OpenCV's generic area path (the one :class:`AreaPush` reproduces): a downscale in
    both directions (ratios >= 1) that is not an integer ratio in both."""
    (sh, sw), (dh, dw) = src_hw, dst_hw
    if min(sh, sw, dh, dw) < 1:
        return False
    # cv::resize: inv_scale = dsize / ssize; scale = 1 / inv_scale (doubles)
    scale_x, scale_y = 1.0 / (<double> dw / <double> sw), 1.0 / (<double> dh / <double> sh)
    if scale_x < 1 or scale_y < 1:
        return False
    eps = 2.220446049250313e-16
    return not (abs(scale_x - round(scale_x)) < eps and abs(scale_y - round(scale_y)) < eps)


def area_taps(ssize: int, dsize: int):
    """OpenCV's ``computeResizeAreaTab`` for one axis, padded to a fixed tap count.

    Returns ``(first, weights)``: ``first`` int32 ``(dsize,)``, the first source index of
    each output's taps, and ``weights`` float32 ``(dsize, k)``, the weights of source
    indices ``first[d] .. first[d] + k - 1`` in OpenCV's order (zeros where padded)."""
    ssize, dsize = int(ssize), int(dsize)
    scale = 1.0 / (<double> dsize / <double> ssize)   # cv::resize's scale, in doubles
    taps = []
    for d in range(dsize):
        fs1 = d * scale
        fs2 = fs1 + scale
        cell = min(scale, ssize - fs1)
        s1, s2 = math.ceil(fs1), math.floor(fs2)
        s2 = min(s2, ssize - 1)
        s1 = min(s1, s2)
        row = []
        if s1 - fs1 > 1e-3:
            row.append((s1 - 1, (s1 - fs1) / cell))
        for s in range(s1, s2):
            row.append((s, 1.0 / cell))
        if fs2 - s2 > 1e-3:
            row.append((s2, min(min(fs2 - s2, 1.0), cell) / cell))
        taps.append(row)
    k = max(len(row) for row in taps)
    first = np.zeros(dsize, np.int32)
    weights = np.zeros((dsize, k), np.float32)
    for d, row in enumerate(taps):
        # pad on the left where the taps would run past the source's end
        start = min(row[0][0], ssize - k)
        first[d] = start
        for s, w in row:
            weights[d, s - start] = np.float32(w)   # OpenCV's (float) cast of a double
    return first, weights


cdef class AreaPush:
    """Max-pool, INTER_AREA resize and frame-stack push for frames of ``src_hw`` ->
    ``dst_hw`` (``(height, width)``; requires :func:`area_is_generic`)."""
    cdef int sh, sw, dh, dw, kx, ky
    cdef object xs, xw, ys, yw, scratch
    cdef int32_t *pxs
    cdef int32_t *pys
    cdef float *pxw
    cdef float *pxw4
    cdef float *pyw
    cdef float *pm
    cdef float *ph
    cdef float *psum

    def __init__(self, src_hw, dst_hw):
        if not area_is_generic(src_hw, dst_hw):
            raise ValueError(f"{src_hw} -> {dst_hw} is not OpenCV's generic INTER_AREA downscale")
        self.sh, self.sw = src_hw
        self.dh, self.dw = dst_hw
        xs, xw = area_taps(self.sw, self.dw)
        ys, yw = area_taps(self.sh, self.dh)
        self.xs, self.xw = np.ascontiguousarray(xs), np.ascontiguousarray(xw)
        self.ys, self.yw = np.ascontiguousarray(ys), np.ascontiguousarray(yw)
        self.kx, self.ky = xw.shape[1], yw.shape[1]
        # One float32 block, 16-byte aligned for the SIMD rows: the x weights repeated 4 times
        # (one per lane), m (4 * sw), hbuf (sh * dw), sum (dw).
        cdef Py_ssize_t i, nw = xw.size * 4
        self.scratch = np.zeros(nw + 4 * self.sw + self.sh * self.dw + self.dw + 4, np.float32)
        self.pxs = <int32_t *> cnp.PyArray_DATA(self.xs)
        self.pys = <int32_t *> cnp.PyArray_DATA(self.ys)
        self.pxw = <float *> cnp.PyArray_DATA(self.xw)
        self.pyw = <float *> cnp.PyArray_DATA(self.yw)
        self.pxw4 = <float *> ((<size_t> cnp.PyArray_DATA(self.scratch) + 15) & ~(<size_t> 15))
        for i in range(nw):
            self.pxw4[i] = self.pxw[i // 4]
        self.pm = self.pxw4 + nw
        self.ph = self.pm + 4 * self.sw
        self.psum = self.ph + self.sh * self.dw

    def resize(self, const uint8_t[:, ::1] newer, const uint8_t[:, ::1] older, uint8_t[:, ::1] out):
        """``out[...] = cv2.resize(max(newer, older), ...)``; ``older`` may be None (no max)."""
        self._check(newer, older, out.shape[0], out.shape[1])
        with nogil:
            self._resize(&newer[0, 0], NULL if older is None else &older[0, 0], &out[0, 0])

    def push(self, const uint8_t[:, ::1] newer, const uint8_t[:, ::1] older, uint8_t[:, :, ::1] stack,
             bint fill):
        """Shift ``stack`` (``(n, dh, dw)`` uint8, oldest first) down by one frame and write the
        resized max of ``newer`` and ``older`` (None: ``newer`` alone) into its last slot; with
        ``fill``, write it into every slot instead (a new game's padding)."""
        cdef Py_ssize_t n = stack.shape[0], slot = <Py_ssize_t> self.dh * self.dw
        cdef Py_ssize_t i
        self._check(newer, older, stack.shape[1], stack.shape[2])
        if n < 1:
            raise ValueError("empty frame stack")
        cdef uint8_t *base = &stack[0, 0, 0]
        with nogil:
            if not fill and n > 1:
                memmove(base, base + slot, (n - 1) * slot)
            self._resize(&newer[0, 0], NULL if older is None else &older[0, 0], base + (n - 1) * slot)
            if fill:
                for i in range(n - 1):
                    memcpy(base + i * slot, base + (n - 1) * slot, slot)

    cdef int _check(self, const uint8_t[:, ::1] newer, const uint8_t[:, ::1] older,
                    Py_ssize_t h, Py_ssize_t w) except -1:
        if newer is None:
            raise ValueError("newer frame is None")
        if newer.shape[0] != self.sh or newer.shape[1] != self.sw:
            raise ValueError(f"frame must be {(self.sh, self.sw)}, got {(newer.shape[0], newer.shape[1])}")
        if older is not None and (older.shape[0] != self.sh or older.shape[1] != self.sw):
            raise ValueError(f"frame must be {(self.sh, self.sw)}, got {(older.shape[0], older.shape[1])}")
        if h != self.dh or w != self.dw:
            raise ValueError(f"output must be {(self.dh, self.dw)}, got {(h, w)}")
        return 0

    cdef void _resize(self, const uint8_t *a, const uint8_t *b, uint8_t *dst) noexcept nogil:
        area_pool_resize(a, b, self.sh, self.sw, dst, self.dh, self.dw,
                         self.pxs, self.pxw, self.pxw4, self.kx, self.pys, self.pyw, self.ky,
                         self.pm, self.ph, self.psum)
