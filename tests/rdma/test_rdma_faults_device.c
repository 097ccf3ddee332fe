/* RDMA under faults on the rails topology, two processes (the source engine in a child), each
 * cell with traffic in flight and its batch reports checked exactly (status, prefix, span,
 * remote effect), every wait within its bound and the bytes outside a failed request intact:
 *  - a port down under a two-rail transfer, for longer than a grant's expiry: the rail is fenced
 *    and paused, the other rail carries the rest, and the rail's trial brings it back once the
 *    port is up;
 *  - a port down when the engine starts: the rail starts paused, then carries requests;
 *  - the address under a rail replaced mid-run (and back): fenced, re-ranked, reopened;
 *  - a source killed (SIGKILL) under traffic, and its successor at the same endpoint (the old
 *    segment reads ORB_ESTALE, never the new process's memory);
 *  - close with a frozen source (SIGSTOP): the documented result within the timeout;
 *  - a key refused by a source that no longer answers: the peer's failure, not a permission;
 *  - a frozen source with more requests than its connection takes holds back no other
 *    source's requests, and its queued requests cost the grant threads no CPU while they wait;
 *  - through a test-only interposer over the loaded verbs table (verbs_interposer.h): posts the
 *    device refuses with and without naming the WR, a key never granted (the peer refuses the
 *    access), a queue pair forced to the error state mid-batch, a post that cannot be proven
 *    untaken (it stays charged; close says ORB_EUNQUIESCED), a queue pair the device refuses to
 *    destroy (kept with its charges, never retried).
 *
 * It changes the VM's links (`ip link`, `ip addr`), so it needs root and the rails topology;
 * elsewhere it exits 77. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "device_util.h"
#include "verbs_interposer.h"
#include "../util/thread_use.h"

#define AREA (8u << 20)            /* each side's registered memory */
#define CHUNK (1u << 20)           /* one request */
#define GUARD 4096u                /* bytes around the local target that must never change */
#define TIMEOUT_NS (60ull * 1000000000ull)
#define IO_TIMEOUT_S 4u

static uint8_t pattern(uint64_t i, uint32_t seed)
{
    return (uint8_t)((i * 2654435761u) >> 13) ^ (uint8_t)(seed * 7u + 1u);
}

/* An engine on `nics` with the settings this test's faults need: short retransmission (about
 * 0.27 s before a lost peer is given up), a rail paused at its first failure for 2 s,
 * io_timeout_s IO_TIMEOUT_S; read_replays `replays` (NULL: the default). */
static orb_engine *engine_on(const char *nics, int source, const char *endpoint, const char *replays,
                             const char *progress)
{
    const char *kv[18] = {"rdma_whitelist", nics, "ack_timeout", "14", "retry_count", "3", "rail_error_threshold", "1",
                          "rail_cooldown", "2s", "rail_probe_interval", "200ms", NULL};
    size_t n = 12;
    if (replays != NULL) {
        kv[n++] = "read_replays";
        kv[n++] = replays;
    }
    /* ORBITE_TEST_PROGRESS: the progress mode of engines the cell does not choose one for (the
     * source processes inherit it). The suite's waiting cell sleeps on events, so that its idle
     * lanes take no CPU from the test beside it. */
    if (progress == NULL)
        progress = getenv("ORBITE_TEST_PROGRESS");
    if (progress != NULL) {
        kv[n++] = "progress_mode";
        kv[n++] = progress;
    }
    orb_rdma_config *rdma = NULL;
    assert_int_equal(orb_rdma_config_new(&rdma), 0);
    for (size_t i = 0; kv[i] != NULL; i += 2)
        if (orb_rdma_config_set(rdma, kv[i], kv[i + 1]) != 0)
            fail_msg("%s = %s: %s", kv[i], kv[i + 1], orb_last_error());
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.helper_mode = ORB_HELPER_OFF;
    cfg.enable_source = source;
    cfg.io_timeout_s = IO_TIMEOUT_S;
    if (endpoint != NULL)
        snprintf(cfg.endpoint, sizeof cfg.endpoint, "%s", endpoint);
    struct orb_engine_params p = {.field_mask = ORB_ENGINE_PARAM_CONFIG | ORB_ENGINE_PARAM_RDMA, .config = &cfg,
                                  .rdma = rdma};
    orb_engine *e = NULL;
    if (orb_engine_create_params(&p, &e) != 0)
        fail_msg("engine on %s: %s", nics, orb_last_error());
    orb_rdma_config_free(rdma);
    return e;
}

/* ---- the source process ---------------------------------------------------------------------- */

struct hello {
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    uint64_t base;
};

/* `arm`: NULL (the interposer only counts the source's memory windows), or "ack-qp-error:N":
 * the queue pair that posts the source's Nth SEND (an ACK) goes to the error state first. */
static _Noreturn void source_main(int to_parent, int from_parent, const char *endpoint, const char *arm)
{
    if (itp_install() != 0)
        _exit(7);
    if (arm != NULL && strncmp(arm, "ack-qp-error:", 13) == 0)
        itp_arm(ITP_POST_SEND, strtoull(arm + 13, NULL, 10), 0, IBV_WR_SEND, ITP_QP_TO_ERROR);
    orb_engine *e = engine_on(RDMA_TEST_SOURCE_NICS, 1, endpoint, NULL, NULL);
    orb_host_memory *mem = NULL;
    orb_reg_id id;
    if (orb_host_memory_alloc(AREA, 0, &mem) != 0 ||
        orb_register_host_memory(e, mem, 0, AREA, ORB_PERM_REMOTE_WRITE, &id) != 0)
        _exit(2);
    uint8_t *bytes = orb_host_memory_data(mem);
    for (uint64_t i = 0; i < AREA; i++)
        bytes[i] = pattern(i, 0);
    struct hello h;
    memset(&h, 0, sizeof h);
    if (orb_engine_endpoint(e, h.endpoint, sizeof h.endpoint) != 0 || orb_engine_source_epoch(e, &h.epoch) != 0)
        _exit(3);
    h.base = (uint64_t)(uintptr_t)bytes;
    if (write(to_parent, &h, sizeof h) != (ssize_t)sizeof h)
        _exit(4);
    uint8_t cmd = 0;
    while (read(from_parent, &cmd, 1) == 1 && cmd != 'q') {
        uint64_t failures = itp_failures(ITP_POST_SEND);
        if (cmd == 'f' && write(to_parent, &failures, sizeof failures) != (ssize_t)sizeof failures)
            _exit(4);
    }
    int rc = orb_engine_close(e, TIMEOUT_NS);
    orb_engine_free(e);
    orb_host_memory_unref(mem);
    if (rc != 0)
        _exit(5);
    /* A window its grants bound and did not give back: 6 (source_stop fails on it). */
    _exit(itp_live_mws() == 0 ? 0 : 6);
}

/* ---- the requester ----------------------------------------------------------------------------- */

/* A source process and the pipes to it. */
struct source {
    pid_t pid;
    int to, from;
    struct hello h;
};

/* Start a source process listening on `endpoint` ("127.0.0.1:0": any port), its interposer
 * armed with `arm` (source_main; NULL: nothing), and read its hello. */
static void source_spawn_armed(struct source *sp, const char *endpoint, const char *arm)
{
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    fflush(NULL);
    sp->pid = fork();
    assert_true(sp->pid >= 0);
    if (sp->pid == 0) {
        /* A fresh process image: nothing of this one's engines or locks comes along. */
        close(up[0]);
        close(down[1]);
        char a[16], b[16];
        snprintf(a, sizeof a, "%d", up[1]);
        snprintf(b, sizeof b, "%d", down[0]);
        execl("/proc/self/exe", "test_rdma_faults_device", "--source", a, b, endpoint, arm, (char *)NULL);
        _exit(127);
    }
    close(up[1]);
    close(down[0]);
    sp->from = up[0];
    sp->to = down[1];
    assert_int_equal(read(sp->from, &sp->h, sizeof sp->h), (ssize_t)sizeof sp->h);
}

static void source_spawn(struct source *sp, const char *endpoint)
{
    source_spawn_armed(sp, endpoint, NULL);
}

/* How many posts its armed interposer made fail so far. */
static uint64_t source_failures(struct source *sp)
{
    uint8_t q = 'f';
    uint64_t n = 0;
    assert_int_equal(write(sp->to, &q, 1), 1);
    assert_int_equal(read(sp->from, &n, sizeof n), (ssize_t)sizeof n);
    return n;
}

/* Ask it to close and wait for its exit: 0 when it closed quiescent with every memory window
 * it allocated deallocated. */
static void source_stop(struct source *sp)
{
    uint8_t q = 'q';
    assert_int_equal(write(sp->to, &q, 1), 1);
    int status = 0;
    assert_int_equal(waitpid(sp->pid, &status, 0), sp->pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(sp->to);
    close(sp->from);
}

/* Kill it outright and reap it. */
static void source_kill(struct source *sp)
{
    assert_int_equal(kill(sp->pid, SIGKILL), 0);
    int status = 0;
    assert_int_equal(waitpid(sp->pid, &status, 0), sp->pid);
    assert_true(WIFSIGNALED(status));
    close(sp->to);
    close(sp->from);
}

/* What a cell opened beyond the fixture: a segment of the fixture's engine and the source
 * process behind it. A cell that fails returns before it closes them, and a connection left open
 * would keep queue pairs (and through them replaced completion queues) in the footprints of the
 * cells after it; cell_teardown() kills and closes what is still held. */
static struct {
    orb_segment *seg;
    struct source src; /* a copy: the cell's own is gone with its frame */
    bool has_src;
} held;

static void hold_for_the_cell(orb_segment *sg, const struct source *sp)
{
    held.seg = sg;
    held.has_src = sp != NULL;
    if (sp != NULL)
        held.src = *sp;
}

static void release_from_the_cell(void)
{
    held.seg = NULL;
    held.has_src = false;
}

static int cell_teardown(void **state)
{
    (void)state;
    if (held.has_src) { /* first, so that closing the segment finds a dead peer, not a slow one */
        (void)kill(held.src.pid, SIGKILL);
        (void)waitpid(held.src.pid, NULL, 0);
        close(held.src.to);
        close(held.src.from);
    }
    if (held.seg != NULL)
        orb_segment_close(held.seg);
    release_from_the_cell();
    itp_hold_send_completions(0, 0); /* a cell that failed with completions held back */
    return 0;
}

static orb_engine *req;
static orb_host_memory *req_mem;
static orb_reg_id req_id;
static uint8_t *local;
static orb_segment *seg;
static struct hello peer;
static struct source main_source;
/* A fresh source's bytes (pattern seed 0) over the whole area: built once, for every cell. */
static uint8_t *source_bytes;

static int setup(void **state)
{
    (void)state;
    if (!rdma_test_present(RDMA_TEST_REQUESTER_NICS) || !rdma_test_present(RDMA_TEST_SOURCE_NICS) || geteuid() != 0) {
        if (getenv("ORBITE_VM_TOPOLOGY") != NULL && strcmp(getenv("ORBITE_VM_TOPOLOGY"), "rails") == 0)
            fail_msg("the rails topology lacks its rxe devices, or this is not root");
        printf("skipped: the devices %s and %s are not all here, or this is not root (the VM's rails topology "
               "has them)\n", RDMA_TEST_REQUESTER_NICS, RDMA_TEST_SOURCE_NICS);
        exit(77);
    }
    source_spawn(&main_source, "127.0.0.1:0");
    peer = main_source.h;
    req = engine_on(RDMA_TEST_REQUESTER_NICS, 0, NULL, NULL, NULL);
    assert_int_equal(orb_host_memory_alloc(AREA, 0, &req_mem), 0);
    local = orb_host_memory_data(req_mem);
    assert_int_equal(orb_register_host_memory(req, req_mem, 0, AREA, ORB_PERM_LOCAL, &req_id), 0);
    source_bytes = malloc(AREA);
    assert_non_null(source_bytes);
    for (uint64_t i = 0; i < AREA; i++)
        source_bytes[i] = pattern(i, 0);
    if (orb_open_segment(req, peer.endpoint, &peer.epoch, TIMEOUT_NS, &seg) != 0)
        fail_msg("open_segment: %s", orb_last_error());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    orb_segment_close(seg);
    assert_int_equal(orb_unregister_memory(req, req_id), 0);
    if (orb_engine_close(req, TIMEOUT_NS) != 0)
        fail_msg("closing the requester: %s", orb_last_error());
    orb_engine_free(req);
    orb_host_memory_unref(req_mem);
    free(source_bytes);
    source_stop(&main_source);
    return 0;
}

/* The first line of sysfs file `path` into `out`, without its newline; whether it had one. */
static bool sysfs_line(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    bool got = fgets(out, (int)cap, f) != NULL;
    fclose(f);
    if (got)
        out[strcspn(out, "\n")] = '\0';
    return got && out[0] != '\0';
}

/* The network device under an rxe device, into `out`: its `parent`, else the device of the first
 * GID of port 1 that names one. Not GID 1's alone: test_the_address_of_a_rail_changes moves the
 * port's IPv4 GID to another index, and a second run of the cells (the suite's retry) in the same
 * boot must still find the device. */
static void netdev_of(const char *ibdev, char *out, size_t cap)
{
    char path[256];
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/parent", ibdev);
    if (sysfs_line(path, out, cap))
        return;
    for (int i = 0; i < 16; i++) {
        snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/%d", ibdev, i);
        if (sysfs_line(path, out, cap))
            return;
    }
    fail_msg("%s: no network device found under it (parent, gid_attrs/ndevs/0..15)", ibdev);
}

static void link_set(const char *netdev, const char *state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip link set dev %s %s", netdev, state);
    if (system(cmd) != 0)
        fail_msg("%s failed", cmd);
}

static void loads_of(orb_engine *e, struct orb_rdma_nic_load out[2])
{
    size_t n = 0;
    assert_int_equal(orb_engine_rdma_nic_load(e, out, 2, &n), 0);
    assert_int_equal(n, 2);
}

static void loads(struct orb_rdma_nic_load out[2])
{
    loads_of(req, out);
}

/* The traffic: WRITE a chunk of a fresh pattern, READ it back and compare, over and over, at a
 * rotating place of the remote area. Every failure's report is checked as it comes. */
struct traffic {
    orb_engine *e;                 /* the requester */
    orb_segment *seg;              /* to this source */
    bool closing;                  /* ORB_ECLOSED is a failure it may see */
    uint32_t first_chunk, nchunks; /* the remote chunks it uses (nchunks 0: all of AREA) */
    uint64_t base;                 /* its area */
    uint8_t *area;                 /* the local bytes it uses: CHUNK + 2 * GUARD */
    atomic_int stop;
    atomic_uint_fast64_t ok, failed, corrupt, slow, failed_requests;
    uint64_t first_failure_ns, last_failure_ns;
    uint64_t longest_ns;
    int bad_report;
    char bad[256];
};

__attribute__((format(printf, 2, 3))) static void note_bad(struct traffic *t, const char *fmt, ...)
{
    if (t->bad_report)
        return;
    t->bad_report = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->bad, sizeof t->bad, fmt, ap);
    va_end(ap);
}

