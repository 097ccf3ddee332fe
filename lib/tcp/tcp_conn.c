/* Socket helpers and nonblocking receive/send primitives of the TCP transport. */
#include "tcp_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/config.h"
#include "core/error.h"

/* Deep enough that a burst of strangers does not make good peers' SYNs wait for a retransmit;
 * the kernel caps it at net.core.somaxconn. */
#define TCP_LISTEN_BACKLOG 4096

int tcp_status_from_errno(int err)
{
    /* On an established connection, ETIMEDOUT is TCP giving up on an unresponsive peer. */
    return err == ETIMEDOUT ? ORB_EPEER : orb_status_from_errno(err);
}

void tcp_conn_init(struct tcp_conn *c, enum tcp_kind kind, int fd, const char *name)
{
    c->kind = kind;
    c->fd = fd;
    c->worker = NULL;
    c->prev = c->next = c->inbox_next = c->ready_next = c->poke_next = NULL;
    c->poked = 0;
    c->in_ready = 0;
    c->adopted = 0;
    c->serve_on_adopt = 0;
    c->turn_left = NULL;
    atomic_init(&c->last_progress_ns, orb_now_ns());
    c->can_recv = 1;
    c->peer_closed = 0;
    c->rx_start = c->rx_end = 0;
    c->rx_lookahead = TCP_RX_STAGE;
    c->rx_lowat = 1;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "?");
}

void tcp_conn_rx_event(struct tcp_conn *c, uint32_t events)
{
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
        c->can_recv = 1;
    /* The end of the stream raises no edge of its own once its event is taken: after it, only
     * recv() returning 0 (or an error) may say the socket is done. */
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
        c->peer_closed = 1;
}

void tcp_conn_touch(struct tcp_conn *c)
{
    atomic_store_explicit(&c->last_progress_ns, orb_now_ns(), memory_order_relaxed);
}

uint64_t tcp_turn_room(const struct tcp_conn *c)
{
    return c->turn_left != NULL ? *c->turn_left : UINT64_MAX;
}

void tcp_turn_spend(struct tcp_conn *c, uint64_t n)
{
    if (c->turn_left != NULL)
        *c->turn_left = n < *c->turn_left ? *c->turn_left - n : 0;
}

/* ---- receiving ------------------------------------------------------------------------------- */

static int rx_failed(struct tcp_conn *c, ssize_t n, int err)
{
    if (n == 0)
        return orb_fail(ORB_EPEER, "connection %s closed by the other end", c->name);
    return orb_fail(tcp_status_from_errno(err), "recv from %s failed: %s", c->name, strerror(err));
}

void tcp_rx_note_payload(struct tcp_conn *c, uint64_t len)
{
    c->rx_lookahead = len > TCP_RX_DIRECT_MIN ? TCP_RX_LOOKAHEAD : TCP_RX_STAGE;
}

static void rx_set_lowat(struct tcp_conn *c, int want)
{
    if (want != c->rx_lowat &&
        setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0)
        c->rx_lowat = want;
}

void tcp_rx_lowat(struct tcp_conn *c, uint64_t left)
{
    /* Two system calls per large payload at most: raise it while plenty is left, lower it only
     * when it would wait for bytes past the payload's end (which may never come). */
    if (left >= 2ull * TCP_RX_LOWAT_MAX)
        rx_set_lowat(c, (int)TCP_RX_LOWAT_MAX);
    else if ((uint64_t)c->rx_lowat > left)
        rx_set_lowat(c, 1);
}

int tcp_rx_need(struct tcp_conn *c, size_t need)
{
    while (c->rx_end - c->rx_start < need) {
        if (!c->can_recv || tcp_turn_room(c) == 0) {
            rx_set_lowat(c, 1); /* a frame header may be all that comes */
            return 0;
        }
        size_t staged = c->rx_end - c->rx_start;
        size_t want = need - staged + c->rx_lookahead;
        if (want > TCP_RX_STAGE - staged)
            want = TCP_RX_STAGE - staged;
        if (staged == 0) {
            c->rx_start = c->rx_end = 0;
        } else if (TCP_RX_STAGE - c->rx_end < want) {
            memmove(c->rx_stage, c->rx_stage + c->rx_start, staged);
            c->rx_end = staged;
            c->rx_start = 0;
        }
        ssize_t n = recv(c->fd, c->rx_stage + c->rx_end, want, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->can_recv = 0;
            rx_set_lowat(c, 1); /* a frame header may be all that comes */
            return 0;
        }
        if (n <= 0)
            return rx_failed(c, n, errno);
        c->rx_end += (size_t)n;
        tcp_conn_touch(c);
        tcp_turn_spend(c, (uint64_t)n);
        if ((size_t)n < want && !c->peer_closed)
            c->can_recv = 0; /* the socket is empty: no second recv() just to hear EAGAIN */
    }
    return 1;
}

