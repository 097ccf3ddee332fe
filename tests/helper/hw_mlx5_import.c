/* Hardware check (exits 77 where it cannot run): on the first mlx5 device of this host,
 *  1. orbite-helper-test (real sysfs, real /dev/infiniband, the kernel device context) answers
 *     OPEN_DEVICE with a descriptor that libibverbs adopts with ibv_import_device();
 *  2. a DevX indirect KLM key created by this process in that adopted context with the library's
 *     own command and call (a grant's key: bound to one QP, READ over an exact range, remotely
 *     invalidatable), passes DEVX_VERIFY;
 *  3. the same key fails DEVX_VERIFY for another direction, length, QP, object handle or variant,
 *     and a key any QP may use (the wildcard QPN) fails it too.
 * libibverbs and libmlx5 are loaded at run time (the library links neither); the key is created
 * with the DevX object ioctl, whose handle DEVX_VERIFY names. When the helper refuses the key as
 * created, the check queries it itself and prints what the device says it is: firmware that
 * rewrites the QP binding, or wants KLM lists padded to a multiple of four entries, shows there. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/mlx5_user_ioctl_cmds.h>

#include <orbite/orbite.h>

#include "common/helper_proto.h"
#include "helper/devx.h"
#include "common/uverbs.h"
#include "helper_test_util.h"
#include "rdma/devx_key.h"

#define SKIP 77
#define WAIT_MS 10000
#define VARIANT 0x42u
#define PAGE 4096u

static int failures;

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                 \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)

/* ---- the verbs calls, resolved at run time ---------------------------------------------------- */

struct verbs {
    void *ibverbs, *mlx5;
    struct ibv_context *(*import_device)(int);
    int (*close_device)(struct ibv_context *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*destroy_qp)(struct ibv_qp *);
    int (*init_obj)(struct mlx5dv_obj *, uint64_t);
};

static bool load_verbs(struct verbs *v)
{
    memset(v, 0, sizeof *v);
    v->ibverbs = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    v->mlx5 = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL);
    if (v->ibverbs == NULL || v->mlx5 == NULL)
        return false;
    struct {
        void *lib;
        const char *name;
        void **slot;
    } syms[] = {
        {v->ibverbs, "ibv_import_device", (void **)&v->import_device},
        {v->ibverbs, "ibv_close_device", (void **)&v->close_device},
        {v->ibverbs, "ibv_alloc_pd", (void **)&v->alloc_pd},
        {v->ibverbs, "ibv_dealloc_pd", (void **)&v->dealloc_pd},
        {v->ibverbs, "ibv_reg_mr", (void **)&v->reg_mr},
        {v->ibverbs, "ibv_dereg_mr", (void **)&v->dereg_mr},
        {v->ibverbs, "ibv_create_cq", (void **)&v->create_cq},
        {v->ibverbs, "ibv_destroy_cq", (void **)&v->destroy_cq},
        {v->ibverbs, "ibv_create_qp", (void **)&v->create_qp},
        {v->ibverbs, "ibv_destroy_qp", (void **)&v->destroy_qp},
        {v->mlx5, "mlx5dv_init_obj", (void **)&v->init_obj},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if ((*syms[i].slot = dlsym(syms[i].lib, syms[i].name)) == NULL)
            return false;
    return true;
}

/* ---- the device --------------------------------------------------------------------------------- */

static bool read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return false;
    bool ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    if (ok)
        buf[strcspn(buf, "\n")] = '\0';
    return ok;
}

