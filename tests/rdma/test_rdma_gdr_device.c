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
 *  - a source under Direct lends device memory on private grants (a protection domain, exact
 *    region and queue pair per rail for each request, torn down before its ACK; no window is
 *    ever bound on a device MR), refusing what lies outside the registration or its permission;
 *  - the NIC's access to GPUDirect memory waits for a producer's recorded work, at either end;
 *  - peermem (a module double in a private mount namespace, the interposer reaching the
 *    stand-in's device bytes): the device pointer registered exactly, both directions, auto
 *    without dma-buf, a refused registration that tries nothing else, a source's route;
 *  - gpu_source_reuse: where no NIC can make DevX keys, grants stay private; with a DevX double
 *    (devx_double.h) that makes keys soft-RoCE can serve, the registration's probe, one checked
 *    key per rail on the connection's own queue pair for each grant, exactly its range and
 *    direction, invalidated by the requester and destroyed before the ACK; a key that fails its
 *    check or cannot be made is never published and the request goes private; a key that
 *    cannot be destroyed keeps what it reaches.
 * Needs the rails topology's devices; elsewhere it exits 77. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "cuda/cuda.h"
#include "cuda/cuda_memory.h"
#include "device_util.h"
#include "devx_double.h"
#include "fakecuda.h"
#include "rdma/ctrl.h"
#include "rdma/rdma_transport.h"
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

/* A dma-buf registration one of whose MRs the device refuses to deregister keeps everything that
 * MR may still reach, for good: the descriptor stays open, the device allocation stays (its
 * owner reference is the registration's), the MR counts as kept, and the deregistration is
 * never asked again, not even when the engine goes. */
static void test_a_refused_dmabuf_deregistration_keeps_everything(void **state)
{
    (void)state;
    itp_dmabuf_as_host(1);
    orb_engine *e = requester("dmabuf");
    orb_cuda_memory *m = device_alloc();
    orb_reg_id id = 0;
    if (orb_register_cuda_memory(e, m, 4096, LEN, ORB_PERM_LOCAL, &id) != 0)
        fail_msg("the Direct registration: %s", orb_last_error());
    int dmabuf = itp_last_dmabuf().fd;
    assert_true(fcntl(dmabuf, F_GETFD) >= 0);
    uint64_t mrs = stats_of(e).memory_regions;
    assert_true(mrs >= 1);
    uint64_t deregs0 = itp_calls(ITP_DEREG_MR);
    itp_arm(ITP_DEREG_MR, 1, EBUSY, -1, ITP_REFUSED_NAMED);
    assert_int_equal(orb_unregister_memory(e, id), 0);
    long live = fake.counts().device_allocations;
    orb_cuda_memory_unref(m); /* the registration's reference stays with the kept MR */
    for (int i = 0; i < 500 && stats_of(e).kept_memory_regions == 0; i++)
        sleep_ms(10);
    sleep_ms(100);
    struct orb_rdma_stats st = stats_of(e);
    assert_int_equal(st.kept_memory_regions, 1);
    assert_int_equal(st.memory_regions, 0);
    assert_int_equal(itp_calls(ITP_DEREG_MR) - deregs0, mrs); /* each MR asked once */
    assert_int_equal(itp_failures(ITP_DEREG_MR) >= 1, 1);
    assert_true(fcntl(dmabuf, F_GETFD) >= 0);
    assert_int_equal(fake.counts().device_allocations, live);
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);
    itp_disarm(ITP_DEREG_MR);
    assert_int_equal(itp_calls(ITP_DEREG_MR) - deregs0, mrs); /* never asked again */
    assert_true(fcntl(dmabuf, F_GETFD) >= 0);
    assert_int_equal(fake.counts().device_allocations, live);
    itp_dmabuf_as_host(0);
}

/* READ `n` bytes of the source's device range at `off` into lbuf + loff, or WRITE them from
 * there; 0 or the failure (its report in *rep). */
static int move(orb_engine *e, orb_segment *seg, uint8_t op, uint64_t remote, const uint8_t *lbuf, size_t loff,
                size_t n, struct orb_batch_report *rep)
{
    struct orb_request r = {.transport = ORB_TRANSPORT_RDMA, .op = op, .local_addr = (uint64_t)(uintptr_t)(lbuf + loff),
                            .remote_addr = remote, .length = n};
    return orb_submit_and_wait(e, seg, &r, 1, NULL, TIMEOUT_NS, rep);
}

/* A Direct GPU source engine with a device allocation (device_alloc's, filled with a pattern that
 * `want` mirrors) and a host-memory requester connected to it; the registrations are the cells'. */
struct gpu_source {
    orb_engine *s, *e;
    orb_cuda_memory *m;
    uint64_t dev;            /* the allocation's device address */
    uint8_t *want, *got;     /* GPU_ALLOC bytes: what the device must hold, and a copy to compare */
    orb_host_memory *lm;
    uint8_t *lbuf;           /* the requester's GPU_ALLOC bytes, registered local-only */
    orb_reg_id lid;
    orb_segment *seg;
};

#define GPU_ALLOC (2 * LEN + 8192)

/* The source engine's transports when a cell replaces them (NULL: the library's). */
static const struct orb_transport_ops *const *source_ops;

