/* orbite-helper's requests: HELLO, INVENTORY, POLICY, OPEN_DEVICE, PEERMEM_PROBE, SLOT_ATTACH,
 * DEVX_VERIFY. Every decision uses the state prepared before the filter; the tenant's identity
 * is the helper's own, never a message field. */
#include "helper/helper.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "core/error.h"
#include "helper/monitor.h"
#include "helper/sandbox.h"
#include "topo/sysfs.h"

#define ATTR_MAX 128             /* a sysfs attribute we read */
#define VERBS_DIR "class/infiniband_verbs"
#define VERBS_ENTRIES_MAX 4096   /* entries examined in class/infiniband_verbs */
#define DEV_NUMBER_MAX 0xFFFFFu  /* minor numbers are 20 bits, majors 12 */

const char *const orb_helper_peermem_files[ORB_HELPER_PEERMEM_CANDIDATES] = {
    "kernel/mm/memory_peers/nv_mem/version",
    "kernel/mm/memory_peers/nv_mem_nc/version",
    "module/nvidia_peermem/version",
};

/* ---- state ----------------------------------------------------------------------------------- */

void orb_helper_state_init(struct orb_helper_state *st, int sock, struct orb_topo_inventory *inv)
{
    memset(st, 0, sizeof *st);
    st->sock = sock;
    st->sysfs_fd = st->devib_fd = st->shm_fd = st->priv_fd = st->monitor_sock = -1;
    st->priv = &orb_helper_priv_local;
    st->admin_gid = (gid_t)-1;
    st->inv = inv;
    for (unsigned i = 0; i < ORB_TOPO_MAX_NICS; i++)
        st->dev_fds[i] = -1;
    for (unsigned i = 0; i < ORB_HP_MAX_SLOTS; i++) {
        st->slots[i].fd = st->slots[i].lock_fd = st->slots[i].dir_fd = -1;
        st->slot_dirs[i].fd = -1;
    }
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        (void)close(*fd);
    *fd = -1;
}

void orb_helper_state_release(struct orb_helper_state *st)
{
    if (st == NULL)
        return;
    close_fd(&st->sysfs_fd);
    close_fd(&st->devib_fd);
    close_fd(&st->shm_fd);
    close_fd(&st->priv_fd);
    close_fd(&st->monitor_sock);
    for (unsigned i = 0; i < ORB_TOPO_MAX_NICS; i++)
        close_fd(&st->dev_fds[i]);
    for (unsigned i = 0; i < ORB_HP_MAX_SLOTS; i++) {
        struct orb_helper_slot *s = &st->slots[i];
        if (s->name[0] == '\0')
            continue;
        if (s->map != NULL)
            munmap(s->map, ORB_HELPER_SLOT_SIZE);
        close_fd(&s->fd);
        close_fd(&s->lock_fd);
        memset(s, 0, sizeof *s);
        s->fd = s->lock_fd = s->dir_fd = -1;
    }
    for (unsigned i = 0; i < ORB_HP_MAX_SLOTS; i++) {
        close_fd(&st->slot_dirs[i].fd);
        st->slot_dirs[i].name[0] = '\0';
    }
    free(st->inv);
    st->inv = NULL;
}

/* ---- small sysfs reads ----------------------------------------------------------------------- */

/* Read a small regular file below `dirfd` into buf as a string without its trailing newline.
 * Fails (false) on anything else: absent, not regular, larger than the buffer, embedded NUL. */
static bool read_attr(int dirfd, const char *path, char *buf, size_t cap)
{
    if (dirfd < 0)
        return false;
    int fd = openat(dirfd, path, ORB_SANDBOX_ATTR_FLAGS);
    if (fd < 0)
        return false;
    bool ok = false;
    struct stat st;
    size_t used = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        goto close_file;
    for (;;) {
        ssize_t n = read(fd, buf + used, cap - 1 - used);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            goto close_file;
        if (n == 0)
            break;
        used += (size_t)n;
        if (used == cap - 1) {
            char spill;
            if (read(fd, &spill, 1) != 0)
                goto close_file; /* larger than the buffer */
            break;
        }
    }
    if (memchr(buf, '\0', used) != NULL)
        goto close_file;
    if (used > 0 && buf[used - 1] == '\n')
        used--;
    buf[used] = '\0';
    ok = true;
close_file:
    close(fd);
    return ok;
}

