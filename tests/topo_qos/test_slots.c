/* The shared slot object: the documented byte layout, encoder/reader round trip, every damaged
 * header field, foreign objects and other clock domains failing closed, the 2 ms rotation and
 * TENT's canSend rule, the reader's clock-boundary check, and a stalled publisher over several
 * intervals never extending a Low slot. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/error.h"
#include "topo/qos.h"
#include "topo/slots.h"

#define MS 1000000ull
#define IV (2 * MS) /* the default rotation interval */

struct object {
    _Alignas(8) uint8_t bytes[4096]; /* a page, as the helper maps it */
};

static const struct orb_clock_domain domain = {
    .clock_id = ORB_SLOTS_CLOCK_MONOTONIC,
    .boot_id = {0x6b, 0x1f, 0x0e, 0x2a, 0x91, 0x4c, 0x4d, 0x7e, 0xa0, 0x13, 0x55, 0xc2, 0x08, 0xee,
                0x3d, 0x71},
    .time_ns_id = 4026531834ull,
};

static uint64_t le(const uint8_t *p, int width)
{
    uint64_t v = 0;
    for (int i = 0; i < width; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put(uint8_t *p, uint64_t v, int width)
{
    for (int i = 0; i < width; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* FNV-1a 64, written out here from its definition to check the stored checksum. */
static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void reseal(struct object *o)
{
    put(o->bytes + 64, fnv(o->bytes, 64), 8);
}

static void encode(struct object *o, uint64_t now)
{
    memset(o, 0xa5, sizeof(*o));
    struct orb_slots_params p = {.interval_ns = IV, .domain = domain, .publisher_epoch = 0x5eed,
                                 .now_ns = now};
    assert_int_equal(orb_slots_encode(o->bytes, sizeof(o->bytes), &p), 0);
}

static int open_reader(const struct object *o, struct orb_slots_reader *r)
{
    return orb_slots_reader_open(o->bytes, sizeof(o->bytes), &domain, IV, 0, r);
}

static void expect_open_fails(const struct object *o, int status, const char *words)
{
    struct orb_slots_reader r;
    memset(&r, 0x77, sizeof(r));
    assert_int_equal(open_reader(o, &r), status);
    if (!strstr(orb_last_error(), words))
        fail_msg("message \"%s\" does not name \"%s\"", orb_last_error(), words);
    assert_int_equal(r.interval_ns, 0x7777777777777777ull); /* untouched on failure */
}

/* ---- format ------------------------------------------------------------------------------------- */

static void test_encode_rejects_bad_parameters(void **state)
{
    (void)state;
    static struct object o;
    struct orb_slots_params p = {.interval_ns = IV, .domain = domain, .publisher_epoch = 1};
    assert_int_equal(orb_slots_encode(NULL, 4096, &p), ORB_EINVAL);
    assert_int_equal(orb_slots_encode(o.bytes, 4096, NULL), ORB_EINVAL);
    assert_int_equal(orb_slots_encode(o.bytes + 4, 4000, &p), ORB_EINVAL);
    assert_int_equal(orb_slots_encode(o.bytes, ORB_SLOTS_HEADER_SIZE - 1, &p), ORB_EINVAL);
    p.interval_ns = ORB_SLOTS_MIN_INTERVAL_NS - 1;
    assert_int_equal(orb_slots_encode(o.bytes, 4096, &p), ORB_EINVAL);
    p.interval_ns = ORB_SLOTS_MAX_INTERVAL_NS + 1;
    assert_int_equal(orb_slots_encode(o.bytes, 4096, &p), ORB_EINVAL);
    p.interval_ns = IV;
    p.publisher_epoch = 0;
    assert_int_equal(orb_slots_encode(o.bytes, 4096, &p), ORB_EINVAL);
    p.publisher_epoch = 1;
    p.domain.clock_id = 4; /* CLOCK_MONOTONIC_RAW is not the shared clock */
    assert_int_equal(orb_slots_encode(o.bytes, 4096, &p), ORB_EINVAL);
    p.domain.clock_id = ORB_SLOTS_CLOCK_MONOTONIC;
    assert_int_equal(orb_slots_encode(o.bytes, ORB_SLOTS_HEADER_SIZE, &p), 0);
}

static void test_layout_matches_the_documented_bytes(void **state)
{
    (void)state;
    static struct object o;
    encode(&o, 7 * IV + 5); /* window 7: slot 1 */
    const uint8_t *b = o.bytes;
    assert_memory_equal(b, "ORBSLOTS", 8);
    assert_int_equal(le(b + 8, 2), 1);
    assert_int_equal(le(b + 10, 2), 96);
    assert_int_equal(le(b + 12, 4), 3);
    assert_int_equal(le(b + 16, 8), IV);
    assert_int_equal(le(b + 24, 4), 1);
    assert_int_equal(le(b + 28, 4), 0);
    assert_memory_equal(b + 32, domain.boot_id, 16);
    assert_int_equal(le(b + 48, 8), domain.time_ns_id);
    assert_int_equal(le(b + 56, 8), 0x5eed);
    assert_int_equal(le(b + 64, 8), fnv(b, 64));
    assert_int_equal(le(b + 72, 8), 0);
    assert_int_equal(le(b + 80, 4), 1);
    assert_int_equal(le(b + 84, 4), 0);
    assert_int_equal(le(b + 88, 8), 7 * IV + 5);
    assert_int_equal(b[96], 0xa5); /* nothing past the header is touched */

    /* The publisher moves the sequence by two and rewrites slot and time only. */
    orb_slots_publish(o.bytes, 9 * IV);
    assert_int_equal(le(b + 72, 8), 2);
    assert_int_equal(le(b + 80, 4), 0);
    assert_int_equal(le(b + 88, 8), 9 * IV);
    assert_int_equal(le(b + 64, 8), fnv(b, 64));
}

static void test_round_trip_and_rotation(void **state)
{
    (void)state;
    static struct object o;
    encode(&o, 0);
    struct orb_slots_reader r;
    assert_int_equal(open_reader(&o, &r), 0);
    assert_int_equal(r.interval_ns, IV);
    assert_int_equal(r.epoch, 0x5eed);
    assert_int_equal(r.stale_ns, 100 * MS);
    /* Over two cycles: High always; Medium in slots 1 and 2; Low only in slot 2. */
    for (uint64_t w = 0; w < 6; w++) {
        uint64_t now = w * IV + IV / 2;
        orb_slots_publish(o.bytes, now);
        uint32_t slot = 99;
        assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_PUBLISHED);
        assert_int_equal(slot, w % 3);
        assert_true(orb_slots_can_send(&r, ORB_PRIO_HIGH, now));
        assert_int_equal(orb_slots_can_send(&r, ORB_PRIO_MEDIUM, now), w % 3 >= 1);
        assert_int_equal(orb_slots_can_send(&r, ORB_PRIO_LOW, now), w % 3 == 2);
        assert_false(orb_slots_can_send(&r, 3, now)); /* no such priority */
    }
    assert_int_equal(orb_slots_slot_at(IV, 0), 0);
    assert_int_equal(orb_slots_slot_at(IV, IV - 1), 0);
    assert_int_equal(orb_slots_slot_at(IV, IV), 1);
    assert_int_equal(orb_slots_slot_at(IV, 5 * IV), 2);
    assert_false(orb_slots_allows(3, ORB_PRIO_HIGH));
}

/* ---- failing closed -------------------------------------------------------------------------------- */

static void test_open_rejects_bad_arguments(void **state)
{
    (void)state;
    static struct object o;
    encode(&o, 0);
    struct orb_slots_reader r;
    assert_int_equal(orb_slots_reader_open(NULL, 4096, &domain, 0, 0, &r), ORB_EINVAL);
    assert_int_equal(orb_slots_reader_open(o.bytes, 4096, NULL, 0, 0, &r), ORB_EINVAL);
    assert_int_equal(orb_slots_reader_open(o.bytes, 4096, &domain, 0, 0, NULL), ORB_EINVAL);
    assert_int_equal(orb_slots_reader_open(o.bytes + 1, 4095, &domain, 0, 0, &r), ORB_EINVAL);
    struct orb_clock_domain unset = domain;
    unset.clock_id = 0;
    assert_int_equal(orb_slots_reader_open(o.bytes, 4096, &unset, 0, 0, &r), ORB_EINVAL);
    assert_int_equal(orb_slots_reader_open(o.bytes, 4096, &domain, 0, IV - 1, &r), ORB_EINVAL);
    /* Short objects: empty, shorter than the magic, shorter than the header. */
    assert_int_equal(orb_slots_reader_open(o.bytes, 0, &domain, 0, 0, &r), ORB_EPROTO);
    assert_int_equal(orb_slots_reader_open(o.bytes, 7, &domain, 0, 0, &r), ORB_EPROTO);
    assert_int_equal(orb_slots_reader_open(o.bytes, 95, &domain, 0, 0, &r), ORB_EPROTO);
    assert_non_null(strstr(orb_last_error(), "95 bytes"));
    /* The header alone is enough; an explicit stale limit is kept; 0 takes the interval. */
    assert_int_equal(orb_slots_reader_open(o.bytes, 96, &domain, 0, 3 * IV, &r), 0);
    assert_int_equal(r.stale_ns, 3 * IV);
}

static void test_foreign_objects_fail_closed(void **state)
{
    (void)state;
    static struct object o;
    encode(&o, 0);
    /* TENT's own slot object starts with its 64-bit magic. */
    put(o.bytes, 0x2025082772805203ull, 8);
    expect_open_fails(&o, ORB_EPERM, "foreign magic");
    memset(o.bytes, 0, sizeof(o.bytes)); /* created but never initialised */
    expect_open_fails(&o, ORB_EPERM, "foreign magic");
    encode(&o, 0);
    o.bytes[7] = 'Z';
    expect_open_fails(&o, ORB_EPERM, "foreign magic");
}

struct damage {
    int off, width;
    uint64_t value;
    int status;
    const char *words;
};

static void test_every_damaged_field_fails_closed(void **state)
{
    (void)state;
    static const struct damage cases[] = {
        {8, 2, 0, ORB_EPROTO, "version"},
        {8, 2, 2, ORB_EPROTO, "version"},
        {10, 2, 64, ORB_EPROTO, "header_size"},
        {10, 2, 4096, ORB_EPROTO, "header_size"},
        {12, 4, 2, ORB_EPROTO, "slot_count"},
        {12, 4, 4, ORB_EPROTO, "slot_count"},
        {16, 8, 0, ORB_EPROTO, "interval_ns"},
        {16, 8, ORB_SLOTS_MIN_INTERVAL_NS - 1, ORB_EPROTO, "interval_ns"},
        {16, 8, ORB_SLOTS_MAX_INTERVAL_NS + 1, ORB_EPROTO, "interval_ns"},
        {24, 4, 0, ORB_EPROTO, "clock_id"},
        {24, 4, 4, ORB_EPROTO, "clock_id"},
        {28, 4, 1, ORB_EPROTO, "flags"},
        {56, 8, 0, ORB_EPROTO, "publisher_epoch"},
    };
    static struct object o;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct damage *d = &cases[i];
        /* Resealed: the field's own check names it. */
        encode(&o, 0);
        put(o.bytes + d->off, d->value, d->width);
        reseal(&o);
        expect_open_fails(&o, d->status, d->words);
        /* Not resealed: caught too (by the field or the checksum). */
        encode(&o, 0);
        put(o.bytes + d->off, d->value, d->width);
        expect_open_fails(&o, ORB_EPROTO, "slot object");
    }
    /* Damage only the checksum sees: a flipped bit of the boot id or the epoch must not pass
     * as "another boot" or as a valid publisher. */
    const int checksummed[] = {32, 47, 48, 55, 56, 63, 64, 71};
    for (size_t i = 0; i < sizeof(checksummed) / sizeof(checksummed[0]); i++) {
        encode(&o, 0);
        o.bytes[checksummed[i]] ^= 0x10;
        expect_open_fails(&o, ORB_EPROTO, "checksum");
    }
    /* The publisher's fields. */
    encode(&o, 0);
    put(o.bytes + 84, 1, 4);
    expect_open_fails(&o, ORB_EPROTO, "reserved");
    encode(&o, 0);
    put(o.bytes + 80, 3, 4);
    expect_open_fails(&o, ORB_EPROTO, "current_slot");
    encode(&o, 4 * IV); /* slot 1 */
    put(o.bytes + 80, 2, 4);
    expect_open_fails(&o, ORB_EPROTO, "current_slot");
    encode(&o, 4 * IV);
    put(o.bytes + 88, 6 * IV, 8); /* time of slot 0, slot still 1 */
    expect_open_fails(&o, ORB_EPROTO, "last_publish_ns");
}

static void test_other_clock_domains_and_intervals(void **state)
{
    (void)state;
    static struct object o;
    struct orb_slots_reader r;
    encode(&o, 0);
    struct orb_clock_domain other_boot = domain;
    other_boot.boot_id[15] ^= 1;
    assert_int_equal(orb_slots_reader_open(o.bytes, 4096, &other_boot, 0, 0, &r), ORB_EPERM);
    assert_non_null(strstr(orb_last_error(), "boot"));
    struct orb_clock_domain other_ns = domain;
    other_ns.time_ns_id++;
    assert_int_equal(orb_slots_reader_open(o.bytes, 4096, &other_ns, 0, 0, &r), ORB_EPERM);
    assert_non_null(strstr(orb_last_error(), "time namespace"));
    assert_int_equal(orb_slots_reader_open(o.bytes, 4096, &domain, 3 * MS, 0, &r), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "configured"));
    assert_int_equal(orb_slots_reader_open(o.bytes, 4096, &domain, 0, 0, &r), 0);
}

/* ---- the clock boundary ----------------------------------------------------------------------------------- */

static void test_published_slot_is_trusted_only_inside_its_window(void **state)
{
    (void)state;
    static struct object o;
    struct orb_slots_reader r;
    uint32_t slot;
    /* Published in the last nanosecond of a Low window (slot 2). */
    encode(&o, 3 * IV - 1 + 2 * IV); /* window 4: slot 1 */
    orb_slots_publish(o.bytes, 6 * IV - 1); /* window 5: slot 2 */
    assert_int_equal(open_reader(&o, &r), 0);
    assert_int_equal(orb_slots_read(&r, 6 * IV - 1, &slot), ORB_SLOTS_PUBLISHED);
    assert_int_equal(slot, 2);
    assert_true(orb_slots_can_send(&r, ORB_PRIO_LOW, 6 * IV - 1));
    /* One nanosecond later the window is over: the slot comes from now (High only). */
    assert_int_equal(orb_slots_read(&r, 6 * IV, &slot), ORB_SLOTS_DERIVED);
    assert_int_equal(slot, 0);
    assert_false(orb_slots_can_send(&r, ORB_PRIO_LOW, 6 * IV));
    assert_false(orb_slots_can_send(&r, ORB_PRIO_MEDIUM, 6 * IV));
    assert_true(orb_slots_can_send(&r, ORB_PRIO_HIGH, 6 * IV));
}

static void test_stalled_publisher_never_extends_low(void **state)
{
    (void)state;
    static struct object o;
    struct orb_slots_reader r;
    uint32_t slot;
    const uint64_t t0 = 1000 * IV + 2 * IV; /* window 1002: slot 0 */
    encode(&o, t0);
    assert_int_equal(orb_slots_reader_open(o.bytes, 4096, &domain, IV, 10 * IV, &r), 0);
    /* The publisher's last words were in a Low slot; then it stops. */
    const uint64_t last = t0 + 2 * IV + 1; /* window 1004: slot 2 */
    orb_slots_publish(o.bytes, last);
    assert_int_equal(orb_slots_read(&r, last, &slot), ORB_SLOTS_PUBLISHED);
    assert_int_equal(slot, 2);
    /* Within the stale limit readers follow the clock: Low only in its own windows. */
    for (uint64_t k = 1; k <= 9; k++) {
        uint64_t now = last + k * IV;
        enum orb_slots_source src = orb_slots_read(&r, now, &slot);
        assert_int_equal(src, ORB_SLOTS_DERIVED);
        assert_int_equal(slot, (2 + k) % 3);
        assert_int_equal(orb_slots_can_send(&r, ORB_PRIO_LOW, now), (2 + k) % 3 == 2);
    }
    /* Past the limit the publisher counts as stalled: High only, even in a Low window. */
    uint64_t late = last + 12 * IV; /* slot (2 + 12) % 3 = 2 by the clock */
    assert_int_equal(orb_slots_slot_at(IV, late), 2);
    assert_int_equal(orb_slots_read(&r, late, &slot), ORB_SLOTS_STALE);
    assert_int_equal(slot, 0);
    assert_false(orb_slots_can_send(&r, ORB_PRIO_LOW, late));
    assert_false(orb_slots_can_send(&r, ORB_PRIO_MEDIUM, late));
    assert_true(orb_slots_can_send(&r, ORB_PRIO_HIGH, late));
    /* The publisher comes back: its slot is trusted again. */
    orb_slots_publish(o.bytes, late);
    assert_int_equal(orb_slots_read(&r, late, &slot), ORB_SLOTS_PUBLISHED);
    assert_int_equal(slot, 2);
}

static void test_publication_from_the_future(void **state)
{
    (void)state;
    static struct object o;
    struct orb_slots_reader r;
    uint32_t slot;
    encode(&o, 50 * IV);
    assert_int_equal(open_reader(&o, &r), 0);
    /* Our clock read preceded the publication by a little: follow our own clock. */
    orb_slots_publish(o.bytes, 51 * IV + 10);
    assert_int_equal(orb_slots_read(&r, 51 * IV - 10, &slot), ORB_SLOTS_DERIVED);
    assert_int_equal(slot, orb_slots_slot_at(IV, 51 * IV - 10));
    /* More than an interval ahead is not our clock: High only. */
    orb_slots_publish(o.bytes, 53 * IV + 2);
    assert_int_equal(orb_slots_read(&r, 52 * IV - 1, &slot), ORB_SLOTS_DAMAGED);
    assert_int_equal(slot, 0);
    assert_false(orb_slots_can_send(&r, ORB_PRIO_MEDIUM, 52 * IV - 1));
}

static void test_changes_after_open_fail_closed(void **state)
{
    (void)state;
    static struct object o;
    struct orb_slots_reader r;
    uint32_t slot;
    const uint64_t now = 20 * IV + 1; /* slot 2 */
    encode(&o, now);
    assert_int_equal(open_reader(&o, &r), 0);
    assert_true(orb_slots_can_send(&r, ORB_PRIO_LOW, now));

    /* Damaged publisher fields. */
    put(o.bytes + 80, 1, 4);
    assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_DAMAGED);
    assert_int_equal(slot, 0);
    put(o.bytes + 80, 7, 4);
    assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_DAMAGED);
    assert_false(orb_slots_can_send(&r, ORB_PRIO_LOW, now));
    orb_slots_publish(o.bytes, now);
    assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_PUBLISHED);

    /* A publisher stuck mid-update (odd sequence) cannot be read consistently. */
    put(o.bytes + 72, le(o.bytes + 72, 8) + 1, 8);
    assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_BUSY);
    assert_int_equal(slot, 0);
    assert_false(orb_slots_can_send(&r, ORB_PRIO_MEDIUM, now));
    put(o.bytes + 72, le(o.bytes + 72, 8) + 1, 8);
    assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_PUBLISHED);

    /* A new publisher re-initialised the object: this reader must reopen. */
    struct orb_slots_params p = {.interval_ns = IV, .domain = domain, .publisher_epoch = 0x5eee,
                                 .now_ns = now};
    assert_int_equal(orb_slots_encode(o.bytes, sizeof(o.bytes), &p), 0);
    assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_DAMAGED);
    assert_false(orb_slots_can_send(&r, ORB_PRIO_LOW, now));
    assert_int_equal(open_reader(&o, &r), 0);
    assert_true(orb_slots_can_send(&r, ORB_PRIO_LOW, now));

    /* Static fields overwritten in place (interval) are caught the same way. */
    put(o.bytes + 16, 4 * MS, 8);
    assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_DAMAGED);
}