static void gpu_source_open(struct gpu_source *g, const char *const *source_kv, unsigned mul, unsigned add)
{
    memset(g, 0, sizeof *g);
    if (rdma_test_engine_with(source_kv, 1, ORB_HELPER_OFF, source_ops, 2, &g->s) != 0)
        fail_msg("a Direct source: %s", orb_last_error());
    g->m = device_alloc();
    g->dev = orb_cuda_memory_ptr(g->m);
    g->want = malloc(GPU_ALLOC);
    g->got = malloc(GPU_ALLOC);
    assert_non_null(g->want);
    assert_non_null(g->got);
    for (size_t i = 0; i < GPU_ALLOC; i++)
        g->want[i] = (uint8_t)(i * mul + add);
    assert_int_equal(orb_cuda_memory_copy_in(g->m, 0, g->want, GPU_ALLOC), 0);
    const char *rk[] = {"rdma_whitelist", RDMA_TEST_REQUESTER_NICS, NULL};
    assert_int_equal(rdma_test_engine(rk, 0, ORB_HELPER_OFF, &g->e), 0);
    assert_int_equal(orb_host_memory_alloc(GPU_ALLOC, 4096, &g->lm), 0);
    g->lbuf = orb_host_memory_data(g->lm);
    assert_int_equal(orb_register_host_memory(g->e, g->lm, 0, GPU_ALLOC, ORB_PERM_LOCAL, &g->lid), 0);
    char ep[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    assert_int_equal(orb_engine_endpoint(g->s, ep, sizeof ep), 0);
    assert_int_equal(orb_engine_source_epoch(g->s, &epoch), 0);
    assert_int_equal(orb_open_segment(g->e, ep, &epoch, TIMEOUT_NS, &g->seg), 0);
}

/* The source's device memory equals `want`, every byte. */
static void gpu_source_check(struct gpu_source *g)
{
    assert_int_equal(orb_cuda_memory_copy_out(g->m, 0, g->got, GPU_ALLOC), 0);
    assert_memory_equal(g->got, g->want, GPU_ALLOC);
}

/* Close everything gpu_source_open made (the cells' registrations on the source go first). */
static void gpu_source_close(struct gpu_source *g)
{
    orb_segment_close(g->seg);
    assert_int_equal(orb_unregister_memory(g->e, g->lid), 0);
    orb_host_memory_unref(g->lm);
    assert_int_equal(orb_engine_close(g->e, TIMEOUT_NS), 0);
    orb_engine_free(g->e);
    orb_cuda_memory_unref(g->m);
    assert_int_equal(orb_engine_close(g->s, TIMEOUT_NS), 0);
    orb_engine_free(g->s);
    free(g->want);
    free(g->got);
}

/* A Direct source lends its device memory on private grants: each request gets, per rail, a
 * protection domain, a memory region of exactly its range with its op's access only (dma-buf:
 * offset from the export's base, iova the range's address), and a queue pair, all torn down
 * before the ACK; READs and WRITEs of every shape land every byte and nothing around them; a
 * request past the registration, or a WRITE of a read-only one, is refused before any byte
 * moves; nothing of the grants is left afterwards. */
static void test_a_direct_source_grants_device_memory_privately(void **state)
{
    (void)state;
    itp_dmabuf_as_host(1);
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_SOURCE_NICS, "cuda_memory", "direct", NULL};
    struct gpu_source g;
    gpu_source_open(&g, kv, 7, 3);
    orb_engine *s = g.s, *e = g.e;
    orb_cuda_memory *m = g.m;
    uint8_t *want = g.want, *lbuf = g.lbuf;
    orb_segment *seg = g.seg;
    const size_t dlen = GPU_ALLOC, reg_off = 4096 + 512, reg_len = 2 * LEN;
    uint64_t base = g.dev + reg_off;
    orb_reg_id id = 0;
    if (orb_register_cuda_memory(s, m, reg_off, reg_len, ORB_PERM_REMOTE_WRITE, &id) != 0)
        fail_msg("the source's Direct registration: %s", orb_last_error());
    /* The source's Describe says how it published the region: by dma-buf. */
    struct orb_region_desc *regs = NULL;
    size_t nregs = 0;
    assert_int_equal(orb_segment_describe(seg, TIMEOUT_NS, &regs, &nregs), 0);
    assert_int_equal(nregs, 1);
    assert_int_equal(regs[0].addr, base);
    assert_int_equal(regs[0].memory_kind, ORB_MEMORY_CUDA);
    assert_int_equal(regs[0].gpu_direct_routes, ORB_GPU_ROUTE_DMABUF);
    orb_region_descs_free(regs);

    struct orb_rdma_stats s0 = stats_of(s);
    uint64_t regs0 = itp_calls(ITP_REG_DMABUF_MR), pds0 = itp_calls(ITP_DEALLOC_PD), mws0 = itp_calls(ITP_ALLOC_MW);
    struct itp_wr_counts wrs0 = itp_wrs_posted();
    struct orb_batch_report rep;
    /* READs: one page at the base, an odd span in the middle, the whole range. */
    static const struct { size_t off, n; } reads[] = {{0, 4096}, {7, LEN + 1001}, {0, 2 * LEN}};
    uint64_t served = 0;
    for (size_t k = 0; k < sizeof reads / sizeof reads[0]; k++) {
        memset(lbuf, 0x11, dlen);
        if (move(e, seg, ORB_OP_READ, base + reads[k].off, lbuf, 5, reads[k].n, &rep) != 0)
            fail_msg("a READ of %zu bytes of a Direct source's device memory: %s", reads[k].n, orb_last_error());
        served++;
        assert_memory_equal(lbuf + 5, want + reg_off + reads[k].off, reads[k].n);
        assert_int_equal(lbuf[4], 0x11);
        assert_int_equal(lbuf[5 + reads[k].n], 0x11);
        /* The region was exactly the request's range, for READ only. */
        struct itp_dmabuf_call d = itp_last_dmabuf();
        assert_int_equal(d.offset, reg_off + reads[k].off);
        assert_int_equal(d.length, reads[k].n);
        assert_int_equal(d.iova, base + reads[k].off);
        assert_int_equal(d.access, IBV_ACCESS_REMOTE_READ);
    }
    /* WRITEs: an odd span, then the last page. */
    static const struct { size_t off, n; } writes[] = {{3, LEN + 77}, {2 * LEN - 4096, 4096}};
    for (size_t k = 0; k < sizeof writes / sizeof writes[0]; k++) {
        for (size_t i = 0; i < writes[k].n; i++)
            lbuf[i] = (uint8_t)(i * 31 + k);
        if (move(e, seg, ORB_OP_WRITE, base + writes[k].off, lbuf, 0, writes[k].n, &rep) != 0)
            fail_msg("a WRITE of %zu bytes into a Direct source's device memory: %s", writes[k].n, orb_last_error());
        served++;
        memcpy(want + reg_off + writes[k].off, lbuf, writes[k].n);
        gpu_source_check(&g); /* those bytes, and nothing around them */
        struct itp_dmabuf_call d = itp_last_dmabuf();
        assert_int_equal(d.length, writes[k].n);
        assert_int_equal(d.access, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);
    }
    /* Refused before any byte moves: a READ and a WRITE one byte past the registration. */
    memset(lbuf, 0x22, dlen);
    assert_int_equal(move(e, seg, ORB_OP_READ, base + reg_len - 100, lbuf, 0, 101, &rep), ORB_ENOENT);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    for (size_t i = 0; i < 101; i++)
        assert_int_equal(lbuf[i], 0x22);
    assert_int_equal(move(e, seg, ORB_OP_WRITE, base + reg_len - 100, lbuf, 0, 101, &rep), ORB_ENOENT);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    gpu_source_check(&g);

    /* Every grant served privately and acknowledged, and torn down: a domain freed for each
     * region made, no grant left active. */
    struct orb_rdma_stats s1 = stats_of(s);
    assert_int_equal(s1.private_grants - s0.private_grants, served);
    uint64_t made = itp_calls(ITP_REG_DMABUF_MR) - regs0;
    print_message("%llu private grants: %llu regions\n", (unsigned long long)served, (unsigned long long)made);
    assert_true(made >= served);
    assert_int_equal(itp_calls(ITP_DEALLOC_PD) - pds0, made);
    assert_int_equal(s1.grants_active, 0);
    /* No memory window was made or bound for device memory, and every grant ended with plain
     * SENDs fenced behind its payload (one per rail, as many as regions), none with invalidate. */
    struct itp_wr_counts wrs1 = itp_wrs_posted();
    print_message("work requests: %llu binds, %llu SENDs (%llu fenced), %llu SEND_WITH_INV\n",
                  (unsigned long long)(wrs1.binds - wrs0.binds), (unsigned long long)(wrs1.sends - wrs0.sends),
                  (unsigned long long)(wrs1.fenced_sends - wrs0.fenced_sends),
                  (unsigned long long)(wrs1.sends_with_inv - wrs0.sends_with_inv));
    assert_int_equal(itp_calls(ITP_ALLOC_MW) - mws0, 0);
    assert_int_equal(wrs1.binds - wrs0.binds, 0);
    assert_int_equal(wrs1.sends_with_inv - wrs0.sends_with_inv, 0);
    assert_true(wrs1.fenced_sends - wrs0.fenced_sends >= made); /* one per rail of each grant */
    assert_int_equal(s1.staged_transfers, s0.staged_transfers);

    /* What a private grant costs next to a window grant: 4 KiB READs one at a time from this
     * GPU source and from the suite's host source (printed; soft-RoCE under emulation measures
     * the emulator, so only the ratio means anything). */
    orb_segment *hseg = segment_to_source(e);
    uint64_t t0 = now_ns();
    for (int k = 0; k < 16; k++)
        assert_int_equal(move(e, seg, ORB_OP_READ, base + 4096u * (unsigned)k, lbuf, 0, 4096, &rep), 0);
    uint64_t t1 = now_ns();
    for (int k = 0; k < 16; k++)
        assert_int_equal(move(e, hseg, ORB_OP_READ, (uint64_t)(uintptr_t)sbytes + 4096u * (unsigned)k, lbuf, 0,
                              4096, &rep), 0);
    uint64_t t2 = now_ns();
    print_message("4 KiB READ, one at a time: %llu us from the GPU source (private grants), %llu us from a host "
                  "source (windows)\n", (unsigned long long)((t1 - t0) / 16000), (unsigned long long)((t2 - t1) / 16000));
    orb_segment_close(hseg);

    /* A read-only registration: a WRITE is refused (permission), a READ served. */
    assert_int_equal(orb_unregister_memory(s, id), 0);
    if (orb_register_cuda_memory(s, m, reg_off, reg_len, ORB_PERM_REMOTE_READ, &id) != 0)
        fail_msg("the source's read-only Direct registration: %s", orb_last_error());
    int rc = move(e, seg, ORB_OP_WRITE, base, lbuf, 0, 4096, &rep);
    assert_int_equal(rc, ORB_EPERM);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    gpu_source_check(&g);
    assert_int_equal(move(e, seg, ORB_OP_READ, base, lbuf, 0, 4096, &rep), 0);
    assert_memory_equal(lbuf, want + reg_off, 4096);

    assert_int_equal(orb_unregister_memory(s, id), 0);
    gpu_source_close(&g);
    itp_dmabuf_as_host(0);
}