/* "MAJOR:MINOR" exactly, decimal. */
static bool parse_dev_number(const char *s, dev_t *out)
{
    unsigned long v[2] = {0, 0};
    for (int part = 0; part < 2; part++) {
        if (*s < '0' || *s > '9')
            return false;
        while (*s >= '0' && *s <= '9') {
            v[part] = v[part] * 10 + (unsigned long)(*s - '0');
            if (v[part] > DEV_NUMBER_MAX)
                return false;
            s++;
        }
        if (part == 0 && *s++ != ':')
            return false;
    }
    if (*s != '\0')
        return false;
    *out = makedev(v[0], v[1]);
    return true;
}

static bool uverbs_name_valid(const char *name)
{
    if (strncmp(name, "uverbs", 6) != 0 || name[6] == '\0' || strlen(name) >= ORB_HELPER_UVERBS_MAX)
        return false;
    for (const char *p = name + 6; *p; p++)
        if (*p < '0' || *p > '9')
            return false;
    return true;
}

int orb_helper_find_nic(const struct orb_helper_state *st, const char *name)
{
    if (st->inv == NULL || name == NULL)
        return -1;
    for (uint32_t i = 0; i < st->inv->nnics; i++) {
        const struct orb_topo_nic *n = &st->inv->nics[i];
        if (n->name[0] != '\0' && strcmp(n->name, name) == 0 && n->id < ORB_TOPO_MAX_NICS)
            return n->id;
    }
    return -1;
}

static const struct orb_topo_nic *nic_by_id(const struct orb_helper_state *st, int id)
{
    for (uint32_t i = 0; st->inv != NULL && i < st->inv->nnics; i++)
        if (st->inv->nics[i].id == id)
            return &st->inv->nics[i];
    return NULL;
}