/* One publisher and two readers at once: a reader sees a whole publication or retries, never
 * an inconsistent one. TSan checks the access protocol; a torn read is rare on few cores, so
 * this is a smoke test. Readers use the newest announced time as now; publications are a
 * third of an interval apart. */
struct race {
    struct object o;
    struct orb_slots_reader r;
    atomic_uint_fast64_t announced;
    atomic_int done;
    atomic_long bad;
};

static void *race_publisher(void *p)
{
    struct race *x = p;
    for (uint64_t i = 1; i <= 20000; i++) {
        uint64_t t = i * (IV / 3);
        orb_slots_publish(x->o.bytes, t);
        atomic_store(&x->announced, t);
    }
    atomic_store(&x->done, 1);
    return NULL;
}

static void *race_reader(void *p)
{
    struct race *x = p;
    while (!atomic_load(&x->done)) {
        uint64_t now = atomic_load(&x->announced);
        uint32_t slot;
        enum orb_slots_source src = orb_slots_read(&x->r, now, &slot);
        /* A reader preempted for more than an interval sees a publication "from the
         * future" and answers High only (DAMAGED): correct, but not what this checks. */
        uint64_t after = atomic_load(&x->announced);
        if (src == ORB_SLOTS_BUSY || after - now + IV / 3 > IV)
            continue;
        if ((src != ORB_SLOTS_PUBLISHED && src != ORB_SLOTS_DERIVED) ||
            slot != orb_slots_slot_at(IV, now))
            atomic_fetch_add(&x->bad, 1);
    }
    return NULL;
}

