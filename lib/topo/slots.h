/* Internal: the shared priority-slot object that cooperating processes on one host map from
 * /dev/shm. Time is cut into rotation intervals (2 ms by default); slot = (now / interval) % 3
 * and a payload post of priority p may go when p <= slot (TENT numbering, High = 0): slot 0
 * admits High, slot 1 High and Medium, slot 2 all. The helper creates the object and runs the
 * one publisher; this module owns the format: a pure encoder, the publisher's update, and a
 * reader that validates a mapped buffer and gates posts.
 *
 * On-disk format, version 1: a 96-byte header at offset 0 of the object, every integer
 * little-endian (the fields marked * are rewritten by the publisher with native 64/32-bit
 * atomics, so the format requires a little-endian host; the build refuses others):
 *
 *   off len field
 *     0   8 magic              the bytes "ORBSLOTS"
 *     8   2 version            1
 *    10   2 header_size        96
 *    12   4 slot_count         3
 *    16   8 interval_ns        rotation interval, ORB_SLOTS_MIN_INTERVAL_NS..MAX
 *    24   4 clock_id           1 = CLOCK_MONOTONIC
 *    28   4 flags              0 (reserved)
 *    32  16 boot_id            the kernel's boot UUID (/proc/sys/kernel/random/boot_id), raw
 *    48   8 time_ns_id         inode of the publisher's time namespace; 0 when the kernel has none
 *    56   8 publisher_epoch    non-zero, new for every publisher that initialises the object
 *    64   8 checksum           FNV-1a 64 over bytes 0..63
 *    72   8 sequence*          even when stable; odd while the publisher rewrites 80..95
 *    80   4 current_slot*      0..2
 *    84   4 reserved           0
 *    88   8 last_publish_ns*   CLOCK_MONOTONIC time of the last publication
 *
 * Why boot_id and the time namespace: CLOCK_MONOTONIC values are comparable only between
 * processes of the same boot (the clock restarts at boot) and the same time namespace
 * (namespaces add per-namespace offsets to CLOCK_MONOTONIC). Two processes agree on both iff
 * their slot arithmetic agrees. The inode of /proc/self/ns/time names the namespace within a
 * boot; the boot UUID makes the pair unique across reboots. */
#ifndef ORB_TOPO_SLOTS_H
#define ORB_TOPO_SLOTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ORB_SLOTS_MAGIC "ORBSLOTS"
#define ORB_SLOTS_VERSION 1
#define ORB_SLOTS_HEADER_SIZE 96
#define ORB_SLOTS_COUNT 3
#define ORB_SLOTS_CLOCK_MONOTONIC 1
#define ORB_SLOTS_DEFAULT_INTERVAL_NS 2000000ull     /* 2 ms, as in TENT */
#define ORB_SLOTS_MIN_INTERVAL_NS 1000000ull         /* the publisher period (1 ms) */
#define ORB_SLOTS_MAX_INTERVAL_NS 1000000000ull      /* 1 s */
#define ORB_SLOTS_DEFAULT_STALE_NS 100000000ull      /* publisher silent this long: stale */

/* The identity of a CLOCK_MONOTONIC: two processes compare equal iff their clocks agree. */
struct orb_clock_domain {
    uint32_t clock_id;          /* ORB_SLOTS_CLOCK_MONOTONIC */
    uint8_t boot_id[16];
    uint64_t time_ns_id;        /* 0: the kernel has no time namespaces */
};

/* The calling process's domain, from /proc/sys/kernel/random/boot_id and /proc/self/ns/time.
 * Errors: ORB_EUNAVAILABLE (no boot_id), ORB_EPROTO (boot_id not a UUID). */
int orb_clock_domain_current(struct orb_clock_domain *out);

/* Parse the text of boot_id ("xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", optional trailing
 * newline) into 16 bytes. Errors: ORB_EPROTO. */
int orb_clock_domain_parse_boot_id(const char *text, size_t len, uint8_t out[16]);

