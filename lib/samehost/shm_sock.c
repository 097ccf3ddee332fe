/* The same-host transport's Unix sockets and the checks on memory files a peer sends. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "samehost/shm_internal.h"

#define TMPFS_MAGIC_VALUE 0x01021994L

#ifdef SHM_TSAN
char shm_tsan_order;
#endif

size_t shm_sock_name(const uint8_t id[ORB_SHM_ID_LEN], char *out, size_t cap)
{
    static const char prefix[] = "orbite-shm-";
    size_t need = 1 + sizeof prefix - 1 + 2 * ORB_SHM_ID_LEN;
    if (cap < need)
        return 0;
    out[0] = '\0'; /* the abstract namespace: no file, gone with the socket */
    memcpy(out + 1, prefix, sizeof prefix - 1);
    for (unsigned i = 0; i < ORB_SHM_ID_LEN; i++)
        snprintf(out + 1 + sizeof prefix - 1 + 2 * i, 3, "%02x", id[i]);
    return need;
}

static int sock_addr(const uint8_t id[ORB_SHM_ID_LEN], struct sockaddr_un *sa, socklen_t *len)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    size_t n = shm_sock_name(id, sa->sun_path, sizeof sa->sun_path);
    if (n == 0)
        return orb_fail(ORB_EINVAL, "shm: socket name too long");
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    return 0;
}

/* A non-blocking SEQPACKET socket and the address of the socket with `id`. */
static int new_socket(const uint8_t id[ORB_SHM_ID_LEN], struct sockaddr_un *sa, socklen_t *sl, int *fd_out)
{
    int rc = sock_addr(id, sa, sl);
    if (rc != 0)
        return rc;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "shm: cannot make a Unix socket: %s", strerror(errno));
    *fd_out = fd;
    return 0;
}

int shm_sock_listen(const uint8_t id[ORB_SHM_ID_LEN], int *fd_out)
{
    struct sockaddr_un sa;
    socklen_t sl;
    int fd = -1;
    int rc = new_socket(id, &sa, &sl, &fd);
    if (rc != 0)
        return rc;
    if (bind(fd, (struct sockaddr *)&sa, sl) != 0 || listen(fd, 64) != 0) {
        int e = errno;
        close(fd);
        return orb_fail(ORB_EUNAVAILABLE, "shm: cannot listen on the abstract Unix socket @%s: %s",
                        sa.sun_path + 1, strerror(e));
    }
    *fd_out = fd;
    return 0;
}

/* Wait for `events` on `fd` until `deadline`. 0, ORB_ETIMEDOUT, or ORB_EPEER on an error. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, orb_deadline_poll_ms(deadline));
        if (n > 0)
            return 0;
        if (n == 0)
            return orb_fail(ORB_ETIMEDOUT, "shm: the same-host peer did not answer in time");
        if (errno != EINTR)
            return orb_fail(ORB_EPEER, "shm: poll: %s", strerror(errno));
    }
}

int shm_sock_connect(const uint8_t id[ORB_SHM_ID_LEN], uint64_t deadline, int *fd_out)
{
    struct sockaddr_un sa;
    socklen_t sl;
    int fd = -1;
    int rc = new_socket(id, &sa, &sl, &fd);
    if (rc != 0)
        return rc;
    for (;;) {
        if (connect(fd, (struct sockaddr *)&sa, sl) == 0)
            break;
        int e = errno;
        /* A full backlog says EAGAIN for Unix sockets: wait a little and try again. */
        if ((e == EAGAIN || e == EINTR) && orb_now_ns() < deadline) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            continue;
        }
        close(fd);
        if (e == EAGAIN)
            return orb_fail(ORB_ETIMEDOUT, "shm: the source's Unix socket accepted no connection in time");
        /* Another network namespace does not see the abstract name: not a path, not an error. */
        return orb_fail(ORB_EUNAVAILABLE, "shm: cannot reach the source's Unix socket @%s: %s (another network "
                        "namespace?)", sa.sun_path + 1, strerror(e));
    }
    *fd_out = fd;
    return 0;
}

