/* The NVLink (CUDA IPC) transport through whole engines on the fakecuda stand-in as the
 * process's driver: device bytes both ways at unaligned sizes, in one process (the source's
 * address copied directly) and between two processes (the source's allocation imported once and
 * cached); which requests ORB_TRANSPORT_UNSPEC gives it; the source's authority (only whole
 * allocations registered with remote write permission, the request's own permission, device
 * memory only); overlapping self-peer copies refused; and a group whose end the source does not
 * acknowledge failing as a whole. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "cuda/cuda.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_memory.h"
#include "core/clock.h"
#include "core/engine.h"
#include "core/engine_internal.h"
#include "core/transport.h"
#include "fakecuda.h"
#include "fakecuda_vmm.h"
#include "nvlink/nvlink_internal.h"
#include "nvlink/nvlink_msg.h"
#include "util.h"

#define MIB (1u << 20)

static struct fakecuda_controls fake;
static int real_driver;

static int setup(void **state)
{
    (void)state;
    const char *driver = getenv("ORBITE_CUDA_DRIVER");
    real_driver = driver != NULL && strcmp(driver, "real") == 0;
    const struct orb_cuda *cu = NULL;
    if ((!real_driver && orb_cuda_use_library(FAKECUDA_FULL) != 0) || orb_cuda_get(&cu) != 0)
        return -1;
    return real_driver ? 0 : fakecuda_controls_load(FAKECUDA_FULL, &fake);
}

/* A device allocation of `len` bytes holding seed's pattern, registered [offset, +reg_len). */
struct dev {
    orb_cuda_memory *mem;
    uint64_t base;                 /* the allocation's first byte */
    size_t len;
    orb_reg_id id;
};

static void dev_new(orb_engine *e, size_t len, size_t offset, size_t reg_len, enum orb_perm perm, uint8_t seed,
                    struct dev *d)
{
    memset(d, 0, sizeof *d);
    d->len = len;
    assert_int_equal(orb_cuda_memory_alloc(0, len, &d->mem), 0);
    uint8_t *pattern = malloc(len);
    assert_non_null(pattern);
    eu_fill(pattern, len, seed);
    assert_int_equal(orb_cuda_memory_from_host(d->mem, 0, pattern, len), 0);
    free(pattern);
    d->base = orb_cuda_memory_ptr(d->mem);
    assert_int_equal(orb_register_cuda_memory(e, d->mem, offset, reg_len, perm, &d->id), 0);
}

static uint8_t *dev_bytes(const struct dev *d)
{
    uint8_t *b = malloc(d->len);
    assert_non_null(b);
    assert_int_equal(orb_cuda_memory_to_host(d->mem, 0, b, d->len), 0);
    return b;
}

static void dev_free(orb_engine *e, struct dev *d)
{
    assert_int_equal(orb_unregister_memory(e, d->id), 0);
    orb_cuda_memory_unref(d->mem);
}

static struct orb_request nvl_req(enum orb_transport t, enum orb_op op, uint64_t local, uint64_t remote, uint64_t len)
{
    struct orb_request r = eu_req_at(op, local, remote, len);
    r.transport = t;
    return r;
}

static int run(orb_engine *req, orb_segment *seg, const struct orb_request *r, size_t n, struct orb_batch_report *out)
{
    memset(out, 0, sizeof *out);
    int rc = orb_submit_and_wait(req, seg, r, n, NULL, 30 * EU_SEC, out);
    if (rc == 0 && out->has_failure)
        rc = out->failure.status;
    return rc;
}

/* Whether [off, +len) of `got` is `want`'s and everything else `orig`'s. */
static void assert_spliced(const uint8_t *got, const uint8_t *orig, const uint8_t *want, size_t total, size_t off,
                           size_t len)
{
    for (size_t i = 0; i < total; i++) {
        uint8_t expect = i >= off && i < off + len ? want[i - off] : orig[i];
        if (got[i] != expect)
            fail_msg("byte %zu (range [%zu, +%zu) of %zu) is 0x%02x, not 0x%02x", i, off, len, total, got[i], expect);
    }
}

/* ---- one process ----------------------------------------------------------------------------- */

/* READ and WRITE between device memory of two engines of one process, by IPC: sizes around
 * alignment, at odd offsets, several requests in one group. */
static void test_device_bytes_move_both_ways(void **state)
{
    (void)state;
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(1, 0);
    struct dev remote, local;
    dev_new(src, 8 * MIB, 0, 8 * MIB, ORB_PERM_REMOTE_WRITE, 3, &remote);
    dev_new(req, 8 * MIB, 4096, 6 * MIB, ORB_PERM_LOCAL, 5, &local);
    orb_segment *seg = eu_open(req, src);
    const size_t sizes[] = {1, 255, 4097, 3 * MIB + 5};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k], loff = 4096 + 7 * k + 1, roff = 13 * k + 3;
        uint8_t *r0 = dev_bytes(&remote), *l0 = dev_bytes(&local);
        struct orb_request r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base + loff, remote.base + roff, n);
        struct orb_batch_report rep;
        if (run(req, seg, &r, 1, &rep) != 0)
            fail_msg("READ of %zu: %s", n, orb_last_error());
        assert_int_equal(rep.completed_bytes, n);
        uint8_t *l1 = dev_bytes(&local);
        assert_spliced(l1, l0, r0 + roff, local.len, loff, n);
        /* And back, elsewhere in the source. */
        size_t back = 4 * MIB + 11 * k;
        r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_WRITE, local.base + loff, remote.base + back, n);
        if (run(req, seg, &r, 1, &rep) != 0)
            fail_msg("WRITE of %zu: %s", n, orb_last_error());
        uint8_t *r1 = dev_bytes(&remote);
        assert_spliced(r1, r0, l1 + loff, remote.len, back, n);
        free(r0), free(l0), free(l1), free(r1);
    }
    /* Sixteen requests and more: several groups, each request its own range. */
    struct orb_request many[40];
    for (size_t i = 0; i < 40; i++)
        many[i] = nvl_req(ORB_TRANSPORT_NVLINK, i % 2 ? ORB_OP_WRITE : ORB_OP_READ, local.base + 4096 + i * 65536,
                          remote.base + 2 * MIB + i * 65536, 65536 - i);
    struct orb_batch_report rep;
    assert_int_equal(run(req, seg, many, 40, &rep), 0);
    assert_int_equal(rep.completed_requests, 40);
    orb_segment_close(seg);
    dev_free(req, &local);
    dev_free(src, &remote);
    assert_int_equal(orb_engine_close(req, 5 * EU_SEC), 0);
    assert_int_equal(orb_engine_close(src, 5 * EU_SEC), 0);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* The source shares only what it may: device memory, whole allocations registered with remote
 * write permission, within the request's own permission. Every refusal names its cause. */