/* The slot of `now_ns` for `interval_ns` (> 0). */
static inline uint32_t orb_slots_slot_at(uint64_t interval_ns, uint64_t now_ns)
{
    return (uint32_t)((now_ns / interval_ns) % ORB_SLOTS_COUNT);
}

/* TENT's canSend rule: priority p may post in slot s iff p <= s. */
static inline bool orb_slots_allows(uint32_t slot, unsigned priority)
{
    return priority <= slot && slot < ORB_SLOTS_COUNT;
}

struct orb_slots_params {
    uint64_t interval_ns;
    struct orb_clock_domain domain;
    uint64_t publisher_epoch;   /* non-zero */
    uint64_t now_ns;            /* the first publication */
};

/* Write a complete version-1 header (with a first publication at params->now_ns) into buf,
 * which must be 8-byte aligned and at least ORB_SLOTS_HEADER_SIZE bytes. Touches only the
 * header bytes. Errors: ORB_EINVAL (NULL, short or misaligned buffer, interval out of bounds,
 * zero epoch, unknown clock id). */
int orb_slots_encode(void *buf, size_t len, const struct orb_slots_params *params);

/* The publisher's update (one publisher per object, serialised by the helper's lock): stores
 * slot = (now / interval) % 3 and now under the sequence protocol. `buf` holds a header
 * written by orb_slots_encode. */
void orb_slots_publish(void *buf, uint64_t now_ns);

/* Why a read answered as it did. */
enum orb_slots_source {
    ORB_SLOTS_PUBLISHED = 0,  /* the publisher's slot, still inside its own interval window */
    ORB_SLOTS_DERIVED,        /* publisher behind (within the stale limit): slot from now */
    ORB_SLOTS_STALE,          /* publisher silent past the stale limit: High only */
    ORB_SLOTS_BUSY,           /* the publisher kept rewriting during the read: High only */
    ORB_SLOTS_DAMAGED,        /* inconsistent slot or time, or header changed: High only */
};

/* A validated view of a mapped object. The mapping is not owned and must outlive the reader. */
struct orb_slots_reader {
    const uint8_t *base;
    uint64_t interval_ns;
    uint64_t stale_ns;
    uint64_t epoch;
    uint64_t checksum;
};

/* Validate the mapped object buf[0..len) against the reader's own clock domain and, when
 * expected_interval_ns != 0, its configured interval; stale_ns (0: the default) is how long a
 * silent publisher is trusted to be merely late. Fails closed:
 *   ORB_EINVAL   NULL or misaligned buffer, stale limit shorter than the interval;
 *   ORB_EPERM    not an OrbiTE slot object (foreign magic), or a different clock domain
 *                (another boot or time namespace), whose slots would be wrong here;
 *   ORB_EPROTO   short object or any damaged or unsupported field (version, header size, slot
 *                count, interval bounds, clock id, flags, epoch, checksum, slot or time);
 *   ORB_ECONFIG  a valid object whose interval differs from expected_interval_ns.
 * The detail message names the field. */
int orb_slots_reader_open(const void *buf, size_t len, const struct orb_clock_domain *mine,
                          uint64_t expected_interval_ns, uint64_t stale_ns,
                          struct orb_slots_reader *out);

/* The slot in force at now_ns and where it came from. The published slot is used only while
 * now is inside the interval window it was published for; once now moves past that window the
 * reader derives the slot from now (same clock domain, so it equals what a live publisher
 * would publish); a publisher silent for longer than the stale limit, a torn or inconsistent
 * read, a publication from the future beyond one interval, or a header rewritten since open
 * all answer slot 0 (High only). A stalled publisher can therefore never extend a Low slot. */
enum orb_slots_source orb_slots_read(const struct orb_slots_reader *r, uint64_t now_ns,
                                     uint32_t *slot);

/* May a payload post of `priority` (enum orb_qos_priority) go at now_ns? */
bool orb_slots_can_send(const struct orb_slots_reader *r, unsigned priority, uint64_t now_ns);

#endif
