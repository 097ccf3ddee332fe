/* The request handlers in-process, on a fixture tree: each request's decisions and refusals,
 * with the policy decision set directly and DEVX_VERIFY against a fake device. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "core/error.h"
#include "helper/helper.h"
#include "helper_test_util.h"
#include "topo/sysfs.h"

struct fixture {
    struct hp_fixture fx;
    struct orb_helper_state st;
    int peer;      /* the library's end */
    uint32_t seq;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    assert_int_equal(hp_fixture_create(&f->fx, "two-socket"), 0);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    f->peer = sv[0];
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    assert_non_null(inv);
    orb_helper_state_init(&f->st, sv[1], inv);
    struct orb_helper_state *st = &f->st;
    st->sysfs_fd = open(f->fx.sysfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    st->devib_fd = open(f->fx.dev, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    st->shm_fd = open(f->fx.shm, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(st->sysfs_fd >= 0 && st->devib_fd >= 0 && st->shm_fd >= 0);
    assert_int_equal(orb_topo_load_sysfs(st->sysfs_fd, inv), 0);
    orb_helper_map_devices(st);
    st->uid = getuid();
    st->gid = getgid();
    st->admin_uid = getuid();
    st->admin_gid = (gid_t)-1;
    st->caps_kept = 0x3;
    st->uctx_ops = &orb_uctx_kernel_ops; /* as the helper starts; tests swap in scripted tables */
    assert_int_equal(orb_clock_domain_current(&st->domain), 0);
    st->domain_ok = true;
    assert_int_equal(orb_helper_slots_prepare(st), 0);
    /* mlx5_0 (id 0) over RDMA, GPUs 0 and 5, one slot name. */
    st->allowed.transports = ORB_HP_T_TCP | ORB_HP_T_RDMA;
    st->allowed.nic_mask = 1u;
    st->allowed.gpu_mask = (1u << 0) | (1u << 5);
    st->allowed.nslots = 1;
    strcpy(st->allowed.slots[0], "tenant-slot");
    f->seq = 1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    close(f->st.sock);
    f->st.sock = -1;
    orb_helper_state_release(&f->st);
    close(f->peer);
    hp_fixture_destroy(&f->fx);
    free(f);
    return 0;
}

typedef int (*handler_fn)(struct orb_helper_state *, const struct orb_hp_msg *);

/* Run `h` on the request in req[0..len) and receive its reply. Returns the handler's result. */
static int run(struct fixture *f, handler_fn h, const uint8_t *req, size_t len, struct orb_hp_msg *reply,
               uint8_t *rbuf, int *fd_out)
{
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_parse(req, len, &m), 0);
    int rc = h(&f->st, &m);
    if (rc != 0)
        return rc;
    size_t rlen = 0, nfds = 0;
    int fds[1] = {-1};
    assert_int_equal(orb_hp_recv(f->peer, rbuf, &rlen, fds, 1, &nfds, 1000), 0);
    assert_int_equal(orb_hp_parse(rbuf, rlen, reply), 0);
    assert_int_equal(reply->hdr.type, m.hdr.type + 1);
    assert_int_equal(reply->hdr.sequence, m.hdr.sequence);
    if (fd_out)
        *fd_out = nfds ? fds[0] : -1;
    else if (nfds)
        close(fds[0]);
    return 0;
}

static int32_t open_device(struct fixture *f, const char *nic, int *fd_out)
{
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_open_device(f->seq++, nic, req, &len), 0);
    struct orb_hp_msg m;
    int fd = -1;
    assert_int_equal(run(f, orb_helper_on_open_device, req, len, &m, rep, &fd), 0);
    int32_t status = 1;
    uint32_t nfds = 9;
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_int_equal(nfds, status == 0 ? 1u : 0u);
    if (fd_out)
        *fd_out = fd;
    else if (fd >= 0)
        close(fd);
    return status;
}

