/* orbite-bench: the requester side (the measured workload and its verification).
 *
 * Layout: the requester registers a local mirror as large as the part of the peer's buffer in
 * use. Request slot k always moves block k: remote offset k * block <-> local offset k * block.
 * Each worker thread owns a contiguous run of slots and walks it round-robin, so the requests
 * in flight never share bytes and the final contents of every slot are known. */
#include "roles.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pattern.h"

#define NS_PER_S 1000000000ull
#define REQUESTER_CLOSE_TIMEOUT_NS (5ull * NS_PER_S)
#define OPEN_TIMEOUT_NS (10ull * NS_PER_S)
#define SCRATCH_LEN (16ull << 20)     /* read-back area for WRITE verification */
#define CHECK_REQUEST_MAX (1ull << 20) /* request size of verification transfers */
#define CHECK_BATCH_MAX 16
#define TICK_NS (250ull * 1000000ull)
#define LATENCY_SAMPLES_MAX (8u << 20)   /* per thread: 64 MiB of samples at most */
#define POISON_BYTE 0xa5
#define PROBE_LEN (64ull << 10)        /* bytes checked at open: does the source hold our pattern? */

struct bench_requester {
    const struct bench_options *opt; /* borrowed */
    orb_engine *engine;
    orb_segment *segment;
    uint64_t remote_base;  /* first byte of the peer's buffer */
    uint64_t used;         /* bytes of it in use (mirror length) */
    orb_host_memory *memory; /* mirror followed by the scratch area; our reference */
    /* --requester-memory cuda: the mirror and scratch area are device memory, and `shadow`
     * (mirror and scratch point into it) holds their host copy for filling and checking. */
    orb_cuda_memory *device;
    uint8_t *shadow;
    uint8_t *mirror;
    uint64_t mirror_addr;
    uint8_t *scratch;
    uint64_t scratch_addr;
    int restore;           /* put the source's pattern back after WRITE cells */
    pid_t source_pid;      /* the forked source, or 0 */
};

void bench_requester_set_source_pid(struct bench_requester *req, pid_t pid)
{
    req->source_pid = pid;
}

