/* A one-producer, one-consumer ring in memory shared with a peer that is not trusted. */
#include "samehost/ring.h"

#include <errno.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "core/clock.h"
#include "core/error.h"

#define TAIL_AT 0u
#define HEAD_AT ORB_SH_RING_LINE
#define ASLEEP_AT (2u * ORB_SH_RING_LINE)
#define ENTRIES_AT (3u * ORB_SH_RING_LINE)

static _Atomic uint32_t *word(const struct orb_sh_ring *r, size_t at)
{
    return (_Atomic uint32_t *)(void *)(r->shared + at);
}

static uint8_t *slot(const struct orb_sh_ring *r, uint32_t index)
{
    return r->shared + ENTRIES_AT + (size_t)(index & (r->capacity - 1)) * ORB_SH_RING_ENTRY;
}

size_t orb_sh_ring_bytes(uint32_t capacity)
{
    if (capacity == 0 || capacity > ORB_SH_RING_MAX_CAPACITY || (capacity & (capacity - 1)) != 0)
        return 0;
    return ENTRIES_AT + (size_t)capacity * ORB_SH_RING_ENTRY;
}

int orb_sh_ring_open(struct orb_sh_ring *r, void *mem, size_t len, uint32_t capacity, enum orb_sh_ring_role role,
                     int fresh)
{
    size_t need = orb_sh_ring_bytes(capacity);
    if (r == NULL || mem == NULL)
        return orb_fail(ORB_EINVAL, "shared ring: no ring or no memory");
    if (need == 0)
        return orb_fail(ORB_EINVAL, "shared ring: capacity %u is not a power of two in [1, %u]", capacity,
                        ORB_SH_RING_MAX_CAPACITY);
    if (len < need)
        return orb_fail(ORB_EINVAL, "shared ring: %zu bytes of memory, %zu needed for %u entries", len, need,
                        capacity);
    if ((uintptr_t)mem % ORB_SH_RING_LINE != 0)
        return orb_fail(ORB_EINVAL, "shared ring: memory not aligned to %u bytes", ORB_SH_RING_LINE);
    if (role != ORB_SH_RING_PRODUCER && role != ORB_SH_RING_CONSUMER)
        return orb_fail(ORB_EINVAL, "shared ring: role %d is neither producer nor consumer", (int)role);
    *r = (struct orb_sh_ring){.shared = mem, .capacity = capacity, .role = role};
    if (fresh) {
        atomic_store_explicit(word(r, TAIL_AT), 0, memory_order_relaxed);
        atomic_store_explicit(word(r, HEAD_AT), 0, memory_order_relaxed);
        atomic_store_explicit(word(r, ASLEEP_AT), 0, memory_order_release);
    } else {
        /* Start from what the creator published, checked as every later read is. */
        uint32_t mine = atomic_load_explicit(word(r, role == ORB_SH_RING_PRODUCER ? TAIL_AT : HEAD_AT),
                                             memory_order_acquire);
        uint32_t theirs = atomic_load_explicit(word(r, role == ORB_SH_RING_PRODUCER ? HEAD_AT : TAIL_AT),
                                               memory_order_acquire);
        uint32_t used = role == ORB_SH_RING_PRODUCER ? mine - theirs : theirs - mine;
        if (used > capacity)
            return orb_fail(ORB_EPROTO, "shared ring: indices %u and %u are %u entries apart, capacity %u",
                            mine, theirs, used, capacity);
        r->index = mine;
        r->peer = theirs;
    }
    return 0;
}

static int broken(struct orb_sh_ring *r, const char *who, uint32_t published, uint32_t used)
{
    r->broken = ORB_EPROTO;
    return orb_fail(ORB_EPROTO, "shared ring: the %s published index %u, %u entries from ours (%u), capacity %u",
                    who, published, used, r->index, r->capacity);
}