static int32_t devx_verify(struct fixture *f, const char *nic)
{
    struct orb_hp_devx_verify v = {.obj_handle = 3, .key = 0x4242, .qpn = 9, .addr = 0x1000, .length = 0x1000,
                                   .access = 1};
    snprintf(v.nic, sizeof v.nic, "%s", nic);
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_devx_verify(f->seq++, &v, req, &len), 0);
    struct orb_hp_msg m;
    assert_int_equal(run(f, orb_helper_on_devx_verify, req, len, &m, rep, NULL), 0);
    int32_t status = 1;
    assert_int_equal(orb_hp_decode_status(&m, &status), 0);
    return status;
}

/* ---- HELLO ----------------------------------------------------------------------------------- */

static void test_hello_reports_identity_and_caps(void **state)
{
    struct fixture *f = *state;
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_hello(7, req, &len), 0);
    struct orb_hp_msg m;
    assert_int_equal(run(f, orb_helper_on_hello, req, len, &m, rep, NULL), 0);
    int32_t status = 1;
    uint32_t version = 0, uid = 0, gid = 0, caps = 0;
    assert_int_equal(orb_hp_decode_hello_reply(&m, &status, &version, &uid, &gid, &caps), 0);
    assert_int_equal(status, 0);
    assert_int_equal(version, ORB_HP_VERSION);
    assert_int_equal(uid, getuid());
    assert_int_equal(gid, getgid());
    assert_int_equal(caps, 0x3);
    assert_true(f->st.hello_done);
}

static void test_hello_of_another_version_is_refused(void **state)
{
    struct fixture *f = *state;
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = hp_raw_header(req, ORB_HP_HELLO, ORB_HP_HEADER_LEN + 4, 3);
    memset(req + len, 0, 4);
    req[len] = ORB_HP_VERSION + 1;
    len += 4;
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_parse(req, len, &m), 0);
    assert_int_equal(orb_helper_on_hello(&f->st, &m), ORB_EPROTO); /* the session ends */
    size_t rlen = 0, nfds = 0;
    assert_int_equal(orb_hp_recv(f->peer, rep, &rlen, NULL, 0, &nfds, 1000), 0); /* after saying why */
    assert_int_equal(orb_hp_parse(rep, rlen, &m), 0);
    int32_t status = 0;
    assert_int_equal(orb_hp_decode_status(&m, &status), 0);
    assert_int_equal(status, ORB_EPROTO);
    assert_false(f->st.hello_done);
}

/* ---- INVENTORY and POLICY -------------------------------------------------------------------- */