static void test_the_source_authorises_each_request(void **state)
{
    (void)state;
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(1, 0);
    struct dev whole, part, ro, local;
    dev_new(src, MIB, 0, MIB, ORB_PERM_REMOTE_WRITE, 1, &whole);
    dev_new(src, MIB, 4096, MIB - 8192, ORB_PERM_REMOTE_WRITE, 2, &part);
    dev_new(src, MIB, 0, MIB, ORB_PERM_REMOTE_READ, 3, &ro);
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 4, &local);
    struct eu_region host;
    eu_region_new(src, 65536, ORB_PERM_REMOTE_WRITE, 6, &host);
    uint64_t host_base = (uint64_t)(uintptr_t)host.base;
    orb_host_memory *lhost = NULL;
    assert_int_equal(orb_host_memory_alloc(65536, 0, &lhost), 0);
    orb_reg_id lhost_id = 0;
    assert_int_equal(orb_register_host_memory(req, lhost, 0, 65536, ORB_PERM_LOCAL, &lhost_id), 0);
    orb_segment *seg = eu_open(req, src);
    struct orb_batch_report rep;
    struct orb_request r;

    r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base, part.base + 8192, 4096);
    assert_int_equal(run(req, seg, &r, 1, &rep), ORB_EPERM);
    assert_non_null(strstr(orb_last_error(), "whole allocation"));
    r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base, ro.base, 4096);
    assert_int_equal(run(req, seg, &r, 1, &rep), ORB_EPERM); /* an import could write it */
    r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_WRITE, local.base, ro.base, 4096);
    assert_int_equal(run(req, seg, &r, 1, &rep), ORB_EPERM);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base, whole.base + MIB - 100, 101); /* past its end */
    assert_int_equal(run(req, seg, &r, 1, &rep), ORB_ENOENT);
    r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base, host_base, 4096);
    assert_int_equal(run(req, seg, &r, 1, &rep), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "device memory"));
    /* The local side too: the transport copies device memory to device memory. */
    r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, (uint64_t)(uintptr_t)orb_host_memory_data(lhost), whole.base,
                4096);
    assert_int_equal(run(req, seg, &r, 1, &rep), ORB_EINVAL);
    assert_int_equal(rep.submitted_requests, 0);

    /* One refusal in a group fails its request only; the others complete. */
    struct orb_request g[3] = {
        nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base, whole.base, 4096),
        nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base + 4096, part.base + 8192, 4096),
        nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base + 8192, whole.base + 4096, 4096),
    };
    assert_int_equal(run(req, seg, g, 3, &rep), ORB_EPERM);
    assert_int_equal(rep.completed_requests, 1);
    assert_int_equal(rep.failure.request_index, 1);
    uint8_t *lb = dev_bytes(&local), *wb = dev_bytes(&whole);
    assert_memory_equal(lb + 8192, wb + 4096, 4096); /* the third did run */
    free(lb), free(wb);

    orb_segment_close(seg);
    assert_int_equal(orb_unregister_memory(req, lhost_id), 0);
    orb_host_memory_unref(lhost);
    eu_region_free(src, &host);
    dev_free(req, &local);
    dev_free(src, &ro);
    dev_free(src, &part);
    dev_free(src, &whole);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* ORB_TRANSPORT_UNSPEC gives IPC the requests between device memory that the source would share,
 * and TCP the others: with every device-to-device copy failing, only those fail. */
static void test_unspec_prefers_ipc_for_shared_device_memory(void **state)
{
    (void)state;
    if (real_driver)
        skip();
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(1, 0);
    struct dev shared, part, local;
    dev_new(src, MIB, 0, MIB, ORB_PERM_REMOTE_WRITE, 1, &shared);
    dev_new(src, MIB, 4096, 65536, ORB_PERM_REMOTE_WRITE, 2, &part);
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 3, &local);
    struct eu_region host, lhost;
    eu_region_new(src, 65536, ORB_PERM_REMOTE_WRITE, 4, &host);
    eu_region_new(req, 65536, ORB_PERM_LOCAL, 5, &lhost);
    orb_segment *seg = eu_open(req, src);
    struct orb_batch_report rep;
    struct orb_request r;

    /* Ask twice, the answer remembered the second time; the copy is by IPC both times. */
    for (int k = 0; k < 2; k++) {
        fake.fail_nth("cuMemcpyDtoDAsync_v2", 1, 999);
        r = nvl_req(ORB_TRANSPORT_UNSPEC, ORB_OP_READ, local.base, shared.base + 100, 4096);
        assert_int_not_equal(run(req, seg, &r, 1, &rep), 0);
        assert_non_null(strstr(orb_last_error(), "cuMemcpyDtoDAsync"));
    }
    fake.fail_nth("cuMemcpyDtoDAsync_v2", 0, 0);
    r = nvl_req(ORB_TRANSPORT_UNSPEC, ORB_OP_WRITE, local.base, shared.base, 4096);
    assert_int_equal(run(req, seg, &r, 1, &rep), 0);

    /* Not shared (part of an allocation), host memory on either side: TCP, unharmed. */
    fake.fail_nth("cuMemcpyDtoDAsync_v2", 1, 999);
    struct orb_request tcp[3] = {
        nvl_req(ORB_TRANSPORT_UNSPEC, ORB_OP_READ, local.base, part.base + 4096, 4096),
        nvl_req(ORB_TRANSPORT_UNSPEC, ORB_OP_READ, local.base + 4096, (uint64_t)(uintptr_t)host.base, 4096),
        nvl_req(ORB_TRANSPORT_UNSPEC, ORB_OP_READ, (uint64_t)(uintptr_t)lhost.base, shared.base, 4096),
    };
    if (run(req, seg, tcp, 3, &rep) != 0)
        fail_msg("TCP requests: %s", orb_last_error());
    uint8_t *lb = dev_bytes(&local), *pb = dev_bytes(&part);
    assert_memory_equal(lb, pb + 4096, 4096);
    free(lb), free(pb);
    fake.fail_nth("cuMemcpyDtoDAsync_v2", 0, 0);

    orb_segment_close(seg);
    eu_region_free(req, &lhost);
    eu_region_free(src, &host);
    dev_free(req, &local);
    dev_free(src, &part);
    dev_free(src, &shared);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* An engine copying within its own allocation through its own source: overlapping ranges are
 * refused (one copy would read what the other writes), disjoint ones run. */