static void test_concurrent_publisher_and_readers(void **state)
{
    (void)state;
    static struct race x;
    encode(&x.o, 0);
    assert_int_equal(open_reader(&x.o, &x.r), 0);
    atomic_store(&x.announced, 0);
    atomic_store(&x.done, 0);
    atomic_store(&x.bad, 0);
    pthread_t pub, rd[2];
    assert_int_equal(pthread_create(&rd[0], NULL, race_reader, &x), 0);
    assert_int_equal(pthread_create(&rd[1], NULL, race_reader, &x), 0);
    assert_int_equal(pthread_create(&pub, NULL, race_publisher, &x), 0);
    pthread_join(pub, NULL);
    pthread_join(rd[0], NULL);
    pthread_join(rd[1], NULL);
    assert_int_equal(atomic_load(&x.bad), 0);
    assert_int_equal(le(x.o.bytes + 72, 8), 40000); /* two sequence steps per publication */
}

/* ---- clock domain ------------------------------------------------------------------------------------------ */

static void test_boot_id_parsing(void **state)
{
    (void)state;
    uint8_t id[16], want[16] = {0x6b, 0x1f, 0x0e, 0x2a, 0x91, 0x4c, 0x4d, 0x7e,
                                0xa0, 0x13, 0x55, 0xc2, 0x08, 0xee, 0x3d, 0x71};
    const char *text = "6b1f0e2a-914c-4d7e-a013-55c208ee3d71\n";
    memset(id, 0, sizeof(id));
    assert_int_equal(orb_clock_domain_parse_boot_id(text, 37, id), 0);
    assert_memory_equal(id, want, 16);
    memset(id, 0, sizeof(id));
    assert_int_equal(orb_clock_domain_parse_boot_id("6B1F0E2A-914C-4D7E-A013-55C208EE3D71", 36, id), 0);
    assert_memory_equal(id, want, 16);

    uint8_t untouched[16];
    memset(untouched, 0xcc, sizeof(untouched));
    memcpy(id, untouched, 16);
    assert_int_equal(orb_clock_domain_parse_boot_id(text, 35, id), ORB_EPROTO);
    assert_int_equal(orb_clock_domain_parse_boot_id("6b1f0e2a-914c-4d7e-a013-55c208ee3d71x", 37, id), ORB_EPROTO);
    assert_int_equal(orb_clock_domain_parse_boot_id("6b1f0e2a0914c-4d7e-a013-55c208ee3d71", 36, id), ORB_EPROTO);
    assert_int_equal(orb_clock_domain_parse_boot_id("6b1f0e2a-914c-4d7e-a013-55c208ee3d7g", 36, id), ORB_EPROTO);
    assert_int_equal(orb_clock_domain_parse_boot_id(NULL, 36, id), ORB_EINVAL);
    assert_memory_equal(id, untouched, 16);
}

