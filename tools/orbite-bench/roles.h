/* orbite-bench: the source and requester sides of a run. */
#ifndef ORBITE_BENCH_ROLES_H
#define ORBITE_BENCH_ROLES_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <orbite/orbite.h>

#include "bench.h"

/* An engine configuration: library defaults, then opt->config_json, then the role's fixed
 * fields (source enabled or not; the source binds opt->endpoint when given). Returns 0, or -1
 * with `err` filled. */
int bench_engine_config(const struct bench_options *opt, int source, struct orb_engine_config *cfg,
                        char *err, size_t errlen);

/* Create the role's engine from `cfg`, with RDMA settings when the role's --rdma JSON is given
 * or the transport is rdma/unspec. Returns 0, or -1 with `err` filled. */
int bench_engine_create(const struct bench_options *opt, int source, const struct orb_engine_config *cfg,
                        orb_engine **out, char *err, size_t errlen);

/* ---- source ---- */

struct bench_source;

/* Create a source engine and register `size` bytes with ORB_PERM_REMOTE_WRITE holding the
 * pattern of opt->seed. The caller owns `*out` (bench_source_stop). Returns 0 or -1 with `err`. */
int bench_source_start(const struct bench_options *opt, uint64_t size, struct bench_source **out,
                       char *err, size_t errlen);

/* The bound endpoint and the epoch as hex text. Returns 0 or -1 with `err`. */
int bench_source_identity(const struct bench_source *src, char *endpoint, size_t endpoint_len,
                          char *epoch_hex, size_t epoch_len, char *err, size_t errlen);

/* Serve until `control_fd` reaches end of file (or fails) or `*stop` becomes non-zero. */
void bench_source_serve(int control_fd, const volatile sig_atomic_t *stop);

/* Close the engine (bounded wait) and free everything. NULL is a no-op returning 0.
 * Returns 0, or -1 with `err` when the engine could not be closed cleanly. */
int bench_source_stop(struct bench_source *src, char *err, size_t errlen);

/* ---- requester ---- */

struct bench_requester;

/* Create a requester engine, open the segment at `endpoint` for `epoch`, find the peer's
 * buffer and register a local mirror of it. The caller owns `*out` (bench_requester_close).
 * `opt` is borrowed for the requester's lifetime. Returns 0 or -1 with `err`. */
int bench_requester_open(const struct bench_options *opt, const char *endpoint,
                         const struct orb_epoch *epoch, struct bench_requester **out, char *err,
                         size_t errlen);

/* The source process this tool forked, whose CPU time each cell then reports (0: none, the
 * source runs elsewhere). */
void bench_requester_set_source_pid(struct bench_requester *req, pid_t pid);

/* Bytes of the peer's buffer this run uses. */
uint64_t bench_requester_buffer(const struct bench_requester *req);

/* 1 when the peer's buffer held the pattern of opt->seed at open; only then are WRITE cells
 * followed by restoring that pattern. */
int bench_requester_source_matches(const struct bench_requester *req);

/* Close the segment and the engine (bounded wait). NULL is a no-op returning 0. Returns 0, or
 * -1 with `err` when the engine could not be closed cleanly. */
int bench_requester_close(struct bench_requester *req, char *err, size_t errlen);

/* Results of one (op, block size) cell. */
struct bench_cell {
    enum orb_op op;
    uint64_t block_size;
    int ran;             /* 1: the measurement finished without a transfer failure */
    int verified;        /* 1: checked and equal; 0: not checked; -1: failed */
    double seconds;      /* measured time */
    uint64_t bytes;
    uint64_t requests;
    uint64_t batches;
    double gbps;         /* 1e9 bytes per second */
    double requests_per_s;
    double lat_min_us;   /* batch completion latency */
    double lat_p50_us;
    double lat_p99_us;
    double lat_max_us;
    /* CPU time over the measured time (from its start until every worker finished): this
     * process, and the forked source (-1 when the source runs elsewhere). */
    double cpu_requester_s;
    double cpu_source_s;
    double cpu_s_per_gb;    /* both together per 1e9 bytes moved; -1 without the source's */
    char error[BENCH_ERROR_MAX];
};

/* What a running cell reports about every 250 ms. */
struct bench_progress {
    unsigned cell_index;
    enum orb_op op;
    uint64_t block_size;
    int warming;         /* still in the unmeasured warm-up */
    double elapsed_s;    /* since the cell started, warm-up included */
    double total_s;      /* warm-up + duration */
    uint64_t bytes;      /* completed so far, warm-up included */
    uint64_t requests;
};

/* Called from the thread running the cell; returning non-zero aborts the cell. */
typedef int (*bench_tick_fn)(const struct bench_progress *progress, void *ctx);

/* Result of bench_requester_run_cell. */
enum bench_cell_status {
    BENCH_CELL_OK = 0,     /* ran and, if asked, verified */
    BENCH_CELL_FAILED = 1, /* failed; cell->error says why; later cells may still run */
    BENCH_CELL_FATAL = 2   /* worker threads did not stop by their deadline: exit at once */
};

/* Measure one cell with opt's batch, depth, threads, warm-up and duration, then verify it.
 * `cell_index` keeps the pattern of every WRITE cell distinct. */
enum bench_cell_status bench_requester_run_cell(struct bench_requester *req, enum orb_op op,
                                                uint64_t block_size, unsigned cell_index,
                                                bench_tick_fn tick, void *tick_ctx,
                                                struct bench_cell *cell);

#endif