/* A request run on its own thread, so that the cell can watch it wait. */
struct pending_move {
    orb_engine *e;
    orb_segment *seg;
    struct orb_request r;
    struct orb_batch_report rep;
    atomic_int finished;
    int rc;
};

static void *pending_move_main(void *arg)
{
    struct pending_move *m = arg;
    m->rc = orb_submit_and_wait(m->e, m->seg, &m->r, 1, NULL, TIMEOUT_NS, &m->rep);
    atomic_store(&m->finished, 1);
    return NULL;
}

static void count_producer_done(void *ctx)
{
    atomic_fetch_add((atomic_int *)ctx, 1);
}

/* The NIC's access to GPUDirect memory (a DMA loan) waits for a producer's recorded work, as a
 * staging copy does: a Direct source's private grant is not given, and a Direct requester's
 * WRITE not posted, until the producer's copy into the device ended, so the bytes that move are
 * the producer's, not older ones; its done callback runs once, after that. */
static void test_a_dma_loan_waits_for_its_producer(void **state)
{
    (void)state;
    itp_dmabuf_as_host(1);
    const struct orb_cuda *cu = NULL;
    assert_int_equal(orb_cuda_get(&cu), 0);
    orb_cu_device d0 = 0;
    orb_cu_context ctx0 = NULL;
    orb_cu_stream producer = NULL;
    assert_int_equal(cu->device_get(&d0, 0), ORB_CU_SUCCESS);
    assert_int_equal(cu->primary_ctx_retain(&ctx0, d0), ORB_CU_SUCCESS);
    assert_int_equal(cu->ctx_set_current(ctx0), ORB_CU_SUCCESS);
    assert_int_equal(cu->stream_create(&producer, ORB_CU_STREAM_NON_BLOCKING), ORB_CU_SUCCESS);
    assert_int_equal(cu->ctx_set_current(NULL), ORB_CU_SUCCESS);
    uint8_t *fresh = malloc(GPU_ALLOC);
    assert_non_null(fresh);

    /* The source's side: its device memory under Direct, rewritten by a held producer. */
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_SOURCE_NICS, "cuda_memory", "direct", NULL};
    struct gpu_source g;
    gpu_source_open(&g, kv, 11, 1);
    const size_t reg_off = 4096 + 512, reg_len = 2 * LEN;
    orb_reg_id id = 0;
    if (orb_register_cuda_memory(g.s, g.m, reg_off, reg_len, ORB_PERM_REMOTE_WRITE, &id) != 0)
        fail_msg("the source's Direct registration: %s", orb_last_error());
    for (size_t i = 0; i < GPU_ALLOC; i++)
        fresh[i] = (uint8_t)(i * 29 + 7);
    atomic_int done = 0;
    fake.hold_streams(1);
    assert_int_equal(cu->memcpy_htod_async(g.dev, fresh, GPU_ALLOC, producer), ORB_CU_SUCCESS);
    assert_int_equal(orb_cuda_memory_record_producer(g.m, producer, count_producer_done, &done), 0);
    memset(g.lbuf, 0x33, GPU_ALLOC);
    struct pending_move pm = {.e = g.e, .seg = g.seg};
    pm.r = (struct orb_request){.transport = ORB_TRANSPORT_RDMA, .op = ORB_OP_READ,
                                .local_addr = (uint64_t)(uintptr_t)g.lbuf, .remote_addr = g.dev + reg_off + 9,
                                .length = LEN + 4321};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, pending_move_main, &pm), 0);
    sleep_ms(300);
    assert_int_equal(atomic_load(&pm.finished), 0); /* its grant waits for the producer */
    assert_int_equal(atomic_load(&done), 0);
    fake.hold_streams(0);
    pthread_join(t, NULL);
    if (pm.rc != 0)
        fail_msg("a READ of a Direct source's device memory after its producer: %s", orb_last_error());
    assert_memory_equal(g.lbuf, fresh + reg_off + 9, LEN + 4321);
    assert_int_equal(atomic_load(&done), 1);
    /* Consumed once: the next READ does not wait, and done does not run again. */
    struct orb_batch_report rep;
    assert_int_equal(move(g.e, g.seg, ORB_OP_READ, g.dev + reg_off, g.lbuf, 0, 4096, &rep), 0);
    assert_memory_equal(g.lbuf, fresh + reg_off, 4096);
    assert_int_equal(atomic_load(&done), 1);
    assert_int_equal(orb_unregister_memory(g.s, id), 0);
    gpu_source_close(&g);

    /* The requester's side: a Direct WRITE from device memory a held producer rewrites. */
    orb_engine *e = requester("auto");
    orb_cuda_memory *m = device_alloc();
    orb_reg_id lid = 0;
    if (orb_register_cuda_memory(e, m, 4096, 2 * LEN, ORB_PERM_LOCAL, &lid) != 0)
        fail_msg("the requester's Direct registration: %s", orb_last_error());
    orb_segment *seg = segment_to_source(e);
    uint64_t dev = orb_cuda_memory_ptr(m);
    for (size_t i = 0; i < GPU_ALLOC; i++)
        fresh[i] = (uint8_t)(i * 17 + 2);
    atomic_store(&done, 0);
    fake.hold_streams(1);
    assert_int_equal(cu->memcpy_htod_async(dev, fresh, GPU_ALLOC, producer), ORB_CU_SUCCESS);
    assert_int_equal(orb_cuda_memory_record_producer(m, producer, count_producer_done, &done), 0);
    struct pending_move pw = {.e = e, .seg = seg};
    pw.r = (struct orb_request){.transport = ORB_TRANSPORT_RDMA, .op = ORB_OP_WRITE, .local_addr = dev + 4096 + 5,
                                .remote_addr = (uint64_t)(uintptr_t)sbytes + 3, .length = LEN + 999};
    assert_int_equal(pthread_create(&t, NULL, pending_move_main, &pw), 0);
    sleep_ms(300);
    assert_int_equal(atomic_load(&pw.finished), 0);
    assert_int_equal(atomic_load(&done), 0);
    fake.hold_streams(0);
    pthread_join(t, NULL);
    if (pw.rc != 0)
        fail_msg("a Direct WRITE from device memory after its producer: %s", orb_last_error());
    assert_memory_equal(sbytes + 3, fresh + 4096 + 5, LEN + 999);
    assert_int_equal(atomic_load(&done), 1);
    orb_segment_close(seg);
    assert_int_equal(orb_unregister_memory(e, lid), 0);
    orb_cuda_memory_unref(m);
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);
    for (size_t i = 0; i < 4 * LEN; i++) /* the source's bytes for the next cell */
        sbytes[i] = (uint8_t)(i * 13 + 5);
    assert_int_equal(cu->stream_destroy(producer), ORB_CU_SUCCESS);
    assert_int_equal(cu->primary_ctx_release(d0), ORB_CU_SUCCESS);
    free(fresh);
    itp_dmabuf_as_host(0);
}

