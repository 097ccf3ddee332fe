/* Device memory through whole engines over TCP, on the fakecuda stand-in as the process's
 * driver: registering device ranges (the host rules: all or nothing, identical ranges shared,
 * the peer's description naming the kind), READ and WRITE with either side or both in device
 * memory at unaligned sizes (both sides through their engine's staging pool), failed copies on either side failing their request
 * only, concurrent callers, and closing with staged work in flight. Staging is a pipeline, seen
 * through the stand-in's copies: a request's first bytes reach the other side before its last
 * are copied, and a request larger than the staging pool passes through chunks that are reused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <dlfcn.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <orbite/orbite.h>

#include "core/clock.h"
#include "cuda/cuda.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_memory.h"
#include "fakecuda.h"
#include "util.h"

#define MIB (1u << 20)
#define GUARD 8192u /* bytes of the allocation on each side of the registered range */

static struct fakecuda_controls fake;

/* With ORBITE_CUDA_DRIVER=real (hardware/gpu-check.sh) the cells run on the machine's own
 * libcuda.so.1; those that need the stand-in's controls (fault injection, slow streams, its
 * counts) are skipped there. */
static int real_driver;
static int second_device; /* 1 where there are two devices, else 0 */

static int setup(void **state)
{
    (void)state;
    const char *driver = getenv("ORBITE_CUDA_DRIVER");
    real_driver = driver != NULL && strcmp(driver, "real") == 0;
    const struct orb_cuda *cu = NULL;
    if ((!real_driver && orb_cuda_use_library(FAKECUDA_FULL) != 0) || orb_cuda_get(&cu) != 0)
        return -1;
    int count = 0;
    if (cu->device_get_count(&count) != ORB_CU_SUCCESS || count < 1)
        return -1;
    second_device = count > 1 ? 1 : 0;
    if (real_driver)
        return 0;
    return fakecuda_controls_load(FAKECUDA_FULL, &fake);
}

/* Live device allocations, from the stand-in; -1 on the real driver. */
static long live_allocations(void)
{
    return real_driver ? -1 : fake.counts().device_allocations;
}

/* One side of a transfer: `len` registered bytes between two guards, in host memory or in
 * device memory of device 0; the whole allocation holds seed's pattern at first. */
struct side {
    int device;
    orb_host_memory *host;
    orb_cuda_memory *dev;
    uint64_t base; /* the registered range's first byte */
    size_t len;
    orb_reg_id id;
};

static void side_new(orb_engine *e, int device, size_t len, enum orb_perm perm, uint8_t seed, struct side *s)
{
    memset(s, 0, sizeof *s);
    s->device = device;
    s->len = len;
    size_t total = len + 2 * GUARD;
    uint8_t *pattern = malloc(total);
    assert_non_null(pattern);
    eu_fill(pattern, total, seed);
    if (device) {
        assert_int_equal(orb_cuda_memory_alloc(0, total, &s->dev), 0);
        assert_int_equal(orb_cuda_memory_from_host(s->dev, 0, pattern, total), 0);
        s->base = orb_cuda_memory_ptr(s->dev) + GUARD;
        assert_int_equal(orb_register_cuda_memory(e, s->dev, GUARD, len, perm, &s->id), 0);
    } else {
        assert_int_equal(orb_host_memory_alloc(total, 0, &s->host), 0);
        memcpy(orb_host_memory_data(s->host), pattern, total);
        s->base = (uint64_t)(uintptr_t)orb_host_memory_data(s->host) + GUARD;
        assert_int_equal(orb_register_host_memory(e, s->host, GUARD, len, perm, &s->id), 0);
    }
    free(pattern);
}

/* The whole allocation (guards included), as it is now, in a new buffer. */
static uint8_t *side_bytes(const struct side *s)
{
    size_t total = s->len + 2 * GUARD;
    uint8_t *b = malloc(total);
    assert_non_null(b);
    if (s->device)
        assert_int_equal(orb_cuda_memory_to_host(s->dev, 0, b, total), 0);
    else
        memcpy(b, orb_host_memory_data(s->host), total);
    return b;
}

static void side_free(orb_engine *e, struct side *s)
{
    assert_int_equal(orb_unregister_memory(e, s->id), 0);
    orb_host_memory_unref(s->host);
    orb_cuda_memory_unref(s->dev);
}

static orb_engine *source_engine(void)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.tcp_stripes = 4;
    cfg.tcp_local_stripes = 4;
    return eu_engine(&cfg);
}


/* The requests' outcome: 0, or the first failure's status (the detail message says why). */
static int run(orb_engine *req, orb_segment *seg, const struct orb_request *r, size_t n, struct orb_batch_report *out)
{
    memset(out, 0, sizeof *out);
    int rc = orb_submit_and_wait(req, seg, r, n, NULL, 30 * EU_SEC, out);
    if (rc == 0 && out->has_failure)
        rc = out->failure.status;
    return rc;
}

/* ---- registration --------------------------------------------------------------------------- */

