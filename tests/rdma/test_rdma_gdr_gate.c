/* The GPUDirect gate: device memory registered with the NICs (cuda_memory "direct", route auto)
 * moves by RDMA with nothing staged, in both directions, with payloads of 4096 bytes and of
 * 8388768 (8 MiB + 160: slices over two rails with a folded tail), under the progress mode
 * `--progress` names. For each transfer both peers' whole buffers are checked (the guards around
 * the payload unchanged on both), every payload work request's scatter entry lies inside the
 * request's own device range (observed by the test's verbs interposer), and the registration's
 * native arguments match the declared allocation: a dma-buf MR at iova = the range's address,
 * offset = address - allocation base, the exact length, local access only; a peer-memory MR at
 * the device address itself. The same transfers with the device memory at the source (a GPU
 * source under Direct, served by private grants): both peers' whole buffers checked, the
 * requester's payload work requests inside its own host range, each grant's region exactly the
 * request's device range with only its op's remote right, and every grant acknowledged and
 * torn down (nothing of it active afterwards). With `--reuse` the source opts into
 * gpu_source_reuse through the helper: every NIC must pass the registration's key probe, and
 * every grant is served by a DevX key on the connection's queue pairs (no region made per
 * grant, none kept), acknowledged after its key is destroyed.
 *
 * On the rails topology (soft-RoCE) it runs on the CUDA stand-in, whose dma-buf descriptors the
 * interposer registers as host pages (soft-RoCE refuses dma-buf). With ORBITE_CUDA_DRIVER=real
 * (hardware/gdr-gate.sh) it runs on the machine's driver and NICs as they are. It exits 77
 * without the NICs, or with the real driver and no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

#include "cuda/cuda.h"
#include "cuda/cuda_memory.h"
#include "device_util.h"
#include "fakecuda.h"
#include "rdma/verbs.h"
#include "verbs_interposer.h"

#define TIMEOUT_NS (120ull * 1000000000ull)
#define GUARD 65536u
#define BIG_PAYLOAD 8388768u
#define ALLOC (BIG_PAYLOAD + 2u * GUARD)

static const char *progress = "polling";
static int reuse; /* --reuse: the source opts into gpu_source_reuse, through the helper */
static int real_driver;
static orb_engine *src, *req;
static orb_host_memory *host;
static orb_cuda_memory *dev;
static uint64_t dev_base, reg_addr, reg_len; /* the allocation, and the registered range in it */
static uint8_t *hbytes;
static orb_reg_id host_id, dev_id;
static orb_segment *seg;
static uint8_t *want_dev, *want_host, *got;
/* The GPU-source cases: device memory at the source, host memory at the requester. */
static orb_cuda_memory *sdev;
static uint64_t sdev_base, sreg_addr;
static orb_host_memory *rhost;
static uint8_t *rbytes;
static orb_reg_id sdev_id, rhost_id;

static orb_engine *engine(const char *nics, int source)
{
    const char *direct[] = {"rdma_whitelist", nics, "progress_mode", progress, "cuda_memory", "direct",
                            "gpu_direct_registration", "auto", NULL, NULL, NULL};
    if (source && reuse) {
        direct[8] = "gpu_source_reuse";
        direct[9] = "true";
    }
    orb_engine *e = NULL;
    /* DevX keys are made in device contexts the helper opened: it alone can verify them. */
    if (rdma_test_engine(direct, source, source && reuse ? ORB_HELPER_REQUIRED : ORB_HELPER_OFF, &e) != 0)
        fail_msg("the %s engine: %s", source ? "source" : "requester", orb_last_error());
    return e;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 2654435761u) >> 11) ^ (uint8_t)seed;
}