/* A request of CHUNK bytes between the local bytes at `local_at` and the remote address `remote`. */
static struct orb_request chunk_request(enum orb_op op, const uint8_t *local_at, uint64_t remote)
{
    struct orb_request r;
    memset(&r, 0, sizeof r);
    r.transport = ORB_TRANSPORT_RDMA;
    r.op = op;
    r.local_addr = (uint64_t)(uintptr_t)local_at;
    r.remote_addr = remote;
    r.length = CHUNK;
    return r;
}

/* Traffic of requester `e` on segment `s` to the source area at `base`, through the local bytes
 * at `area` (CHUNK + 2 * GUARD of them). */
static void traffic_init(struct traffic *t, orb_engine *e, orb_segment *s, uint64_t base, uint8_t *area)
{
    memset(t, 0, sizeof *t);
    t->e = e;
    t->seg = s;
    t->base = base;
    t->area = area;
}

/* One request; 0 or its status; the report checked against what a failure may look like. */
static int one(struct traffic *t, enum orb_op op, uint64_t remote_off, uint64_t local_off)
{
    struct orb_request r = chunk_request(op, t->area + local_off, t->base + remote_off);
    struct orb_batch_report rep;
    uint64_t t0 = now_ns();
    int rc = orb_submit_and_wait(t->e, t->seg, &r, 1, NULL, TIMEOUT_NS, &rep);
    uint64_t took = now_ns() - t0;
    if (took > t->longest_ns)
        t->longest_ns = took;
    /* Each wait is bounded by io_timeout_s (the ACK's) and, for a rebuild, the drain before it. */
    if (took > (2ull * IO_TIMEOUT_S + 1) * 1000000000ull)
        atomic_fetch_add(&t->slow, 1);
    if (rc == 0) {
        if (rep.status != 0 || rep.completed_requests != 1 || rep.has_failure)
            note_bad(t, "a success reported status %d, %zu completed, failure %d", rep.status, rep.completed_requests,
                     rep.has_failure);
        return 0;
    }
    /* Refused before it was accepted (a closed engine, a lost control connection), nothing of
     * it was attempted: the span may be empty. */
    size_t span_min = rep.submitted_requests == 0 ? 0 : 1;
    /* A batch the engine refused to make (it is closed) has no failure block at all. */
    bool no_batch = rep.done && rep.status == rc && rep.submitted_requests == 0 && !rep.has_failure;
    if (!no_batch && (!rep.done || rep.status != rc || !rep.has_failure || rep.failure.request_index != 0 ||
        rep.failure.affected_requests < span_min || rep.failure.affected_requests > 1 || rep.failure.status != rc ||
        rep.completed_requests != 0))
        note_bad(t, "a failure (%s) reported done %d status %d index %zu span %zu completed %zu", orb_strerror(rc),
                 rep.done, rep.status, rep.failure.request_index, rep.failure.affected_requests,
                 rep.completed_requests);
    if (rc != ORB_EPEER && rc != ORB_ETIMEDOUT && rc != ORB_EUNAVAILABLE && !(t->closing && rc == ORB_ECLOSED))
        note_bad(t, "a request failed with %s: %s", orb_strerror(rc), orb_last_error());
    if (atomic_fetch_add(&t->failed_requests, 1) == 0)
        t->first_failure_ns = now_ns();
    t->last_failure_ns = now_ns();
    if (op == ORB_OP_READ && rep.failure.remote_effect != ORB_REMOTE_EFFECT_NONE)
        note_bad(t, "a failed READ reports a remote effect");
    return rc;
}

static void *traffic_main(void *arg)
{
    struct traffic *t = arg;
    uint64_t round = 0;
    /* Local layout: [guard][target][guard]; the guards keep pattern 0xee throughout. */
    uint8_t *guard = t->area, *target = t->area + GUARD;
    memset(guard, 0xee, CHUNK + 2 * GUARD);
    while (!atomic_load(&t->stop)) {
        uint32_t seed = (uint32_t)++round;
        uint32_t nchunks = t->nchunks != 0 ? t->nchunks : AREA / CHUNK;
        uint64_t remote_off = (t->first_chunk + round % nchunks) * (uint64_t)CHUNK;
        for (uint64_t i = 0; i < CHUNK; i++)
            target[i] = pattern(i, seed);
        int rc = one(t, ORB_OP_WRITE, remote_off, GUARD);
        if (rc == 0) {
            memset(target, 0, CHUNK);
            rc = one(t, ORB_OP_READ, remote_off, GUARD);
            if (rc == 0) {
                for (uint64_t i = 0; i < CHUNK; i++)
                    if (target[i] != pattern(i, seed)) {
                        atomic_fetch_add(&t->corrupt, 1);
                        note_bad(t, "round %llu: byte %llu read back differs", (unsigned long long)round,
                                 (unsigned long long)i);
                        break;
                    }
            }
        }
        atomic_fetch_add(rc == 0 ? &t->ok : &t->failed, 1);
        for (uint32_t i = 0; i < GUARD; i++)
            if (guard[i] != 0xee || guard[GUARD + CHUNK + i] != 0xee) {
                note_bad(t, "round %llu: a byte outside the request changed", (unsigned long long)round);
                break;
            }
    }
    return NULL;
}

/* Checks made while traffic runs: the first one that fails is kept, and reported once the
 * traffic is stopped (an assertion's jump would leave its thread running). */
static char checks_failed[256];
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond) && checks_failed[0] == '\0')                                                   \
            snprintf(checks_failed, sizeof checks_failed, "line %d: %s", __LINE__, #cond);          \
    } while (0)

/* What this process holds: descriptors, resident memory, and the verbs objects the kernel
 * lists for it (`rdma resource show`; -1 where that cannot be read). */
struct footprint {
    long fds, rss_kib, qps, cqs, mrs, pds;
};

static long count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    long n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = -1;
    if (f != NULL) {
        if (fscanf(f, "%ld %ld", &size, &resident) != 2)
            resident = -1;
        fclose(f);
    }
    return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Lines of `rdma resource show KIND` that name one of this process's threads ("pid N" is the
 * thread that made the object: a lane or grant thread for queue pairs rebuilt there). */
static long rdma_objects(const char *kind)
{
    long tids[256];
    size_t ntids = 0;
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL && ntids < 256;)
        if (e->d_name[0] != '.')
            tids[ntids++] = strtol(e->d_name, NULL, 10);
    closedir(d);
    char cmd[96], line[512];
    snprintf(cmd, sizeof cmd, "rdma resource show %s 2>/dev/null", kind);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    long n = 0;
    while (fgets(line, sizeof line, p) != NULL) {
        const char *at = strstr(line, " pid ");
        long pid = at != NULL ? strtol(at + 5, NULL, 10) : -1;
        for (size_t i = 0; i < ntids; i++)
            if (tids[i] == pid) {
                n++;
                break;
            }
    }
    return pclose(p) == 0 ? n : -1;
}

static struct footprint footprint(void)
{
    return (struct footprint){.fds = count_fds(), .rss_kib = rss_kib(), .qps = rdma_objects("qp"),
                              .cqs = rdma_objects("cq"), .mrs = rdma_objects("mr"), .pds = rdma_objects("pd")};
}

/* Whether `now` holds no more than `base`: the same descriptors and verbs objects, resident
 * memory within 32 MiB (allocator caches); into `why` what differs. */
static bool footprint_back(const struct footprint *base, const struct footprint *now, char *why, size_t cap)
{
    snprintf(why, cap, "fds %ld -> %ld, rss %ld -> %ld KiB, qps %ld -> %ld, cqs %ld -> %ld, mrs %ld -> %ld, pds %ld -> %ld",
             base->fds, now->fds, base->rss_kib, now->rss_kib, base->qps, now->qps, base->cqs, now->cqs, base->mrs,
             now->mrs, base->pds, now->pds);
    return now->fds == base->fds && now->rss_kib <= base->rss_kib + 32 * 1024 && now->qps == base->qps &&
           now->cqs == base->cqs && now->mrs == base->mrs && now->pds == base->pds;
}

/* Poll every 20 ms until `cond` holds or `limit_ms` passed; the time it took in ms, or -1. */
#define WAIT_FOR(cond, limit_ms)                                                                   \
    ({                                                                                             \
        uint64_t t0_ = now_ns();                                                                   \
        long took_ = -1;                                                                           \
        while (now_ns() - t0_ < (uint64_t)(limit_ms) * 1000000ull) {                               \
            if (cond) {                                                                            \
                took_ = (long)((now_ns() - t0_) / 1000000ull);                                     \
                break;                                                                             \
            }                                                                                      \
            sleep_ms(20);                                                                          \
        }                                                                                          \
        took_;                                                                                     \
    })

/* A traffic cell's verdict once its traffic stopped: every failure's report as it may be, every
 * check made meanwhile held, no byte wrong, no wait past its bound. */
static void traffic_verdict(const struct traffic *t)
{
    if (t->bad_report)
        fail_msg("%s", t->bad);
    if (checks_failed[0] != '\0')
        fail_msg("%s", checks_failed);
    assert_int_equal(atomic_load(&t->corrupt), 0);
    assert_int_equal(atomic_load(&t->slow), 0);
}

/* The cell's end: within 3 s this process holds no more than `before` (released links are freed
 * by a lane); else the cell fails, `what` saying what was left. */
static void footprint_returns(const struct footprint *before, const char *what)
{
    char why[320];
    struct footprint after;
    if (WAIT_FOR((after = footprint(), footprint_back(before, &after, why, sizeof why)), 3000) < 0)
        fail_msg("%s: %s", what, why);
    print_message("footprint back: %s\n", why);
}