static void test_device_ranges_register_as_host_ranges_do(void **state)
{
    (void)state;
    orb_engine *e = source_engine();
    orb_cuda_memory *m = NULL, *other = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 4 * MIB, &m), 0);
    assert_int_equal(orb_cuda_memory_alloc(second_device, MIB, &other), 0);
    uint64_t base = orb_cuda_memory_ptr(m);
    orb_reg_id id = 0, again = 0, id2 = 0;

    /* Edge cases first: nothing is registered by any of them. */
    assert_int_equal(orb_register_cuda_memory(NULL, m, 0, 4096, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_register_cuda_memory(e, NULL, 0, 4096, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_register_cuda_memory(e, m, 0, 4096, ORB_PERM_LOCAL, NULL), ORB_EINVAL);
    assert_int_equal(orb_register_cuda_memory(e, m, 0, 0, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_register_cuda_memory(e, m, 4 * MIB - 1, 2, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "exceeds the cuda owner's"));
    assert_int_equal(orb_register_cuda_memory(e, m, SIZE_MAX, 2, ORB_PERM_LOCAL, &id), ORB_EINVAL);
    assert_int_equal(orb_register_cuda_memory(e, m, 0, 4096, (enum orb_perm)2, &id), ORB_EINVAL);
    assert_int_equal(id, 0);
    struct orb_local_region region;
    assert_int_equal(orb_resolve_local_address(e, base, 1, &region), ORB_ENOENT);

    /* One registration per identical range; the caller's reference is its own. */
    assert_int_equal(orb_register_cuda_memory(e, m, 4096, MIB, ORB_PERM_REMOTE_WRITE, &id), 0);
    assert_int_equal(orb_register_cuda_memory(e, m, 4096, MIB, ORB_PERM_LOCAL, &again), 0);
    assert_true(id == again);
    assert_int_equal(orb_resolve_local_address(e, base + 4096 + 17, 100, &region), 0);
    assert_true(region.id == id && region.base == base + 4096 && region.length == MIB);
    assert_int_equal(region.perm, ORB_PERM_REMOTE_WRITE);

    /* A batch is all or nothing: one bad range (index 2) registers none of the others. */
    struct orb_cuda_range ranges[3] = {
        {.owner = m, .offset = 2 * MIB, .length = 4096, .perm = ORB_PERM_REMOTE_READ},
        {.owner = other, .offset = 0, .length = MIB, .perm = ORB_PERM_LOCAL},
        {.owner = other, .offset = 1, .length = MIB, .perm = ORB_PERM_LOCAL},
    };
    orb_reg_id ids[3] = {0, 0, 0};
    assert_int_equal(orb_register_cuda_memory_batch(e, ranges, 3, ids), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "range 2"));
    assert_true(ids[0] == 0 && ids[1] == 0 && ids[2] == 0);
    assert_int_equal(orb_resolve_local_address(e, base + 2 * MIB, 1, &region), ORB_ENOENT);
    assert_int_equal(orb_resolve_local_address(e, orb_cuda_memory_ptr(other), 1, &region), ORB_ENOENT);
    assert_int_equal(orb_register_cuda_memory_batch(e, ranges, 0, ids), ORB_EINVAL);
    ranges[2].owner = NULL;
    assert_int_equal(orb_register_cuda_memory_batch(e, ranges, 3, ids), ORB_EINVAL);
    ranges[2].owner = other;
    ranges[2].offset = 0;
    ranges[2].length = 4096; /* a second range of `other`, inside the first */
    assert_int_equal(orb_register_cuda_memory_batch(e, ranges, 3, ids), 0);
    assert_true(ids[0] != 0 && ids[1] != 0 && ids[2] != 0 && ids[1] != ids[2]);
    assert_int_equal(orb_register_cuda_memory(e, m, 2 * MIB, 4096, ORB_PERM_LOCAL, &id2), 0);
    assert_true(id2 == ids[0]);

    /* A peer's description names the kind of every remote region. */
    struct side host;
    side_new(e, 0, 8192, ORB_PERM_REMOTE_READ, 1, &host);
    orb_engine *req = eu_requester(1, 0);
    orb_segment *seg = eu_open(req, e);
    struct orb_region_desc *descs = NULL;
    size_t count = 0;
    assert_int_equal(orb_segment_describe(seg, 5 * EU_SEC, &descs, &count), 0);
    assert_int_equal(count, 3); /* the two remote device ranges and the host one */
    int device_seen = 0, host_seen = 0;
    for (size_t i = 0; i < count; i++) {
        if (descs[i].addr == base + 4096) {
            assert_int_equal(descs[i].memory_kind, ORB_MEMORY_CUDA);
            assert_int_equal(descs[i].perm, ORB_PERM_REMOTE_WRITE);
            device_seen++;
        } else if (descs[i].addr == base + 2 * MIB) {
            assert_int_equal(descs[i].memory_kind, ORB_MEMORY_CUDA);
            device_seen++;
        } else {
            assert_true(descs[i].addr == host.base);
            assert_int_equal(descs[i].memory_kind, ORB_MEMORY_HOST);
            host_seen++;
        }
    }
    assert_int_equal(device_seen, 2);
    assert_int_equal(host_seen, 1);
    orb_region_descs_free(descs);
    orb_segment_close(seg);
    orb_engine_free(req);

    /* The registrations hold the owners: dropping the caller's references frees nothing yet. */
    long before = live_allocations();
    orb_cuda_memory_unref(m);
    orb_cuda_memory_unref(other);
    assert_true(live_allocations() == before);
    side_free(e, &host);
    orb_engine_free(e); /* the last references go with the registrations */
    if (!real_driver)
        assert_int_equal(live_allocations(), before - 2);
}

/* ---- watching the staging copies ------------------------------------------------------------- */

/* What a transfer's staging copies are checked for (the stand-in's watcher sees them). */
enum watch_checks {
    WATCH_OVERLAP = 1, /* the first bytes reach the receiving side before the last are copied */
    WATCH_BOUND = 2,   /* each staged side's copies pass through fewer host bytes than the request */
};

/* How long the copy of a request's last bytes waits for its first bytes to arrive: far longer
 * than a pipelined path needs (milliseconds), so that only a serial one runs into it. */
#define WATCH_WAIT (15 * EU_SEC)
#define WATCH_HOSTS 256
/* The engine's staging pool, the most host memory staging may use. */
#define STAGING_BOUND (64 * MIB)

/* The host buffers that one side's staging copies used. */
struct staged_hosts {
    enum fakecuda_copy_kind kind; /* HtoD or DtoH; 0: the side is not watched */
    uint64_t from, end;           /* the side's device bytes of the request */
    uint64_t copied;              /* bytes those copies moved */
    size_t n;
    int overflow;                 /* more distinct buffers than fit in host[] */
    struct {
        uint64_t addr, bytes;
    } host[WATCH_HOSTS];
};

static struct {
    pthread_mutex_t lock;
    /* WATCH_OVERLAP: the first copy out of the sending side that holds its last byte (late_at)
     * waits, before its bytes move, until the first bytes arrived, or WATCH_WAIT passed: on a
     * receiving side on the device, a copy into it that holds its first byte (early_at) ended;
     * on one in host memory, its end of the connections between the engines (the source's when
     * it receives) received a chunk's bytes more than when the request started. */
    int overlap;
    uint64_t early_at, late_at;
    int wire, wire_source_end;    /* bytes received on the wire are counted; at the source's end */
    unsigned wire_port;           /* the source's */
    uint64_t wire_base;           /* received by then */
    int early_done, late_seen, early_before_late;
    struct staged_hosts out, in; /* the sending side's copies to the host, the receiving side's from it */
} watch = {.lock = PTHREAD_MUTEX_INITIALIZER};

static unsigned port_of(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)(const void *)a)->sin_port);
    if (a->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)(const void *)a)->sin6_port);
    return 0;
}