/* The first mlx5-driven RDMA device with a uverbs node this process may open. */
static bool find_mlx5(char nic[65], char node[300])
{
    DIR *d = opendir("/sys/class/infiniband_verbs");
    if (d == NULL)
        return false;
    struct dirent *e;
    bool found = false;
    while (!found && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "uverbs", 6) != 0)
            continue;
        char path[600], ibdev[128], link[600];
        snprintf(path, sizeof path, "/sys/class/infiniband_verbs/%s/ibdev", e->d_name);
        if (!read_line(path, ibdev, sizeof ibdev) || strlen(ibdev) > 64)
            continue;
        snprintf(path, sizeof path, "/sys/class/infiniband/%s/device/driver", ibdev);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0)
            continue;
        link[n] = '\0';
        const char *base = strrchr(link, '/');
        if (strcmp(base ? base + 1 : link, "mlx5_core") != 0)
            continue;
        snprintf(node, 300, "/dev/infiniband/%s", e->d_name);
        if (access(node, R_OK | W_OK) != 0 && getuid() != 0)
            continue; /* a node restricted to the helper: this check runs the helper without caps */
        memcpy(nic, ibdev, strlen(ibdev) + 1); /* at most 64 bytes, checked above */
        found = true;
    }
    closedir(d);
    return found;
}

/* ---- DevX objects through the uverbs ioctl ------------------------------------------------------ */

/* An indirect KLM key over [addr, addr + len) of `lkey`, READ only, bound to `qpn`, in protection
 * domain `pdn`: the command the library builds for a grant (rdma/devx_key.h), created with the
 * library's own call. `any_qp` rewrites the binding to the wildcard QPN, which the library never
 * asks for, to see the helper refuse such a key. */
static int create_klm_key(struct ibv_context *ctx, uint32_t pdn, uint32_t qpn, uint32_t lkey, uint64_t addr,
                          uint64_t len, bool any_qp, uint32_t *handle, uint32_t *key)
{
    uint8_t in[ORB_DEVX_CREATE_IN_MAX], out[ORB_DEVX_CREATE_OUT_LEN];
    size_t in_len = 0;
    struct orb_devx_key_spec s = {.pdn = pdn, .qpn = qpn, .parent_lkey = lkey, .variant = VARIANT, .addr = addr,
                                  .len = len, .op = ORB_OP_READ};
    if (orb_devx_key_encode(&s, in, &in_len) != 0) {
        fprintf(stderr, "the key's command: %s\n", orb_last_error());
        return EINVAL;
    }
    if (any_qp)
        orb_be32_put(in + ORB_DEVX_CREATE_MKC_OFFSET + ORB_MKC_QPN, ORB_MKC_QPN_WILDCARD << 8 | VARIANT);
    memset(out, 0, sizeof out);
    uint32_t index = 0;
    if (orb_devx_key_kernel_ops.create(NULL, ctx, in, in_len, out, sizeof out, handle) != 0 ||
        orb_devx_key_decode_created(out, &index) != 0) {
        fprintf(stderr, "CREATE_MKEY: %s\n", orb_last_error());
        return EIO;
    }
    *key = index << 8 | VARIANT;
    return 0;
}

static void destroy_obj(int fd, uint32_t handle)
{
    struct orb_uverbs_attr a[1] = {{MLX5_IB_ATTR_DEVX_OBJ_DESTROY_HANDLE, 0, handle}};
    int err = orb_uverbs_call(fd, RDMA_DRIVER_MLX5, MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_METHOD_DEVX_OBJ_DESTROY, a, 1);
    CHECK(err == 0, "DEVX_OBJ_DESTROY: %s", strerror(err));
}

/* ---- the helper ---------------------------------------------------------------------------------- */

static int32_t open_device(struct hp_proc *p, const char *nic, int *fd)
{
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    int32_t status = 1;
    uint32_t nfds = 0;
    *fd = -1;
    if (orb_hp_encode_open_device(p->seq++, nic, req, &len) != 0 || hp_call(p, req, len, NULL, 0, &m, rep, fd) != 0 ||
        orb_hp_decode_fd_reply(&m, &status, &nfds) != 0)
        return 1;
    return status;
}

static int32_t verify(struct hp_proc *p, const struct orb_hp_devx_verify *v)
{
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    int32_t status = 1;
    if (orb_hp_encode_devx_verify(p->seq++, v, req, &len) != 0 || hp_call(p, req, len, NULL, 0, &m, rep, NULL) != 0 ||
        orb_hp_decode_status(&m, &status) != 0)
        return 1;
    return status;
}