static void test_inventory_is_filtered_by_policy(void **state)
{
    struct fixture *f = *state;
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    static struct orb_topo_nic nic;
    static struct orb_topo_gpu gpu;
    static struct orb_topo_numa numa;
    int32_t status = 1;
    uint32_t total = 0;

    assert_int_equal(orb_hp_encode_inventory(f->seq++, ORB_HP_INV_NIC, 0, req, &len), 0);
    assert_int_equal(run(f, orb_helper_on_inventory, req, len, &m, rep, NULL), 0);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NIC, &status, &total, &nic, &gpu, &numa), 0);
    assert_int_equal(status, 0);
    assert_int_equal(total, 1);
    assert_string_equal(nic.name, "mlx5_0");

    assert_int_equal(orb_hp_encode_inventory(f->seq++, ORB_HP_INV_NIC, 1, req, &len), 0);
    assert_int_equal(run(f, orb_helper_on_inventory, req, len, &m, rep, NULL), 0);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NIC, &status, &total, &nic, &gpu, &numa), 0);
    assert_int_equal(status, ORB_ENOENT);

    /* The other NIC appears once the policy allows it, keeping its id. */
    f->st.allowed.nic_mask = 2u;
    assert_int_equal(orb_hp_encode_inventory(f->seq++, ORB_HP_INV_NIC, 0, req, &len), 0);
    assert_int_equal(run(f, orb_helper_on_inventory, req, len, &m, rep, NULL), 0);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NIC, &status, &total, &nic, &gpu, &numa), 0);
    assert_int_equal(total, 1);
    assert_string_equal(nic.name, "mlx5_1");
    assert_int_equal(nic.id, 1);

    /* GPUs: only allowed ordinals that exist. */
    uint32_t expected = 0;
    for (uint32_t i = 0; i < f->st.inv->ngpus; i++)
        expected += f->st.inv->gpus[i].ordinal == 0 || f->st.inv->gpus[i].ordinal == 5;
    assert_int_equal(orb_hp_encode_inventory(f->seq++, ORB_HP_INV_GPU, 0, req, &len), 0);
    assert_int_equal(run(f, orb_helper_on_inventory, req, len, &m, rep, NULL), 0);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_GPU, &status, &total, &nic, &gpu, &numa), 0);
    if (expected > 0) {
        assert_int_equal(status, 0);
        assert_int_equal(total, expected);
        assert_int_equal(gpu.ordinal, 0);
    } else {
        assert_int_equal(status, ORB_ENOENT);
    }

    /* NUMA nodes are not filtered. */
    assert_int_equal(orb_hp_encode_inventory(f->seq++, ORB_HP_INV_NUMA, 0, req, &len), 0);
    assert_int_equal(run(f, orb_helper_on_inventory, req, len, &m, rep, NULL), 0);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NUMA, &status, &total, &nic, &gpu, &numa), 0);
    assert_int_equal(total, f->st.inv->nnuma);
}

static void test_policy_reply_is_the_decision(void **state)
{
    struct fixture *f = *state;
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_empty(ORB_HP_POLICY, f->seq++, req, &len), 0);
    struct orb_hp_msg m;
    assert_int_equal(run(f, orb_helper_on_policy, req, len, &m, rep, NULL), 0);
    static struct orb_hp_policy p;
    int32_t status = 1;
    assert_int_equal(orb_hp_decode_policy_reply(&m, &status, &p), 0);
    assert_int_equal(status, 0);
    assert_int_equal(p.nic_mask, 1u);
    assert_int_equal(p.gpu_mask, (1u << 0) | (1u << 5));
    assert_int_equal(p.nslots, 1);
    assert_string_equal(p.slots[0], "tenant-slot");
}

/* ---- OPEN_DEVICE ----------------------------------------------------------------------------- */

static void test_open_device_refusals(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(open_device(f, "mlx5_7", NULL), ORB_ENOENT);
    assert_int_equal(open_device(f, "mlx5_1", NULL), ORB_EPERM); /* not in the NIC mask */
    f->st.allowed.transports = ORB_HP_T_TCP;
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EPERM); /* no RDMA at all */
    f->st.allowed.transports |= ORB_HP_T_RDMA;
    /* Not driven by mlx5_core: no context the library could import, nothing opened. */
    char path[600];
    snprintf(path, sizeof path, "%s/uverbs0", f->fx.dev);
    assert_int_equal(symlink("/dev/null", path), 0); /* would be refused if it were opened */
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "not an mlx5 device"));
    assert_int_equal(unlink(path), 0);
    f->st.mlx5[0] = true;
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EUNAVAILABLE); /* no node yet */
    /* A regular file and a symlink where the node should be. */
    assert_int_equal(hp_write_file(f->fx.dev, "uverbs0", "", 0666), 0);
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EPERM);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink("/dev/null", path), 0);
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EPERM);
    /* The node now belongs to another device in sysfs. */
    char verbs[600];
    snprintf(verbs, sizeof verbs, "%s/class/infiniband_verbs/uverbs0", f->fx.sysfs);
    assert_int_equal(hp_write_file(verbs, "ibdev", "mlx5_1\n", 0644), 0);
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EUNAVAILABLE);
    /* No /dev/infiniband. */
    close(f->st.devib_fd);
    f->st.devib_fd = -1;
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EUNAVAILABLE);
    assert_int_equal(f->st.dev_fds[0], -1);
}