/* Bytes the kernel received so far on this process's TCP connections with the source listening
 * on `port`: at the source's end of each (its local port is the source's), or at the
 * requester's (its peer's is). 0 when the descriptors cannot be listed. Called on a stream's
 * thread too: it asserts nothing. */
static uint64_t wire_received(unsigned port, int source_end)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return 0;
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int fd = atoi(de->d_name);
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || fd == dirfd(d))
            continue;
        struct sockaddr_storage mine, peer;
        socklen_t ml = sizeof mine, pl = sizeof peer;
        if (getsockname(fd, (struct sockaddr *)&mine, &ml) != 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
            continue; /* not a connected socket */
        if (port_of(source_end ? &mine : &peer) != port)
            continue;
        struct tcp_info ti;
        socklen_t tl = sizeof ti;
        memset(&ti, 0, sizeof ti);
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0)
            sum += ti.tcpi_bytes_received;
    }
    closedir(d);
    return sum;
}

static int early_arrived(void)
{
    if (watch.wire)
        return wire_received(watch.wire_port, watch.wire_source_end) >= watch.wire_base + MIB;
    return watch.early_done;
}

static uint64_t device_end_of(const struct fakecuda_copy *c)
{
    return c->kind == FAKECUDA_HTOD ? c->dst : c->src;
}

static int covers(const struct fakecuda_copy *c, uint64_t at)
{
    uint64_t dev = device_end_of(c);
    return at >= dev && at - dev < c->bytes;
}

static void staged_note(struct staged_hosts *s, const struct fakecuda_copy *c)
{
    uint64_t dev = device_end_of(c), host = c->kind == FAKECUDA_HTOD ? c->src : c->dst;
    if (s->kind != c->kind || dev < s->from || dev >= s->end)
        return;
    s->copied += c->bytes;
    for (size_t i = 0; i < s->n; i++)
        if (s->host[i].addr == host) {
            if (c->bytes > s->host[i].bytes)
                s->host[i].bytes = c->bytes;
            return;
        }
    if (s->n == WATCH_HOSTS) {
        s->overflow = 1;
        return;
    }
    s->host[s->n].addr = host;
    s->host[s->n].bytes = c->bytes;
    s->n++;
}

/* The stand-in's watcher, on a stream's thread. */
static void on_copy(const struct fakecuda_copy *c, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&watch.lock);
    if (c->done) {
        staged_note(&watch.out, c);
        staged_note(&watch.in, c);
        if (watch.overlap && c->kind == FAKECUDA_HTOD && covers(c, watch.early_at))
            watch.early_done = 1;
    } else if (watch.overlap && c->kind == FAKECUDA_DTOH && covers(c, watch.late_at) && !watch.late_seen) {
        watch.late_seen = 1;
        uint64_t deadline = orb_now_ns() + WATCH_WAIT;
        while (!early_arrived() && orb_now_ns() < deadline) {
            pthread_mutex_unlock(&watch.lock);
            nanosleep(&(struct timespec){0, 1000000}, NULL);
            pthread_mutex_lock(&watch.lock);
        }
        watch.early_before_late = early_arrived();
    }
    pthread_mutex_unlock(&watch.lock);
}

/* Watch the staging copies of `len` bytes from `from_at` of the sending side to `to_at` of the
 * receiving side (each on the device or not) between `req` and `src`, for `op`. */
static void watch_start(int checks, orb_engine *src, enum orb_op op, int from_dev, uint64_t from_at, int to_dev,
                        uint64_t to_at, size_t len)
{
    char ep[ORB_ENDPOINT_MAX];
    assert_int_equal(orb_engine_endpoint(src, ep, sizeof ep), 0);
    const char *colon = strrchr(ep, ':');
    assert_non_null(colon);
    pthread_mutex_lock(&watch.lock);
    watch.overlap = (checks & WATCH_OVERLAP) != 0;
    watch.early_at = to_at;
    watch.late_at = from_at + len - 1;
    watch.wire = !to_dev;
    watch.wire_source_end = op == ORB_OP_WRITE;
    watch.wire_port = (unsigned)atoi(colon + 1);
    watch.wire_base = watch.wire ? wire_received(watch.wire_port, watch.wire_source_end) : 0;
    watch.early_done = watch.late_seen = watch.early_before_late = 0;
    memset(&watch.out, 0, sizeof watch.out);
    memset(&watch.in, 0, sizeof watch.in);
    if (from_dev)
        watch.out = (struct staged_hosts){.kind = FAKECUDA_DTOH, .from = from_at, .end = from_at + len};
    if (to_dev)
        watch.in = (struct staged_hosts){.kind = FAKECUDA_HTOD, .from = to_at, .end = to_at + len};
    pthread_mutex_unlock(&watch.lock);
    fake.watch_copies(on_copy, NULL);
}

/* A staged side moved every byte of the request through fewer host bytes than the request and
 * no more than the staging bound: chunks were reused, so none was refilled before its bytes had
 * gone on (every byte arrives intact), and no copy of the whole request was ever made. */