/* A peer-memory module as the engine looks for one: in a mount namespace of this process's own,
 * /sys/kernel/mm becomes a small tmpfs with memory_peers/nv_mem/version in it. 0, or -1 when the
 * namespace or the mount cannot be had here (the caller skips). */
static int peermem_module_double(void)
{
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("peermem-double", "/sys/kernel/mm", "tmpfs", 0, "mode=0755") != 0)
        return -1;
    if (mkdir("/sys/kernel/mm/memory_peers", 0755) != 0 || mkdir("/sys/kernel/mm/memory_peers/nv_mem", 0755) != 0)
        return -1;
    int fd = open("/sys/kernel/mm/memory_peers/nv_mem/version", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    bool ok = write(fd, "1.0\n", 4) == 4;
    close(fd);
    return ok ? 0 : -1;
}

/* Peer memory (gpu_direct_registration peermem; the module a double, the NIC reaching the
 * stand-in's device bytes through the verbs interposer): the device pointer itself is registered,
 * exactly the range, at its own address as iova; bytes move both ways through it; nothing is
 * exported as dma-buf. auto takes peermem where dma-buf is missing. A registration the NIC
 * refuses is the registration's failure: no other route, nothing registered or counted. A Direct
 * source registered this way publishes the peermem route and serves its device bytes. */
