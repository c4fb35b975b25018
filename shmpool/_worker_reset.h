/* A dead worker's control block made ready for its replacement.
 *
 * What the dead worker published before it died stays valid: its results were
 * written before each publication, and its completion head was stored after
 * them, so every env id up to that head is handed back to the parent (oldest
 * first) as a result.  What it was asked and had not published is not here:
 * the parent knows which envs it still owed and asks the replacement again.
 * The doorbell it may have owed (killed between storing its head and ringing)
 * is rung, so the parent's count of publications matches the doorbell again.
 * Then its whole block, both lines, is zeroed: the replacement starts at
 * command 0 with empty rings. */
#ifndef SHMPOOL_WORKER_RESET_H
#define SHMPOOL_WORKER_RESET_H

#include "_control.h"
#include "_rings.h"

/* Parent, once the worker is dead: copy what it published and the parent had
 * not taken into out (room for shm_ring_slots of it), clear its block.
 * Returns how many were copied, or -1, with nothing changed, when its ring is
 * corrupt (a head more than its slots past the parent's tail). */
static inline ptrdiff_t shm_reset_worker(shm_rings *r, int worker, uint32_t *out) {
    ptrdiff_t got;
    if (shm_untaken(r, worker) > shm_ring_slots(r, worker))
        return -1;
    got = shm_hand_back(r, worker, out);
    shm_clear_block(r->base, worker);
    return got;
}

#endif