static void check_bounded(const char *what, const struct staged_hosts *s, size_t len)
{
    if (s->kind == 0)
        return;
    uint64_t staged = 0;
    for (size_t i = 0; i < s->n; i++)
        staged += s->host[i].bytes;
    print_message("%s: %zu bytes staged %s through %zu host buffers of %llu bytes\n", what, len,
                  s->kind == FAKECUDA_DTOH ? "out" : "in", s->n, (unsigned long long)staged);
    assert_true(s->copied >= len);
    if (s->overflow || staged >= len || staged > STAGING_BOUND)
        fail_msg("%s: staged through %s%llu bytes of host memory (the pool holds %u): more than the pool, or no "
                 "chunk reused: the request was staged whole", what, s->overflow ? "more than " : "",
                 (unsigned long long)staged, STAGING_BOUND);
}

static void watch_stop_and_check(int checks, const char *what, size_t len)
{
    fake.watch_copies(NULL, NULL);
    pthread_mutex_lock(&watch.lock);
    watch.overlap = 0;
    int late_seen = watch.late_seen, early_before_late = watch.early_before_late, wire = watch.wire;
    static struct staged_hosts out, in; /* copies, checked with the lock free */
    out = watch.out;
    in = watch.in;
    pthread_mutex_unlock(&watch.lock);
    if (checks & WATCH_OVERLAP) {
        if (!late_seen)
            fail_msg("%s: no staging copy of the request's last bytes was seen", what);
        if (!early_before_late)
            fail_msg("%s: the request's first bytes had not reached the other side %s after %llu s while its "
                     "last bytes waited to be copied: staging copies and socket I/O do not overlap", what,
                     wire ? "(on the wire)" : "(in its device memory)", (unsigned long long)(WATCH_WAIT / EU_SEC));
    }
    if (checks & WATCH_BOUND) {
        check_bounded(what, &out, len);
        check_bounded(what, &in, len);
    }
}

/* ---- the TCP paths --------------------------------------------------------------------------- */

/* `op` of `len` bytes at offset `off` of each side's range, local and remote in the kinds
 * given, between fresh engines; both sides' whole allocations are checked afterwards. `checks`
 * (enum watch_checks, on the stand-in only) are made of the transfer's staging copies. */
static void transfer_and_check(orb_engine *src, orb_engine *req, orb_segment *seg, int local_dev, int remote_dev,
                               enum orb_op op, size_t len, size_t off, int checks)
{
    size_t span = len + off + 4096;
    struct side local, remote;
    side_new(req, local_dev, span, ORB_PERM_LOCAL, 0x11, &local);
    side_new(src, remote_dev, span, ORB_PERM_REMOTE_WRITE, 0x22, &remote);
    uint8_t *local_before = side_bytes(&local), *remote_before = side_bytes(&remote);
    char what[96];
    snprintf(what, sizeof what, "%s of %zu bytes (local %s, remote %s)", op == ORB_OP_READ ? "READ" : "WRITE", len,
             local_dev ? "device" : "host", remote_dev ? "device" : "host");

    if (real_driver)
        checks = 0;
    uint64_t local_at = local.base + off, remote_at = remote.base + off + 1;
    if (checks != 0 && op == ORB_OP_READ)
        watch_start(checks, src, op, remote_dev, remote_at, local_dev, local_at, len);
    else if (checks != 0)
        watch_start(checks, src, op, local_dev, local_at, remote_dev, remote_at, len);
    struct orb_request r = eu_req_at(op, local_at, remote_at, len);
    struct orb_batch_report rep;
    int rc = run(req, seg, &r, 1, &rep);
    if (checks != 0)
        watch_stop_and_check(checks, what, len);
    if (rc != 0)
        fail_msg("%s: %s", what, orb_last_error());
    assert_int_equal(rep.status, 0);
    assert_int_equal(rep.completed_bytes, len);

    /* Exactly the request's bytes moved; every other byte of both allocations is as it was (the
     * expected bytes are built in the before copies, one side checked at a time). */
    size_t total = span + 2 * GUARD;
    if (op == ORB_OP_READ)
        memcpy(local_before + GUARD + off, remote_before + GUARD + off + 1, len);
    else
        memcpy(remote_before + GUARD + off + 1, local_before + GUARD + off, len);
    uint8_t *after = side_bytes(&local);
    assert_memory_equal(after, local_before, total);
    free(after);
    after = side_bytes(&remote);
    assert_memory_equal(after, remote_before, total);
    free(after);
    free(local_before);
    free(remote_before);
    side_free(req, &local);
    side_free(src, &remote);
}