static void test_a_port_down_under_a_two_rail_transfer(void **state)
{
    (void)state;
    checks_failed[0] = '\0';
    char requester_nics[128], rail1_dev[64], netdev[64];
    snprintf(requester_nics, sizeof requester_nics, "%s", RDMA_TEST_REQUESTER_NICS);
    char *comma = strchr(requester_nics, ',');
    assert_non_null(comma);
    snprintf(rail1_dev, sizeof rail1_dev, "%s", comma + 1);
    netdev_of(rail1_dev, netdev, sizeof netdev);

    struct footprint before = footprint();
    struct traffic t;
    traffic_init(&t, req, seg, peer.base, local);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, traffic_main, &t), 0);
    struct orb_rdma_nic_load l[2];
    /* Both rails carry it first. */
    long took = WAIT_FOR((loads(l), l[0].completed_bytes > 0 && l[1].completed_bytes > 0), 10000);
    CHECK(took >= 0);

    link_set(netdev, "down");
    uint64_t down_at = now_ns();
    long detected = WAIT_FOR(stats_of(req).routes_down >= 1, 3000);
    print_message("port of %s (%s) down: the monitor fenced rail 1 after %ld ms\n", rail1_dev, netdev, detected);
    CHECK(detected >= 0 && detected <= 2000);
    sleep_ms(500); /* what was in flight on rail 1 has failed by now */
    loads(l);
    uint64_t rail0 = l[0].completed_bytes, rail1 = l[1].completed_bytes;
    uint64_t ok_down = atomic_load(&t.ok);
    sleep_ms(7000); /* past io_timeout_s and the source's grace: a grant the failure left at the source has expired */
    loads(l);
    struct orb_rdma_stats s = stats_of(req);
    print_message("while down: %llu more round(s) ok, rail 0 +%llu bytes, rail 1 +%llu bytes; rail errors %llu, "
                  "open pairs %llu, %llu failed round(s) so far\n",
                  (unsigned long long)(atomic_load(&t.ok) - ok_down), (unsigned long long)(l[0].completed_bytes - rail0),
                  (unsigned long long)(l[1].completed_bytes - rail1), (unsigned long long)s.rail_errors,
                  (unsigned long long)s.rail_open_pairs, (unsigned long long)atomic_load(&t.failed));
    /* Only what was in flight on rail 1 when its port went down failed (the traffic runs one
     * request at a time), also after the grant that failure left at the source would have
     * expired; the other rail carries the rest; the fenced one carries nothing. */
    CHECK(atomic_load(&t.failed) <= 2);
    CHECK(atomic_load(&t.ok) > ok_down);
    CHECK(l[0].completed_bytes > rail0);
    CHECK((l[1].completed_bytes) == (rail1));
    CHECK((l[1].port_active) == (0));
    CHECK((l[1].healthy) == (0));
    /* The failure on rail 1 paused its pair (threshold 1), charged to the rail's NIC. */
    CHECK(s.rail_errors >= 1 && s.rail_open_pairs == 1);
    CHECK(l[1].rail_errors >= 1 && l[1].rail_open_pairs == 1 && l[0].rail_open_pairs == 0);

    link_set(netdev, "up");
    uint64_t up_at = now_ns();
    long back = WAIT_FOR((loads(l), l[1].port_active && l[1].completed_bytes > rail1 && stats_of(req).rail_recoveries >= 1),
                         20000);
    s = stats_of(req);
    print_message("port up: rail 1 carried traffic again after %ld ms (route recoveries %llu, probes %llu, "
                  "rail recoveries %llu, reconnects %llu; down for %llu ms)\n",
                  back, (unsigned long long)s.route_recoveries, (unsigned long long)s.rail_probes,
                  (unsigned long long)s.rail_recoveries, (unsigned long long)s.reconnects,
                  (unsigned long long)((up_at - down_at) / 1000000ull));
    CHECK(back >= 0);
    /* The monitor opened the route, and the pair's half-open trial brought it back. */
    CHECK(s.route_recoveries >= 1);
    CHECK(s.rail_probes >= 1 && s.rail_recoveries >= 1 && s.rail_open_pairs == 0);
    sleep_ms(500);
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    print_message("%llu round(s) ok, %llu failed, longest wait %llu ms\n", (unsigned long long)atomic_load(&t.ok),
                  (unsigned long long)atomic_load(&t.failed), (unsigned long long)(t.longest_ns / 1000000ull));
    traffic_verdict(&t);
    s = stats_of(req);
    assert_int_equal(s.routes_down, 0);
    assert_true(s.monitor_ticks >= 4);
    /* The connection was rebuilt, as wide as before: nothing more is held than before. */
    footprint_returns(&before, "the rebuilt connection holds more than the first");
}

/* The requester's rail 1: its device and network device. */
static void rail1_of(char *dev, size_t dev_cap, char *netdev, size_t net_cap)
{
    const char *comma = strchr(RDMA_TEST_REQUESTER_NICS, ',');
    assert_non_null(comma);
    snprintf(dev, dev_cap, "%s", comma + 1);
    netdev_of(dev, netdev, net_cap);
}

/* A rail-1 cell's start: no failed check yet, rail 1's devices, and what this process holds. */
struct cell {
    char dev[64], netdev[64];
    struct footprint before;
};

static void cell_begin(struct cell *cell)
{
    checks_failed[0] = '\0';
    rail1_of(cell->dev, sizeof cell->dev, cell->netdev, sizeof cell->netdev);
    cell->before = footprint();
}

/* READs of half an area (`half` 0 or 1) into the same half of `local`, batch after batch, each
 * checked byte for byte against the source's pattern (a fresh source's memory, which nothing
 * writes). Two of them keep both rails busy while the other checks its bytes. */
struct reader {
    orb_segment *seg;
    uint64_t base;
    uint32_t half;
    atomic_int *stop;
    atomic_uint_fast64_t batches, failed, corrupt;
    char why[320];                 /* the first failure */
};


static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    enum { N = AREA / CHUNK / 2 };
    uint64_t at = (uint64_t)rd->half * N * CHUNK;
    struct orb_request r[N];
    for (uint32_t i = 0; i < N; i++)
        r[i] = chunk_request(ORB_OP_READ, local + at + (uint64_t)i * CHUNK, rd->base + at + (uint64_t)i * CHUNK);
    while (!atomic_load(rd->stop)) {
        memset(local + at, 0, (size_t)N * CHUNK);
        struct orb_batch_report rep;
        int rc = orb_submit_and_wait(req, rd->seg, r, N, NULL, TIMEOUT_NS, &rep);
        if (rc != 0) {
            if (atomic_fetch_add(&rd->failed, 1) == 0)
                snprintf(rd->why, sizeof rd->why, "%s at request %zu of %u, effect %d: %s", orb_strerror(rc),
                         rep.failure.request_index, N, rep.failure.remote_effect, orb_last_error());
            continue;
        }
        if (memcmp(local + at, source_bytes + at, (size_t)N * CHUNK) != 0)
            atomic_fetch_add(&rd->corrupt, 1);
        atomic_fetch_add(&rd->batches, 1);
    }
    return NULL;
}

/* Two readers, one per half of the area, on segment `sg` to the source at `base`. */
struct readers {
    struct reader rd[2];
    pthread_t th[2];
    atomic_int stop;
};

static void readers_start(struct readers *rs, orb_segment *sg, uint64_t base)
{
    memset(rs, 0, sizeof *rs);
    for (uint32_t k = 0; k < 2; k++) {
        rs->rd[k] = (struct reader){.seg = sg, .base = base, .half = k, .stop = &rs->stop};
        assert_int_equal(pthread_create(&rs->th[k], NULL, reader_main, &rs->rd[k]), 0);
    }
}

static uint64_t readers_batches(struct readers *rs)
{
    return atomic_load(&rs->rd[0].batches) + atomic_load(&rs->rd[1].batches);
}

/* Stop and join them; fail the cell if a batch failed or a byte differed. `what` (printed with
 * the counts) says what happened meanwhile. */
static void readers_stop(struct readers *rs, const char *what)
{
    atomic_store(&rs->stop, 1);
    for (uint32_t k = 0; k < 2; k++)
        pthread_join(rs->th[k], NULL);
    uint64_t failed = atomic_load(&rs->rd[0].failed) + atomic_load(&rs->rd[1].failed);
    uint64_t corrupt = atomic_load(&rs->rd[0].corrupt) + atomic_load(&rs->rd[1].corrupt);
    print_message("%llu batch(es) of %u READs ok, %llu failed, %llu corrupt; %s\n", (unsigned long long)readers_batches(rs),
                  AREA / CHUNK / 2, (unsigned long long)failed, (unsigned long long)corrupt, what);
    if (failed != 0)
        fail_msg("a batch of READs failed: %s", rs->rd[0].failed != 0 ? rs->rd[0].why : rs->rd[1].why);
    assert_int_equal(corrupt, 0);
}

/* What the requester's stats say of a cell's READ batches. */
static void replays_since(const struct orb_rdma_stats *s0, char *out, size_t cap)
{
    struct orb_rdma_stats s = stats_of(req);
    snprintf(out, cap, "%llu READ(s) asked again, %llu rail error(s), %llu reconnect(s)",
             (unsigned long long)(s.read_replays - s0->read_replays),
             (unsigned long long)(s.rail_errors - s0->rail_errors), (unsigned long long)(s.reconnects - s0->reconnects));
}

/* A port down under batches of READs spread over both rails: the READs its rail was carrying are
 * asked again (read_replays) and the other rail carries them, so that no batch fails and every
 * byte arrives; once the port is up the rail carries READs again. */
static void test_reads_replay_on_the_other_rail(void **state)
{
    (void)state;
    struct cell cell;
    cell_begin(&cell);
    struct source b;
    source_spawn(&b, "127.0.0.1:0");
    orb_segment *sb = NULL;
    if (orb_open_segment(req, b.h.endpoint, &b.h.epoch, TIMEOUT_NS, &sb) != 0)
        fail_msg("open_segment: %s", orb_last_error());
    hold_for_the_cell(sb, &b);
    struct orb_rdma_stats s0 = stats_of(req);
    struct orb_rdma_nic_load l[2];
    loads(l);
    uint64_t rail1_start = l[1].completed_bytes;
    struct readers rs;
    readers_start(&rs, sb, b.h.base);
    CHECK(WAIT_FOR((loads(l), l[1].completed_bytes > rail1_start && readers_batches(&rs) >= 2), 10000) >= 0);

    /* The port goes down until that caught READs in flight on its rail (their replays show it),
     * at most three times: between two batches its rail may carry nothing. */
    long replayed = -1;
    for (uint32_t cycle = 1; cycle <= 3 && replayed < 0; cycle++) {
        link_set(cell.netdev, "down");
        replayed = WAIT_FOR(stats_of(req).read_replays > s0.read_replays, 3000);
        print_message("port of %s (%s) down under READ batches (%u): the first READ was asked again after %ld ms\n",
                      cell.dev, cell.netdev, cycle, replayed);
        sleep_ms(1500); /* the replays are through */
        uint64_t batches_down = readers_batches(&rs);
        loads(l);
        uint64_t rail0 = l[0].completed_bytes, rail1 = l[1].completed_bytes;
        sleep_ms(1500);
        loads(l);
        /* The other rail carries every READ meanwhile; the fenced one nothing. */
        CHECK(readers_batches(&rs) > batches_down);
        CHECK(l[0].completed_bytes > rail0);
        CHECK(l[1].completed_bytes == rail1);
        link_set(cell.netdev, "up");
        long back = WAIT_FOR((loads(l), l[1].port_active && l[1].completed_bytes > rail1), 20000);
        print_message("port up: rail 1 carried READs again after %ld ms\n", back);
        CHECK(back >= 0);
    }
    CHECK(replayed >= 0);
    char what[160];
    replays_since(&s0, what, sizeof what);
    readers_stop(&rs, what);
    if (checks_failed[0] != '\0')
        fail_msg("%s", checks_failed);
    /* The path failure counted against the rail, as without replays. */
    assert_true(stats_of(req).rail_errors > s0.rail_errors);
    release_from_the_cell();
    orb_segment_close(sb);
    source_stop(&b);
    footprint_returns(&cell.before, "the requester kept something of the connection");
}

/* A queue pair of the source dies under READ batches on both rails (made to by the source's
 * interposer, right before it posts an ACK), while the requester's end of it is still alive:
 * only that queue pair is lost at the source. The ACK goes on another queue pair, the grants
 * asked for on the dead one are refused naming it and given other rails, the READs it was
 * carrying are asked again, the connection is rebuilt, and no batch fails. */