/* A device context table that answers from a script (one errno per call) and records the
 * descriptors it was given. */
struct fake_uctx {
    int answers[8];
    int calls;
    bool asked_devx[8];
    dev_t asked_rdev;
};

static int fake_create(void *impl, int dev_fd, bool devx)
{
    struct fake_uctx *u = impl;
    assert_true(u->calls < 8);
    struct stat s;
    assert_int_equal(fstat(dev_fd, &s), 0);
    u->asked_rdev = s.st_rdev;
    u->asked_devx[u->calls] = devx;
    return u->answers[u->calls++];
}

static const struct orb_uctx_ops fake_uctx_ops = {.create = fake_create};

/* As root, a character device with mlx5_0's numbers (1:3) stands in for uverbs0. */
static bool make_stand_in_node(struct fixture *f)
{
    char path[600];
    snprintf(path, sizeof path, "%s/uverbs0", f->fx.dev);
    return getuid() == 0 && mknod(path, S_IFCHR | 0600, makedev(1, 3)) == 0;
}

static void test_open_device_success_keeps_a_dup(void **state)
{
    struct fixture *f = *state;
    if (!make_stand_in_node(f)) {
        skip(); /* a character device needs root */
        return;
    }
    struct fake_uctx u = {{0}, 0, {false}, 0};
    f->st.mlx5[0] = true;
    f->st.uctx_ops = &fake_uctx_ops;
    f->st.uctx_impl = &u;
    int fd = -1;
    assert_int_equal(open_device(f, "mlx5_0", &fd), 0);
    /* The context was created on the verified node, with DevX, before the hand-over. */
    assert_int_equal(u.calls, 1);
    assert_true(u.asked_devx[0]);
    assert_int_equal(u.asked_rdev, makedev(1, 3));
    assert_true(f->st.devx[0]);
    struct stat a, b;
    assert_int_equal(fstat(fd, &a), 0);
    assert_true(S_ISCHR(a.st_mode));
    assert_int_equal(a.st_rdev, makedev(1, 3));
    assert_true(f->st.dev_fds[0] >= 0);
    assert_int_equal(fstat(f->st.dev_fds[0], &b), 0);
    assert_int_equal(a.st_rdev, b.st_rdev);
    close(fd);
    /* A second open replaces the kept reference (one per NIC). */
    assert_int_equal(open_device(f, "mlx5_0", NULL), 0);
    assert_true(f->st.dev_fds[0] >= 0);
    assert_int_equal(f->st.dev_fds[1], -1);
    /* The numbers must be the ones sysfs gives. */
    char verbs[600];
    snprintf(verbs, sizeof verbs, "%s/class/infiniband_verbs/uverbs0", f->fx.sysfs);
    assert_int_equal(hp_write_file(verbs, "dev", "1:5\n", 0644), 0);
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EPERM);
    assert_int_equal(hp_write_file(verbs, "dev", "1:3:0\n", 0644), 0);
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EUNAVAILABLE);
    assert_int_equal(u.calls, 2); /* no context creation for a node that failed its checks */
}