static void test_either_side_or_both_on_the_device(void **state)
{
    (void)state;
    orb_engine *src = source_engine();
    orb_engine *req = eu_requester(4, 2 * MIB);
    orb_segment *seg = eu_open(req, src);
    /* Below a chunk, one chunk and a byte, and several chunks across four stripes. */
    const size_t sizes[] = {1, 4097, MIB + 1, 5 * MIB + 12345};
    for (int local_dev = 0; local_dev <= 1; local_dev++)
        for (int remote_dev = 0; remote_dev <= 1; remote_dev++)
            for (int op = ORB_OP_READ; op <= ORB_OP_WRITE; op++)
                for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
                    transfer_and_check(src, req, seg, local_dev, remote_dev, (enum orb_op)op, sizes[k], 3 + k, 0);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* Many requests in one batch: more staged pieces than the pool has chunks, so pieces wait for
 * chunks that earlier pieces give back. */
static void test_a_batch_larger_than_the_pool(void **state)
{
    (void)state;
    long pinned_before = real_driver ? 0 : fake.counts().host_allocations;
    long blocking_before = real_driver ? 0 : fake.counts().blocking_streams;
    orb_engine *src = source_engine();
    orb_engine *req = eu_requester(2, 0);
    orb_segment *seg = eu_open(req, src);
    const size_t each = 3 * MIB + 5, n = 30; /* 120 chunks: about twice the pool */
    struct side local, remote;
    side_new(req, 1, each * n, ORB_PERM_LOCAL, 0x33, &local);
    side_new(src, 1, each * n, ORB_PERM_REMOTE_WRITE, 0x44, &remote);
    uint8_t *remote_before = side_bytes(&remote);
    struct orb_request r[30];
    for (size_t i = 0; i < n; i++)
        r[i] = eu_req_at(ORB_OP_READ, local.base + i * each, remote.base + (n - 1 - i) * each, each);
    struct orb_batch_report rep;
    assert_int_equal(run(req, seg, r, n, &rep), 0);
    assert_int_equal(rep.completed_requests, n);
    uint8_t *local_after = side_bytes(&local);
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(local_after + GUARD + i * each, remote_before + GUARD + (n - 1 - i) * each, each);
    free(local_after);
    /* And back the other way, as WRITEs. */
    for (size_t i = 0; i < n; i++)
        r[i] = eu_req_at(ORB_OP_WRITE, local.base + i * each, remote.base + i * each, each);
    uint8_t *local_now = side_bytes(&local);
    assert_int_equal(run(req, seg, r, n, &rep), 0);
    uint8_t *remote_after = side_bytes(&remote);
    assert_memory_equal(remote_after + GUARD, local_now + GUARD, each * n);
    free(remote_after);
    free(local_now);
    free(remote_before);
    if (!real_driver) {
        /* Staging is pinned host memory from each engine's pool: the requester's at most the 60
         * chunks of its 64 that requests may take (4 are the engine's as a source), and the
         * source's, per connection (two stripes), one chunk for a WRITE's payload and one for a
         * READ's answer at most. */
        long pinned = fake.counts().host_allocations - pinned_before;
        assert_true(pinned >= 2);
        assert_true(pinned <= 60 + 2 * 2);
        assert_int_equal(fake.counts().blocking_streams, blocking_before); /* every copy stream non-blocking */
    }
    side_free(req, &local);
    side_free(src, &remote);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(src);
    if (!real_driver) /* all of it freed with the engines */
        assert_int_equal(fake.counts().host_allocations, pinned_before);
}

/* ---- pipelining ------------------------------------------------------------------------------ */

/* `op` with the sending side on the device and the receiving side on the device or in host
 * memory (fresh engines each), over one stripe: the request's pieces go in order over one
 * connection, so that a pipelined path delivers its first bytes whatever the copy of the last
 * waits for. 41 chunks, fewer than the pool holds: only overlap, not the bound, sends the first
 * early. */
static void expect_overlap(enum orb_op op, int receiver_dev)
{
    orb_engine *src = source_engine();
    orb_engine *req = eu_requester(1, 0);
    orb_segment *seg = eu_open(req, src);
    int local_dev = op == ORB_OP_WRITE ? 1 : receiver_dev, remote_dev = op == ORB_OP_WRITE ? receiver_dev : 1;
    transfer_and_check(src, req, seg, local_dev, remote_dev, op, 40 * MIB + 12345, 3, WATCH_OVERLAP);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* A WRITE out of device memory is not copied whole before it is sent: its first chunk has
 * reached the source (its socket; with device memory there, that memory, through the source's
 * own staging) before the requester copies the last one out of its device. */
static void test_a_write_sends_its_first_chunk_before_its_last_is_copied(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* the copy watcher is the stand-in's */
    expect_overlap(ORB_OP_WRITE, 0);
    expect_overlap(ORB_OP_WRITE, 1);
}

/* A READ of device memory: the source sends a chunk while it copies the next, so the first chunk
 * has reached the requester (its socket; with device memory there, that memory, through the
 * requester's staging, which copies each chunk to its device as it arrives) before the source
 * copies the last one out of its device. */
static void test_a_read_sends_its_first_chunk_before_its_last_is_copied(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* the copy watcher is the stand-in's */
    expect_overlap(ORB_OP_READ, 0);
    expect_overlap(ORB_OP_READ, 1);
}

/* A single request larger than the staging pool, either way, with the device on either side,
 * completes with every byte in place: staging holds a bounded part of it at a time (on the
 * stand-in: the staged side's copies reuse fewer host bytes than the request), never all of it.
 * Two stripes: the source stages two connections' frames at once. */
static void test_a_request_larger_than_the_staging_pool(void **state)
{
    (void)state;
    orb_engine *src = source_engine();
    orb_engine *req = eu_requester(2, 0);
    orb_segment *seg = eu_open(req, src);
    const size_t big = 80 * MIB + 12345;
    /* The requester's pool, out of and into the device; the source's chunks, likewise. */
    transfer_and_check(src, req, seg, 1, 0, ORB_OP_WRITE, big, 5, WATCH_BOUND);
    transfer_and_check(src, req, seg, 1, 0, ORB_OP_READ, big, 7, WATCH_BOUND);
    transfer_and_check(src, req, seg, 0, 1, ORB_OP_READ, big, 11, WATCH_BOUND);
    transfer_and_check(src, req, seg, 0, 1, ORB_OP_WRITE, big, 13, WATCH_BOUND);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* ---- failures -------------------------------------------------------------------------------- */

/* A failed copy fails its request, names the cause, and leaves the engines working. */
static void expect_copy_failure(orb_engine *src, orb_engine *req, orb_segment *seg, int local_dev, int remote_dev,
                                enum orb_op op, const char *export, const char *cause, enum orb_remote_effect effect)
{
    struct side local, remote;
    side_new(req, local_dev, 2 * MIB, ORB_PERM_LOCAL, 0x55, &local);
    side_new(src, remote_dev, 2 * MIB, ORB_PERM_REMOTE_WRITE, 0x66, &remote);
    struct orb_request r = eu_req_at(op, local.base, remote.base, MIB - 7); /* one piece, one chunk */
    struct orb_batch_report rep;
    fake.fail_nth(export, 1, 999 /* CUDA_ERROR_UNKNOWN */);
    int rc = run(req, seg, &r, 1, &rep);
    fake.fail_nth(export, 0, 0);
    assert_int_not_equal(rc, 0);
    if (strstr(orb_last_error(), cause) == NULL)
        fail_msg("the failure does not name \"%s\": %s", cause, orb_last_error());
    assert_int_equal(rep.completed_requests, 0);
    assert_int_equal(rep.failure.remote_effect, effect);
    /* The same transfer works once the device does, on the same connection. */
    assert_int_equal(run(req, seg, &r, 1, &rep), 0);
    assert_int_equal(rep.completed_bytes, MIB - 7);
    side_free(req, &local);
    side_free(src, &remote);
}

static void test_a_failed_copy_fails_only_its_request(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* fault injection is the stand-in's */
    orb_engine *src = source_engine();
    orb_engine *req = eu_requester(1, 0);
    orb_segment *seg = eu_open(req, src);
    /* The requester's staging: a WRITE's copy out of the device, a READ's copy into it. */
    expect_copy_failure(src, req, seg, 1, 0, ORB_OP_WRITE, "cuMemcpyDtoHAsync_v2", "copying a WRITE's bytes",
                        ORB_REMOTE_EFFECT_NONE);
    expect_copy_failure(src, req, seg, 1, 0, ORB_OP_READ, "cuMemcpyHtoDAsync_v2", "copying a READ's bytes",
                        ORB_REMOTE_EFFECT_NONE);
    expect_copy_failure(src, req, seg, 1, 0, ORB_OP_READ, "cuEventSynchronize", "cuEventSynchronize",
                        ORB_REMOTE_EFFECT_NONE);
    /* The source's: a READ's first chunk is refused with an ERROR. */
    expect_copy_failure(src, req, seg, 0, 1, ORB_OP_READ, "cuMemcpyDtoHAsync_v2", "copying the READ's bytes",
                        ORB_REMOTE_EFFECT_NONE);
    /* A WRITE's chunk into source device memory: the rest is drained and the ERROR says some of
     * its bytes may have landed. */
    expect_copy_failure(src, req, seg, 0, 1, ORB_OP_WRITE, "cuMemcpyHtoDAsync_v2", "copying the WRITE's bytes",
                        ORB_REMOTE_EFFECT_UNKNOWN);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(src);
    struct orb_cuda_retained kept;
    assert_int_equal(orb_cuda_retained_resources(&kept), 0);
    assert_int_equal(kept.device_allocations, 0); /* every failed copy drained its stream */
}

/* The `nth` copy's wait from now fails, and so does the drain after it: its end is unproven
 * (0: nothing fails any more). */
static void fail_a_copys_end(unsigned long long nth)
{
    fake.fail_nth("cuEventSynchronize", nth, nth != 0 ? 999 : 0);
    fake.fail_nth("cuStreamSynchronize", nth != 0 ? 1 : 0, nth != 0 ? 999 : 0);
}

/* The fenced allocation `dev` let go (by the application; kept by the library), the engines freed:
 * exactly one pinned chunk and one device allocation more are retained than `before`. */
static void end_with_one_chunk_kept(orb_engine *req, orb_engine *src, orb_segment *seg, orb_engine *owner,
                                    orb_reg_id id, orb_cuda_memory *dev, const struct orb_cuda_retained *before)
{
    assert_int_equal(orb_unregister_memory(owner, id), 0);
    orb_cuda_memory_unref(dev);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(src);
    struct orb_cuda_retained kept;
    assert_int_equal(orb_cuda_retained_resources(&kept), 0);
    assert_int_equal(kept.host_allocations - before->host_allocations, 1);
    assert_int_equal(kept.device_allocations - before->device_allocations, 1);
}

/* One staging copy whose end cannot be proven keeps its chunk and fences its allocation, and
 * nothing more: the request's later pieces, refused at once by the fenced allocation, give
 * their chunks back, so the request ends (ORB_EUNQUIESCED) instead of waiting for a pool that
 * emptied, and the next request, on another allocation, runs. One chunk is kept for good. */
static void test_an_unproven_copy_keeps_one_chunk(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* fault injection is the stand-in's */
    long pinned_before = fake.counts().host_allocations;
    struct orb_cuda_retained before;
    assert_int_equal(orb_cuda_retained_resources(&before), 0);
    orb_engine *src = source_engine();
    orb_engine *req = eu_requester(2, 0);
    orb_segment *seg = eu_open(req, src);
    const size_t big = 80 * MIB; /* more chunks than the pool's 64 */
    struct side fenced, remote, healthy, remote2;
    side_new(req, 1, big, ORB_PERM_LOCAL, 0x71, &fenced);
    side_new(src, 0, big, ORB_PERM_REMOTE_WRITE, 0x72, &remote);
    side_new(req, 1, 2 * MIB, ORB_PERM_LOCAL, 0x73, &healthy);
    side_new(src, 0, 2 * MIB, ORB_PERM_REMOTE_WRITE, 0x74, &remote2);
    for (int op = 0; op < 2; op++) {
        struct orb_request r = eu_req_at(op ? ORB_OP_WRITE : ORB_OP_READ, fenced.base, remote.base, big);
        struct orb_batch_report rep;
        if (op == 0)
            fail_a_copys_end(3);
        uint64_t t0 = orb_now_ns();
        int rc = run(req, seg, &r, 1, &rep);
        fail_a_copys_end(0);
        print_message("%s of the fenced allocation: %d (%s) in %.1f s\n", op ? "WRITE" : "READ", rc, orb_last_error(),
                      (double)(orb_now_ns() - t0) / 1e9);
        assert_int_equal(rc, ORB_EUNQUIESCED);
        assert_int_equal(rep.done, 1);
        assert_int_equal(rep.completed_requests, 0);
        /* Another allocation's request runs at once, through the pool. */
        struct orb_request ok = eu_req_at(op ? ORB_OP_WRITE : ORB_OP_READ, healthy.base, remote2.base, 2 * MIB);
        if (run(req, seg, &ok, 1, &rep) != 0)
            fail_msg("a request on a healthy allocation after the fence: %s", orb_last_error());
    }
    side_free(req, &healthy);
    side_free(src, &remote2);
    side_free(src, &remote);
    end_with_one_chunk_kept(req, src, seg, req, fenced.id, fenced.dev, &before);
    /* Every pinned chunk is freed with the engines but the one the unproven copy used. */
    assert_int_equal(fake.counts().host_allocations - pinned_before, 1);
}

/* The source's side of the same rule: a READ of source device memory whose first chunk's copy
 * cannot be proven to end is refused with ORB_EUNQUIESCED, the source keeps that chunk (counted
 * as retained) and the allocation, and the connection serves the next request, of another
 * allocation. */
static void test_an_unproven_copy_at_the_source(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* fault injection is the stand-in's */
    struct orb_cuda_retained before;
    assert_int_equal(orb_cuda_retained_resources(&before), 0);
    orb_engine *src = source_engine();
    orb_engine *req = eu_requester(1, 0);
    orb_segment *seg = eu_open(req, src);
    struct side local, fenced, healthy;
    side_new(req, 0, 4 * MIB, ORB_PERM_LOCAL, 0x81, &local);
    side_new(src, 1, 4 * MIB, ORB_PERM_REMOTE_WRITE, 0x82, &fenced);
    side_new(src, 1, 4 * MIB, ORB_PERM_REMOTE_WRITE, 0x83, &healthy);
    uint8_t *local_before = side_bytes(&local);
    struct orb_request r = eu_req_at(ORB_OP_READ, local.base, fenced.base, 2 * MIB);
    struct orb_batch_report rep;
    fail_a_copys_end(1); /* the first chunk's */
    int rc = run(req, seg, &r, 1, &rep);
    fail_a_copys_end(0);
    assert_int_equal(rc, ORB_EUNQUIESCED);
    assert_non_null(strstr(orb_last_error(), "draining the copy stream failed too"));
    assert_int_equal(rep.completed_requests, 0);
    uint8_t *local_after = side_bytes(&local);
    assert_memory_equal(local_after, local_before, 4 * MIB + 2 * GUARD); /* nothing landed */
    free(local_after);
    free(local_before);
    /* The same connection serves another allocation. */
    r = eu_req_at(ORB_OP_READ, local.base, healthy.base, 2 * MIB);
    if (run(req, seg, &r, 1, &rep) != 0)
        fail_msg("a READ of another allocation after: %s", orb_last_error());
    side_free(src, &healthy);
    side_free(req, &local);
    end_with_one_chunk_kept(req, src, seg, src, fenced.id, fenced.dev, &before);
}

/* ---- range loans ---------------------------------------------------------------------------- */

/* A request that writes device bytes has them to itself: an overlapping request in flight (or
 * in the same submission) is refused, while reads share. A copy to the engine itself through
 * its own source is held to the same rule across its two sides. */
static void test_overlapping_device_access_is_refused(void **state)
{
    (void)state;
    orb_engine *e = source_engine(); /* source and requester at once: a copy to itself */
    orb_segment *self = eu_open(e, e);
    struct side dev, host;
    side_new(e, 1, 4 * MIB, ORB_PERM_REMOTE_WRITE, 0x31, &dev);
    side_new(e, 0, 4 * MIB, ORB_PERM_REMOTE_WRITE, 0x32, &host);
    struct orb_batch_report rep;

    /* Two READs into overlapping device bytes in one submission: the second is refused and
     * the submission with it, before anything moves. */
    struct orb_request two[2] = {eu_req_at(ORB_OP_READ, dev.base, host.base, MIB),
                                 eu_req_at(ORB_OP_READ, dev.base + MIB - 1, host.base + 2 * MIB, MIB)};
    memset(&rep, 0, sizeof rep);
    assert_int_equal(orb_submit_and_wait(e, self, two, 2, NULL, 10 * EU_SEC, &rep), ORB_EBUSY);
    assert_non_null(strstr(orb_last_error(), "request 1"));
    assert_non_null(strstr(orb_last_error(), "in use"));
    /* A READ into them and a WRITE out of them conflict too; two WRITEs out of them share. */
    two[1] = eu_req_at(ORB_OP_WRITE, dev.base + 17, host.base + 2 * MIB, MIB);
    assert_int_equal(orb_submit_and_wait(e, self, two, 2, NULL, 10 * EU_SEC, &rep), ORB_EBUSY);
    two[0] = eu_req_at(ORB_OP_WRITE, dev.base, host.base, MIB);
    assert_int_equal(run(e, self, two, 2, &rep), 0);
    assert_int_equal(rep.completed_requests, 2);
    /* Adjacent ranges do not overlap. */
    two[0] = eu_req_at(ORB_OP_READ, dev.base, host.base, MIB);
    two[1] = eu_req_at(ORB_OP_READ, dev.base + MIB, host.base + MIB, MIB);
    assert_int_equal(run(e, self, two, 2, &rep), 0);

    /* To itself: READ device [0, 1 MiB) from device [512 KiB, +1 MiB) of the same allocation.
     * The requester lends the target (it writes it), the source the origin (it reads it): the
     * source refuses the overlap, and the request fails without a byte moved. */
    uint8_t *before = side_bytes(&dev);
    struct orb_request r = eu_req_at(ORB_OP_READ, dev.base, dev.base + MIB / 2, MIB);
    assert_int_equal(run(e, self, &r, 1, &rep), ORB_EBUSY);
    assert_non_null(strstr(orb_last_error(), "in use"));
    uint8_t *after = side_bytes(&dev);
    assert_memory_equal(after, before, 4 * MIB + 2 * GUARD);
    free(after);
    /* Apart, the same copy works, and the loans are all back: the overlap works now as two
     * separate steps. */
    r = eu_req_at(ORB_OP_READ, dev.base, dev.base + 2 * MIB, MIB);
    assert_int_equal(run(e, self, &r, 1, &rep), 0);
    after = side_bytes(&dev);
    assert_memory_equal(after + GUARD, before + GUARD + 2 * MIB, MIB);
    free(after);
    free(before);

    side_free(e, &dev);
    side_free(e, &host);
    orb_segment_close(self);
    orb_engine_free(e);
}

/* ---- concurrency and close ------------------------------------------------------------------- */

struct caller {
    orb_engine *req, *src;
    orb_segment *seg;
    int index;
    int failures;
};

static void *caller_main(void *arg)
{
    struct caller *c = arg;
    const size_t sizes[3] = {4093, MIB + 17, 3 * MIB + 4099};
    for (int round = 0; round < 4; round++)
        for (size_t k = 0; k < 3; k++) {
            size_t len = sizes[k];
            struct side local, remote;
            side_new(c->req, 1, len, ORB_PERM_LOCAL, (uint8_t)(c->index * 7 + round), &local);
            side_new(c->src, (c->index + round) % 2, len, ORB_PERM_REMOTE_WRITE, (uint8_t)(c->index * 7 + round + 1),
                     &remote);
            struct side back;
            side_new(c->req, 1, len, ORB_PERM_LOCAL, (uint8_t)(c->index * 7 + round + 2), &back);
            uint8_t *want = side_bytes(&local);
            struct orb_request r = eu_req_at(ORB_OP_WRITE, local.base, remote.base, len);
            struct orb_batch_report rep;
            if (run(c->req, c->seg, &r, 1, &rep) != 0)
                c->failures++;
            r = eu_req_at(ORB_OP_READ, back.base, remote.base, len); /* what landed, read back */
            if (run(c->req, c->seg, &r, 1, &rep) != 0)
                c->failures++;
            uint8_t *got = side_bytes(&remote), *got_back = side_bytes(&back);
            if (memcmp(got + GUARD, want + GUARD, len) != 0 || memcmp(got_back + GUARD, want + GUARD, len) != 0)
                c->failures++;
            free(got);
            free(got_back);
            free(want);
            side_free(c->req, &back);
            side_free(c->req, &local);
            side_free(c->src, &remote);
        }
    return NULL;
}

static void test_eight_concurrent_callers(void **state)
{
    (void)state;
    orb_engine *src = source_engine();
    orb_engine *req = eu_requester(2, 0);
    orb_segment *seg = eu_open(req, src);
    struct caller callers[8];
    pthread_t threads[8];
    for (int i = 0; i < 8; i++) {
        callers[i] = (struct caller){.req = req, .src = src, .seg = seg, .index = i};
        assert_int_equal(pthread_create(&threads[i], NULL, caller_main, &callers[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(threads[i], NULL);
        assert_int_equal(callers[i].failures, 0);
    }
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* Closing the requester's engine while staged pieces wait for chunks and copies are slow: the
 * batch settles (nothing hangs), every chunk comes back, nothing is retained. */
static void test_close_with_staged_work_in_flight(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* slow streams are the stand-in's */
    struct orb_cuda_retained before; /* what earlier cells kept on purpose */
    assert_int_equal(orb_cuda_retained_resources(&before), 0);
    orb_engine *src = source_engine();
    orb_engine *req = eu_requester(2, 0);
    orb_segment *seg = eu_open(req, src);
    struct side local, remote;
    side_new(req, 1, 96 * MIB, ORB_PERM_LOCAL, 0x77, &local);
    side_new(src, 0, 96 * MIB, ORB_PERM_REMOTE_WRITE, 0x78, &remote);
    struct orb_request r[2] = {eu_req_at(ORB_OP_WRITE, local.base, remote.base, 48 * MIB),
                               eu_req_at(ORB_OP_READ, local.base + 48 * MIB, remote.base + 48 * MIB, 48 * MIB)};
    orb_batch *b = NULL;
    assert_int_equal(orb_batch_open(req, seg, &b), 0);
    fake.slow_streams(300);
    assert_int_equal(orb_batch_submit(b, r, 2), 0);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    assert_int_equal(orb_engine_close(req, 2 * EU_SEC), 0);
    fake.slow_streams(0);
    struct orb_batch_report rep;
    int rc = orb_batch_wait(b, 10 * EU_SEC, &rep);
    assert_int_not_equal(rc, ORB_ETIMEDOUT);
    assert_int_equal(rep.done, 1);
    assert_true(rep.completed_requests <= 2);
    if (rep.completed_requests < 2)
        assert_int_not_equal(rep.status, 0);
    assert_int_equal(rep.local_drained, 1);
    orb_batch_free(b);
    orb_segment_close(seg);
    (void)orb_unregister_memory(req, local.id); /* the closed engine may refuse: freeing retires it */
    orb_cuda_memory_unref(local.dev);
    orb_engine_free(req);
    side_free(src, &remote);
    orb_engine_free(src);
    struct orb_cuda_retained kept;
    assert_int_equal(orb_cuda_retained_resources(&kept), 0);
    assert_int_equal(kept.device_allocations, before.device_allocations);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_ranges_register_as_host_ranges_do),
        cmocka_unit_test(test_either_side_or_both_on_the_device),
        cmocka_unit_test(test_a_batch_larger_than_the_pool),
        cmocka_unit_test(test_a_write_sends_its_first_chunk_before_its_last_is_copied),
        cmocka_unit_test(test_a_read_sends_its_first_chunk_before_its_last_is_copied),
        cmocka_unit_test(test_a_request_larger_than_the_staging_pool),
        cmocka_unit_test(test_a_failed_copy_fails_only_its_request),
        cmocka_unit_test(test_an_unproven_copy_keeps_one_chunk),
        cmocka_unit_test(test_an_unproven_copy_at_the_source),
        cmocka_unit_test(test_overlapping_device_access_is_refused),
        cmocka_unit_test(test_eight_concurrent_callers),
        cmocka_unit_test(test_close_with_staged_work_in_flight),
    };
    /* ORBITE_TEST_FILTER: run only the cells it matches (a cmocka test filter, '*' globbing). */
    if (getenv("ORBITE_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("ORBITE_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, NULL);
}
