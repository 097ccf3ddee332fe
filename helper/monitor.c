/* orbite-helper's privileged monitor: the two privileged steps, the local and remote ways to
 * ask for them, the fork and the monitor's loop (see monitor.h). */
#include "helper/monitor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <syslog.h>
#include <unistd.h>

#include "core/error.h"
#include "helper/helper.h"
#include "helper/sandbox.h"

#define REQUEST_LEN 24u
#define REPLY_LEN 16u /* the datagram layer's minimum: magic | status | type | zero */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- the steps, in this process ------------------------------------------------------------ */

static int local_open_node(struct orb_helper_state *st, int nic_id, int *fd_out)
{
    const struct orb_topo_nic *n = orb_helper_granted_nic(st, nic_id);
    if (n == NULL)
        return orb_fail(ORB_EPERM, "open device: NIC %d is not granted", nic_id);
    if (!n->usable || !st->mlx5[nic_id] || st->uverbs[nic_id][0] == '\0')
        return orb_fail(ORB_EUNAVAILABLE, "open device %s: no importable uverbs node", n->name);
    return orb_helper_open_uverbs(st, nic_id, fd_out);
}

static int local_open_slot(struct orb_helper_state *st, uint32_t slot_index, uint64_t interval_ns, int *fd_out)
{
    if (slot_index >= st->allowed.nslots || slot_index >= ORB_HP_MAX_SLOTS)
        return orb_fail(ORB_EPERM, "slot: index %u is not granted", slot_index);
    return orb_helper_slot_open_shared(st, st->allowed.slots[slot_index], interval_ns, fd_out);
}

const struct orb_helper_priv_ops orb_helper_priv_local = {
    .open_node = local_open_node,
    .open_slot = local_open_slot,
};

/* ---- the steps, asked of the monitor -------------------------------------------------------- */

static int monitor_lost(struct orb_helper_state *st, int *fds, size_t nfds)
{
    orb_hp_close_fds(fds, nfds);
    if (st->monitor_sock >= 0)
        (void)close(st->monitor_sock);
    st->monitor_sock = -1;
    st->exit_code = ORB_HELPER_EXIT_MONITOR;
    return ORB_EPEER;
}

static int remote_call(struct orb_helper_state *st, uint32_t type, uint32_t index, uint64_t interval_ns, int *fd_out)
{
    if (st->monitor_sock < 0)
        return monitor_lost(st, NULL, 0);
    uint8_t req[REQUEST_LEN];
    put32(req, ORB_MON_MAGIC);
    put32(req + 4, type);
    put32(req + 8, index);
    put32(req + 12, 0);
    put32(req + 16, (uint32_t)interval_ns);
    put32(req + 20, (uint32_t)(interval_ns >> 32));
    if (orb_hp_send_deadline(st->monitor_sock, req, sizeof req, NULL, 0, ORB_MON_TIMEOUT_MS) != 0)
        return monitor_lost(st, NULL, 0);
    uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 0, nfds = 0;
    int fds[1] = {-1};
    if (orb_hp_recv(st->monitor_sock, buf, &len, fds, 1, &nfds, ORB_MON_TIMEOUT_MS) != 0)
        return monitor_lost(st, NULL, 0);
    int32_t status = (int32_t)get32(buf + 4);
    bool well_formed = len == REPLY_LEN && get32(buf) == ORB_MON_MAGIC && get32(buf + 8) == type &&
                       get32(buf + 12) == 0 && status <= 0 && (status == 0) == (nfds == 1);
    if (!well_formed)
        return monitor_lost(st, fds, nfds);
    if (status == 0)
        *fd_out = fds[0];
    return status;
}

static int remote_open_node(struct orb_helper_state *st, int nic_id, int *fd_out)
{
    if (nic_id < 0)
        return ORB_EPERM;
    return remote_call(st, ORB_MON_OPEN_NODE, (uint32_t)nic_id, 0, fd_out);
}

static int remote_open_slot(struct orb_helper_state *st, uint32_t slot_index, uint64_t interval_ns, int *fd_out)
{
    return remote_call(st, ORB_MON_SLOT, slot_index, interval_ns, fd_out);
}

const struct orb_helper_priv_ops orb_helper_priv_remote = {
    .open_node = remote_open_node,
    .open_slot = remote_open_slot,
};

/* ---- the monitor's loop ---------------------------------------------------------------------- */

/* One request: 0 answered, negative when the worker broke the rules (the monitor then ends). */
static int answer(struct orb_helper_state *st, int sock, const uint8_t *buf, size_t len)
{
    if (len != REQUEST_LEN || get32(buf) != ORB_MON_MAGIC || get32(buf + 12) != 0)
        return orb_fail(ORB_EPROTO, "monitor: malformed request of %zu bytes", len);
    uint32_t type = get32(buf + 4), index = get32(buf + 8);
    uint64_t interval_ns = (uint64_t)get32(buf + 16) | (uint64_t)get32(buf + 20) << 32;
    int fd = -1, status;
    switch (type) {
    case ORB_MON_OPEN_NODE:
        if (interval_ns != 0 || orb_helper_granted_nic(st, (int)index) == NULL || index > INT32_MAX)
            return orb_fail(ORB_EPROTO, "monitor: the worker asked for NIC %u, which the policy does not grant", index);
        status = local_open_node(st, (int)index, &fd);
        break;
    case ORB_MON_SLOT:
        if (index >= st->allowed.nslots || index >= ORB_HP_MAX_SLOTS)
            return orb_fail(ORB_EPROTO, "monitor: the worker asked for slot %u, which the policy does not grant", index);
        status = local_open_slot(st, index, interval_ns, &fd);
        break;
    default:
        return orb_fail(ORB_EPROTO, "monitor: request type %u", type);
    }
    if (status > 0 || (status == 0 && fd < 0))
        status = ORB_EUNAVAILABLE;
    uint8_t rep[REPLY_LEN];
    put32(rep, ORB_MON_MAGIC);
    put32(rep + 4, (uint32_t)status);
    put32(rep + 8, type);
    put32(rep + 12, 0);
    int rc = orb_hp_send_deadline(sock, rep, sizeof rep, &fd, status == 0 ? 1 : 0, ORB_MON_TIMEOUT_MS);
    if (fd >= 0)
        (void)close(fd);
    return rc;
}

