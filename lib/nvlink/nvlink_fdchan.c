/* The NVLink transport's descriptor channel: an allocation with no legacy IPC handle (a virtual
 * memory management one) is shared by a file descriptor, and a descriptor cannot cross the TCP
 * control connection. The source listens on a Unix SEQPACKET socket in the abstract namespace,
 * named by a random id it gives in BEGIN_OK; a requester connects, sends FETCH with the token
 * of a group the source holds, and gets FETCH_OK with the descriptor attached (SCM_RIGHTS).
 * The token is the whole authority (it came over the authenticated control connection); the
 * socket's own name is no secret. One connection, one FETCH. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/thread_name.h"
#include "nvlink/nvlink_internal.h"

#define NAME_PREFIX "orbite-nvl-"

/* The abstract address of channel `id`; *len_out its length. */
static void channel_address(const uint8_t id[ORB_NVL_ID_LEN], struct sockaddr_un *a, socklen_t *len_out)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    char name[sizeof NAME_PREFIX + 2 * ORB_NVL_ID_LEN];
    int n = snprintf(name, sizeof name, "%s", NAME_PREFIX);
    for (uint32_t i = 0; i < ORB_NVL_ID_LEN; i++)
        n += snprintf(name + n, sizeof name - (size_t)n, "%02x", id[i]);
    /* sun_path[0] stays NUL: the abstract namespace, no file to leave behind or to race on. */
    memcpy(a->sun_path + 1, name, (size_t)n);
    *len_out = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Wait until `fd` is ready for `events` or `deadline` passes: 0, or ORB_ETIMEDOUT. */
static int wait_for(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = orb_now_ns();
        if (now >= deadline)
            return ORB_ETIMEDOUT;
        uint64_t ms = (deadline - now + 999999u) / 1000000u;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, ms > 1000 ? 1000 : (int)ms);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return ORB_ETIMEDOUT;
    }
}

/* ---- the source ---------------------------------------------------------------------------- */

