/* The lowest layer of the wire: atomics with explicit ordering and a futex
 * sleep/wake on 32-bit words in shared memory.  Kept tiny and header-only so
 * Cython inlines it; every ordering is spelled out rather than relying on
 * x86's strong memory model. */
#ifndef SHMPOOL_WIRE_H
#define SHMPOOL_WIRE_H

#include <stdint.h>
#include <time.h>
#include <errno.h>
#include <sched.h>

#if defined(__linux__)
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <linux/futex.h>
#define SHM_HAVE_FUTEX 1
#else
#define SHM_HAVE_FUTEX 0
#endif

static inline uint32_t shm_load_acquire(const uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint32_t shm_load_relaxed(const uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void shm_store_release(uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline void shm_store_relaxed(uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
/* Sequentially consistent store: the Dekker handshake between a sleeper
 * raising its waiters flag and a waker publishing a new value needs a full
 * barrier on both sides. */
static inline void shm_store_seqcst(uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
static inline uint32_t shm_load_seqcst(const uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
/* Returns the new value. */
static inline uint32_t shm_add_fetch(uint32_t *p, uint32_t v) {
    return __atomic_add_fetch(p, v, __ATOMIC_SEQ_CST);
}
static inline uint64_t shm_load_acquire64(const uint64_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint64_t shm_load_relaxed64(const uint64_t *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void shm_store_release64(uint64_t *p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline uint64_t shm_fetch_add64(uint64_t *p, uint64_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}
static inline int shm_cas(uint32_t *p, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0,
                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static inline void shm_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

static inline void shm_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* Counters only ever grow (mod 2^32): "reached" is a wrap-safe comparison. */
static inline int shm_reached(uint32_t value, uint32_t target) {
    return (int32_t)(value - target) >= 0;
}

static inline int64_t shm_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int shm_have_futex(void) { return SHM_HAVE_FUTEX; }

/* Sleep while *word == expected, at most timeout_ns.  Returns 0 on wake or
 * value change, -1 on timeout/interrupt (callers re-check the word anyway).
 * Shared (not PRIVATE) futexes: the word lives in memory mapped by several
 * processes. */
static inline int shm_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns) {
#if SHM_HAVE_FUTEX
    struct timespec ts;
    if (timeout_ns < 0) timeout_ns = 0;
    ts.tv_sec = timeout_ns / 1000000000LL;
    ts.tv_nsec = timeout_ns % 1000000000LL;
    long r = syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);
    return r == 0 ? 0 : -1;
#else
    (void)word; (void)expected; (void)timeout_ns;
    return -1;
#endif
}

static inline void shm_futex_wake(uint32_t *word) {
#if SHM_HAVE_FUTEX
    syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
#else
    (void)word;
#endif
}

static inline int shm_set_pdeathsig(int sig) {
#if defined(__linux__)
    return prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0);
#else
    (void)sig;
    return -1;
#endif
}

#endif
