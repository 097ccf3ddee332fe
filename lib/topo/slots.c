/* The shared priority-slot object: format, encoder, publisher update and validating reader
 * (see slots.h for the layout). */
#include "slots.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/ascii.h"
#include "core/error.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the slot object's publisher fields are native atomics stored little-endian");

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 8,
    OFF_HEADER_SIZE = 10,
    OFF_SLOT_COUNT = 12,
    OFF_INTERVAL = 16,
    OFF_CLOCK_ID = 24,
    OFF_FLAGS = 28,
    OFF_BOOT_ID = 32,
    OFF_TIME_NS = 48,
    OFF_EPOCH = 56,
    OFF_CHECKSUM = 64,
    OFF_SEQUENCE = 72,
    OFF_SLOT = 80,
    OFF_RESERVED = 84,
    OFF_PUBLISH = 88,
    CHECKSUM_SPAN = 64,     /* the checksum covers the static fields, bytes 0..63 */
    READ_TRIES = 4,         /* sequence retries before a read answers BUSY */
};

_Static_assert(OFF_PUBLISH + 8 == ORB_SLOTS_HEADER_SIZE, "header layout");

/* ---- little-endian fields and publisher atomics ----------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, unsigned width)
{
    for (unsigned i = 0; i < width; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, unsigned width)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < width; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The buffer is 8-byte aligned (checked at open/encode) and every atomic field is aligned to
 * its size within the header. */
static uint64_t *word64(const uint8_t *base, unsigned off)
{
    return (uint64_t *)(uintptr_t)(base + off);
}

static uint32_t *word32(const uint8_t *base, unsigned off)
{
    return (uint32_t *)(uintptr_t)(base + off);
}

static uint64_t fnv1a64(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- clock domain --------------------------------------------------------------------------- */

int orb_clock_domain_parse_boot_id(const char *text, size_t len, uint8_t out[16])
{
    if (!text || !out)
        return orb_fail(ORB_EINVAL, "boot id: NULL argument");
    if (len == 37 && text[36] == '\n')
        len = 36;
    if (len != 36)
        return orb_fail(ORB_EPROTO, "boot id: %zu characters, a UUID has 36", len);
    uint8_t bytes[16];
    size_t nb = 0;
    for (size_t i = 0; i < 36;) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (text[i] != '-')
                return orb_fail(ORB_EPROTO, "boot id: expected '-' at offset %zu", i);
            i++;
            continue;
        }
        int hi = orb_ascii_hex_value(text[i]), lo = orb_ascii_hex_value(text[i + 1]);
        if (hi < 0 || lo < 0)
            return orb_fail(ORB_EPROTO, "boot id: non-hex character near offset %zu", i);
        bytes[nb++] = (uint8_t)(hi << 4 | lo);
        i += 2;
    }
    memcpy(out, bytes, sizeof(bytes));
    return 0;
}

int orb_clock_domain_current(struct orb_clock_domain *out)
{
    if (!out)
        return orb_fail(ORB_EINVAL, "clock domain: NULL output");
    char text[64];
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "clock domain: cannot open boot_id: %s",
                        strerror(errno));
    ssize_t n;
    do {
        n = read(fd, text, sizeof(text));
    } while (n < 0 && errno == EINTR);
    int saved = errno;
    close(fd);
    if (n < 0)
        return orb_fail(ORB_EUNAVAILABLE, "clock domain: cannot read boot_id: %s",
                        strerror(saved));
    struct orb_clock_domain d = {.clock_id = ORB_SLOTS_CLOCK_MONOTONIC};
    int rc = orb_clock_domain_parse_boot_id(text, (size_t)n, d.boot_id);
    if (rc)
        return rc;
    /* Kernels before 5.6 have no time namespaces (no such file): every process shares one. */
    struct stat st;
    if (stat("/proc/self/ns/time", &st) == 0)
        d.time_ns_id = (uint64_t)st.st_ino;
    *out = d;
    return 0;
}

static bool same_domain(const struct orb_clock_domain *a, const struct orb_clock_domain *b)
{
    return a->clock_id == b->clock_id && a->time_ns_id == b->time_ns_id &&
           memcmp(a->boot_id, b->boot_id, sizeof(a->boot_id)) == 0;
}

