/* Thread names: orb_thread_name() names the calling thread "orb-..." cut to the kernel's 15
 * characters, and an engine's own threads carry such names (seen the way `ps -L` sees them). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/thread_name.h"
#include "orbite/orbite.h"
#include "../util/thread_use.h"

struct named {
    int which;
    unsigned arg;
    char got[32];
};

static void *name_self(void *arg)
{
    struct named *n = arg;
    if (n->which == 0)
        orb_thread_name("lane%u", n->arg);
    else if (n->which == 1)
        orb_thread_name("abcdefghij%u", n->arg);
    else
        orb_thread_name("abcdefghijklmnop%u", n->arg);
    if (pthread_getname_np(pthread_self(), n->got, sizeof n->got) != 0)
        n->got[0] = '\0';
    return NULL;
}

static void named_as(int which, unsigned arg, const char *want)
{
    struct named n = {.which = which, .arg = arg};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, name_self, &n), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_string_equal(n.got, want);
}

static void test_names_are_prefixed_and_cut_to_fit(void **state)
{
    (void)state;
    named_as(0, 3, "orb-lane3");
    /* 4 + 11 characters: the most the kernel keeps. */
    named_as(1, 7, "orb-abcdefghij7");
    named_as(2, 12, "orb-abcdefghijk");
}

static void test_an_engine_names_its_threads(void **state)
{
    (void)state;
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.tcp_workers = 2;
    unsigned before = thread_use_of("orb-tcp-").threads;
    orb_engine *e = NULL;
    assert_int_equal(orb_engine_create(&cfg, &e), 0);
    /* Each thread names itself as it starts: give them the time to run. */
    for (int i = 0; i < 500 && thread_use_of("orb-tcp-").threads - before < 2; i++)
        nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    assert_int_equal(thread_use_of("orb-tcp-").threads - before, 2);
    assert_int_equal(orb_engine_close(e, 5000000000ull), 0);
    orb_engine_free(e);
    assert_int_equal(thread_use_of("orb-tcp-").threads, before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_are_prefixed_and_cut_to_fit),
        cmocka_unit_test(test_an_engine_names_its_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
