/* Internal: what a transport remembers of a peer's answers about remote ranges, for choosing a
 * transport without asking the peer request after request: extents a request may travel within
 * (for good, until forgotten), and exact ranges refused (for a while). Not thread-safe: the owner
 * locks it. */
#ifndef ORB_CORE_RANGE_MEMO_H
#define ORB_CORE_RANGE_MEMO_H

#include <stdbool.h>
#include <stdint.h>

#define ORB_RANGE_MEMO_MAX 128u /* answers kept; the oldest goes first */

struct orb_range_memo_entry {
    uint64_t addr, length;
    uint64_t expires;           /* CLOCK_MONOTONIC ns; ORB_DEADLINE_NONE: never */
    bool ok;
};

struct orb_range_memo {
    struct orb_range_memo_entry entries[ORB_RANGE_MEMO_MAX];
    uint32_t count, next;
};

/* 1 when [addr, +length) lies inside a remembered extent, 0 when exactly this range was refused
 * and the refusal has not expired at `now`, -1 when nothing is known. */
int orb_range_memo_lookup(const struct orb_range_memo *m, uint64_t addr, uint64_t length, uint64_t now);

/* Remember an extent requests may travel within (`ok`, kept until forgotten) or a refused range
 * (kept until `refusal_expires`). */
void orb_range_memo_remember(struct orb_range_memo *m, uint64_t addr, uint64_t length, bool ok,
                             uint64_t refusal_expires);

/* Forget every answer overlapping [addr, +length): the peer's answer turned out stale. */
void orb_range_memo_forget(struct orb_range_memo *m, uint64_t addr, uint64_t length);

#endif