static void test_peermem_registers_the_device_pointer(void **state)
{
    (void)state;
    if (peermem_module_double() != 0) {
        print_message("no private mount namespace here (%s): skipped\n", strerror(errno));
        skip();
    }
    itp_device_as_host(fake.host_view);
    uint64_t dmabufs0 = itp_calls(ITP_REG_DMABUF_MR);
    orb_engine *e = requester("peermem");
    orb_cuda_memory *m = device_alloc();
    uint64_t dev = orb_cuda_memory_ptr(m);
    uint8_t *want = malloc(GPU_ALLOC), *got = malloc(GPU_ALLOC);
    assert_non_null(want);
    assert_non_null(got);
    memset(want, 0x6b, GPU_ALLOC);
    assert_int_equal(orb_cuda_memory_copy_in(m, 0, want, GPU_ALLOC), 0);
    orb_reg_id id = 0;
    if (orb_register_cuda_memory(e, m, 4096, 2 * LEN, ORB_PERM_LOCAL, &id) != 0)
        fail_msg("the peermem registration: %s", orb_last_error());
    struct itp_reg_mr_call c = itp_last_reg_mr();
    assert_int_equal(c.addr, dev + 4096);
    assert_int_equal(c.iova, dev + 4096);
    assert_int_equal(c.length, 2 * LEN);
    struct orb_rdma_stats s0 = stats_of(e);
    assert_int_equal(s0.peermem_registrations, 1);
    assert_int_equal(s0.dmabuf_registrations, 0);
    assert_int_equal(itp_calls(ITP_REG_DMABUF_MR), dmabufs0);

    orb_segment *seg = segment_to_source(e);
    struct orb_request r = {.transport = ORB_TRANSPORT_RDMA, .op = ORB_OP_READ, .local_addr = dev + 4096 + 9,
                            .remote_addr = (uint64_t)(uintptr_t)sbytes + 5, .length = LEN + 777};
    struct orb_batch_report rep;
    if (orb_submit_and_wait(e, seg, &r, 1, NULL, TIMEOUT_NS, &rep) != 0)
        fail_msg("a READ into peermem-registered device memory: %s", orb_last_error());
    memcpy(want + 4096 + 9, sbytes + 5, LEN + 777);
    assert_int_equal(orb_cuda_memory_copy_out(m, 0, got, GPU_ALLOC), 0);
    assert_memory_equal(got, want, GPU_ALLOC);
    r.op = ORB_OP_WRITE;
    r.remote_addr = (uint64_t)(uintptr_t)sbytes + 2 * LEN + 1;
    if (orb_submit_and_wait(e, seg, &r, 1, NULL, TIMEOUT_NS, &rep) != 0)
        fail_msg("a WRITE from peermem-registered device memory: %s", orb_last_error());
    assert_memory_equal(sbytes + 2 * LEN + 1, want + 4096 + 9, LEN + 777);
    assert_int_equal(stats_of(e).staged_transfers, s0.staged_transfers); /* through its own MRs */

    /* Refused by the NIC: the registration fails, no other route is tried, nothing stays. */
    orb_cuda_memory *m2 = device_alloc();
    orb_reg_id id2 = 0;
    itp_arm(ITP_REG_MR, 1, EFAULT, -1, ITP_REFUSED_NAMED);
    int rc = orb_register_cuda_memory(e, m2, 0, LEN, ORB_PERM_LOCAL, &id2);
    itp_disarm(ITP_REG_MR);
    print_message("a refused peermem registration: %d (%s)\n", rc, orb_last_error());
    assert_int_not_equal(rc, 0);
    struct orb_rdma_stats s1 = stats_of(e);
    assert_int_equal(s1.peermem_registrations, 1);
    assert_int_equal(s1.registrations, s0.registrations);
    assert_int_equal(s1.registered_bytes, s0.registered_bytes);
    assert_int_equal(itp_calls(ITP_REG_DMABUF_MR), dmabufs0);
    orb_cuda_memory_unref(m2);
    orb_segment_close(seg);
    assert_int_equal(orb_unregister_memory(e, id), 0);
    orb_cuda_memory_unref(m);
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);

    /* auto, where the device offers no dma-buf: the module decides. */
    fake.set_dmabuf(0);
    e = requester("auto");
    m = device_alloc();
    if (orb_register_cuda_memory(e, m, 0, LEN, ORB_PERM_LOCAL, &id) != 0)
        fail_msg("auto without dma-buf, with a peer-memory module: %s", orb_last_error());
    assert_int_equal(stats_of(e).peermem_registrations, 1);
    assert_int_equal(itp_calls(ITP_REG_DMABUF_MR), dmabufs0);
    assert_int_equal(orb_unregister_memory(e, id), 0);
    orb_cuda_memory_unref(m);
    assert_int_equal(orb_engine_close(e, TIMEOUT_NS), 0);
    orb_engine_free(e);
    fake.set_dmabuf(1);

    /* A Direct source by peermem: Describe says so, and its device bytes are served. */
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_SOURCE_NICS, "cuda_memory", "direct", "gpu_direct_registration",
                        "peermem", NULL};
    struct gpu_source g;
    gpu_source_open(&g, kv, 3, 8);
    const size_t reg_off = 4096 + 512;
    if (orb_register_cuda_memory(g.s, g.m, reg_off, 2 * LEN, ORB_PERM_REMOTE_WRITE, &id) != 0)
        fail_msg("the source's peermem registration: %s", orb_last_error());
    struct orb_region_desc *regs = NULL;
    size_t nregs = 0;
    assert_int_equal(orb_segment_describe(g.seg, TIMEOUT_NS, &regs, &nregs), 0);
    assert_int_equal(nregs, 1);
    assert_int_equal(regs[0].memory_kind, ORB_MEMORY_CUDA);
    assert_int_equal(regs[0].gpu_direct_routes, ORB_GPU_ROUTE_PEERMEM);
    orb_region_descs_free(regs);
    assert_int_equal(stats_of(g.s).peermem_registrations, 1);
    memset(g.lbuf, 0x44, GPU_ALLOC);
    if (move(g.e, g.seg, ORB_OP_READ, g.dev + reg_off + 3, g.lbuf, 0, LEN + 55, &rep) != 0)
        fail_msg("a READ of a peermem source's device memory: %s", orb_last_error());
    assert_memory_equal(g.lbuf, g.want + reg_off + 3, LEN + 55);
    assert_int_equal(orb_unregister_memory(g.s, id), 0);
    gpu_source_close(&g);

    itp_device_as_host(NULL);
    (void)umount2("/sys/kernel/mm", MNT_DETACH); /* the module double goes for the later cells */
    for (size_t i = 0; i < 4 * LEN; i++) /* the source's bytes for the next cell */
        sbytes[i] = (uint8_t)(i * 13 + 5);
    free(want);
    free(got);
}

/* A private grant whose end never comes (the requester's fenced SEND is refused at its device) is
 * torn down alone at the source once io_timeout_s and the grace passed: its domain freed, its
 * charge back, while the connection goes on serving (the READ itself is asked again and lands).
 * A requester that stages moves device memory from a Direct source slot by slot, each slot a
 * private grant of its own. */
static void test_a_private_grant_that_never_ends_goes_alone(void **state)
{
    (void)state;
    itp_dmabuf_as_host(1);
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_SOURCE_NICS, "cuda_memory", "direct", "io_timeout_s", "2", NULL};
    struct gpu_source g;
    gpu_source_open(&g, kv, 11, 1);
    orb_engine *s = g.s, *e = g.e;
    uint8_t *want = g.want, *lbuf = g.lbuf;
    orb_segment *seg = g.seg;
    const size_t dlen = GPU_ALLOC;
    uint64_t dev = g.dev;
    orb_reg_id id = 0;
    assert_int_equal(orb_register_cuda_memory(s, g.m, 0, dlen, ORB_PERM_REMOTE_WRITE, &id), 0);
    const char *staged[] = {"rdma_whitelist", RDMA_TEST_REQUESTER_NICS, "host_memory", "staged",
                            "max_staging_bytes", "1048576", NULL};
    orb_engine *st = NULL;
    assert_int_equal(rdma_test_engine(staged, 0, ORB_HELPER_OFF, &st), 0);
    orb_reg_id sid = 0;
    assert_int_equal(orb_register_host_memory(st, g.lm, 0, dlen, ORB_PERM_LOCAL, &sid), 0);
    char ep[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    assert_int_equal(orb_engine_endpoint(s, ep, sizeof ep), 0);
    assert_int_equal(orb_engine_source_epoch(s, &epoch), 0);
    orb_segment *sseg = NULL;
    assert_int_equal(orb_open_segment(st, ep, &epoch, TIMEOUT_NS, &sseg), 0);
    struct orb_batch_report rep;
    /* One served grant first: the connection and its lanes are up. */
    assert_int_equal(move(e, seg, ORB_OP_READ, dev, lbuf, 0, 4096, &rep), 0);
    struct orb_rdma_stats s0 = stats_of(s), r0 = stats_of(e);
    uint64_t regs0 = itp_calls(ITP_REG_DMABUF_MR), pds0 = itp_calls(ITP_DEALLOC_PD);
    /* The next SEND posted is that READ's fenced end on its private queue pair: refused. */
    itp_arm(ITP_POST_SEND, 1, EIO, IBV_WR_SEND, ITP_REFUSED_NAMED);
    memset(lbuf, 0, dlen);
    if (move(e, seg, ORB_OP_READ, dev + 100, lbuf, 0, 8192, &rep) != 0)
        fail_msg("a READ whose first private grant lost its end: %s", orb_last_error());
    itp_disarm(ITP_POST_SEND);
    assert_true(itp_failures(ITP_POST_SEND) >= 1);
    assert_memory_equal(lbuf, want + 100, 8192);
    struct orb_rdma_stats r1 = stats_of(e);
    assert_int_equal(r1.read_replays - r0.read_replays, 1);
    /* The first grant is still held at the source, then torn down alone by its expiry. */
    assert_int_equal(stats_of(s).grants_active, 1);
    for (int i = 0; i < 100 && stats_of(s).grants_active != 0; i++)
        sleep_ms(100);
    struct orb_rdma_stats s1 = stats_of(s);
    assert_int_equal(s1.grants_active, 0);
    assert_int_equal(s1.private_grants - s0.private_grants, 1); /* the replay's, acknowledged */
    assert_int_equal(itp_calls(ITP_DEALLOC_PD) - pds0, itp_calls(ITP_REG_DMABUF_MR) - regs0);
    /* The connection lived on: the next request needs no rebuilt connection. */
    assert_int_equal(move(e, seg, ORB_OP_WRITE, dev + 3 * 4096, lbuf, 0, 4096, &rep), 0);
    memcpy(want + 3 * 4096, lbuf, 4096);
    assert_int_equal(stats_of(e).reconnects, r0.reconnects);
    assert_int_equal(s1.source_connections, s0.source_connections);

    /* A staging requester (slots of 256 KiB) against the Direct source: each slot a private
     * grant. */
    uint64_t served = stats_of(s).private_grants;
    const size_t n = LEN + 5;
    memset(lbuf, 0x33, dlen);
    if (move(st, sseg, ORB_OP_READ, dev + 9, lbuf, 1, n, &rep) != 0)
        fail_msg("a staged READ from a Direct source: %s", orb_last_error());
    assert_memory_equal(lbuf + 1, want + 9, n);
    assert_int_equal(lbuf[0], 0x33);
    assert_int_equal(lbuf[1 + n], 0x33);
    assert_int_equal(stats_of(s).private_grants - served, (n + (256u << 10) - 1) / (256u << 10));
    for (size_t i = 0; i < n; i++)
        lbuf[i] = (uint8_t)(i ^ 0x5a);
    if (move(st, sseg, ORB_OP_WRITE, dev + LEN / 2, lbuf, 0, n, &rep) != 0)
        fail_msg("a staged WRITE into a Direct source: %s", orb_last_error());
    memcpy(want + LEN / 2, lbuf, n);
    gpu_source_check(&g);
    assert_int_equal(stats_of(s).grants_active, 0);

    orb_segment_close(sseg);
    assert_int_equal(orb_unregister_memory(st, sid), 0);
    assert_int_equal(orb_engine_close(st, TIMEOUT_NS), 0);
    orb_engine_free(st);
    assert_int_equal(orb_unregister_memory(s, id), 0);
    gpu_source_close(&g);
    itp_dmabuf_as_host(0);
}

