/* Device memory registered with the NICs (cuda_memory "direct", GPUDirect RDMA) on soft-RoCE with
 * the CUDA stand-in as the driver and the test-only verbs interposer (verbs_interposer.h):
 *  - Direct needs MLX5_SCATTER_TO_CQE=0 set before the engine starts;
 *  - dma-buf: the whole allocation exported once, the MR exactly the registered range (offset
 *    from the allocation's base, iova its address, local write only); soft-RoCE refuses dma-buf
 *    and that refusal is the registration's, with no other route tried, nothing staged and the
 *    descriptor closed;
 *  - auto without dma-buf and without a peer-memory module, and peermem without the module: no
 *    route, naming what is missing, nothing exported or registered;
 *  - with a device double that takes dma-buf (the interposer maps the stand-in's descriptor), a
 *    requester moves device bytes with RDMA READ and WRITE through its own MRs (nothing staged),
 *    a device that does not order NIC writes gets one flush per READ into it, the allocation's
 *    SYNC_MEMOPS is set, the stats count the registration, and unregistering closes the
 *    descriptor;
 *  - a source under Direct refuses grants on device memory (no window is bound on a device MR).
 * Needs the rails topology's devices; elsewhere it exits 77. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "cuda/cuda.h"
#include "cuda/cuda_memory.h"
#include "device_util.h"
#include "fakecuda.h"
#include "verbs_interposer.h"

#define TIMEOUT_NS (60ull * 1000000000ull)
#define LEN (1u << 20)

static struct fakecuda_controls fake;
static orb_engine *src;
static orb_host_memory *src_mem;
static uint8_t *sbytes;
static orb_reg_id src_id;

static orb_engine *requester(const char *route)
{
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_REQUESTER_NICS, "cuda_memory", "direct",
                        "gpu_direct_registration", route, NULL};
    orb_engine *e = NULL;
    if (rdma_test_engine(kv, 0, ORB_HELPER_OFF, &e) != 0)
        fail_msg("a Direct requester (%s): %s", route, orb_last_error());
    return e;
}

static orb_segment *segment_to_source(orb_engine *e)
{
    char ep[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    assert_int_equal(orb_engine_endpoint(src, ep, sizeof ep), 0);
    assert_int_equal(orb_engine_source_epoch(src, &epoch), 0);
    orb_segment *s = NULL;
    if (orb_open_segment(e, ep, &epoch, TIMEOUT_NS, &s) != 0)
        fail_msg("open_segment: %s", orb_last_error());
    return s;
}

static int setup(void **state)
{
    (void)state;
    if (!rdma_test_present(RDMA_TEST_REQUESTER_NICS) || !rdma_test_present(RDMA_TEST_SOURCE_NICS)) {
        fprintf(stderr, "SKIP: the rails topology's devices are not here\n");
        exit(77);
    }
    if (itp_install() != 0 || orb_cuda_use_library(FAKECUDA_FULL) != 0 ||
        fakecuda_controls_load(FAKECUDA_FULL, &fake) != 0)
        return -1;
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_SOURCE_NICS, NULL};
    if (rdma_test_engine(kv, 1, ORB_HELPER_OFF, &src) != 0 || orb_host_memory_alloc(4 * LEN, 4096, &src_mem) != 0)
        return -1;
    sbytes = orb_host_memory_data(src_mem);
    for (size_t i = 0; i < 4 * LEN; i++)
        sbytes[i] = (uint8_t)(i * 13 + 5);
    return orb_register_host_memory(src, src_mem, 0, 4 * LEN, ORB_PERM_REMOTE_WRITE, &src_id);
}

static int teardown(void **state)
{
    (void)state;
    (void)orb_unregister_memory(src, src_id);
    orb_host_memory_unref(src_mem);
    (void)orb_engine_close(src, TIMEOUT_NS);
    orb_engine_free(src);
    return 0;
}

/* A device allocation of 2 MiB + 8 KiB: the registered range starts 4096 + 512 bytes in. */
static orb_cuda_memory *device_alloc(void)
{
    orb_cuda_memory *m = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 2 * LEN + 8192, &m), 0);
    return m;
}