int shm_sock_send(int sock, const uint8_t *msg, size_t len, int fd, uint64_t deadline)
{
    struct iovec iov = {.iov_base = (void *)(uintptr_t)msg, .iov_len = len};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    for (;;) {
        ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == (ssize_t)len)
            return 0;
        if (n >= 0)
            return orb_fail(ORB_EPEER, "shm: a message was cut short");
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN) {
            int rc = wait_fd(sock, POLLOUT, deadline);
            if (rc != 0)
                return rc;
            continue;
        }
        return orb_fail(ORB_EPEER, "shm: the same-host peer's socket failed: %s", strerror(errno));
    }
}

static void close_passed(struct msghdr *mh)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c != NULL; c = CMSG_NXTHDR(mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            close(fd);
        }
    }
}

int shm_sock_recv(int sock, uint8_t *buf, size_t cap, size_t *len_out, int *fd_out, uint64_t deadline)
{
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    for (;;) {
        struct iovec iov = {.iov_base = buf, .iov_len = cap};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                            .msg_controllen = sizeof ctl.buf};
        ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int rc = wait_fd(sock, POLLIN, deadline);
            if (rc != 0)
                return rc;
            continue;
        }
        if (n < 0)
            return orb_fail(ORB_EPEER, "shm: the same-host peer's socket failed: %s", strerror(errno));
        if (n == 0 && mh.msg_controllen == 0)
            return orb_fail(ORB_EPEER, "shm: the same-host peer closed the connection");
        int got = -1, count = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                if (k >= 1 && count == 0)
                    memcpy(&got, CMSG_DATA(c), sizeof got);
                count += (int)k;
            } else {
                count += 2; /* credentials or anything else: not ours to take */
            }
        }
        if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || count > 1 || (count == 1 && fd_out == NULL)) {
            close_passed(&mh);
            return orb_fail(ORB_EPROTO, "shm: the same-host peer sent a message that is too long or carries "
                            "descriptors it may not");
        }
        *len_out = (size_t)n;
        if (fd_out != NULL)
            *fd_out = got;
        return 0;
    }
}

int shm_sock_closed(int sock)
{
    struct pollfd p = {.fd = sock, .events = 0};
    int n = poll(&p, 1, 0);
    return n > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
}

int shm_map_peer_file(int fd, uint64_t offset, uint64_t length, int writable, void **out)
{
    struct stat st;
    struct statfs sf;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return orb_fail(ORB_EPERM, "shm: the peer's descriptor is not a regular file");
    if (fstatfs(fd, &sf) != 0 || (long)sf.f_type != TMPFS_MAGIC_VALUE)
        return orb_fail(ORB_EPERM, "shm: the peer's file is not a memory file of tmpfs");
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
        return orb_fail(ORB_EPERM, "shm: the peer's memory file is not sealed against shrinking: it could "
                        "make this process fault");
    long page = sysconf(_SC_PAGESIZE);
    if (length == 0 || offset % (uint64_t)page != 0 || length % (uint64_t)page != 0 ||
        offset > UINT64_MAX - length || (uint64_t)st.st_size < offset + length)
        return orb_fail(ORB_EINVAL, "shm: [%llu, +%llu) is not whole pages of the peer's %lld-byte memory file",
                        (unsigned long long)offset, (unsigned long long)length, (long long)st.st_size);
    int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    void *p = mmap(NULL, (size_t)length, prot, MAP_SHARED | MAP_NORESERVE, fd, (off_t)offset);
    if (p == MAP_FAILED)
        return orb_fail(errno == ENOMEM ? ORB_ERESOURCE : ORB_EPERM, "shm: cannot map %llu bytes of the peer's "
                        "memory file%s: %s", (unsigned long long)length, writable ? " writable" : "",
                        strerror(errno));
    *out = p;
    return 0;
}
