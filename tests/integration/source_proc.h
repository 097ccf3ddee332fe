/* A source engine in a separate process, driven over a socketpair, for two-process tests. */
#ifndef ORB_TEST_SOURCE_PROC_H
#define ORB_TEST_SOURCE_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <orbite/orbite.h>

#define SRC_RW_LEN ((64u << 20) + 8192u) /* ORB_PERM_REMOTE_WRITE */
#define SRC_RO_LEN (1u << 20)            /* ORB_PERM_REMOTE_READ  */

struct src_info {
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    uint64_t rw_addr;
    uint64_t ro_addr;
};

struct src_proc {
    pid_t pid;
    int cmd_fd;
    struct src_info info;
};

/* The byte at offset `off` of a buffer filled with pattern `seed`. */
static inline uint8_t pattern_byte(uint32_t seed, uint64_t off)
{
    uint64_t x = (off + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32 | seed);
    x ^= x >> 29;
    return (uint8_t)(x ^ (x >> 17));
}

/* Start a source process listening on `port` (0: any). Both buffers hold pattern 1 (rw) and 2
 * (ro). Returns 0 or -1. */
int src_start(struct src_proc *p, uint16_t port);
/* Kill -9 and reap (idempotent). */
void src_kill(struct src_proc *p);
/* Ask the source to exit cleanly and reap. */
void src_stop(struct src_proc *p);
/* Copy `len` bytes of the source's memory at `addr` into `out`. 0 or -1. */
int src_get(struct src_proc *p, uint64_t addr, void *out, uint64_t len);
/* Overwrite the source's memory at `addr` with `len` bytes. 0 or -1. */
int src_set(struct src_proc *p, uint64_t addr, const void *data, uint64_t len);
/* Notifications the source received so far whose named range already held the announced
 * checksum when the notification was taken (ok) and those that did not (bad). */
int src_notes(struct src_proc *p, uint64_t *ok, uint64_t *bad);

/* Notification payload the tests send: the range written and its checksum. */
struct note_payload {
    uint64_t addr;
    uint64_t len;
    uint64_t sum;
};
uint64_t checksum(const void *data, uint64_t len);

/* Entry point of the source process (the test binary re-executed with --source). */
int src_main(int cmd_fd, uint16_t port);

#endif
