/* The verbs calls the RDMA transport is built on, against a real device through the run-time
 * loader (lib/rdma/verbs.h): discovery (device, port, IPv4-mapped RoCE GID), a protection domain,
 * memory registered with iova = address, two RC queue pairs connected to each other, RDMA WRITE
 * and READ from 1 byte to 1 MiB with every byte checked, and a type-2B memory window bound
 * read-only to a sub-range: a READ inside it works, a WRITE through it fails at the device and
 * leaves the target unchanged.
 *
 * A hardware check: it exits 77 without a verbs device. ctest runs it on this machine (skipped)
 * and inside the soft-RoCE VM (tests/vm/vm-run.sh), where it runs for real. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <orbite/orbite.h>

#include "device_util.h"
#include "rdma/devices.h"
#include "rdma/verbs.h"
#include "topo/sysfs.h"

#define BUF (1u << 20)
#define CQ_DEPTH 64
#define POLL_DEADLINE_NS (30ull * 1000000000ull) /* rxe under emulation is slow, never this slow */

struct rig {
    const struct orb_verbs *v;
    struct ibv_device **list;
    struct ibv_context *ctx;
    uint8_t port;
    int gid_index;
    union ibv_gid gid;
    enum ibv_mtu mtu;
    struct ibv_pd *pd;
    uint8_t *src, *dst, *back;
    struct ibv_mr *src_mr, *dst_mr, *back_mr;
    struct ibv_cq *cq_a, *cq_b;
    struct ibv_qp *qp_a, *qp_b; /* a posts; b is the target side */
};

static struct rig g;

static bool ipv4_mapped(const union ibv_gid *gid)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(gid->raw, prefix, sizeof prefix) == 0 && memcmp(gid->raw + 12, "\0\0\0\0", 4) != 0;
}

static struct ibv_mr *reg(void *addr, size_t len, unsigned access)
{
    struct ibv_mr *mr = g.v->reg_mr_iova2(g.pd, addr, len, (uint64_t)(uintptr_t)addr, access);
    if (mr == NULL)
        fail_msg("reg_mr_iova2 of %zu bytes: %s", len, strerror(errno));
    assert_int_equal(mr->length, len);
    return mr;
}

static void to_rts_with(struct ibv_qp *qp, uint32_t remote_qpn, const union ibv_gid *dgid, int sgid_index,
                        enum ibv_mtu mtu);

static void to_rts(struct ibv_qp *qp, uint32_t remote_qpn)
{
    to_rts_with(qp, remote_qpn, &g.gid, g.gid_index, g.mtu);
}