static void test_open_device_context_refusals(void **state)
{
    struct fixture *f = *state;
    if (!make_stand_in_node(f)) {
        skip();
        return;
    }
    f->st.mlx5[0] = true;
    /* No table at all: refused before anything is opened. */
    f->st.uctx_ops = NULL;
    assert_int_equal(open_device(f, "mlx5_0", NULL), ORB_EUNAVAILABLE);
    /* Both attempts refused: no fd handed over, none kept. */
    struct fake_uctx u = {{EINVAL, EACCES}, 0, {false}, 0};
    f->st.uctx_ops = &fake_uctx_ops;
    f->st.uctx_impl = &u;
    int fd = 7;
    assert_int_equal(open_device(f, "mlx5_0", &fd), ORB_EPERM);
    assert_int_equal(fd, -1);
    assert_int_equal(u.calls, 2);
    assert_int_equal(f->st.dev_fds[0], -1);
    /* DevX refused, plain verbs granted: the device is handed over, DEVX_VERIFY is unavailable. */
    u = (struct fake_uctx){{EOPNOTSUPP, 0}, 0, {false}, 0};
    assert_int_equal(open_device(f, "mlx5_0", &fd), 0);
    assert_true(fd >= 0);
    close(fd);
    assert_true(u.asked_devx[0]);
    assert_false(u.asked_devx[1]);
    assert_true(f->st.dev_fds[0] >= 0);
    assert_false(f->st.devx[0]);
    /* The real table on the stand-in (no uverbs ioctl there): unavailable, the kept dup stays. */
    int kept = f->st.dev_fds[0];
    f->st.uctx_ops = &orb_uctx_kernel_ops;
    assert_int_equal(open_device(f, "mlx5_0", &fd), ORB_EUNAVAILABLE);
    assert_int_equal(fd, -1);
    assert_int_equal(f->st.dev_fds[0], kept);
}

/* ---- PEERMEM_PROBE --------------------------------------------------------------------------- */

static uint32_t peermem(struct fixture *f)
{
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_empty(ORB_HP_PEERMEM_PROBE, f->seq++, req, &len), 0);
    struct orb_hp_msg m;
    assert_int_equal(run(f, orb_helper_on_peermem, req, len, &m, rep, NULL), 0);
    int32_t status = 1;
    uint32_t found = 99;
    assert_int_equal(orb_hp_decode_peermem_reply(&m, &status, &found), 0);
    assert_int_equal(status, 0);
    return found;
}

static void test_peermem_needs_the_version_files(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(peermem(f), 0);
    /* Bare module directories are no evidence. */
    assert_int_equal(hp_mkdirs(f->fx.sysfs, "module/nvidia_peermem", 0755), 0);
    assert_int_equal(hp_mkdirs(f->fx.sysfs, "kernel/mm/memory_peers/nv_mem_nc", 0755), 0);
    assert_int_equal(peermem(f), 0);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/kernel/mm/memory_peers/nv_mem_nc", f->fx.sysfs);
    assert_int_equal(hp_write_file(dir, "version", "1\n", 0444), 0);
    assert_int_equal(peermem(f), 1u << 1);
    assert_int_equal(hp_mkdirs(f->fx.sysfs, "kernel/mm/memory_peers/nv_mem/version", 0755), 0); /* a dir */
    assert_int_equal(peermem(f), 1u << 1);
    snprintf(dir, sizeof dir, "%s/module/nvidia_peermem", f->fx.sysfs);
    assert_int_equal(hp_write_file(dir, "version", "1\n", 0444), 0);
    assert_int_equal(peermem(f), (1u << 1) | (1u << 2));
}

/* ---- SLOT_ATTACH ----------------------------------------------------------------------------- */

static void test_slot_attach_follows_policy(void **state)
{
    struct fixture *f = *state;
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    int32_t status = 1;
    uint32_t nfds = 0;
    int fd = -1;
    assert_int_equal(orb_hp_encode_slot_attach(f->seq++, "other-slot", ORB_SLOTS_DEFAULT_INTERVAL_NS, req, &len), 0);
    assert_int_equal(run(f, orb_helper_on_slot_attach, req, len, &m, rep, &fd), 0);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_int_equal(status, ORB_EPERM);
    assert_int_equal(fd, -1);
    assert_int_equal(orb_hp_encode_slot_attach(f->seq++, "tenant-slot", 1, req, &len), 0);
    assert_int_equal(run(f, orb_helper_on_slot_attach, req, len, &m, rep, &fd), 0);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_int_equal(status, ORB_EINVAL);
    assert_int_equal(orb_hp_encode_slot_attach(f->seq++, "tenant-slot", ORB_SLOTS_DEFAULT_INTERVAL_NS, req, &len), 0);
    assert_int_equal(run(f, orb_helper_on_slot_attach, req, len, &m, rep, &fd), 0);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_int_equal(status, 0);
    assert_int_equal(nfds, 1);
    assert_true(fd >= 0);
    assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    close(fd);
}