static void test_direct_needs_scatter_to_cqe_off(void **state)
{
    (void)state;
    unsetenv("MLX5_SCATTER_TO_CQE");
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_REQUESTER_NICS, "cuda_memory", "direct", NULL};
    orb_engine *e = NULL;
    assert_int_equal(rdma_test_engine(kv, 0, ORB_HELPER_OFF, &e), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "MLX5_SCATTER_TO_CQE=0"));
    setenv("MLX5_SCATTER_TO_CQE", "1", 1);
    assert_int_equal(rdma_test_engine(kv, 0, ORB_HELPER_OFF, &e), ORB_ECONFIG);
    setenv("MLX5_SCATTER_TO_CQE", "0", 1); /* every later cell's engines */
    assert_int_equal(rdma_test_engine(kv, 0, ORB_HELPER_OFF, &e), 0);
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);
}

static void test_a_refused_dmabuf_registration_is_the_registrations(void **state)
{
    (void)state;
    orb_engine *e = requester("dmabuf");
    orb_cuda_memory *m = device_alloc();
    struct orb_rdma_stats before = stats_of(e);
    long exports = fake.counts().dmabuf_exports;
    uint64_t regs = itp_calls(ITP_REG_MR), dmabufs = itp_calls(ITP_REG_DMABUF_MR);
    orb_reg_id id = 0;
    int rc = orb_register_cuda_memory(e, m, 4096 + 512, LEN + 77, ORB_PERM_LOCAL, &id);
    print_message("a dma-buf registration on soft-RoCE: %s (%s)\n", orb_strerror(rc), orb_last_error());
    assert_int_equal(rc, ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "dma-buf"));
    /* Exported once, the whole allocation; the MR asked for exactly the range. */
    assert_int_equal(fake.counts().dmabuf_exports, exports + 1);
    assert_true(itp_calls(ITP_REG_DMABUF_MR) > dmabufs);
    struct itp_dmabuf_call c = itp_last_dmabuf();
    assert_true(c.offset == 4096 + 512 && c.length == LEN + 77);
    assert_true(c.iova == orb_cuda_memory_ptr(m) + 4096 + 512);
    assert_int_equal(c.access, IBV_ACCESS_LOCAL_WRITE);
    assert_true(c.fd_was_open);
    /* No other route, nothing kept: the descriptor closed, no MR, no bytes charged. */
    assert_int_equal(itp_calls(ITP_REG_MR), regs);
    assert_true(fcntl(c.fd, F_GETFD) < 0); /* the export's descriptor is closed */
    struct orb_rdma_stats after = stats_of(e);
    assert_true(after.memory_regions == before.memory_regions && after.registered_bytes == before.registered_bytes &&
                after.dmabuf_registrations == 0 && after.staging_bytes == 0);
    orb_cuda_memory_unref(m);
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);
}

static void test_no_route_names_what_is_missing(void **state)
{
    (void)state;
    long exports = fake.counts().dmabuf_exports;
    uint64_t regs = itp_calls(ITP_REG_MR), dmabufs = itp_calls(ITP_REG_DMABUF_MR);
    orb_cuda_memory *m = device_alloc();
    orb_reg_id id = 0;
    /* auto on a device that does not export dma-buf, on a host without a peer-memory module. */
    fake.set_dmabuf(0);
    orb_engine *e = requester("auto");
    assert_int_equal(orb_register_cuda_memory(e, m, 0, LEN, ORB_PERM_LOCAL, &id), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "no GPUDirect registration route"));
    assert_non_null(strstr(orb_last_error(), "exports no dma-buf"));
    assert_non_null(strstr(orb_last_error(), "peer-memory module"));
    fake.set_dmabuf(1);
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);
    /* peermem asked for by name, without the module. */
    e = requester("peermem");
    assert_int_equal(orb_register_cuda_memory(e, m, 0, LEN, ORB_PERM_LOCAL, &id), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "gpu_direct_registration peermem"));
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);
    /* Nothing was exported or registered on the way. */
    assert_int_equal(fake.counts().dmabuf_exports, exports);
    assert_int_equal(itp_calls(ITP_REG_MR), regs);
    assert_int_equal(itp_calls(ITP_REG_DMABUF_MR), dmabufs);
    orb_cuda_memory_unref(m);
}