static void test_overlapping_self_peer_copies_are_refused(void **state)
{
    (void)state;
    orb_engine *e = eu_engine(NULL);
    struct dev d;
    dev_new(e, MIB, 0, MIB, ORB_PERM_REMOTE_WRITE, 9, &d);
    orb_segment *seg = eu_open(e, e);
    struct orb_batch_report rep;
    struct orb_request r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, d.base, d.base + 1000, 4096);
    assert_int_equal(run(e, seg, &r, 1, &rep), ORB_EBUSY);
    uint8_t *before = dev_bytes(&d);
    r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_WRITE, d.base, d.base + 8192, 4096);
    assert_int_equal(run(e, seg, &r, 1, &rep), 0);
    uint8_t *after = dev_bytes(&d);
    assert_spliced(after, before, before, d.len, 8192, 4096);
    free(before), free(after);
    orb_segment_close(seg);

    /* Reached by another name, the engine is not taken for itself (nothing on the wire says so):
     * its handles go to the driver, which refuses a process's own. */
    char ep[ORB_ENDPOINT_MAX], other_name[ORB_ENDPOINT_MAX + 16];
    struct orb_epoch epoch;
    assert_int_equal(orb_engine_endpoint(e, ep, sizeof ep), 0);
    assert_int_equal(orb_engine_source_epoch(e, &epoch), 0);
    const char *port = strrchr(ep, ':');
    assert_non_null(port);
    snprintf(other_name, sizeof other_name, "localhost%s", port);
    if (orb_open_segment(e, other_name, &epoch, 5 * EU_SEC, &seg) != 0)
        fail_msg("open %s: %s", other_name, orb_last_error());
    r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_WRITE, d.base, d.base + 8192, 4096);
    assert_int_not_equal(run(e, seg, &r, 1, &rep), 0);
    assert_non_null(strstr(orb_last_error(), "cuIpcOpenMemHandle"));
    orb_segment_close(seg);
    dev_free(e, &d);
    orb_engine_free(e);
}

/* The source lets a group go when its lease runs out; the requester's end then is refused and
 * no request of the group completes, even those whose copies succeeded. */
static void test_an_unacknowledged_end_fails_the_whole_group(void **state)
{
    (void)state;
    if (real_driver)
        skip();
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.io_timeout_s = 1;
    orb_engine *src = eu_engine(&cfg);
    orb_engine *req = eu_requester(1, 0);
    struct dev remote, local;
    dev_new(src, MIB, 0, MIB, ORB_PERM_REMOTE_WRITE, 1, &remote);
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 2, &local);
    orb_segment *seg = eu_open(req, src);
    struct orb_request g[3];
    for (int i = 0; i < 3; i++)
        g[i] = nvl_req(ORB_TRANSPORT_NVLINK, i == 1 ? ORB_OP_WRITE : ORB_OP_READ, local.base + i * 8192,
                       remote.base + i * 8192, 8192);
    fake.slow_streams(600 * 1000); /* each copy outlasts a third of the lease */
    struct orb_batch_report rep;
    int rc = run(req, seg, g, 3, &rep);
    fake.slow_streams(0);
    assert_int_equal(rc, ORB_ETIMEDOUT);
    assert_non_null(strstr(orb_last_error(), "did not acknowledge"));
    assert_int_equal(rep.completed_requests, 0);
    assert_int_equal(rep.failure.request_index, 0);
    assert_int_equal(rep.failure.affected_requests, 3);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_UNKNOWN);
    /* The next group runs as usual. */
    assert_int_equal(run(req, seg, g, 3, &rep), 0);
    orb_segment_close(seg);
    dev_free(req, &local);
    dev_free(src, &remote);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* A group whose copy cannot be proven to end (the local allocation is fenced) sends no END: the
 * source keeps its ranges lent until the group's lease runs out, so a conflicting WRITE into them
 * is refused meanwhile (ORB_EBUSY) and accepted after. */
static void test_an_unproven_copy_keeps_the_group_held(void **state)
{
    (void)state;
    if (real_driver)
        skip();
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.io_timeout_s = 1; /* the lease */
    orb_engine *src = eu_engine(&cfg);
    orb_engine *req = eu_requester(1, 0);
    struct dev remote, a, b;
    dev_new(src, MIB, 0, MIB, ORB_PERM_REMOTE_WRITE, 1, &remote);
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 2, &a);
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 3, &b);
    orb_segment *seg = eu_open(req, src);
    struct orb_request from_a = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_WRITE, a.base, remote.base, 65536);
    struct orb_request from_b = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_WRITE, b.base, remote.base, 65536);
    struct orb_batch_report rep;
    fake.fail_nth("cuEventSynchronize", 1, 999); /* the copy's wait fails, and so does the drain */
    fake.fail_nth("cuStreamSynchronize", 1, 999);
    int rc = run(req, seg, &from_a, 1, &rep);
    fake.fail_nth("cuEventSynchronize", 0, 0);
    fake.fail_nth("cuStreamSynchronize", 0, 0);
    assert_int_equal(rc, ORB_EUNQUIESCED);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_UNKNOWN);
    uint64_t failed_at = orb_now_ns();
    rc = run(req, seg, &from_b, 1, &rep);
    if (orb_now_ns() - failed_at < 900 * 1000 * 1000ull && rc != ORB_EBUSY)
        fail_msg("a WRITE into the range an unproven copy may still write, within its lease: %d (%s)", rc,
                 orb_last_error());
    /* Once the lease ran out the range is free again. */
    uint64_t give_up = orb_deadline_after(10 * EU_SEC);
    while ((rc = run(req, seg, &from_b, 1, &rep)) == ORB_EBUSY && orb_now_ns() < give_up)
        usleep(100 * 1000);
    assert_int_equal(rc, 0);
    assert_true(orb_now_ns() - failed_at >= 900 * 1000 * 1000ull);
    orb_segment_close(seg);
    dev_free(req, &b);
    assert_int_equal(orb_unregister_memory(req, a.id), 0);
    orb_cuda_memory_unref(a.mem); /* fenced: kept by the library */
    dev_free(src, &remote);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* Another process that knows a requester's epoch (no secret) cannot end its group while the
 * copies run: the group's id is not one to guess. */
static void test_a_guessed_end_ends_no_group(void **state)
{
    (void)state;
    if (real_driver)
        skip();
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(1, 0);
    struct orb_epoch victim;
    assert_int_equal(orb_engine_source_epoch(req, &victim), 0);
    struct dev remote, local;
    dev_new(src, MIB, 0, MIB, ORB_PERM_REMOTE_WRITE, 1, &remote);
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 2, &local);
    orb_segment *seg = eu_open(req, src);
    struct orb_request r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base, remote.base, 8192);
    orb_batch *b = NULL;
    assert_int_equal(orb_batch_open(req, seg, &b), 0);
    fake.slow_streams(300 * 1000); /* the group is held while the forger tries */
    assert_int_equal(orb_batch_submit(b, &r, 1), 0);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    uint8_t msg[64], resp[64];
    size_t len = 0, resp_len = 0;
    struct orb_batch_report rep;
    uint64_t tries = 0;
    while (orb_batch_poll(b, &rep) == ORB_EAGAIN) { /* ids 1..64, again and again, until it ends */
        uint64_t id = 1 + tries++ % 64;
        assert_int_equal(orb_nvl_end_encode(ORB_NVL_END, id, msg, sizeof msg, &len), 0);
        int rc = orb_engine_control(src, ORB_TRANSPORT_NVLINK, &victim, msg, len, resp, sizeof resp, &resp_len);
        if (rc != ORB_ETIMEDOUT)
            fail_msg("a guessed END of group %llu: %d, not refused", (unsigned long long)id, rc);
    }
    assert_true(tries > 64);
    assert_int_equal(orb_batch_wait(b, 30 * EU_SEC, &rep), 0);
    fake.slow_streams(0);
    assert_int_equal(rep.completed_requests, 1);
    uint8_t *want = dev_bytes(&remote), *got = dev_bytes(&local);
    assert_memory_equal(got, want, 8192);
    free(want);
    free(got);
    assert_int_equal(orb_batch_free(b), 0);
    orb_segment_close(seg);
    dev_free(req, &local);
    dev_free(src, &remote);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* A requester that breaks the rules, speaking to the source directly: broken messages refused,
 * a group id held twice refused, a requester's holds bounded, an END of a group not held
 * refused, and groups never ended let go when their lease runs out (the registration's owner is
 * then released). */
