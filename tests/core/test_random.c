/* Random bytes: small requests come from a per-thread pool, large ones from the kernel; no
 * value is handed out twice, not across threads, not across a refill, not to a fork child. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/random.h"

#define DRAWS 4096 /* 16-byte draws: 64 KiB, many refills of the pool */

static int cmp16(const void *a, const void *b)
{
    return memcmp(a, b, 16);
}

static void assert_all_distinct(uint8_t (*v)[16], size_t n)
{
    qsort(v, n, 16, cmp16);
    for (size_t i = 1; i < n; i++)
        assert_int_not_equal(memcmp(v[i - 1], v[i], 16), 0);
}

static void test_draws_never_repeat(void **state)
{
    (void)state;
    uint8_t (*v)[16] = calloc(DRAWS, 16);
    assert_non_null(v);
    for (size_t i = 0; i < DRAWS; i++)
        assert_int_equal(orb_random_bytes(v[i], 16), 0);
    assert_all_distinct(v, DRAWS);
    free(v);
}

static void test_sizes_from_one_byte_past_the_pool_limit(void **state)
{
    (void)state;
    /* Odd sizes leave a pool's tail too short for the next draw: it is refilled, not overrun. */
    for (size_t n = 1; n <= 300; n += 7) {
        uint8_t buf[320];
        memset(buf, 0xa5, sizeof buf);
        assert_int_equal(orb_random_bytes(buf, n), 0);
        for (size_t i = n; i < sizeof buf; i++)
            assert_int_equal(buf[i], 0xa5);
    }
    /* 64 random bytes all zero: the pool handed out wiped bytes. */
    uint8_t big[64], zero[64] = {0};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(orb_random_bytes(big, 24), 0);
        assert_int_equal(orb_random_bytes(big + 24, 40), 0);
        assert_int_not_equal(memcmp(big, zero, sizeof big), 0);
    }
}

static void *draw_many(void *arg)
{
    uint8_t (*v)[16] = arg;
    for (size_t i = 0; i < DRAWS / 4; i++)
        if (orb_random_bytes(v[i], 16) != 0)
            memset(v[i], 0, 16);
    return NULL;
}

static void test_threads_draw_distinct_values(void **state)
{
    (void)state;
    uint8_t (*v)[16] = calloc(DRAWS, 16);
    assert_non_null(v);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, draw_many, v + (size_t)i * (DRAWS / 4)), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_all_distinct(v, DRAWS);
    free(v);
}

static void test_a_fork_child_does_not_repeat_its_parent(void **state)
{
    (void)state;
    uint8_t first[16];
    assert_int_equal(orb_random_bytes(first, sizeof first), 0); /* the pool holds more now */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint8_t mine[4][16];
        for (int i = 0; i < 4; i++)
            if (orb_random_bytes(mine[i], 16) != 0)
                _exit(2);
        _exit(write(fds[1], mine, sizeof mine) == (ssize_t)sizeof mine ? 0 : 3);
    }
    uint8_t all[8][16];
    for (int i = 0; i < 4; i++)
        assert_int_equal(orb_random_bytes(all[i], 16), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(read(fds[0], (uint8_t *)all + 4 * 16, 4 * 16), 4 * 16);
    close(fds[0]);
    close(fds[1]);
    assert_all_distinct(all, 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_from_one_byte_past_the_pool_limit),
        cmocka_unit_test(test_draws_never_repeat),
        cmocka_unit_test(test_threads_draw_distinct_values),
        cmocka_unit_test(test_a_fork_child_does_not_repeat_its_parent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