static void test_a_direct_requester_moves_device_bytes(void **state)
{
    (void)state;
    itp_dmabuf_as_host(1);
    fake.set_rdma_ordering(0); /* a device that needs a flush after each READ into it */
    orb_engine *e = requester("auto"); /* dma-buf is there, so auto takes it */
    orb_cuda_memory *m = device_alloc();
    uint8_t *want = malloc(2 * LEN + 8192), *got = malloc(2 * LEN + 8192);
    assert_non_null(want);
    assert_non_null(got);
    memset(want, 0x5a, 2 * LEN + 8192);
    assert_int_equal(orb_cuda_memory_copy_in(m, 0, want, 2 * LEN + 8192), 0);
    orb_reg_id id = 0;
    if (orb_register_cuda_memory(e, m, 4096, 2 * LEN, ORB_PERM_LOCAL, &id) != 0)
        fail_msg("the Direct registration: %s", orb_last_error());
    int dmabuf = itp_last_dmabuf().fd; /* held by the registration from now on */
    assert_true(fcntl(dmabuf, F_GETFD) >= 0);
    /* Its synchronous operations synchronize: the NIC reaches the bytes directly. */
    const struct orb_cuda *cu = NULL;
    unsigned int sync = 0;
    assert_int_equal(orb_cuda_get(&cu), 0);
    assert_int_equal(cu->pointer_get_attribute(&sync, ORB_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, orb_cuda_memory_ptr(m)),
                     ORB_CU_SUCCESS);
    assert_int_equal(sync, 1);
    struct orb_rdma_stats s0 = stats_of(e);
    assert_int_equal(s0.dmabuf_registrations, 1);
    assert_int_equal(s0.peermem_registrations, 0);
    orb_segment *seg = segment_to_source(e);
    uint64_t dev = orb_cuda_memory_ptr(m);
    struct orb_request r = {.transport = ORB_TRANSPORT_RDMA, .op = ORB_OP_READ, .local_addr = dev + 4096 + 3,
                            .remote_addr = (uint64_t)(uintptr_t)sbytes + 11, .length = LEN + 1001};
    struct orb_batch_report rep;
    long flushes = fake.counts().rdma_flushes;
    if (orb_submit_and_wait(e, seg, &r, 1, NULL, TIMEOUT_NS, &rep) != 0)
        fail_msg("a Direct READ into device memory: %s", orb_last_error());
    assert_int_equal(fake.counts().rdma_flushes, flushes + 1);
    memcpy(want + 4096 + 3, sbytes + 11, LEN + 1001);
    assert_int_equal(orb_cuda_memory_copy_out(m, 0, got, 2 * LEN + 8192), 0);
    assert_memory_equal(got, want, 2 * LEN + 8192);
    /* And back out, into another place of the source. */
    r.op = ORB_OP_WRITE;
    r.remote_addr = (uint64_t)(uintptr_t)sbytes + 2 * LEN;
    if (orb_submit_and_wait(e, seg, &r, 1, NULL, TIMEOUT_NS, &rep) != 0)
        fail_msg("a Direct WRITE from device memory: %s", orb_last_error());
    assert_int_equal(fake.counts().rdma_flushes, flushes + 1); /* nothing arrived in the device */
    fake.set_rdma_ordering(100);
    assert_memory_equal(sbytes + 2 * LEN, want + 4096 + 3, LEN + 1001);
    struct orb_rdma_stats s1 = stats_of(e);
    assert_int_equal(s1.staged_transfers, s0.staged_transfers); /* through its own MRs */
    assert_int_equal(s1.staging_bytes, 0);
    orb_segment_close(seg);
    /* The dma-buf descriptor is closed with the registration's last MR. */
    assert_true(fcntl(dmabuf, F_GETFD) >= 0);
    assert_int_equal(orb_unregister_memory(e, id), 0);
    /* Retired once its last use ends (the engine's release work may finish it just after). */
    for (int i = 0; i < 200 && stats_of(e).memory_regions != 0; i++)
        sleep_ms(10);
    assert_int_equal(stats_of(e).memory_regions, 0);
    assert_true(fcntl(dmabuf, F_GETFD) < 0);
    orb_cuda_memory_unref(m);
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);
    itp_dmabuf_as_host(0);
    for (size_t i = 0; i < 4 * LEN; i++) /* the source's bytes for the next cell */
        sbytes[i] = (uint8_t)(i * 13 + 5);
    free(want);
    free(got);
}

