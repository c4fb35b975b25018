/* The rings of the async path, and the claims that bound them.
 *
 * Per worker, after the blocks (_control.h): a request ring (env ids the parent
 * asks it to step or reset, with a flag bit), a completion ring (env ids it has
 * finished), and beside the completion ring the tickets that order completions
 * across workers.  Each ring has one slot per env of the worker's shard: a
 * claim lets an env in flight at most once before the parent takes it back,
 * so an env is requested, and published, at most once per round and no ring
 * overflows.
 *
 * Each ring has a single producer and a single consumer.  Heads and tails are
 * 64-bit counts that only grow; a slot is count % slots.  A worker that dies
 * mid-publish leaves no hole: everything it published up to its head is a
 * valid result.  Every completion takes a ticket from one shared counter, and
 * the parent takes completions oldest ticket first, so an env that finished
 * early is never passed over for one that finished later on another worker. */
#ifndef SHMPOOL_RINGS_H
#define SHMPOOL_RINGS_H

#include "_control.h"

/* Request flag: reset this env instead of stepping it. */
#define SHM_REQ_RESET 0x80000000u
#define SHM_REQ_ENV_MASK 0x7FFFFFFFu   /* a request word without its flag: the env id */

/* The rings of a control region as one process sees them. */
typedef struct {
    uint8_t *base;                             /* the control region */
    int num_workers;
    uint32_t *req_rings[SHM_MAX_WORKERS];
    uint32_t req_caps[SHM_MAX_WORKERS];        /* slots of each worker's rings: its env count */
    uint32_t *comp_rings[SHM_MAX_WORKERS];
    uint32_t *order_rings[SHM_MAX_WORKERS];    /* completion ticket of each comp_rings slot */
    uint64_t comp_tails[SHM_MAX_WORKERS];      /* parent only: completions taken from each ring */
    uint32_t starts[SHM_MAX_WORKERS + 1];      /* first env of each shard, then num_envs */
    uint64_t taken;                            /* parent only: completions taken in all (doorbell target) */
    int me;                                    /* worker side: the shard shm_publish last wrote to */
} shm_rings;

/* Bytes of one worker's three rings (requests, completions, tickets). */
static inline int64_t shm_worker_rings_bytes(int64_t slots) { return 3 * shm_ring_bytes(slots); }

/* Lay the rings out after the blocks: all request rings, then all completion
 * rings, then all ticket rings.  shard_sizes: envs per worker, each >= 1. */
static inline void shm_rings_map(shm_rings *r, uint8_t *base, const uint32_t *shard_sizes, int num_workers) {
    int64_t off = shm_rings_offset(num_workers);
    uint32_t first = 0;
    r->base = base;
    r->num_workers = num_workers;
    for (int w = 0; w < num_workers; w++) {
        r->req_rings[w] = (uint32_t *)(base + off);
        r->req_caps[w] = shard_sizes[w];
        off += shm_ring_bytes(shard_sizes[w]);
        r->starts[w] = first;
        first += shard_sizes[w];
    }
    r->starts[num_workers] = first;
    for (int w = 0; w < num_workers; w++) {
        r->comp_rings[w] = (uint32_t *)(base + off);
        r->comp_tails[w] = 0;
        off += shm_ring_bytes(r->req_caps[w]);
    }
    for (int w = 0; w < num_workers; w++) {
        r->order_rings[w] = (uint32_t *)(base + off);
        off += shm_ring_bytes(r->req_caps[w]);
    }
    r->taken = 0;
    r->me = 0;
}

/* --- claims ------------------------------------------------------------------ */

/* Mark ids in flight (in_flight: one byte per env, 1 = in flight).  Returns 0,
 * with nothing marked, if one is outside [0, num_envs), repeated, or already in
 * flight. */
static inline int shm_claim(const int64_t *ids, ptrdiff_t n, uint8_t *in_flight, ptrdiff_t num_envs) {
    for (ptrdiff_t i = 0; i < n; i++) {
        int64_t e = ids[i];
        if (e < 0 || e >= num_envs || in_flight[e]) {
            for (ptrdiff_t j = 0; j < i; j++)
                in_flight[ids[j]] = 0;
            return 0;
        }
        in_flight[e] = 1;
    }
    return 1;
}

/* --- requests: parent -> worker ------------------------------------------------ */

/* Parent: append claimed env ids (each with flag) to their owners' request
 * rings and publish the new heads.  counts[w]: how many worker w got; the
 * caller posts CMD_ASYNC to each worker with a count (after its head, so the
 * post's seq_cst add publishes the requests). */
static inline void shm_push_requests(shm_rings *r, const int64_t *ids, ptrdiff_t n, const int32_t *owner,
                                     uint32_t flag, uint64_t *counts) {
    uint64_t heads[SHM_MAX_WORKERS];
    int w;
    for (w = 0; w < r->num_workers; w++) {
        heads[w] = shm_load_relaxed64((uint64_t *)(shm_block(r->base, w) + SHM_A_REQ_HEAD));
        counts[w] = 0;
    }
    for (ptrdiff_t i = 0; i < n; i++) {
        int64_t e = ids[i];
        w = owner[e];
        r->req_rings[w][(heads[w] + counts[w]) % r->req_caps[w]] = (uint32_t)e | flag;
        counts[w] += 1;
    }
    for (w = 0; w < r->num_workers; w++)
        if (counts[w])
            shm_store_release64((uint64_t *)(shm_block(r->base, w) + SHM_A_REQ_HEAD), heads[w] + counts[w]);
}