static int setup(void **state)
{
    (void)state;
    if (!rdma_test_present(RDMA_TEST_REQUESTER_NICS) || !rdma_test_present(RDMA_TEST_SOURCE_NICS)) {
        fprintf(stderr, "SKIP: the NICs %s / %s are not here\n", RDMA_TEST_REQUESTER_NICS, RDMA_TEST_SOURCE_NICS);
        exit(77);
    }
    const char *driver = getenv("ORBITE_CUDA_DRIVER");
    real_driver = driver != NULL && strcmp(driver, "real") == 0;
    const struct orb_cuda *cu = NULL;
    int count = 0;
    if ((!real_driver && orb_cuda_use_library(FAKECUDA_FULL) != 0) || orb_cuda_get(&cu) != 0 ||
        cu->device_get_count(&count) != ORB_CU_SUCCESS || count < 1) {
        fprintf(stderr, "SKIP: no CUDA device (%s)\n", orb_last_error());
        exit(77);
    }
    if (itp_install() != 0)
        return -1;
    itp_dmabuf_as_host(!real_driver);
    setenv("MLX5_SCATTER_TO_CQE", "0", 1); /* Direct's requirement, before any engine starts */
    src = engine(RDMA_TEST_SOURCE_NICS, 1);
    req = engine(RDMA_TEST_REQUESTER_NICS, 0);
    if (orb_host_memory_alloc(ALLOC, 4096, &host) != 0 || orb_cuda_memory_alloc(0, ALLOC, &dev) != 0)
        return -1;
    hbytes = orb_host_memory_data(host);
    dev_base = orb_cuda_memory_ptr(dev);
    want_dev = malloc(ALLOC);
    want_host = malloc(ALLOC);
    got = malloc(ALLOC);
    if (want_dev == NULL || want_host == NULL || got == NULL)
        return -1;
    if (orb_register_host_memory(src, host, 0, ALLOC, ORB_PERM_REMOTE_WRITE, &host_id) != 0)
        return -1;
    /* The registered device range starts a page into the allocation and ends a page early. */
    reg_addr = dev_base + 4096;
    reg_len = ALLOC - 8192;
    /* The GPU source's device range: the same place in its own allocation (registered first: the
     * registration cell looks at the requester's, the last one made). */
    if (orb_cuda_memory_alloc(0, ALLOC, &sdev) != 0 || orb_host_memory_alloc(ALLOC, 4096, &rhost) != 0)
        return -1;
    sdev_base = orb_cuda_memory_ptr(sdev);
    sreg_addr = sdev_base + 4096;
    rbytes = orb_host_memory_data(rhost);
    if (orb_register_cuda_memory(src, sdev, 4096, reg_len, ORB_PERM_REMOTE_WRITE, &sdev_id) != 0) {
        fprintf(stderr, "the source's Direct registration: %s\n", orb_last_error());
        return -1;
    }
    struct orb_rdma_stats ss;
    if (reuse && (orb_engine_rdma_stats(src, &ss) != 0 || ss.reuse_probe_failures != 0)) {
        fprintf(stderr, "FAIL: --reuse: a NIC failed the gpu_source_reuse probe (the log says why)\n");
        return -1;
    }
    if (orb_register_host_memory(req, rhost, 0, ALLOC, ORB_PERM_LOCAL, &rhost_id) != 0)
        return -1;
    if (orb_register_cuda_memory(req, dev, 4096, reg_len, ORB_PERM_LOCAL, &dev_id) != 0) {
        fprintf(stderr, "the Direct registration: %s\n", orb_last_error());
        return -1;
    }
    char ep[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    if (orb_engine_endpoint(src, ep, sizeof ep) != 0 || orb_engine_source_epoch(src, &epoch) != 0 ||
        orb_open_segment(req, ep, &epoch, TIMEOUT_NS, &seg) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    orb_segment_close(seg);
    (void)orb_unregister_memory(req, dev_id);
    (void)orb_unregister_memory(src, host_id);
    (void)orb_unregister_memory(src, sdev_id);
    (void)orb_unregister_memory(req, rhost_id);
    (void)orb_engine_close(req, TIMEOUT_NS);
    (void)orb_engine_close(src, TIMEOUT_NS);
    orb_engine_free(req);
    orb_engine_free(src);
    orb_cuda_memory_unref(dev);
    orb_host_memory_unref(host);
    orb_cuda_memory_unref(sdev);
    orb_host_memory_unref(rhost);
    free(want_dev);
    free(want_host);
    free(got);
    return 0;
}

/* The registration's native arguments against the declared allocation. */
static void test_the_registration_matches_the_allocation(void **state)
{
    (void)state;
    struct orb_rdma_stats st;
    assert_int_equal(orb_engine_rdma_stats(req, &st), 0);
    print_message("route: %s (dma-buf %llu, peer memory %llu registrations)\n",
                  st.dmabuf_registrations ? "dma-buf" : "peer memory", (unsigned long long)st.dmabuf_registrations,
                  (unsigned long long)st.peermem_registrations);
    assert_int_equal(st.dmabuf_registrations + st.peermem_registrations, 1);
    const int remote = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND;
    if (st.dmabuf_registrations == 1) {
        struct itp_dmabuf_call c = itp_last_dmabuf();
        assert_int_equal(c.iova, reg_addr);
        assert_int_equal(c.length, reg_len);
        /* The export covers the containing allocation from its (page-aligned) base. */
        assert_int_equal(c.offset, reg_addr - (dev_base & ~(uint64_t)4095));
        assert_true(c.fd_was_open);
        assert_true((c.access & IBV_ACCESS_LOCAL_WRITE) != 0);
        assert_int_equal(c.access & remote, 0);
    } else {
        struct itp_reg_mr_call c = itp_last_reg_mr();
        assert_int_equal(c.addr, reg_addr);
        assert_int_equal(c.iova, reg_addr);
        assert_int_equal(c.length, reg_len);
        assert_int_equal(c.access & remote, 0);
    }
    assert_true(st.memory_regions >= st.nics_open); /* one on every open NIC, the source's host MRs besides */
}

/* One transfer of `payload` bytes, `op`, between the device range (a page and 3 bytes into the
 * registration) and the host (GUARD + 5 bytes in), everything else of both checked. */
static void move_and_check(enum orb_op op, uint32_t payload, uint32_t seed)
{
    const uint64_t dev_off = 4096 + 3, host_off = GUARD + 5;
    fill(want_dev, ALLOC, seed);
    fill(want_host, ALLOC, seed + 1);
    assert_int_equal(orb_cuda_memory_copy_in(dev, 0, want_dev, ALLOC), 0);
    memcpy(hbytes, want_host, ALLOC);
    itp_watch_payload(reg_addr + dev_off, reg_addr + dev_off + payload);
    struct orb_request r = {.transport = ORB_TRANSPORT_RDMA, .op = op, .local_addr = reg_addr + dev_off,
                            .remote_addr = (uint64_t)(uintptr_t)hbytes + host_off, .length = payload};
    struct orb_batch_report rep;
    struct orb_rdma_stats before, after;
    assert_int_equal(orb_engine_rdma_stats(req, &before), 0);
    if (orb_submit_and_wait(req, seg, &r, 1, NULL, TIMEOUT_NS, &rep) != 0)
        fail_msg("a Direct %s of %u bytes: %s", op == ORB_OP_READ ? "READ" : "WRITE", payload, orb_last_error());
    struct itp_payload_watch w = itp_payload_seen();
    itp_watch_payload(0, 0);
    assert_int_equal(orb_engine_rdma_stats(req, &after), 0);
    if (op == ORB_OP_READ)
        memcpy(want_dev + 4096 + dev_off, want_host + host_off, payload);
    else
        memcpy(want_host + host_off, want_dev + 4096 + dev_off, payload);
    assert_int_equal(orb_cuda_memory_copy_out(dev, 0, got, ALLOC), 0);
    assert_memory_equal(got, want_dev, ALLOC);
    assert_memory_equal(hbytes, want_host, ALLOC);
    print_message("%s %u bytes: %llu work request(s), all inside the device range\n",
                  op == ORB_OP_READ ? "READ" : "WRITE", payload, (unsigned long long)w.inside);
    assert_int_equal(w.outside, 0);
    assert_int_equal(w.bytes_inside, payload);
    assert_true(w.inside >= 1);
    if (payload == BIG_PAYLOAD && after.rails >= 2)
        assert_true(w.inside >= 2); /* sliced over the rails */
    assert_int_equal(after.staged_transfers, before.staged_transfers); /* nothing staged */
    assert_int_equal(after.staging_bytes, 0);
}

/* One transfer of `payload` bytes, `op`, between the requester's host memory (GUARD + 5 bytes in)
 * and the GPU source's device range (a page and 3 bytes into its registration), everything else
 * of both checked, and the private grant's region against the request. */
static void move_and_check_gpu_source(enum orb_op op, uint32_t payload, uint32_t seed)
{
    const uint64_t dev_off = 4096 + 3, host_off = GUARD + 5;
    fill(want_dev, ALLOC, seed);
    fill(want_host, ALLOC, seed + 1);
    assert_int_equal(orb_cuda_memory_copy_in(sdev, 0, want_dev, ALLOC), 0);
    memcpy(rbytes, want_host, ALLOC);
    const uint64_t remote = sreg_addr + dev_off;
    itp_watch_payload((uint64_t)(uintptr_t)rbytes + host_off, (uint64_t)(uintptr_t)rbytes + host_off + payload);
    struct orb_request r = {.transport = ORB_TRANSPORT_RDMA, .op = op,
                            .local_addr = (uint64_t)(uintptr_t)rbytes + host_off, .remote_addr = remote,
                            .length = payload};
    struct orb_batch_report rep;
    struct orb_rdma_stats before, after, rs;
    assert_int_equal(orb_engine_rdma_stats(src, &before), 0);
    uint64_t dmabuf0 = itp_calls(ITP_REG_DMABUF_MR), reg0 = itp_calls(ITP_REG_MR);
    if (orb_submit_and_wait(req, seg, &r, 1, NULL, TIMEOUT_NS, &rep) != 0)
        fail_msg("a %s of %u bytes of a GPU source: %s", op == ORB_OP_READ ? "READ" : "WRITE", payload,
                 orb_last_error());
    struct itp_payload_watch w = itp_payload_seen();
    itp_watch_payload(0, 0);
    if (op == ORB_OP_READ)
        memcpy(want_host + host_off, want_dev + 4096 + dev_off, payload);
    else
        memcpy(want_dev + 4096 + dev_off, want_host + host_off, payload);
    assert_int_equal(orb_cuda_memory_copy_out(sdev, 0, got, ALLOC), 0);
    assert_memory_equal(got, want_dev, ALLOC);
    assert_memory_equal(rbytes, want_host, ALLOC);
    /* The grant's region: exactly the request's device range, only the op's remote right; with
     * --reuse none at all (a DevX key over the registration's own MR). */
    const int rights = op == ORB_OP_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    if (reuse) {
        assert_int_equal(itp_calls(ITP_REG_DMABUF_MR), dmabuf0);
        assert_int_equal(itp_calls(ITP_REG_MR), reg0);
    } else if (itp_calls(ITP_REG_DMABUF_MR) > dmabuf0) {
        struct itp_dmabuf_call c = itp_last_dmabuf();
        assert_int_equal(c.iova, remote);
        assert_int_equal(c.length, payload);
        assert_int_equal(c.offset, remote - (sdev_base & ~(uint64_t)4095));
        assert_int_equal(c.access, rights);
    } else {
        struct itp_reg_mr_call c = itp_last_reg_mr();
        assert_int_equal(c.addr, remote);
        assert_int_equal(c.iova, remote);
        assert_int_equal(c.length, payload);
        assert_int_equal(c.access, rights);
    }
    assert_int_equal(orb_engine_rdma_stats(src, &after), 0);
    assert_int_equal(orb_engine_rdma_stats(req, &rs), 0);
    print_message("GPU source: %s %u bytes: %llu work request(s), all inside the requester's range\n",
                  op == ORB_OP_READ ? "READ" : "WRITE", payload, (unsigned long long)w.inside);
    assert_int_equal(w.outside, 0);
    assert_int_equal(w.bytes_inside, payload);
    if (payload == BIG_PAYLOAD && rs.rails >= 2)
        assert_true(w.inside >= 2); /* sliced over the rails */
    assert_int_equal(after.private_grants - before.private_grants, reuse ? 0 : 1);
    assert_int_equal(after.reuse_grants - before.reuse_grants, reuse ? 1 : 0);
    assert_int_equal(after.kept_keys, 0);
    assert_int_equal(after.grants_active, 0); /* torn down (or its key destroyed) before its ACK */
    assert_int_equal(after.staged_transfers, before.staged_transfers);
}

static void test_gpu_source_read_4096(void **state)
{
    (void)state;
    move_and_check_gpu_source(ORB_OP_READ, 4096, 11);
}

static void test_gpu_source_write_4096(void **state)
{
    (void)state;
    move_and_check_gpu_source(ORB_OP_WRITE, 4096, 13);
}

static void test_gpu_source_read_folded_tail(void **state)
{
    (void)state;
    move_and_check_gpu_source(ORB_OP_READ, BIG_PAYLOAD, 15);
}

static void test_gpu_source_write_folded_tail(void **state)
{
    (void)state;
    move_and_check_gpu_source(ORB_OP_WRITE, BIG_PAYLOAD, 17);
}

static void test_read_4096(void **state)
{
    (void)state;
    move_and_check(ORB_OP_READ, 4096, 1);
}

static void test_write_4096(void **state)
{
    (void)state;
    move_and_check(ORB_OP_WRITE, 4096, 3);
}

static void test_read_folded_tail(void **state)
{
    (void)state;
    move_and_check(ORB_OP_READ, BIG_PAYLOAD, 5);
}

static void test_write_folded_tail(void **state)
{
    (void)state;
    move_and_check(ORB_OP_WRITE, BIG_PAYLOAD, 7);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--progress") == 0 && i + 1 < argc)
            progress = argv[++i];
        else if (strcmp(argv[i], "--reuse") == 0)
            reuse = 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_registration_matches_the_allocation),
        cmocka_unit_test(test_read_4096),
        cmocka_unit_test(test_write_4096),
        cmocka_unit_test(test_read_folded_tail),
        cmocka_unit_test(test_write_folded_tail),
        cmocka_unit_test(test_gpu_source_read_4096),
        cmocka_unit_test(test_gpu_source_write_4096),
        cmocka_unit_test(test_gpu_source_read_folded_tail),
        cmocka_unit_test(test_gpu_source_write_folded_tail),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