static void test_a_hostile_requester_is_bounded(void **state)
{
    (void)state;
    if (real_driver)
        skip();
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.io_timeout_s = 1;
    orb_engine *src = eu_engine(&cfg);
    struct dev d;
    dev_new(src, MIB, 0, MIB, ORB_PERM_REMOTE_WRITE, 1, &d);
    struct orb_epoch sender = {{0}}, other = {{0}};
    sender.bytes[0] = 0x5e;
    other.bytes[0] = 0x07;
    uint8_t req[4096], resp[4096];
    size_t len = 0, resp_len = 0;

    const uint8_t junk[] = {ORB_NVL_BEGIN, ORB_NVL_VERSION, 0, 0, 1, 2, 3};
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, junk, sizeof junk, resp, sizeof resp,
                                        &resp_len), ORB_EPROTO);
    assert_int_equal(orb_nvl_end_encode(ORB_NVL_END_OK, 3, req, sizeof req, &len), 0); /* an answer, not a request */
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, req, len, resp, sizeof resp, &resp_len),
                     ORB_EPROTO);
    assert_int_equal(orb_nvl_end_encode(ORB_NVL_END, 3, req, sizeof req, &len), 0);
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, req, len, resp, sizeof resp, &resp_len),
                     ORB_ETIMEDOUT);

    struct orb_nvl_begin b = {.count = 1, .ranges = {{.op = ORB_OP_READ, .addr = d.base, .length = 64}}};
    for (uint64_t g = 1; g <= 256; g++) {
        b.group = g;
        assert_int_equal(orb_nvl_begin_encode(ORB_NVL_BEGIN, &b, req, sizeof req, &len), 0);
        if (orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, req, len, resp, sizeof resp, &resp_len) != 0)
            fail_msg("group %llu: %s", (unsigned long long)g, orb_last_error());
    }
    b.group = 256; /* held already */
    assert_int_equal(orb_nvl_begin_encode(ORB_NVL_BEGIN, &b, req, sizeof req, &len), 0);
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, req, len, resp, sizeof resp, &resp_len),
                     ORB_EPROTO);
    b.group = 257;
    assert_int_equal(orb_nvl_begin_encode(ORB_NVL_BEGIN, &b, req, sizeof req, &len), 0);
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, req, len, resp, sizeof resp, &resp_len),
                     ORB_ERESOURCE);
    /* Another requester is not held up by that one, and its END is its own. */
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &other, req, len, resp, sizeof resp, &resp_len), 0);
    assert_int_equal(orb_nvl_end_encode(ORB_NVL_END, 257, req, sizeof req, &len), 0);
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, req, len, resp, sizeof resp, &resp_len),
                     ORB_ETIMEDOUT);
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &other, req, len, resp, sizeof resp, &resp_len), 0);
    uint64_t echoed = 0;
    assert_int_equal(orb_nvl_end_decode(ORB_NVL_END_OK, resp, resp_len, &echoed), 0);
    assert_int_equal(echoed, 257);

    /* The held groups pin the registration: unregistered, its owner stays until the leases end. */
    long before = fake.counts().device_allocations;
    dev_free(src, &d);
    assert_int_equal(fake.counts().device_allocations, before);
    for (int i = 0; i < 60 && fake.counts().device_allocations == before; i++)
        usleep(50 * 1000);
    assert_int_equal(fake.counts().device_allocations, before - 1);
    assert_int_equal(orb_engine_close(src, 5 * EU_SEC), 0);
    orb_engine_free(src);
}

/* A source closing while a requester holds a group: the close is not proven while the group may
 * still be copied (its lease of io_timeout_s runs), and a later close succeeds once it ended. */
static void test_a_source_close_waits_for_held_groups(void **state)
{
    (void)state;
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.io_timeout_s = 1;
    orb_engine *src = eu_engine(&cfg);
    struct dev d;
    dev_new(src, MIB, 0, MIB, ORB_PERM_REMOTE_WRITE, 1, &d);
    struct orb_epoch sender = {{0}};
    sender.bytes[0] = 0x11;
    uint8_t req[4096], resp[4096];
    size_t len = 0, resp_len = 0;
    struct orb_nvl_begin b = {.group = 1, .count = 1,
                              .ranges = {{.op = ORB_OP_WRITE, .addr = d.base + 64, .length = 64}}};
    assert_int_equal(orb_nvl_begin_encode(ORB_NVL_BEGIN, &b, req, sizeof req, &len), 0);
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, req, len, resp, sizeof resp, &resp_len), 0);
    assert_int_equal(orb_engine_close(src, 100 * 1000 * 1000), ORB_EUNQUIESCED);
    assert_non_null(strstr(orb_last_error(), "held by their requesters"));
    assert_int_equal(orb_engine_close(src, 5 * EU_SEC), 0);
    dev_free(src, &d);
    orb_engine_free(src);
}

/* ---- two processes --------------------------------------------------------------------------- */

/* A lying source: its NVLink answers say every allocation is twice its size. */
static int lying_control(void *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len, uint8_t *resp,
                         size_t cap, size_t *resp_len)
{
    int rc = orb_nvlink_transport.control(tp, sender, req, len, resp, cap, resp_len);
    struct orb_nvl_begin_ok *m = malloc(sizeof *m);
    if (rc != 0 || m == NULL || orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, resp, *resp_len, m) != 0) {
        free(m);
        return rc;
    }
    for (uint32_t i = 0; i < m->nallocs; i++)
        m->allocs[i].size *= 2;
    rc = orb_nvl_begin_ok_encode(ORB_NVL_BEGIN_OK, m, resp, cap, resp_len);
    free(m);
    return rc;
}

/* A mute source: it answers QUERY only after 1.5 s, past any requester's patience. */
static int mute_control(void *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len, uint8_t *resp,
                        size_t cap, size_t *resp_len)
{
    if (len > 0 && req[0] == ORB_NVL_QUERY)
        usleep(1500 * 1000);
    return orb_nvlink_transport.control(tp, sender, req, len, resp, cap, resp_len);
}

