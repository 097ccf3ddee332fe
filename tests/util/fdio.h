/* Test support: whole-buffer reads and writes on pipes and sockets between test processes. */
#ifndef ORB_TESTS_UTIL_FDIO_H
#define ORB_TESTS_UTIL_FDIO_H

#include <stddef.h>

/* Write all `len` bytes of `data` to `fd`, retrying short writes and EINTR. 0 or -1. */
int test_write_all(int fd, const void *data, size_t len);

/* Read exactly `len` bytes from `fd` within `timeout_ms` in all, retrying short reads and
 * EINTR. 0, or -1 (end of file, an error, or the deadline). */
int test_read_all(int fd, void *data, size_t len, int timeout_ms);

#endif