static void test_a_source_queue_pair_dies(void **state)
{
    (void)state;
    struct cell cell;
    cell_begin(&cell);
    struct source b;
    source_spawn_armed(&b, "127.0.0.1:0", "ack-qp-error:40");
    orb_segment *sb = NULL;
    if (orb_open_segment(req, b.h.endpoint, &b.h.epoch, TIMEOUT_NS, &sb) != 0)
        fail_msg("open_segment: %s", orb_last_error());
    hold_for_the_cell(sb, &b);
    struct orb_rdma_stats s0 = stats_of(req);
    struct readers rs;
    readers_start(&rs, sb, b.h.base);
    long died = WAIT_FOR(source_failures(&b) == 1, 20000);
    print_message("the source's queue pair went to the error state after %ld ms\n", died);
    CHECK(died >= 0);
    /* Both rails carry READs again once the connection is rebuilt. */
    struct orb_rdma_nic_load l[2];
    loads(l);
    uint64_t rail0 = l[0].completed_bytes, rail1 = l[1].completed_bytes;
    long back = WAIT_FOR((loads(l), stats_of(req).reconnects > s0.reconnects && l[0].completed_bytes > rail0 &&
                          l[1].completed_bytes > rail1),
                         20000);
    print_message("the connection was rebuilt and both rails carried READs again after %ld ms more\n", back);
    CHECK(back >= 0);
    sleep_ms(1000);
    char what[160];
    replays_since(&s0, what, sizeof what);
    readers_stop(&rs, what);
    if (checks_failed[0] != '\0')
        fail_msg("%s", checks_failed);
    assert_int_equal(source_failures(&b), 1);
    release_from_the_cell();
    orb_segment_close(sb);
    source_stop(&b);
    footprint_returns(&cell.before, "the requester kept something of the connection");
}

/* The completion-queue cell on requester engine `e` (its queues those made after `cq_mark`, its
 * segment `sg` to the source at `base`, its local memory `area`). */
static void completion_queue_error_on(orb_engine *e, uint64_t cq_mark, orb_segment *sg, uint64_t base,
                                      uint8_t *area, const struct cell *cell)
{
    struct orb_rdma_stats s0 = stats_of(e);
    struct orb_rdma_nic_load l[2];
    loads_of(e, l);
    uint64_t rail1_start = l[1].completed_bytes;
    struct traffic t;
    traffic_init(&t, e, sg, base, area);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, traffic_main, &t), 0);
    CHECK(WAIT_FOR((loads_of(e, l), l[1].completed_bytes > rail1_start), 10000) >= 0);
    uint32_t broken = itp_break_cqs_since(cell->dev, cq_mark);
    uint64_t t0 = now_ns();
    long fenced = WAIT_FOR(stats_of(e).routes_down >= 1, 3000);
    long replaced = WAIT_FOR(stats_of(e).progress_recoveries > s0.progress_recoveries, 10000);
    loads_of(e, l);
    uint64_t rail1 = l[1].completed_bytes;
    long back = WAIT_FOR((loads_of(e, l), stats_of(e).routes_down == 0 && l[1].completed_bytes > rail1), 15000);
    uint64_t took_ms = (now_ns() - t0) / 1000000ull;
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    struct orb_rdma_stats s = stats_of(e);
    print_message("%u completion queue(s) of %s reported an error: fenced after %ld ms, a lane's queues replaced after "
                  "%ld ms more, rail 1 carried traffic again %ld ms later (%llu ms in all); %llu lane(s) recovered, "
                  "%llu round(s) ok, %llu failed\n",
                  broken, cell->dev, fenced, replaced, back, (unsigned long long)took_ms,
                  (unsigned long long)(s.progress_recoveries - s0.progress_recoveries),
                  (unsigned long long)atomic_load(&t.ok), (unsigned long long)atomic_load(&t.failed));
    CHECK(broken >= 2); /* a pair per lane */
    CHECK(fenced >= 0);
    CHECK(replaced >= 0);
    CHECK(back >= 0);
    traffic_verdict(&t);
    /* The context stayed: its NICs, protection domains and memory regions. */
    assert_int_equal(s.nics_open, s0.nics_open);
    assert_int_equal(s.memory_regions, s0.memory_regions);
    assert_int_equal(s.routes_down, 0);
}

static void test_a_completion_queue_error(void **state)
{
    (void)state;
    struct cell cell;
    cell_begin(&cell);
    completion_queue_error_on(req, 0, seg, peer.base, local, &cell);
    /* New queues for old: once the old queue pairs are gone, so are the old queues. */
    footprint_returns(&cell.before, "the recovered lane holds more than before");
}

/* A requester engine of a cell's own (read_replays `replays`, NULL: the default), with its memory
 * and a segment to the source `h`. */
struct side {
    orb_engine *e;
    orb_host_memory *mem;
    orb_reg_id id;
    orb_segment *seg;
    struct traffic t;              /* its one-request helper's state */
};

static void side_up_with(struct side *sd, const struct hello *h, const char *replays, const char *progress)
{
    memset(sd, 0, sizeof *sd);
    sd->e = engine_on(RDMA_TEST_REQUESTER_NICS, 0, NULL, replays, progress);
    assert_int_equal(orb_host_memory_alloc(CHUNK + 2 * GUARD, 0, &sd->mem), 0);
    assert_int_equal(orb_register_host_memory(sd->e, sd->mem, 0, CHUNK + 2 * GUARD, ORB_PERM_LOCAL, &sd->id), 0);
    if (orb_open_segment(sd->e, h->endpoint, &h->epoch, TIMEOUT_NS, &sd->seg) != 0)
        fail_msg("open_segment: %s", orb_last_error());
    traffic_init(&sd->t, sd->e, sd->seg, h->base, orb_host_memory_data(sd->mem));
    memset(sd->t.area, 0xee, CHUNK + 2 * GUARD);
}

static void side_up(struct side *sd, const struct hello *h, const char *replays)
{
    side_up_with(sd, h, replays, NULL);
}

/* Its segment closed, its memory unregistered, the engine closed quiescent and freed. */
static void side_down(struct side *sd)
{
    orb_segment_close(sd->seg);
    assert_int_equal(orb_unregister_memory(sd->e, sd->id), 0);
    if (orb_engine_close(sd->e, TIMEOUT_NS) != 0)
        fail_msg("closing a cell's engine: %s", orb_last_error());
    orb_engine_free(sd->e);
    orb_host_memory_unref(sd->mem);
}

/* The completion-queue cell on an engine whose lanes wait on their completion channels
 * (progress_mode event_driven): the new queues are armed on the same channel, and the old
 * ones' events are acknowledged before they are destroyed (else destroying them would hang). */
static void test_a_completion_queue_error_event_driven(void **state)
{
    (void)state;
    struct cell cell;
    cell_begin(&cell);
    struct side sd;
    uint64_t mark = itp_cq_mark(); /* the fixture's engine keeps its queues */
    side_up_with(&sd, &peer, NULL, "event_driven");
    completion_queue_error_on(sd.e, mark, sd.seg, peer.base, sd.t.area, &cell);
    side_down(&sd);
    footprint_returns(&cell.before, "the event-driven engine kept something of the recovered lane");
}

/* A port down when the engine starts: the rail's context and protection domain are kept
 * (paused), Direct registrations still get their memory regions on it, requests go on the
 * other rail; once the port is up the rail carries requests too. */
static void test_a_port_down_at_start(void **state)
{
    (void)state;
    struct cell cell;
    cell_begin(&cell);
    link_set(cell.netdev, "down");
    uint64_t down_at = now_ns();
    struct side sd;
    side_up(&sd, &peer, NULL);
    orb_engine *e = sd.e;
    struct orb_rdma_stats s;
    assert_int_equal(orb_engine_rdma_stats(e, &s), 0);
    CHECK(s.rails == 2 && s.routes_down == 1);
    CHECK(s.memory_regions == 2); /* one on each NIC, the paused one's included */
    struct traffic *t = &sd.t;
    pthread_t th;
    bool running = pthread_create(&th, NULL, traffic_main, t) == 0;
    CHECK(running);
    struct orb_rdma_nic_load l[2];
    size_t n = 0;
    CHECK(WAIT_FOR(atomic_load(&t->ok) >= 3, 10000) >= 0);
    CHECK(orb_engine_rdma_nic_load(e, l, 2, &n) == 0 && n == 2);
    CHECK(l[0].completed_bytes > 0 && l[1].completed_bytes == 0 && l[1].port_active == 0);
    while (now_ns() - down_at < 5000000000ull)
        sleep_ms(50);
    link_set(cell.netdev, "up");
    long back = WAIT_FOR((orb_engine_rdma_nic_load(e, l, 2, &n) == 0 && l[1].completed_bytes > 0), 10000);
    print_message("a port down at start: rail 1 carried requests %ld ms after the port came up\n", back);
    CHECK(back >= 0);
    atomic_store(&t->stop, 1);
    if (running)
        pthread_join(th, NULL);
    assert_int_equal(orb_engine_rdma_stats(e, &s), 0);
    print_message("%llu round(s) ok, %llu failed; route recoveries %llu\n", (unsigned long long)atomic_load(&t->ok),
                  (unsigned long long)atomic_load(&t->failed), (unsigned long long)s.route_recoveries);
    CHECK(s.route_recoveries >= 1 && s.routes_down == 0);
    CHECK(atomic_load(&t->failed) == 0);
    side_down(&sd);
    if (t->bad_report)
        fail_msg("%s", t->bad);
    if (checks_failed[0] != '\0')
        fail_msg("%s", checks_failed);
    footprint_returns(&cell.before, "the engine left something behind");
}

/* Shell commands in order, up to the first that fails: NULL when all succeeded, else that one. */
static const char *run_all(const char *const *cmds)
{
    for (size_t i = 0; cmds[i] != NULL; i++)
        if (system(cmds[i]) != 0)
            return cmds[i];
    return NULL;
}

/* Shell commands in order, each whether or not it succeeds, quietly. */
static void run_each(const char *const *cmds)
{
    for (size_t i = 0; cmds[i] != NULL; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s 2>/dev/null", cmds[i]);
        (void)!system(cmd);
    }
}

/* The address cell's change `cmds` (run_all); should one fail, the cell's traffic thread `th`
 * stops (it must not run on into the next cells), each list of `undo` (NULL-terminated) runs
 * quietly, and the cell fails naming the command. */
static void change_address(const char *const *cmds, const char *const *const *undo, struct traffic *t, pthread_t th)
{
    const char *failed_cmd = run_all(cmds);
    if (failed_cmd == NULL)
        return;
    atomic_store(&t->stop, 1);
    pthread_join(th, NULL);
    for (size_t i = 0; undo[i] != NULL; i++)
        run_each(undo[i]);
    fail_msg("%s failed", failed_cmd);
}

/* The address under the requester's rail 1 is replaced mid-run (the rails topology's
 * 10.77.2.1 by 10.77.2.9, with the routes that reach it): the monitor fences the rail, takes
 * the new GID and opens it again; only what was in flight on it fails. Then back. */
