/* Internal: socket helpers and the nonblocking receive/send primitives shared by the TCP
 * transport's source and requester connections.
 *
 * Receiving goes through a staging buffer, with a read-ahead that follows the traffic. While the
 * frames carry small payloads (up to TCP_RX_DIRECT_MIN), each recv() asks for as much as the
 * stage holds, so one system call brings in many frames and their payloads are copied out of the
 * stage. Once a frame carries a large payload, the read-ahead drops to TCP_RX_LOOKAHEAD, so that
 * payload bytes go straight from the socket into their destination and only the few that share a
 * recv() with the header are copied. A recv() that returns less than it asked for drained the
 * socket: the connection waits for the next (edge-triggered) event instead of asking again. */
#ifndef ORB_TCP_CONN_H
#define ORB_TCP_CONN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "wire/wire.h"

/* The staging buffer: at least a header plus the largest body received through it (NOTIFY:
 * 4 + ORB_NOTIFY_MAX), and room for many small frames per recv(). */
#define TCP_RX_STAGE (64u << 10)
/* The read-ahead beyond the current frame while payloads are large (they go direct). */
#define TCP_RX_LOOKAHEAD 256u
/* Payloads up to this size are received through the stage; larger ones straight into place. */
#define TCP_RX_DIRECT_MIN (16u << 10)
/* A receive of a large payload sets SO_RCVLOWAT to what is left of it, up to this much, so that
 * the worker wakes once per this many bytes rather than once per segment. */
#define TCP_RX_LOWAT_MAX (256u << 10)
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
    int can_recv;                    /* cleared on EAGAIN or a short read, set by EPOLLIN */
    int peer_closed;                 /* an event said the other end closed (EPOLLRDHUP, HUP,
                                      * ERR): read on to the end, a short read proves nothing */
    size_t rx_start, rx_end;         /* unconsumed staged bytes */
    size_t rx_lookahead;             /* bytes a recv() asks for beyond the current need */
    int rx_lowat;                    /* SO_RCVLOWAT as last set (1: the kernel's default) */
    char name[TCP_NAME_MAX];         /* the other end, for logs */
    uint8_t rx_stage[TCP_RX_STAGE];
};

/* The status of a failed socket call on a connection: orb_status_from_errno(), except that
 * ETIMEDOUT (TCP gave up retransmitting) means the peer failed: ORB_EPEER. */
int tcp_status_from_errno(int err);

/* Record what an epoll event says about receiving. */
void tcp_conn_rx_event(struct tcp_conn *c, uint32_t events);

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

/* Tell the receive side the payload size of the frame just decoded: it picks the read-ahead
 * for the frames that follow (small payloads: batch them through the stage; large ones: let
 * them go direct). */
void tcp_rx_note_payload(struct tcp_conn *c, uint64_t len);

/* Before receiving `left` more bytes of a payload straight into place: raise SO_RCVLOWAT while
 * much is left, so that the socket wakes the worker in bigger steps, and lower it before it could
 * wait for bytes beyond the payload. tcp_rx_need() puts the default back before it waits for a
 * frame. Best effort, and no system call when nothing changes. */
void tcp_rx_lowat(struct tcp_conn *c, uint64_t left);

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

/* 1 when the other end of connected socket `fd` is on this host: a loopback address, or this
 * end's own address (a connection to an address of this host gets that address as its source).
 * 0 otherwise, and when either address cannot be read. */
int tcp_peer_on_this_host(int fd);

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