static void to_rts_with(struct ibv_qp *qp, uint32_t remote_qpn, const union ibv_gid *dgid, int sgid_index,
                        enum ibv_mtu mtu)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = g.port;
    a.pkey_index = 0;
    a.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    assert_int_equal(g.v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 1;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *dgid;
    a.ah_attr.grh.sgid_index = (uint8_t)sgid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = g.port;
    assert_int_equal(g.v->modify_qp(qp, &a,
                                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
                     0);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 18;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 1;
    a.max_rd_atomic = 16;
    assert_int_equal(g.v->modify_qp(qp, &a,
                                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
                     0);
}

static struct ibv_qp *make_qp_on(struct ibv_pd *pd, struct ibv_cq *cq)
{
    struct ibv_qp_init_attr init;
    memset(&init, 0, sizeof init);
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 32;
    init.cap.max_recv_wr = 32;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    struct ibv_qp *qp = g.v->create_qp(pd, &init);
    if (qp == NULL)
        fail_msg("create_qp: %s", strerror(errno));
    return qp;
}

static struct ibv_qp *make_qp(struct ibv_cq *cq)
{
    return make_qp_on(g.pd, cq);
}

/* One completion of `cq`, within the deadline. */
static struct ibv_wc poll_one(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    uint64_t deadline = now_ns() + POLL_DEADLINE_NS;
    for (;;) {
        int n = ibv_poll_cq(cq, 1, &wc);
        assert_true(n >= 0);
        if (n == 1)
            return wc;
        if (now_ns() > deadline)
            fail_msg("no completion within %llu s", (unsigned long long)(POLL_DEADLINE_NS / 1000000000ull));
    }
}

/* Post one signalled RDMA operation on `qp` and return its completion from `cq`. */
static struct ibv_wc rdma_op_on(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op, void *local,
                                uint32_t lkey, uint64_t remote, uint32_t rkey, uint32_t len, uint64_t id)
{
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)local, .length = len, .lkey = lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    assert_int_equal(ibv_post_send(qp, &wr, &bad), 0);
    struct ibv_wc wc = poll_one(cq);
    assert_int_equal(wc.wr_id, id);
    return wc;
}

/* The same on the device test's own pair (qp_a posts). */
static struct ibv_wc rdma_op(enum ibv_wr_opcode op, void *local, uint32_t lkey, uint64_t remote, uint32_t rkey,
                             uint32_t len, uint64_t id)
{
    return rdma_op_on(g.qp_a, g.cq_a, op, local, lkey, remote, rkey, len, id);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

static int setup(void **state)
{
    (void)state;
    memset(&g, 0, sizeof g);
    if (orb_verbs_get(&g.v) != 0) {
        if (getenv("ORBITE_VM") != NULL)
            fail_msg("inside the test VM: %s", orb_last_error());
        printf("skipped: %s\n", orb_last_error());
        exit(77);
    }
    int n = 0;
    g.list = g.v->get_device_list(&n);
    if (g.list == NULL || n == 0) {
        /* Inside the test VM a device is the point: its absence is a failure there. */
        if (getenv("ORBITE_VM") != NULL)
            fail_msg("no verbs device inside the test VM");
        printf("skipped: no verbs device\n");
        exit(77);
    }
    g.ctx = g.v->open_device(g.list[0]);
    if (g.ctx == NULL)
        fail_msg("open_device %s: %s", g.v->get_device_name(g.list[0]), strerror(errno));
    struct ibv_device_attr dev;
    assert_int_equal(g.v->query_device(g.ctx, &dev), 0);
    assert_true(dev.phys_port_cnt >= 1);
    g.port = 1;
    struct ibv_port_attr port;
    assert_int_equal(orb_verbs_query_port(g.v, g.ctx, g.port, &port), 0);
    assert_int_equal(port.state, IBV_PORT_ACTIVE);
    assert_true(port.gid_tbl_len > 0);
    g.mtu = port.active_mtu;
    g.gid_index = -1;
    for (int i = 0; i < port.gid_tbl_len && g.gid_index < 0; i++) {
        union ibv_gid gid;
        if (g.v->query_gid(g.ctx, g.port, i, &gid) == 0 && ipv4_mapped(&gid)) {
            g.gid_index = i;
            g.gid = gid;
        }
    }
    assert_true(g.gid_index >= 0);
    print_message("%s: port %u, mtu %d, GID index %d, %s memory windows\n", g.v->get_device_name(g.list[0]),
                  g.port, 128 << g.mtu, g.gid_index,
                  (dev.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) ? "type-2B" : "no type-2B");
    g.pd = g.v->alloc_pd(g.ctx);
    assert_non_null(g.pd);
    g.src = aligned_alloc(4096, BUF);
    g.dst = aligned_alloc(4096, BUF);
    g.back = aligned_alloc(4096, BUF);
    assert_true(g.src && g.dst && g.back);
    const unsigned remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    g.src_mr = reg(g.src, BUF, IBV_ACCESS_LOCAL_WRITE);
    g.dst_mr = reg(g.dst, BUF, remote | IBV_ACCESS_MW_BIND);
    g.back_mr = reg(g.back, BUF, IBV_ACCESS_LOCAL_WRITE);
    g.cq_a = g.v->create_cq(g.ctx, CQ_DEPTH, NULL, NULL, 0);
    g.cq_b = g.v->create_cq(g.ctx, CQ_DEPTH, NULL, NULL, 0);
    assert_true(g.cq_a && g.cq_b);
    g.qp_a = make_qp(g.cq_a);
    g.qp_b = make_qp(g.cq_b);
    to_rts(g.qp_a, g.qp_b->qp_num);
    to_rts(g.qp_b, g.qp_a->qp_num);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (g.qp_a)
        assert_int_equal(g.v->destroy_qp(g.qp_a), 0);
    if (g.qp_b)
        assert_int_equal(g.v->destroy_qp(g.qp_b), 0);
    if (g.cq_a)
        assert_int_equal(g.v->destroy_cq(g.cq_a), 0);
    if (g.cq_b)
        assert_int_equal(g.v->destroy_cq(g.cq_b), 0);
    struct ibv_mr *mrs[] = {g.src_mr, g.dst_mr, g.back_mr};
    for (size_t i = 0; i < 3; i++)
        if (mrs[i])
            assert_int_equal(g.v->dereg_mr(mrs[i]), 0);
    if (g.pd)
        assert_int_equal(g.v->dealloc_pd(g.pd), 0);
    if (g.ctx)
        assert_int_equal(g.v->close_device(g.ctx), 0);
    if (g.list)
        g.v->free_device_list(g.list);
    free(g.src);
    free(g.dst);
    free(g.back);
    return 0;
}

static void test_write_and_read_every_size(void **state)
{
    (void)state;
    static const uint32_t sizes[] = {1, 7, 64, 4095, 4096, 4097, 65536, 300000, BUF};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint32_t len = sizes[i];
        fill(g.src, BUF, (uint32_t)i);
        memset(g.dst, 0xEE, BUF);
        struct ibv_wc wc = rdma_op(IBV_WR_RDMA_WRITE, g.src, g.src_mr->lkey, (uint64_t)(uintptr_t)g.dst,
                                   g.dst_mr->rkey, len, 100 + i);
        if (wc.status != IBV_WC_SUCCESS)
            fail_msg("WRITE of %u bytes: %s", len, g.v->wc_status_str(wc.status));
        assert_memory_equal(g.dst, g.src, len);
        if (len < BUF)
            assert_int_equal(g.dst[len], 0xEE); /* not one byte past */
        memset(g.back, 0, BUF);
        wc = rdma_op(IBV_WR_RDMA_READ, g.back, g.back_mr->lkey, (uint64_t)(uintptr_t)g.dst, g.dst_mr->rkey, len,
                     200 + i);
        if (wc.status != IBV_WC_SUCCESS)
            fail_msg("READ of %u bytes: %s", len, g.v->wc_status_str(wc.status));
        assert_memory_equal(g.back, g.src, len);
    }
}

/* Last: the refused WRITE moves both queue pairs to the error state. */
static void test_read_only_window_grants_exactly_that(void **state)
{
    (void)state;
    struct ibv_mw *mw = ibv_alloc_mw(g.pd, IBV_MW_TYPE_2);
    if (mw == NULL) {
        print_message("skipped: no type-2 memory windows (%s)\n", strerror(errno));
        skip();
        return;
    }
    fill(g.dst, BUF, 77);
    memcpy(g.back, g.dst, BUF); /* the expected contents */
    uint8_t *window = g.dst + 4096;
    const uint32_t window_len = 8192;
    /* Bind on the target side's queue pair, through which remote accesses arrive. */
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 300;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.bind_info.mr = g.dst_mr;
    wr.bind_mw.bind_info.addr = (uint64_t)(uintptr_t)window;
    wr.bind_mw.bind_info.length = window_len;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
    assert_int_equal(ibv_post_send(g.qp_b, &wr, &bad), 0);
    struct ibv_wc wc = poll_one(g.cq_b);
    if (wc.status != IBV_WC_SUCCESS)
        fail_msg("bind: %s", g.v->wc_status_str(wc.status));
    uint32_t rkey = wr.bind_mw.rkey;
    mw->rkey = rkey; /* rxe compares them on the next bind */

    uint8_t *out = aligned_alloc(4096, BUF);
    assert_non_null(out);
    struct ibv_mr *out_mr = reg(out, BUF, IBV_ACCESS_LOCAL_WRITE);
    memset(out, 0, BUF);
    wc = rdma_op(IBV_WR_RDMA_READ, out, out_mr->lkey, (uint64_t)(uintptr_t)window, rkey, window_len, 301);
    if (wc.status != IBV_WC_SUCCESS)
        fail_msg("READ inside the window: %s", g.v->wc_status_str(wc.status));
    assert_memory_equal(out, window, window_len);

    fill(g.src, BUF, 99);
    wc = rdma_op(IBV_WR_RDMA_WRITE, g.src, g.src_mr->lkey, (uint64_t)(uintptr_t)window, rkey, 64, 302);
    assert_int_not_equal(wc.status, IBV_WC_SUCCESS);
    print_message("WRITE through the read-only window: %s\n", g.v->wc_status_str(wc.status));
    assert_memory_equal(g.dst, g.back, BUF); /* not a byte changed */

    assert_int_equal(g.v->dereg_mr(out_mr), 0);
    free(out);
    assert_int_equal(ibv_dealloc_mw(mw), 0);
}

/* The IPv4-mapped GID of port 1 of `ctx`, or -1. */
static int find_gid(struct ibv_context *ctx, union ibv_gid *out)
{
    struct ibv_port_attr port;
    if (orb_verbs_query_port(g.v, ctx, 1, &port) != 0)
        return -1;
    for (int i = 0; i < port.gid_tbl_len; i++)
        if (g.v->query_gid(ctx, 1, i, out) == 0 && ipv4_mapped(out))
            return i;
    return -1;
}

/* Two "hosts" (the rails topology: rxe_a0 and rxe_b0 over a veth pair): a 1 MiB WRITE from one
 * device's memory to the other's and a READ back, every byte checked. Skipped elsewhere. */
static void test_across_two_devices(void **state)
{
    (void)state;
    int n = 0;
    struct ibv_device **list = g.v->get_device_list(&n);
    assert_non_null(list);
    struct ibv_device *da = NULL, *db = NULL;
    for (int i = 0; i < n; i++) {
        const char *name = g.v->get_device_name(list[i]);
        if (strcmp(name, "rxe_a0") == 0)
            da = list[i];
        if (strcmp(name, "rxe_b0") == 0)
            db = list[i];
    }
    if (da == NULL || db == NULL) {
        g.v->free_device_list(list);
        print_message("skipped: no rxe_a0/rxe_b0 pair (the rails topology has one)\n");
        skip();
        return;
    }
    struct ibv_context *ca = g.v->open_device(da), *cb = g.v->open_device(db);
    assert_true(ca && cb);
    union ibv_gid ga, gb;
    int ia = find_gid(ca, &ga), ib = find_gid(cb, &gb);
    assert_true(ia >= 0 && ib >= 0);
    assert_memory_not_equal(ga.raw, gb.raw, 16);
    struct ibv_port_attr port;
    assert_int_equal(orb_verbs_query_port(g.v, ca, 1, &port), 0);
    enum ibv_mtu mtu = port.active_mtu;
    struct ibv_pd *pa = g.v->alloc_pd(ca), *pb = g.v->alloc_pd(cb);
    assert_true(pa && pb);
    uint8_t *src = aligned_alloc(4096, BUF), *dst = aligned_alloc(4096, BUF), *back = aligned_alloc(4096, BUF);
    assert_true(src && dst && back);
    fill(src, BUF, 1234);
    memset(dst, 0, BUF);
    memset(back, 0, BUF);
    const unsigned remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    struct ibv_mr *msrc = g.v->reg_mr_iova2(pa, src, BUF, (uint64_t)(uintptr_t)src, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *mback = g.v->reg_mr_iova2(pa, back, BUF, (uint64_t)(uintptr_t)back, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *mdst = g.v->reg_mr_iova2(pb, dst, BUF, (uint64_t)(uintptr_t)dst, remote);
    assert_true(msrc && mback && mdst);
    struct ibv_cq *qa_cq = g.v->create_cq(ca, CQ_DEPTH, NULL, NULL, 0), *qb_cq = g.v->create_cq(cb, CQ_DEPTH, NULL, NULL, 0);
    assert_true(qa_cq && qb_cq);
    struct ibv_qp *qa = make_qp_on(pa, qa_cq), *qb = make_qp_on(pb, qb_cq);
    to_rts_with(qa, qb->qp_num, &gb, ia, mtu);
    to_rts_with(qb, qa->qp_num, &ga, ib, mtu);

    struct ibv_wc wc = rdma_op_on(qa, qa_cq, IBV_WR_RDMA_WRITE, src, msrc->lkey, (uint64_t)(uintptr_t)dst,
                                  mdst->rkey, BUF, 500);
    if (wc.status != IBV_WC_SUCCESS)
        fail_msg("WRITE across the veth pair: %s", g.v->wc_status_str(wc.status));
    assert_memory_equal(dst, src, BUF);
    wc = rdma_op_on(qa, qa_cq, IBV_WR_RDMA_READ, back, mback->lkey, (uint64_t)(uintptr_t)dst, mdst->rkey, BUF, 501);
    if (wc.status != IBV_WC_SUCCESS)
        fail_msg("READ across the veth pair: %s", g.v->wc_status_str(wc.status));
    assert_memory_equal(back, src, BUF);
    print_message("1 MiB WRITE and READ between rxe_a0 and rxe_b0: every byte checked\n");

    assert_int_equal(g.v->destroy_qp(qa), 0);
    assert_int_equal(g.v->destroy_qp(qb), 0);
    assert_int_equal(g.v->destroy_cq(qa_cq), 0);
    assert_int_equal(g.v->destroy_cq(qb_cq), 0);
    assert_int_equal(g.v->dereg_mr(msrc), 0);
    assert_int_equal(g.v->dereg_mr(mback), 0);
    assert_int_equal(g.v->dereg_mr(mdst), 0);
    assert_int_equal(g.v->dealloc_pd(pa), 0);
    assert_int_equal(g.v->dealloc_pd(pb), 0);
    assert_int_equal(g.v->close_device(ca), 0);
    assert_int_equal(g.v->close_device(cb), 0);
    g.v->free_device_list(list);
    free(src);
    free(dst);
    free(back);
}

/* The engine's way to its NICs: the inventory of the real /sys, opened directly (no helper), a
 * PD each; a mask leaves the others closed. */
static void test_devices_open_from_the_inventory(void **state)
{
    (void)state;
    int sysfs = open("/sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(sysfs >= 0);
    static struct orb_topo_inventory inv;
    assert_int_equal(orb_topo_load_sysfs(sysfs, &inv), 0);
    close(sysfs);
    uint32_t usable = 0;
    for (uint32_t i = 0; i < inv.nnics; i++)
        usable += inv.nics[i].usable;
    assert_true(usable >= 1);
    struct orb_rdma_verbs_impl impl;
    struct orb_rdma_open_ops ops;
    orb_rdma_devices_verbs_ops(&impl, g.v, NULL, &ops);
    static struct orb_rdma_devices d;
    assert_int_equal(orb_rdma_devices_open(&ops, &impl, &inv, ~0ull, ORB_HELPER_OFF, &d), 0);
    assert_int_equal(d.nopen, usable);
    for (uint32_t i = 0; i < inv.nnics; i++) {
        const struct orb_rdma_nic *n = &d.nics[inv.nics[i].id];
        if (!inv.nics[i].usable)
            continue;
        assert_int_equal(n->route, ORB_RDMA_ROUTE_DIRECT);
        assert_non_null(n->pd);
        struct ibv_port_attr port;
        assert_int_equal(orb_verbs_query_port(g.v, n->ctx, 1, &port), 0);
        print_message("slot %u: %s, port 1 %s\n", n->id, n->name,
                      port.state == IBV_PORT_ACTIVE ? "active" : "not active");
    }
    assert_int_equal(orb_rdma_devices_close(&d), 0);
    /* Only the first NIC allowed: the others are never opened. */
    uint8_t first = inv.nics[0].id;
    assert_int_equal(orb_rdma_devices_open(&ops, &impl, &inv, UINT64_C(1) << first, ORB_HELPER_OFF, &d), 0);
    assert_int_equal(d.nopen, inv.nics[0].usable ? 1u : 0u);
    for (uint32_t i = 1; i < inv.nnics; i++)
        assert_null(d.nics[inv.nics[i].id].ctx);
    assert_int_equal(orb_rdma_devices_close(&d), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devices_open_from_the_inventory),
        cmocka_unit_test(test_write_and_read_every_size),
        cmocka_unit_test(test_across_two_devices),
        cmocka_unit_test(test_read_only_window_grants_exactly_that),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