static void test_the_address_of_a_rail_changes(void **state)
{
    (void)state;
    checks_failed[0] = '\0';
    char dev[64], netdev[64];
    rail1_of(dev, sizeof dev, netdev, sizeof netdev);
    if (strcmp(netdev, "va1") != 0) {
        print_message("skipped: rail 1 is on %s, not the rails topology's va1\n", netdev);
        return;
    }
    static const char *const to_new[] = {
        "ip rule add pref 20 iif lo from 10.77.2.9 to 10.77.2.2 lookup 100",
        "ip route add 10.77.2.9/32 dev vb1 table 103",
        "ip rule add pref 20 iif lo from 10.77.2.2 to 10.77.2.9 lookup 103",
        "ip neigh replace 10.77.2.9 lladdr $(cat /sys/class/net/va1/address) dev vb1 nud permanent",
        "ip addr add 10.77.2.9/32 dev va1", "ip addr del 10.77.2.1/32 dev va1", NULL};
    static const char *const to_old[] = {"ip addr add 10.77.2.1/32 dev va1", "ip addr del 10.77.2.9/32 dev va1", NULL};
    /* What to_new adds besides the address, cleared before the cell: an earlier run in the same
     * boot (the suite's first try) left it behind. (It stays after the cell: taken away right
     * after the return to the old address, the route's recovery did not come within 5 s in some
     * runs.) */
    static const char *const routes_gone[] = {"ip rule del pref 20 iif lo from 10.77.2.9 to 10.77.2.2 lookup 100",
                                              "ip rule del pref 20 iif lo from 10.77.2.2 to 10.77.2.9 lookup 103",
                                              "ip route del 10.77.2.9/32 dev vb1 table 103",
                                              "ip neigh del 10.77.2.9 dev vb1", NULL};
    run_each(routes_gone);
    struct traffic t;
    traffic_init(&t, req, seg, peer.base, local);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, traffic_main, &t), 0);
    struct orb_rdma_nic_load l[2];
    CHECK(WAIT_FOR(atomic_load(&t.ok) >= 3, 10000) >= 0);
    struct orb_rdma_stats s0 = stats_of(req);
    change_address(to_new, (const char *const *const[]){to_old, routes_gone, NULL}, &t, th);
    uint64_t changed_at = now_ns();
    long fenced = WAIT_FOR(stats_of(req).routes_down >= 1, 3000);
    long reopened = WAIT_FOR(stats_of(req).route_recoveries > s0.route_recoveries, 5000);
    loads(l);
    uint64_t rail1 = l[1].completed_bytes;
    long carried = WAIT_FOR((loads(l), l[1].completed_bytes > rail1), 10000);
    print_message("address changed: fenced after %ld ms, route open again %ld ms later, rail 1 carried requests "
                  "%ld ms after that (%llu ms in all)\n", fenced, reopened, carried,
                  (unsigned long long)((now_ns() - changed_at) / 1000000ull));
    CHECK(fenced >= 0 && reopened >= 0 && carried >= 0);
    uint64_t failed_new = atomic_load(&t.failed);
    change_address(to_old, (const char *const *const[]){to_old, NULL}, &t, th);
    s0 = stats_of(req);
    CHECK(WAIT_FOR(stats_of(req).route_recoveries > s0.route_recoveries, 5000) >= 0);
    loads(l);
    rail1 = l[1].completed_bytes;
    CHECK(WAIT_FOR((loads(l), l[1].completed_bytes > rail1), 10000) >= 0);
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    print_message("%llu round(s) ok, %llu failed (%llu at the first change)\n", (unsigned long long)atomic_load(&t.ok),
                  (unsigned long long)atomic_load(&t.failed), (unsigned long long)failed_new);
    CHECK(atomic_load(&t.failed) <= 4); /* at most what was in flight at each change */
    if (t.bad_report)
        fail_msg("%s", t.bad);
    if (checks_failed[0] != '\0')
        fail_msg("%s", checks_failed);
}

/* Local bytes [off, off + len) all `v`? */
static bool all_are(const uint8_t *p, uint64_t len, uint8_t v)
{
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != v)
            return false;
    return true;
}

static int read_one(orb_engine *e, orb_segment *s, uint8_t *dst, uint64_t remote, struct orb_batch_report *rep)
{
    struct orb_request r = chunk_request(ORB_OP_READ, dst, remote);
    return orb_submit_and_wait(e, s, &r, 1, NULL, TIMEOUT_NS, rep);
}

static void test_a_killed_source_and_its_successor(void **state)
{
    (void)state;
    struct footprint before = footprint();
    struct source b;
    source_spawn(&b, "127.0.0.1:0");
    orb_segment *sb = NULL;
    if (orb_open_segment(req, b.h.endpoint, &b.h.epoch, TIMEOUT_NS, &sb) != 0)
        fail_msg("open_segment: %s", orb_last_error());
    struct traffic t;
    traffic_init(&t, req, sb, b.h.base, local + 2 * (CHUNK + 2 * GUARD));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, traffic_main, &t), 0);
    checks_failed[0] = '\0';
    CHECK(WAIT_FOR(atomic_load(&t.ok) >= 3, 10000) >= 0);
    source_kill(&b);
    uint64_t killed_at = now_ns();
    long detected = WAIT_FOR(atomic_load(&t.failed_requests) >= 1, (IO_TIMEOUT_S + 2) * 1000);
    sleep_ms(1000);
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    print_message("source killed: the first request failed after %ld ms; %llu failed request(s), the last %llu ms "
                  "after the kill; longest wait %llu ms\n", detected, (unsigned long long)atomic_load(&t.failed_requests),
                  (unsigned long long)((t.last_failure_ns - killed_at) / 1000000ull),
                  (unsigned long long)(t.longest_ns / 1000000ull));
    if (t.bad_report)
        fail_msg("%s", t.bad);
    if (checks_failed[0] != '\0')
        fail_msg("%s", checks_failed);
    assert_true(detected >= 0);
    assert_int_equal(atomic_load(&t.corrupt), 0);
    assert_int_equal(atomic_load(&t.slow), 0);

    /* A new process at the same endpoint: the old segment's requests are stale and touch
     * nothing; a segment with the new epoch reads the new process's memory. */
    struct source b2;
    source_spawn(&b2, b.h.endpoint);
    assert_string_equal(b2.h.endpoint, b.h.endpoint);
    assert_memory_not_equal(&b2.h.epoch, &b.h.epoch, sizeof b.h.epoch);
    uint8_t *dst = t.area + GUARD;
    memset(t.area, 0xab, CHUNK + 2 * GUARD);
    struct orb_batch_report rep;
    uint64_t t0 = now_ns();
    int rc = read_one(req, sb, dst, b2.h.base, &rep);
    print_message("the old segment's READ after the restart: %s in %llu ms (%s)\n", orb_strerror(rc),
                  (unsigned long long)((now_ns() - t0) / 1000000ull), orb_last_error());
    assert_int_equal(rc, ORB_ESTALE);
    assert_true(rep.done && rep.has_failure && rep.failure.status == ORB_ESTALE &&
                rep.failure.remote_effect == ORB_REMOTE_EFFECT_NONE);
    assert_true(all_are(t.area, CHUNK + 2 * GUARD, 0xab));
    orb_segment_close(sb);
    orb_segment *sb2 = NULL;
    if (orb_open_segment(req, b2.h.endpoint, &b2.h.epoch, TIMEOUT_NS, &sb2) != 0)
        fail_msg("open_segment to the successor: %s", orb_last_error());
    assert_int_equal(read_one(req, sb2, dst, b2.h.base, &rep), 0);
    for (uint64_t i = 0; i < CHUNK; i++)
        if (dst[i] != pattern(i, 0))
            fail_msg("byte %llu of the successor's memory differs", (unsigned long long)i);
    orb_segment_close(sb2);
    source_stop(&b2);
    /* The requester let go of both connections (released peers are freed by a lane). */
    footprint_returns(&before, "the requester kept something of the killed source's connection");
}

/* A requester engine of its own closes while its source is frozen (SIGSTOP) under traffic: the
 * documented result within the close's timeout, and the engine's batches all end. */
static void test_close_with_a_frozen_source(void **state)
{
    (void)state;
    struct footprint before = footprint();
    struct source c;
    source_spawn(&c, "127.0.0.1:0");
    struct side sd;
    side_up(&sd, &c.h, NULL);
    orb_engine *e = sd.e;
    struct traffic *t = &sd.t;
    t->closing = true;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, traffic_main, t), 0);
    checks_failed[0] = '\0';
    CHECK(WAIT_FOR(atomic_load(&t->ok) >= 3, 10000) >= 0);
    CHECK(kill(c.pid, SIGSTOP) == 0);
    sleep_ms(200); /* requests in flight now wait for a frozen process */
    const uint64_t close_timeout = 2ull * 1000000000ull;
    uint64_t t0 = now_ns();
    int rc = orb_engine_close(e, close_timeout);
    uint64_t took = now_ns() - t0;
    print_message("close with a frozen source: %s in %llu ms (%s)\n", orb_strerror(rc),
                  (unsigned long long)(took / 1000000ull), rc != 0 ? orb_last_error() : "");
    atomic_store(&t->stop, 1);
    pthread_join(th, NULL);
    (void)kill(c.pid, SIGCONT);
    if (checks_failed[0] != '\0')
        fail_msg("%s", checks_failed);
    assert_true(rc == 0 || rc == ORB_EUNQUIESCED);
    assert_true(took <= close_timeout + 1000000000ull);
    if (t->bad_report)
        fail_msg("%s", t->bad);
    assert_int_equal(atomic_load(&t->corrupt), 0);
    if (rc == ORB_EUNQUIESCED) /* a later close keeps waiting */
        assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    side_down(&sd); /* closed already: the close is 0 again */
    source_stop(&c);
    footprint_returns(&before, "the closed engine left something behind");
}

/* ---- the device refusing calls (the verbs interposer) ----------------------------------------- */

/* WRITE a fresh pattern to the source and READ it back; 0 when both succeeded and it matched. */
static int round_trip(struct traffic *t, uint32_t seed)
{
    uint8_t *target = t->area + GUARD;
    for (uint64_t i = 0; i < CHUNK; i++)
        target[i] = pattern(i, seed);
    int rc = one(t, ORB_OP_WRITE, 0, GUARD);
    if (rc != 0)
        return rc;
    memset(target, 0, CHUNK);
    if ((rc = one(t, ORB_OP_READ, 0, GUARD)) != 0)
        return rc;
    for (uint64_t i = 0; i < CHUNK; i++)
        if (target[i] != pattern(i, seed))
            return ORB_EPROTO;
    return 0;
}

/* A READ whose second work request the device refuses: named by bad_wr (the WR was not taken,
 * it is let go at once) or not named though it was taken (it ends with its flush). Either way
 * its queue pair is dead: with a replay left the READ is asked again on a new one and succeeds;
 * without (`replays` false: the engine's read_replays is 0) it fails at once with its exact
 * report. Nothing of it stays charged, and the next requests succeed (the connection heals). */
static void refused_posts_on(orb_engine *e, struct traffic *t, bool replays)
{
    static const enum itp_post_failure modes[] = {ITP_REFUSED_NAMED, ITP_TAKEN_UNNAMED};
    for (size_t m = 0; m < 2; m++) {
        uint64_t failed_before = itp_failures(ITP_POST_SEND);
        uint64_t replayed_before = stats_of(e).read_replays;
        itp_arm(ITP_POST_SEND, 2, ENOMEM, IBV_WR_RDMA_READ, modes[m]);
        uint64_t t0 = now_ns();
        int rc = one(t, ORB_OP_READ, 0, GUARD);
        uint64_t took = now_ns() - t0;
        itp_disarm(ITP_POST_SEND);
        print_message("a READ post refused (%s), %s: %s in %llu ms\n", m == 0 ? "named by bad_wr" : "taken, not named",
                      replays ? "replays on" : "no replays", orb_strerror(rc), (unsigned long long)(took / 1000000ull));
        assert_int_equal(itp_failures(ITP_POST_SEND), failed_before + 1);
        assert_int_equal(rc, replays ? 0 : ORB_EPEER);
        assert_int_equal(stats_of(e).read_replays, replayed_before + (replays ? 1 : 0));
        assert_true(took < (replays ? (IO_TIMEOUT_S + 1) * 1000000000ull : 2000000000ull));
        if (t->bad_report)
            fail_msg("%s", t->bad);
        assert_true(WAIT_FOR(stats_of(e).requests_in_flight == 0, 2000) >= 0);
        for (uint32_t i = 0; i < 3; i++)
            if ((rc = round_trip(t, 100 + i)) != 0)
                fail_msg("round %u after the refused post: %s (%s)", i, orb_strerror(rc), orb_last_error());
    }
}

static void test_refused_posts(void **state)
{
    (void)state;
    struct traffic t;
    traffic_init(&t, req, seg, peer.base, local);
    memset(local, 0xee, CHUNK + 2 * GUARD);
    refused_posts_on(req, &t, true);
    struct side sd;
    side_up(&sd, &peer, "0");
    refused_posts_on(sd.e, &sd.t, false);
    side_down(&sd);
}

/* A WRITE whose only work request the device refuses. Named by bad_wr, nothing of it reached
 * the device: its failure says no remote effect, and the source's bytes are as they were. Taken
 * without being named, it may have: the effect is unknown. A WRITE is never asked again. */