void orb_helper_map_devices(struct orb_helper_state *st)
{
    if (st->sysfs_fd < 0 || st->inv == NULL)
        return;
    for (uint32_t i = 0; i < st->inv->nnics; i++) {
        const struct orb_topo_nic *n = &st->inv->nics[i];
        char path[256], link[256];
        if (n->name[0] == '\0' || n->id >= ORB_TOPO_MAX_NICS)
            continue;
        snprintf(path, sizeof path, "class/infiniband/%s/device/driver", n->name);
        ssize_t len = readlinkat(st->sysfs_fd, path, link, sizeof link - 1);
        if (len > 0) {
            link[len] = '\0';
            const char *base = strrchr(link, '/');
            st->mlx5[n->id] = strcmp(base ? base + 1 : link, "mlx5_core") == 0;
        }
    }
    int dfd = openat(st->sysfs_fd, VERBS_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    DIR *d = fdopendir(dfd);
    if (d == NULL) {
        close(dfd);
        return;
    }
    struct dirent *e;
    for (unsigned seen = 0; seen < VERBS_ENTRIES_MAX && (e = readdir(d)) != NULL; seen++) {
        if (!uverbs_name_valid(e->d_name))
            continue;
        char path[128], ibdev[ATTR_MAX];
        snprintf(path, sizeof path, VERBS_DIR "/%.*s/ibdev", ORB_HELPER_UVERBS_MAX, e->d_name);
        if (!read_attr(st->sysfs_fd, path, ibdev, sizeof ibdev))
            continue;
        int id = orb_helper_find_nic(st, ibdev);
        if (id >= 0 && st->uverbs[id][0] == '\0')
            memcpy(st->uverbs[id], e->d_name, strlen(e->d_name) + 1); /* valid: shorter than the field */
    }
    closedir(d);
}

/* ---- replies --------------------------------------------------------------------------------- */

/* Every reply: never blocks past ORB_HELPER_REPLY_DEADLINE_MS. A library that leaves its replies
 * unread that long ends its session (ORB_HELPER_EXIT_STALLED), so it can hold the worker no
 * longer than that; the monitor, which publishes the slots, never waits on it at all. */
static int reply(struct orb_helper_state *st, const uint8_t *buf, size_t len, const int *fds, size_t nfds)
{
    int rc = orb_hp_send_deadline(st->sock, buf, len, fds, nfds, ORB_HELPER_REPLY_DEADLINE_MS);
    if (rc == ORB_ETIMEDOUT)
        st->exit_code = ORB_HELPER_EXIT_STALLED;
    return rc;
}

static int send_status(struct orb_helper_state *st, uint16_t type, uint32_t seq, int status)
{
    uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 0;
    int rc = orb_hp_encode_status(type, seq, status, buf, &len);
    return rc != 0 ? rc : reply(st, buf, len, NULL, 0);
}

/* An fd reply: status 0 with `fd` (closed here either way), or a refusal. */
static int send_fd_reply(struct orb_helper_state *st, uint16_t type, uint32_t seq, int status, int fd)
{
    uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 0;
    int rc = orb_hp_encode_fd_reply(type, seq, status, status == 0 ? 1 : 0, buf, &len);
    if (rc == 0)
        rc = reply(st, buf, len, &fd, status == 0 ? 1 : 0);
    if (fd >= 0)
        close(fd);
    return rc;
}

static bool rdma_allowed(const struct orb_helper_state *st, int nic_id)
{
    return (st->allowed.transports & ORB_HP_T_RDMA) != 0 && nic_id >= 0 && nic_id < 64 &&
           ((st->allowed.nic_mask >> nic_id) & 1u) != 0;
}

const struct orb_topo_nic *orb_helper_granted_nic(const struct orb_helper_state *st, int nic_id)
{
    return rdma_allowed(st, nic_id) ? nic_by_id(st, nic_id) : NULL;
}

/* ---- HELLO ----------------------------------------------------------------------------------- */

int orb_helper_on_hello(struct orb_helper_state *st, const struct orb_hp_msg *m)
{
    uint32_t version = 0;
    int status = orb_hp_decode_hello(m, &version);
    uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 0;
    /* Exact version match or nothing. A well-formed HELLO of another version (the decoder
     * refuses it) is told why before the session ends; anything else just ends it. */
    if (status != 0 && m->body_len != 4)
        return status;
    int rc = orb_hp_encode_hello_reply(m->hdr.sequence, status == 0 ? 0 : ORB_EPROTO, (uint32_t)st->uid,
                                       (uint32_t)st->gid, (uint32_t)(st->caps_kept & 0xFFFFFFFFu), buf, &len);
    if (rc == 0)
        rc = reply(st, buf, len, NULL, 0);
    if (rc != 0)
        return rc;
    if (status != 0)
        return orb_fail(ORB_EPROTO, "helper: HELLO of another protocol version");
    st->hello_done = true;
    return 0;
}

/* ---- INVENTORY ------------------------------------------------------------------------------- */

int orb_helper_on_inventory(struct orb_helper_state *st, const struct orb_hp_msg *m)
{
    uint8_t kind = 0;
    uint32_t index = 0;
    int rc = orb_hp_decode_inventory(m, &kind, &index);
    if (rc != 0)
        return rc;
    const struct orb_topo_inventory *inv = st->inv;
    const struct orb_topo_nic *nic = NULL;
    const struct orb_topo_gpu *gpu = NULL;
    const struct orb_topo_numa *numa = NULL;
    uint32_t total = 0;
    /* The tenant sees only what the policy lets it use; items keep their inventory ids. */
    switch (kind) {
    case ORB_HP_INV_NIC:
        for (uint32_t i = 0; inv && i < inv->nnics; i++) {
            const struct orb_topo_nic *n = &inv->nics[i];
            if (n->id >= 64 || !((st->allowed.nic_mask >> n->id) & 1u))
                continue;
            if (total++ == index)
                nic = n;
        }
        break;
    case ORB_HP_INV_GPU:
        for (uint32_t i = 0; inv && i < inv->ngpus; i++) {
            const struct orb_topo_gpu *g = &inv->gpus[i];
            if (g->ordinal >= 64 || !((st->allowed.gpu_mask >> g->ordinal) & 1u))
                continue;
            if (total++ == index)
                gpu = g;
        }
        break;
    case ORB_HP_INV_NUMA:
        total = inv ? inv->nnuma : 0;
        if (index < total)
            numa = &inv->numa[index];
        break;
    default:
        return orb_fail(ORB_EPROTO, "helper: inventory kind %u", kind);
    }
    int status = nic || gpu || numa ? 0 : ORB_ENOENT;
    uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 0;
    rc = orb_hp_encode_inventory_reply(m->hdr.sequence, status, total, kind, nic, gpu, numa, buf, &len);
    if (rc != 0) /* an item the codec refuses: answer without it rather than end the session */
        rc = orb_hp_encode_inventory_reply(m->hdr.sequence, ORB_EUNAVAILABLE, total, kind, NULL, NULL, NULL, buf,
                                           &len);
    return rc != 0 ? rc : reply(st, buf, len, NULL, 0);
}

/* ---- POLICY ---------------------------------------------------------------------------------- */

int orb_helper_on_policy(struct orb_helper_state *st, const struct orb_hp_msg *m)
{
    int rc = orb_hp_decode_empty(m);
    if (rc != 0)
        return rc;
    uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 0;
    rc = orb_hp_encode_policy_reply(m->hdr.sequence, 0, &st->allowed, buf, &len);
    return rc != 0 ? rc : reply(st, buf, len, NULL, 0);
}

/* ---- OPEN_DEVICE ----------------------------------------------------------------------------- */

int orb_helper_open_uverbs(struct orb_helper_state *st, int id, int *out)
{
    const struct orb_topo_nic *n = nic_by_id(st, id);
    if (n == NULL || st->devib_fd < 0 || st->sysfs_fd < 0 || st->uverbs[id][0] == '\0')
        return orb_fail(ORB_EUNAVAILABLE, "open device: NIC %d has no uverbs node", id);
    const char *nic = n->name;
    const char *node = st->uverbs[id];
    char path[128], value[ATTR_MAX];
    dev_t expected;
    snprintf(path, sizeof path, VERBS_DIR "/%s/ibdev", node);
    if (!read_attr(st->sysfs_fd, path, value, sizeof value) || strcmp(value, nic) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "open device %s: %s no longer belongs to it", nic, node);
    snprintf(path, sizeof path, VERBS_DIR "/%s/dev", node);
    if (!read_attr(st->sysfs_fd, path, value, sizeof value) || !parse_dev_number(value, &expected))
        return orb_fail(ORB_EUNAVAILABLE, "open device %s: no device number for %s", nic, node);

    int fd = openat(st->devib_fd, node, ORB_SANDBOX_NODE_FLAGS);
    int err = errno;
    if (fd < 0) {
        if (err == ELOOP)
            return orb_fail(ORB_EPERM, "open device %s: %s is a symbolic link", nic, node);
        return orb_fail(err == ENOENT ? ORB_EUNAVAILABLE : ORB_EPERM, "open device %s: %s: %s", nic, node,
                        strerror(err));
    }
    struct stat s;
    if (fstat(fd, &s) != 0 || !S_ISCHR(s.st_mode) || s.st_rdev != expected) {
        close(fd);
        return orb_fail(ORB_EPERM, "open device %s: %s is not the NIC's character device", nic, node);
    }
    *out = fd;
    return 0;
}

int orb_helper_on_open_device(struct orb_helper_state *st, const struct orb_hp_msg *m)
{
    char nic[ORB_HP_NAME_MAX + 1];
    int rc = orb_hp_decode_open_device(m, nic);
    if (rc != 0)
        return rc;
    uint16_t type = ORB_HP_OPEN_DEVICE_REPLY;
    int id = orb_helper_find_nic(st, nic);
    if (id < 0)
        return send_fd_reply(st, type, m->hdr.sequence, ORB_ENOENT, -1);
    if (!rdma_allowed(st, id))
        return send_fd_reply(st, type, m->hdr.sequence, ORB_EPERM, -1);
    const struct orb_topo_nic *n = nic_by_id(st, id);
    if (n == NULL || !n->usable || st->uverbs[id][0] == '\0')
        return send_fd_reply(st, type, m->hdr.sequence, ORB_EUNAVAILABLE, -1);
    /* ibv_import_device() adopts a context only through a provider import step, which rdma-core
     * has for mlx5 alone; the context request is mlx5's too (uctx.h). */
    if (!st->mlx5[id] || st->uctx_ops == NULL) {
        orb_fail(ORB_EUNAVAILABLE, "open device %s: not an mlx5 device; no importable context", nic);
        return send_fd_reply(st, type, m->hdr.sequence, ORB_EUNAVAILABLE, -1);
    }
    int fd = -1;
    int status = st->priv->open_node(st, id, &fd);
    if (status == ORB_EPEER)
        return status; /* the monitor is gone: the session ends (exit_code says why) */
    if (status != 0)
        return send_fd_reply(st, type, m->hdr.sequence, status, -1);
    bool devx = false;
    status = orb_uctx_create(st->uctx_ops, st->uctx_impl, fd, nic, &devx);
    if (status != 0) {
        close(fd);
        return send_fd_reply(st, type, m->hdr.sequence, status, -1);
    }
    /* Keep our own reference to the tenant's device context: DEVX_VERIFY queries its objects. */
    int keep = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (keep < 0) {
        close(fd);
        return send_fd_reply(st, type, m->hdr.sequence, ORB_EUNAVAILABLE, -1);
    }
    close_fd(&st->dev_fds[id]);
    st->dev_fds[id] = keep;
    st->devx[id] = devx;
    return send_fd_reply(st, type, m->hdr.sequence, 0, fd);
}

/* ---- PEERMEM_PROBE --------------------------------------------------------------------------- */

int orb_helper_on_peermem(struct orb_helper_state *st, const struct orb_hp_msg *m)
{
    int rc = orb_hp_decode_empty(m);
    if (rc != 0)
        return rc;
    /* A version file is the evidence; a bare module directory is not. */
    uint32_t found = 0;
    for (unsigned i = 0; st->sysfs_fd >= 0 && i < ORB_HELPER_PEERMEM_CANDIDATES; i++) {
        struct stat s;
        if (fstatat(st->sysfs_fd, orb_helper_peermem_files[i], &s, 0) == 0 && S_ISREG(s.st_mode))
            found |= 1u << i;
    }
    uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 0;
    rc = orb_hp_encode_peermem_reply(m->hdr.sequence, 0, found, buf, &len);
    return rc != 0 ? rc : reply(st, buf, len, NULL, 0);
}

/* ---- SLOT_ATTACH ----------------------------------------------------------------------------- */

/* The index of `name` among the slots the policy grants, or -1. */
static int slot_granted(const struct orb_helper_state *st, const char *name)
{
    for (uint32_t i = 0; i < st->allowed.nslots && i < ORB_HP_MAX_SLOTS; i++)
        if (strcmp(st->allowed.slots[i], name) == 0)
            return (int)i;
    return -1;
}

int orb_helper_on_slot_attach(struct orb_helper_state *st, const struct orb_hp_msg *m)
{
    char name[ORB_HP_NAME_MAX + 1];
    uint64_t interval_ns = 0;
    int rc = orb_hp_decode_slot_attach(m, name, &interval_ns);
    if (rc != 0)
        return rc;
    int index = slot_granted(st, name);
    if (index < 0)
        return send_fd_reply(st, ORB_HP_SLOT_REPLY, m->hdr.sequence, ORB_EPERM, -1);
    int fd = -1;
    int status = st->priv->open_slot(st, (uint32_t)index, interval_ns, &fd);
    if (status == ORB_EPEER)
        return status; /* the monitor is gone: the session ends (exit_code says why) */
    return send_fd_reply(st, ORB_HP_SLOT_REPLY, m->hdr.sequence, status, fd);
}

/* ---- DEVX_VERIFY ----------------------------------------------------------------------------- */

int orb_helper_on_devx_verify(struct orb_helper_state *st, const struct orb_hp_msg *m)
{
    struct orb_hp_devx_verify v;
    int rc = orb_hp_decode_devx_verify(m, &v);
    if (rc != 0)
        return rc;
    int id = orb_helper_find_nic(st, v.nic);
    int status;
    if (id < 0)
        status = ORB_ENOENT;
    else if (!rdma_allowed(st, id))
        status = ORB_EPERM;
    else if (!st->mlx5[id] || st->devx_ops == NULL)
        status = ORB_EUNAVAILABLE;
    else if (st->dev_fds[id] < 0)
        status = ORB_EINVAL; /* OPEN_DEVICE first: the key lives in that device context */
    else if (!st->devx[id])
        status = ORB_EUNAVAILABLE; /* the kernel refused DevX for that context */
    else
        status = orb_devx_verify(st->devx_ops, st->devx_impl, st->dev_fds[id], &v);
    if (status < ORB_EAGAIN || status > 0)
        status = ORB_EUNAVAILABLE;
    return send_status(st, ORB_HP_DEVX_REPLY, m->hdr.sequence, status);
}
