/*
 * cuda_copy: device memory through OrbiTE, checked byte for byte.
 *
 *   cuda_copy [REQUESTER_DEVICE [SOURCE_DEVICE]]      (ordinals among the visible devices; 0 0)
 *
 * One process plays both roles over loopback TCP: a source engine publishes device memory of
 * SOURCE_DEVICE, a requester engine moves device memory of REQUESTER_DEVICE to and from it.
 * Eight threads share the two engines and one segment; each runs four rounds of three unaligned
 * sizes, and in each: fills its local device range with a pattern, WRITEs it into its remote
 * device range, checks the remote bytes, puts a second pattern there, READs it back and checks
 * the local bytes. Every range sits between guard bytes that must not change. The bytes go
 * through host staging on both sides (the requester's pool, the source's connection chunks).
 *
 * Exits 0 when every check held, 77 when no CUDA driver or device is there, 1 otherwise.
 */
#include <orbite/orbite.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8
#define ROUNDS 4
#define GUARD 4096u
#define LOCAL_OFF 3u  /* unaligned starts on both sides */
#define REMOTE_OFF 5u
#define TIMEOUT_NS (30ull * 1000 * 1000 * 1000)

static const size_t sizes[3] = {4093, (1u << 20) + 17, (3u << 20) + 4099};
#define MAX_LEN ((3u << 20) + 4099)
#define SPAN (MAX_LEN + 2 * GUARD + 16)

static int requester_device, source_device;
static orb_engine *source, *requester;
static orb_segment *segment;

struct caller {
    int index;
    int failed;
    char why[256];
};

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

/* Record the first failure of caller `c`. Returns 1 so that callers can `return fail(...)`. */
static int fail(struct caller *c, const char *what, int status)
{
    if (!c->failed)
        snprintf(c->why, sizeof c->why, "%s: %s (%s)", what, status != 0 ? orb_strerror(status) : "mismatch",
                 status != 0 ? orb_last_error() : "the bytes differ");
    c->failed = 1;
    return 1;
}

static int transfer(enum orb_op op, uint64_t local, uint64_t remote, size_t len)
{
    struct orb_request r;
    memset(&r, 0, sizeof r);
    r.op = op;
    r.local_addr = local;
    r.remote_addr = remote;
    r.length = len;
    struct orb_batch_report report;
    int rc = orb_submit_and_wait(requester, segment, &r, 1, NULL, TIMEOUT_NS, &report);
    if (rc == 0 && (report.has_failure || report.completed_bytes != len))
        rc = report.has_failure ? report.failure.status : ORB_EPROTO;
    return rc;
}

/* Whether `got` (the whole span of a device allocation) holds `want` at `off` and `guard` bytes
 * everywhere else. */
static int span_ok(const uint8_t *got, const uint8_t *want, size_t off, size_t len, uint8_t guard)
{
    for (size_t i = 0; i < SPAN; i++) {
        uint8_t expected = i >= off && i < off + len ? want[i - off] : guard;
        if (got[i] != expected)
            return 0;
    }
    return 1;
}

static int one_round(struct caller *c, orb_cuda_memory *local, orb_cuda_memory *remote, uint8_t *pattern,
                     uint8_t *bytes, size_t len, uint32_t seed)
{
    uint64_t local_addr = orb_cuda_memory_ptr(local) + GUARD + LOCAL_OFF;
    uint64_t remote_addr = orb_cuda_memory_ptr(remote) + GUARD + REMOTE_OFF;
    int rc;
    /* Guards everywhere, then the pattern in the local range. */
    memset(bytes, 0xa5, SPAN);
    if ((rc = orb_cuda_memory_copy_in(local, 0, bytes, SPAN)) != 0)
        return fail(c, "orb_cuda_memory_copy_in (local guards)", rc);
    memset(bytes, 0x5a, SPAN);
    if ((rc = orb_cuda_memory_copy_in(remote, 0, bytes, SPAN)) != 0)
        return fail(c, "orb_cuda_memory_copy_in (remote guards)", rc);
    fill(pattern, len, seed);
    if ((rc = orb_cuda_memory_copy_in(local, GUARD + LOCAL_OFF, pattern, len)) != 0)
        return fail(c, "orb_cuda_memory_copy_in (pattern)", rc);

    if ((rc = transfer(ORB_OP_WRITE, local_addr, remote_addr, len)) != 0)
        return fail(c, "WRITE device -> remote device", rc);
    if ((rc = orb_cuda_memory_copy_out(remote, 0, bytes, SPAN)) != 0)
        return fail(c, "orb_cuda_memory_copy_out (remote)", rc);
    if (!span_ok(bytes, pattern, GUARD + REMOTE_OFF, len, 0x5a))
        return fail(c, "the remote bytes after WRITE", 0);

    fill(pattern, len, seed ^ 0x5eedu);
    if ((rc = orb_cuda_memory_copy_in(remote, GUARD + REMOTE_OFF, pattern, len)) != 0)
        return fail(c, "orb_cuda_memory_copy_in (second pattern)", rc);
    if ((rc = transfer(ORB_OP_READ, local_addr, remote_addr, len)) != 0)
        return fail(c, "READ remote device -> device", rc);
    if ((rc = orb_cuda_memory_copy_out(local, 0, bytes, SPAN)) != 0)
        return fail(c, "orb_cuda_memory_copy_out (local)", rc);
    if (!span_ok(bytes, pattern, GUARD + LOCAL_OFF, len, 0xa5))
        return fail(c, "the local bytes after READ", 0);
    return 0;
}