/* The source process: one engine, one device allocation of 4 MiB registered whole (seed 7's
 * pattern). It prints "<endpoint> <epoch> <base>" and then answers lines on stdin: "check OFF
 * LEN SEED" ([OFF, +LEN) holds what seed's pattern of 4 MiB holds there: "ok" or "bad N"),
 * "quit". VMM and PRIVATE_VMM sources make that allocation with cuMemCreate (with and without a
 * POSIX file descriptor handle type) and adopt it. */
enum child_kind { HONEST, LYING, MUTE, MANY, VMM, PRIVATE_VMM };
#define MANY_ALLOCS 64 /* beyond the 4 MiB one: more allocations than a peer keeps imported */

static int source_child(enum child_kind kind)
{
    const struct orb_cuda *cu = NULL;
    if ((!real_driver && orb_cuda_use_library(FAKECUDA_FULL) != 0) || orb_cuda_get(&cu) != 0)
        return 10;
    struct orb_engine_config cfg;
    orb_engine *e = NULL;
    orb_cuda_memory *m = NULL;
    orb_reg_id id = 0;
    static struct orb_transport_ops odd;
    odd = orb_nvlink_transport;
    odd.control = kind == LYING ? lying_control : mute_control;
    const struct orb_transport_ops *ops[] = {&orb_tcp_transport,
                                             kind == LYING || kind == MUTE ? &odd : &orb_nvlink_transport};
    if (orb_engine_config_init(&cfg) != 0 || orb_engine_create_with(&cfg, NULL, ops, 2, &e) != 0)
        return 11;
    struct fakecuda_vmm vmm = {0};
    if (kind == VMM || kind == PRIVATE_VMM) {
        orb_cu_context ctx = NULL;
        unsigned types = kind == VMM ? ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
        if (cu->primary_ctx_retain(&ctx, 0) != ORB_CU_SUCCESS || cu->ctx_set_current(ctx) != ORB_CU_SUCCESS ||
            fakecuda_vmm_make(cu, real_driver ? "libcuda.so.1" : FAKECUDA_FULL, 0, 4 * MIB, types, &vmm) != 0 ||
            orb_cuda_memory_adopt(0, vmm.va, 4 * MIB, NULL, NULL, &m) != 0)
            return 12;
    } else if (orb_cuda_memory_alloc(0, 4 * MIB, &m) != 0)
        return 12;
    uint8_t *buf = malloc(4 * MIB), *pattern = malloc(4 * MIB);
    if (buf == NULL || pattern == NULL)
        return 12;
    eu_fill(buf, 4 * MIB, 7);
    if (orb_cuda_memory_from_host(m, 0, buf, 4 * MIB) != 0 ||
        orb_register_cuda_memory(e, m, 0, 4 * MIB, ORB_PERM_REMOTE_WRITE, &id) != 0)
        return 13;
    char ep[ORB_ENDPOINT_MAX], epoch[64];
    struct orb_epoch ee;
    if (orb_engine_endpoint(e, ep, sizeof ep) != 0 || orb_engine_source_epoch(e, &ee) != 0 ||
        orb_epoch_format(&ee, epoch, sizeof epoch) != 0)
        return 14;
    printf("%s %s %llu\n", ep, epoch, (unsigned long long)orb_cuda_memory_ptr(m));
    orb_cuda_memory *more[MANY_ALLOCS] = {NULL};
    orb_reg_id more_ids[MANY_ALLOCS] = {0};
    if (kind == MANY) {
        for (int i = 0; i < MANY_ALLOCS; i++) {
            if (orb_cuda_memory_alloc(0, 65536, &more[i]) != 0 ||
                orb_register_cuda_memory(e, more[i], 0, 65536, ORB_PERM_REMOTE_WRITE, &more_ids[i]) != 0)
                return 19;
            printf("%llu%c", (unsigned long long)orb_cuda_memory_ptr(more[i]), i + 1 < MANY_ALLOCS ? ' ' : '\n');
        }
    }
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin) != NULL) {
        size_t off = 0, len = 0;
        unsigned seed = 0;
        if (strncmp(line, "quit", 4) == 0)
            break;
        if (sscanf(line, "check %zu %zu %u", &off, &len, &seed) != 3 || off + len > 4 * MIB)
            return 15;
        if (orb_cuda_memory_to_host(m, off, buf, len) != 0)
            return 16;
        eu_fill(pattern, 4 * MIB, (uint8_t)seed);
        size_t bad = 0;
        while (bad < len && buf[bad] == pattern[off + bad])
            bad++;
        if (bad == len)
            printf("ok\n");
        else
            printf("bad %zu\n", off + bad);
        fflush(stdout);
    }
    free(buf);
    free(pattern);
    for (int i = 0; i < MANY_ALLOCS; i++)
        if (more[i] != NULL) {
            if (orb_unregister_memory(e, more_ids[i]) != 0)
                return 17;
            orb_cuda_memory_unref(more[i]);
        }
    if (orb_unregister_memory(e, id) != 0)
        return 17;
    orb_cuda_memory_unref(m);
    if (orb_engine_close(e, 5 * EU_SEC) != 0)
        return 18;
    orb_engine_free(e);
    if ((kind == VMM || kind == PRIVATE_VMM) && fakecuda_vmm_free(cu, &vmm) != 0)
        return 20;
    return 0;
}

struct child {
    pid_t pid;
    FILE *to, *from;
};