/* Worker: the next env id requested from it (with its flag), or -1. */
static inline int64_t shm_pop_request(shm_rings *r, int worker) {
    uint8_t *blk = shm_block(r->base, worker);
    uint64_t *tail = (uint64_t *)(blk + SHM_B_REQ_TAIL);
    uint64_t t = shm_load_relaxed64(tail);
    if (t == shm_load_acquire64((uint64_t *)(blk + SHM_A_REQ_HEAD)))
        return -1;
    uint32_t v = r->req_rings[worker][t % r->req_caps[worker]];
    shm_store_release64(tail, t + 1);
    return v;
}

/* --- completions: worker -> parent ----------------------------------------- */

/* The worker whose shard holds env_id (< num_envs): the last one, else a
 * binary search over the shards' first envs. */
static inline int shm_owner(shm_rings *r, uint32_t env_id) {
    int w = r->me, lo, hi, mid;
    if (r->starts[w] <= env_id && env_id < r->starts[w + 1])
        return w;
    lo = 0;
    hi = r->num_workers - 1;
    while (lo < hi) {
        mid = (lo + hi + 1) / 2;
        if (r->starts[mid] <= env_id)
            lo = mid;
        else
            hi = mid - 1;
    }
    r->me = lo;
    return lo;
}

/* Worker: append a finished env (results already written) to its shard's
 * completion ring with a ticket, and ring the doorbell.  Waking a sleeping
 * parent is the caller's (shm_wake on the SHM_SIG_PUB signal). */
static inline void shm_publish(shm_rings *r, uint32_t env_id) {
    int w = shm_owner(r, env_id);
    uint8_t *blk = shm_block(r->base, w);
    uint64_t *headp = (uint64_t *)(blk + SHM_B_COMP_HEAD);
    uint64_t h = shm_load_relaxed64(headp);
    /* The ticket orders this completion among all workers' (a wrap-safe count). */
    uint32_t ticket = shm_add_fetch((uint32_t *)(r->base + SHM_OFF_ORDER), 1);
    r->comp_rings[w][h % r->req_caps[w]] = env_id;
    r->order_rings[w][h % r->req_caps[w]] = ticket;
    shm_store_release64(headp, h + 1);
    shm_add_fetch(shm_signal(r->base, SHM_SIG_PUB), 1);
    shm_store_release((uint32_t *)(blk + SHM_B_COMP_RUNG), (uint32_t)(h + 1));
}

static inline uint64_t *shm_comp_head(shm_rings *r, int worker) {
    return (uint64_t *)(shm_block(r->base, worker) + SHM_B_COMP_HEAD);
}

/* Parent: move what the completion rings hold (at most n) into out[start:],
 * oldest completion first across all workers (by ticket); returns how many. */
static inline ptrdiff_t shm_take_ready(shm_rings *r, uint32_t *out, ptrdiff_t start, ptrdiff_t n) {
    int nw = r->num_workers, w, best;
    ptrdiff_t got = 0;
    uint64_t heads[SHM_MAX_WORKERS];
    uint32_t o, best_o = 0;
    for (w = 0; w < nw; w++)
        heads[w] = shm_load_acquire64(shm_comp_head(r, w));
    while (got < n) {
        best = -1;
        for (w = 0; w < nw; w++) {
            if (r->comp_tails[w] != heads[w]) {
                o = r->order_rings[w][r->comp_tails[w] % r->req_caps[w]];
                if (best < 0 || (int32_t)(o - best_o) < 0) {
                    best = w;
                    best_o = o;
                }
            }
        }
        if (best < 0)
            break;
        out[start + got] = r->comp_rings[best][r->comp_tails[best] % r->req_caps[best]];
        r->comp_tails[best] += 1;
        got += 1;
    }
    r->taken += (uint64_t)got;
    return got;
}

/* Parent: the doorbell value to sleep for while `more` completions are still
 * wanted, given the doorbell read (`seen`) before the last shm_take_ready.  A
 * worker stores its head before it rings, so every publication `seen` counts
 * was in the rings.  The doorbell can run ahead after a worker restart (a ring
 * rung for a worker killed mid-publish): then wait for any publication. */
static inline uint32_t shm_doorbell_target(const shm_rings *r, uint32_t seen, uint64_t more) {
    uint32_t want = (uint32_t)(r->taken + more);
    if (shm_reached(seen, want))
        want = seen + 1;
    return want;
}

/* --- a dead worker's rings --------------------------------------------------- */

/* Completions a worker published that the parent has not taken. */
static inline uint64_t shm_untaken(shm_rings *r, int worker) {
    return shm_load_acquire64(shm_comp_head(r, worker)) - r->comp_tails[worker];
}

static inline uint32_t shm_ring_slots(const shm_rings *r, int worker) { return r->req_caps[worker]; }

/* Parent, for a dead worker (shm_untaken within its slots): copy what it
 * published and the parent has not taken into out, oldest first, count them
 * as taken, and ring the doorbell for a publication it stored but was killed
 * before ringing.  Its ring starts again from zero: the caller clears its
 * block.  Returns how many were copied. */
static inline ptrdiff_t shm_hand_back(shm_rings *r, int worker, uint32_t *out) {
    uint64_t t = r->comp_tails[worker], head = shm_load_acquire64(shm_comp_head(r, worker));
    uint64_t cap = r->req_caps[worker];
    ptrdiff_t got = 0;
    uint32_t missed;
    while (t != head) {
        out[got++] = r->comp_rings[worker][t % cap];
        t += 1;
    }
    r->taken += (uint64_t)got;
    missed = (uint32_t)head - shm_load_acquire((uint32_t *)(shm_block(r->base, worker) + SHM_B_COMP_RUNG));
    if (missed)
        shm_add_fetch(shm_signal(r->base, SHM_SIG_PUB), missed);
    r->comp_tails[worker] = 0;
    return got;
}

#endif