static void *caller_main(void *arg)
{
    struct caller *c = arg;
    orb_cuda_memory *local = NULL, *remote = NULL;
    uint8_t *pattern = malloc(MAX_LEN), *bytes = malloc(SPAN);
    orb_reg_id local_id = 0, remote_id = 0;
    int rc;
    if (pattern == NULL || bytes == NULL) {
        fail(c, "malloc", ORB_ENOMEM);
        goto free_buffers;
    }
    if ((rc = orb_cuda_memory_alloc(requester_device, SPAN, &local)) != 0 ||
        (rc = orb_cuda_memory_alloc(source_device, SPAN, &remote)) != 0) {
        fail(c, "orb_cuda_memory_alloc", rc);
        goto free_memory;
    }
    if ((rc = orb_register_cuda_memory(requester, local, GUARD, MAX_LEN + 16, ORB_PERM_LOCAL, &local_id)) != 0 ||
        (rc = orb_register_cuda_memory(source, remote, GUARD, MAX_LEN + 16, ORB_PERM_REMOTE_WRITE, &remote_id)) != 0) {
        fail(c, "orb_register_cuda_memory", rc);
        goto unregister;
    }
    for (int round = 0; round < ROUNDS && !c->failed; round++)
        for (size_t k = 0; k < 3 && !c->failed; k++)
            one_round(c, local, remote, pattern, bytes, sizes[k], (uint32_t)(c->index * 100 + round * 10 + (int)k));
unregister:
    if (local_id != 0)
        orb_unregister_memory(requester, local_id);
    if (remote_id != 0)
        orb_unregister_memory(source, remote_id);
free_memory:
    orb_cuda_memory_unref(local);
    orb_cuda_memory_unref(remote);
free_buffers:
    free(pattern);
    free(bytes);
    return NULL;
}

static int parse_device(const char *s, int *out)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < 0 || v > 1024)
        return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 3 || (argc > 1 && parse_device(argv[1], &requester_device) != 0) ||
        (argc > 2 && parse_device(argv[2], &source_device) != 0)) {
        fprintf(stderr, "usage: %s [REQUESTER_DEVICE [SOURCE_DEVICE]]\n", argv[0]);
        return 2;
    }
    /* A machine without a CUDA driver or device skips. */
    orb_cuda_memory *probe = NULL;
    int rc = orb_cuda_memory_alloc(requester_device, 4096, &probe);
    if (rc == ORB_EUNAVAILABLE) {
        printf("cuda_copy: skipped: %s\n", orb_last_error());
        return 77;
    }
    if (rc != 0) {
        fprintf(stderr, "cuda_copy: device %d: %s (%s)\n", requester_device, orb_strerror(rc), orb_last_error());
        return 1;
    }
    orb_cuda_memory_unref(probe);

    struct orb_engine_config cfg;
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    if ((rc = orb_engine_config_init(&cfg)) != 0 || (rc = orb_engine_create(&cfg, &source)) != 0)
        goto engine_failed;
    cfg.enable_source = 0;
    cfg.tcp_stripes = 2;
    if ((rc = orb_engine_create(&cfg, &requester)) != 0 || (rc = orb_engine_endpoint(source, endpoint, sizeof endpoint)) != 0 ||
        (rc = orb_engine_source_epoch(source, &epoch)) != 0 ||
        (rc = orb_open_segment(requester, endpoint, &epoch, TIMEOUT_NS, &segment)) != 0)
        goto engine_failed;

    struct caller callers[THREADS];
    pthread_t threads[THREADS];
    int started = 0;
    for (int i = 0; i < THREADS; i++) {
        callers[i] = (struct caller){.index = i};
        if (pthread_create(&threads[i], NULL, caller_main, &callers[i]) != 0)
            break;
        started++;
    }
    int failures = started == THREADS ? 0 : 1;
    for (int i = 0; i < started; i++) {
        pthread_join(threads[i], NULL);
        if (callers[i].failed) {
            fprintf(stderr, "cuda_copy: caller %d: %s\n", i, callers[i].why);
            failures++;
        }
    }
    orb_segment_close(segment);
    orb_engine_free(requester);
    orb_engine_free(source);
    struct orb_cuda_retained kept;
    if (orb_cuda_retained_resources(&kept) == 0 && (kept.device_allocations != 0 || kept.contexts != 0)) {
        fprintf(stderr, "cuda_copy: failed cleanup kept %llu device allocations\n",
                (unsigned long long)kept.device_allocations);
        failures++;
    }
    if (failures != 0)
        return 1;
    printf("cuda_copy: %d callers x %d rounds x 3 sizes (%zu, %zu, %zu bytes), device %d <-> device %d over TCP: "
           "every byte checked\n", THREADS, ROUNDS, sizes[0], sizes[1], sizes[2], requester_device, source_device);
    return 0;

engine_failed:
    fprintf(stderr, "cuda_copy: setting up the engines failed: %s (%s)\n", orb_strerror(rc), orb_last_error());
    orb_segment_close(segment);
    orb_engine_free(requester);
    orb_engine_free(source);
    return 1;
}