static void child_start(struct child *c, const char *how)
{
    int in[2], out[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execl("/proc/self/exe", "test_nvlink", how, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->to = fdopen(in[1], "w");
    c->from = fdopen(out[0], "r");
    assert_non_null(c->to);
    assert_non_null(c->from);
}

static void child_check(struct child *c, size_t off, size_t len, unsigned seed)
{
    fprintf(c->to, "check %zu %zu %u\n", off, len, seed);
    fflush(c->to);
    char line[64];
    assert_non_null(fgets(line, sizeof line, c->from));
    if (strncmp(line, "ok", 2) != 0)
        fail_msg("the source's bytes [%zu, +%zu): %s", off, len, line);
}

static void child_end(struct child *c)
{
    fprintf(c->to, "quit\n");
    fclose(c->to);
    fclose(c->from);
    int status = 0;
    assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fail_msg("the source process failed at step %d", WEXITSTATUS(status));
}

/* Start a source process of `how` and open a segment of a new requester to it: *base is its
 * allocation's first byte. */
static void remote_open(struct child *c, const char *how, orb_engine **req, orb_segment **seg,
                        unsigned long long *base)
{
    child_start(c, how);
    char first[512], ep[ORB_ENDPOINT_MAX], epoch_text[64];
    if (fgets(first, sizeof first, c->from) == NULL || sscanf(first, "%127s %63s %llu", ep, epoch_text, base) != 3)
        fail_msg("the source process said nothing");
    struct orb_epoch epoch;
    assert_int_equal(orb_epoch_parse(epoch_text, &epoch), 0);
    *req = eu_requester(1, 0);
    *seg = NULL;
    assert_int_equal(orb_open_segment(*req, ep, &epoch, 5 * EU_SEC, seg), 0);
}

/* Another process's allocation is imported once, on the first request, and used by every later
 * one (READ and WRITE, by name and by ORB_TRANSPORT_UNSPEC); closing the engine unmaps it. */
static void test_two_processes_share_an_allocation(void **state)
{
    (void)state;
    struct child c;
    orb_engine *req = NULL;
    orb_segment *seg = NULL;
    unsigned long long base = 0;
    remote_open(&c, "--source-child", &req, &seg, &base);
    struct dev local;
    dev_new(req, 4 * MIB, 0, 4 * MIB, ORB_PERM_LOCAL, 9, &local);
    long imports = real_driver ? 0 : fake.counts().imports;

    struct orb_batch_report rep;
    struct orb_request r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base, base, 4 * MIB);
    if (run(req, seg, &r, 1, &rep) != 0)
        fail_msg("READ: %s", orb_last_error());
    uint8_t *lb = dev_bytes(&local);
    assert_int_equal(eu_first_mismatch(lb, 4 * MIB, 7), SIZE_MAX);
    free(lb);
    if (!real_driver)
        assert_int_equal(fake.counts().imports, imports + 1);

    /* Write seed 9's pattern into the middle of the source, by UNSPEC. */
    dev_free(req, &local);
    dev_new(req, 4 * MIB, 0, 4 * MIB, ORB_PERM_LOCAL, 9, &local);
    r = nvl_req(ORB_TRANSPORT_UNSPEC, ORB_OP_WRITE, local.base + MIB, base + MIB, 2 * MIB);
    if (run(req, seg, &r, 1, &rep) != 0)
        fail_msg("WRITE: %s", orb_last_error());
    child_check(&c, 0, MIB, 7);
    child_check(&c, MIB, 2 * MIB, 9);
    child_check(&c, 3 * MIB, MIB, 7);
    if (!real_driver)
        assert_int_equal(fake.counts().imports, imports + 1); /* the same import */

    orb_segment_close(seg);
    dev_free(req, &local);
    assert_int_equal(orb_engine_close(req, 5 * EU_SEC), 0);
    orb_engine_free(req);
    if (!real_driver)
        assert_int_equal(fake.counts().imports, imports); /* unmapped */
    child_check(&c, 3 * MIB, MIB, 7);
    child_end(&c);
}

/* A source that dies while a group's copies run: the group's end cannot be acknowledged, so no
 * request of it completes; the engine still closes, its mapping of the dead process's
 * allocation given back. */
static void test_a_source_dying_mid_group_fails_the_group(void **state)
{
    (void)state;
    if (real_driver)
        skip();
    struct child c;
    orb_engine *req = NULL;
    orb_segment *seg = NULL;
    unsigned long long base = 0;
    remote_open(&c, "--source-child", &req, &seg, &base);
    struct dev local;
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 2, &local);
    long imports = fake.counts().imports;
    struct orb_request g[3];
    for (int i = 0; i < 3; i++)
        g[i] = nvl_req(ORB_TRANSPORT_NVLINK, i == 2 ? ORB_OP_WRITE : ORB_OP_READ, local.base + i * 65536,
                       base + i * 65536, 65536);
    fake.slow_streams(200 * 1000);
    orb_batch *b = NULL;
    assert_int_equal(orb_batch_open(req, seg, &b), 0);
    assert_int_equal(orb_batch_submit(b, g, 3), 0);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    usleep(100 * 1000); /* the group begun, its copies queued and slowed */
    kill(c.pid, SIGKILL);
    int status = 0;
    assert_int_equal(waitpid(c.pid, &status, 0), c.pid);
    fclose(c.to);
    fclose(c.from);
    struct orb_batch_report rep;
    int rc = orb_batch_wait(b, 30 * EU_SEC, &rep);
    fake.slow_streams(0);
    assert_true(rc == ORB_EPEER || rc == ORB_ESTALE);
    assert_int_equal(rep.completed_requests, 0);
    assert_int_equal(rep.failure.request_index, 0);
    assert_int_equal(rep.failure.affected_requests, 3);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_UNKNOWN);
    assert_int_equal(orb_batch_free(b), 0);
    orb_segment_close(seg);
    dev_free(req, &local);
    assert_int_equal(orb_engine_close(req, 5 * EU_SEC), 0);
    orb_engine_free(req);
    assert_int_equal(fake.counts().imports, imports);
}

/* A source that says its allocation is larger than what its handle maps: the requester refuses
 * to copy past the mapping (which would reach its own memory) and fails the request. */
static void test_a_lying_source_is_refused(void **state)
{
    (void)state;
    struct child c;
    orb_engine *req = NULL;
    orb_segment *seg = NULL;
    unsigned long long base = 0;
    remote_open(&c, "--lying-source-child", &req, &seg, &base);
    struct dev local;
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 2, &local);
    long imports = real_driver ? 0 : fake.counts().imports;
    struct orb_batch_report rep;
    struct orb_request r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base, base, 4096);
    assert_int_equal(run(req, seg, &r, 1, &rep), ORB_EPROTO);
    assert_non_null(strstr(orb_last_error(), "its handle maps"));
    if (!real_driver)
        assert_int_equal(fake.counts().imports, imports); /* closed again */
    orb_segment_close(seg);
    dev_free(req, &local);
    orb_engine_free(req);
    child_end(&c);
}

/* A source that does not answer the question ORB_TRANSPORT_UNSPEC asks: the first request waits
 * for it once (at most a second) and goes by TCP, and later ones are not held up by it. */
static void test_a_mute_source_does_not_hold_up_submission(void **state)
{
    (void)state;
    struct child c;
    orb_engine *req = NULL;
    orb_segment *seg = NULL;
    unsigned long long base = 0;
    remote_open(&c, "--mute-source-child", &req, &seg, &base);
    struct dev local;
    dev_new(req, 4 * MIB, 0, 4 * MIB, ORB_PERM_LOCAL, 2, &local);
    struct orb_batch_report rep;
    for (int i = 0; i < 4; i++) {
        struct orb_request r = nvl_req(ORB_TRANSPORT_UNSPEC, ORB_OP_READ, local.base + i * MIB, base + i * MIB, MIB);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (run(req, seg, &r, 1, &rep) != 0)
            fail_msg("request %d: %s", i, orb_last_error());
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s_taken = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        if (i == 0)
            assert_true(s_taken < 2.5); /* one question, bounded by a second, then the transfer */
        else
            assert_true(s_taken < 0.9); /* no question: less than one question's bound */
    }
    child_check(&c, 0, 4 * MIB, 7);
    uint8_t *lb = dev_bytes(&local);
    assert_int_equal(eu_first_mismatch(lb, 4 * MIB, 7), SIZE_MAX); /* every byte came, by TCP */
    free(lb);
    orb_segment_close(seg);
    dev_free(req, &local);
    orb_engine_free(req);
    child_end(&c);
}