static void test_refused_write_posts(void **state)
{
    (void)state;
    static const enum itp_post_failure modes[] = {ITP_REFUSED_NAMED, ITP_TAKEN_UNNAMED};
    enum { LEN = 4096 };
    struct traffic t;
    traffic_init(&t, req, seg, peer.base, local);
    memset(local, 0xee, CHUNK + 2 * GUARD);
    uint8_t *target = local + GUARD;
    assert_int_equal(round_trip(&t, 9), 0); /* the source's first chunk: pattern 9 */
    for (size_t m = 0; m < 2; m++) {
        uint64_t replayed_before = stats_of(req).read_replays;
        struct orb_request r = chunk_request(ORB_OP_WRITE, target, peer.base);
        r.length = LEN; /* one work request */
        memset(target, 0x5a, LEN);
        itp_arm(ITP_POST_SEND, 1, ENOMEM, IBV_WR_RDMA_WRITE, modes[m]);
        struct orb_batch_report rep;
        int rc = orb_submit_and_wait(req, seg, &r, 1, NULL, TIMEOUT_NS, &rep);
        itp_disarm(ITP_POST_SEND);
        print_message("a WRITE post refused (%s): %s, remote effect %s\n", m == 0 ? "named by bad_wr" : "taken, not named",
                      orb_strerror(rc), rep.failure.remote_effect == ORB_REMOTE_EFFECT_NONE ? "none" : "unknown");
        assert_int_equal(rc, ORB_EPEER);
        assert_true(rep.done && rep.has_failure && rep.failure.request_index == 0 && rep.failure.affected_requests == 1);
        assert_int_equal(rep.failure.remote_effect, m == 0 ? ORB_REMOTE_EFFECT_NONE : ORB_REMOTE_EFFECT_UNKNOWN);
        assert_int_equal(stats_of(req).read_replays, replayed_before);
        assert_true(WAIT_FOR(stats_of(req).requests_in_flight == 0, 2000) >= 0);
        if (m == 0) {
            /* Nothing of it reached the source: READ back, its bytes are pattern 9 still. */
            memset(target, 0, LEN);
            r.op = ORB_OP_READ;
            if ((rc = orb_submit_and_wait(req, seg, &r, 1, NULL, TIMEOUT_NS, &rep)) != 0)
                fail_msg("reading back: %s (%s)", orb_strerror(rc), orb_last_error());
            for (uint32_t i = 0; i < LEN; i++)
                if (target[i] != pattern(i, 9))
                    fail_msg("byte %u of the source changed under a WRITE that was never posted", i);
        }
    }
    assert_int_equal(round_trip(&t, 10), 0);
}

/* A refused single READ's report: failed with `status` alone, no remote effect, within `bound_ns`;
 * the guard bytes around its destination untouched. */
static void refused_read_reported(int rc, const struct orb_batch_report *rep, int status, uint64_t took,
                                  uint64_t bound_ns)
{
    assert_int_equal(rc, status);
    assert_true(rep->done && rep->has_failure && rep->failure.request_index == 0 &&
                rep->failure.affected_requests == 1 && rep->failure.status == status &&
                rep->failure.remote_effect == ORB_REMOTE_EFFECT_NONE);
    assert_true(took < bound_ns);
    for (uint32_t i = 0; i < GUARD; i++)
        assert_true(local[i] == 0xee && local[GUARD + CHUNK + i] == 0xee);
}

/* A READ through a key the source never granted (a revoked one): the source's device refuses
 * the access, the request fails with ORB_EPERM and its exact report, rail health does not count
 * it (the peer's authority, not the path), and the connection heals. */
static void test_a_revoked_key(void **state)
{
    (void)state;
    struct traffic t;
    traffic_init(&t, req, seg, peer.base, local);
    memset(local, 0xee, CHUNK + 2 * GUARD);
    struct orb_rdma_stats s0 = stats_of(req);
    itp_arm(ITP_POST_SEND, 1, 0, IBV_WR_RDMA_READ, ITP_WRONG_KEY);
    struct orb_request r = chunk_request(ORB_OP_READ, local + GUARD, peer.base);
    struct orb_batch_report rep;
    uint64_t t0 = now_ns();
    int rc = orb_submit_and_wait(req, seg, &r, 1, NULL, TIMEOUT_NS, &rep);
    uint64_t took = now_ns() - t0;
    itp_disarm(ITP_POST_SEND);
    print_message("a READ through a key never granted: %s in %llu ms (%s)\n", orb_strerror(rc),
                  (unsigned long long)(took / 1000000ull), orb_last_error());
    refused_read_reported(rc, &rep, ORB_EPERM, took, 2000000000ull);
    assert_int_equal(stats_of(req).rail_errors, s0.rail_errors);
    for (uint32_t i = 0; i < 3; i++)
        if ((rc = round_trip(&t, 200 + i)) != 0)
            fail_msg("round %u after the refused access: %s (%s)", i, orb_strerror(rc), orb_last_error());
}

static void freeze(void *pid)
{
    (void)kill(*(pid_t *)pid, SIGSTOP);
}

/* The same refusal from a source process that cannot answer any more (frozen with SIGSTOP just
 * before the post, the way a dying one loses its windows with its process): its device refuses
 * the key, the PING that follows goes unanswered, and the request fails as the peer's
 * (ORB_EPEER), not as a refused permission, within that PING's second; thawed, the source
 * serves the next requests. */
static void test_a_refusal_by_a_source_that_does_not_answer(void **state)
{
    (void)state;
    struct source b;
    source_spawn(&b, "127.0.0.1:0");
    orb_segment *sb = NULL;
    if (orb_open_segment(req, b.h.endpoint, &b.h.epoch, TIMEOUT_NS, &sb) != 0)
        fail_msg("open_segment: %s", orb_last_error());
    hold_for_the_cell(sb, &b);
    struct traffic t;
    traffic_init(&t, req, sb, b.h.base, local);
    int rc = round_trip(&t, 300);
    if (rc != 0)
        fail_msg("the first round trip: %s (%s)", orb_strerror(rc), orb_last_error());
    memset(local, 0xee, CHUNK + 2 * GUARD);
    itp_on_armed_post(freeze, &b.pid);
    itp_arm(ITP_POST_SEND, 1, 0, IBV_WR_RDMA_READ, ITP_WRONG_KEY);
    struct orb_request r = chunk_request(ORB_OP_READ, local + GUARD, b.h.base);
    struct orb_batch_report rep;
    uint64_t t0 = now_ns();
    rc = orb_submit_and_wait(req, sb, &r, 1, NULL, TIMEOUT_NS, &rep);
    uint64_t took = now_ns() - t0;
    itp_disarm(ITP_POST_SEND);
    itp_on_armed_post(NULL, NULL);
    (void)kill(b.pid, SIGCONT);
    print_message("a key refused by a frozen source: %s in %llu ms (%s)\n", orb_strerror(rc),
                  (unsigned long long)(took / 1000000ull), orb_last_error());
    refused_read_reported(rc, &rep, ORB_EPEER, took, 4000000000ull);
    for (uint32_t i = 0; i < 3; i++)
        if ((rc = round_trip(&t, 310 + i)) != 0)
            fail_msg("round %u after the source thawed: %s (%s)", i, orb_strerror(rc), orb_last_error());
    release_from_the_cell();
    orb_segment_close(sb);
    source_stop(&b);
}

/* A frozen source (SIGSTOP) with far more requests than its connection takes at once (the
 * rest wait in the grant queue; its GRANT calls wait for an answer that does not come) holds
 * back no request to another source: round trips to the main source complete, byte for byte,
 * while the frozen one's requests wait. Nor do the grant threads burn the CPU walking the
 * queue of requests that cannot go. Thawed, the frozen source's batch ends (served, or failed
 * as the peer's) with a consistent report. */
static void test_a_frozen_source_holds_back_no_other(void **state)
{
    (void)state;
    enum { N = 2048, SMALL = 4096, LOCAL_SLOTS = 512, REMOTE_SLOTS = 1024 };
    struct source b;
    source_spawn(&b, "127.0.0.1:0");
    orb_segment *sb = NULL;
    if (orb_open_segment(req, b.h.endpoint, &b.h.epoch, TIMEOUT_NS, &sb) != 0)
        fail_msg("open_segment: %s", orb_last_error());
    struct traffic tb, tm;
    traffic_init(&tb, req, sb, b.h.base, local);
    traffic_init(&tm, req, seg, peer.base, local);
    int rc = round_trip(&tb, 400); /* its connection is up */
    if (rc != 0)
        fail_msg("the first round trip to the second source: %s (%s)", orb_strerror(rc), orb_last_error());
    uint8_t *far = local + (2u << 20); /* outside the round trips' bytes */
    struct orb_request *r = calloc(N, sizeof *r);
    assert_non_null(r);
    for (uint32_t i = 0; i < N; i++) {
        r[i].transport = ORB_TRANSPORT_RDMA;
        r[i].op = ORB_OP_WRITE;
        r[i].local_addr = (uint64_t)(uintptr_t)far + (uint64_t)(i % LOCAL_SLOTS) * SMALL;
        r[i].remote_addr = b.h.base + (uint64_t)(i % REMOTE_SLOTS) * SMALL;
        r[i].length = SMALL;
    }
    assert_int_equal(kill(b.pid, SIGSTOP), 0);
    orb_batch *frozen = NULL;
    int open_rc = orb_batch_open(req, sb, &frozen);
    int submit_rc = open_rc == 0 ? orb_batch_submit(frozen, r, N) : open_rc;
    int seal_rc = submit_rc == 0 ? orb_batch_seal(frozen, NULL) : submit_rc;
    sleep_ms(300); /* the grant threads take what they can of the frozen source's */
    /* Half a second with nothing but the frozen source's requests queued: the grant threads
     * that do not wait in its GRANT calls have nothing to take and wait for a change. */
    struct thread_use u0 = thread_use_of("orb-rdma-grant");
    sleep_ms(500);
    struct thread_use u1 = thread_use_of("orb-rdma-grant");
    unsigned long long idle_ms = thread_use_ms(u1.ticks - u0.ticks);
    unsigned long long wakes = u1.sleeps - u0.sleeps;
    /* Three round trips to the main source, each WRITE then READ of 1 MiB, checked. */
    uint64_t t0 = now_ns();
    int other_rc = 0;
    for (uint32_t i = 0; i < 3 && other_rc == 0; i++)
        other_rc = round_trip(&tm, 401 + i);
    uint64_t took = now_ns() - t0;
    struct orb_batch_report still;
    int still_rc = seal_rc == 0 ? orb_batch_poll(frozen, &still) : seal_rc;
    (void)kill(b.pid, SIGCONT);
    print_message("grant threads in half a second with %d requests queued for a frozen source: %llu ms of CPU, "
                  "%llu wake-ups\n", N - 32, idle_ms, wakes);
    print_message("round trips to another source while one is frozen: %s in %llu ms; the frozen one's batch %s\n",
                  orb_strerror(other_rc), (unsigned long long)(took / 1000000ull),
                  still_rc == ORB_EAGAIN ? "still waiting" : orb_strerror(still_rc));
    assert_int_equal(seal_rc, 0);
    if (other_rc != 0)
        fail_msg("a round trip to the main source: %s (%s)", orb_strerror(other_rc), orb_last_error());
    assert_int_equal(tm.bad_report, 0);
    /* Well before the frozen source's calls time out (io_timeout_s): nothing waited for them. */
    assert_true(took < (IO_TIMEOUT_S - 1) * 1000000000ull);
    assert_int_equal(still_rc, ORB_EAGAIN);
    /* Each grant thread that had nothing to take walked the whole queue every millisecond:
     * 610 ms of CPU and 1008 wake-ups in a second under soft-RoCE in a VM. Now they wait for
     * a change, up to 16 ms at a time. */
    assert_true(u0.threads > 0); /* the grant threads were found by their name */
    assert_int_equal(u1.threads, u0.threads);
    assert_true(idle_ms <= 60);
    assert_true(wakes <= 200);
    struct orb_batch_report rep;
    rc = orb_batch_wait(frozen, TIMEOUT_NS, &rep);
    print_message("thawed: the frozen source's batch ended with %s (%zu of %d completed)\n", orb_strerror(rc),
                  rep.completed_requests, N);
    assert_true(rep.done);
    assert_true(rc == 0 || rc == ORB_EPEER || rc == ORB_ETIMEDOUT);
    assert_int_equal(rep.status, rc);
    if (rc == 0)
        assert_int_equal(rep.completed_requests, N);
    else
        assert_true(rep.has_failure && rep.failure.status == rc && rep.completed_requests == rep.failure.request_index);
    assert_int_equal(orb_batch_free(frozen), 0);
    free(r);
    orb_segment_close(sb);
    source_kill(&b);
}

/* The first warning line containing `want` since warning_watch(), kept while the engine's lines
 * still go to stderr as the default sink writes them. */
static struct {
    pthread_mutex_t lock;
    const char *want;
    char line[512];
} warning_seen = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void warning_sink(enum orb_log_level level, const char *message, void *ctx)
{
    (void)ctx;
    static const char *const names[] = {"error", "warn", "info", "debug", "trace"};
    fprintf(stderr, "orbite[%s]: %s\n", (unsigned)level < 5 ? names[level] : "?", message);
    pthread_mutex_lock(&warning_seen.lock);
    if (level == ORB_LOG_WARN && warning_seen.want != NULL && warning_seen.line[0] == '\0' &&
        strstr(message, warning_seen.want) != NULL)
        snprintf(warning_seen.line, sizeof warning_seen.line, "%s", message);
    pthread_mutex_unlock(&warning_seen.lock);
}