/* gpu_source_reuse where no NIC can make DevX keys (soft-RoCE, opened without the helper): the
 * registration's probe fails on each NIC and says so (counted once per registration), and the
 * grants stay private, every byte landing as without the option; no key is ever made. */
static void test_gpu_source_reuse_stays_private_where_keys_cannot_be_made(void **state)
{
    (void)state;
    itp_dmabuf_as_host(1);
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_SOURCE_NICS, "cuda_memory", "direct", "gpu_source_reuse", "true",
                        NULL};
    struct gpu_source g;
    gpu_source_open(&g, kv, 11, 1);
    const size_t reg_off = 4096 + 512, reg_len = 2 * LEN;
    uint64_t base = g.dev + reg_off;
    struct orb_rdma_stats s0 = stats_of(g.s);
    orb_reg_id id = 0;
    if (orb_register_cuda_memory(g.s, g.m, reg_off, reg_len, ORB_PERM_REMOTE_WRITE, &id) != 0)
        fail_msg("the source's Direct registration: %s", orb_last_error());
    assert_int_equal(stats_of(g.s).reuse_probe_failures - s0.reuse_probe_failures, 1);
    /* A local-only registration is never probed: no peer can be granted it. */
    orb_reg_id local_id = 0;
    assert_int_equal(orb_register_cuda_memory(g.s, g.m, 0, 4096, ORB_PERM_LOCAL, &local_id), 0);
    assert_int_equal(stats_of(g.s).reuse_probe_failures - s0.reuse_probe_failures, 1);
    assert_int_equal(orb_unregister_memory(g.s, local_id), 0);

    struct orb_batch_report rep;
    memset(g.lbuf, 0x11, GPU_ALLOC);
    if (move(g.e, g.seg, ORB_OP_READ, base + 9, g.lbuf, 3, LEN + 5, &rep) != 0)
        fail_msg("a READ with gpu_source_reuse: %s", orb_last_error());
    assert_memory_equal(g.lbuf + 3, g.want + reg_off + 9, LEN + 5);
    assert_int_equal(g.lbuf[2], 0x11);
    assert_int_equal(g.lbuf[3 + LEN + 5], 0x11);
    for (size_t i = 0; i < 8192; i++)
        g.lbuf[i] = (uint8_t)(i * 3 + 7);
    if (move(g.e, g.seg, ORB_OP_WRITE, base + 100, g.lbuf, 0, 8192, &rep) != 0)
        fail_msg("a WRITE with gpu_source_reuse: %s", orb_last_error());
    memcpy(g.want + reg_off + 100, g.lbuf, 8192);
    gpu_source_check(&g);
    struct orb_rdma_stats s1 = stats_of(g.s);
    assert_int_equal(s1.private_grants - s0.private_grants, 2);
    assert_int_equal(s1.reuse_grants, s0.reuse_grants);
    assert_int_equal(s1.kept_keys, 0);
    assert_int_equal(s1.grants_active, 0);

    assert_int_equal(orb_unregister_memory(g.s, id), 0);
    gpu_source_close(&g);
    itp_dmabuf_as_host(0);
}


/* ---- gpu_source_reuse with keys made (the DevX double, devx_double.h) ------------------------- */

static int devx_start(orb_engine *engine, void **tp_out)
{
    struct orb_rdma_env env = *orb_rdma_real_env();
    env.devx_ops = devx_double_ops();
    env.devx_verify = devx_double_verify;
    return orb_rdma_tp_start_with(engine, &env, tp_out);
}

static struct orb_transport_ops devx_rdma;
static const struct orb_transport_ops *const devx_source_ops[] = {&orb_tcp_transport, &devx_rdma};

/* A Direct gpu_source_reuse source whose NICs make keys through the double, and its registration
 * of the allocation's [reg_off, +2 LEN) for remote writes (probed on each NIC). */
#define REUSE_REG_OFF (4096u + 512u)
static orb_reg_id reuse_source_open(struct gpu_source *g, unsigned mul, unsigned add)
{
    for (int f = 0; f < DEVX_DOUBLE_FAULTS; f++)
        devx_double_fault((enum devx_double_fault)f, 0, 0);
    itp_dmabuf_as_host(1);
    devx_double_install(fake.host_view);
    devx_rdma = orb_rdma_transport;
    devx_rdma.start = devx_start;
    source_ops = devx_source_ops;
    const char *kv[] = {"rdma_whitelist", RDMA_TEST_SOURCE_NICS, "cuda_memory", "direct", "gpu_source_reuse", "true",
                        NULL};
    gpu_source_open(g, kv, mul, add);
    source_ops = NULL;
    orb_reg_id id = 0;
    if (orb_register_cuda_memory(g->s, g->m, REUSE_REG_OFF, 2 * LEN, ORB_PERM_REMOTE_WRITE, &id) != 0)
        fail_msg("the source's Direct registration: %s", orb_last_error());
    return id;
}

