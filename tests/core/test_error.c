/* The error convention: status texts, the thread-local detail message and its lifetime, and the
 * errno mapping that decides whether a failure is blamed on the peer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include <cmocka.h>

#include "core/error.h"

static void test_peer_errnos_are_epeer(void **state)
{
    (void)state;
    const int peer[] = {ECONNRESET, ECONNREFUSED, ECONNABORTED, EPIPE, ENOTCONN, ESHUTDOWN,
                        ENETRESET, ENETDOWN, ENETUNREACH, EHOSTDOWN, EHOSTUNREACH};
    for (size_t i = 0; i < sizeof peer / sizeof peer[0]; i++)
        assert_int_equal(orb_status_from_errno(peer[i]), ORB_EPEER);
}

static void test_local_errnos_keep_their_meaning(void **state)
{
    (void)state;
    const struct {
        int err;
        int status;
    } want[] = {
        {0, ORB_OK},
        {ENOMEM, ORB_ENOMEM},
        {ENOBUFS, ORB_ENOMEM},
        {EMFILE, ORB_ERESOURCE},
        {ENFILE, ORB_ERESOURCE},
        {EAGAIN, ORB_EAGAIN},
        {EWOULDBLOCK, ORB_EAGAIN},
        {EINTR, ORB_EAGAIN},
        {ETIMEDOUT, ORB_ETIMEDOUT},
        {EPROTO, ORB_EPROTO},
        {EINVAL, ORB_EINVAL},
        {EFAULT, ORB_EINVAL},
        {EBADF, ORB_EINVAL},
        {ENOTSOCK, ORB_EINVAL},
        {EMSGSIZE, ORB_EINVAL},
        {ENOENT, ORB_ENOENT},
        {EEXIST, ORB_EEXIST},
        {EBUSY, ORB_EBUSY},
        /* The operating system's refusals are not a registration's permission. */
        {EPERM, ORB_EUNAVAILABLE},
        {EACCES, ORB_EUNAVAILABLE},
        {EADDRINUSE, ORB_EUNAVAILABLE},
        {EADDRNOTAVAIL, ORB_EUNAVAILABLE},
        {EAFNOSUPPORT, ORB_EUNAVAILABLE},
        {EOPNOTSUPP, ORB_EUNAVAILABLE},
        {ENOSYS, ORB_EUNAVAILABLE},
        {EIO, ORB_EUNAVAILABLE},
        {ENODEV, ORB_EUNAVAILABLE},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (orb_status_from_errno(want[i].err) != want[i].status)
            fail_msg("errno %d (%s) maps to %d, want %d", want[i].err, strerror(want[i].err),
                     orb_status_from_errno(want[i].err), want[i].status);
}

/* An errno nobody listed is the system's failure, never a failed peer (which would make the
 * engine probe the peer for a restart). */
static void test_unknown_errno_is_not_epeer(void **state)
{
    (void)state;
    const int odd[] = {EXDEV, ESTALE, ENOTTY, ECHILD, EDOM, 4000, -1};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        int st = orb_status_from_errno(odd[i]);
        assert_int_not_equal(st, ORB_EPEER);
        assert_int_not_equal(st, ORB_ESTALE);
        assert_int_equal(st, ORB_EUNAVAILABLE);
    }
}

static void test_strerror_covers_every_status(void **state)
{
    (void)state;
    for (int st = ORB_OK; st >= ORB_EAGAIN; st--) {
        const char *t = orb_strerror(st);
        assert_non_null(t);
        assert_string_not_equal(t, "unknown status");
    }
    assert_string_equal(orb_strerror(1), "unknown status");
    assert_string_equal(orb_strerror(ORB_EAGAIN - 1), "unknown status");
}

static void *other_thread(void *arg)
{
    (void)arg;
    orb_fail(ORB_EPEER, "the other thread's failure");
    return NULL;
}

/* The message names the cause, belongs to the calling thread and stays until the next call. */
static void test_last_error_is_per_thread(void **state)
{
    (void)state;
    assert_int_equal(orb_fail(ORB_EINVAL, "bad %s %d", "length", 7), ORB_EINVAL);
    assert_string_equal(orb_last_error(), "bad length 7");
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
    pthread_join(t, NULL);
    assert_string_equal(orb_last_error(), "bad length 7");
    assert_int_equal(orb_fail_wrap(ORB_ENOENT, "request %d", 3), ORB_ENOENT);
    assert_string_equal(orb_last_error(), "request 3: bad length 7");
    orb_clear_error();
    assert_string_equal(orb_last_error(), "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_errnos_are_epeer),
        cmocka_unit_test(test_local_errnos_keep_their_meaning),
        cmocka_unit_test(test_unknown_errno_is_not_epeer),
        cmocka_unit_test(test_strerror_covers_every_status),
        cmocka_unit_test(test_last_error_is_per_thread),
    };
    return cmocka_run_group_tests_name("error", tests, NULL, NULL);
}
