/* Test doubles for the engine side of the TCP transport: a fake engine (configuration, registry,
 * epoch, notification queue), fake batches that decide orb_xfer_may_start(), and an
 * orb_xfer_done() that records each xfer's outcome. Used by the TCP transport tests, which run a
 * source and a requester transport in one process over loopback. */
#ifndef ORB_TESTS_TCP_HARNESS_H
#define ORB_TESTS_TCP_HARNESS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/engine.h"
#include "core/transport.h"

#define TH_MAX_NOTES 8
#define TH_SEC 1000000000ull

/* The fake engine (defines the opaque struct orb_engine for these tests). */
struct orb_engine {
    struct orb_engine_config cfg;
    struct orb_registry *registry;
    struct orb_stage_pool *stage_pool;
    struct orb_epoch epoch;
    atomic_int source_open;
    void *tp;                            /* the transport under test */
    /* Notifications delivered to this engine as a source (guarded by the harness lock). */
    struct orb_notification_msg notes[TH_MAX_NOTES];
    size_t nnotes;
    /* Control messages for this engine as a source (orb_engine_control): NULL answers
     * ORB_EUNAVAILABLE; the last sender seen (guarded by the harness lock). */
    int (*control)(orb_engine *e, uint8_t transport, const uint8_t *req, size_t len, uint8_t *resp,
                   size_t cap, size_t *resp_len);
    struct orb_epoch control_sender;
    int control_calls;
    /* What the transport counted as served, by op (orb_engine_count_served; harness lock). */
    uint64_t served_requests[2], served_bytes[2], served_failed[2];
};

/* A fake batch: it withdraws its xfers once `withdraw` is set. */
struct orb_batch {
    atomic_int withdraw;
};

/* An xfer with its recorded outcome. */
struct th_xfer {
    struct orb_xfer x;       /* first member */
    struct orb_reg reg;      /* a registration of exactly the xfer's local bytes */
    atomic_int may_start_calls;
    int done_calls;          /* harness lock */
    int status;
    enum orb_remote_effect effect;
    char why[256];           /* the cause given with a failure ("" without) */
};

/* Start an engine with `cfg` (NULL: defaults, two stripes, two workers, 5 s io timeout) and a
 * fresh random epoch; asserts on failure. */
orb_engine *th_engine_new(const struct orb_engine_config *cfg);
/* Stop and destroy the transport, free the registry and the engine. */
void th_engine_free(orb_engine *e);
/* The engine's endpoint. */
void th_endpoint(orb_engine *e, char *buf, size_t len);

/* Allocate `len` bytes, register them with `perm`, fill them with a pattern derived from `seed`.
 * Returns the bytes; *owner_out receives the owner (release with orb_host_memory_unref()). */
uint8_t *th_region(orb_engine *e, size_t len, enum orb_perm perm, uint8_t seed,
                   orb_host_memory **owner_out);
void th_fill(uint8_t *p, size_t len, uint8_t seed);

/* Open a peer of `req` to `src` (the right epoch), asserting success. */
void *th_open(orb_engine *req, orb_engine *src);

/* An xfer that is a whole request of one slice (its request range is its own range). */
void th_xfer_init(struct th_xfer *t, enum orb_xfer_op op, void *local, const void *remote,
                  uint64_t length, struct orb_batch *batch);
/* Wait until every xfer of `t[0..n)` has been completed; 0, or -1 at the timeout. */
int th_wait(struct th_xfer *t, size_t n, uint64_t timeout_ns);
/* Snapshot of an xfer's outcome (under the harness lock). */
int th_done_calls(const struct th_xfer *t);

/* Submit then wait; returns the xfer's status (asserts it was accepted and completed once). */
int th_run(void *peer, struct th_xfer *t, uint64_t timeout_ns);

/* Log capture: warnings and above are appended to a buffer while capturing. */
void th_log_capture(void);
int th_log_contains(const char *needle);
void th_log_stop(void);

/* Number of notifications the source engine queued, and a copy of one. */
size_t th_notes(orb_engine *e, struct orb_notification_msg *out, size_t index);
/* Make orb_engine_deliver_notification() fail with `status` (0: queue normally). */
void th_set_notify_status(int status);

/* A raw client socket to `e`'s endpoint (blocking, 5 s receive timeout). */
int th_raw_connect(orb_engine *e);
/* Send HELLO (right or wrong epoch) on a raw socket and read the answer's type. */
int th_raw_hello(int fd, orb_engine *e, int right_epoch);
/* 1 when the other end closed the socket within `timeout_ns` (reads and drops any bytes). */
int th_raw_closed(int fd, uint64_t timeout_ns);

#endif
