/* The control region's map, and the counters in it.
 *
 * The parent and every worker map the same bytes and compute the same addresses
 * from here: a header of four lines, then one block per worker, then the rings
 * (_rings.h).  A LINE is two cache lines, so that adjacent-line prefetching
 * cannot make two writers share one.  Each worker's block is two lines: line A
 * written only by the parent, line B only by the worker.
 *
 * The counters are signal words (three words: value, sleeper's flag, the
 * sleeper's target; see _waiting.h): the sync counter (shards finished), the
 * doorbell (completions published), and per worker its command sequence and
 * the sequence it has handled.  Counters only grow (mod 2**32), so a waiter
 * compares against a target instead of resetting flags. */
#ifndef SHMPOOL_CONTROL_H
#define SHMPOOL_CONTROL_H

#include <stddef.h>
#include "_wire.h"

enum {
    SHM_LINE = 128,
    SHM_HEADER_LINES = 4,
    SHM_MAGIC = 0x73686d70,          /* "shmp" */
    SHM_MAX_WORKERS = 1024,

    /* Header lines. */
    SHM_OFF_META = 0,                /* magic, workers, envs */
    SHM_OFF_SYNC = 1 * SHM_LINE,     /* signal: shards finished (sync step / reset) */
    SHM_OFF_ORDER = 2 * SHM_LINE,    /* completion tickets: recv takes envs in the order they finished */
    SHM_OFF_PUB = 3 * SHM_LINE,      /* signal: completions published, all workers (a doorbell for sleeping) */

    /* A worker's block: line A written by the parent, line B by the worker. */
    SHM_A_CMD_SEQ = 0,               /* signal (value, waiters, target) */
    SHM_A_CMD = 12,
    SHM_A_REQ_HEAD = 16,             /* uint64: requests pushed */
    SHM_A_POST_NS = 24,              /* int64: CLOCK_MONOTONIC time of the newest post (adaptive waiters learn from it) */
    SHM_B_DONE_SEQ = SHM_LINE,       /* signal (value, waiters, target) */
    SHM_B_REQ_TAIL = SHM_LINE + 16,  /* uint64: requests taken */
    SHM_B_COMP_HEAD = SHM_LINE + 24, /* uint64: completions published into this worker's ring */
    SHM_B_COMP_RUNG = SHM_LINE + 32, /* uint32: low bits of the head once its doorbell was rung */
    SHM_BLOCK = 2 * SHM_LINE,

    /* Signal ids (a semaphore each when there is no futex): the two header
     * signals, then per worker its command and done sequences. */
    SHM_SIG_SYNC = 0,
    SHM_SIG_PUB = 1,

    /* Commands a worker executes (shmpool.protocol re-exports them). */
    SHM_CMD_STEP = 1,                /* step the whole shard (sync), then bump the sync counter */
    SHM_CMD_ASYNC = 2,               /* drain the worker's request ring, publishing each env */
    SHM_CMD_MESSAGE = 3,             /* read one message from the side channel and answer it */
    SHM_CMD_EXIT = 4,
};

static inline int shm_command_signal(int worker) { return 2 + 2 * worker; }
static inline int shm_done_signal(int worker) { return 3 + 2 * worker; }
static inline int shm_signal_count(int num_workers) { return 2 + 2 * num_workers; }

static inline int64_t shm_align(int64_t n) { return (n + SHM_LINE - 1) / SHM_LINE * SHM_LINE; }

/* Bytes of one ring of uint32 slots, rounded up to a LINE. */
static inline int64_t shm_ring_bytes(int64_t slots) { return shm_align(4 * slots); }

/* The header and the blocks; the rings follow. */
static inline int64_t shm_rings_offset(int num_workers) {
    return SHM_HEADER_LINES * SHM_LINE + (int64_t)num_workers * SHM_BLOCK;
}

static inline uint8_t *shm_block(uint8_t *base, int worker) {
    return base + SHM_HEADER_LINES * SHM_LINE + worker * SHM_BLOCK;
}

static inline uint32_t *shm_signal(uint8_t *base, int sid) {
    if (sid == SHM_SIG_SYNC)
        return (uint32_t *)(base + SHM_OFF_SYNC);
    if (sid == SHM_SIG_PUB)
        return (uint32_t *)(base + SHM_OFF_PUB);
    sid -= 2;
    return (uint32_t *)(shm_block(base, sid >> 1) + ((sid & 1) ? SHM_B_DONE_SEQ : SHM_A_CMD_SEQ));
}

/* Written once by the parent before any worker maps the region.  sync_start:
 * where the sync counter starts (tests start it near 2**32 to drive a real
 * pool across the wrap). */
static inline void shm_init_header(uint8_t *base, uint32_t num_workers, uint32_t num_envs, uint32_t sync_start) {
    uint32_t *meta = (uint32_t *)(base + SHM_OFF_META);
    meta[0] = SHM_MAGIC;
    meta[1] = num_workers;
    meta[2] = num_envs;
    shm_store_seqcst(shm_signal(base, SHM_SIG_SYNC), sync_start);
}

static inline int shm_header_matches(const uint8_t *base, uint32_t num_workers, uint32_t num_envs) {
    const uint32_t *meta = (const uint32_t *)(base + SHM_OFF_META);
    return meta[0] == SHM_MAGIC && meta[1] == num_workers && meta[2] == num_envs;
}

/* Parent: give a worker a command; returns the command's sequence number.
 * Waking the worker, if it sleeps, is the caller's (shm_wake, _waiting.h). */
static inline uint32_t shm_post(uint8_t *base, int worker, uint32_t cmd) {
    uint8_t *blk = shm_block(base, worker);
    shm_store_relaxed((uint32_t *)(blk + SHM_A_CMD), cmd);
    /* The stamp is published by the seq_cst add below, like the command. */
    shm_store_release64((uint64_t *)(blk + SHM_A_POST_NS), (uint64_t)shm_now_ns());
    return shm_add_fetch((uint32_t *)(blk + SHM_A_CMD_SEQ), 1);
}

/* Worker: the newest command's sequence number, and the command into *cmd. */
static inline uint32_t shm_command(uint8_t *base, int worker, uint32_t *cmd) {
    uint8_t *blk = shm_block(base, worker);
    uint32_t seq = shm_load_acquire((uint32_t *)(blk + SHM_A_CMD_SEQ));
    *cmd = shm_load_relaxed((uint32_t *)(blk + SHM_A_CMD));
    return seq;
}

/* When the newest command was posted (CLOCK_MONOTONIC ns).  Read it after an
 * acquire load saw that command's sequence: that makes the stamp visible. */
static inline int64_t shm_post_stamp(uint8_t *base, int worker) {
    return (int64_t)shm_load_acquire64((uint64_t *)(shm_block(base, worker) + SHM_A_POST_NS));
}

/* Zero a worker's whole block (both lines) for its replacement. */
static inline void shm_clear_block(uint8_t *base, int worker) {
    uint32_t *blk = (uint32_t *)shm_block(base, worker);
    for (int i = 0; i < SHM_BLOCK / 4; i++)
        shm_store_relaxed(blk + i, 0);
    shm_fence();
}

#endif