static void reuse_source_close(struct gpu_source *g, orb_reg_id id)
{
    assert_int_equal(orb_unregister_memory(g->s, id), 0);
    gpu_source_close(g);
    itp_dmabuf_as_host(0);
    for (int f = 0; f < DEVX_DOUBLE_FAULTS; f++)
        devx_double_fault((enum devx_double_fault)f, 0, 0);
}

/* The source's NICs (as many as the rails of a connection to it). */
static size_t source_nics(void)
{
    size_t n = 0;
    const char *list = RDMA_TEST_SOURCE_NICS;
    for (const char *p = list; *p != '\0';) {
        size_t len = strcspn(p, ",");
        n += len > 0;
        p += len + (p[len] == ',');
    }
    return n;
}

/* The keys made from the `from`-th on, one per rail: each checked, bound to a QP of its own
 * (never the wildcard), exactly [addr, +len) with only `op`'s remote right, posted with,
 * invalidated by the peer on its QP and destroyed. */
static void check_grant_keys(size_t from, size_t to, uint8_t op, uint64_t addr, uint64_t len)
{
    size_t n = 0;
    uint32_t qpns[ORB_RDMA_MAX_RAILS];
    struct devx_double_key k;
    assert_int_equal(to - from, source_nics()); /* a 1 MiB request is sliced over every rail */
    for (size_t i = from; i < to && devx_double_key(i, &k); i++, n++) {
        for (size_t j = 0; j < n; j++)
            assert_int_not_equal(qpns[j], k.qpn);
        qpns[n] = k.qpn;
        print_message("key 0x%08x: qpn %u, 0x%llx +%llu, %s, %u posts\n", k.key, k.qpn, (unsigned long long)k.addr,
                      (unsigned long long)k.len, k.remote_read ? "read" : "write", k.posts);
        assert_true(k.verified);
        assert_int_not_equal(k.qpn, 0xFFFFFFu);
        assert_int_equal(k.addr, addr);
        assert_int_equal(k.len, len);
        assert_int_equal(k.remote_read, op == ORB_OP_READ);
        assert_int_equal(k.remote_write, op == ORB_OP_WRITE);
        assert_true(k.posts >= 1);
        assert_true(k.invalidated);
        assert_true(k.destroyed);
    }
    assert_int_equal(n, to - from);
}

/* gpu_source_reuse where the NICs make keys: the registration's probe makes, checks and destroys
 * one READ key per NIC; then each request's grant is one key per rail on the connection's own
 * queue pair of that rail, exactly the request's range and direction, checked before it is
 * published, used by the requester's payload, ended by its SEND_WITH_INV on that queue pair and
 * destroyed before the ACK. No private queue pair, no window bind, no memory window; every byte
 * lands and nothing around it. */
static void test_gpu_source_reuse_grants_by_verified_keys(void **state)
{
    (void)state;
    struct devx_double_counts d0 = devx_double_counts();
    struct gpu_source g;
    orb_reg_id id = reuse_source_open(&g, 7, 3);
    const uint64_t base = g.dev + REUSE_REG_OFF;
    struct devx_double_counts d1 = devx_double_counts();
    const size_t nics = source_nics();
    assert_int_equal(d1.creates - d0.creates, nics); /* the probe: one key per NIC */
    assert_int_equal(d1.destroys - d0.destroys, nics);
    assert_int_equal(d1.verifies - d0.verifies, nics);
    assert_int_equal(d1.verify_failures, d0.verify_failures);
    assert_int_equal(d1.live, d0.live);
    struct devx_double_key k;
    for (size_t i = d0.creates; i < d1.creates; i++) {
        assert_true(devx_double_key(i, &k));
        assert_true(k.verified && k.destroyed && k.remote_read && !k.remote_write);
        assert_int_equal(k.posts, 0);
    }
    struct orb_rdma_stats s0 = stats_of(g.s), r0 = stats_of(g.e);
    assert_int_equal(s0.reuse_probe_failures, 0);
    struct itp_wr_counts w0 = itp_wrs_posted();
    int64_t mws0 = itp_live_mws();

    struct orb_batch_report rep;
    memset(g.lbuf, 0x11, GPU_ALLOC);
    if (move(g.e, g.seg, ORB_OP_READ, base + 9, g.lbuf, 3, LEN + 5, &rep) != 0)
        fail_msg("a READ by DevX keys: %s", orb_last_error());
    assert_memory_equal(g.lbuf + 3, g.want + REUSE_REG_OFF + 9, LEN + 5);
    assert_int_equal(g.lbuf[2], 0x11);
    assert_int_equal(g.lbuf[3 + LEN + 5], 0x11);
    struct devx_double_counts d2 = devx_double_counts();
    check_grant_keys(d1.creates, d2.creates, ORB_OP_READ, base + 9, LEN + 5);

    for (size_t i = 0; i < LEN; i++)
        g.lbuf[i] = (uint8_t)(i * 3 + 7);
    if (move(g.e, g.seg, ORB_OP_WRITE, base + 100, g.lbuf, 0, LEN, &rep) != 0)
        fail_msg("a WRITE by DevX keys: %s", orb_last_error());
    memcpy(g.want + REUSE_REG_OFF + 100, g.lbuf, LEN);
    gpu_source_check(&g);
    struct devx_double_counts d3 = devx_double_counts();
    check_grant_keys(d2.creates, d3.creates, ORB_OP_WRITE, base + 100, LEN);

    assert_int_equal(d3.invalidations - d1.invalidations, 2 * nics);
    assert_int_equal(d3.refused_posts, d0.refused_posts);
    assert_int_equal(d3.live, d0.live);
    struct orb_rdma_stats s1 = stats_of(g.s);
    assert_int_equal(s1.reuse_grants - s0.reuse_grants, 2);
    assert_int_equal(s1.private_grants, s0.private_grants);
    assert_int_equal(s1.kept_keys, 0);
    assert_int_equal(s1.grants_active, 0);
    assert_int_equal(stats_of(g.e).reconnects, r0.reconnects);
    struct itp_wr_counts w1 = itp_wrs_posted();
    assert_int_equal(w1.binds, w0.binds);
    assert_int_equal(w1.sends_with_inv - w0.sends_with_inv, 2 * nics); /* one per rail's key */
    assert_int_equal(itp_live_mws(), mws0);
    reuse_source_close(&g, id);
}

/* A key that fails the helper's check at a grant (the device bound it to the wildcard QP) is
 * destroyed unpublished, with any key already made for the grant's other rails, and the request
 * is granted privately, every byte landing; a key the device will not make is the same. A
 * registration whose probe fails on every NIC (counted once) has its grants private. */
