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
};

#define ORB_HELPER_TEST_MAX_FDS 64u

/* --device-context fake: context creation that succeeds, with DevX, without touching the fd. */
extern const struct orb_uctx_ops orb_helper_testing_uctx_ops;

/* 1: a test request, answered; 0: not one (normal dispatch); negative: end the session. */
int orb_helper_testing_request(struct orb_helper_state *st, const uint8_t *buf, size_t len);

#endif
