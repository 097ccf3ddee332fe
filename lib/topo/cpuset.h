/* Internal: CPU sets as the kernel prints them in sysfs ("cpulist": "0-3,8,10-11"), for binding
 * the RDMA lanes to the CPUs of their NICs' NUMA node.
 *
 * Grammar (strict; anything else fails closed): an optional trailing newline; otherwise empty (a
 * node without CPUs) or comma-separated items, each a CPU number or a range "a-b" with a <= b;
 * numbers are decimal without sign, blanks or leading zeros ("0" itself is fine) and below
 * ORB_CPUSET_MAX. At most ORB_CPULIST_MAX_BYTES bytes. Pure functions; thread-safe. */
#ifndef ORB_TOPO_CPUSET_H
#define ORB_TOPO_CPUSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ORB_CPUSET_MAX 1024u                  /* CPUs 0..1023 (glibc's CPU_SETSIZE) */
#define ORB_CPUSET_WORDS (ORB_CPUSET_MAX / 64)
#define ORB_CPULIST_MAX_BYTES 8192u

struct orb_cpuset {
    uint64_t bits[ORB_CPUSET_WORDS];
};

/* Parse `len` bytes of `text` (need not be NUL-terminated) into *out, written only on success.
 * Errors: ORB_EINVAL (NULL), ORB_ECONFIG (not a cpulist as above; the message says why). */
int orb_cpulist_parse(const char *text, size_t len, struct orb_cpuset *out);

/* The number of CPUs in `s`. */
uint32_t orb_cpuset_count(const struct orb_cpuset *s);

/* *dst = *a & *b. */
void orb_cpuset_and(struct orb_cpuset *dst, const struct orb_cpuset *a, const struct orb_cpuset *b);

static inline bool orb_cpuset_has(const struct orb_cpuset *s, uint32_t cpu)
{
    return cpu < ORB_CPUSET_MAX && ((s->bits[cpu / 64] >> (cpu % 64)) & 1u) != 0;
}

static inline void orb_cpuset_add(struct orb_cpuset *s, uint32_t cpu)
{
    if (cpu < ORB_CPUSET_MAX)
        s->bits[cpu / 64] |= UINT64_C(1) << (cpu % 64);
}

#endif
