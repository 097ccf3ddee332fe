/* Host memory owners: argument checks, alignment, zeroing, reference counting, release; shared
 * (memfd) allocations: seals, mapping, sharing across mappings and a fork, descriptor lifetime. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

static size_t page_len(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

static size_t round_to_page(size_t len)
{
    return (len + page_len() - 1) / page_len() * page_len();
}

/* The lowest descriptor free now (what the next open would get): a leak would move it. */
static int lowest_free_fd(void)
{
    int fd = dup(0);
    assert_true(fd >= 0);
    close(fd);
    return fd;
}

static int fd_is_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1 || errno != EBADF;
}

/* The mapping of /proc/self/maps that holds `addr`: 1 with its bounds and permissions, 0 if none
 * (sanitizers add mappings of their own, so the tests look at the allocation's neighbourhood
 * rather than count them). */
static int mapping_at(uintptr_t addr, uintptr_t *start, uintptr_t *end, char perms[5])
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        unsigned long lo, hi;
        char pr[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, pr) == 3 && addr >= lo && addr < hi) {
            *start = lo, *end = hi;
            memcpy(perms, pr, 5);
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* What an alignment's reservation left behind would be an inaccessible private mapping touching
 * the allocation. */
static void assert_no_reserve_left_around(uintptr_t lo, uintptr_t hi)
{
    uintptr_t s0, e0;
    char perms[5];
    if (mapping_at(lo - 1, &s0, &e0, perms))
        assert_false(e0 == lo && strcmp(perms, "---p") == 0);
    if (mapping_at(hi, &s0, &e0, perms))
        assert_false(s0 == hi && strcmp(perms, "---p") == 0);
}

static void test_alloc_shared_rejects_bad_arguments(void **state)
{
    (void)state;
    int free_fd = lowest_free_fd();
    orb_host_memory *mem = (orb_host_memory *)(uintptr_t)0x1;
    assert_int_equal(orb_host_memory_alloc_shared(4096, 0, NULL), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc_shared(0, 0, &mem), ORB_EINVAL);
    assert_string_not_equal(orb_last_error(), "");
    assert_int_equal(orb_host_memory_alloc_shared(64, 3, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc_shared(64, 48, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc_shared(64, SIZE_MAX, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc_shared(SIZE_MAX, 0, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc_shared(SIZE_MAX - 8, 16, &mem), ORB_EINVAL);
    /* Rounds past SIZE_MAX only once rounded to the page, or with the alignment's reservation. */
    assert_int_equal(orb_host_memory_alloc_shared(SIZE_MAX - page_len() + 2, 0, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc_shared((size_t)INT64_MAX, 0, &mem), ORB_EINVAL);
    assert_int_equal(orb_host_memory_alloc_shared((size_t)INT64_MAX - ((size_t)1 << 21), (size_t)1 << 30,
                                                  &mem),
                     ORB_EINVAL);
    /* Out-parameter untouched, no descriptor left open. */
    assert_ptr_equal(mem, (orb_host_memory *)(uintptr_t)0x1);
    assert_int_equal(lowest_free_fd(), free_fd);
}

static void test_alloc_shared_enomem(void **state)
{
    (void)state;
    int free_fd = lowest_free_fd();
    orb_host_memory *mem = NULL;
    /* Passes the argument checks; no address space holds it. */
    assert_int_equal(orb_host_memory_alloc_shared((size_t)1 << 62, 0, &mem), ORB_ENOMEM);
    assert_null(mem);
    assert_int_equal(lowest_free_fd(), free_fd);
}

/* At the descriptor limit no memfd can be made: ORB_ERESOURCE naming the errno, no heap fallback. */
static void test_alloc_shared_at_the_descriptor_limit(void **state)
{
    (void)state;
    struct rlimit saved;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
    struct rlimit low = saved;
    low.rlim_cur = (rlim_t)lowest_free_fd(); /* the next descriptor would be past the limit */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    orb_host_memory *mem = NULL;
    int rc = orb_host_memory_alloc_shared(4096, 0, &mem);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
    assert_int_equal(rc, ORB_ERESOURCE);
    assert_null(mem);
    assert_non_null(strstr(orb_last_error(), strerror(EMFILE)));
    /* Below the limit again, it works. */
    assert_int_equal(orb_host_memory_alloc_shared(4096, 0, &mem), 0);
    orb_host_memory_unref(mem);
}

static void test_alloc_shared_is_zeroed_and_aligned(void **state)
{
    (void)state;
    size_t page = page_len();
    const size_t lens[] = { 1, 4096, 12345, ((size_t)1 << 20) + 123 };
    const size_t aligns[] = { 0, 1, 64, 4096, (size_t)1 << 20, (size_t)1 << 21, (size_t)1 << 30 };
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (size_t j = 0; j < sizeof aligns / sizeof aligns[0]; j++) {
            size_t want = aligns[j] > page ? aligns[j] : page;
            orb_host_memory *mem = NULL;
            assert_int_equal(orb_host_memory_alloc_shared(lens[i], aligns[j], &mem), 0);
            uint8_t *p = orb_host_memory_data(mem);
            assert_non_null(p);
            assert_int_equal((uintptr_t)p % want, 0);
            assert_int_equal(orb_host_memory_size(mem), lens[i]);
            for (size_t k = 0; k < lens[i]; k++)
                assert_int_equal(p[k], 0);
            memset(p, 0xab, lens[i]); /* the whole length is writable */
            /* One shared mapping of exactly the rounded file; what alignment reserved is gone. */
            uintptr_t lo = 0, hi = 0;
            char perms[5];
            assert_true(mapping_at((uintptr_t)p, &lo, &hi, perms));
            assert_int_equal(lo, (uintptr_t)p);
            assert_int_equal(hi - lo, round_to_page(lens[i]));
            assert_string_equal(perms, "rw-s");
            assert_no_reserve_left_around(lo, hi);
            orb_host_memory_unref(mem);
        }
    }
}

static void test_alloc_shared_file_is_sealed(void **state)
{
    (void)state;
    size_t len = 3 * page_len() + 5;
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_alloc_shared(len, 0, &mem), 0);
    int fd = orb_host_memory_shared_fd(mem);
    assert_true(fd >= 0);
    assert_true((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal((size_t)st.st_size, round_to_page(len));
    /* A kernel that seals memory files against exec by policy (vm.memfd_noexec) adds F_SEAL_EXEC. */
    const int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    int seals = fcntl(fd, F_GET_SEALS);
    assert_true(seals >= 0);
    assert_int_equal(seals & (want | F_SEAL_WRITE | F_SEAL_FUTURE_WRITE), want);
    /* Neither shrinks nor grows; the seals themselves are sealed. */
    errno = 0;
    assert_int_equal(ftruncate(fd, 0), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(fd, st.st_size + (off_t)page_len()), -1);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal((size_t)st.st_size, round_to_page(len));
    orb_host_memory_unref(mem);
}

/* Offset 0 of the file is the first byte of the data: a second mapping of it in this process sees
 * the first's writes and the first sees the second's. */
static void test_alloc_shared_second_mapping_sees_writes(void **state)
{
    (void)state;
    size_t len = ((size_t)1 << 20) + 77;
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_alloc_shared(len, (size_t)1 << 21, &mem), 0);
    uint8_t *p = orb_host_memory_data(mem);
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(i * 7 + 1);
    int fd = orb_host_memory_shared_fd(mem);
    uint8_t *view = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(view != MAP_FAILED);
    assert_ptr_not_equal(view, p);
    assert_memory_equal(view, p, len);
    view[0] = 0xee;
    view[len - 1] = 0xdd;
    assert_int_equal(p[0], 0xee);
    assert_int_equal(p[len - 1], 0xdd);
    assert_int_equal(munmap(view, len), 0);
    orb_host_memory_unref(mem);
}

/* A child forked while the allocation exists shares its pages, it does not copy them. */
static void test_alloc_shared_a_forked_child_shares_the_bytes(void **state)
{
    (void)state;
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_alloc_shared(65536, 0, &mem), 0);
    volatile uint8_t *p = orb_host_memory_data(mem);
    p[100] = 0x11;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        p[100] = p[100] == 0x11 ? 0x77 : 0x66;
        p[65535] = 0x55;
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(p[100], 0x77);
    assert_int_equal(p[65535], 0x55);
    orb_host_memory_unref(mem);
}

/* The descriptor and the mapping live exactly as long as the last reference. */
static void test_alloc_shared_last_unref_closes_and_unmaps(void **state)
{
    (void)state;
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_alloc_shared(8192, (size_t)1 << 21, &mem), 0);
    uint8_t *p = orb_host_memory_data(mem);
    int fd = orb_host_memory_shared_fd(mem);
    assert_true(fd >= 0);
    assert_ptr_equal(orb_host_memory_ref(mem), mem);
    orb_host_memory_unref(mem);
    assert_true(fd_is_open(fd));
    p[8191] = 1; /* still mapped */
    orb_host_memory_unref(mem);
    /* Checked before anything else could take the number again. */
    errno = 0;
    assert_int_equal(fcntl(fd, F_GETFD), -1);
    assert_int_equal(errno, EBADF);
    uintptr_t lo, hi;
    char perms[5];
    if (mapping_at((uintptr_t)p, &lo, &hi, perms))
        assert_int_not_equal(perms[3], 's'); /* whatever is there now, not the file */
}

static void test_shared_fd_of_other_memory_is_minus_one(void **state)
{
    (void)state;
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_alloc(4096, 0, &mem), 0);
    assert_int_equal(orb_host_memory_shared_fd(mem), -1);
    orb_host_memory_unref(mem);
    assert_int_equal(orb_host_memory_alloc((size_t)1 << 20, (size_t)1 << 21, &mem), 0);
    assert_int_equal(orb_host_memory_shared_fd(mem), -1);
    orb_host_memory_unref(mem);
    static char buf[65536];
    assert_int_equal(orb_host_memory_wrap(buf, sizeof buf, NULL, NULL, &mem), 0);
    assert_int_equal(orb_host_memory_shared_fd(mem), -1);
    orb_host_memory_unref(mem);
    assert_int_equal(orb_host_memory_shared_fd(NULL), -1);
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
        cmocka_unit_test(test_alloc_shared_rejects_bad_arguments),
        cmocka_unit_test(test_alloc_shared_enomem),
        cmocka_unit_test(test_alloc_shared_at_the_descriptor_limit),
        cmocka_unit_test(test_alloc_shared_is_zeroed_and_aligned),
        cmocka_unit_test(test_alloc_shared_file_is_sealed),
        cmocka_unit_test(test_alloc_shared_second_mapping_sees_writes),
        cmocka_unit_test(test_alloc_shared_a_forked_child_shares_the_bytes),
        cmocka_unit_test(test_alloc_shared_last_unref_closes_and_unmaps),
        cmocka_unit_test(test_shared_fd_of_other_memory_is_minus_one),
        cmocka_unit_test(test_wrap_release_runs_once_on_last_unref),
        cmocka_unit_test(test_wrap_without_release),
        cmocka_unit_test(test_concurrent_refs_release_once),
        cmocka_unit_test(test_host_kind_cpu_view),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
