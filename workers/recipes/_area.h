/* OpenCV's INTER_AREA downscale (the generic, non-integer-ratio path of
 * cv::resize for uint8, one channel), fused with a two-frame max-pool.
 *
 * OpenCV (imgproc/src/resize.cpp, ResizeArea_Invoker with T=uchar, WT=float)
 * computes every output pixel as
 *     buf[dx]  = 0 + S[sx0]*ax0 + S[sx0+1]*ax1 + ...        (float, per source row)
 *     sum[dx]  = ay0*buf_row0[dx]; sum[dx] += ay1*buf_row1[dx]; ...
 *     D[dx]    = saturate_cast<uchar>(sum[dx])               (round half to even)
 * with the weights of computeResizeAreaTab rounded to float.  This file does the
 * same float operations in the same order, so the result is bit for bit
 * OpenCV's.  Taps are padded to a fixed count per output column/row with zero
 * weights: adding +0.0f to a non-negative float leaves it unchanged, so the
 * padding changes no bit.  Each source row's horizontal pass is computed once
 * (OpenCV repeats it for rows shared by two output rows; the values are equal).
 *
 * Must be compiled without floating-point contraction (-ffp-contract=off):
 * a fused multiply-add rounds once where OpenCV rounds twice.
 */
#ifndef SHMPOOL_AREA_H
#define SHMPOOL_AREA_H

#include <stdint.h>
#include <string.h>
#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The horizontal pass of one source row: m (w floats) -> h (dw floats). */
static inline void area_row(const float *restrict m, float *restrict h, int dw,
                            const int32_t *restrict xs, const float *restrict xw, int kx) {
    if (kx == 3) {   /* every ratio in (1, 2]: the Atari 160 -> 84 case, unrolled */
        for (int dx = 0; dx < dw; dx++) {
            const float *s = m + xs[dx];
            const float *w = xw + 3 * dx;
            float v = 0.0f;
            v = v + s[0] * w[0];
            v = v + s[1] * w[1];
            v = v + s[2] * w[2];
            h[dx] = v;
        }
        return;
    }
    for (int dx = 0; dx < dw; dx++) {
        const float *s = m + xs[dx];
        const float *w = xw + (size_t)kx * dx;
        float v = 0.0f;
        for (int k = 0; k < kx; k++)
            v = v + s[k] * w[k];
        h[dx] = v;
    }
}

/* saturate_cast<uchar>(float): round half to even (the current rounding mode,
 * as cvRound), then clamp to [0, 255]. */
