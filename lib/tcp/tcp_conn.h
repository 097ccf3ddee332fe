/* Internal: socket helpers and the nonblocking receive/send primitives shared by the TCP
 * transport's source and requester connections.
 *
 * Receiving uses a small staging buffer for frame headers and bodies. Payload bytes are received
 * straight into their destination; only the few payload bytes that arrive in the same recv() as
 * the frame's header (at most TCP_RX_LOOKAHEAD) pass through the staging buffer. */
#ifndef ORB_TCP_CONN_H
#define ORB_TCP_CONN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "wire/wire.h"

/* Holds a header plus the largest body received through it (NOTIFY: 4 + ORB_NOTIFY_MAX). */
#define TCP_RX_STAGE 8192u
/* Bytes read beyond what the current frame needs, so that pipelined frames cost fewer recv()s. */
#define TCP_RX_LOOKAHEAD 256u
/* Longest "host:port" text, with brackets around an IPv6 address. */
#define TCP_NAME_MAX 80u

/* What an epoll event's data.ptr points at: the first member of every registered object. */
enum tcp_kind { TCP_KIND_WAKE = 1, TCP_KIND_LISTENER, TCP_KIND_SOURCE, TCP_KIND_REQUESTER };

struct tcp_worker;

/* The part of a connection that the owning worker drives. */
struct tcp_conn {
    enum tcp_kind kind;              /* first member: epoll data points here */
    int fd;                          /* -1 once closed */
    struct tcp_worker *worker;       /* owns the connection's I/O */
    struct tcp_conn *prev, *next;    /* the worker's list (worker thread only) */
    struct tcp_conn *inbox_next;     /* handover list (guarded by the worker's lock) */
    struct tcp_conn *poke_next;      /* the worker's poke list (guarded by the worker's lock) */
    int poked;                       /* on the poke list (guarded by the worker's lock) */
    struct tcp_conn *ready_next;     /* the worker's ready list (worker thread only) */
    int in_ready;                    /* on the ready list: more to do after its turn */
    int adopted;                     /* registered with the worker's epoll */
    int serve_on_adopt;              /* handed over with work staged: serve it once adopted */
    uint64_t *turn_left;             /* the worker's byte budget for the current turn */
    atomic_uint_fast64_t last_progress_ns;
    /* Worker thread only: */
    int can_recv;                    /* cleared on EAGAIN, set by EPOLLIN */
    size_t rx_start, rx_end;         /* unconsumed staged bytes */
    char name[TCP_NAME_MAX];         /* the other end, for logs */
    uint8_t rx_stage[TCP_RX_STAGE];
};

/* The status of a failed socket call on a connection: orb_status_from_errno(), except that
 * ETIMEDOUT (TCP gave up retransmitting) means the peer failed: ORB_EPEER. */
int tcp_status_from_errno(int err);

/* Initialise the shared part (fd adopted by the connection). */
void tcp_conn_init(struct tcp_conn *c, enum tcp_kind kind, int fd, const char *name);

/* Mark progress now (any byte moved). */
void tcp_conn_touch(struct tcp_conn *c);

/* Bytes the worker may still move for this connection in its current turn, and spending them.
 * A worker gives each connection a bounded turn so that one busy connection cannot starve the
 * others (or delay stop); the receive helpers below report "nothing now" when it is spent. */
uint64_t tcp_turn_room(const struct tcp_conn *c);
void tcp_turn_spend(struct tcp_conn *c, uint64_t n);

/* Ensure `need` (<= TCP_RX_STAGE) unconsumed bytes are staged. Returns 1 when they are, 0 when
 * the socket has no more for now (or the turn is spent), or a negative status (ORB_EPEER on EOF
 * or reset). */
int tcp_rx_need(struct tcp_conn *c, size_t need);

/* The unconsumed staged bytes, and consuming some of them. */
const uint8_t *tcp_rx_peek(const struct tcp_conn *c);
void tcp_rx_consume(struct tcp_conn *c, size_t n);

/* 1 when nothing is staged. */
int tcp_rx_empty(const struct tcp_conn *c);

/* Move up to `len` bytes into `dst`: staged bytes first, then straight from the socket. Returns
 * the bytes moved (0: nothing available now, or the turn is spent) or a negative status. */
ssize_t tcp_rx_into(struct tcp_conn *c, uint8_t *dst, size_t len);

/* sendmsg() of `iov`, never raising SIGPIPE. Returns bytes sent, 0 when the socket is full, or
 * a negative status. */
ssize_t tcp_send_iov(int fd, struct iovec *iov, int iovcnt);

/* Shorten `iov` so that it holds at most `limit` bytes; returns the new count. */
int tcp_iov_clip(struct iovec *iov, int iovcnt, uint64_t limit);

/* TCP_NODELAY and, when `bufsize` != 0, SO_SNDBUF/SO_RCVBUF. Best effort. */
void tcp_socket_tune(int fd, uint32_t bufsize);

/* "host:port" (IPv6 in brackets) of a socket address. */
void tcp_format_addr(const void *sockaddr, char *buf, size_t len);

/* Bind and listen on `endpoint` ("host:port"), nonblocking. Writes the bound address.
 * Errors: ORB_ECONFIG (endpoint), ORB_EUNAVAILABLE (cannot bind or listen). */
int tcp_listen(const char *endpoint, uint32_t bufsize, int *fd_out, char *bound, size_t bound_len);

/* Connect a nonblocking socket to `endpoint` before `deadline`. Writes the peer's name.
 * Errors: ORB_EINVAL (endpoint), ORB_EPEER (refused, unreachable), ORB_ETIMEDOUT. */
int tcp_dial(const char *endpoint, uint64_t deadline, uint32_t bufsize, int *fd_out, char *name,
             size_t name_len);

/* Move exactly `len` bytes on a nonblocking socket, waiting in poll() until `deadline`.
 * Errors: ORB_EPEER (EOF, reset), ORB_ETIMEDOUT. */
int tcp_send_all(int fd, const uint8_t *buf, size_t len, uint64_t deadline);
int tcp_recv_all(int fd, uint8_t *buf, size_t len, uint64_t deadline);

#endif
