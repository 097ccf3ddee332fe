/* Host memory owners: argument checks, alignment, zeroing, reference counting, release. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/memory.h"
#include "core/registry.h"

/* The out-of-memory case asks for an impossible size; sanitizers must return NULL, not abort. */
#define SANITIZER_HOOK __attribute__((visibility("default"), used))
SANITIZER_HOOK const char *__asan_default_options(void);
SANITIZER_HOOK const char *__tsan_default_options(void);
SANITIZER_HOOK const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
SANITIZER_HOOK const char *__tsan_default_options(void)
{
    return "allocator_may_return_null=1";
}

struct release_log {
    int calls;
    void *ptr;
    size_t len;
};

static void count_release(void *ptr, size_t len, void *ctx)
{
    struct release_log *log = ctx;
    log->calls++;
    log->ptr = ptr;
    log->len = len;
}

static void test_alloc_rejects_bad_arguments(void **state)
{
    (void)state;
    orb_host_memory *mem = (orb_host_memory *)(uintptr_t)0x1;
    assert_int_equal(orb_host_memory_alloc(4096, 0, NULL), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc(0, 0, &mem), ORB_EINVAL);
    assert_string_not_equal(orb_last_error(), "");
    assert_int_equal(orb_host_memory_alloc(64, 3, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc(64, 48, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc(SIZE_MAX, 0, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc(SIZE_MAX - 8, 16, &mem), ORB_EINVAL);
    /* Out-parameter untouched on failure. */
    assert_ptr_equal(mem, (orb_host_memory *)(uintptr_t)0x1);
}

static void test_alloc_enomem(void **state)
{
    (void)state;
    orb_host_memory *mem = NULL;
    /* Far beyond any address space but still passes the argument checks. */
    int rc = orb_host_memory_alloc((size_t)1 << 62, 0, &mem);
    assert_int_equal(rc, ORB_ENOMEM);
    assert_null(mem);
}

static void test_alloc_alignment_and_zeroing(void **state)
{
    (void)state;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t aligns[] = { 0, 1, 2, 8, 16, 64, 4096, 1u << 16, 1u << 21 };
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        size_t want = aligns[i] == 0 ? page : aligns[i];
        orb_host_memory *mem = NULL;
        assert_int_equal(orb_host_memory_alloc(12345, aligns[i], &mem), 0);
        assert_non_null(mem);
        uint8_t *p = orb_host_memory_data(mem);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % want, 0);
        assert_int_equal(orb_host_memory_size(mem), 12345);
        for (size_t j = 0; j < 12345; j++)
            assert_int_equal(p[j], 0);
        memset(p, 0xab, 12345); /* the whole length is writable */
        orb_host_memory_unref(mem);
    }
}

static void test_alloc_large_is_zeroed(void **state)
{
    (void)state;
    size_t len = (size_t)64 << 20;
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_alloc(len, 0, &mem), 0);
    uint8_t *p = orb_host_memory_data(mem);
    assert_int_equal(p[0], 0);
    assert_int_equal(p[len / 2], 0);
    assert_int_equal(p[len - 1], 0);
    orb_host_memory_unref(mem);
}

static void test_wrap_rejects_bad_arguments(void **state)
{
    (void)state;
    struct release_log log = { 0 };
    char buf[16];
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_wrap(buf, sizeof buf, count_release, &log, NULL), ORB_EINVAL);
    assert_int_equal(orb_host_memory_wrap(NULL, 16, count_release, &log, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_wrap(buf, 0, count_release, &log, &mem), ORB_EINVAL);
    /* A range running past the end of the address space. */
    assert_int_equal(orb_host_memory_wrap((void *)(UINTPTR_MAX - 15), 32, count_release, &log, &mem),
                     ORB_EINVAL);
    assert_null(mem);
    assert_int_equal(log.calls, 0); /* nothing adopted, nothing released */
}

static void test_wrap_release_runs_once_on_last_unref(void **state)
{
    (void)state;
    struct release_log log = { 0 };
    char buf[100];
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_wrap(buf, sizeof buf, count_release, &log, &mem), 0);
    assert_ptr_equal(orb_host_memory_data(mem), buf);
    assert_int_equal(orb_host_memory_size(mem), sizeof buf);

    assert_ptr_equal(orb_host_memory_ref(mem), mem);
    assert_ptr_equal(orb_host_memory_ref(mem), mem);
    orb_host_memory_unref(mem);
    orb_host_memory_unref(mem);
    assert_int_equal(log.calls, 0);
    orb_host_memory_unref(mem);
    assert_int_equal(log.calls, 1);
    assert_ptr_equal(log.ptr, buf);
    assert_int_equal(log.len, sizeof buf);
}

static void test_wrap_without_release(void **state)
{
    (void)state;
    static char buf[32];
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_wrap(buf, sizeof buf, NULL, NULL, &mem), 0);
    orb_host_memory_unref(mem); /* must not touch buf's storage */
    buf[0] = 1;
    assert_int_equal(buf[0], 1);
}

static void test_null_is_safe(void **state)
{
    (void)state;
    assert_null(orb_host_memory_data(NULL));
    assert_int_equal(orb_host_memory_size(NULL), 0);
    assert_null(orb_host_memory_ref(NULL));
    orb_host_memory_unref(NULL);
}

struct ref_worker {
    orb_host_memory *mem;
    int rounds;
};

static void *ref_unref_loop(void *arg)
{
    struct ref_worker *w = arg;
    for (int i = 0; i < w->rounds; i++) {
        orb_host_memory_ref(w->mem);
        orb_host_memory_unref(w->mem);
    }
    orb_host_memory_unref(w->mem); /* the reference the main thread gave this worker */
    return NULL;
}

static void test_concurrent_refs_release_once(void **state)
{
    (void)state;
    enum { THREADS = 4 };
    struct release_log log = { 0 };
    static char buf[64];
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_wrap(buf, sizeof buf, count_release, &log, &mem), 0);
    pthread_t threads[THREADS];
    struct ref_worker w = { .mem = mem, .rounds = 20000 };
    for (int i = 0; i < THREADS; i++) {
        orb_host_memory_ref(mem);
        assert_int_equal(pthread_create(&threads[i], NULL, ref_unref_loop, &w), 0);
    }
    orb_host_memory_unref(mem);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    assert_int_equal(log.calls, 1);
}

static void test_host_kind_cpu_view(void **state)
{
    (void)state;
    char buf[8];
    struct orb_reg r = { .base = (uint64_t)(uintptr_t)buf, .len = sizeof buf };
    assert_int_equal(orb_memkind_host.kind, ORB_MEM_HOST);
    assert_string_equal(orb_memkind_host.name, "host");
    assert_ptr_equal(orb_memkind_host.cpu_view(&r, (uint64_t)(uintptr_t)(buf + 3)), buf + 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_rejects_bad_arguments),
        cmocka_unit_test(test_alloc_enomem),
        cmocka_unit_test(test_wrap_rejects_bad_arguments),
        cmocka_unit_test(test_null_is_safe),
        cmocka_unit_test(test_alloc_alignment_and_zeroing),
        cmocka_unit_test(test_alloc_large_is_zeroed),
        cmocka_unit_test(test_wrap_release_runs_once_on_last_unref),
        cmocka_unit_test(test_wrap_without_release),
        cmocka_unit_test(test_concurrent_refs_release_once),
        cmocka_unit_test(test_host_kind_cpu_view),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
