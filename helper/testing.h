/* Test-only requests of orbite-helper-test (built with ORB_HELPER_TESTING, installed nowhere).
 * They use the normal 16-byte header with types outside the protocol's range, so the installed
 * helper's parser rejects them like any unknown type. Bodies are little-endian. */
#ifndef ORB_HELPER_TESTING_H
#define ORB_HELPER_TESTING_H

#include <stddef.h>
#include <stdint.h>

struct orb_helper_state;
struct orb_uctx_ops;

enum orb_helper_test_type {
    /* req: empty. rep: u32 non-NUL bytes left in the initial environment block | u32 nfds |
     * nfds x i32 open fds (ascending) | u16 len + /proc/self/status (truncated to fit). */
    ORB_HELPER_TEST_SELF_REPORT = 0x7F00,
    ORB_HELPER_TEST_SELF_REPORT_REPLY = 0x7F01,
    /* req: empty. The helper calls socket(), which the filter forbids: it must die of SIGSYS.
     * Should socket() return, the reply (0x7F03) carries i32 result | i32 errno. */
    ORB_HELPER_TEST_FORBIDDEN = 0x7F02,
    ORB_HELPER_TEST_FORBIDDEN_REPLY = 0x7F03,
    /* req: empty. Like ORB_HELPER_TEST_FORBIDDEN with a call the filter forbids by its
     * arguments or outright: openat(AT_FDCWD, "/etc/passwd"), unlinkat() in the held sysfs
     * directory, and capset() (raising nothing). Same reply, should the call return. */
    ORB_HELPER_TEST_FORBIDDEN_OPENAT = 0x7F04,
    ORB_HELPER_TEST_FORBIDDEN_UNLINKAT = 0x7F05,
    ORB_HELPER_TEST_FORBIDDEN_CAPSET = 0x7F06,
};

#define ORB_HELPER_TEST_MAX_FDS 64u

/* --device-context fake: context creation that succeeds, with DevX, without touching the fd. */
extern const struct orb_uctx_ops orb_helper_testing_uctx_ops;

/* /proc/self of the worker, opened once before its filter (which admits read-only openat() on
 * this descriptor alone in the test build): what the self-report reads. -1 when absent. */
int orb_helper_testing_open_proc(void);

/* 1: a test request, answered; 0: not one (normal dispatch); negative: end the session. */
int orb_helper_testing_request(struct orb_helper_state *st, const uint8_t *buf, size_t len);

#endif