static void warning_watch(const char *want)
{
    pthread_mutex_lock(&warning_seen.lock);
    warning_seen.want = want;
    warning_seen.line[0] = '\0';
    pthread_mutex_unlock(&warning_seen.lock);
    orb_log_set_handler(warning_sink, NULL);
}

/* The line seen (empty: none), copied out; the default sink again. */
static void warning_unwatch(char *out, size_t cap)
{
    orb_log_set_handler(NULL, NULL);
    pthread_mutex_lock(&warning_seen.lock);
    snprintf(out, cap, "%s", warning_seen.line);
    warning_seen.want = NULL;
    pthread_mutex_unlock(&warning_seen.lock);
}

/* A queue pair forced to the error state in the middle of a batch of READs (through `e`'s
 * segment `sg`, into `area`, CHUNK + 2 * GUARD bytes). With replays the READs it carried are
 * asked again and the whole batch arrives. Without (`replays` false), the report names the
 * first request that did not complete, the prefix before it completed with its bytes, READs
 * have no remote effect; either way the bytes around the batch never change and the next batch
 * succeeds. */
static void qp_to_error_on(orb_engine *e, orb_segment *sg, uint8_t *area, bool replays)
{
    enum { N = 8, PART = CHUNK / 4 };
    uint8_t *dst = area + GUARD;
    struct traffic t;
    traffic_init(&t, e, sg, peer.base, area);
    /* The source's first 2 MiB hold a known pattern (a WRITE of them first). */
    for (uint32_t half = 0; half < 2; half++) {
        memset(area, 0xee, CHUNK + 2 * GUARD);
        for (uint64_t i = 0; i < CHUNK; i++)
            dst[i] = pattern(half * CHUNK + i, 77);
        assert_int_equal(one(&t, ORB_OP_WRITE, half * CHUNK, GUARD), 0);
    }
    struct orb_request r[N];
    memset(r, 0, sizeof r);
    for (uint32_t i = 0; i < N; i++) {
        r[i].transport = ORB_TRANSPORT_RDMA;
        r[i].op = ORB_OP_READ;
        r[i].local_addr = (uint64_t)(uintptr_t)dst + (uint64_t)i * (PART / 2);
        r[i].remote_addr = peer.base + (uint64_t)i * PART;
        r[i].length = PART / 2; /* 128 KiB each, packed into the first 1 MiB locally */
    }
    memset(area, 0xee, CHUNK + 2 * GUARD);
    uint64_t replayed_before = stats_of(e).read_replays, rail_errors_before = stats_of(e).rail_errors;
    warning_watch("flushed though nothing here failed the queue pair");
    itp_arm(ITP_POST_SEND, 13, 0, IBV_WR_RDMA_READ, ITP_QP_TO_ERROR); /* of 16: 2 slices a request */
    struct orb_batch_report rep;
    int rc = orb_submit_and_wait(e, sg, r, N, NULL, TIMEOUT_NS, &rep);
    itp_disarm(ITP_POST_SEND);
    char warned[512];
    warning_unwatch(warned, sizeof warned);
    uint64_t replayed = stats_of(e).read_replays - replayed_before;
    print_message("a queue pair forced to error mid-batch, %s: %s; %zu completed, failure at %zu spanning %zu; "
                  "%llu READ(s) asked again\n", replays ? "replays on" : "no replays", orb_strerror(rc),
                  rep.completed_requests, rep.failure.request_index, rep.failure.affected_requests,
                  (unsigned long long)replayed);
    assert_int_equal(itp_failures(ITP_POST_SEND) > 0, 1);
    /* Nothing in the engine failed that queue pair: its flushes are said, and they count against
     * its rail's path. */
    if (strstr(warned, "its path is taken to have failed") == NULL)
        fail_msg("no warning said the device failed the queue pair (seen: \"%s\")", warned);
    assert_true(stats_of(e).rail_errors > rail_errors_before);
    size_t whole = N;
    if (replays) {
        if (rc != 0)
            fail_msg("the batch with replays: %s (%s)", orb_strerror(rc), orb_last_error());
        assert_true(rep.done && !rep.has_failure && rep.completed_requests == N);
        assert_true(replayed >= 1);
    } else {
        assert_int_equal(rc, ORB_EPEER);
        assert_true(rep.done && rep.has_failure && rep.failure.status == ORB_EPEER);
        assert_int_equal(rep.completed_requests, rep.failure.request_index);
        assert_true(rep.failure.affected_requests >= 1 && rep.failure.request_index + rep.failure.affected_requests <= N);
        assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
        assert_int_equal(replayed, 0);
        whole = rep.completed_requests;
    }
    for (size_t i = 0; i < whole; i++)
        for (uint64_t b = 0; b < PART / 2; b++)
            if (dst[i * (PART / 2) + b] != pattern(i * PART + b, 77))
                fail_msg("request %zu of the completed prefix: byte %llu differs", i, (unsigned long long)b);
    for (uint32_t i = 0; i < GUARD; i++)
        assert_int_equal(area[i], 0xee);
    for (uint64_t i = (uint64_t)N * (PART / 2); i < CHUNK + GUARD; i++)
        assert_int_equal(dst[i], 0xee);
    memset(area, 0xee, CHUNK + 2 * GUARD);
    rc = orb_submit_and_wait(e, sg, r, N, NULL, TIMEOUT_NS, &rep);
    if (rc != 0)
        fail_msg("the next batch: %s (%s)", orb_strerror(rc), orb_last_error());
    for (size_t i = 0; i < N; i++)
        for (uint64_t b = 0; b < PART / 2; b++)
            if (dst[i * (PART / 2) + b] != pattern(i * PART + b, 77))
                fail_msg("the next batch, request %zu: byte %llu differs", i, (unsigned long long)b);
}

static void test_a_queue_pair_forced_to_error_mid_batch(void **state)
{
    (void)state;
    qp_to_error_on(req, seg, local, true);
    struct side sd;
    side_up(&sd, &peer, "0");
    qp_to_error_on(sd.e, sd.seg, sd.t.area, false);
    side_down(&sd);
}

/* A READ of the source's first chunk into sd's target once a rail can carry it: with
 * rail_error_threshold 1 every rail that failed a cell's request is paused for its cooldown
 * (2 s), and a READ finds no rail meanwhile (ORB_EUNAVAILABLE). At most 10 s. */
static void read_when_a_rail_is_back(struct side *sd)
{
    uint64_t until = now_ns() + 10000000000ull;
    for (;;) {
        int rc = one(&sd->t, ORB_OP_READ, 0, GUARD);
        if (rc == 0)
            return;
        if (rc != ORB_EUNAVAILABLE || now_ns() > until)
            fail_msg("a READ after the cell's failures: %s (%s)", orb_strerror(rc), orb_last_error());
        sleep_ms(200);
    }
}

/* A rail's end (its SEND_WITH_INV) whose completion comes back flushed after the source's ACK
 * came: its queue pair died once the SEND had arrived, before the transport acknowledged it (the
 * interposer holds the completion back 1.5 s and then hands it out as a flush). The ACK proves
 * that every rail's binding arrived, each sent only once its rail's payload had completed: the
 * request succeeds, READ and WRITE alike, with no replay (read_replays 0 here) and every byte in
 * place; the rail counts the path failure; the next request goes through. */
static void test_a_rail_end_that_fails_after_its_ack(void **state)
{
    (void)state;
    struct cell cell;
    cell_begin(&cell);
    struct side sd;
    side_up_with(&sd, &peer, "0", "polling");
    uint8_t *dst = sd.t.area + GUARD;
    for (uint32_t k = 0; k < 2; k++) {
        enum orb_op op = k == 0 ? ORB_OP_READ : ORB_OP_WRITE;
        uint32_t seed = 91 + k;
        memset(sd.t.area, 0xee, CHUNK + 2 * GUARD);
        for (uint64_t i = 0; i < CHUNK; i++)
            dst[i] = pattern(i, seed);
        if (op == ORB_OP_READ) { /* the source's chunk holds the pattern; the READ lands on zeros */
            assert_int_equal(one(&sd.t, ORB_OP_WRITE, 0, GUARD), 0); /* the first request: rails healthy */
            memset(dst, 0, CHUNK);
        }
        struct orb_rdma_stats s0 = stats_of(sd.e);
        warning_watch("flushed though nothing here failed the queue pair");
        itp_hold_send_completions(1, 1500);
        struct orb_request r = chunk_request(op, dst, peer.base);
        struct orb_batch_report rep;
        int rc = orb_submit_and_wait(sd.e, sd.seg, &r, 1, NULL, TIMEOUT_NS, &rep);
        uint32_t kept_back = itp_held_send_completions();
        itp_hold_send_completions(0, 0);
        char warned[512];
        warning_unwatch(warned, sizeof warned);
        struct orb_rdma_stats s = stats_of(sd.e);
        print_message("%s with its rail's end flushed after the ACK: %s (%s); %u completion(s) held back, %llu rail "
                      "error(s), %llu replay(s)\n", op == ORB_OP_READ ? "a READ" : "a WRITE", orb_strerror(rc),
                      rc != 0 ? orb_last_error() : "", kept_back, (unsigned long long)(s.rail_errors - s0.rail_errors),
                      (unsigned long long)(s.read_replays - s0.read_replays));
        assert_int_equal(kept_back, 1);
        if (rc != 0)
            fail_msg("the request failed: %s", orb_last_error());
        assert_true(rep.done && !rep.has_failure && rep.completed_requests == 1);
        assert_int_equal(s.read_replays, s0.read_replays);
        if (strstr(warned, "its path is taken to have failed") == NULL)
            fail_msg("no warning said the queue pair's path failed (seen: \"%s\")", warned);
        assert_true(s.rail_errors > s0.rail_errors);
        if (op == ORB_OP_WRITE) { /* what the source holds now, read back */
            memset(dst, 0, CHUNK);
            read_when_a_rail_is_back(&sd);
        }
        for (uint64_t i = 0; i < CHUNK; i++)
            if (dst[i] != pattern(i, seed))
                fail_msg("%s: byte %llu differs", op == ORB_OP_READ ? "the READ" : "the WRITE", (unsigned long long)i);
        for (uint32_t i = 0; i < GUARD; i++)
            assert_true(sd.t.area[i] == 0xee && dst[CHUNK + i] == 0xee);
    }
    /* The next request goes through. */
    memset(dst, 0, CHUNK);
    read_when_a_rail_is_back(&sd);
    for (uint64_t i = 0; i < CHUNK; i++)
        if (dst[i] != pattern(i, 92))
            fail_msg("the next READ: byte %llu differs", (unsigned long long)i);
    side_down(&sd);
    footprint_returns(&cell.before, "the engine kept something of the failed queue pair");
}

/* What the lane threads used over 2 s from 4 s into an engine's close (past its 2 s deadline:
 * its drain window has begun), into the struct thread_use at `arg`. */
static void *sample_drain(void *arg)
{
    struct thread_use *u = arg;
    sleep_ms(4000);
    struct thread_use a = thread_use_of("orb-rdma-lane");
    sleep_ms(2000);
    struct thread_use b = thread_use_of("orb-rdma-lane");
    u->ticks = b.ticks - a.ticks;
    u->sleeps = b.sleeps - a.sleeps;
    u->threads = b.threads;
    return NULL;
}

/* A READ whose work request the device refuses without naming it, not having taken it: nothing
 * can prove it will never run, so it stays charged -- its request does not end, the wait for it
 * times out with it still live, and the engine's close says ORB_EUNQUIESCED and keeps its
 * memory. Its connection takes no new work meanwhile (its grant at the source expires, and the
 * connection cannot be rebuilt under a request that may still run): a new request fails within
 * its bound, naming why. */
