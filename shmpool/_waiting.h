/* Waiting on a signal word: spin, then sched_yield, then sleep (a futex, or a
 * posix semaphore where futex is missing), always bounded by a timeout slice so
 * callers can check liveness between slices.
 *
 * A signal is three words: the value, the sleeper's flag and the value the
 * sleeper waits for, so a waker issues a syscall only when a sleeper raised
 * the flag and the value it waits for is reached.  The sleeper raises its flag
 * and then re-reads the value; the waker stores the value and then reads the
 * flag; both seq_cst, so one of them sees the other (no lost wake-up).
 *
 * The semaphores are Python objects (posix_ipc), so sleeping on one is the
 * caller's; this header gives it the same flag handshake (shm_sem_prepare,
 * shm_sem_finish).  An adaptive wait (workers under "auto") learns how long
 * commands take to come and sleeps at once when they come later than its
 * budget (shm_learn_gap); the wait itself is the caller's. */
#ifndef SHMPOOL_WAITING_H
#define SHMPOOL_WAITING_H

#include "_wire.h"

/* What shm_wait_word returns. */
enum {
    SHM_WAIT_TIMEOUT = 0,
    SHM_WAIT_REACHED = 1,
    SHM_WAIT_SEMAPHORE = 2,   /* no futex: the caller sleeps on its semaphore */
};

/* Spin, then yield, then sleep until *word reaches target (wrap-safe), at most
 * timeout_ns.  spin_ns and yield_ns are the time in each busy phase. */
static inline int shm_wait_word(uint32_t *word, uint32_t target, int64_t spin_ns,
                                int64_t yield_ns, int64_t timeout_ns, int futex) {
    uint32_t *waiters = word + 1;
    uint32_t v;
    int64_t start, now, deadline;
    if (shm_reached(shm_load_acquire(word), target))
        return SHM_WAIT_REACHED;
    start = shm_now_ns();
    deadline = start + timeout_ns;
    if (spin_ns > timeout_ns)
        spin_ns = timeout_ns;
    /* Busy phase: cheapest wake-up (~1 us), costs a whole core. */
    for (;;) {
        for (int i = 0; i < 64; i++) {
            shm_cpu_relax();
            if (shm_reached(shm_load_acquire(word), target))
                return SHM_WAIT_REACHED;
        }
        now = shm_now_ns();
        if (now - start >= spin_ns)
            break;
    }
    /* Yield phase: stays responsive while letting an oversubscribed core run
     * the process we are waiting for. */
    while (now - start < spin_ns + yield_ns && now < deadline) {
        sched_yield();
        if (shm_reached(shm_load_acquire(word), target))
            return SHM_WAIT_REACHED;
        now = shm_now_ns();
    }
    if (!futex)
        return now < deadline ? SHM_WAIT_SEMAPHORE : SHM_WAIT_TIMEOUT;
    /* Sleep phase.  Raise the flag, then re-check: a waker stores the value
     * before it reads the flag (both seq_cst), so one of us sees the other. */
    shm_store_relaxed(word + 2, target);
    while (now < deadline) {
        shm_store_seqcst(waiters, 1);
        v = shm_load_seqcst(word);
        if (shm_reached(v, target)) {
            shm_store_relaxed(waiters, 0);
            return SHM_WAIT_REACHED;
        }
        shm_futex_wait(word, v, deadline - now);
        shm_store_relaxed(waiters, 0);
        if (shm_reached(shm_load_acquire(word), target))
            return SHM_WAIT_REACHED;
        now = shm_now_ns();
    }
    return SHM_WAIT_TIMEOUT;
}

/* The waker's half, after its seq_cst store or add to *word: wake the sleeper
 * if one raised the flag and the value it waits for is reached.  Returns 1 when
 * that sleeper lies on a semaphore (no futex): the caller releases it. */
static inline int shm_wake(uint32_t *word, int futex) {
    /* The publishing store/add was seq_cst, so this load cannot pass it; the
     * sleeper wrote its target before raising the flag. */
    if (shm_load_seqcst(word + 1) && shm_reached(shm_load_relaxed(word), shm_load_acquire(word + 2))) {
        if (!futex)
            return 1;
        shm_futex_wake(word);
    }
    return 0;
}

/* Before sleeping on a semaphore: the same flag handshake as the futex sleep.
 * Returns 1 when the target is already reached (flag lowered): do not sleep. */
static inline int shm_sem_prepare(uint32_t *word, uint32_t target) {
    shm_store_relaxed(word + 2, target);
    shm_store_seqcst(word + 1, 1);
    if (shm_reached(shm_load_seqcst(word), target)) {
        shm_store_relaxed(word + 1, 0);
        return 1;
    }
    return 0;
}

/* After the semaphore woke the sleeper or its slice ran out: lower the flag;
 * 1 when the target is reached. */
static inline int shm_sem_finish(uint32_t *word, uint32_t target) {
    shm_store_relaxed(word + 1, 0);
    return shm_reached(shm_load_acquire(word), target);
}

/* An adaptive waiter's learnt gap between the start of its command wait and
 * the command's post, after a wait that met its command (observed_ns: post
 * stamp - wait start, 0 when the command was there at once).  A moving average
 * over about four commands; one long pause (an update) is counted as 4 budgets
 * at most, so it cannot outweigh many short gaps. */
static inline int64_t shm_learn_gap(int64_t gap_ns, int64_t observed_ns, int64_t budget_ns) {
    if (observed_ns < 0)
        observed_ns = 0;
    if (observed_ns > 4 * budget_ns)
        observed_ns = 4 * budget_ns;
    return gap_ns + (observed_ns - gap_ns) / 4;
}

/* The gap learnt after a whole slice without a command: the trainer is busy
 * elsewhere, so the next wait sleeps at once. */
static inline int64_t shm_gap_after_silence(int64_t budget_ns) { return 4 * budget_ns; }

#endif