static void test_a_direct_source_refuses_device_grants(void **state)
{
    (void)state;
    itp_dmabuf_as_host(1);
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_SOURCE_NICS, "cuda_memory", "direct", NULL};
    orb_engine *s = NULL;
    if (rdma_test_engine(kv, 1, ORB_HELPER_OFF, &s) != 0)
        fail_msg("a Direct source: %s", orb_last_error());
    orb_cuda_memory *m = device_alloc();
    orb_reg_id id = 0;
    assert_int_equal(orb_register_cuda_memory(s, m, 0, LEN, ORB_PERM_REMOTE_WRITE, &id), 0);
    const char *rk[] = {"rdma_whitelist", RDMA_TEST_REQUESTER_NICS, NULL};
    orb_engine *e = NULL;
    assert_int_equal(rdma_test_engine(rk, 0, ORB_HELPER_OFF, &e), 0);
    orb_host_memory *lm = NULL;
    orb_reg_id lid = 0;
    assert_int_equal(orb_host_memory_alloc(LEN, 4096, &lm), 0);
    memset(orb_host_memory_data(lm), 0x11, LEN);
    assert_int_equal(orb_register_host_memory(e, lm, 0, LEN, ORB_PERM_LOCAL, &lid), 0);
    char ep[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    assert_int_equal(orb_engine_endpoint(s, ep, sizeof ep), 0);
    assert_int_equal(orb_engine_source_epoch(s, &epoch), 0);
    orb_segment *seg = NULL;
    assert_int_equal(orb_open_segment(e, ep, &epoch, TIMEOUT_NS, &seg), 0);
    struct orb_request r = {.transport = ORB_TRANSPORT_RDMA, .op = ORB_OP_READ,
                            .local_addr = (uint64_t)(uintptr_t)orb_host_memory_data(lm),
                            .remote_addr = orb_cuda_memory_ptr(m), .length = 4096};
    struct orb_batch_report rep;
    int rc = orb_submit_and_wait(e, seg, &r, 1, NULL, TIMEOUT_NS, &rep);
    print_message("a READ of a Direct source's device memory: %s (%s)\n", orb_strerror(rc), orb_last_error());
    assert_int_equal(rc, ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "private grant"));
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(((uint8_t *)orb_host_memory_data(lm))[i], 0x11);
    orb_segment_close(seg);
    assert_int_equal(orb_unregister_memory(e, lid), 0);
    orb_host_memory_unref(lm);
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);
    assert_int_equal(orb_unregister_memory(s, id), 0);
    orb_cuda_memory_unref(m);
    assert_int_equal(orb_engine_close(s, TIMEOUT_NS), 0);
    orb_engine_free(s);
    itp_dmabuf_as_host(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_direct_needs_scatter_to_cqe_off),
        cmocka_unit_test(test_a_refused_dmabuf_registration_is_the_registrations),
        cmocka_unit_test(test_no_route_names_what_is_missing),
        cmocka_unit_test(test_a_direct_requester_moves_device_bytes),
        cmocka_unit_test(test_a_direct_source_refuses_device_grants),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