static void test_an_unprovable_post_stays_charged(void **state)
{
    (void)state;
    struct side sd;
    side_up(&sd, &peer, NULL);
    assert_int_equal(round_trip(&sd.t, 7), 0);
    warning_watch("got no ACK within io_timeout_s");
    itp_arm(ITP_POST_SEND, 1, ENOMEM, IBV_WR_RDMA_READ, ITP_REFUSED_UNNAMED);
    struct orb_request r = chunk_request(ORB_OP_READ, sd.t.area + GUARD, peer.base);
    struct orb_batch_report rep;
    int rc = orb_submit_and_wait(sd.e, sd.seg, &r, 1, NULL, 3000000000ull, &rep);
    itp_disarm(ITP_POST_SEND);
    print_message("a READ post refused without proof: %s, done %d, %llu request(s) in flight\n", orb_strerror(rc),
                  rep.done, (unsigned long long)stats_of(sd.e).requests_in_flight);
    assert_int_equal(rc, ORB_ETIMEDOUT);
    assert_int_equal(rep.done, 0);
    assert_int_equal(stats_of(sd.e).requests_in_flight, 1);
    /* Past its ACK deadline it is still charged. */
    sleep_ms((IO_TIMEOUT_S + 1) * 1000);
    assert_int_equal(stats_of(sd.e).requests_in_flight, 1);
    /* The timeout's warning names the rail with the payload outstanding and its queue pair's
     * state: the refused post failed the link, which moved its queue pair to the error state. */
    char seen[512];
    warning_unwatch(seen, sizeof seen);
    print_message("the timeout said: %s\n", seen);
    assert_non_null(strstr(seen, "payload work request(s) without a completion, queue pair "));
    assert_non_null(strstr(seen, " error"));
    /* A new request: refused within io_timeout_s (the rebuild it waits for cannot start). */
    uint64_t t0 = now_ns();
    r = chunk_request(ORB_OP_WRITE, sd.t.area + GUARD, peer.base);
    rc = orb_submit_and_wait(sd.e, sd.seg, &r, 1, NULL, TIMEOUT_NS, &rep);
    uint64_t took = now_ns() - t0;
    print_message("the next request: %s in %llu ms (%s)\n", orb_strerror(rc), (unsigned long long)(took / 1000000ull),
                  orb_last_error());
    assert_true(rc != 0 && rep.done && rep.has_failure && rep.failure.remote_effect == ORB_REMOTE_EFFECT_NONE);
    assert_true(took < (IO_TIMEOUT_S + 2) * 1000000000ull);
    struct thread_use drain = {0, 0, 0};
    pthread_t sampler;
    assert_int_equal(pthread_create(&sampler, NULL, sample_drain, &drain), 0);
    t0 = now_ns();
    rc = orb_engine_close(sd.e, 2000000000ull);
    took = now_ns() - t0;
    pthread_join(sampler, NULL);
    print_message("close: %s in %llu ms (%s)\n", orb_strerror(rc), (unsigned long long)(took / 1000000ull),
                  orb_last_error());
    unsigned long long drain_ms = thread_use_ms(drain.ticks);
    const char *mode = getenv("ORBITE_TEST_PROGRESS");
    print_message("the %u lane threads (%s) over 2 s of the drain window: %llu ms of CPU, %llu wake-ups\n",
                  drain.threads, mode != NULL ? mode : "polling", drain_ms, drain.sleeps);
    assert_int_equal(rc, ORB_EUNQUIESCED);
    /* Its timeout, then the one 30 s destruction window the flushes get. */
    assert_true(took < 35000000000ull);
    /* The draining lanes wait for their flushes rather than spin: event-driven ones sleep on
     * their channels (they polled without a timeout: 3.8 s of CPU and 3200 wake-ups in these
     * 2 s on soft-RoCE), looking again every 25.6 ms, and polling ones nap up to 25.6 ms. The
     * process's other engine's lanes count too: they idle on events where ORBITE_TEST_PROGRESS
     * says event_driven (the suite's run); polling, their 200 us naps cost more than a drain
     * does, and only the figure is printed. */
    assert_true(drain.threads > 0);
    if (mode != NULL && strcmp(mode, "event_driven") == 0) {
        assert_true(drain_ms <= 400);
        assert_true(drain.sleeps <= 1000);
    }
    /* Unquiesced: the engine is kept (orb_engine_free leaks it on purpose), its memory too. */
    orb_engine_free(sd.e);
    orb_host_memory_unref(sd.mem);
}

/* A queue pair the device refuses to destroy: it is kept with its charges, never destroyed
 * again, counted in kept_queue_pairs, and the engine's close says ORB_EUNQUIESCED, again and
 * again. */
static void test_a_queue_pair_that_cannot_be_destroyed(void **state)
{
    (void)state;
    struct side sd;
    side_up(&sd, &peer, NULL);
    assert_int_equal(round_trip(&sd.t, 9), 0);
    uint64_t before = itp_calls(ITP_DESTROY_QP);
    itp_arm(ITP_DESTROY_QP, 1, EBUSY, -1, ITP_REFUSED_NAMED);
    orb_segment_close(sd.seg); /* its connection goes: its queue pairs are destroyed */
    long took = WAIT_FOR(stats_of(sd.e).kept_queue_pairs == 1, 5000);
    itp_disarm(ITP_DESTROY_QP);
    sleep_ms(1000); /* its siblings go right after it */
    uint64_t after = itp_calls(ITP_DESTROY_QP);
    print_message("a queue pair kept after %ld ms; %llu destroy call(s)\n", took,
                  (unsigned long long)(after - before));
    assert_true(took >= 0);
    assert_true(after - before >= 2); /* the kept one and its siblings, each once */
    int rc = orb_engine_close(sd.e, 2000000000ull);
    assert_int_equal(rc, ORB_EUNQUIESCED);
    assert_non_null(strstr(orb_last_error(), "could not be destroyed"));
    assert_int_equal(orb_engine_close(sd.e, 1000000000ull), ORB_EUNQUIESCED);
    assert_int_equal(itp_calls(ITP_DESTROY_QP), after); /* never tried again */
    assert_int_equal(stats_of(sd.e).kept_queue_pairs, 1);
    orb_engine_free(sd.e);
    orb_host_memory_unref(sd.mem);
}

/* ---- the soak (opt-in: --soak SECONDS, not in ctest) ------------------------------------------ */

/* Two traffic threads (WRITE then READ back, each on chunks of its own) on both rails for
 * `seconds`, rail 1's port down for 5 s every 20 s. 0 when no byte was wrong, every failure's
 * report was exact and within its bound, and the process holds what it held before. */
static int soak(unsigned seconds)
{
    if (setup(NULL) != 0)
        return 1;
    char dev[64], netdev[64];
    rail1_of(dev, sizeof dev, netdev, sizeof netdev);
    struct footprint before = footprint();
    struct traffic t[2];
    pthread_t th[2];
    for (uint32_t i = 0; i < 2; i++) {
        traffic_init(&t[i], req, seg, peer.base, local + i * (CHUNK + 2 * GUARD));
        t[i].first_chunk = i * (AREA / CHUNK / 2);
        t[i].nchunks = AREA / CHUNK / 2;
        if (pthread_create(&th[i], NULL, traffic_main, &t[i]) != 0)
            return 1;
    }
    uint64_t start = now_ns(), end = start + (uint64_t)seconds * 1000000000ull;
    unsigned flaps = 0;
    long peak_rss = 0, peak_fds = 0;
    while (now_ns() < end) {
        uint64_t cycle = start + (uint64_t)(flaps + 1) * 20000000000ull;
        while (now_ns() < cycle && now_ns() < end) {
            struct footprint f = footprint();
            peak_rss = f.rss_kib > peak_rss ? f.rss_kib : peak_rss;
            peak_fds = f.fds > peak_fds ? f.fds : peak_fds;
            sleep_ms(1000);
        }
        if (now_ns() >= end)
            break;
        link_set(netdev, "down");
        sleep_ms(5000);
        link_set(netdev, "up");
        flaps++;
    }
    for (uint32_t i = 0; i < 2; i++) {
        atomic_store(&t[i].stop, 1);
        pthread_join(th[i], NULL);
    }
    sleep_ms(3000); /* the last flap's rebuild and released links */
    struct footprint after = footprint();
    char why[320];
    bool back = footprint_back(&before, &after, why, sizeof why);
    struct orb_rdma_stats s = stats_of(req);
    uint64_t ok = atomic_load(&t[0].ok) + atomic_load(&t[1].ok), failed = atomic_load(&t[0].failed) + atomic_load(&t[1].failed);
    uint64_t corrupt = atomic_load(&t[0].corrupt) + atomic_load(&t[1].corrupt);
    uint64_t slow = atomic_load(&t[0].slow) + atomic_load(&t[1].slow);
    uint64_t longest = t[0].longest_ns > t[1].longest_ns ? t[0].longest_ns : t[1].longest_ns;
    printf("soak: %u s, %u flap(s) of rail 1 (%s): %llu round(s) ok (%.1f MiB each way), %llu failed, %llu wrong, "
           "%llu slow, longest wait %llu ms\n",
           seconds, flaps, netdev, (unsigned long long)ok, (double)ok * CHUNK / (1 << 20), (unsigned long long)failed,
           (unsigned long long)corrupt, (unsigned long long)slow, (unsigned long long)(longest / 1000000ull));
    printf("soak: rail errors %llu, pauses now %llu, probes %llu, recoveries %llu, route recoveries %llu, reconnects "
           "%llu, READs asked again %llu, monitor ticks %llu\n",
           (unsigned long long)s.rail_errors, (unsigned long long)s.rail_open_pairs, (unsigned long long)s.rail_probes,
           (unsigned long long)s.rail_recoveries, (unsigned long long)s.route_recoveries,
           (unsigned long long)s.reconnects, (unsigned long long)s.read_replays, (unsigned long long)s.monitor_ticks);
    printf("soak: peak rss %ld KiB, peak fds %ld; before and after: %s\n", peak_rss, peak_fds, why);
    for (uint32_t i = 0; i < 2; i++)
        if (t[i].bad_report)
            printf("soak: thread %u: %s\n", i, t[i].bad);
    bool pass = corrupt == 0 && slow == 0 && !t[0].bad_report && !t[1].bad_report && back && ok > 0;
    printf("soak: %s\n", pass ? "passed" : "FAILED");
    (void)teardown(NULL);
    return pass ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "--source") == 0)
        source_main(atoi(argv[2]), atoi(argv[3]), argv[4], argc >= 6 ? argv[5] : NULL);
    if (argc >= 3 && strcmp(argv[1], "--soak") == 0)
        return soak((unsigned)atoi(argv[2]));
    /* The requester's verbs calls go through the interposer (the source processes' too, counted
     * only). */
    if (itp_install() != 0) {
        printf("skipped: libibverbs cannot be loaded\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_a_port_down_under_a_two_rail_transfer, cell_teardown),
        cmocka_unit_test_teardown(test_reads_replay_on_the_other_rail, cell_teardown),
        cmocka_unit_test_teardown(test_a_source_queue_pair_dies, cell_teardown),
        cmocka_unit_test_teardown(test_a_port_down_at_start, cell_teardown),
        cmocka_unit_test_teardown(test_a_completion_queue_error, cell_teardown),
        cmocka_unit_test_teardown(test_a_completion_queue_error_event_driven, cell_teardown),
        cmocka_unit_test_teardown(test_the_address_of_a_rail_changes, cell_teardown),
        cmocka_unit_test_teardown(test_a_killed_source_and_its_successor, cell_teardown),
        cmocka_unit_test_teardown(test_close_with_a_frozen_source, cell_teardown),
        cmocka_unit_test_teardown(test_refused_posts, cell_teardown),
        cmocka_unit_test_teardown(test_refused_write_posts, cell_teardown),
        cmocka_unit_test_teardown(test_a_revoked_key, cell_teardown),
        cmocka_unit_test_teardown(test_a_refusal_by_a_source_that_does_not_answer, cell_teardown),
        cmocka_unit_test_teardown(test_a_frozen_source_holds_back_no_other, cell_teardown),
        cmocka_unit_test_teardown(test_a_queue_pair_forced_to_error_mid_batch, cell_teardown),
        cmocka_unit_test_teardown(test_a_rail_end_that_fails_after_its_ack, cell_teardown),
        cmocka_unit_test_teardown(test_an_unprovable_post_stays_charged, cell_teardown),
        cmocka_unit_test_teardown(test_a_queue_pair_that_cannot_be_destroyed, cell_teardown),
    };
    /* ORBITE_TEST_FILTER: run only the cells it matches (a cmocka test filter, '*' globbing). */
    if (getenv("ORBITE_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("ORBITE_TEST_FILTER"));
    /* ORBITE_TEST_SKIP: leave out the cells it matches (ctest runs one of them on its own). */
    if (getenv("ORBITE_TEST_SKIP") != NULL)
        cmocka_set_skip_filter(getenv("ORBITE_TEST_SKIP"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