/* ---- DEVX_VERIFY ----------------------------------------------------------------------------- */

struct fake_devx {
    int calls;
    int answer;
    uint32_t asked_handle, asked_key;
};

static int fake_query(void *impl, int dev_fd, uint32_t obj_handle, uint32_t key, uint8_t *out, size_t out_len)
{
    struct fake_devx *d = impl;
    (void)out;
    (void)out_len;
    assert_true(dev_fd >= 0);
    d->calls++;
    d->asked_handle = obj_handle;
    d->asked_key = key;
    return d->answer;
}

static void test_devx_verify_routing(void **state)
{
    struct fixture *f = *state;
    struct fake_devx dev = {0, ORB_EUNAVAILABLE, 0, 0};
    const struct orb_devx_ops ops = {.query_mkey = fake_query};
    f->st.devx_ops = &ops;
    f->st.devx_impl = &dev;
    assert_int_equal(devx_verify(f, "mlx5_9"), ORB_ENOENT);
    assert_int_equal(devx_verify(f, "mlx5_1"), ORB_EPERM);
    assert_int_equal(devx_verify(f, "mlx5_0"), ORB_EUNAVAILABLE); /* not driven by mlx5_core */
    f->st.mlx5[0] = true;
    assert_int_equal(devx_verify(f, "mlx5_0"), ORB_EINVAL); /* no device opened yet */
    assert_int_equal(dev.calls, 0);
    f->st.dev_fds[0] = open("/dev/null", O_RDWR | O_CLOEXEC);
    assert_int_equal(devx_verify(f, "mlx5_0"), ORB_EUNAVAILABLE); /* its context has no DevX */
    assert_int_equal(dev.calls, 0);
    f->st.devx[0] = true;
    assert_int_equal(devx_verify(f, "mlx5_0"), ORB_EUNAVAILABLE);
    assert_int_equal(dev.calls, 1);
    assert_int_equal(dev.asked_handle, 3); /* the request's object handle reaches the device */
    assert_int_equal(dev.asked_key, 0x4242);
    dev.answer = 0; /* an all-zero key context: refused */
    assert_int_equal(devx_verify(f, "mlx5_0"), ORB_EPERM);
    assert_int_equal(dev.calls, 2);
    /* The real device table on a descriptor that is no uverbs file. */
    f->st.devx_ops = &orb_devx_kernel_ops;
    assert_int_equal(devx_verify(f, "mlx5_0"), ORB_EUNAVAILABLE);
}

/* ---- device mapping --------------------------------------------------------------------------- */

static void test_device_map_from_sysfs(void **state)
{
    struct fixture *f = *state;
    assert_string_equal(f->st.uverbs[0], "uverbs0");
    assert_string_equal(f->st.uverbs[1], "uverbs1");
    assert_false(f->st.mlx5[0]);
    assert_int_equal(orb_helper_find_nic(&f->st, "mlx5_1"), 1);
    assert_int_equal(orb_helper_find_nic(&f->st, "mlx5"), -1);
    assert_int_equal(orb_helper_find_nic(&f->st, NULL), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_device_map_from_sysfs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hello_of_another_version_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hello_reports_identity_and_caps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inventory_is_filtered_by_policy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policy_reply_is_the_decision, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_device_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_device_success_keeps_a_dup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_device_context_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peermem_needs_the_version_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slot_attach_follows_policy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_devx_verify_routing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