/* ---- encoder and publisher -------------------------------------------------------------------- */

int orb_slots_encode(void *buf, size_t len, const struct orb_slots_params *params)
{
    if (!buf || !params)
        return orb_fail(ORB_EINVAL, "slot object: NULL buffer or parameters");
    if ((uintptr_t)buf % 8)
        return orb_fail(ORB_EINVAL, "slot object: buffer is not 8-byte aligned");
    if (len < ORB_SLOTS_HEADER_SIZE)
        return orb_fail(ORB_EINVAL, "slot object: %zu bytes, the header needs %d", len,
                        ORB_SLOTS_HEADER_SIZE);
    if (params->interval_ns < ORB_SLOTS_MIN_INTERVAL_NS ||
        params->interval_ns > ORB_SLOTS_MAX_INTERVAL_NS)
        return orb_fail(ORB_EINVAL, "slot object: interval %llu ns outside %llu..%llu",
                        (unsigned long long)params->interval_ns,
                        (unsigned long long)ORB_SLOTS_MIN_INTERVAL_NS,
                        (unsigned long long)ORB_SLOTS_MAX_INTERVAL_NS);
    if (params->publisher_epoch == 0)
        return orb_fail(ORB_EINVAL, "slot object: publisher epoch is zero");
    if (params->domain.clock_id != ORB_SLOTS_CLOCK_MONOTONIC)
        return orb_fail(ORB_EINVAL, "slot object: unknown clock id %u", params->domain.clock_id);

    uint8_t *h = buf;
    memset(h, 0, ORB_SLOTS_HEADER_SIZE);
    memcpy(h + OFF_MAGIC, ORB_SLOTS_MAGIC, 8);
    put_le(h + OFF_VERSION, ORB_SLOTS_VERSION, 2);
    put_le(h + OFF_HEADER_SIZE, ORB_SLOTS_HEADER_SIZE, 2);
    put_le(h + OFF_SLOT_COUNT, ORB_SLOTS_COUNT, 4);
    put_le(h + OFF_INTERVAL, params->interval_ns, 8);
    put_le(h + OFF_CLOCK_ID, params->domain.clock_id, 4);
    put_le(h + OFF_FLAGS, 0, 4);
    memcpy(h + OFF_BOOT_ID, params->domain.boot_id, 16);
    put_le(h + OFF_TIME_NS, params->domain.time_ns_id, 8);
    put_le(h + OFF_EPOCH, params->publisher_epoch, 8);
    put_le(h + OFF_CHECKSUM, fnv1a64(h, CHECKSUM_SPAN), 8);
    put_le(h + OFF_SEQUENCE, 0, 8);
    put_le(h + OFF_SLOT, orb_slots_slot_at(params->interval_ns, params->now_ns), 4);
    put_le(h + OFF_PUBLISH, params->now_ns, 8);
    return 0;
}

void orb_slots_publish(void *buf, uint64_t now_ns)
{
    uint8_t *h = buf;
    uint64_t interval = get_le(h + OFF_INTERVAL, 8);
    if (interval == 0)
        return; /* not an encoded header: never divide by zero */
    uint64_t *seq = word64(h, OFF_SEQUENCE);
    uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
    /* Sequence protocol: odd while writing; readers retry on odd or changed values. Release
     * stores order the odd sequence before the data and the data before the even sequence
     * (no fences: sanitizer builds do not model them). */
    __atomic_store_n(seq, s + 1, __ATOMIC_RELAXED);
    __atomic_store_n(word32(h, OFF_SLOT), orb_slots_slot_at(interval, now_ns), __ATOMIC_RELEASE);
    __atomic_store_n(word64(h, OFF_PUBLISH), now_ns, __ATOMIC_RELEASE);
    __atomic_store_n(seq, s + 2, __ATOMIC_RELEASE);
}

/* ---- reader ----------------------------------------------------------------------------------- */

struct publication {
    uint32_t slot;
    uint64_t time_ns;
};

