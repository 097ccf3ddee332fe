/* OPEN_DEVICE's device context creation: the mlx5 request bytes, the DevX-then-plain retry,
 * the errno mapping (against a scripted table), and the real ioctl on files that are no uverbs
 * nodes. The kernel side of a real mlx5 device is checked by tests/hw/hw_mlx5_import. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "helper/uctx.h"
#include "common/uverbs.h"

/* A table that answers from a script, one errno per call, and records what it was asked. */
struct script {
    int answers[4];
    int calls;
    bool asked_devx[4];
    int asked_fd;
};

static int scripted_create(void *impl, int dev_fd, bool devx)
{
    struct script *s = impl;
    assert_true(s->calls < 4);
    s->asked_devx[s->calls] = devx;
    s->asked_fd = dev_fd;
    return s->answers[s->calls++];
}

static const struct orb_uctx_ops scripted = {.create = scripted_create};

/* Run orb_uctx_create with answers a0, a1; *devx is left at 7 when not written. */
static int run(struct script *s, int a0, int a1, int *devx_state)
{
    memset(s, 0, sizeof *s);
    s->answers[0] = a0;
    s->answers[1] = a1;
    bool devx = false;
    /* A sentinel the call must not touch on failure: compare the byte before and after. */
    unsigned char before;
    memset(&devx, 0x5A, sizeof devx);
    memcpy(&before, &devx, 1);
    int rc = orb_uctx_create(&scripted, s, 5, "mlx5_3", &devx);
    unsigned char after;
    memcpy(&after, &devx, 1);
    *devx_state = after == before ? 7 : (devx ? 1 : 0);
    return rc;
}

static void test_request_bytes_are_libmlx5s(void **state)
{
    (void)state;
    uint8_t req[ORB_UCTX_REQ_LEN];
    static const uint8_t with_devx[ORB_UCTX_REQ_LEN] = {
        16, 0, 0, 0,    /* total_num_bfregs */
        4, 0, 0, 0,     /* num_low_latency_bfregs */
        1, 0, 0, 0,     /* flags: MLX5_IB_ALLOC_UCTX_DEVX */
        0, 0, 0, 0,     /* comp_mask: the kernel refuses any bit */
        1, 0, 0, 0,     /* max_cqe_version, reserved0, reserved1 */
        0, 0, 0, 0,     /* reserved2 */
        3, 0, 0, 0, 0, 0, 0, 0, /* lib_caps: 4K_UAR | DYN_UAR (import needs dynamic UARs) */
    };
    memset(req, 0xEE, sizeof req);
    orb_uctx_encode_request(true, req);
    assert_memory_equal(req, with_devx, sizeof req);
    uint8_t plain[ORB_UCTX_REQ_LEN];
    memcpy(plain, with_devx, sizeof plain);
    plain[8] = 0;
    orb_uctx_encode_request(false, req);
    assert_memory_equal(req, plain, sizeof req);
}

static void test_arguments_are_checked(void **state)
{
    (void)state;
    struct script s;
    memset(&s, 0, sizeof s);
    bool devx = false;
    assert_int_equal(orb_uctx_create(NULL, NULL, 5, "mlx5_0", &devx), ORB_EINVAL);
    const struct orb_uctx_ops empty = {.create = NULL};
    assert_int_equal(orb_uctx_create(&empty, NULL, 5, "mlx5_0", &devx), ORB_EINVAL);
    assert_int_equal(orb_uctx_create(&scripted, &s, -1, "mlx5_0", &devx), ORB_EINVAL);
    assert_int_equal(orb_uctx_create(&scripted, &s, 5, NULL, &devx), ORB_EINVAL);
    assert_int_equal(orb_uctx_create(&scripted, &s, 5, "mlx5_0", NULL), ORB_EINVAL);
    assert_int_equal(s.calls, 0);
}

static void test_devx_first(void **state)
{
    (void)state;
    struct script s;
    int devx = 0;
    assert_int_equal(run(&s, 0, 0, &devx), 0);
    assert_int_equal(devx, 1);
    assert_int_equal(s.calls, 1);
    assert_true(s.asked_devx[0]);
    assert_int_equal(s.asked_fd, 5);
}

static void test_refused_devx_falls_back_to_plain_verbs(void **state)
{
    (void)state;
    /* EIO included: the firmware's refusal of a DevX user context comes back as EIO. */
    static const int refusals[] = {EINVAL, EOPNOTSUPP, EPERM, ENOMEM, EAGAIN, EIO};
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        struct script s;
        int devx = 9;
        assert_int_equal(run(&s, refusals[i], 0, &devx), 0);
        assert_int_equal(devx, 0);
        assert_int_equal(s.calls, 2);
        assert_true(s.asked_devx[0]);
        assert_false(s.asked_devx[1]);
    }
}