static inline void area_store(const float *restrict sum, uint8_t *restrict d, int dw) {
    int dx = 0;
#if defined(__SSE2__)
    for (; dx + 16 <= dw; dx += 16) {
        __m128i a = _mm_cvtps_epi32(_mm_loadu_ps(sum + dx));
        __m128i b = _mm_cvtps_epi32(_mm_loadu_ps(sum + dx + 4));
        __m128i c = _mm_cvtps_epi32(_mm_loadu_ps(sum + dx + 8));
        __m128i e = _mm_cvtps_epi32(_mm_loadu_ps(sum + dx + 12));
        __m128i ab = _mm_packs_epi32(a, b), ce = _mm_packs_epi32(c, e);
        _mm_storeu_si128((__m128i *)(d + dx), _mm_packus_epi16(ab, ce));
    }
#endif
    for (; dx < dw; dx++) {
        long v = lrintf(sum[dx]);
        d[dx] = (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
}

#if defined(__SSE2__)
/* Four source rows at once, one row per SIMD lane: m4[x] = (float) max(a, b) of
 * rows y..y+3 at column x; then the taps (the same float operations per lane as
 * area_row) and a 4x4 transpose back into four rows of hbuf.  Needs sw % 16 == 0
 * and dw % 4 == 0 (the caller checks). */
static void area_rows4(const uint8_t *a, const uint8_t *b, int sw, int dw,
                       const int32_t *restrict xs, const float *restrict xw, int kx,
                       const __m128 *restrict xw4, __m128 *restrict m4, float *restrict h) {
    const __m128i zero = _mm_setzero_si128();
    for (int x = 0; x < sw; x += 16) {
        __m128i r[4];
        for (int l = 0; l < 4; l++) {
            r[l] = _mm_loadu_si128((const __m128i *)(a + (size_t)l * sw + x));
            if (b)
                r[l] = _mm_max_epu8(r[l], _mm_loadu_si128((const __m128i *)(b + (size_t)l * sw + x)));
        }
        /* bytes of rows 0..3 interleaved per column: [r0 r1 r2 r3] x 16 columns */
        __m128i r01lo = _mm_unpacklo_epi8(r[0], r[1]), r01hi = _mm_unpackhi_epi8(r[0], r[1]);
        __m128i r23lo = _mm_unpacklo_epi8(r[2], r[3]), r23hi = _mm_unpackhi_epi8(r[2], r[3]);
        __m128i q[4] = {_mm_unpacklo_epi16(r01lo, r23lo), _mm_unpackhi_epi16(r01lo, r23lo),
                        _mm_unpacklo_epi16(r01hi, r23hi), _mm_unpackhi_epi16(r01hi, r23hi)};
        for (int g = 0; g < 4; g++) {   /* q[g]: columns x+4g .. x+4g+3, four bytes each */
            __m128i lo = _mm_unpacklo_epi8(q[g], zero), hi = _mm_unpackhi_epi8(q[g], zero);
            m4[x + 4 * g + 0] = _mm_cvtepi32_ps(_mm_unpacklo_epi16(lo, zero));
            m4[x + 4 * g + 1] = _mm_cvtepi32_ps(_mm_unpackhi_epi16(lo, zero));
            m4[x + 4 * g + 2] = _mm_cvtepi32_ps(_mm_unpacklo_epi16(hi, zero));
            m4[x + 4 * g + 3] = _mm_cvtepi32_ps(_mm_unpackhi_epi16(hi, zero));
        }
    }
    for (int dx = 0; dx < dw; dx += 4) {
        __m128 v[4];
        if (kx == 3) {   /* every ratio in (1, 2]: the Atari 160 -> 84 case, unrolled */
            for (int j = 0; j < 4; j++) {
                const __m128 *s = m4 + xs[dx + j];
                const __m128 *w = xw4 + 3 * (dx + j);
                __m128 acc = _mm_mul_ps(s[0], w[0]);   /* 0 + p == p exactly */
                acc = _mm_add_ps(acc, _mm_mul_ps(s[1], w[1]));
                v[j] = _mm_add_ps(acc, _mm_mul_ps(s[2], w[2]));
            }
        } else for (int j = 0; j < 4; j++) {
            const __m128 *s = m4 + xs[dx + j];
            const float *w = xw + (size_t)kx * (dx + j);
            __m128 acc = _mm_setzero_ps();
            for (int k = 0; k < kx; k++)
                acc = _mm_add_ps(acc, _mm_mul_ps(s[k], _mm_set1_ps(w[k])));
            v[j] = acc;
        }
        _MM_TRANSPOSE4_PS(v[0], v[1], v[2], v[3]);   /* v[l]: row l, columns dx..dx+3 */
        for (int l = 0; l < 4; l++)
            _mm_storeu_ps(h + (size_t)l * dw + dx, v[l]);
    }
}
#endif

/* dst (dh x dw) <- INTER_AREA(max(a, b)) of a, b (sh x sw, row-major uint8);
 * b may be NULL (no max-pool).  xw4: the x weights, each repeated 4 times
 * (dw*kx*4 floats, 16-byte aligned); m: 4*sw floats of scratch, 16-byte aligned;
 * hbuf: sh*dw floats; sum: dw floats.  xs/xw: dw first taps and dw*kx weights;
 * ys/yw likewise for rows.  Padded taps point inside the source and weigh 0. */
static void area_pool_resize(const uint8_t *restrict a, const uint8_t *restrict b, int sh, int sw,
                             uint8_t *restrict dst, int dh, int dw,
                             const int32_t *xs, const float *xw, const float *xw4, int kx,
                             const int32_t *ys, const float *yw, int ky,
                             float *restrict m, float *restrict hbuf, float *restrict sum) {
    int y = 0;
#if defined(__SSE2__)
    if (sw % 16 == 0 && dw % 4 == 0) {
        for (; y + 4 <= sh; y += 4)
            area_rows4(a + (size_t)y * sw, b ? b + (size_t)y * sw : NULL, sw, dw, xs, xw, kx,
                       (const __m128 *)xw4, (__m128 *)m, hbuf + (size_t)y * dw);
    }
#endif
    for (; y < sh; y++) {
        const uint8_t *ra = a + (size_t)y * sw;
        if (b) {
            const uint8_t *rb = b + (size_t)y * sw;
            for (int x = 0; x < sw; x++) {
                uint8_t p = ra[x], q = rb[x];
                m[x] = (float)(p > q ? p : q);
            }
        } else {
            for (int x = 0; x < sw; x++)
                m[x] = (float)ra[x];
        }
        area_row(m, hbuf + (size_t)y * dw, dw, xs, xw, kx);
    }
    for (int dy = 0; dy < dh; dy++) {
        const float *w = yw + (size_t)ky * dy;
        const float *h = hbuf + (size_t)ys[dy] * dw;
        for (int dx = 0; dx < dw; dx++)
            sum[dx] = w[0] * h[dx];
        for (int k = 1; k < ky; k++) {
            const float *hk = h + (size_t)k * dw;
            float wk = w[k];
            for (int dx = 0; dx < dw; dx++)
                sum[dx] = sum[dx] + wk * hk[dx];
        }
        area_store(sum, dst + (size_t)dy * dw, dw);
    }
}

#endif