static bool read_publication(const uint8_t *h, struct publication *out)
{
    uint64_t *seq = word64(h, OFF_SEQUENCE);
    for (int i = 0; i < READ_TRIES; i++) {
        uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
        if (s1 & 1)
            continue;
        /* Acquire loads keep the second sequence read after the data; seeing data of a
         * newer write makes its odd sequence visible, so the comparison fails. */
        uint32_t slot = __atomic_load_n(word32(h, OFF_SLOT), __ATOMIC_ACQUIRE);
        uint64_t t = __atomic_load_n(word64(h, OFF_PUBLISH), __ATOMIC_ACQUIRE);
        if (__atomic_load_n(seq, __ATOMIC_RELAXED) == s1) {
            out->slot = slot;
            out->time_ns = t;
            return true;
        }
    }
    return false;
}

static bool publication_consistent(const struct publication *p, uint64_t interval)
{
    return p->slot < ORB_SLOTS_COUNT && p->slot == orb_slots_slot_at(interval, p->time_ns);
}

int orb_slots_reader_open(const void *buf, size_t len, const struct orb_clock_domain *mine,
                          uint64_t expected_interval_ns, uint64_t stale_ns,
                          struct orb_slots_reader *out)
{
    if (!buf || !mine || !out)
        return orb_fail(ORB_EINVAL, "slot object: NULL buffer, domain or reader");
    if ((uintptr_t)buf % 8)
        return orb_fail(ORB_EINVAL, "slot object: mapping is not 8-byte aligned");
    if (mine->clock_id != ORB_SLOTS_CLOCK_MONOTONIC)
        return orb_fail(ORB_EINVAL, "slot object: the reader's clock id %u is not CLOCK_MONOTONIC",
                        mine->clock_id);
    const uint8_t *h = buf;
    if (len >= 8 && memcmp(h + OFF_MAGIC, ORB_SLOTS_MAGIC, 8) != 0)
        return orb_fail(ORB_EPERM, "slot object: not an OrbiTE slot object (foreign magic)");
    if (len < ORB_SLOTS_HEADER_SIZE)
        return orb_fail(ORB_EPROTO, "slot object: %zu bytes, shorter than the %d-byte header",
                        len, ORB_SLOTS_HEADER_SIZE);
    uint64_t version = get_le(h + OFF_VERSION, 2);
    if (version != ORB_SLOTS_VERSION)
        return orb_fail(ORB_EPROTO, "slot object: version %llu, this reader knows %d",
                        (unsigned long long)version, ORB_SLOTS_VERSION);
    uint64_t header_size = get_le(h + OFF_HEADER_SIZE, 2);
    if (header_size != ORB_SLOTS_HEADER_SIZE)
        return orb_fail(ORB_EPROTO, "slot object: header_size %llu, version 1 has %d",
                        (unsigned long long)header_size, ORB_SLOTS_HEADER_SIZE);
    uint64_t slot_count = get_le(h + OFF_SLOT_COUNT, 4);
    if (slot_count != ORB_SLOTS_COUNT)
        return orb_fail(ORB_EPROTO, "slot object: slot_count %llu, expected %d",
                        (unsigned long long)slot_count, ORB_SLOTS_COUNT);
    uint64_t interval = get_le(h + OFF_INTERVAL, 8);
    if (interval < ORB_SLOTS_MIN_INTERVAL_NS || interval > ORB_SLOTS_MAX_INTERVAL_NS)
        return orb_fail(ORB_EPROTO, "slot object: interval_ns %llu outside %llu..%llu",
                        (unsigned long long)interval,
                        (unsigned long long)ORB_SLOTS_MIN_INTERVAL_NS,
                        (unsigned long long)ORB_SLOTS_MAX_INTERVAL_NS);
    uint64_t clock_id = get_le(h + OFF_CLOCK_ID, 4);
    if (clock_id != ORB_SLOTS_CLOCK_MONOTONIC)
        return orb_fail(ORB_EPROTO, "slot object: clock_id %llu is not CLOCK_MONOTONIC (%d)",
                        (unsigned long long)clock_id, ORB_SLOTS_CLOCK_MONOTONIC);
    uint64_t flags = get_le(h + OFF_FLAGS, 4);
    if (flags != 0)
        return orb_fail(ORB_EPROTO, "slot object: unknown flags 0x%llx",
                        (unsigned long long)flags);
    uint64_t epoch = get_le(h + OFF_EPOCH, 8);
    if (epoch == 0)
        return orb_fail(ORB_EPROTO, "slot object: publisher_epoch is zero");
    uint64_t checksum = get_le(h + OFF_CHECKSUM, 8);
    if (checksum != fnv1a64(h, CHECKSUM_SPAN))
        return orb_fail(ORB_EPROTO, "slot object: header checksum mismatch (damaged header)");
    if (get_le(h + OFF_RESERVED, 4) != 0)
        return orb_fail(ORB_EPROTO, "slot object: reserved word after current_slot is not zero");