static void futex_wake(_Atomic uint32_t *w)
{
    (void)syscall(SYS_futex, (uint32_t *)(void *)w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static int has_entry(const struct orb_sh_ring *r)
{
    return r->peer != r->index || atomic_load_explicit(word(r, TAIL_AT), memory_order_acquire) != r->index;
}

/* Entries the consumer may read ahead: their lines come over while it copies the first. */
#define PREFETCH_MAX 16u

int orb_sh_ring_stage(struct orb_sh_ring *r, const void *entry)
{
    if (r == NULL || r->role != ORB_SH_RING_PRODUCER || entry == NULL)
        return orb_fail(ORB_EINVAL, "shared ring: push needs the producer's side and an entry");
    if (r->broken)
        return orb_fail(r->broken, "shared ring: broken by an impossible index earlier");
    if (r->index - r->peer >= r->capacity) {
        /* Full as far as this side knows: see how far the consumer has come. */
        uint32_t head = atomic_load_explicit(word(r, HEAD_AT), memory_order_acquire);
        uint32_t used = r->index - head;
        if (used > r->capacity)
            return broken(r, "consumer", head, used);
        r->peer = head;
        if (used == r->capacity)
            return ORB_EAGAIN;
    }
    memcpy(slot(r, r->index), entry, ORB_SH_RING_ENTRY);
    r->index++;
    return 0;
}

void orb_sh_ring_publish(struct orb_sh_ring *r)
{
    if (r == NULL || r->role != ORB_SH_RING_PRODUCER || r->broken)
        return;
    /* Sequentially consistent with the consumer's "asleep, then look at the tail": either it sees
     * this tail, or this side sees it asleep and wakes it. */
    atomic_store_explicit(word(r, TAIL_AT), r->index, memory_order_seq_cst);
    if (atomic_load_explicit(word(r, ASLEEP_AT), memory_order_seq_cst) != 0)
        futex_wake(word(r, TAIL_AT));
}

int orb_sh_ring_push(struct orb_sh_ring *r, const void *entry)
{
    int rc = orb_sh_ring_stage(r, entry);
    if (rc == 0)
        orb_sh_ring_publish(r);
    return rc;
}

int orb_sh_ring_pending(const struct orb_sh_ring *r)
{
    return r != NULL && r->role == ORB_SH_RING_CONSUMER && !r->broken && has_entry(r);
}

void orb_sh_ring_wake(struct orb_sh_ring *r)
{
    if (r != NULL && r->shared != NULL)
        futex_wake(word(r, TAIL_AT));
}

int orb_sh_ring_pop(struct orb_sh_ring *r, void *entry)
{
    if (r == NULL || r->role != ORB_SH_RING_CONSUMER || entry == NULL)
        return orb_fail(ORB_EINVAL, "shared ring: pop needs the consumer's side and room for an entry");
    if (r->broken)
        return orb_fail(r->broken, "shared ring: broken by an impossible index earlier");
    if (r->peer == r->index) {
        /* Empty as far as this side knows: see what the producer has published. */
        uint32_t tail = atomic_load_explicit(word(r, TAIL_AT), memory_order_acquire);
        uint32_t avail = tail - r->index;
        if (avail > r->capacity)
            return broken(r, "producer", tail, avail);
        if (avail == 0)
            return ORB_EAGAIN;
        r->peer = tail;
        for (uint32_t k = 1; k < avail && k <= PREFETCH_MAX; k++)
            __builtin_prefetch(slot(r, r->index + k), 0);
    }
    memcpy(entry, slot(r, r->index), ORB_SH_RING_ENTRY);
    r->index++;
    atomic_store_explicit(word(r, HEAD_AT), r->index, memory_order_release);
    return 0;
}


static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Wait until the producer's tail differs from `index` (reads nothing of `r` but its memory). */
static int wait_past(struct orb_sh_ring *r, uint32_t index, uint64_t poll_ns, uint64_t deadline)
{
    if (atomic_load_explicit(word(r, TAIL_AT), memory_order_acquire) != index)
        return 0;
    uint64_t now = orb_now_ns();
    uint64_t poll_end = poll_ns < deadline - now && now < deadline ? now + poll_ns : deadline;
    for (uint32_t spins = 0; now < poll_end; spins++) {
        if (atomic_load_explicit(word(r, TAIL_AT), memory_order_acquire) != index)
            return 0;
        cpu_relax();
        if ((spins & 63u) == 63u)
            now = orb_now_ns();
    }
    _Atomic uint32_t *tail = word(r, TAIL_AT), *asleep = word(r, ASLEEP_AT);
    for (;;) {
        atomic_store_explicit(asleep, 1, memory_order_seq_cst);
        uint32_t seen = atomic_load_explicit(tail, memory_order_seq_cst);
        if (seen != index)
            break;
        now = orb_now_ns();
        if (now >= deadline) {
            atomic_store_explicit(asleep, 0, memory_order_relaxed);
            return ORB_ETIMEDOUT;
        }
        /* A second at most per sleep: a wake-up the peer never sends (it published the tail
         * and stopped) delays this side by that much, not until the deadline. */
        uint64_t left = deadline - now < ORB_NS_PER_SEC ? deadline - now : ORB_NS_PER_SEC;
        struct timespec ts = {.tv_sec = (time_t)(left / ORB_NS_PER_SEC), .tv_nsec = (long)(left % ORB_NS_PER_SEC)};
        long woke = syscall(SYS_futex, (uint32_t *)(void *)tail, FUTEX_WAIT, seen, &ts, NULL, 0);
        if (woke == 0)
            break; /* an entry, or orb_sh_ring_wake(): the caller looks */
    }
    atomic_store_explicit(asleep, 0, memory_order_relaxed);
    return 0;
}

void orb_sh_ring_want_wake(struct orb_sh_ring *r, int on)
{
    if (r != NULL && r->role == ORB_SH_RING_CONSUMER && r->shared != NULL)
        atomic_store_explicit(word(r, ASLEEP_AT), on ? 1u : 0u, memory_order_seq_cst);
}

int orb_sh_ring_doze(struct orb_sh_ring *r, uint64_t deadline)
{
    if (r == NULL || r->role != ORB_SH_RING_CONSUMER)
        return orb_fail(ORB_EINVAL, "shared ring: doze needs the consumer's side");
    _Atomic uint32_t *tail = word(r, TAIL_AT);
    for (;;) {
        uint64_t now = orb_now_ns();
        if (now >= deadline)
            return ORB_ETIMEDOUT;
        uint64_t left = deadline - now;
        struct timespec ts = {.tv_sec = (time_t)(left / ORB_NS_PER_SEC), .tv_nsec = (long)(left % ORB_NS_PER_SEC)};
        uint32_t seen = atomic_load_explicit(tail, memory_order_relaxed);
        if (syscall(SYS_futex, (uint32_t *)(void *)tail, FUTEX_WAIT, seen, &ts, NULL, 0) == 0)
            return 0;
        /* EAGAIN: the tail moved before the call (entries for someone else); EINTR; ETIMEDOUT:
         * the loop's clock says which. */
    }
}

int orb_sh_ring_wait(struct orb_sh_ring *r, uint64_t poll_ns, uint64_t deadline)
{
    if (r == NULL || r->role != ORB_SH_RING_CONSUMER)
        return orb_fail(ORB_EINVAL, "shared ring: wait needs the consumer's side");
    if (r->broken)
        return 0;
    return wait_past(r, r->index, poll_ns, deadline);
}

int orb_sh_ring_wait_at(struct orb_sh_ring *r, uint32_t index, uint64_t poll_ns, uint64_t deadline)
{
    if (r == NULL || r->role != ORB_SH_RING_CONSUMER)
        return orb_fail(ORB_EINVAL, "shared ring: wait needs the consumer's side");
    return wait_past(r, index, poll_ns, deadline);
}