static void test_a_key_that_fails_its_check_is_never_published(void **state)
{
    (void)state;
    struct gpu_source g;
    orb_reg_id id = reuse_source_open(&g, 5, 1);
    const uint64_t base = g.dev + REUSE_REG_OFF;
    struct orb_batch_report rep;
    struct orb_rdma_stats s0 = stats_of(g.s);
    const uint32_t rails = (uint32_t)source_nics();
    uint64_t privately = 0;
    for (uint32_t skip = 0; skip < rails && skip < 2; skip++) { /* the first rail's key, a later one's */
        struct devx_double_counts d0 = devx_double_counts();
        devx_double_fault(DEVX_DOUBLE_WILDCARD, skip, 1);
        memset(g.lbuf, 0x22, GPU_ALLOC);
        if (move(g.e, g.seg, ORB_OP_READ, base + 1000 * skip, g.lbuf, 1, LEN + 3, &rep) != 0)
            fail_msg("a READ whose key failed its check: %s", orb_last_error());
        assert_memory_equal(g.lbuf + 1, g.want + REUSE_REG_OFF + 1000 * skip, LEN + 3);
        assert_int_equal(g.lbuf[0], 0x22);
        assert_int_equal(g.lbuf[1 + LEN + 3], 0x22);
        privately++;
        struct devx_double_counts d1 = devx_double_counts();
        assert_int_equal(d1.verify_failures - d0.verify_failures, 1);
        assert_int_equal(d1.creates - d0.creates, skip + 1);
        assert_int_equal(d1.live, d0.live); /* the failed key and any made before it: destroyed */
        assert_int_equal(d1.refused_posts, d0.refused_posts);
        for (size_t i = d0.creates; i < d1.creates; i++) {
            struct devx_double_key k;
            assert_true(devx_double_key(i, &k));
            assert_int_equal(k.posts, 0); /* none was published */
        }
    }
    struct orb_rdma_stats s1 = stats_of(g.s);
    assert_int_equal(s1.private_grants - s0.private_grants, privately);
    assert_int_equal(s1.reuse_grants, s0.reuse_grants);
    assert_int_equal(s1.grants_active, 0);
    /* A refused CREATE: the same. */
    devx_double_fault(DEVX_DOUBLE_CREATE_REFUSED, 0, 1);
    if (move(g.e, g.seg, ORB_OP_WRITE, base + 64, g.lbuf, 0, 4096, &rep) != 0)
        fail_msg("a WRITE whose key the device would not make: %s", orb_last_error());
    memcpy(g.want + REUSE_REG_OFF + 64, g.lbuf, 4096);
    gpu_source_check(&g);
    assert_int_equal(stats_of(g.s).private_grants - s1.private_grants, 1);

    /* A probe that fails on every NIC: that registration's grants stay private. */
    struct orb_rdma_stats s2 = stats_of(g.s);
    struct devx_double_counts d2 = devx_double_counts();
    devx_double_fault(DEVX_DOUBLE_WILDCARD, 0, rails);
    orb_reg_id id2 = 0;
    assert_int_equal(orb_register_cuda_memory(g.s, g.m, 0, 4096, ORB_PERM_REMOTE_READ, &id2), 0);
    assert_int_equal(stats_of(g.s).reuse_probe_failures - s2.reuse_probe_failures, 1);
    struct devx_double_counts d3 = devx_double_counts();
    assert_int_equal(d3.verify_failures - d2.verify_failures, rails);
    assert_int_equal(d3.live, d2.live);
    memset(g.lbuf, 0, 4096);
    if (move(g.e, g.seg, ORB_OP_READ, g.dev + 8, g.lbuf, 0, 4000, &rep) != 0)
        fail_msg("a READ of a registration whose probe failed: %s", orb_last_error());
    assert_memory_equal(g.lbuf, g.want + 8, 4000);
    struct orb_rdma_stats s3 = stats_of(g.s);
    assert_int_equal(s3.private_grants - s2.private_grants, 1);
    assert_int_equal(s3.reuse_grants, s2.reuse_grants);
    assert_int_equal(devx_double_counts().creates, d3.creates); /* no key tried for it */
    assert_int_equal(orb_unregister_memory(g.s, id2), 0);
    reuse_source_close(&g, id);
}

/* A key the device refuses to destroy keeps its authority uncertain, so what it reaches is kept
 * for good, counted in kept_keys: at a grant's end the request fails with ORB_EUNQUIESCED and the
 * device allocation outlives its registration, its owner and the engines; at a registration's
 * probe the registration fails with ORB_EUNQUIESCED. */
static void test_a_key_that_cannot_be_destroyed_keeps_its_memory(void **state)
{
    (void)state;
    struct gpu_source g;
    orb_reg_id id = reuse_source_open(&g, 9, 4);
    const uint64_t base = g.dev + REUSE_REG_OFF;
    struct orb_batch_report rep;
    struct orb_rdma_stats s0 = stats_of(g.s);
    long allocations = fake.counts().device_allocations;
    uint64_t live0 = devx_double_counts().live;
    devx_double_fault(DEVX_DOUBLE_DESTROY_REFUSED, 0, 1);
    int rc = move(g.e, g.seg, ORB_OP_READ, base, g.lbuf, 0, 8192, &rep);
    print_message("a READ whose key could not be destroyed: %d (%s)\n", rc, orb_last_error());
    assert_int_equal(rc, ORB_EUNQUIESCED);
    assert_int_equal(rep.status, ORB_EUNQUIESCED);
    struct orb_rdma_stats s1 = stats_of(g.s);
    assert_int_equal(s1.kept_keys - s0.kept_keys, 1);
    assert_int_equal(s1.grants_active, 0);
    assert_int_equal(devx_double_counts().live - live0, 1);

    devx_double_fault(DEVX_DOUBLE_DESTROY_REFUSED, 0, 1);
    orb_reg_id id2 = 0;
    assert_int_equal(orb_register_cuda_memory(g.s, g.m, 0, 4096, ORB_PERM_REMOTE_READ, &id2), ORB_EUNQUIESCED);
    assert_int_equal(stats_of(g.s).kept_keys - s0.kept_keys, 2);
    assert_int_equal(devx_double_counts().live - live0, 2);

    assert_int_equal(orb_unregister_memory(g.s, id), 0);
    gpu_source_close(&g); /* the allocation's owner goes too */
    assert_int_equal(fake.counts().device_allocations, allocations);
    itp_dmabuf_as_host(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_direct_needs_scatter_to_cqe_off),
        cmocka_unit_test(test_a_refused_dmabuf_registration_is_the_registrations),
        cmocka_unit_test(test_no_route_names_what_is_missing),
        cmocka_unit_test(test_a_direct_requester_moves_device_bytes),
        cmocka_unit_test(test_a_direct_source_grants_device_memory_privately),
        cmocka_unit_test(test_a_dma_loan_waits_for_its_producer),
        cmocka_unit_test(test_peermem_registers_the_device_pointer),
        cmocka_unit_test(test_a_private_grant_that_never_ends_goes_alone),
        cmocka_unit_test(test_gpu_source_reuse_stays_private_where_keys_cannot_be_made),
        cmocka_unit_test(test_a_refused_dmabuf_deregistration_keeps_everything),
        cmocka_unit_test(test_gpu_source_reuse_grants_by_verified_keys),
        cmocka_unit_test(test_a_key_that_fails_its_check_is_never_published),
        cmocka_unit_test(test_a_key_that_cannot_be_destroyed_keeps_its_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
