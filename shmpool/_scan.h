/* Whether a batch needs more than its arrays, in one pass over two per-env
 * arrays the workers write beside their results (not in the control region):
 * a status byte (nonzero: the env has a side-channel message, an error or
 * extra infos) and an info mask (nonzero: numeric infos in shared memory, one
 * bit per info column).  A batch where no env reports skips every Python-side
 * read; the masks' summary tells the info reader which columns to read. */
#ifndef SHMPOOL_SCAN_H
#define SHMPOOL_SCAN_H

#include <stddef.h>
#include <stdint.h>

/* Bits of a scan's answer. */
enum {
    SHM_SCAN_SIDE_MESSAGE = 1,   /* some env of the batch has a side-channel message */
    SHM_SCAN_NUMERIC_INFO = 2,   /* some env of the batch has numeric infos in shared memory */
};

/* Every env's status byte and info mask. */
static inline int shm_scan_all(const uint8_t *status, const uint64_t *info_masks, ptrdiff_t num_envs) {
    int flags = 0;
    for (ptrdiff_t i = 0; i < num_envs; i++) {
        if (status[i])
            flags |= SHM_SCAN_SIDE_MESSAGE;
        if (info_masks[i])
            flags |= SHM_SCAN_NUMERIC_INFO;
    }
    return flags;
}

/* The envs ids[0:n].  Returns -1 at the first id outside [0, num_envs), its
 * position in *bad. */
static inline int shm_scan_ids(const uint8_t *status, const uint64_t *info_masks, ptrdiff_t num_envs,
                               const int32_t *ids, ptrdiff_t n, ptrdiff_t *bad) {
    int flags = 0;
    for (ptrdiff_t i = 0; i < n; i++) {
        int32_t e = ids[i];
        if (e < 0 || e >= num_envs) {
            *bad = i;
            return -1;
        }
        if (status[e])
            flags |= SHM_SCAN_SIDE_MESSAGE;
        if (info_masks[e])
            flags |= SHM_SCAN_NUMERIC_INFO;
    }
    return flags;
}

/* A batch's info masks: their OR into *any, their AND into *every (0 for no
 * masks); returns how many are nonzero. */
static inline ptrdiff_t shm_mask_summary(const uint64_t *masks, ptrdiff_t n, uint64_t *any, uint64_t *every) {
    ptrdiff_t count = 0;
    uint64_t m, union_ = 0, common = n ? ~(uint64_t)0 : 0;
    for (ptrdiff_t i = 0; i < n; i++) {
        m = masks[i];
        union_ |= m;
        common &= m;
        if (m)
            count += 1;
    }
    *any = union_;
    *every = common;
    return count;
}

#endif