static void test_current_domain_is_stable(void **state)
{
    (void)state;
    struct orb_clock_domain a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0xff, sizeof(b));
    assert_int_equal(orb_clock_domain_current(&a), 0);
    assert_int_equal(orb_clock_domain_current(&b), 0);
    assert_int_equal(a.clock_id, ORB_SLOTS_CLOCK_MONOTONIC);
    assert_int_equal(a.time_ns_id, b.time_ns_id);
    assert_memory_equal(a.boot_id, b.boot_id, 16);
    uint8_t zero[16] = {0};
    assert_memory_not_equal(a.boot_id, zero, 16);
    assert_int_equal(orb_clock_domain_current(NULL), ORB_EINVAL);

    /* An object published in this domain opens here. */
    static struct object o;
    struct orb_slots_params p = {.interval_ns = IV, .domain = a, .publisher_epoch = 9, .now_ns = 0};
    assert_int_equal(orb_slots_encode(o.bytes, sizeof(o.bytes), &p), 0);
    struct orb_slots_reader r;
    assert_int_equal(orb_slots_reader_open(o.bytes, sizeof(o.bytes), &b, IV, 0, &r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_rejects_bad_parameters),
        cmocka_unit_test(test_layout_matches_the_documented_bytes),
        cmocka_unit_test(test_round_trip_and_rotation),
        cmocka_unit_test(test_open_rejects_bad_arguments),
        cmocka_unit_test(test_foreign_objects_fail_closed),
        cmocka_unit_test(test_every_damaged_field_fails_closed),
        cmocka_unit_test(test_other_clock_domains_and_intervals),
        cmocka_unit_test(test_published_slot_is_trusted_only_inside_its_window),
        cmocka_unit_test(test_stalled_publisher_never_extends_low),
        cmocka_unit_test(test_publication_from_the_future),
        cmocka_unit_test(test_changes_after_open_fail_closed),
        cmocka_unit_test(test_concurrent_publisher_and_readers),
        cmocka_unit_test(test_boot_id_parsing),
        cmocka_unit_test(test_current_domain_is_stable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