/* CPU seconds this process has used. */
static double self_cpu_s(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds (user + system) process `pid` has used, from /proc; -1 when unknown. */
static double proc_cpu_s(pid_t pid)
{
    if (pid <= 0)
        return -1;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: fields restart after the last ')'. */
    const char *p = strrchr(buf, ')');
    if (p == NULL)
        return -1;
    unsigned long long utime = 0, stime = 0;
    /* After ')': state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)(utime + stime) / (double)hz : -1;
}

static void errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int transfer_range(struct bench_requester *req, enum orb_op op, uint64_t local_addr,
                          uint64_t offset, uint64_t len, uint64_t timeout_ns, char *err,
                          size_t errlen);

/* With device memory: the host copy of [p, p + len) (a part of mirror or scratch) into the
 * device (push) or out of it (pull). No-ops for host memory. */
static int push(struct bench_requester *req, const uint8_t *p, uint64_t len, char *err, size_t errlen)
{
    if (req->device == NULL || len == 0)
        return 0;
    int rc = orb_cuda_memory_copy_in(req->device, (size_t)(p - req->shadow), p, (size_t)len);
    if (rc != 0)
        errf(err, errlen, "orb_cuda_memory_copy_in: %s (%s)", orb_strerror(rc), orb_last_error());
    return rc != 0 ? -1 : 0;
}

static int pull(struct bench_requester *req, uint8_t *p, uint64_t len, char *err, size_t errlen)
{
    if (req->device == NULL || len == 0)
        return 0;
    int rc = orb_cuda_memory_copy_out(req->device, (size_t)(p - req->shadow), p, (size_t)len);
    if (rc != 0)
        errf(err, errlen, "orb_cuda_memory_copy_out: %s (%s)", orb_strerror(rc), orb_last_error());
    return rc != 0 ? -1 : 0;
}

/* Pick the largest peer region that allows every operation we will run. */
static int pick_region(const struct bench_options *opt, const struct orb_region_desc *regions,
                       size_t count, struct orb_region_desc *out)
{
    enum orb_perm need = (opt->ops & BENCH_OP_WRITE) ? ORB_PERM_REMOTE_WRITE : ORB_PERM_REMOTE_READ;
    int found = 0;
    for (size_t i = 0; i < count; i++) {
        int allows = need == ORB_PERM_REMOTE_READ ? regions[i].perm != ORB_PERM_LOCAL
                                                  : regions[i].perm == ORB_PERM_REMOTE_WRITE;
        if (allows && (!found || regions[i].length > out->length)) {
            *out = regions[i];
            found = 1;
        }
    }
    return found ? 0 : -1;
}

int bench_requester_open(const struct bench_options *opt, const char *endpoint,
                         const struct orb_epoch *epoch, struct bench_requester **out, char *err,
                         size_t errlen)
{
    struct orb_engine_config cfg;
    if (bench_engine_config(opt, 0, &cfg, err, errlen) != 0)
        return -1;
    struct bench_requester *req = calloc(1, sizeof *req);
    if (req == NULL) {
        errf(err, errlen, "out of memory");
        return -1;
    }
    req->opt = opt;
    struct orb_region_desc *regions = NULL;
    size_t count = 0;
    struct orb_region_desc region = {0};

    int rc;
    if (bench_engine_create(opt, 0, &cfg, &req->engine, err, errlen) != 0)
        goto fail_free_struct;
    rc = orb_open_segment(req->engine, endpoint, epoch, OPEN_TIMEOUT_NS, &req->segment);
    if (rc != 0) {
        errf(err, errlen, "orb_open_segment(%s): %s (%s)", endpoint, orb_strerror(rc),
             orb_last_error());
        goto fail_free_engine;
    }
    rc = orb_segment_describe(req->segment, OPEN_TIMEOUT_NS, &regions, &count);
    if (rc != 0) {
        errf(err, errlen, "orb_segment_describe: %s (%s)", orb_strerror(rc), orb_last_error());
        goto fail_close_segment;
    }
    rc = pick_region(opt, regions, count, &region);
    orb_region_descs_free(regions);
    if (rc != 0) {
        errf(err, errlen, "the source at %s publishes no region allowing remote %s (%zu regions)",
             endpoint, (opt->ops & BENCH_OP_WRITE) ? "WRITE" : "READ", count);
        goto fail_close_segment;
    }
    req->remote_base = region.addr;
    req->used = region.length;
    /* --buffer-size limits the part in use, grown as for a source this tool starts. */
    if (opt->buffer_size != 0 && bench_source_buffer_size(opt) < req->used)
        req->used = bench_source_buffer_size(opt);
    if (req->used > SIZE_MAX - SCRATCH_LEN) {
        errf(err, errlen, "peer buffer of %llu bytes is too large", (unsigned long long)req->used);
        goto fail_close_segment;
    }
    size_t total = (size_t)(req->used + SCRATCH_LEN);
    orb_reg_id reg;
    if (opt->requester_device >= 0) {
        rc = orb_cuda_memory_alloc(opt->requester_device, total, &req->device);
        if (rc != 0) {
            errf(err, errlen, "orb_cuda_memory_alloc(cuda:%d, %zu): %s (%s)", opt->requester_device, total,
                 orb_strerror(rc), orb_last_error());
            goto fail_close_segment;
        }
        if ((req->shadow = malloc(total)) == NULL) {
            errf(err, errlen, "out of memory for a %zu-byte host copy", total);
            goto fail_unref_memory;
        }
        req->mirror = req->shadow;
        req->mirror_addr = orb_cuda_memory_ptr(req->device);
        memset(req->shadow, POISON_BYTE, total);
        if (push(req, req->shadow, total, err, errlen) != 0)
            goto fail_unref_memory;
        rc = orb_register_cuda_memory(req->engine, req->device, 0, total, ORB_PERM_LOCAL, &reg);
    } else {
        /* The same-host transport copies into and out of the requester's buffer only when the
         * source can map it: shareable memory for shm, and for unspec, which then picks the
         * same-host transport when the source runs on this host (and TCP or RDMA otherwise). */
        int shared = opt->transport == ORB_TRANSPORT_SHM || opt->transport == ORB_TRANSPORT_UNSPEC;
        rc = shared ? orb_host_memory_alloc_shared(total, 0, &req->memory)
                    : orb_host_memory_alloc(total, 0, &req->memory);
        if (rc != 0) {
            errf(err, errlen, "%s(%zu): %s (%s)",
                 shared ? "orb_host_memory_alloc_shared" : "orb_host_memory_alloc", total,
                 orb_strerror(rc), orb_last_error());
            goto fail_close_segment;
        }
        req->mirror = orb_host_memory_data(req->memory);
        req->mirror_addr = (uint64_t)(uintptr_t)req->mirror;
        /* Touch every page now, so that the first cell does not pay for page faults. */
        memset(req->mirror, POISON_BYTE, total);
        rc = orb_register_host_memory(req->engine, req->memory, 0, total, ORB_PERM_LOCAL, &reg);
    }
    req->scratch = req->mirror + req->used;
    req->scratch_addr = req->mirror_addr + req->used;
    if (rc != 0) {
        errf(err, errlen, "registering the requester's %zu bytes: %s (%s)", total, orb_strerror(rc),
             orb_last_error());
        goto fail_unref_memory;
    }
    /* The source must hold the pattern of our seed: otherwise every READ check fails, and
     * restoring after WRITE cells would overwrite its contents with a foreign pattern. */
    uint64_t probe = req->used < PROBE_LEN ? req->used : PROBE_LEN;
    if (transfer_range(req, ORB_OP_READ, req->scratch_addr, 0, probe,
                       (uint64_t)(opt->timeout_s * 1e9), err, errlen) != 0 ||
        pull(req, req->scratch, probe, err, errlen) != 0)
        goto fail_close_engine;
    size_t at = bench_pattern_check(req->scratch, (size_t)probe, opt->seed, 0);
    req->restore = at == probe;
    if (!req->restore && opt->verify) {
        errf(err, errlen,
             "the source's buffer does not hold the pattern of seed %#llx (byte %zu differs): "
             "use the source's --seed, or restart a source left changed by an interrupted run",
             (unsigned long long)opt->seed, at);
        goto fail_close_engine;
    }
    *out = req;
    return 0;

fail_close_engine:
    /* The registration holds the memory until the engine is gone. */
    orb_segment_close(req->segment);
    orb_engine_free(req->engine);
    orb_host_memory_unref(req->memory);
    orb_cuda_memory_unref(req->device);
    free(req->shadow);
    free(req);
    return -1;

fail_unref_memory:
    orb_host_memory_unref(req->memory);
    orb_cuda_memory_unref(req->device);
    free(req->shadow);
fail_close_segment:
    orb_segment_close(req->segment);
fail_free_engine:
    orb_engine_free(req->engine);
fail_free_struct:
    free(req);
    return -1;
}

uint64_t bench_requester_buffer(const struct bench_requester *req)
{
    return req->used;
}

int bench_requester_source_matches(const struct bench_requester *req)
{
    return req->restore;
}

int bench_requester_close(struct bench_requester *req, char *err, size_t errlen)
{
    if (req == NULL)
        return 0;
    int result = 0;
    orb_segment_close(req->segment);
    int rc = orb_engine_close(req->engine, REQUESTER_CLOSE_TIMEOUT_NS);
    if (rc != 0) {
        errf(err, errlen, "orb_engine_close (requester): %s (%s)", orb_strerror(rc),
             orb_last_error());
        result = -1;
    }
    orb_engine_free(req->engine);
    orb_host_memory_unref(req->memory);
    orb_cuda_memory_unref(req->device);
    free(req->shadow);
    free(req);
    return result;
}

/* ------------------------------------------------------------------------ */
/* Measured workload                                                         */
/* ------------------------------------------------------------------------ */

struct cell_run;

struct worker {
    struct cell_run *run;
    unsigned index;
    pthread_t thread;
    uint64_t slot_base;   /* first slot this worker owns */
    uint64_t slot_count;  /* slots it owns (>= depth * batch) */
    uint64_t issued;      /* requests built so far; the next one uses slot issued % slot_count */
    struct orb_request *requests; /* depth * batch, one group per ring entry */
    orb_batch *ring[BENCH_MAX_DEPTH];
    uint64_t ring_start[BENCH_MAX_DEPTH];
    /* Measured batches: submitted at or after run->measure_start. */
    uint64_t bytes;
    uint64_t requests_done;
    uint64_t batches;
    uint64_t last_done_ns;
    uint64_t measured_started; /* batches it started at or after run->measure_start */
    uint64_t *latency;
    size_t n_latency;
    size_t cap_latency;
    /* Everything completed, warm-up included, for the progress line. */
    atomic_uint_fast64_t live_bytes;
    atomic_uint_fast64_t live_requests;
    int failed;
    char error[BENCH_ERROR_MAX];
};

struct cell_run {
    struct bench_requester *req;
    enum orb_op op;
    uint64_t block;
    uint32_t batch;
    uint32_t depth;
    uint64_t timeout_ns;
    uint64_t measure_start;
    uint64_t measure_end;
    atomic_int abort;
    struct worker *workers;
    unsigned n_workers;
    pthread_mutex_t lock;      /* guards n_finished */
    pthread_cond_t finished;   /* signalled as each worker ends (CLOCK_MONOTONIC) */
    unsigned n_finished;
};

static const char *op_name(enum orb_op op)
{
    return op == ORB_OP_READ ? "READ" : "WRITE";
}

/* Record the worker's first failure and stop every worker. */
static void worker_fail(struct worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void worker_fail(struct worker *w, const char *fmt, ...)
{
    if (!w->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->error, sizeof w->error, fmt, ap);
        va_end(ap);
        w->failed = 1;
    }
    atomic_store(&w->run->abort, 1);
}

static void worker_fail_report(struct worker *w, const char *call, int rc,
                               const struct orb_batch_report *rep)
{
    const char *detail = orb_last_error();
    if (rep != NULL && rep->has_failure && detail[0] == '\0') {
        worker_fail(w, "thread %u: %s: %s%s%s; first failure at request %zu of the batch (%zu affected): %s",
                    w->index, call, orb_strerror(rc), detail[0] ? ": " : "", detail,
                    rep->failure.request_index, rep->failure.affected_requests,
                    orb_strerror(rep->failure.status));
    } else {
        worker_fail(w, "thread %u: %s: %s%s%s", w->index, call, orb_strerror(rc),
                    detail[0] ? ": " : "", detail);
    }
}

/* Build the next batch of requests into `reqs`. */
static void build_batch(struct worker *w, struct orb_request *reqs)
{
    const struct cell_run *run = w->run;
    const struct bench_requester *req = run->req;
    for (uint32_t i = 0; i < run->batch; i++) {
        uint64_t slot = w->slot_base + (w->issued + i) % w->slot_count;
        uint64_t offset = slot * run->block;
        reqs[i] = (struct orb_request){
            .transport = req->opt->transport,
            .op = run->op,
            .local_addr = req->mirror_addr + offset,
            .remote_addr = req->remote_base + offset,
            .length = run->block,
            .priority = ORB_PRIORITY_HIGH,
        };
    }
    w->issued += run->batch;
}

static void record_latency(struct worker *w, uint64_t ns)
{
    if (w->n_latency == w->cap_latency) {
        if (w->cap_latency >= LATENCY_SAMPLES_MAX)
            return;
        size_t cap = w->cap_latency ? w->cap_latency * 2 : 4096;
        uint64_t *grown = realloc(w->latency, cap * sizeof *grown);
        if (grown == NULL)
            return; /* keep the samples we have; the quantiles stay meaningful */
        w->latency = grown;
        w->cap_latency = cap;
    }
    w->latency[w->n_latency++] = ns;
}

/* Account one successful batch that started at `start` and was seen complete at `done`. */
static int account_batch(struct worker *w, uint64_t start, uint64_t done,
                         const struct orb_batch_report *rep)
{
    const struct cell_run *run = w->run;
    uint64_t expect = (uint64_t)run->batch * run->block;
    if (rep->completed_requests != run->batch || rep->completed_bytes != expect) {
        worker_fail(w, "thread %u: batch reported success with %zu of %u requests and %llu of %llu bytes",
                    w->index, rep->completed_requests, run->batch,
                    (unsigned long long)rep->completed_bytes, (unsigned long long)expect);
        return -1;
    }
    atomic_fetch_add_explicit(&w->live_bytes, expect, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->live_requests, run->batch, memory_order_relaxed);
    if (start >= run->measure_start) {
        w->bytes += expect;
        w->requests_done += run->batch;
        w->batches++;
        if (done > w->last_done_ns)
            w->last_done_ns = done;
        record_latency(w, done - start);
    }
    return 0;
}

/* Start another batch while the measured time lasts. A thread that has not started one in
 * it yet (its batches of the warm-up outlasted the whole window, as on a slow or loaded host)
 * starts one more, so every cell measures at least one batch per thread and the reported
 * time stretches to that batch's completion rather than reporting nothing. */
static int keep_going(const struct worker *w)
{
    const struct cell_run *run = w->run;
    if (atomic_load(&run->abort))
        return 0;
    return bench_now_ns() < run->measure_end || w->measured_started == 0;
}

static void note_started(struct worker *w, uint64_t start)
{
    if (start >= w->run->measure_start)
        w->measured_started++;
}

/* depth 1: one synchronous orb_submit_and_wait at a time. */
static void run_sync(struct worker *w)
{
    struct cell_run *run = w->run;
    while (keep_going(w)) {
        struct orb_batch_report rep;
        build_batch(w, w->requests);
        uint64_t start = bench_now_ns();
        note_started(w, start);
        int rc = orb_submit_and_wait(run->req->engine, run->req->segment, w->requests, run->batch,
                                     NULL, run->timeout_ns, &rep);
        uint64_t done = bench_now_ns();
        if (rc != 0) {
            worker_fail_report(w, "orb_submit_and_wait", rc, &rep);
            return;
        }
        if (account_batch(w, start, done, &rep) != 0)
            return;
    }
}

/* Open, fill and seal an asynchronous batch into ring entry `slot`. */
static int launch_batch(struct worker *w, unsigned slot)
{
    struct cell_run *run = w->run;
    struct orb_request *reqs = w->requests + (size_t)slot * run->batch;
    orb_batch *batch = NULL;
    build_batch(w, reqs);
    uint64_t start = bench_now_ns();
    int rc = orb_batch_open(run->req->engine, run->req->segment, &batch);
    if (rc != 0) {
        worker_fail_report(w, "orb_batch_open", rc, NULL);
        return -1;
    }
    rc = orb_batch_submit(batch, reqs, run->batch);
    if (rc == 0)
        rc = orb_batch_seal(batch, NULL);
    else
        worker_fail_report(w, "orb_batch_submit", rc, NULL);
    if (rc != 0) {
        if (!w->failed)
            worker_fail_report(w, "orb_batch_seal", rc, NULL);
        /* Submitted work may still be live: seal so that it can be waited for, then free. */
        (void)orb_batch_seal(batch, NULL);
        struct orb_batch_report rep;
        (void)orb_batch_wait(batch, run->timeout_ns, &rep);
        if (orb_batch_free(batch) != 0)
            worker_fail(w, "thread %u: a failed batch stayed live; it is leaked", w->index);
        return -1;
    }
    w->ring[slot] = batch;
    w->ring_start[slot] = start;
    note_started(w, start);
    return 0;
}

/* depth > 1: keep up to `depth` sealed batches in flight, completing them in order. */
static void run_async(struct worker *w)
{
    struct cell_run *run = w->run;
    unsigned head = 0;
    unsigned in_flight = 0;
    for (;;) {
        while (in_flight < run->depth && keep_going(w)) {
            if (launch_batch(w, (head + in_flight) % run->depth) != 0)
                break;
            in_flight++;
        }
        if (in_flight == 0)
            return;
        struct orb_batch_report rep;
        orb_batch *batch = w->ring[head];
        int rc = orb_batch_wait(batch, run->timeout_ns, &rep);
        uint64_t done = bench_now_ns();
        if (rc != 0)
            worker_fail_report(w, "orb_batch_wait", rc, &rep);
        else if (!w->failed)
            (void)account_batch(w, w->ring_start[head], done, &rep);
        rc = orb_batch_free(batch);
        if (rc != 0)
            worker_fail(w, "thread %u: orb_batch_free: %s; a batch still live after its wait is leaked",
                        w->index, orb_strerror(rc));
        w->ring[head] = NULL;
        head = (head + 1) % run->depth;
        in_flight--;
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    if (w->run->depth == 1)
        run_sync(w);
    else
        run_async(w);
    pthread_mutex_lock(&w->run->lock);
    w->run->n_finished++;
    pthread_cond_signal(&w->run->finished);
    pthread_mutex_unlock(&w->run->lock);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Verification                                                              */
/* ------------------------------------------------------------------------ */

/* Move [offset, offset + len) of the peer's buffer from or to local memory at `local_addr`,
 * in requests of at most CHECK_REQUEST_MAX bytes. */
static int transfer_range(struct bench_requester *req, enum orb_op op, uint64_t local_addr,
                          uint64_t offset, uint64_t len, uint64_t timeout_ns, char *err,
                          size_t errlen)
{
    struct orb_request reqs[CHECK_BATCH_MAX];
    while (len > 0) {
        size_t n = 0;
        while (n < CHECK_BATCH_MAX && len > 0) {
            uint64_t piece = len < CHECK_REQUEST_MAX ? len : CHECK_REQUEST_MAX;
            reqs[n++] = (struct orb_request){
                .transport = req->opt->transport,
                .op = op,
                .local_addr = local_addr,
                .remote_addr = req->remote_base + offset,
                .length = piece,
            };
            local_addr += piece;
            offset += piece;
            len -= piece;
        }
        struct orb_batch_report rep;
        int rc = orb_submit_and_wait(req->engine, req->segment, reqs, n, NULL, timeout_ns, &rep);
        if (rc != 0) {
            errf(err, errlen, "%s of verification data: %s (%s)", op_name(op), orb_strerror(rc),
                 orb_last_error());
            return -1;
        }
    }
    return 0;
}

static void mismatch(char *err, size_t errlen, const char *what, uint64_t offset, uint8_t got,
                     uint8_t want)
{
    errf(err, errlen, "verification failed: %s at buffer offset %llu: byte 0x%02x, expected 0x%02x",
         what, (unsigned long long)offset, got, want);
}

/* READ: the mirror's touched slots must hold the source's pattern. */
static int verify_read(const struct cell_run *run, char *err, size_t errlen)
{
    struct bench_requester *req = run->req;
    for (unsigned t = 0; t < run->n_workers; t++) {
        const struct worker *w = &run->workers[t];
        uint64_t touched = w->issued < w->slot_count ? w->issued : w->slot_count;
        uint64_t start = w->slot_base * run->block;
        uint64_t len = touched * run->block;
        if (pull(req, req->mirror + start, len, err, errlen) != 0)
            return -1;
        size_t at = bench_pattern_check(req->mirror + start, (size_t)len, req->opt->seed, start);
        if (at != len) {
            mismatch(err, errlen, "data read differs from the source's pattern", start + at,
                     req->mirror[start + at], bench_pattern_byte(req->opt->seed, start + at));
            return -1;
        }
    }
    return 0;
}

/* WRITE: read the touched slots back and compare them with what was written (`seed`). */
static int verify_write(const struct cell_run *run, uint64_t seed, char *err, size_t errlen)
{
    struct bench_requester *req = run->req;
    for (unsigned t = 0; t < run->n_workers; t++) {
        const struct worker *w = &run->workers[t];
        uint64_t touched = w->issued < w->slot_count ? w->issued : w->slot_count;
        uint64_t offset = w->slot_base * run->block;
        uint64_t end = offset + touched * run->block;
        while (offset < end) {
            uint64_t len = end - offset < SCRATCH_LEN ? end - offset : SCRATCH_LEN;
            memset(req->scratch, POISON_BYTE, (size_t)len);
            if (push(req, req->scratch, len, err, errlen) != 0 ||
                transfer_range(req, ORB_OP_READ, req->scratch_addr, offset, len, run->timeout_ns,
                               err, errlen) != 0 ||
                pull(req, req->scratch, len, err, errlen) != 0)
                return -1;
            size_t at = bench_pattern_check(req->scratch, (size_t)len, seed, offset);
            if (at != len) {
                mismatch(err, errlen, "data written did not arrive", offset + at,
                         req->scratch[at], bench_pattern_byte(seed, offset + at));
                return -1;
            }
            offset += len;
        }
    }
    return 0;
}

/* Put the source's pattern back over every slot a WRITE cell touched, so that later READ
 * cells (and later runs against the same source) verify against the original contents. */
static int restore_source(const struct cell_run *run, char *err, size_t errlen)
{
    struct bench_requester *req = run->req;
    for (unsigned t = 0; t < run->n_workers; t++) {
        const struct worker *w = &run->workers[t];
        uint64_t touched = w->issued < w->slot_count ? w->issued : w->slot_count;
        uint64_t offset = w->slot_base * run->block;
        uint64_t len = touched * run->block;
        if (len == 0)
            continue;
        bench_pattern_fill(req->mirror + offset, (size_t)len, req->opt->seed, offset);
        if (push(req, req->mirror + offset, len, err, errlen) != 0 ||
            transfer_range(req, ORB_OP_WRITE, req->mirror_addr + offset, offset, len,
                           run->timeout_ns, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* One cell                                                                  */
/* ------------------------------------------------------------------------ */

/* A cell's shared state, on the heap: if its workers cannot be stopped it is leaked, never
 * freed under them. */
static struct cell_run *cell_run_new(void)
{
    struct cell_run *run = calloc(1, sizeof *run);
    if (run == NULL)
        return NULL;
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        goto fail_free;
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&run->finished, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        goto fail_free;
    if (pthread_mutex_init(&run->lock, NULL) != 0)
        goto fail_destroy_cond;
    atomic_init(&run->abort, 0);
    return run;

fail_destroy_cond:
    pthread_cond_destroy(&run->finished);
fail_free:
    free(run);
    return NULL;
}

static void cell_run_free(struct cell_run *run)
{
    for (unsigned t = 0; t < run->n_workers && run->workers != NULL; t++) {
        free(run->workers[t].requests);
        free(run->workers[t].latency);
    }
    free(run->workers);
    pthread_mutex_destroy(&run->lock);
    pthread_cond_destroy(&run->finished);
    free(run);
}

/* Fold the workers' measurements into `cell`. */
static void summarise(struct cell_run *run, struct bench_cell *cell)
{
    uint64_t last_done = 0;
    size_t n_samples = 0;
    for (unsigned t = 0; t < run->n_workers; t++) {
        const struct worker *w = &run->workers[t];
        cell->bytes += w->bytes;
        cell->requests += w->requests_done;
        cell->batches += w->batches;
        if (w->last_done_ns > last_done)
            last_done = w->last_done_ns;
        n_samples += w->n_latency;
    }
    if (cell->batches == 0 || last_done <= run->measure_start)
        return;
    cell->seconds = (double)(last_done - run->measure_start) / 1e9;
    cell->gbps = (double)cell->bytes / cell->seconds / 1e9;
    cell->cpu_s_per_gb = cell->cpu_source_s < 0 || cell->bytes == 0
                             ? -1
                             : (cell->cpu_requester_s + cell->cpu_source_s) /
                                   ((double)cell->bytes / 1e9);
    cell->requests_per_s = (double)cell->requests / cell->seconds;
    uint64_t *all = n_samples > 0 ? malloc(n_samples * sizeof *all) : NULL;
    if (all == NULL)
        return; /* no samples could be kept: latency stays 0 */
    size_t k = 0;
    for (unsigned t = 0; t < run->n_workers; t++) {
        memcpy(all + k, run->workers[t].latency, run->workers[t].n_latency * sizeof *all);
        k += run->workers[t].n_latency;
    }
    bench_sort_u64(all, n_samples);
    cell->lat_min_us = (double)all[0] / 1e3;
    cell->lat_p50_us = (double)bench_quantile(all, n_samples, 0.50) / 1e3;
    cell->lat_p99_us = (double)bench_quantile(all, n_samples, 0.99) / 1e3;
    cell->lat_max_us = (double)all[n_samples - 1] / 1e3;
    free(all);
}

enum bench_cell_status bench_requester_run_cell(struct bench_requester *req, enum orb_op op,
                                                uint64_t block_size, unsigned cell_index,
                                                bench_tick_fn tick, void *tick_ctx,
                                                struct bench_cell *cell)
{
    const struct bench_options *opt = req->opt;
    char blockbuf[32];
    memset(cell, 0, sizeof *cell);
    cell->op = op;
    cell->block_size = block_size;

    uint64_t slots = req->used / block_size;
    uint64_t per_thread = slots / opt->threads;
    uint64_t needed = (uint64_t)opt->depth * opt->batch;
    if (per_thread < needed) {
        errf(cell->error, sizeof cell->error,
             "buffer of %llu bytes holds %llu blocks of %s per thread; depth * batch needs %llu",
             (unsigned long long)req->used, (unsigned long long)per_thread,
             bench_format_size(block_size, blockbuf, sizeof blockbuf), (unsigned long long)needed);
        return BENCH_CELL_FAILED;
    }

    /* A WRITE cell writes its own pattern, distinct per cell, so stale bytes cannot pass. */
    uint64_t write_seed = bench_mix64(opt->seed ^ (0x5752495445ull + cell_index));
    uint64_t span = per_thread * opt->threads * block_size;
    if (op == ORB_OP_READ)
        memset(req->mirror, POISON_BYTE, (size_t)span);
    else
        bench_pattern_fill(req->mirror, (size_t)span, write_seed, 0);
    if (push(req, req->mirror, span, cell->error, sizeof cell->error) != 0)
        return BENCH_CELL_FAILED;

    struct cell_run *run = cell_run_new();
    if (run == NULL) {
        errf(cell->error, sizeof cell->error, "out of memory");
        return BENCH_CELL_FAILED;
    }
    run->req = req;
    run->op = op;
    run->block = block_size;
    run->batch = opt->batch;
    run->depth = opt->depth;
    run->timeout_ns = (uint64_t)(opt->timeout_s * 1e9);
    run->workers = calloc(opt->threads, sizeof *run->workers);
    if (run->workers == NULL) {
        cell_run_free(run);
        errf(cell->error, sizeof cell->error, "out of memory");
        return BENCH_CELL_FAILED;
    }
    run->n_workers = opt->threads;
    for (unsigned t = 0; t < run->n_workers; t++) {
        struct worker *w = &run->workers[t];
        w->run = run;
        w->index = t;
        w->slot_base = (uint64_t)t * per_thread;
        w->slot_count = per_thread;
        atomic_init(&w->live_bytes, 0);
        atomic_init(&w->live_requests, 0);
        w->requests = calloc((size_t)opt->depth * opt->batch, sizeof *w->requests);
        if (w->requests == NULL) {
            cell_run_free(run);
            errf(cell->error, sizeof cell->error, "out of memory");
            return BENCH_CELL_FAILED;
        }
    }

    uint64_t cell_start = bench_now_ns();
    run->measure_start = cell_start + (uint64_t)(opt->warmup_s * 1e9);
    run->measure_end = run->measure_start + (uint64_t)(opt->duration_s * 1e9);
    /* Every worker finishes by then: after the measured time it only waits for its `depth`
     * batches in flight, each wait bounded by the timeout. */
    uint64_t deadline =
        run->measure_end + (uint64_t)(opt->depth + 1) * run->timeout_ns + 5 * NS_PER_S;

    unsigned started = 0;
    for (; started < run->n_workers; started++) {
        if (pthread_create(&run->workers[started].thread, NULL, worker_main,
                           &run->workers[started]) != 0) {
            atomic_store(&run->abort, 1);
            errf(cell->error, sizeof cell->error, "cannot start requester thread %u", started);
            break;
        }
    }

    /* Sleep until a worker ends, the measured time starts (to sample CPU time) or the next
     * progress tick: no polling beside the workload. */
    uint64_t next_tick = cell_start + TICK_NS;
    double cpu_self_start = -1, cpu_source_start = -1;
    pthread_mutex_lock(&run->lock);
    while (run->n_finished < started) {
        uint64_t now = bench_now_ns();
        if (cpu_self_start < 0 && now >= run->measure_start) {
            cpu_self_start = self_cpu_s();
            cpu_source_start = proc_cpu_s(req->source_pid);
        }
        if (cpu_self_start < 0 && run->measure_start < next_tick && now < run->measure_start) {
            struct timespec ts = {.tv_sec = (time_t)(run->measure_start / NS_PER_S),
                                  .tv_nsec = (long)(run->measure_start % NS_PER_S)};
            pthread_cond_timedwait(&run->finished, &run->lock, &ts);
            continue;
        }
        if (now >= deadline) {
            pthread_mutex_unlock(&run->lock);
            errf(cell->error, sizeof cell->error,
                 "requester threads still busy %.1f s after the measured time; giving up",
                 (double)(now - run->measure_end) / 1e9);
            /* The threads still use the engine, `run` and their memory: nothing is freed. */
            return BENCH_CELL_FATAL;
        }
        if (now < next_tick) {
            uint64_t wake = next_tick < deadline ? next_tick : deadline;
            struct timespec ts = {.tv_sec = (time_t)(wake / NS_PER_S),
                                  .tv_nsec = (long)(wake % NS_PER_S)};
            pthread_cond_timedwait(&run->finished, &run->lock, &ts);
            continue;
        }
        pthread_mutex_unlock(&run->lock);
        next_tick = now + TICK_NS;
        struct bench_progress p = {
            .cell_index = cell_index,
            .op = op,
            .block_size = block_size,
            .warming = now < run->measure_start,
            .elapsed_s = (double)(now - cell_start) / 1e9,
            .total_s = opt->warmup_s + opt->duration_s,
        };
        for (unsigned t = 0; t < started; t++) {
            p.bytes += atomic_load_explicit(&run->workers[t].live_bytes, memory_order_relaxed);
            p.requests += atomic_load_explicit(&run->workers[t].live_requests,
                                               memory_order_relaxed);
        }
        if (tick != NULL && tick(&p, tick_ctx) != 0 && !atomic_load(&run->abort)) {
            atomic_store(&run->abort, 1);
            if (cell->error[0] == '\0')
                errf(cell->error, sizeof cell->error, "interrupted");
        }
        pthread_mutex_lock(&run->lock);
    }
    pthread_mutex_unlock(&run->lock);
    for (unsigned t = 0; t < started; t++)
        pthread_join(run->workers[t].thread, NULL);
    cell->cpu_requester_s = cpu_self_start < 0 ? 0 : self_cpu_s() - cpu_self_start;
    double source_now = proc_cpu_s(req->source_pid);
    cell->cpu_source_s = cpu_source_start < 0 || source_now < 0 ? -1 : source_now - cpu_source_start;

    /* A worker's own failure names the cause best; an interruption or a thread that could
     * not start is reported when no worker failed. */
    int failed = started < run->n_workers || cell->error[0] != '\0';
    for (unsigned t = 0; t < started; t++) {
        if (run->workers[t].failed) {
            snprintf(cell->error, sizeof cell->error, "%s", run->workers[t].error);
            failed = 1;
            break;
        }
    }
    if (!failed) {
        summarise(run, cell);
        if (cell->batches == 0) {
            errf(cell->error, sizeof cell->error,
                 "no batch started during the measured %.2f s; raise --duration", opt->duration_s);
            failed = 1;
        }
    }
    cell->ran = !failed;

    enum bench_cell_status status = failed ? BENCH_CELL_FAILED : BENCH_CELL_OK;
    if (!failed && opt->verify) {
        int bad = op == ORB_OP_READ ? verify_read(run, cell->error, sizeof cell->error)
                                    : verify_write(run, write_seed, cell->error, sizeof cell->error);
        cell->verified = bad ? -1 : 1;
        if (bad)
            status = BENCH_CELL_FAILED;
    }
    if (op == ORB_OP_WRITE && req->restore && started == run->n_workers) {
        char restore_err[BENCH_ERROR_MAX];
        if (restore_source(run, restore_err, sizeof restore_err) != 0) {
            if (cell->error[0] == '\0')
                snprintf(cell->error, sizeof cell->error, "restoring the source pattern: %.450s",
                         restore_err);
            status = BENCH_CELL_FAILED;
        }
    }
    cell_run_free(run);
    return status;
}