/* A peer's imports are bounded: the 65th allocation unmaps the least recently used one. When the
 * driver refuses that unmapping, the group that shared the import does not count as complete,
 * although its copy ran, and the mapping is reported as kept. */
static void test_a_failed_import_close_fails_its_group(void **state)
{
    (void)state;
    if (real_driver)
        skip();
    struct child c;
    orb_engine *req = NULL;
    orb_segment *seg = NULL;
    unsigned long long base = 0, more[MANY_ALLOCS];
    remote_open(&c, "--many-source-child", &req, &seg, &base);
    for (int i = 0; i < MANY_ALLOCS; i++)
        assert_int_equal(fscanf(c.from, "%llu", &more[i]), 1);
    struct dev local;
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 2, &local);
    struct orb_cuda_retained kept0, kept1;
    assert_int_equal(orb_cuda_retained_resources(&kept0), 0);
    long imports = fake.counts().imports;
    struct orb_batch_report rep;
    struct orb_request r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base, base, 4096);
    assert_int_equal(run(req, seg, &r, 1, &rep), 0);
    for (int i = 0; i < MANY_ALLOCS - 1; i++) {
        r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base + 4096, more[i], 4096);
        if (run(req, seg, &r, 1, &rep) != 0)
            fail_msg("allocation %d: %s", i, orb_last_error());
    }
    assert_int_equal(fake.counts().imports, imports + MANY_ALLOCS); /* the most a peer keeps */
    /* A group of three whose last request's import replaces one whose close fails: the whole
     * attempted group is the failure's span, a WRITE in it makes the effect unknown, and no
     * request of it counts, not even those whose copies ended well. */
    fake.fail_nth("cuIpcCloseMemHandle", 1, 999u);
    struct orb_request g[3] = {nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_WRITE, local.base, base + 65536, 4096),
                               nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base + 4096, base, 4096),
                               nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base + 8192, more[MANY_ALLOCS - 1],
                                       4096)};
    assert_int_not_equal(run(req, seg, g, 3, &rep), 0);
    assert_non_null(strstr(orb_last_error(), "could not be closed"));
    assert_int_equal(rep.completed_requests, 0);
    assert_true(rep.has_failure);
    assert_int_equal(rep.failure.request_index, 0);
    assert_int_equal(rep.failure.affected_requests, 3);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_UNKNOWN);
    r = g[2];
    assert_int_equal(orb_cuda_retained_resources(&kept1), 0);
    assert_int_equal(kept1.imports, kept0.imports + 1);
    /* The next group is fine, by the new import. */
    assert_int_equal(run(req, seg, &r, 1, &rep), 0);
    orb_segment_close(seg);
    dev_free(req, &local);
    orb_engine_free(req);
    child_end(&c);
}

/* Another process's virtual memory management allocation has no legacy IPC handle: it comes by
 * descriptor from the source's channel, is mapped once and found again by later groups (their
 * tokens differ, the allocation does not), READ and WRITE; closing the engine unmaps it and
 * frees its address range. */
static void test_a_vmm_allocation_is_shared_by_descriptor(void **state)
{
    (void)state;
    struct child c;
    orb_engine *req = NULL;
    orb_segment *seg = NULL;
    unsigned long long base = 0;
    remote_open(&c, "--vmm-source-child", &req, &seg, &base);
    struct fakecuda_counts before = {0};
    if (!real_driver)
        before = fake.counts();
    struct dev local;
    dev_new(req, 4 * MIB, 0, 4 * MIB, ORB_PERM_LOCAL, 9, &local);
    struct orb_batch_report rep;
    struct orb_request r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_READ, local.base + 1, base + 1, 4 * MIB - 3);
    if (run(req, seg, &r, 1, &rep) != 0)
        fail_msg("READ: %s", orb_last_error());
    uint8_t *lb = dev_bytes(&local), *want = malloc(4 * MIB);
    assert_non_null(want);
    eu_fill(want, 4 * MIB, 7);
    assert_memory_equal(lb + 1, want + 1, 4 * MIB - 3);
    free(lb);
    dev_free(req, &local); /* the READ wrote over it: seed 9's bytes again */
    dev_new(req, 4 * MIB, 0, 4 * MIB, ORB_PERM_LOCAL, 9, &local);
    if (!real_driver) {
        struct fakecuda_counts now = fake.counts();
        assert_int_equal(now.imports, before.imports + 1);
        assert_int_equal(now.reservations, before.reservations + 1);
    }
    /* Seed 9's bytes into the middle of the source, by UNSPEC, in two requests of one group. */
    struct orb_request w[2] = {nvl_req(ORB_TRANSPORT_UNSPEC, ORB_OP_WRITE, local.base + MIB, base + MIB, MIB),
                               nvl_req(ORB_TRANSPORT_UNSPEC, ORB_OP_WRITE, local.base + 2 * MIB, base + 2 * MIB, MIB)};
    if (run(req, seg, w, 2, &rep) != 0)
        fail_msg("WRITE: %s", orb_last_error());
    child_check(&c, 0, MIB, 7);
    child_check(&c, MIB, 2 * MIB, 9);
    child_check(&c, 3 * MIB, MIB, 7);
    if (!real_driver)
        assert_int_equal(fake.counts().imports, before.imports + 1); /* the same mapping */
    orb_segment_close(seg);
    dev_free(req, &local);
    assert_int_equal(orb_engine_close(req, 5 * EU_SEC), 0);
    orb_engine_free(req);
    if (!real_driver) {
        struct fakecuda_counts after = fake.counts();
        assert_int_equal(after.imports, before.imports);
        assert_int_equal(after.reservations, before.reservations);
        assert_int_equal(after.vmm_allocations, before.vmm_allocations);
    }
    free(want);
    child_end(&c);
}

/* One made without a shareable handle type cannot be mapped by another process: by name the
 * request is refused before anything moves, saying why; ORB_TRANSPORT_UNSPEC takes TCP. */
static void test_a_vmm_allocation_without_a_descriptor_type_goes_by_tcp(void **state)
{
    (void)state;
    struct child c;
    orb_engine *req = NULL;
    orb_segment *seg = NULL;
    unsigned long long base = 0;
    remote_open(&c, "--private-vmm-source-child", &req, &seg, &base);
    struct dev local;
    dev_new(req, MIB, 0, MIB, ORB_PERM_LOCAL, 3, &local);
    struct orb_batch_report rep;
    struct orb_request r = nvl_req(ORB_TRANSPORT_NVLINK, ORB_OP_WRITE, local.base, base, MIB);
    assert_int_equal(run(req, seg, &r, 1, &rep), ORB_EUNAVAILABLE);
    if (strstr(orb_last_error(), "POSIX file descriptor handle type") == NULL)
        fail_msg("the refusal does not say why: %s", orb_last_error());
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    child_check(&c, 0, MIB, 7);
    r.transport = ORB_TRANSPORT_UNSPEC;
    if (run(req, seg, &r, 1, &rep) != 0)
        fail_msg("WRITE by UNSPEC: %s", orb_last_error());
    child_check(&c, 0, MIB, 3);
    orb_segment_close(seg);
    dev_free(req, &local);
    assert_int_equal(orb_engine_close(req, 5 * EU_SEC), 0);
    orb_engine_free(req);
    child_end(&c);
}