const uint8_t *tcp_rx_peek(const struct tcp_conn *c)
{
    return c->rx_stage + c->rx_start;
}

void tcp_rx_consume(struct tcp_conn *c, size_t n)
{
    c->rx_start += n;
    if (c->rx_start == c->rx_end)
        c->rx_start = c->rx_end = 0;
}

int tcp_rx_empty(const struct tcp_conn *c)
{
    return c->rx_start == c->rx_end;
}

ssize_t tcp_rx_into(struct tcp_conn *c, uint8_t *dst, size_t len)
{
    if (len == 0)
        return 0;
    size_t staged = c->rx_end - c->rx_start;
    if (staged > 0) {
        size_t k = staged < len ? staged : len;
        memcpy(dst, c->rx_stage + c->rx_start, k);
        tcp_rx_consume(c, k);
        return (ssize_t)k;
    }
    uint64_t room = tcp_turn_room(c);
    if (!c->can_recv || room == 0)
        return 0;
    if (len > room)
        len = (size_t)room;
    /* The stage is empty: the bytes after this payload (the next frames) land there. */
    c->rx_start = c->rx_end = 0;
    struct iovec iov[2] = {{.iov_base = dst, .iov_len = len},
                           {.iov_base = c->rx_stage, .iov_len = c->rx_lookahead}};
    for (;;) {
        ssize_t n = readv(c->fd, iov, 2);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->can_recv = 0;
            return 0;
        }
        if (n <= 0)
            return rx_failed(c, n, errno);
        tcp_conn_touch(c);
        tcp_turn_spend(c, (uint64_t)n);
        if ((size_t)n < len + c->rx_lookahead && !c->peer_closed)
            c->can_recv = 0; /* the socket is empty */
        if ((size_t)n > len) {
            c->rx_end = (size_t)n - len;
            return (ssize_t)len;
        }
        return n;
    }
}

/* ---- sending --------------------------------------------------------------------------------- */

ssize_t tcp_send_iov(int fd, struct iovec *iov, int iovcnt)
{
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
    for (;;) {
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0)
            return n;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        int err = errno;
        return orb_fail(tcp_status_from_errno(err), "send failed: %s", strerror(err));
    }
}

int tcp_iov_clip(struct iovec *iov, int iovcnt, uint64_t limit)
{
    for (int i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len >= limit) {
            iov[i].iov_len = (size_t)limit;
            return limit == 0 ? i : i + 1;
        }
        limit -= iov[i].iov_len;
    }
    return iovcnt;
}

/* ---- sockets --------------------------------------------------------------------------------- */

void tcp_socket_tune(int fd, uint32_t bufsize)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (bufsize != 0) {
        int size = bufsize > INT32_MAX ? INT32_MAX : (int)bufsize;
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    }
}

int tcp_peer_on_this_host(int fd)
{
    struct sockaddr_storage peer, self;
    socklen_t peer_len = sizeof peer, self_len = sizeof self;
    if (getpeername(fd, (struct sockaddr *)&peer, &peer_len) != 0 ||
        getsockname(fd, (struct sockaddr *)&self, &self_len) != 0 || peer.ss_family != self.ss_family)
        return 0;
    if (peer.ss_family == AF_INET) {
        const struct in_addr *p = &((const struct sockaddr_in *)&peer)->sin_addr;
        const struct in_addr *s = &((const struct sockaddr_in *)&self)->sin_addr;
        return (ntohl(p->s_addr) >> 24) == 127 || p->s_addr == s->s_addr;
    }
    if (peer.ss_family == AF_INET6) {
        const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)&peer;
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&self;
        if (IN6_IS_ADDR_LOOPBACK(&p->sin6_addr) ||
            (IN6_IS_ADDR_V4MAPPED(&p->sin6_addr) && p->sin6_addr.s6_addr[12] == 127))
            return 1;
        return memcmp(&p->sin6_addr, &s->sin6_addr, sizeof p->sin6_addr) == 0 &&
               p->sin6_scope_id == s->sin6_scope_id;
    }
    return 0;
}

void tcp_format_addr(const void *sockaddr, char *buf, size_t len)
{
    const struct sockaddr *sa = sockaddr;
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = sockaddr;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
        snprintf(buf, len, "%s:%u", host, port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = sockaddr;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
        snprintf(buf, len, "[%s]:%u", host, port);
    } else {
        snprintf(buf, len, "?");
    }
}

