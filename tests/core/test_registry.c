/* The registration table: containment, permissions, repeated and batch registration, pins,
 * ids, descriptions, and concurrent admission against add/remove. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/memory.h"
#include "core/registry.h"

#define SENTINEL_ID 0xdeadbeefull

struct release_log {
    atomic_int calls;
};

static void count_release(void *ptr, size_t len, void *ctx)
{
    (void)ptr;
    (void)len;
    struct release_log *log = ctx;
    atomic_fetch_add(&log->calls, 1);
}

/* An owner over `len` heap bytes whose release is counted in `log` (and frees the bytes). */
static void free_release(void *ptr, size_t len, void *ctx)
{
    count_release(ptr, len, ctx);
    free(ptr);
}

static orb_host_memory *tracked_owner(size_t len, struct release_log *log)
{
    void *bytes = calloc(1, len);
    assert_non_null(bytes);
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_wrap(bytes, len, free_release, log, &mem), 0);
    return mem;
}

static orb_host_memory *plain_owner(size_t len)
{
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_alloc(len, 0, &mem), 0);
    return mem;
}

static uint64_t addr_of(orb_host_memory *mem, size_t offset)
{
    return (uint64_t)(uintptr_t)orb_host_memory_data(mem) + offset;
}

static struct orb_registry *new_registry(uint32_t max)
{
    struct orb_registry *reg = NULL;
    assert_int_equal(orb_registry_new(max, NULL, NULL, &reg), 0);
    assert_non_null(reg);
    return reg;
}

/* acquire + release, returning only the status. */
static int probe(struct orb_registry *reg, uint64_t addr, uint64_t len, enum orb_perm need)
{
    struct orb_reg *r = NULL;
    int rc = orb_registry_acquire(reg, addr, len, need, &r);
    if (rc == 0) {
        assert_non_null(r);
        assert_true(r->base <= addr && addr + len <= r->base + r->len);
        orb_registry_release(r);
    } else {
        assert_null(r);
    }
    return rc;
}

/* acquire + release, returning the id that admitted the range (0 on failure). */
static orb_reg_id probe_id(struct orb_registry *reg, uint64_t addr, uint64_t len, enum orb_perm need)
{
    struct orb_reg *r = NULL;
    if (orb_registry_acquire(reg, addr, len, need, &r) != 0)
        return 0;
    orb_reg_id id = r->id;
    orb_registry_release(r);
    return id;
}

/* ------------------------------------------------------------------------ */
/* Argument checks                                                           */
/* ------------------------------------------------------------------------ */

static void test_new_and_free_arguments(void **state)
{
    (void)state;
    struct orb_registry *reg = (struct orb_registry *)(uintptr_t)0x1;
    assert_int_equal(orb_registry_new(0, NULL, NULL, &reg), ORB_EINVAL);
    assert_ptr_equal(reg, (struct orb_registry *)(uintptr_t)0x1);
    assert_int_equal(orb_registry_new(4, NULL, NULL, NULL), ORB_EINVAL);
    orb_registry_free(NULL);
    orb_registry_release(NULL);
    assert_int_equal(orb_registry_count(NULL), 0);
}