/* The descriptor channel serves only the token of a group held now, and an allocation of it:
 * a wrong token or one whose group ended is refused, so is an index beyond the group's; a
 * channel no one listens on is named unreachable. */
static void test_the_descriptor_channel_serves_only_held_groups(void **state)
{
    (void)state;
    if (real_driver)
        skip();
    const struct orb_cuda *cu = NULL;
    assert_int_equal(orb_cuda_get(&cu), 0);
    orb_engine *src = eu_engine(NULL);
    orb_cu_context ctx = NULL;
    assert_int_equal(cu->primary_ctx_retain(&ctx, 0), ORB_CU_SUCCESS);
    assert_int_equal(cu->ctx_set_current(ctx), ORB_CU_SUCCESS);
    struct fakecuda_vmm v;
    assert_int_equal(fakecuda_vmm_make(cu, FAKECUDA_FULL, 0, 2 * MIB, ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &v),
                     0);
    orb_cuda_memory *m = NULL;
    orb_reg_id id = 0;
    assert_int_equal(orb_cuda_memory_adopt(0, v.va, 2 * MIB, NULL, NULL, &m), 0);
    assert_int_equal(orb_register_cuda_memory(src, m, 0, 2 * MIB, ORB_PERM_REMOTE_WRITE, &id), 0);
    struct orb_epoch sender = {{0}};
    sender.bytes[0] = 0x42;
    uint8_t msg[4096], resp[4096];
    size_t len = 0, resp_len = 0;
    struct orb_nvl_begin b = {.group = 3, .count = 1, .ranges = {{.op = ORB_OP_READ, .addr = v.va, .length = 100}}};
    assert_int_equal(orb_nvl_begin_encode(ORB_NVL_BEGIN, &b, msg, sizeof msg, &len), 0);
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, msg, len, resp, sizeof resp, &resp_len), 0);
    struct orb_nvl_begin_ok ok;
    assert_int_equal(orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, resp, resp_len, &ok), 0);
    assert_int_equal(ok.grants[0].status, 0);
    assert_int_equal(ok.allocs[0].share, ORB_NVL_SHARE_FD);
    struct orb_nvl_fd_handle h;
    assert_int_equal(orb_nvl_fd_handle_unpack(ok.allocs[0].handle, &h), 0);
    struct orb_nvl_fetch f = {.alloc = 0};
    memcpy(f.token, h.token, sizeof f.token);
    int fd = -1;
    uint64_t size = 0;
    uint64_t deadline = orb_deadline_after(2 * EU_SEC);
    assert_int_equal(nvl_fdchan_fetch(h.channel, &f, deadline, &fd, &size), 0);
    assert_true(fd >= 0 && size == 2 * MIB);
    close(fd);
    f.alloc = 1; /* the group has one allocation */
    assert_int_equal(nvl_fdchan_fetch(h.channel, &f, deadline, &fd, &size), ORB_EINVAL);
    f.alloc = 0;
    f.token[5] ^= 1;
    assert_int_equal(nvl_fdchan_fetch(h.channel, &f, deadline, &fd, &size), ORB_ENOENT);
    f.token[5] ^= 1;
    uint8_t other_channel[ORB_NVL_ID_LEN];
    memcpy(other_channel, h.channel, sizeof other_channel);
    other_channel[0] ^= 0xff; /* no one listens there */
    assert_int_equal(nvl_fdchan_fetch(other_channel, &f, deadline, &fd, &size), ORB_EUNAVAILABLE);
    /* The group ends: its token fetches nothing more. */
    assert_int_equal(orb_nvl_end_encode(ORB_NVL_END, 3, msg, sizeof msg, &len), 0);
    assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, msg, len, resp, sizeof resp, &resp_len), 0);
    assert_int_equal(nvl_fdchan_fetch(h.channel, &f, deadline, &fd, &size), ORB_ENOENT);
    assert_int_equal(orb_unregister_memory(src, id), 0);
    orb_cuda_memory_unref(m);
    assert_int_equal(orb_engine_close(src, 5 * EU_SEC), 0);
    orb_engine_free(src);
    assert_int_equal(fakecuda_vmm_free(cu, &v), 0);
    assert_int_equal(cu->primary_ctx_release(0), ORB_CU_SUCCESS);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strncmp(argv[1], "--", 2) == 0 && strstr(argv[1], "source-child") != NULL) {
        const char *driver = getenv("ORBITE_CUDA_DRIVER");
        real_driver = driver != NULL && strcmp(driver, "real") == 0;
        enum child_kind kind = strcmp(argv[1], "--lying-source-child") == 0         ? LYING
                               : strcmp(argv[1], "--mute-source-child") == 0        ? MUTE
                               : strcmp(argv[1], "--many-source-child") == 0        ? MANY
                               : strcmp(argv[1], "--vmm-source-child") == 0         ? VMM
                               : strcmp(argv[1], "--private-vmm-source-child") == 0 ? PRIVATE_VMM : HONEST;
        return source_child(kind);
    }
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_bytes_move_both_ways),
        cmocka_unit_test(test_the_source_authorises_each_request),
        cmocka_unit_test(test_unspec_prefers_ipc_for_shared_device_memory),
        cmocka_unit_test(test_overlapping_self_peer_copies_are_refused),
        cmocka_unit_test(test_an_unacknowledged_end_fails_the_whole_group),
        cmocka_unit_test(test_an_unproven_copy_keeps_the_group_held),
        cmocka_unit_test(test_a_guessed_end_ends_no_group),
        cmocka_unit_test(test_a_hostile_requester_is_bounded),
        cmocka_unit_test(test_a_source_close_waits_for_held_groups),
        cmocka_unit_test(test_two_processes_share_an_allocation),
        cmocka_unit_test(test_a_source_dying_mid_group_fails_the_group),
        cmocka_unit_test(test_a_lying_source_is_refused),
        cmocka_unit_test(test_a_mute_source_does_not_hold_up_submission),
        cmocka_unit_test(test_a_failed_import_close_fails_its_group),
        cmocka_unit_test(test_a_vmm_allocation_is_shared_by_descriptor),
        cmocka_unit_test(test_a_vmm_allocation_without_a_descriptor_type_goes_by_tcp),
        cmocka_unit_test(test_the_descriptor_channel_serves_only_held_groups),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