/* What the device says the key is, for a refusal's diagnosis. */
static void print_key(int fd, uint32_t handle, uint32_t key)
{
    uint8_t out[ORB_DEVX_QUERY_OUT_LEN];
    struct orb_devx_mkey m;
    int rc = orb_devx_kernel_ops.query_mkey(NULL, fd, handle, key, out, sizeof out);
    if (rc != 0 || orb_devx_decode_mkey(out, sizeof out, &m) != 0) {
        fprintf(stderr, "  QUERY_MKEY: %s: %s\n", orb_strerror(rc), orb_last_error());
        return;
    }
    fprintf(stderr,
            "  device's view: status %u free %u umr_en %u a %u rw %u rr %u access_mode %u qpn 0x%x variant 0x%02x\n"
            "  start 0x%llx len %llu translations %u; klm0 {%u, 0x%x, 0x%llx} klm1 {%u, 0x%x, 0x%llx}\n",
            m.status, m.free, m.umr_en, m.atomic, m.rw, m.rr, m.access_mode, m.qpn, m.variant,
            (unsigned long long)m.start_addr, (unsigned long long)m.len, m.translations, m.klm[0].byte_count,
            m.klm[0].key, (unsigned long long)m.klm[0].addr, m.klm[1].byte_count, m.klm[1].key,
            (unsigned long long)m.klm[1].addr);
}

static void check_key(struct hp_proc *p, int fd, const char *nic, uint32_t handle, uint32_t key, uint32_t qpn,
                      uint64_t addr, uint64_t len)
{
    struct orb_hp_devx_verify good = {.obj_handle = handle, .key = key, .qpn = qpn, .addr = addr, .length = len,
                                      .access = 1};
    snprintf(good.nic, sizeof good.nic, "%s", nic);
    int32_t st = verify(p, &good);
    CHECK(st == 0, "the key as created: %s", orb_strerror(st));
    if (st != 0)
        print_key(fd, handle, key);
    struct orb_hp_devx_verify v = good;
    v.access = 2;
    CHECK(verify(p, &v) == ORB_EPERM, "WRITE asked of a READ key");
    v = good;
    v.length = len - 1;
    CHECK(verify(p, &v) == ORB_EPERM, "a shorter range");
    v = good;
    v.addr = addr + 1;
    CHECK(verify(p, &v) == ORB_EPERM, "a shifted range");
    v = good;
    v.qpn = (qpn + 1) & 0xFFFFFFu;
    CHECK(verify(p, &v) == ORB_EPERM, "another QP");
    v = good;
    v.key = (key & ~0xFFu) | ((VARIANT + 1) & 0xFFu);
    CHECK(verify(p, &v) == ORB_EPERM, "another variant");
    v = good;
    v.obj_handle = handle + 1000;
    CHECK(verify(p, &v) == ORB_EPERM, "a handle of no object");
}