static void test_add_rejects_bad_ranges(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4096);
    orb_reg_id id = SENTINEL_ID;

    assert_int_equal(orb_registry_add(reg, NULL, 0, 16, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add(reg, mem, 0, 0, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "length"));
    assert_int_equal(orb_registry_add(reg, mem, 0, 4097, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add(reg, mem, 1, 4096, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add(reg, mem, 4096, 1, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add(reg, mem, SIZE_MAX, 2, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add(reg, mem, 0, SIZE_MAX, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add(reg, mem, 0, 16, (enum orb_perm)2, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add(reg, mem, 0, 16, (enum orb_perm)-1, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add(reg, mem, 0, 16, ORB_PERM_LOCAL, NULL), ORB_EINVAL);
    assert_int_equal(orb_registry_add(NULL, mem, 0, 16, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(id, SENTINEL_ID);
    assert_int_equal(orb_registry_count(reg), 0);

    /* The exact end of the owner is fine. */
    assert_int_equal(orb_registry_add(reg, mem, 4095, 1, ORB_PERM_LOCAL, &id), 0);
    assert_int_equal(orb_registry_add(reg, mem, 0, 4096, ORB_PERM_LOCAL, &id), 0);
    assert_int_equal(orb_registry_count(reg), 2);

    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_lookup_rejects_bad_ranges(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4096);
    orb_reg_id id;
    assert_int_equal(orb_registry_add(reg, mem, 0, 4096, ORB_PERM_REMOTE_WRITE, &id), 0);
    uint64_t base = addr_of(mem, 0);
    struct orb_reg *r = (struct orb_reg *)(uintptr_t)0x1;
    struct orb_local_region region = { .id = SENTINEL_ID };

    assert_int_equal(orb_registry_acquire(reg, base, 0, ORB_PERM_LOCAL, &r), ORB_EINVAL);
    assert_int_equal(orb_registry_acquire(reg, UINT64_MAX, 2, ORB_PERM_LOCAL, &r), ORB_EINVAL);
    assert_int_equal(orb_registry_acquire(reg, base, 16, (enum orb_perm)2, &r), ORB_EINVAL);
    assert_int_equal(orb_registry_acquire(reg, base, 16, ORB_PERM_LOCAL, NULL), ORB_EINVAL);
    assert_int_equal(orb_registry_acquire(NULL, base, 16, ORB_PERM_LOCAL, &r), ORB_EINVAL);
    assert_ptr_equal(r, (struct orb_reg *)(uintptr_t)0x1);
    assert_int_equal(orb_registry_resolve(reg, base, 0, &region), ORB_EINVAL);
    assert_int_equal(orb_registry_resolve(reg, 1, UINT64_MAX, &region), ORB_EINVAL);
    assert_int_equal(orb_registry_resolve(reg, base, 1, NULL), ORB_EINVAL);
    assert_int_equal(region.id, SENTINEL_ID);

    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

/* ------------------------------------------------------------------------ */
/* Containment and permission                                                */
/* ------------------------------------------------------------------------ */

static void test_containment_edges(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4096);
    orb_reg_id id;
    assert_int_equal(orb_registry_add(reg, mem, 100, 1000, ORB_PERM_LOCAL, &id), 0);
    uint64_t start = addr_of(mem, 100), end = addr_of(mem, 1100);

    /* One byte outside each end, and ranges straddling each edge. */
    assert_int_equal(probe(reg, start - 1, 1, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(probe(reg, end, 1, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(probe(reg, start - 1, 2, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(probe(reg, end - 1, 2, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(probe(reg, start - 1, 1002, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(probe(reg, start, 1001, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(probe(reg, 0, 1, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(probe(reg, UINT64_MAX - 1, 1, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(probe(reg, UINT64_MAX, 1, ORB_PERM_LOCAL), ORB_EINVAL); /* end not representable */

    /* Both edges from inside. */
    assert_int_equal(probe(reg, start, 1, ORB_PERM_LOCAL), 0);
    assert_int_equal(probe(reg, end - 1, 1, ORB_PERM_LOCAL), 0);
    assert_int_equal(probe(reg, start, 1000, ORB_PERM_LOCAL), 0);
    assert_int_equal(probe(reg, start + 10, 500, ORB_PERM_LOCAL), 0);

    struct orb_local_region region;
    assert_int_equal(orb_registry_resolve(reg, end - 1, 2, &region), ORB_ENOENT);
    assert_int_equal(orb_registry_resolve(reg, start - 1, 1, &region), ORB_ENOENT);
    assert_int_equal(orb_registry_resolve(reg, end - 1, 1, &region), 0);
    assert_int_equal(region.id, id);
    assert_int_equal(region.base, start);
    assert_int_equal(region.length, 1000);
    assert_int_equal(region.perm, ORB_PERM_LOCAL);

    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_permissions_for_each_need(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(3 * 4096);
    orb_reg_id id;
    assert_int_equal(orb_registry_add(reg, mem, 0, 4096, ORB_PERM_LOCAL, &id), 0);
    assert_int_equal(orb_registry_add(reg, mem, 4096, 4096, ORB_PERM_REMOTE_READ, &id), 0);
    assert_int_equal(orb_registry_add(reg, mem, 8192, 4096, ORB_PERM_REMOTE_WRITE, &id), 0);
    uint64_t local = addr_of(mem, 10), read = addr_of(mem, 4106), write = addr_of(mem, 8202);

    assert_int_equal(probe(reg, local, 8, ORB_PERM_LOCAL), 0);
    /* Local-only memory is invisible to peers: the answer of unregistered memory, not EPERM. */
    assert_int_equal(probe(reg, local, 8, ORB_PERM_REMOTE_READ), ORB_ENOENT);
    assert_non_null(strstr(orb_last_error(), "open to peers"));
    assert_int_equal(probe(reg, local, 8, ORB_PERM_REMOTE_WRITE), ORB_ENOENT);

    assert_int_equal(probe(reg, read, 8, ORB_PERM_LOCAL), 0);
    assert_int_equal(probe(reg, read, 8, ORB_PERM_REMOTE_READ), 0);
    assert_int_equal(probe(reg, read, 8, ORB_PERM_REMOTE_WRITE), ORB_EPERM);
    assert_non_null(strstr(orb_last_error(), "WRITE"));

    assert_int_equal(probe(reg, write, 8, ORB_PERM_LOCAL), 0);
    assert_int_equal(probe(reg, write, 8, ORB_PERM_REMOTE_READ), 0);
    assert_int_equal(probe(reg, write, 8, ORB_PERM_REMOTE_WRITE), 0);

    /* A range spanning two adjacent registrations is contained by neither. */
    assert_int_equal(probe(reg, addr_of(mem, 4090), 16, ORB_PERM_LOCAL), ORB_ENOENT);

    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_overlapping_and_nested(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4096);
    orb_reg_id a, b, outer, inner;
    /* a = [0, 100) local, b = [50, 150) read/write: overlapping. */
    assert_int_equal(orb_registry_add(reg, mem, 0, 100, ORB_PERM_LOCAL, &a), 0);
    assert_int_equal(orb_registry_add(reg, mem, 50, 100, ORB_PERM_REMOTE_WRITE, &b), 0);
    assert_int_not_equal(a, b);
    assert_int_equal(orb_registry_count(reg), 2);

    assert_int_equal(probe_id(reg, addr_of(mem, 60), 10, ORB_PERM_REMOTE_WRITE), b);
    assert_int_equal(probe_id(reg, addr_of(mem, 120), 10, ORB_PERM_LOCAL), b);
    assert_int_equal(probe_id(reg, addr_of(mem, 10), 10, ORB_PERM_LOCAL), a);
    assert_int_equal(probe(reg, addr_of(mem, 10), 10, ORB_PERM_REMOTE_READ), ORB_ENOENT);
    assert_int_equal(probe(reg, addr_of(mem, 40), 20, ORB_PERM_REMOTE_READ), ORB_ENOENT);
    assert_int_equal(probe(reg, addr_of(mem, 40), 120, ORB_PERM_LOCAL), ORB_ENOENT);

    /* outer = [1000, 3000) read, inner = [1500, 1510) local and the same base as outer. */
    assert_int_equal(orb_registry_add(reg, mem, 1000, 2000, ORB_PERM_REMOTE_READ, &outer), 0);
    assert_int_equal(orb_registry_add(reg, mem, 1500, 10, ORB_PERM_LOCAL, &inner), 0);
    orb_reg_id same_base;
    assert_int_equal(orb_registry_add(reg, mem, 1000, 10, ORB_PERM_LOCAL, &same_base), 0);
    assert_int_not_equal(same_base, outer);
    /* The containing registration that allows the need is preferred over the closer one. */
    assert_int_equal(probe_id(reg, addr_of(mem, 1500), 10, ORB_PERM_REMOTE_READ), outer);
    assert_int_equal(probe_id(reg, addr_of(mem, 1000), 10, ORB_PERM_REMOTE_READ), outer);
    assert_int_equal(probe(reg, addr_of(mem, 1500), 10, ORB_PERM_REMOTE_WRITE), ORB_EPERM);
    assert_int_equal(probe(reg, addr_of(mem, 1500), 11, ORB_PERM_LOCAL), 0);

    /* Without the outer one, the nested range is local only; beyond it nothing contains. */
    assert_int_equal(orb_registry_remove(reg, outer), 0);
    assert_int_equal(probe(reg, addr_of(mem, 1500), 10, ORB_PERM_REMOTE_READ), ORB_ENOENT);
    assert_int_equal(probe_id(reg, addr_of(mem, 1500), 10, ORB_PERM_LOCAL), inner);
    assert_int_equal(probe(reg, addr_of(mem, 1500), 11, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(probe(reg, addr_of(mem, 2000), 1, ORB_PERM_LOCAL), ORB_ENOENT);

    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_long_registration_found_past_many_short_ones(void **state)
{
    (void)state;
    enum { SHORT = 200 };
    struct orb_registry *reg = new_registry(1024);
    orb_host_memory *mem = plain_owner(1 << 20);
    orb_reg_id big;
    assert_int_equal(orb_registry_add(reg, mem, 0, 1 << 20, ORB_PERM_REMOTE_READ, &big), 0);
    for (size_t i = 0; i < SHORT; i++) {
        orb_reg_id id;
        assert_int_equal(orb_registry_add(reg, mem, 1000 * (i + 1), 10, ORB_PERM_LOCAL, &id), 0);
    }
    /* Lookups far above the long registration's base must scan back past the short ones. */
    assert_int_equal(probe_id(reg, addr_of(mem, 500005), 1, ORB_PERM_REMOTE_READ), big);
    assert_int_equal(probe_id(reg, addr_of(mem, 3000), 10, ORB_PERM_REMOTE_READ), big);
    assert_int_equal(probe_id(reg, addr_of(mem, (1 << 20) - 1), 1, ORB_PERM_LOCAL), big);
    assert_int_equal(orb_registry_remove(reg, big), 0);
    assert_int_equal(probe(reg, addr_of(mem, 3000), 10, ORB_PERM_REMOTE_READ), ORB_ENOENT);
    assert_int_equal(probe(reg, addr_of(mem, 500005), 1, ORB_PERM_LOCAL), ORB_ENOENT);
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_disjoint_owners(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *m1 = plain_owner(8192), *m2 = plain_owner(8192);
    orb_reg_id id1, id2;
    assert_int_equal(orb_registry_add(reg, m1, 0, 8192, ORB_PERM_REMOTE_READ, &id1), 0);
    assert_int_equal(orb_registry_add(reg, m2, 0, 8192, ORB_PERM_REMOTE_WRITE, &id2), 0);
    assert_int_equal(probe_id(reg, addr_of(m1, 100), 100, ORB_PERM_REMOTE_READ), id1);
    assert_int_equal(probe_id(reg, addr_of(m2, 100), 100, ORB_PERM_REMOTE_WRITE), id2);
    assert_int_equal(probe(reg, addr_of(m1, 100), 100, ORB_PERM_REMOTE_WRITE), ORB_EPERM);

    struct orb_reg *r = NULL;
    assert_int_equal(orb_registry_acquire(reg, addr_of(m2, 5), 1, ORB_PERM_LOCAL, &r), 0);
    assert_ptr_equal(r->owner, m2);
    assert_ptr_equal(r->kind, &orb_memkind_host);
    assert_ptr_equal(r->kind->cpu_view(r, addr_of(m2, 5)), (uint8_t *)orb_host_memory_data(m2) + 5);
    orb_registry_release(r);

    orb_registry_free(reg);
    orb_host_memory_unref(m1);
    orb_host_memory_unref(m2);
}

/* ------------------------------------------------------------------------ */
/* Repeated registration, unregister, ids                                    */
/* ------------------------------------------------------------------------ */

static void test_repeated_registration_keeps_permission(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4096);
    orb_reg_id first, second, third;
    assert_int_equal(orb_registry_add(reg, mem, 64, 256, ORB_PERM_REMOTE_READ, &first), 0);
    assert_int_equal(orb_registry_add(reg, mem, 64, 256, ORB_PERM_REMOTE_WRITE, &second), 0);
    assert_int_equal(orb_registry_add(reg, mem, 64, 256, ORB_PERM_LOCAL, &third), 0);
    assert_int_equal(first, second);
    assert_int_equal(first, third);
    assert_int_equal(orb_registry_count(reg), 1);

    struct orb_local_region region;
    assert_int_equal(orb_registry_resolve(reg, addr_of(mem, 64), 256, &region), 0);
    assert_int_equal(region.perm, ORB_PERM_REMOTE_READ);
    assert_int_equal(probe(reg, addr_of(mem, 64), 256, ORB_PERM_REMOTE_WRITE), ORB_EPERM);
    assert_int_equal(probe(reg, addr_of(mem, 64), 256, ORB_PERM_REMOTE_READ), 0);

    /* Three registrations need three unregisters. */
    assert_int_equal(orb_registry_remove(reg, first), 0);
    assert_int_equal(orb_registry_remove(reg, first), 0);
    assert_int_equal(probe(reg, addr_of(mem, 64), 256, ORB_PERM_REMOTE_READ), 0);
    assert_int_equal(orb_registry_count(reg), 1);
    assert_int_equal(orb_registry_remove(reg, first), 0);
    assert_int_equal(probe(reg, addr_of(mem, 64), 256, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(orb_registry_count(reg), 0);
    assert_int_equal(orb_registry_remove(reg, first), ORB_ENOENT);

    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

/* Adopting bytes succeeds only for a range nobody registered: the table answers under its lock
 * and, on refusal, changes nothing (no reference is added that would have to be undone). */
static void test_adopt_refuses_published_range(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4096);
    orb_reg_id shared, adopted, again = 77;
    assert_int_equal(orb_registry_add(reg, mem, 0, 512, ORB_PERM_REMOTE_READ, &shared), 0);
    assert_int_equal(orb_registry_adopt(reg, mem, 0, 512, ORB_PERM_LOCAL, &again), ORB_EEXIST);
    assert_int_equal(again, 77);
    assert_non_null(strstr(orb_last_error(), "already registered"));
    /* One unregister is enough: the refusal added no reference. */
    assert_int_equal(orb_registry_remove(reg, shared), 0);
    assert_int_equal(orb_registry_count(reg), 0);
    /* Free again, the range can be adopted, and then neither adopted nor shared twice. */
    assert_int_equal(orb_registry_adopt(reg, mem, 0, 512, ORB_PERM_LOCAL, &adopted), 0);
    assert_int_not_equal(adopted, shared);
    assert_int_equal(orb_registry_adopt(reg, mem, 0, 512, ORB_PERM_LOCAL, &again), ORB_EEXIST);
    /* An overlapping but different range is another registration. */
    assert_int_equal(orb_registry_adopt(reg, mem, 0, 511, ORB_PERM_LOCAL, &again), 0);
    assert_int_equal(orb_registry_count(reg), 2);
    assert_int_equal(orb_registry_remove(reg, adopted), 0);
    assert_int_equal(orb_registry_remove(reg, again), 0);
    assert_int_equal(orb_registry_count(reg), 0);
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_ids_never_reused(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(4);
    orb_host_memory *mem = plain_owner(4096);
    assert_int_equal(orb_registry_remove(reg, 0), ORB_ENOENT);
    assert_int_equal(orb_registry_remove(reg, 1), ORB_ENOENT);

    orb_reg_id previous = 0;
    for (int round = 0; round < 100; round++) {
        orb_reg_id id;
        assert_int_equal(orb_registry_add(reg, mem, 0, 128, ORB_PERM_LOCAL, &id), 0);
        assert_int_not_equal(id, 0);
        assert_true(id > previous);
        if (previous != 0)
            assert_int_equal(orb_registry_remove(reg, previous), ORB_ENOENT);
        assert_int_equal(orb_registry_remove(reg, id), 0);
        previous = id;
    }
    assert_int_equal(orb_registry_count(reg), 0);
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_budget_for_single_registrations(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(2);
    orb_host_memory *mem = plain_owner(4096);
    orb_reg_id a, b, c = SENTINEL_ID, again;
    assert_int_equal(orb_registry_add(reg, mem, 0, 10, ORB_PERM_LOCAL, &a), 0);
    assert_int_equal(orb_registry_add(reg, mem, 10, 10, ORB_PERM_LOCAL, &b), 0);
    assert_int_equal(orb_registry_add(reg, mem, 20, 10, ORB_PERM_LOCAL, &c), ORB_ERESOURCE);
    assert_int_equal(c, SENTINEL_ID);
    /* A repeated registration takes no new budget. */
    assert_int_equal(orb_registry_add(reg, mem, 0, 10, ORB_PERM_LOCAL, &again), 0);
    assert_int_equal(again, a);
    /* Unregistering returns the budget. */
    assert_int_equal(orb_registry_remove(reg, b), 0);
    assert_int_equal(orb_registry_add(reg, mem, 20, 10, ORB_PERM_LOCAL, &c), 0);
    assert_int_equal(orb_registry_count(reg), 2);
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_owner_retained_until_last_unregister(void **state)
{
    (void)state;
    struct release_log log = { 0 };
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = tracked_owner(4096, &log);
    orb_reg_id a, b;
    assert_int_equal(orb_registry_add(reg, mem, 0, 100, ORB_PERM_LOCAL, &a), 0);
    assert_int_equal(orb_registry_add(reg, mem, 100, 100, ORB_PERM_LOCAL, &b), 0);
    orb_host_memory_unref(mem); /* the registrations keep the owner */
    assert_int_equal(atomic_load(&log.calls), 0);
    assert_int_equal(orb_registry_remove(reg, a), 0);
    assert_int_equal(atomic_load(&log.calls), 0);
    assert_int_equal(orb_registry_remove(reg, b), 0);
    assert_int_equal(atomic_load(&log.calls), 1);
    orb_registry_free(reg);
}

static void test_unregister_while_pinned(void **state)
{
    (void)state;
    struct release_log log = { 0 };
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = tracked_owner(4096, &log);
    orb_reg_id id;
    assert_int_equal(orb_registry_add(reg, mem, 0, 4096, ORB_PERM_REMOTE_WRITE, &id), 0);
    uint64_t base = addr_of(mem, 0);
    orb_host_memory_unref(mem); /* the registration keeps the owner alive */

    struct orb_reg *p1 = NULL, *p2 = NULL;
    struct orb_local_region region;
    assert_int_equal(orb_registry_acquire(reg, 0, 1, ORB_PERM_LOCAL, &p1), ORB_ENOENT);
    assert_int_equal(orb_registry_resolve(reg, 1, 1, &region), ORB_ENOENT);
    assert_int_equal(orb_registry_acquire(reg, base, 4096, ORB_PERM_REMOTE_WRITE, &p1), 0);
    assert_int_equal(orb_registry_acquire(reg, base + 8, 8, ORB_PERM_REMOTE_READ, &p2), 0);
    assert_ptr_equal(p1, p2);

    /* Unregister hides the range at once, but the backing stays. */
    assert_int_equal(orb_registry_remove(reg, id), 0);
    assert_int_equal(probe(reg, base, 1, ORB_PERM_LOCAL), ORB_ENOENT);
    assert_int_equal(orb_registry_resolve(reg, base, 1, &region), ORB_ENOENT);
    assert_int_equal(orb_registry_remove(reg, id), ORB_ENOENT);
    assert_int_equal(orb_registry_count(reg), 0);
    assert_int_equal(atomic_load(&log.calls), 0);
    uint8_t *bytes = p1->kind->cpu_view(p1, base);
    bytes[0] = 0x5a;
    bytes[4095] = 0xa5;
    assert_int_equal(p1->id, id);

    orb_registry_release(p1);
    assert_int_equal(atomic_load(&log.calls), 0);
    assert_int_equal(((uint8_t *)p2->kind->cpu_view(p2, base))[4095], 0xa5);
    orb_registry_release(p2);
    assert_int_equal(atomic_load(&log.calls), 1);
    orb_registry_free(reg);
}

/* A pinned registration answers for further ranges by orb_reg_admits(), with the rules of an
 * acquisition; the unpublish count moves with every registration that leaves the table (and
 * only then), so that a holder knows when to ask the table again. */
static void test_admits_and_the_unpublish_count(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4 * 4096);
    orb_reg_id local, read, write, again;
    uint64_t u0 = orb_registry_unpublished(reg);
    assert_int_equal(u0, 0);
    assert_int_equal(orb_registry_add(reg, mem, 0, 4096, ORB_PERM_LOCAL, &local), 0);
    assert_int_equal(orb_registry_add(reg, mem, 4096, 4096, ORB_PERM_REMOTE_READ, &read), 0);
    assert_int_equal(orb_registry_add(reg, mem, 8192, 8192, ORB_PERM_REMOTE_WRITE, &write), 0);
    assert_int_equal(orb_registry_unpublished(reg), 0); /* adding takes nothing out */

    struct orb_reg *w = NULL, *r = NULL, *l = NULL;
    uint64_t wb = addr_of(mem, 8192), rb = addr_of(mem, 4096), lb = addr_of(mem, 0);
    assert_int_equal(orb_registry_acquire(reg, wb, 1, ORB_PERM_REMOTE_WRITE, &w), 0);
    assert_int_equal(orb_registry_acquire(reg, rb, 1, ORB_PERM_REMOTE_READ, &r), 0);
    assert_int_equal(orb_registry_acquire(reg, lb, 1, ORB_PERM_LOCAL, &l), 0);
    /* Containment, to the byte at both ends. */
    assert_true(orb_reg_admits(w, wb, 8192, ORB_PERM_REMOTE_WRITE));
    assert_true(orb_reg_admits(w, wb + 8191, 1, ORB_PERM_REMOTE_READ));
    assert_false(orb_reg_admits(w, wb, 8193, ORB_PERM_REMOTE_WRITE));
    assert_false(orb_reg_admits(w, wb - 1, 2, ORB_PERM_REMOTE_WRITE));
    assert_false(orb_reg_admits(w, wb + 8192, 1, ORB_PERM_REMOTE_READ));
    /* Permission: a READ-only registration admits no WRITE, a local-only one no peer at all. */
    assert_true(orb_reg_admits(r, rb, 4096, ORB_PERM_REMOTE_READ));
    assert_false(orb_reg_admits(r, rb, 4096, ORB_PERM_REMOTE_WRITE));
    assert_true(orb_reg_admits(l, lb, 4096, ORB_PERM_LOCAL));
    assert_false(orb_reg_admits(l, lb, 1, ORB_PERM_REMOTE_READ));
    assert_false(orb_reg_admits(l, lb, 1, ORB_PERM_REMOTE_WRITE));
    /* Bad arguments admit nothing. */
    assert_false(orb_reg_admits(NULL, wb, 1, ORB_PERM_REMOTE_READ));
    assert_false(orb_reg_admits(w, wb, 0, ORB_PERM_REMOTE_READ));
    assert_false(orb_reg_admits(w, UINT64_MAX, 2, ORB_PERM_REMOTE_READ));
    assert_false(orb_reg_admits(w, wb, 1, (enum orb_perm)77));

    /* A second user reference's unregistration leaves the range published: no change. */
    assert_int_equal(orb_registry_add(reg, mem, 8192, 8192, ORB_PERM_REMOTE_WRITE, &again), 0);
    assert_int_equal(again, write);
    assert_int_equal(orb_registry_remove(reg, write), 0);
    assert_int_equal(orb_registry_unpublished(reg), 0);
    assert_int_equal(orb_registry_remove(reg, write), 0);
    assert_int_equal(orb_registry_unpublished(reg), 1);
    assert_int_equal(orb_registry_remove(reg, write), ORB_ENOENT); /* a failed removal: none */
    assert_int_equal(orb_registry_unpublished(reg), 1);
    /* Retiring every one counts each. */
    orb_registry_retire_all(reg);
    assert_int_equal(orb_registry_unpublished(reg), 3);
    orb_registry_release(w);
    orb_registry_release(r);
    orb_registry_release(l);
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_free_with_pinned_registration(void **state)
{
    (void)state;
    struct release_log log = { 0 };
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = tracked_owner(4096, &log);
    orb_reg_id pinned_id, idle_id;
    assert_int_equal(orb_registry_add(reg, mem, 0, 64, ORB_PERM_LOCAL, &pinned_id), 0);
    assert_int_equal(orb_registry_add(reg, mem, 64, 64, ORB_PERM_LOCAL, &idle_id), 0);
    struct orb_reg *r = NULL;
    assert_int_equal(orb_registry_acquire(reg, addr_of(mem, 0), 64, ORB_PERM_LOCAL, &r), 0);
    orb_host_memory_unref(mem);

    orb_registry_free(reg);
    assert_int_equal(atomic_load(&log.calls), 0); /* the pinned registration holds the owner */
    assert_int_equal(r->id, pinned_id);
    orb_registry_release(r);
    assert_int_equal(atomic_load(&log.calls), 1);
}

/* ------------------------------------------------------------------------ */
/* Batches                                                                   */
/* ------------------------------------------------------------------------ */

static void test_batch_rejects_arguments(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4096);
    struct orb_host_range range = { mem, 0, 16, ORB_PERM_LOCAL };
    orb_reg_id id = SENTINEL_ID;
    assert_int_equal(orb_registry_add_batch(NULL, &range, 1, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add_batch(reg, NULL, 1, &id), ORB_EINVAL);
    assert_int_equal(orb_registry_add_batch(reg, &range, 1, NULL), ORB_EINVAL);
    assert_int_equal(id, SENTINEL_ID);
    /* An empty batch changes nothing and succeeds. */
    assert_int_equal(orb_registry_add_batch(reg, NULL, 0, NULL), 0);
    assert_int_equal(orb_registry_count(reg), 0);
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_batch_failure_at_last_index_changes_nothing(void **state)
{
    (void)state;
    enum { N = 12 };
    struct release_log log = { 0 };
    struct orb_registry *reg = new_registry(64);
    orb_host_memory *mem = tracked_owner(1 << 16, &log);
    orb_reg_id existing;
    assert_int_equal(orb_registry_add(reg, mem, 0, 64, ORB_PERM_LOCAL, &existing), 0);

    const char *bad_kinds[] = { "length", "owner", "offset", "permission" };
    for (size_t kind = 0; kind < 4; kind++) {
        struct orb_host_range ranges[N];
        orb_reg_id ids[N];
        for (size_t i = 0; i < N; i++) {
            ranges[i] = (struct orb_host_range){ mem, 1024 * (i + 1), 100, ORB_PERM_REMOTE_READ };
            ids[i] = SENTINEL_ID;
        }
        ranges[3] = (struct orb_host_range){ mem, 0, 64, ORB_PERM_REMOTE_WRITE }; /* existing */
        switch (kind) {
        case 0: ranges[N - 1].length = 0; break;
        case 1: ranges[N - 1].owner = NULL; break;
        case 2: ranges[N - 1].offset = (1 << 16) - 99; break;
        default: ranges[N - 1].perm = (enum orb_perm)7; break;
        }
        assert_int_equal(orb_registry_add_batch(reg, ranges, N, ids), ORB_EINVAL);
        assert_non_null(strstr(orb_last_error(), "range 11"));
        assert_non_null(strstr(orb_last_error(), bad_kinds[kind]));
        for (size_t i = 0; i < N; i++)
            assert_int_equal(ids[i], SENTINEL_ID);
        assert_int_equal(orb_registry_count(reg), 1);
        assert_int_equal(probe(reg, addr_of(mem, 1024), 100, ORB_PERM_LOCAL), ORB_ENOENT);
    }

    /* The existing registration gained no reference: one unregister retires it. */
    assert_int_equal(orb_registry_remove(reg, existing), 0);
    assert_int_equal(orb_registry_count(reg), 0);
    orb_host_memory_unref(mem);
    assert_int_equal(atomic_load(&log.calls), 1); /* no registration kept the owner */
    orb_registry_free(reg);
}

static void test_batch_budget_exhausted_mid_batch(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(4);
    orb_host_memory *mem = plain_owner(4096);
    orb_reg_id existing;
    assert_int_equal(orb_registry_add(reg, mem, 0, 16, ORB_PERM_LOCAL, &existing), 0);

    /* Room for three: index 0 repeats the existing range and index 2 repeats index 1, so the
     * fourth new range is index 5. */
    struct orb_host_range ranges[7] = {
        { mem, 0, 16, ORB_PERM_LOCAL },   { mem, 100, 16, ORB_PERM_LOCAL },
        { mem, 100, 16, ORB_PERM_LOCAL }, { mem, 200, 16, ORB_PERM_LOCAL },
        { mem, 300, 16, ORB_PERM_LOCAL }, { mem, 400, 16, ORB_PERM_LOCAL },
        { mem, 500, 16, ORB_PERM_LOCAL },
    };
    orb_reg_id ids[7] = { SENTINEL_ID, SENTINEL_ID, SENTINEL_ID, SENTINEL_ID,
                          SENTINEL_ID, SENTINEL_ID, SENTINEL_ID };
    assert_int_equal(orb_registry_add_batch(reg, ranges, 7, ids), ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "range 5"));
    for (size_t i = 0; i < 7; i++)
        assert_int_equal(ids[i], SENTINEL_ID);
    assert_int_equal(orb_registry_count(reg), 1);
    assert_int_equal(probe(reg, addr_of(mem, 100), 16, ORB_PERM_LOCAL), ORB_ENOENT);

    /* Without the last two it fits exactly. */
    assert_int_equal(orb_registry_add_batch(reg, ranges, 5, ids), 0);
    assert_int_equal(orb_registry_count(reg), 4);
    assert_int_equal(ids[0], existing);
    assert_int_equal(ids[1], ids[2]);
    assert_int_not_equal(ids[1], ids[3]);

    /* Full table: a batch of only repeats still succeeds, one new range does not. */
    orb_reg_id more[2];
    assert_int_equal(orb_registry_add_batch(reg, &ranges[3], 2, more), 0);
    assert_int_equal(more[0], ids[3]);
    assert_int_equal(orb_registry_add_batch(reg, &ranges[4], 2, more), ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "range 1"));
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_batch_repeats_and_order(void **state)
{
    (void)state;
    enum { N = 40 };
    struct orb_registry *reg = new_registry(256);
    orb_host_memory *mem = plain_owner(1 << 16);
    /* Existing registrations interleave with the batch's ranges. */
    orb_reg_id existing_ids[5];
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(orb_registry_add(reg, mem, 1000 * i + 500, 10, ORB_PERM_REMOTE_READ,
                                          &existing_ids[i]), 0);

    struct orb_host_range ranges[N];
    for (size_t i = 0; i < N; i++) {
        /* Descending addresses; every fifth repeats its predecessor with another permission. */
        ranges[i] = (struct orb_host_range){ mem, 1000 * (N - i), 10, ORB_PERM_REMOTE_WRITE };
        if (i % 5 == 4)
            ranges[i] = (struct orb_host_range){ mem, ranges[i - 1].offset, 10, ORB_PERM_LOCAL };
    }
    ranges[7] = (struct orb_host_range){ mem, 2500, 10, ORB_PERM_LOCAL }; /* repeat of existing */
    orb_reg_id ids[N];
    assert_int_equal(orb_registry_add_batch(reg, ranges, N, ids), 0);
    assert_int_equal(ids[7], existing_ids[2]);

    for (size_t i = 0; i < N; i++) {
        struct orb_local_region region;
        uint64_t addr = addr_of(mem, ranges[i].offset);
        assert_int_equal(orb_registry_resolve(reg, addr, 10, &region), 0);
        assert_int_equal(region.id, ids[i]);
        assert_int_equal(region.base, addr);
        for (size_t j = 0; j < i; j++) {
            if (ranges[j].offset == ranges[i].offset)
                assert_int_equal(ids[j], ids[i]);
            else
                assert_int_not_equal(ids[j], ids[i]);
        }
        if (i % 5 == 4) /* the first permission of a repeated range wins */
            assert_int_equal(region.perm, ORB_PERM_REMOTE_WRITE);
    }
    assert_int_equal(probe_id(reg, addr_of(mem, 2500), 10, ORB_PERM_REMOTE_READ), existing_ids[2]);
    assert_int_equal(probe(reg, addr_of(mem, 2500), 10, ORB_PERM_REMOTE_WRITE), ORB_EPERM);

    /* describe_remote lists them sorted by address. */
    struct orb_region_desc *descs = NULL;
    size_t n = 0;
    assert_int_equal(orb_registry_describe_remote(reg, &descs, &n), 0);
    assert_int_equal(n, orb_registry_count(reg));
    for (size_t i = 1; i < n; i++)
        assert_true(descs[i - 1].addr < descs[i].addr);
    free(descs);

    /* Each reference of a repeated range must be dropped: ids[3] was registered twice. */
    assert_int_equal(ids[3], ids[4]);
    assert_int_equal(orb_registry_remove(reg, ids[3]), 0);
    assert_int_equal(probe(reg, addr_of(mem, ranges[3].offset), 10, ORB_PERM_LOCAL), 0);
    assert_int_equal(orb_registry_remove(reg, ids[3]), 0);
    assert_int_equal(probe(reg, addr_of(mem, ranges[3].offset), 10, ORB_PERM_LOCAL), ORB_ENOENT);
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

static void test_batch_new_ids_follow_batch_order(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4096);
    struct orb_host_range ranges[3] = {
        { mem, 300, 8, ORB_PERM_LOCAL }, { mem, 100, 8, ORB_PERM_LOCAL }, { mem, 200, 8, ORB_PERM_LOCAL },
    };
    orb_reg_id ids[3];
    assert_int_equal(orb_registry_add_batch(reg, ranges, 3, ids), 0);
    assert_true(ids[0] < ids[1] && ids[1] < ids[2]);
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

/* ------------------------------------------------------------------------ */
/* describe_remote                                                           */
/* ------------------------------------------------------------------------ */

static void test_describe_remote(void **state)
{
    (void)state;
    struct orb_registry *reg = new_registry(16);
    orb_host_memory *mem = plain_owner(4096);
    struct orb_region_desc *descs = (struct orb_region_desc *)(uintptr_t)0x1;
    size_t n = 99;
    assert_int_equal(orb_registry_describe_remote(reg, NULL, &n), ORB_EINVAL);
    assert_int_equal(orb_registry_describe_remote(reg, &descs, NULL), ORB_EINVAL);
    assert_int_equal(orb_registry_describe_remote(reg, &descs, &n), 0);
    assert_null(descs);
    assert_int_equal(n, 0);

    orb_reg_id local, read, write;
    assert_int_equal(orb_registry_add(reg, mem, 2000, 10, ORB_PERM_REMOTE_WRITE, &write), 0);
    assert_int_equal(orb_registry_add(reg, mem, 0, 10, ORB_PERM_LOCAL, &local), 0);
    assert_int_equal(orb_registry_add(reg, mem, 1000, 20, ORB_PERM_REMOTE_READ, &read), 0);
    assert_int_equal(orb_registry_describe_remote(reg, &descs, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(descs[0].addr, addr_of(mem, 1000));
    assert_int_equal(descs[0].length, 20);
    assert_int_equal(descs[0].perm, ORB_PERM_REMOTE_READ);
    assert_int_equal(descs[1].addr, addr_of(mem, 2000));
    assert_int_equal(descs[1].length, 10);
    assert_int_equal(descs[1].perm, ORB_PERM_REMOTE_WRITE);
    free(descs);

    assert_int_equal(orb_registry_remove(reg, read), 0);
    assert_int_equal(orb_registry_describe_remote(reg, &descs, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(descs[0].addr, addr_of(mem, 2000));
    free(descs);
    orb_registry_free(reg);
    orb_host_memory_unref(mem);
}

/* ------------------------------------------------------------------------ */
/* Concurrency                                                               */
/* ------------------------------------------------------------------------ */

#define STRESS_SLOTS 32
#define STRESS_SLOT_BYTES 4096

struct stress {
    struct orb_registry *reg;
    orb_host_memory *stable;      /* registered for the whole run */
    uint64_t churn_base;          /* start of the churned address range */
    atomic_int stop;
    atomic_int failures;
    atomic_long acquired;
    atomic_long churned;
    struct release_log churn_log; /* releases of churned owners */
    atomic_int churn_owners;
};

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *stress_acquirer(void *arg)
{
    struct stress *st = arg;
    uint64_t seed = (uint64_t)(uintptr_t)&seed | 1;
    uint64_t stable = addr_of(st->stable, 0);
    while (!atomic_load(&st->stop)) {
        uint64_t off = next_random(&seed) % (STRESS_SLOTS * STRESS_SLOT_BYTES - 64);
        struct orb_reg *r = NULL;
        /* The stable registration must always admit. */
        if (orb_registry_acquire(st->reg, stable + off, 64, ORB_PERM_REMOTE_WRITE, &r) != 0) {
            atomic_fetch_add(&st->failures, 1);
            continue;
        }
        orb_registry_release(r);
        /* Churned ranges come and go; an admitted one must contain the range and stay readable. */
        int rc = orb_registry_acquire(st->reg, st->churn_base + off, 64, ORB_PERM_REMOTE_READ, &r);
        if (rc == 0) {
            volatile uint8_t *p = r->kind->cpu_view(r, st->churn_base + off);
            if (!(r->base <= st->churn_base + off && st->churn_base + off + 64 <= r->base + r->len) ||
                r->perm == ORB_PERM_LOCAL || p[0] != 0x77 || p[63] != 0x77)
                atomic_fetch_add(&st->failures, 1);
            atomic_fetch_add(&st->acquired, 1);
            orb_registry_release(r);
        } else if (rc != ORB_ENOENT && rc != ORB_EPERM) {
            atomic_fetch_add(&st->failures, 1);
        }
    }
    return NULL;
}

static void *stress_mutator(void *arg)
{
    struct stress *st = arg;
    uint64_t seed = ((uint64_t)(uintptr_t)&seed << 1) | 1;
    uint8_t *churn = (uint8_t *)(uintptr_t)st->churn_base;
    while (!atomic_load(&st->stop)) {
        /* Wrap a fresh owner over a random span of the churn area, register, then retire it. */
        size_t slot = next_random(&seed) % STRESS_SLOTS;
        size_t span = 1 + next_random(&seed) % 4;
        if (slot + span > STRESS_SLOTS)
            span = STRESS_SLOTS - slot;
        orb_host_memory *owner = NULL;
        if (orb_host_memory_wrap(churn + slot * STRESS_SLOT_BYTES, span * STRESS_SLOT_BYTES,
                                 count_release, &st->churn_log, &owner) != 0) {
            atomic_fetch_add(&st->failures, 1);
            continue;
        }
        atomic_fetch_add(&st->churn_owners, 1);
        orb_reg_id ids[2];
        struct orb_host_range ranges[2] = {
            { owner, 0, span * STRESS_SLOT_BYTES, ORB_PERM_REMOTE_READ },
            { owner, 0, STRESS_SLOT_BYTES, (next_random(&seed) & 1) ? ORB_PERM_LOCAL : ORB_PERM_REMOTE_WRITE },
        };
        int rc = orb_registry_add_batch(st->reg, ranges, 2, ids);
        orb_host_memory_unref(owner);
        if (rc != 0) {
            if (rc != ORB_ERESOURCE)
                atomic_fetch_add(&st->failures, 1);
            continue;
        }
        for (int i = 0; i < 2; i++)
            if (orb_registry_remove(st->reg, ids[i]) != 0)
                atomic_fetch_add(&st->failures, 1);
        atomic_fetch_add(&st->churned, 1);
    }
    return NULL;
}

static void test_concurrent_acquire_vs_add_remove(void **state)
{
    (void)state;
    enum { ACQUIRERS = 3, MUTATORS = 2 };
    static struct stress st;
    memset(&st, 0, sizeof st);
    st.reg = new_registry(64);
    st.stable = plain_owner(STRESS_SLOTS * STRESS_SLOT_BYTES);
    orb_reg_id stable_id;
    assert_int_equal(orb_registry_add(st.reg, st.stable, 0, STRESS_SLOTS * STRESS_SLOT_BYTES,
                                      ORB_PERM_REMOTE_WRITE, &stable_id), 0);
    uint8_t *churn = malloc(STRESS_SLOTS * STRESS_SLOT_BYTES);
    assert_non_null(churn);
    memset(churn, 0x77, STRESS_SLOTS * STRESS_SLOT_BYTES);
    st.churn_base = (uint64_t)(uintptr_t)churn;

    pthread_t threads[ACQUIRERS + MUTATORS];
    for (int i = 0; i < ACQUIRERS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, stress_acquirer, &st), 0);
    for (int i = 0; i < MUTATORS; i++)
        assert_int_equal(pthread_create(&threads[ACQUIRERS + i], NULL, stress_mutator, &st), 0);
    struct timespec two_seconds = { 2, 0 };
    nanosleep(&two_seconds, NULL);
    atomic_store(&st.stop, 1);
    for (int i = 0; i < ACQUIRERS + MUTATORS; i++)
        pthread_join(threads[i], NULL);

    assert_int_equal(atomic_load(&st.failures), 0);
    assert_true(atomic_load(&st.churned) > 0);
    assert_true(atomic_load(&st.acquired) > 0);
    /* Every churned owner was released exactly once, and only the stable range remains. */
    assert_int_equal(atomic_load(&st.churn_log.calls), atomic_load(&st.churn_owners));
    assert_int_equal(orb_registry_count(st.reg), 1);
    assert_int_equal(probe_id(st.reg, addr_of(st.stable, 0), 1, ORB_PERM_REMOTE_WRITE), stable_id);

    orb_registry_free(st.reg);
    orb_host_memory_unref(st.stable);
    free(churn);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_and_free_arguments),
        cmocka_unit_test(test_add_rejects_bad_ranges),
        cmocka_unit_test(test_lookup_rejects_bad_ranges),
        cmocka_unit_test(test_containment_edges),
        cmocka_unit_test(test_permissions_for_each_need),
        cmocka_unit_test(test_overlapping_and_nested),
        cmocka_unit_test(test_long_registration_found_past_many_short_ones),
        cmocka_unit_test(test_disjoint_owners),
        cmocka_unit_test(test_repeated_registration_keeps_permission),
        cmocka_unit_test(test_adopt_refuses_published_range),
        cmocka_unit_test(test_ids_never_reused),
        cmocka_unit_test(test_budget_for_single_registrations),
        cmocka_unit_test(test_owner_retained_until_last_unregister),
        cmocka_unit_test(test_unregister_while_pinned),
        cmocka_unit_test(test_admits_and_the_unpublish_count),
        cmocka_unit_test(test_free_with_pinned_registration),
        cmocka_unit_test(test_batch_rejects_arguments),
        cmocka_unit_test(test_batch_failure_at_last_index_changes_nothing),
        cmocka_unit_test(test_batch_budget_exhausted_mid_batch),
        cmocka_unit_test(test_batch_repeats_and_order),
        cmocka_unit_test(test_batch_new_ids_follow_batch_order),
        cmocka_unit_test(test_describe_remote),
        cmocka_unit_test(test_concurrent_acquire_vs_add_remove),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
