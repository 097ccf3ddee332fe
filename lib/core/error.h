/* Internal: the one error convention (status codes + thread-local detail message). */
#ifndef ORB_CORE_ERROR_H
#define ORB_CORE_ERROR_H

#include <orbite/orbite.h>

/* Public entry points are defined with ORB_EXPORT; the version script (lib/orbite.map) is the export list. */
#define ORB_EXPORT __attribute__((visibility("default")))

/* Record `fmt` as the calling thread's detail message and return `status` (negative), so that
 * failure paths read `return orb_fail(ORB_EINVAL, "length is zero");`. */
int orb_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Same, with the previous detail message appended after ": " (for adding context while
 * propagating a callee's failure). Returns `status`. */
int orb_fail_wrap(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the calling thread's detail message. */
void orb_clear_error(void);

/* Map an errno value to the ORB_E* status of its meaning: ORB_EPEER only for a peer or network
 * that failed (ECONNRESET, EPIPE, ECONNREFUSED, EHOSTUNREACH, ...), ORB_ENOMEM / ORB_ERESOURCE for
 * local shortages, ORB_EINVAL for a malformed call, ORB_EPROTO for EPROTO, ORB_ETIMEDOUT for
 * ETIMEDOUT, ORB_EAGAIN for EAGAIN and EINTR, and ORB_EUNAVAILABLE for the system refusing or
 * lacking something, which includes every errno not listed. An unknown errno is never taken for
 * a failed peer, which would send the caller probing the peer for a restart. */
int orb_status_from_errno(int err);

#endif