/* Answer one connection: its FETCH (within NVL_FETCH_WAIT_NS), then FETCH_OK. */
static void serve(struct nvl_tp *tp, int conn)
{
    uint8_t buf[64];
    if (wait_for(conn, POLLIN, orb_deadline_after(NVL_FETCH_WAIT_NS)) != 0)
        return; /* a connection that says nothing is dropped */
    ssize_t n = recv(conn, buf, sizeof buf, MSG_DONTWAIT);
    struct orb_nvl_fetch f;
    struct orb_nvl_fetch_ok ok = {0};
    int fd = -1;
    if (n <= 0 || orb_nvl_fetch_decode(buf, (size_t)n, &f) != 0) {
        ORB_LOGD("nvlink source: a malformed FETCH on the descriptor channel: %s", n > 0 ? orb_last_error() : "none");
        return; /* not one of ours: no answer at all */
    }
    ok.status = nvl_source_fetch(tp, &f, &fd, &ok.size);
    if (ok.status != 0)
        ok.size = 0;
    size_t len = 0;
    if (orb_nvl_fetch_ok_encode(&ok, buf, sizeof buf, &len) != 0)
        goto close_fd;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        msg.msg_control = control.bytes;
        msg.msg_controllen = sizeof control.bytes;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    if (sendmsg(conn, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        ORB_LOGD("nvlink source: a FETCH_OK could not be sent: %s", strerror(errno));
close_fd:
    if (fd >= 0)
        (void)close(fd); /* the peer holds its own copy now, or nothing */
}

static void *channel_main(void *arg)
{
    struct nvl_tp *tp = arg;
    orb_thread_name("nvl-fdchan");
    while (!atomic_load(&tp->chan_quit)) {
        struct pollfd p = {.fd = tp->chan_fd, .events = POLLIN};
        if (poll(&p, 1, 200) <= 0)
            continue;
        int conn = accept4(tp->chan_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (conn < 0)
            continue;
        serve(tp, conn);
        (void)close(conn);
    }
    return NULL;
}

int nvl_fdchan_open(struct nvl_tp *tp)
{
    pthread_mutex_lock(&tp->lock);
    int rc = 0;
    if (tp->chan_started)
        goto unlock;
    uint8_t id[ORB_NVL_ID_LEN];
    if ((rc = orb_random_bytes(id, sizeof id)) != 0)
        goto unlock;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un a;
    socklen_t alen = 0;
    channel_address(id, &a, &alen);
    if (fd < 0 || bind(fd, (const struct sockaddr *)&a, alen) != 0 || listen(fd, 64) != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "nvlink: cannot open the descriptor channel: %s", strerror(errno));
        if (fd >= 0)
            (void)close(fd);
        goto unlock;
    }
    tp->chan_fd = fd;
    memcpy(tp->chan_id, id, sizeof id);
    atomic_store(&tp->chan_quit, false);
    if (pthread_create(&tp->chan_thread, NULL, channel_main, tp) != 0) {
        (void)close(fd);
        tp->chan_fd = -1;
        rc = orb_fail(ORB_ENOMEM, "nvlink: cannot start the descriptor channel's thread");
        goto unlock;
    }
    tp->chan_started = true;
unlock:
    pthread_mutex_unlock(&tp->lock);
    return rc;
}

void nvl_fdchan_close(struct nvl_tp *tp)
{
    if (!tp->chan_started)
        return;
    atomic_store(&tp->chan_quit, true);
    pthread_join(tp->chan_thread, NULL);
    (void)close(tp->chan_fd);
    tp->chan_fd = -1;
    tp->chan_started = false;
}

/* ---- the requester ------------------------------------------------------------------------- */

int nvl_fdchan_fetch(const uint8_t channel[ORB_NVL_ID_LEN], const struct orb_nvl_fetch *f, uint64_t deadline,
                     int *fd_out, uint64_t *size_out)
{
    uint8_t buf[64];
    size_t len = 0;
    int rc = orb_nvl_fetch_encode(f, buf, sizeof buf, &len);
    if (rc != 0)
        return rc;
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return orb_fail(ORB_ENOMEM, "nvlink: no socket for the source's descriptor channel: %s", strerror(errno));
    struct sockaddr_un a;
    socklen_t alen = 0;
    channel_address(channel, &a, &alen);
    if (connect(s, (const struct sockaddr *)&a, alen) != 0) {
        /* Gone (the source's engine ended), or another network namespace than the source's:
         * abstract sockets are per namespace. */
        rc = orb_fail(errno == EAGAIN ? ORB_EAGAIN : ORB_EUNAVAILABLE,
                      "nvlink: the source's descriptor channel cannot be reached from here: %s", strerror(errno));
        goto close_socket;
    }
    if ((rc = wait_for(s, POLLOUT, deadline)) != 0 || send(s, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)len) {
        rc = orb_fail(rc != 0 ? rc : ORB_EPEER, "nvlink: sending FETCH to the source's descriptor channel failed");
        goto close_socket;
    }
    if ((rc = wait_for(s, POLLIN, deadline)) != 0) {
        rc = orb_fail(ORB_ETIMEDOUT, "nvlink: the source's descriptor channel did not answer in time");
        goto close_socket;
    }
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int) * 4)];
    } control;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                         .msg_controllen = sizeof control.bytes};
    ssize_t n = recvmsg(s, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    /* Every descriptor that came, whatever else is wrong: ours to close unless it is the one. */
    int got[4], ngot = 0;
    for (struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k && ngot < 4; i++)
            memcpy(&got[ngot++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    struct orb_nvl_fetch_ok ok;
    if (n <= 0)
        rc = orb_fail(ORB_EPEER, "nvlink: the source's descriptor channel closed without an answer");
    else if ((msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0)
        rc = orb_fail(ORB_EPROTO, "nvlink: the source's FETCH_OK came truncated");
    else if ((rc = orb_nvl_fetch_ok_decode(buf, (size_t)n, &ok)) != 0)
        ;
    else if (ok.status != 0)
        rc = orb_fail(ok.status, "nvlink: the source refused the descriptor of allocation %u", f->alloc);
    else if (ngot != 1)
        rc = orb_fail(ORB_EPROTO, "nvlink: the source's FETCH_OK came with %d descriptors, not one", ngot);
    if (rc == 0) {
        *fd_out = got[0];
        *size_out = ok.size;
        ngot = 0;
    }
    for (int i = 0; i < ngot; i++)
        (void)close(got[i]);
close_socket:
    (void)close(s);
    return rc;
}