int orb_helper_monitor_serve(struct orb_helper_state *st, int sock)
{
    uint8_t buf[ORB_HP_MAX_MSG];
    for (;;) {
        /* Publication does not depend on the worker, let alone on the library. */
        bool ticking = orb_helper_slots_tick(st, orb_helper_now_ns());
        struct pollfd p = {.fd = sock, .events = POLLIN, .revents = 0};
        int ready = poll(&p, 1, ticking ? 1 : -1);
        if (ready < 0 && errno != EINTR)
            return orb_fail(ORB_EUNAVAILABLE, "monitor: poll: %s", strerror(errno));
        if (ready <= 0)
            continue;
        size_t len = 0, nfds = 0;
        int rc = orb_hp_recv(sock, buf, &len, NULL, 0, &nfds, 0);
        if (rc == ORB_EPEER)
            return 0; /* the worker is done */
        if (rc == ORB_ETIMEDOUT)
            continue;
        if (rc != 0) /* descriptors or control messages from the worker, truncation */
            return rc;
        rc = answer(st, sock, buf, len);
        if (rc != 0)
            return rc;
    }
}

/* The child: never returns. */
static void monitor_main(struct orb_helper_state *st, int sock, pid_t worker)
{
    if (st->sock >= 0)
        (void)close(st->sock); /* the library talks to the worker only */
    st->sock = -1;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != worker)
        _exit(ORB_HELPER_EXIT_ORPHAN);
    if (orb_sandbox_caps_effective() != 0) {
        syslog(LOG_ERR, "monitor: refusing to run: %s", orb_last_error());
        _exit(ORB_HELPER_EXIT_CAPS);
    }
    if (st->shm_fd >= 0 && st->allowed.nslots > 0 &&
        (orb_helper_slots_prepare(st) != 0 || orb_helper_slots_prepare_names(st) != 0))
        syslog(LOG_WARNING, "monitor: shared slots unavailable this session: %s", orb_last_error());
    st->sealed = true; /* from here on only the directories opened now can be used */
    int dirs[ORB_HP_MAX_SLOTS];
    unsigned ndirs = 0;
    for (unsigned i = 0; i < ORB_HP_MAX_SLOTS; i++)
        if (st->slot_dirs[i].name[0] != '\0')
            dirs[ndirs++] = st->slot_dirs[i].fd;
    /* Of /dev/infiniband, only the nodes of the NICs this tenant may open stay reachable. */
    int nodes[ORB_TOPO_MAX_NICS];
    unsigned nnodes = 0;
    for (int id = 0; id < ORB_TOPO_MAX_NICS && st->devib_fd >= 0; id++) {
        const struct orb_topo_nic *n = orb_helper_granted_nic(st, id);
        if (n == NULL || !n->usable || !st->mlx5[id] || st->uverbs[id][0] == '\0')
            continue;
        int fd = openat(st->devib_fd, st->uverbs[id], O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0)
            nodes[nnodes++] = fd;
    }
    struct orb_sandbox_paths reach = {
        .sysfs_fd = st->sysfs_fd,
        .shm_fd = st->shm_fd,
        .slot_dir_fds = dirs,
        .nslot_dirs = ndirs,
        .proc_fd = -1,
        .node_fds = nodes,
        .nnodes = nnodes,
    };
    int restricted = orb_sandbox_restrict_paths(&reach);
    for (unsigned i = 0; i < nnodes; i++)
        (void)close(nodes[i]);
    if (restricted < 0) {
        syslog(LOG_ERR, "monitor: refusing to run: %s", orb_last_error());
        _exit(ORB_HELPER_EXIT_STARTUP);
    }
    closelog(); /* its reconnects would need socket(), which the filter forbids */
    bool chown_needed = st->admin_uid != geteuid() || st->admin_gid != (gid_t)-1;
    struct orb_sandbox_monitor_rules rules = {
        .sysfs_fd = st->sysfs_fd,
        .devib_fd = st->devib_fd,
        .shm_fd = st->shm_fd,
        .slot_dir_fds = dirs,
        .nslot_dirs = ndirs,
        .chown = chown_needed,
        .chown_uid = (uint32_t)st->admin_uid,
        .chown_gid = (uint32_t)st->admin_gid,
    };
    if (orb_sandbox_load_monitor_filter(&rules) != 0)
        _exit(ORB_HELPER_EXIT_STARTUP);
    int rc = orb_helper_monitor_serve(st, sock);
    _exit(rc == 0 ? ORB_HELPER_EXIT_EOF : ORB_HELPER_EXIT_PROTOCOL);
}

int orb_helper_monitor_start(struct orb_helper_state *st)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "monitor: socketpair: %s", strerror(errno));
    pid_t worker = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        (void)close(sv[0]);
        (void)close(sv[1]);
        return orb_fail(ORB_EUNAVAILABLE, "monitor: fork: %s", strerror(err));
    }
    if (pid == 0) {
        (void)close(sv[0]);
        monitor_main(st, sv[1], worker);
    }
    (void)close(sv[1]);
    st->monitor_sock = sv[0];
    st->priv = &orb_helper_priv_remote;
    return 0;
}