static void test_absent_ioctl_is_not_retried(void **state)
{
    (void)state;
    static const int absent[] = {ENOTTY, EPROTONOSUPPORT, ENOSYS, EBADF};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        struct script s;
        int devx = 0;
        int rc = run(&s, absent[i], 0, &devx);
        assert_int_equal(s.calls, 1);
        assert_int_equal(devx, 7); /* not written */
        assert_int_equal(rc, absent[i] == EBADF ? ORB_EPERM : ORB_EUNAVAILABLE);
        assert_non_null(strstr(orb_last_error(), "mlx5_3"));
    }
}

static void test_second_refusal_is_mapped(void **state)
{
    (void)state;
    static const struct {
        int err;
        int status;
    } cases[] = {
        {EOPNOTSUPP, ORB_EUNAVAILABLE}, {EIO, ORB_EUNAVAILABLE}, {EAGAIN, ORB_EAGAIN}, {ENOMEM, ORB_ENOMEM},
        {EINVAL, ORB_EPERM},            {EACCES, ORB_EPERM},     {EFAULT, ORB_EPERM},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct script s;
        int devx = 0;
        assert_int_equal(run(&s, EINVAL, cases[i].err, &devx), cases[i].status);
        assert_int_equal(s.calls, 2);
        assert_int_equal(devx, 7);
        assert_non_null(strstr(orb_last_error(), "mlx5_3"));
    }
}

static void test_a_broken_table_fails_closed(void **state)
{
    (void)state;
    struct script s;
    int devx = 0;
    assert_int_equal(run(&s, -1, 0, &devx), ORB_EPERM);
    assert_int_equal(s.calls, 1);
    assert_int_equal(devx, 7);
    assert_int_equal(run(&s, EINVAL, -22, &devx), ORB_EPERM);
    assert_int_equal(devx, 7);
}

/* The real ioctl: a file that is no uverbs node has no such ioctl. */
static void test_kernel_table_on_files_that_are_no_uverbs_nodes(void **state)
{
    (void)state;
    bool devx = true;
    int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(orb_uctx_kernel_ops.create(NULL, fd, true), ENOTTY);
    assert_int_equal(orb_uctx_create(&orb_uctx_kernel_ops, NULL, fd, "mlx5_0", &devx), ORB_EUNAVAILABLE);
    assert_true(devx);
    close(fd);
    char path[] = "/tmp/orbite-uctx-XXXXXX";
    fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    assert_int_equal(orb_uctx_create(&orb_uctx_kernel_ops, NULL, fd, "mlx5_0", &devx), ORB_EUNAVAILABLE);
    close(fd);
    assert_int_equal(orb_uctx_kernel_ops.create(NULL, -1, true), EBADF);
}

/* The shared call refuses what it cannot send and reports the kernel's errno. */
static void test_uverbs_call_arguments(void **state)
{
    (void)state;
    struct orb_uverbs_attr attrs[ORB_UVERBS_MAX_ATTRS + 1];
    memset(attrs, 0, sizeof attrs);
    int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(orb_uverbs_call(fd, 0, 0, 0, attrs, ORB_UVERBS_MAX_ATTRS + 1), EINVAL);
    assert_int_equal(orb_uverbs_call(fd, 0, 0, 0, NULL, 1), EINVAL);
    assert_int_equal(orb_uverbs_call(-1, 0, 0, 0, attrs, 1), EBADF);
    attrs[0].data = 77;
    assert_int_equal(orb_uverbs_call(fd, 0, 0, 0, attrs, ORB_UVERBS_MAX_ATTRS), ENOTTY);
    assert_int_equal(attrs[0].data, 77); /* left alone on failure */
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments_are_checked),
        cmocka_unit_test(test_a_broken_table_fails_closed),
        cmocka_unit_test(test_absent_ioctl_is_not_retried),
        cmocka_unit_test(test_second_refusal_is_mapped),
        cmocka_unit_test(test_refused_devx_falls_back_to_plain_verbs),
        cmocka_unit_test(test_devx_first),
        cmocka_unit_test(test_request_bytes_are_libmlx5s),
        cmocka_unit_test(test_kernel_table_on_files_that_are_no_uverbs_nodes),
        cmocka_unit_test(test_uverbs_call_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