int main(void)
{
    char nic[65], node[300];
    if (!find_mlx5(nic, node)) {
        printf("SKIP: no mlx5 RDMA device with a usable uverbs node on this host\n");
        return SKIP;
    }
    struct verbs vb;
    if (!load_verbs(&vb)) {
        printf("SKIP: libibverbs.so.1 or libmlx5.so.1 (or a symbol) missing: %s\n", dlerror());
        return SKIP;
    }
    printf("device %s (%s)\n", nic, node);

    char root[] = "/tmp/orbite-hw-XXXXXX", policy[64], shm[64], owner[16];
    if (mkdtemp(root) == NULL)
        return 1;
    snprintf(policy, sizeof policy, "%s/policy", root);
    snprintf(shm, sizeof shm, "%s/shm", root);
    snprintf(owner, sizeof owner, "%u", (unsigned)getuid());
    char ini[200];
    snprintf(ini, sizeof ini, "[defaults]\ntransports = tcp, rdma\nnics = %s\n", nic);
    if (mkdir(policy, 0755) != 0 || mkdir(shm, 0755) != 0 || hp_write_file(policy, "10-hw.ini", ini, 0644) != 0)
        return 1;
    const char *argv[] = {ORB_HELPER_TEST_EXE, "--sysfs-root", "/sys", "--policy-dir", policy, "--dev-dir",
                          "/dev/infiniband", "--shm-dir", shm, "--policy-owner", owner, "--device-context",
                          "kernel", NULL};
    struct hp_proc p = {.pid = -1, .sock = -1, .seq = 1};
    struct hp_spawn_opts o = {.argv = argv};
    CHECK(hp_spawn(&p, &o) == 0, "spawn the helper");
    CHECK(hp_hello(&p) == 0, "HELLO");

    int fd = -1;
    int32_t st = open_device(&p, nic, &fd);
    CHECK(st == 0 && fd >= 0, "OPEN_DEVICE %s: %s", nic, orb_strerror(st));
    struct ibv_context *ctx = fd >= 0 ? vb.import_device(fd) : NULL;
    CHECK(ctx != NULL, "ibv_import_device on the helper's descriptor: %s", strerror(errno));
    if (ctx != NULL) {
        size_t size = 4 * PAGE;
        uint8_t *buf = aligned_alloc(PAGE, size);
        struct ibv_pd *pd = vb.alloc_pd(ctx);
        CHECK(pd != NULL, "ibv_alloc_pd: %s", strerror(errno));
        struct ibv_mr *mr = pd ? vb.reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) : NULL;
        CHECK(mr != NULL, "ibv_reg_mr: %s", strerror(errno));
        struct ibv_cq *cq = vb.create_cq(ctx, 4, NULL, NULL, 0);
        CHECK(cq != NULL, "ibv_create_cq: %s", strerror(errno));
        struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
                                              .max_recv_sge = 1}};
        struct ibv_qp *qp = pd && cq ? vb.create_qp(pd, &qa) : NULL;
        CHECK(qp != NULL, "ibv_create_qp: %s", strerror(errno));
        struct mlx5dv_pd dvpd = {0};
        struct mlx5dv_obj obj = {.pd = {.in = pd, .out = &dvpd}};
        CHECK(pd && vb.init_obj(&obj, MLX5DV_OBJ_PD) == 0, "mlx5dv_init_obj(PD)");
        if (mr && qp) {
            uint64_t addr = (uint64_t)(uintptr_t)buf + PAGE, len = 2 * PAGE;
            uint32_t handle = 0, key = 0;
            int err = create_klm_key(ctx, dvpd.pdn, qp->qp_num, mr->lkey, addr, len, false, &handle, &key);
            CHECK(err == 0, "a DevX KLM key bound to QP 0x%x (firmware that needs the wildcard QPN fails here)",
                  qp->qp_num);
            if (err == 0) {
                printf("key 0x%08x, DevX object %u, QP 0x%x\n", key, handle, qp->qp_num);
                check_key(&p, ctx->cmd_fd, nic, handle, key, qp->qp_num, addr, len);
                destroy_obj(ctx->cmd_fd, handle);
            }
            /* A key any QP may use: the helper must refuse it whatever QP the request names. */
            uint32_t any_handle = 0, any_key = 0;
            err = create_klm_key(ctx, dvpd.pdn, qp->qp_num, mr->lkey, addr, len, true, &any_handle, &any_key);
            CHECK(err == 0, "a DevX KLM key for any QP");
            if (err == 0) {
                struct orb_hp_devx_verify w = {.obj_handle = any_handle, .key = any_key, .qpn = qp->qp_num,
                                               .addr = addr, .length = len, .access = 1};
                snprintf(w.nic, sizeof w.nic, "%s", nic);
                CHECK(verify(&p, &w) == ORB_EPERM, "a key not bound to one QP");
                destroy_obj(ctx->cmd_fd, any_handle);
            }
        }
        if (qp)
            vb.destroy_qp(qp);
        if (cq)
            vb.destroy_cq(cq);
        if (mr)
            vb.dereg_mr(mr);
        if (pd)
            vb.dealloc_pd(pd);
        vb.close_device(ctx);
        free(buf);
    } else if (fd >= 0) {
        close(fd);
    }
    hp_close(&p);
    int ws = p.pid > 0 ? hp_wait(&p, WAIT_MS) : -1;
    CHECK(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "helper exit status 0x%x", ws);
    hp_remove_tree(root);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