/* Resolve `endpoint` into an address list (freeaddrinfo()). */
static int resolve(const char *endpoint, int passive, int err_status, struct addrinfo **out)
{
    char host[ORB_ENDPOINT_MAX];
    uint16_t port;
    int rc = orb_endpoint_split(endpoint, host, sizeof host, &port);
    if (rc != 0)
        return orb_fail_wrap(err_status, "endpoint '%s'", endpoint);
    char port_text[8];
    snprintf(port_text, sizeof port_text, "%u", (unsigned)port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    int gai = getaddrinfo(host[0] != '\0' ? host : NULL, port_text, &hints, out);
    if (gai != 0)
        return orb_fail(err_status, "cannot resolve '%s': %s", endpoint, gai_strerror(gai));
    return 0;
}

int tcp_listen(const char *endpoint, uint32_t bufsize, int *fd_out, char *bound, size_t bound_len)
{
    struct addrinfo *list;
    int rc = resolve(endpoint, 1, ORB_ECONFIG, &list);
    if (rc != 0)
        return rc;
    int err = 0;
    int fd = -1;
    for (struct addrinfo *ai = list; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bufsize != 0)
            tcp_socket_tune(fd, bufsize); /* accepted sockets inherit the buffer sizes */
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, TCP_LISTEN_BACKLOG) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(list);
    if (fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "cannot listen on %s: %s", endpoint, strerror(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        err = errno;
        close(fd);
        return orb_fail(ORB_EUNAVAILABLE, "getsockname on %s: %s", endpoint, strerror(err));
    }
    tcp_format_addr(&ss, bound, bound_len);
    *fd_out = fd;
    return 0;
}

/* Wait for `events` on `fd` until `deadline`. 1 ready, 0 deadline passed, negative status. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = orb_deadline_poll_ms(deadline);
        int n = poll(&p, 1, ms);
        if (n > 0)
            return 1;
        if (n == 0) {
            if (orb_deadline_poll_ms(deadline) == 0)
                return 0;
            continue;
        }
        if (errno != EINTR)
            return orb_fail(orb_status_from_errno(errno), "poll failed: %s", strerror(errno));
    }
}

/* Connect one address. 0, or a status (ORB_ETIMEDOUT when the deadline passed). */
static int dial_one(const struct addrinfo *ai, uint64_t deadline, uint32_t bufsize, int *fd_out,
                    int *err_out)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        *err_out = errno;
        return ORB_EPEER;
    }
    tcp_socket_tune(fd, bufsize);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            *err_out = errno;
            close(fd);
            return ORB_EPEER;
        }
        int ready = wait_fd(fd, POLLOUT, deadline);
        if (ready <= 0) {
            *err_out = ETIMEDOUT;
            close(fd);
            return ready == 0 ? ORB_ETIMEDOUT : ready;
        }
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
            soerr = errno;
        if (soerr != 0) {
            *err_out = soerr;
            close(fd);
            return ORB_EPEER;
        }
    }
    *fd_out = fd;
    return 0;
}

int tcp_dial(const char *endpoint, uint64_t deadline, uint32_t bufsize, int *fd_out, char *name,
             size_t name_len)
{
    struct addrinfo *list;
    int rc = resolve(endpoint, 0, ORB_EINVAL, &list);
    if (rc != 0)
        return rc;
    int err = ECONNREFUSED;
    rc = ORB_EPEER;
    int fd = -1;
    for (struct addrinfo *ai = list; ai != NULL; ai = ai->ai_next) {
        rc = dial_one(ai, deadline, bufsize, &fd, &err);
        if (rc == 0) {
            tcp_format_addr(ai->ai_addr, name, name_len);
            break;
        }
        if (rc == ORB_ETIMEDOUT)
            break;
    }
    freeaddrinfo(list);
    if (rc == ORB_ETIMEDOUT)
        return orb_fail(ORB_ETIMEDOUT, "connect to %s: deadline passed", endpoint);
    if (rc != 0)
        return orb_fail(ORB_EPEER, "cannot connect to %s: %s", endpoint, strerror(err));
    *fd_out = fd;
    return 0;
}

int tcp_send_all(int fd, const uint8_t *buf, size_t len, uint64_t deadline)
{
    size_t off = 0;
    while (off < len) {
        struct iovec iov = {.iov_base = (void *)(uintptr_t)(buf + off), .iov_len = len - off};
        ssize_t n = tcp_send_iov(fd, &iov, 1);
        if (n < 0)
            return (int)n;
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        int ready = wait_fd(fd, POLLOUT, deadline);
        if (ready == 0)
            return orb_fail(ORB_ETIMEDOUT, "send: deadline passed");
        if (ready < 0)
            return ready;
    }
    return 0;
}

int tcp_recv_all(int fd, uint8_t *buf, size_t len, uint64_t deadline)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = recv(fd, buf + off, len - off, 0);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n == 0)
            return orb_fail(ORB_EPEER, "connection closed by the other end");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return orb_fail(tcp_status_from_errno(errno), "recv failed: %s", strerror(errno));
        int ready = wait_fd(fd, POLLIN, deadline);
        if (ready == 0)
            return orb_fail(ORB_ETIMEDOUT, "recv: deadline passed");
        if (ready < 0)
            return ready;
    }
    return 0;
}