    struct orb_clock_domain theirs = {.clock_id = (uint32_t)clock_id,
                                      .time_ns_id = get_le(h + OFF_TIME_NS, 8)};
    memcpy(theirs.boot_id, h + OFF_BOOT_ID, 16);
    if (memcmp(theirs.boot_id, mine->boot_id, 16) != 0)
        return orb_fail(ORB_EPERM, "slot object: published by another boot (boot_id differs)");
    if (!same_domain(&theirs, mine))
        return orb_fail(ORB_EPERM,
                        "slot object: published from another time namespace (%llu, ours %llu)",
                        (unsigned long long)theirs.time_ns_id,
                        (unsigned long long)mine->time_ns_id);
    if (expected_interval_ns && expected_interval_ns != interval)
        return orb_fail(ORB_ECONFIG, "slot object: interval_ns %llu, configured %llu",
                        (unsigned long long)interval, (unsigned long long)expected_interval_ns);
    if (stale_ns == 0)
        stale_ns = ORB_SLOTS_DEFAULT_STALE_NS > 2 * interval ? ORB_SLOTS_DEFAULT_STALE_NS
                                                              : 2 * interval;
    if (stale_ns < interval)
        return orb_fail(ORB_EINVAL, "slot object: stale limit %llu ns is under the interval",
                        (unsigned long long)stale_ns);

    struct publication pub;
    if (read_publication(h, &pub) && !publication_consistent(&pub, interval))
        return orb_fail(ORB_EPROTO,
                        "slot object: current_slot %u does not match last_publish_ns %llu",
                        pub.slot, (unsigned long long)pub.time_ns);
    /* A publication torn at every try is left to orb_slots_read, which answers High only. */

    out->base = h;
    out->interval_ns = interval;
    out->stale_ns = stale_ns;
    out->epoch = epoch;
    out->checksum = checksum;
    return 0;
}

enum orb_slots_source orb_slots_read(const struct orb_slots_reader *r, uint64_t now_ns,
                                     uint32_t *slot)
{
    *slot = 0;
    const uint8_t *h = r->base;
    /* A header rewritten since open (new publisher, damage) is not the object we validated. */
    if (__atomic_load_n(word64(h, OFF_EPOCH), __ATOMIC_RELAXED) != r->epoch ||
        __atomic_load_n(word64(h, OFF_CHECKSUM), __ATOMIC_RELAXED) != r->checksum ||
        __atomic_load_n(word64(h, OFF_INTERVAL), __ATOMIC_RELAXED) != r->interval_ns)
        return ORB_SLOTS_DAMAGED;
    struct publication pub;
    if (!read_publication(h, &pub))
        return ORB_SLOTS_BUSY;
    if (!publication_consistent(&pub, r->interval_ns))
        return ORB_SLOTS_DAMAGED;
    uint64_t window_pub = pub.time_ns / r->interval_ns;
    uint64_t window_now = now_ns / r->interval_ns;
    if (window_now == window_pub) {
        *slot = pub.slot;
        return ORB_SLOTS_PUBLISHED;
    }
    if (pub.time_ns > now_ns) {
        /* Our clock read may precede a fresh publication slightly; more is not our clock. */
        if (pub.time_ns - now_ns > r->interval_ns)
            return ORB_SLOTS_DAMAGED;
        *slot = orb_slots_slot_at(r->interval_ns, now_ns);
        return ORB_SLOTS_DERIVED;
    }
    if (now_ns - pub.time_ns > r->stale_ns)
        return ORB_SLOTS_STALE;
    *slot = orb_slots_slot_at(r->interval_ns, now_ns);
    return ORB_SLOTS_DERIVED;
}

bool orb_slots_can_send(const struct orb_slots_reader *r, unsigned priority, uint64_t now_ns)
{
    uint32_t slot;
    (void)orb_slots_read(r, now_ns, &slot);
    return orb_slots_allows(slot, priority);
}
