/* The TCP requester: peers (one CONTROL and `tcp_stripes` DATA connections to one source epoch),
 * per-connection xfer queues, and the response state machine.
 *
 * Each connection keeps one FIFO of xfers, split in three by two pointers:
 *   head .. last_sent        fully sent, awaiting their responses (which come back in order)
 *   send_next (send_off)     partly sent, or the next to send
 *   .. tail                  not sent yet
 * The queue is guarded by the connection's lock. Sending has one owner at a time (tx_busy): a
 * submitting thread that finds the connection idle sends directly (no worker wake-up) up to
 * TCP_DIRECT_SEND_BYTES; the worker continues on EPOLLOUT, or on a kick when the submitter's
 * budget ran out first. The owner drops the lock around orb_xfer_may_start() and sendmsg(), so
 * submitters can append meanwhile. Receiving runs on the worker only: it takes the answered xfer
 * off the head under the lock, then moves a READ's payload straight into the xfer's local bytes without the
 * lock. Completions (orb_xfer_done) are always reported with no connection lock held.
 *
 * A worker never waits for an application thread. When a response arrives for a frame that a
 * submitting thread has sent but not yet accounted for, or a teardown finds a submitter inside
 * sendmsg(), the worker leaves the work where it is and the submitter pokes it (tcp_worker_poke)
 * as soon as it has accounted for its bytes or let go of the socket. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stager.h"
#include "tcp_internal.h"

enum req_rx_state {
    RRX_HEADER,  /* waiting for a frame header */
    RRX_BODY,    /* waiting for a body that fits the staging buffer */
    RRX_BIGBODY, /* receiving a DESCRIBE_RESP body into rx_big */
    RRX_PAYLOAD  /* receiving a READ_RESP payload into rx_xfer->local */
};

struct tcp_peer;

struct tcp_req_conn {
    struct tcp_conn base;             /* first member */
    struct tcp_peer *peer;

    pthread_mutex_t lock;
    pthread_cond_t cond;              /* the sender advanced or let go */
    /* Guarded by lock: */
    struct orb_xfer *head, *last_sent, *send_next, *tail;
    uint64_t send_off;                /* bytes of send_next's frame on the wire */
    uint64_t next_tag;                /* requests carry non-zero tags */
    int can_send;                     /* cleared on EAGAIN, set by EPOLLOUT */
    int tx_busy;                      /* a thread is sending (lock dropped) */
    int tx_again;                     /* someone asked the busy sender to look again */
    int rx_deferred;                  /* the worker left a response staged until the sender
                                       * accounts for what it sent; the sender pokes it */
    int kill_status;                  /* non-zero: tear down once the sender lets go */
    int closed;                       /* torn down: no more submissions */
    int close_status;                 /* what later submissions get */
    int send_error;                   /* a send failed; the worker tears down */
    atomic_uint_fast64_t queued_bytes;/* READ/WRITE bytes queued (for stripe choice) */

    /* The sender only: encoded frame prefixes of one sendmsg(). */
    uint8_t prefix[TCP_TX_BATCH][TCP_PREFIX_MAX];

    /* The worker only: */
    enum req_rx_state rx_state;
    struct orb_wire_header rx_hdr;
    struct orb_xfer *rx_xfer;         /* answered, being finished (owned here) */
    enum orb_remote_effect rx_effect; /* if rx_xfer fails now */
    uint64_t rx_off;
    uint8_t *rx_big;
};

struct tcp_peer {
    struct tcp_transport *tp;         /* referenced */
    atomic_uint_fast64_t refs;        /* the core + one per connection a worker owns */
    atomic_int dead;                  /* 0, or the status that killed a connection: no more
                                       * submissions (ORB_EPEER only when the peer failed) */
    atomic_int released;              /* the core let go */
    uint32_t nstripes;                /* the transport's count for a peer on this host or not */
    uint64_t stripe_threshold;
    uint64_t max_payload;             /* min(ours, the source's HELLO_OK) */
    char endpoint[ORB_ENDPOINT_MAX];
    uint32_t nconns;
    struct tcp_req_conn conns[];      /* [0] CONTROL, [1 + i] DATA stripe i */
};

/* A DESCRIBE or CONTROL in the control queue; the waiting caller and the connection each hold a
 * reference. */
struct tcp_call_op {
    struct orb_xfer x;                /* op TCP_OP_DESCRIBE or TCP_OP_CONTROL */
    pthread_mutex_t lock;
    pthread_cond_t cond;              /* CLOCK_MONOTONIC */
    int refs;
    int done;
    int status;
    struct orb_region_desc *regions;  /* DESCRIBE: owned until handed to the caller */
    size_t count;
    uint8_t transport;                /* CONTROL: the transport it is for */
    uint8_t req[4 + ORB_WIRE_MAX_CONTROL];  /* CONTROL: the body sent (transport, 0, 0, bytes) */
    uint8_t resp[ORB_WIRE_MAX_CONTROL]; /* CONTROL: the answer's bytes */
    size_t resp_len;
    char text[ORB_WIRE_MAX_ERROR_TEXT + 1];
};

/* ---- frames ---------------------------------------------------------------------------------- */

/* While queued, x->tag is the request's wire tag plus this bit once orb_xfer_may_start() said
 * yes, so that it is asked exactly once even if the frame waits for another sendmsg(). */
#define TAG_STARTED (1ull << 63)

static uint64_t wire_tag(const struct orb_xfer *x)
{
    return x->tag & ~TAG_STARTED;
}

static size_t frame_prefix_len(const struct orb_xfer *x)
{
    switch (x->op) {
    case ORB_XFER_READ:
    case ORB_XFER_WRITE: return ORB_WIRE_HEADER_LEN + 32u;
    case ORB_XFER_NOTIFY: return ORB_WIRE_HEADER_LEN + 4u;
    default: return ORB_WIRE_HEADER_LEN; /* DESCRIBE_REQ; CONTROL_REQ (its body is the payload) */
    }
}

static uint64_t frame_payload_len(const struct orb_xfer *x)
{
    return x->op == ORB_XFER_WRITE || x->op == ORB_XFER_NOTIFY || x->op == TCP_OP_CONTROL ? x->length : 0;
}

static uint64_t frame_len(const struct orb_xfer *x)
{
    return frame_prefix_len(x) + frame_payload_len(x);
}

/* Encode the frame's header and fixed body (the payload follows from the local bytes). Arguments were
 * checked at submission, so this cannot fail. */
static void frame_prefix(const struct orb_xfer *x, uint8_t out[TCP_PREFIX_MAX])
{
    size_t len = 0;
    if (x->op == ORB_XFER_READ || x->op == ORB_XFER_WRITE) {
        struct orb_wire_xfer m = {.addr = x->remote_addr, .length = x->length,
                                  .request_addr = x->request_remote_addr,
                                  .request_length = x->request_length};
        (void)orb_wire_xfer_encode(x->op == ORB_XFER_READ ? ORB_WIRE_READ_REQ : ORB_WIRE_WRITE_REQ,
                                   wire_tag(x), &m, out, TCP_PREFIX_MAX, &len);
    } else if (x->op == ORB_XFER_NOTIFY) {
        struct orb_wire_header h = {.type = ORB_WIRE_NOTIFY, .body_len = 4u + (uint32_t)x->length,
                                    .tag = wire_tag(x)};
        orb_wire_header_encode(&h, out);
        struct orb_writer w;
        orb_writer_init(&w, out + ORB_WIRE_HEADER_LEN, 4);
        orb_writer_u32(&w, (uint32_t)x->length);
    } else if (x->op == TCP_OP_CONTROL) {
        struct orb_wire_header h = {.type = ORB_WIRE_CONTROL_REQ, .body_len = (uint32_t)x->length,
                                    .tag = wire_tag(x)};
        orb_wire_header_encode(&h, out);
    } else {
        (void)orb_wire_describe_req_encode(wire_tag(x), out, TCP_PREFIX_MAX, &len);
    }
}

/* After the queue lets go of `x`: remember how it ends (the tag is ours to reuse). */
static void xfer_mark(struct orb_xfer *x, int status, enum orb_remote_effect effect)
{
    x->tag = (uint64_t)(uint32_t)status | (uint64_t)effect << 32;
}

static int mark_status(const struct orb_xfer *x)
{
    return (int)(int32_t)(uint32_t)x->tag;
}

static enum orb_remote_effect mark_effect(const struct orb_xfer *x)
{
    return (enum orb_remote_effect)(x->tag >> 32);
}

/* ---- completion ------------------------------------------------------------------------------ */

static void call_put(struct tcp_call_op *op)
{
    pthread_mutex_lock(&op->lock);
    int last = --op->refs == 0;
    pthread_mutex_unlock(&op->lock);
    if (!last)
        return;
    free(op->regions);
    pthread_cond_destroy(&op->cond);
    pthread_mutex_destroy(&op->lock);
    free(op);
}

static void describe_finish(struct tcp_call_op *op, int status, struct orb_region_desc *regions,
                            size_t count, const char *text)
{
    pthread_mutex_lock(&op->lock);
    op->done = 1;
    op->status = status;
    op->regions = regions;
    op->count = count;
    snprintf(op->text, sizeof op->text, "%s", text);
    pthread_cond_broadcast(&op->cond);
    pthread_mutex_unlock(&op->lock);
    call_put(op);
}

/* End `x` for good. Never called with a connection lock held. */
static void req_complete(struct tcp_transport *tp, struct orb_xfer *x, int status,
                         enum orb_remote_effect effect, const char *text)
{
    if (TCP_OP_IS_CALL(x->op)) {
        describe_finish(TCP_CONTAINER_OF(x, struct tcp_call_op, x), status, NULL, 0,
                        text ? text : orb_strerror(status));
        return;
    }
    if (text != NULL) {
        char why[320];
        snprintf(why, sizeof why, "the source answered: %.280s", text);
        orb_xfer_done_why(x, status, effect, why);
    } else {
        orb_xfer_done(x, status, effect);
    }
    atomic_fetch_sub(&tp->inflight_xfers, 1);
}

static void req_complete_list(struct tcp_transport *tp, struct orb_xfer *list)
{
    while (list != NULL) {
        struct orb_xfer *next = list->next;
        list->next = NULL;
        req_complete(tp, list, mark_status(list), mark_effect(list), NULL);
        list = next;
    }
}

/* ---- sending --------------------------------------------------------------------------------- */

static void queued_sub(struct tcp_req_conn *c, const struct orb_xfer *x)
{
    if (x->op == ORB_XFER_READ || x->op == ORB_XFER_WRITE)
        atomic_fetch_sub_explicit(&c->queued_bytes, x->length, memory_order_relaxed);
}

/* Take the withdrawn candidates (keep[i] == 0) out of the unsent part of the queue onto
 * *withdrawn, ending with ORB_ETIMEDOUT. Lock held. */
static void req_unlink_withdrawn(struct tcp_req_conn *c, struct orb_xfer *const *cand,
                                 const uint8_t *keep, size_t ncand, struct orb_xfer **withdrawn)
{
    struct orb_xfer *prev = c->last_sent; /* cand[0]'s predecessor (NULL: it is the head) */
    for (size_t i = 0; i < ncand; i++) {
        struct orb_xfer *x = cand[i];
        if (keep[i]) {
            prev = x;
            continue;
        }
        if (prev != NULL)
            prev->next = x->next;
        else
            c->head = x->next;
        if (c->send_next == x)
            c->send_next = x->next;
        if (c->tail == x)
            c->tail = prev;
        queued_sub(c, x);
        xfer_mark(x, ORB_ETIMEDOUT, ORB_REMOTE_EFFECT_NONE);
        x->next = *withdrawn;
        *withdrawn = x;
    }
}

/* Account `n` bytes sent from send_next on. Lock held. */
static void req_advance(struct tcp_req_conn *c, uint64_t n)
{
    while (n > 0 && c->send_next != NULL) {
        struct orb_xfer *x = c->send_next;
        uint64_t left = frame_len(x) - c->send_off;
        uint64_t take = n < left ? n : left;
        c->send_off += take;
        n -= take;
        if (take == left) {
            c->last_sent = x;
            c->send_next = x->next;
            c->send_off = 0;
        }
    }
}

/* Hand the connection back to its worker, which left something for this sender (lock held). */
static void req_poke_worker(struct tcp_req_conn *c)
{
    c->rx_deferred = 0;
    if (c->base.worker != NULL)
        tcp_worker_poke(c->base.worker, &c->base);
}

/* Send queued frames until the socket is full, nothing is left or `*budget` bytes went out.
 * Called and returns with the lock held; withdrawn xfers are put on *withdrawn for the caller
 * to complete unlocked. Returns 1 when frames are left that the socket would take now. */
static int req_tx_locked(struct tcp_req_conn *c, struct orb_xfer **withdrawn, uint64_t *budget)
{
    if (c->tx_busy) {
        c->tx_again = 1;
        return 0;
    }
    c->tx_busy = 1;
    for (;;) {
        c->tx_again = 0;
        if (c->closed || c->send_error != 0 || !c->can_send || c->send_next == NULL ||
            *budget == 0)
            break;
        struct orb_xfer *cand[TCP_TX_BATCH];
        size_t ncand = 0;
        for (struct orb_xfer *x = c->send_next; x != NULL && ncand < TCP_TX_BATCH; x = x->next)
            cand[ncand++] = x;
        uint64_t first_off = c->send_off;
        pthread_mutex_unlock(&c->lock);

        /* A frame not started yet may still be withdrawn by its batch. Only the sender touches
         * the unsent frames' tags; the receiver reads tags of sent frames, under the lock. */
        uint8_t keep[TCP_TX_BATCH];
        int any_withdrawn = 0;
        for (size_t i = 0; i < ncand; i++) {
            keep[i] = 1;
            if ((cand[i]->tag & TAG_STARTED) || TCP_OP_IS_CALL(cand[i]->op))
                continue;
            if (orb_xfer_may_start(cand[i])) {
                cand[i]->tag |= TAG_STARTED;
            } else {
                keep[i] = 0;
                any_withdrawn = 1;
            }
        }
        if (any_withdrawn) {
            pthread_mutex_lock(&c->lock);
            req_unlink_withdrawn(c, cand, keep, ncand, withdrawn);
            pthread_mutex_unlock(&c->lock);
        }

        struct iovec iov[2 * TCP_TX_BATCH];
        int niov = 0;
        for (size_t i = 0; i < ncand; i++) {
            if (!keep[i])
                continue;
            struct orb_xfer *x = cand[i];
            uint64_t skip = i == 0 ? first_off : 0;
            size_t plen = frame_prefix_len(x);
            frame_prefix(x, c->prefix[i]);
            if (skip < plen) {
                iov[niov].iov_base = c->prefix[i] + skip;
                iov[niov].iov_len = plen - skip;
                niov++;
                skip = 0;
            } else {
                skip -= plen;
            }
            uint64_t payload = frame_payload_len(x);
            if (payload > skip) {
                iov[niov].iov_base = orb_xfer_local_cpu(x) + skip;
                iov[niov].iov_len = payload - skip;
                niov++;
            }
        }
        niov = tcp_iov_clip(iov, niov, *budget);
        ssize_t sent = niov > 0 ? tcp_send_iov(c->base.fd, iov, niov) : 0;

        pthread_mutex_lock(&c->lock);
        if (niov == 0)
            continue; /* everything gathered was withdrawn */
        if (sent < 0) {
            ORB_LOGW("tcp: send to %s failed: %s", c->base.name, orb_last_error());
            c->send_error = (int)sent;
            break;
        }
        if (sent == 0) {
            if (c->tx_again)
                continue; /* EPOLLOUT arrived while the lock was dropped */
            c->can_send = 0;
            break;
        }
        tcp_conn_touch(&c->base);
        *budget = (uint64_t)sent < *budget ? *budget - (uint64_t)sent : 0;
        req_advance(c, (uint64_t)sent);
        if (c->rx_deferred && c->last_sent != NULL)
            req_poke_worker(c);
    }
    c->tx_busy = 0;
    pthread_cond_broadcast(&c->cond); /* a stopping worker may wait for this (only then) */
    if (c->rx_deferred || c->kill_status != 0)
        req_poke_worker(c);
    return *budget == 0 && c->can_send && c->send_next != NULL && !c->closed &&
           c->send_error == 0;
}

/* Append the chain first..last to `c` and start sending. ORB_ECLOSED / ORB_EPEER when the
 * connection is gone (nothing appended). */
static int req_enqueue(struct tcp_req_conn *c, struct orb_xfer *first, struct orb_xfer *last,
                       uint64_t bytes)
{
    struct orb_xfer *withdrawn = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->closed || c->send_error != 0) {
        int rc = c->closed ? c->close_status : ORB_EPEER;
        pthread_mutex_unlock(&c->lock);
        return orb_fail(rc, "the connection to %s is %s", c->peer->endpoint,
                        rc == ORB_ECLOSED ? "closed" : rc == ORB_EPEER ? "lost" : "broken");
    }
    for (struct orb_xfer *x = first; x != NULL; x = x->next)
        x->tag = c->next_tag++;
    if (c->tail != NULL) {
        c->tail->next = first;
    } else {
        c->head = first;
        tcp_conn_touch(&c->base); /* the no-progress clock starts with the work */
    }
    c->tail = last;
    if (c->send_next == NULL) {
        c->send_next = first;
        c->send_off = 0;
    }
    atomic_fetch_add_explicit(&c->queued_bytes, bytes, memory_order_relaxed);
    /* Send from this thread while the connection takes it: no worker wake-up on the way out.
     * Past the budget the worker continues (the socket being writable, no EPOLLOUT will come). */
    uint64_t budget = TCP_DIRECT_SEND_BYTES;
    int more = req_tx_locked(c, &withdrawn, &budget);
    int failed = c->send_error != 0;
    pthread_mutex_unlock(&c->lock);
    if (failed || more)
        tcp_worker_kick(c->base.worker);
    req_complete_list(c->peer->tp, withdrawn);
    return 0;
}

/* ---- teardown -------------------------------------------------------------------------------- */

static void peer_unref(struct tcp_peer *p)
{
    if (atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    struct tcp_transport *tp = p->tp;
    for (uint32_t i = 0; i < p->nconns; i++) {
        struct tcp_req_conn *c = &p->conns[i];
        if (c->base.fd >= 0)
            close(c->base.fd);
        free(c->rx_big);
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->lock);
    }
    free(p);
    tcp_transport_unref(tp);
}

void tcp_req_conn_kill(struct tcp_req_conn *c, int status)
{
    struct tcp_peer *p = c->peer;
    struct tcp_transport *tp = p->tp;
    if (status == 0) {
        status = ORB_ECLOSED; /* an orderly close has nothing left to fail */
    } else if (status != ORB_ECLOSED) {
        int none = 0; /* before anyone hears of the failure; the first cause stays */
        atomic_compare_exchange_strong(&p->dead, &none, status);
    }

    pthread_mutex_lock(&c->lock);
    if (c->kill_status != 0)
        status = c->kill_status; /* a deferred teardown keeps its first cause */
    c->closed = 1;
    c->close_status = status;
    if (c->tx_busy && !atomic_load(&tp->stopping)) {
        /* An application thread is inside sendmsg() on this socket: closing the descriptor now
         * could give its number to another file under that call. The worker does not wait for
         * it: shut the socket down (the send fails at once), and finish when the sender lets go
         * and pokes this worker. */
        c->kill_status = status;
        (void)shutdown(c->base.fd, SHUT_RDWR);
        pthread_mutex_unlock(&c->lock);
        return;
    }
    /* Only while the transport stops: the sender's sendmsg() never blocks (MSG_DONTWAIT). */
    while (c->tx_busy)
        pthread_cond_wait(&c->cond, &c->lock);
    c->kill_status = 0;
    /* A WRITE whose payload reached the socket without an answer may have changed peer bytes. */
    struct orb_xfer *list = c->head;
    int sent = c->last_sent != NULL;
    for (struct orb_xfer *x = list; x != NULL; x = x->next) {
        enum orb_remote_effect effect = ORB_REMOTE_EFFECT_NONE;
        if (x->op == ORB_XFER_WRITE &&
            (sent || (x == c->send_next && c->send_off > frame_prefix_len(x))))
            effect = ORB_REMOTE_EFFECT_UNKNOWN;
        if (x == c->last_sent)
            sent = 0;
        xfer_mark(x, status, effect);
    }
    c->head = c->last_sent = c->send_next = c->tail = NULL;
    c->send_off = 0;
    atomic_store(&c->queued_bytes, 0);
    if (c->base.worker != NULL)
        tcp_worker_forget(c->base.worker, &c->base);
    if (c->base.fd >= 0)
        close(c->base.fd);
    c->base.fd = -1;
    pthread_mutex_unlock(&c->lock);

    if (c->rx_xfer != NULL) {
        struct orb_xfer *x = c->rx_xfer;
        c->rx_xfer = NULL;
        req_complete(tp, x, status, c->rx_effect, NULL);
    }
    free(c->rx_big);
    c->rx_big = NULL;
    c->rx_state = RRX_HEADER;
    req_complete_list(tp, list);
    peer_unref(p); /* may free `c` */
}

/* Log and tear down after a failure. The status keeps its meaning: ORB_EPEER when the peer (or
 * the network) failed, ORB_EPROTO when it broke the protocol, ORB_ENOMEM or ORB_EUNAVAILABLE when
 * this side could not go on; only ORB_EPEER makes the engine ask whether the peer restarted. */
static void req_conn_fail(struct tcp_req_conn *c, int status)
{
    if (status >= 0 || status == ORB_EAGAIN || status == ORB_ECLOSED)
        status = ORB_EPEER;
    if (!atomic_load(&c->peer->released))
        ORB_LOGW("tcp: connection to %s lost: %s", c->base.name, orb_last_error());
    tcp_req_conn_kill(c, status);
}

static int req_violation(struct tcp_req_conn *c, const char *what, const char *detail)
{
    orb_fail(ORB_EPROTO, "%s from %s%s%s", what, c->base.name, detail[0] ? ": " : "", detail);
    return ORB_EPROTO;
}

/* ---- receiving ------------------------------------------------------------------------------- */

/* Take the oldest request off the queue if it carries `tag`. NULL on a mismatch, or with
 * *deferred set when the answer may be for a frame that a sending application thread has put on
 * the wire but not accounted for yet: the worker never waits for that thread; it leaves the
 * response staged, and the sender pokes it once it has accounted (or let go). */
static struct orb_xfer *req_pop(struct tcp_req_conn *c, uint64_t tag, int *deferred)
{
    pthread_mutex_lock(&c->lock);
    *deferred = 0;
    if (c->last_sent == NULL && c->tx_busy) {
        c->rx_deferred = 1;
        *deferred = 1;
        pthread_mutex_unlock(&c->lock);
        return NULL;
    }
    struct orb_xfer *x = NULL;
    if (c->last_sent != NULL && wire_tag(c->head) == tag) {
        x = c->head;
        c->head = x->next;
        if (c->last_sent == x)
            c->last_sent = NULL;
        if (c->head == NULL)
            c->tail = NULL;
        x->next = NULL;
        queued_sub(c, x);
    }
    pthread_mutex_unlock(&c->lock);
    return x;
}

static uint8_t expected_response(const struct orb_xfer *x)
{
    switch (x->op) {
    case ORB_XFER_READ: return ORB_WIRE_READ_RESP;
    case ORB_XFER_WRITE: return ORB_WIRE_WRITE_RESP;
    case ORB_XFER_NOTIFY: return ORB_WIRE_NOTIFY_RESP;
    case TCP_OP_CONTROL: return ORB_WIRE_CONTROL_RESP;
    default: return ORB_WIRE_DESCRIBE_RESP;
    }
}

/* Act on a complete response body. 0, 1 when deferred (the body must stay where it is; the
 * state is unchanged), or a negative status (the connection dies). */
static int req_on_response(struct tcp_req_conn *c, const uint8_t *body, size_t len)
{
    struct tcp_transport *tp = c->peer->tp;
    const struct orb_wire_header *h = &c->rx_hdr;
    enum req_rx_state was = c->rx_state;
    c->rx_state = RRX_HEADER;

    if (h->type == ORB_WIRE_ERROR && h->tag == 0) {
        struct orb_wire_error e;
        if (orb_wire_error_decode(body, len, &e) != 0)
            return req_violation(c, "malformed ERROR", orb_last_error());
        return orb_fail(ORB_EPEER, "%s closed the connection: %s (%s)", c->base.name, e.text,
                        orb_strerror(e.status));
    }
    int deferred;
    struct orb_xfer *x = req_pop(c, h->tag, &deferred);
    if (deferred) {
        c->rx_state = was;
        return 1;
    }
    if (x == NULL) {
        char detail[96];
        snprintf(detail, sizeof detail, "%s with tag %llu", orb_wire_type_name(h->type),
                 (unsigned long long)h->tag);
        return req_violation(c, "response that answers no pending request", detail);
    }
    /* Held here so that a failure below still completes it. */
    c->rx_xfer = x;
    c->rx_effect = x->op == ORB_XFER_WRITE ? ORB_REMOTE_EFFECT_UNKNOWN : ORB_REMOTE_EFFECT_NONE;

    if (h->type == ORB_WIRE_ERROR) {
        struct orb_wire_error e;
        if (orb_wire_error_decode(body, len, &e) != 0)
            return req_violation(c, "malformed ERROR", orb_last_error());
        ORB_LOGD("tcp: %s refused tag %llu: %s", c->base.name, (unsigned long long)h->tag, e.text);
        c->rx_xfer = NULL;
        req_complete(tp, x, e.status, e.effect_unknown ? ORB_REMOTE_EFFECT_UNKNOWN : ORB_REMOTE_EFFECT_NONE, e.text);
        return 0;
    }
    if (h->type != expected_response(x)) {
        char detail[96];
        snprintf(detail, sizeof detail, "%s with tag %llu", orb_wire_type_name(h->type),
                 (unsigned long long)h->tag);
        return req_violation(c, "wrong response type", detail);
    }
    switch (h->type) {
    case ORB_WIRE_READ_RESP: {
        struct orb_wire_xfer m;
        if (orb_wire_xfer_decode(ORB_WIRE_READ_RESP, body, len, &m) != 0)
            return req_violation(c, "malformed READ_RESP", orb_last_error());
        if (m.addr != x->remote_addr || m.length != x->length)
            return req_violation(c, "READ_RESP for another range", "");
        tcp_rx_note_payload(&c->base, m.length);
        c->rx_off = 0;
        c->rx_state = RRX_PAYLOAD;
        return 0;
    }
    case ORB_WIRE_DESCRIBE_RESP: {
        struct orb_region_desc *regions = NULL;
        size_t count = 0;
        if (orb_wire_describe_resp_decode(body, len, &regions, &count) != 0)
            return req_violation(c, "malformed DESCRIBE_RESP", orb_last_error());
        c->rx_xfer = NULL;
        describe_finish(TCP_CONTAINER_OF(x, struct tcp_call_op, x), 0, regions, count, "");
        return 0;
    }
    case ORB_WIRE_CONTROL_RESP: {
        struct orb_wire_control m;
        struct tcp_call_op *op = TCP_CONTAINER_OF(x, struct tcp_call_op, x);
        if (orb_wire_control_decode(body, len, &m) != 0)
            return req_violation(c, "malformed CONTROL_RESP", orb_last_error());
        if (m.transport != op->transport)
            return req_violation(c, "CONTROL_RESP from another transport", "");
        c->rx_xfer = NULL;
        pthread_mutex_lock(&op->lock);
        memcpy(op->resp, m.data, m.length); /* m.length <= ORB_WIRE_MAX_CONTROL */
        op->resp_len = m.length;
        pthread_mutex_unlock(&op->lock);
        describe_finish(op, 0, NULL, 0, "");
        return 0;
    }
    default: /* WRITE_RESP, NOTIFY_RESP */
        tcp_rx_note_payload(&c->base, 0);
        c->rx_xfer = NULL;
        req_complete(tp, x, 0, ORB_REMOTE_EFFECT_NONE, NULL);
        return 0;
    }
}

/* Receive and act until the socket is drained. 0 or a negative status (the connection dies). */
static int req_rx(struct tcp_req_conn *c)
{
    for (;;) {
        int rc;
        ssize_t n;
        switch (c->rx_state) {
        case RRX_HEADER:
            rc = tcp_rx_need(&c->base, ORB_WIRE_HEADER_LEN);
            if (rc <= 0)
                return rc;
            if (orb_wire_header_decode(tcp_rx_peek(&c->base), &c->rx_hdr) != 0)
                return req_violation(c, "bad frame header", orb_last_error());
            tcp_rx_consume(&c->base, ORB_WIRE_HEADER_LEN);
            switch (c->rx_hdr.type) {
            case ORB_WIRE_ERROR:
            case ORB_WIRE_DESCRIBE_RESP:
            case ORB_WIRE_CONTROL_RESP:
            case ORB_WIRE_READ_RESP:
            case ORB_WIRE_WRITE_RESP:
            case ORB_WIRE_NOTIFY_RESP: break;
            default: return req_violation(c, "unexpected frame", orb_wire_type_name(c->rx_hdr.type));
            }
            if (c->rx_hdr.body_len <= TCP_RX_STAGE - TCP_RX_LOOKAHEAD) {
                c->rx_state = RRX_BODY;
                break;
            }
            c->rx_big = malloc(c->rx_hdr.body_len);
            if (c->rx_big == NULL)
                return orb_fail(ORB_ENOMEM, "no memory for a %u-byte response body",
                                (unsigned)c->rx_hdr.body_len);
            c->rx_off = 0;
            c->rx_state = RRX_BIGBODY;
            break;
        case RRX_BODY: {
            rc = tcp_rx_need(&c->base, c->rx_hdr.body_len);
            if (rc <= 0)
                return rc;
            rc = req_on_response(c, tcp_rx_peek(&c->base), c->rx_hdr.body_len);
            if (rc == 1)
                return 0; /* deferred: the body stays staged until the sender pokes */
            tcp_rx_consume(&c->base, c->rx_hdr.body_len);
            if (rc < 0)
                return rc;
            break;
        }
        case RRX_BIGBODY:
            while (c->rx_off < c->rx_hdr.body_len) {
                n = tcp_rx_into(&c->base, c->rx_big + c->rx_off, c->rx_hdr.body_len - c->rx_off);
                if (n <= 0)
                    return (int)n;
                c->rx_off += (uint64_t)n;
            }
            rc = req_on_response(c, c->rx_big, c->rx_hdr.body_len);
            if (rc == 1)
                return 0; /* deferred: rx_big stays whole until the sender pokes */
            free(c->rx_big);
            c->rx_big = NULL;
            if (rc < 0)
                return rc;
            break;
        case RRX_PAYLOAD: {
            struct orb_xfer *x = c->rx_xfer;
            while (c->rx_off < x->length) {
                if (tcp_rx_empty(&c->base))
                    tcp_rx_lowat(&c->base, x->length - c->rx_off);
                n = tcp_rx_into(&c->base, orb_xfer_local_cpu(x) + c->rx_off, x->length - c->rx_off);
                if (n <= 0)
                    return (int)n;
                c->rx_off += (uint64_t)n;
            }
            c->rx_xfer = NULL;
            c->rx_state = RRX_HEADER;
            req_complete(c->peer->tp, x, 0, ORB_REMOTE_EFFECT_NONE, NULL);
            break;
        }
        }
    }
}

/* Worker-side housekeeping after I/O. Returns 1 when `c` was torn down (do not touch it). */
static int req_conn_check(struct tcp_req_conn *c)
{
    pthread_mutex_lock(&c->lock);
    int send_error = c->send_error;
    int idle = c->head == NULL && !c->tx_busy;
    pthread_mutex_unlock(&c->lock);
    if (send_error != 0) {
        orb_fail(send_error, "a send to %s failed (%s)", c->base.name, orb_strerror(send_error));
        req_conn_fail(c, send_error);
        return 1;
    }
    if (atomic_load(&c->peer->released)) {
        int dead = atomic_load(&c->peer->dead);
        if (dead != 0) {
            tcp_req_conn_kill(c, dead);
            return 1;
        }
        if (idle && c->rx_xfer == NULL && c->rx_state == RRX_HEADER) {
            tcp_req_conn_kill(c, 0);
            return 1;
        }
    }
    return 0;
}

/* Send what is queued, within the worker's turn. Returns 1 when more could go now. */
static int req_worker_tx(struct tcp_req_conn *c, int writable)
{
    struct orb_xfer *withdrawn = NULL;
    pthread_mutex_lock(&c->lock);
    if (writable)
        c->can_send = 1;
    int more = req_tx_locked(c, &withdrawn, c->base.turn_left);
    pthread_mutex_unlock(&c->lock);
    req_complete_list(c->peer->tp, withdrawn);
    return more;
}

/* A teardown left for the sender to let go of the socket: finish it once it has. Returns 1
 * when the connection is being torn down (do not use it any more). */
static int req_kill_pending(struct tcp_req_conn *c)
{
    pthread_mutex_lock(&c->lock);
    int status = c->kill_status;
    int busy = c->tx_busy;
    pthread_mutex_unlock(&c->lock);
    if (status == 0)
        return 0;
    if (!busy)
        tcp_req_conn_kill(c, status);
    return 1;
}

void tcp_req_conn_on_event(struct tcp_req_conn *c, uint32_t events)
{
    if (req_kill_pending(c))
        return;
    int more = req_worker_tx(c, (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0);
    tcp_conn_rx_event(&c->base, events);
    int rc = req_rx(c);
    if (rc < 0) {
        req_conn_fail(c, rc);
        return;
    }
    if (req_conn_check(c))
        return;
    if (more || tcp_turn_room(&c->base) == 0)
        tcp_worker_defer(c->base.worker, &c->base);
}

void tcp_req_conn_scan(struct tcp_req_conn *c, uint64_t now)
{
    if (req_kill_pending(c))
        return;
    if (req_worker_tx(c, 0))
        tcp_worker_defer(c->base.worker, &c->base); /* a submitter handed the sending over */
    if (req_conn_check(c))
        return;
    uint64_t timeout = c->peer->tp->io_timeout_ns;
    if (timeout == 0)
        return;
    pthread_mutex_lock(&c->lock);
    int busy = c->head != NULL;
    pthread_mutex_unlock(&c->lock);
    busy = busy || c->rx_xfer != NULL || c->rx_state != RRX_HEADER;
    uint64_t last = atomic_load_explicit(&c->base.last_progress_ns, memory_order_relaxed);
    if (busy && now > last && now - last > timeout) {
        orb_fail(ORB_EPEER, "no progress for %llu s with work pending",
                 (unsigned long long)(timeout / ORB_NS_PER_SEC));
        req_conn_fail(c, ORB_EPEER);
    }
}

/* ---- peers ----------------------------------------------------------------------------------- */

/* Connect one connection and prove the source's epoch with HELLO. *dropped says that the
 * connection was made but closed before any answer came. */
static int req_handshake_once(struct tcp_transport *tp, struct tcp_req_conn *c,
                              const char *endpoint, const struct orb_epoch *expected,
                              uint64_t deadline, uint32_t role, uint32_t stripe,
                              uint32_t *max_payload, int *dropped)
{
    int fd;
    char name[TCP_NAME_MAX];
    *dropped = 0;
    int rc = tcp_dial(endpoint, deadline, tp->socket_buffer, &fd, name, sizeof name);
    if (rc != 0)
        return rc;
    tcp_conn_init(&c->base, TCP_KIND_REQUESTER, fd, name); /* the fd is closed with the peer */

    struct orb_wire_hello hello = {.expected = *expected, .sender = *orb_engine_epoch(tp->engine),
                                   .role = role, .stripe = stripe};
    uint8_t buf[ORB_WIRE_HEADER_LEN + 8u + ORB_WIRE_MAX_ERROR_TEXT];
    size_t len;
    rc = orb_wire_hello_encode(&hello, buf, sizeof buf, &len);
    if (rc == 0)
        rc = tcp_send_all(fd, buf, len, deadline);
    if (rc == 0)
        rc = tcp_recv_all(fd, buf, ORB_WIRE_HEADER_LEN, deadline);
    if (rc != 0) {
        *dropped = rc == ORB_EPEER;
        return orb_fail_wrap(rc, "HELLO to %s", endpoint);
    }
    struct orb_wire_header h;
    if (orb_wire_header_decode(buf, &h) != 0)
        return orb_fail_wrap(ORB_EPROTO, "answer to HELLO from %s", endpoint);
    if (h.type != ORB_WIRE_ERROR && h.type != ORB_WIRE_HELLO_OK)
        return orb_fail(ORB_EPROTO, "%s answered HELLO with %s", endpoint, orb_wire_type_name(h.type));
    if (h.body_len > sizeof buf)
        return orb_fail(ORB_EPROTO, "%s answered HELLO with an oversized body", endpoint);
    rc = tcp_recv_all(fd, buf, h.body_len, deadline);
    if (rc != 0)
        return orb_fail_wrap(rc, "answer to HELLO from %s", endpoint);
    if (h.type == ORB_WIRE_ERROR) {
        struct orb_wire_error e;
        if (orb_wire_error_decode(buf, h.body_len, &e) != 0)
            return orb_fail_wrap(ORB_EPROTO, "ERROR answering HELLO from %s", endpoint);
        if (e.status == ORB_ESTALE)
            return orb_fail(ORB_ESTALE, "%s runs another source epoch than expected", endpoint);
        return orb_fail(e.status, "%s refused HELLO: %s", endpoint, e.text);
    }
    struct orb_wire_hello_ok ok;
    if (orb_wire_hello_ok_decode(buf, h.body_len, &ok) != 0)
        return orb_fail_wrap(ORB_EPROTO, "HELLO_OK from %s", endpoint);
    if (memcmp(ok.epoch.bytes, expected->bytes, sizeof ok.epoch.bytes) != 0)
        return orb_fail(ORB_ESTALE, "%s accepted HELLO under another epoch", endpoint);
    if (ok.max_payload < *max_payload)
        *max_payload = ok.max_payload;
    return 0;
}

/* A source admitting a flood of strangers drops its oldest unauthenticated connection to make
 * room, and that may be ours, accepted but not yet read. Being dropped before any answer is no
 * verdict on this peer, so the connection is dialled again, a few times, within the deadline. A
 * refused connect, a timeout or any answer (an ERROR included) ends the attempt at once. */
#define TCP_HELLO_ATTEMPTS 4

static int req_handshake(struct tcp_transport *tp, struct tcp_req_conn *c, const char *endpoint,
                         const struct orb_epoch *expected, uint64_t deadline, uint32_t role,
                         uint32_t stripe, uint32_t *max_payload)
{
    for (unsigned attempt = 1;; attempt++) {
        int dropped;
        int rc = req_handshake_once(tp, c, endpoint, expected, deadline, role, stripe, max_payload,
                                    &dropped);
        if (rc == 0 || !dropped || attempt == TCP_HELLO_ATTEMPTS || orb_now_ns() >= deadline)
            return rc;
        ORB_LOGD("tcp: %s dropped connection %u before answering HELLO; dialling again",
                 endpoint, attempt);
        close(c->base.fd);
        c->base.fd = -1;
    }
}

/* A connection slot of `p`, not connected yet. */
static void req_conn_init(struct tcp_peer *p, struct tcp_req_conn *c)
{
    c->base.fd = -1;
    c->peer = p;
    c->next_tag = 1;
    c->can_send = 1;
    c->rx_state = RRX_HEADER;
    atomic_init(&c->queued_bytes, 0);
    pthread_mutex_init(&c->lock, NULL);
    (void)orb_cond_init_monotonic(&c->cond);
}

int tcp_peer_open(void *tp_, const char *endpoint, const struct orb_epoch *expected,
                  uint64_t deadline, const struct orb_control_path *ctl, void **peer_out)
{
    (void)ctl; /* TCP is the control path */
    struct tcp_transport *tp = tp_;
    if (endpoint == NULL || expected == NULL || peer_out == NULL)
        return orb_fail(ORB_EINVAL, "peer_open: NULL argument");
    if (atomic_load(&tp->stopping))
        return orb_fail(ORB_ECLOSED, "the TCP transport is stopped");
    /* Room for either count: which one applies is known once CONTROL is connected. */
    uint32_t most = tp->nstripes > tp->local_stripes ? tp->nstripes : tp->local_stripes;
    struct tcp_peer *p = calloc(1, sizeof *p + (1 + most) * sizeof p->conns[0]);
    if (p == NULL)
        return orb_fail(ORB_ENOMEM, "cannot allocate a peer");
    p->tp = tp;
    atomic_init(&p->refs, 1);
    atomic_init(&p->dead, 0);
    atomic_init(&p->released, 0);
    p->stripe_threshold = tp->stripe_threshold;
    snprintf(p->endpoint, sizeof p->endpoint, "%s", endpoint);
    p->nconns = 0; /* the connections initialised so far: what peer_unref() undoes */
    req_conn_init(p, &p->conns[p->nconns++]);
    atomic_fetch_add(&tp->refs, 1); /* dropped when the peer is freed */

    uint32_t max_payload = ORB_WIRE_MAX_PAYLOAD;
    int rc = req_handshake(tp, &p->conns[0], endpoint, expected, deadline, ORB_WIRE_ROLE_CONTROL, 0,
                           &max_payload);
    if (rc == 0) {
        p->nstripes = tcp_peer_on_this_host(p->conns[0].base.fd) ? tp->local_stripes : tp->nstripes;
        while (p->nconns < 1 + p->nstripes)
            req_conn_init(p, &p->conns[p->nconns++]);
    }
    uint32_t nconns = p->nconns;
    for (uint32_t i = 1; i < nconns && rc == 0; i++)
        rc = req_handshake(tp, &p->conns[i], endpoint, expected, deadline, ORB_WIRE_ROLE_DATA, i - 1,
                           &max_payload);
    if (rc != 0) {
        peer_unref(p);
        return rc;
    }
    p->max_payload = max_payload;

    for (uint32_t i = 0; i < nconns; i++) {
        struct tcp_req_conn *c = &p->conns[i];
        atomic_fetch_add(&p->refs, 1);
        if (tcp_worker_handover(tcp_next_worker(tp), &c->base) != 0) {
            atomic_fetch_sub(&p->refs, 1); /* not handed over: closed when the peer is freed */
            rc = ORB_ECLOSED;
        }
    }
    if (rc != 0) {
        tcp_peer_release(p);
        return orb_fail(ORB_ECLOSED, "the TCP transport is stopping");
    }
    *peer_out = p;
    return 0;
}

uint64_t tcp_peer_slice_len(void *peer_, uint64_t length)
{
    const struct tcp_peer *p = peer_;
    uint64_t slice = length;
    if (length > p->stripe_threshold) {
        uint64_t per = length / p->nstripes + (length % p->nstripes != 0);
        slice = per > UINT64_MAX - TCP_SLICE_ALIGN
                    ? p->max_payload
                    : (per + TCP_SLICE_ALIGN - 1) / TCP_SLICE_ALIGN * TCP_SLICE_ALIGN;
    }
    if (slice > length)
        slice = length;
    if (slice > p->max_payload)
        slice = p->max_payload;
    return slice == 0 ? 1 : slice;
}

int tcp_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan)
{
    uint64_t slice = tcp_peer_slice_len(peer, in->length);
    /* Memory without a CPU view goes through the core's staging, one chunk per piece. */
    if (in->local_reg != NULL && in->local_reg->kind->cpu_view(in->local_reg, in->local_reg->base) == NULL &&
        slice > ORB_STAGE_CHUNK)
        slice = ORB_STAGE_CHUNK;
    return orb_plan_even(plan, in->length, slice);
}

static int xfer_check(const struct tcp_peer *p, const struct orb_xfer *x, size_t i)
{
    if (x == NULL)
        return orb_fail(ORB_EINVAL, "xfer %zu is NULL", i);
    if (x->op == ORB_XFER_NOTIFY) {
        if (x->length == 0 || x->length > ORB_NOTIFY_MAX || x->notify_data == NULL)
            return orb_fail(ORB_EINVAL, "notification %zu: length %llu outside 1..%d", i,
                            (unsigned long long)x->length, ORB_NOTIFY_MAX);
        return 0;
    }
    if (x->op != ORB_XFER_READ && x->op != ORB_XFER_WRITE)
        return orb_fail(ORB_EINVAL, "xfer %zu: unknown op %u", i, (unsigned)x->op);
    if (x->length == 0 || x->length > p->max_payload)
        return orb_fail(ORB_EINVAL, "xfer %zu: length %llu outside 1..%llu", i,
                        (unsigned long long)x->length, (unsigned long long)p->max_payload);
    /* TCP moves bytes through the CPU: the local side must have a CPU view over its length. */
    const struct orb_reg *reg = x->local_reg;
    if (reg == NULL || x->local_offset > reg->len || x->length > reg->len - x->local_offset ||
        orb_xfer_local_cpu(x) == NULL)
        return orb_fail(ORB_EINVAL, "xfer %zu: local bytes outside their registration or "
                        "without a CPU view", i);
    if (x->remote_addr > UINT64_MAX - x->length)
        return orb_fail(ORB_EINVAL, "xfer %zu: remote range wraps around", i);
    /* The frame names the whole request; it must be a range that contains this slice. */
    if (x->request_length == 0 || x->request_remote_addr > UINT64_MAX - x->request_length ||
        x->remote_addr < x->request_remote_addr ||
        x->remote_addr + x->length > x->request_remote_addr + x->request_length)
        return orb_fail(ORB_EINVAL, "xfer %zu: slice lies outside its request's range", i);
    return 0;
}

static int peer_submit(struct tcp_peer *p, struct orb_xfer *const *xfers, size_t n)
{
    struct tcp_transport *tp = p->tp;
    if (n == 0)
        return 0;
    if (xfers == NULL)
        return orb_fail(ORB_EINVAL, "peer_submit: NULL xfers");
    for (size_t i = 0; i < n; i++) {
        int rc = xfer_check(p, xfers[i], i);
        if (rc != 0)
            return rc;
    }
    if (atomic_load(&tp->stopping))
        return orb_fail(ORB_ECLOSED, "the TCP transport is stopped");
    int dead = atomic_load(&p->dead);
    if (dead != 0)
        return orb_fail(dead, "the connection to %s was %s (%s)", p->endpoint,
                        dead == ORB_EPEER ? "lost" : "broken", orb_strerror(dead));

    /* One chain per connection: notifications on CONTROL, data on the least loaded stripe.
     * Consecutive xfers stay on one stripe until it has taken a stripe threshold's worth: a
     * group of small requests then costs one sendmsg() and wakes one worker at each end,
     * while large requests (and their slices) still spread over every stripe. */
    struct orb_xfer *first[1 + TCP_MAX_STRIPES] = {0}, *last[1 + TCP_MAX_STRIPES] = {0};
    uint64_t bytes[1 + TCP_MAX_STRIPES] = {0};
    size_t count[1 + TCP_MAX_STRIPES] = {0};
    uint64_t load[TCP_MAX_STRIPES];
    for (uint32_t s = 0; s < p->nstripes; s++)
        load[s] = atomic_load_explicit(&p->conns[1 + s].queued_bytes, memory_order_relaxed);
    uint32_t fill = UINT32_MAX; /* the stripe being filled */
    uint64_t filled = 0;
    for (size_t i = 0; i < n; i++) {
        struct orb_xfer *x = xfers[i];
        uint32_t k = 0;
        if (x->op != ORB_XFER_NOTIFY) {
            if (fill == UINT32_MAX || filled >= p->stripe_threshold) {
                fill = 0;
                for (uint32_t s = 1; s < p->nstripes; s++)
                    if (load[s] < load[fill])
                        fill = s;
                filled = 0;
            }
            load[fill] += x->length;
            bytes[1 + fill] += x->length;
            filled += x->length;
            k = 1 + fill;
        }
        x->next = NULL;
        if (last[k] != NULL)
            last[k]->next = x;
        else
            first[k] = x;
        last[k] = x;
        count[k]++;
    }

    atomic_fetch_add(&tp->inflight_xfers, n);
    size_t accepted = 0;
    int first_rc = 0;
    struct orb_xfer *refused = NULL; /* chains no connection took, marked with their status */
    for (uint32_t k = 0; k < p->nconns; k++) {
        if (first[k] == NULL)
            continue;
        int rc = req_enqueue(&p->conns[k], first[k], last[k], bytes[k]);
        if (rc == 0) {
            accepted += count[k];
            continue;
        }
        if (first_rc == 0)
            first_rc = rc;
        for (struct orb_xfer *x = first[k]; x != NULL; x = x->next)
            xfer_mark(x, rc, ORB_REMOTE_EFFECT_NONE);
        last[k]->next = refused;
        refused = first[k];
    }
    if (accepted == 0) {
        /* Nothing was accepted: the caller keeps every xfer. */
        atomic_fetch_sub(&tp->inflight_xfers, n);
        return orb_fail(first_rc, "the connection to %s is gone", p->endpoint);
    }
    /* Some were accepted, so every xfer must be reported: end the refused ones here. */
    req_complete_list(tp, refused);
    return 0;
}

int tcp_peer_submit(void *peer_, struct orb_xfer *const *xfers, size_t n)
{
    struct tcp_peer *p = peer_;
    /* What is handed over may complete, and its batch (whose segment holds this peer) end and
     * let go of the peer, before this call is done with the peer's connections (a submitter
     * such as the engine's stager holds nothing else): the peer stays until the call returns. */
    atomic_fetch_add(&p->refs, 1);
    int rc = peer_submit(p, xfers, n);
    peer_unref(p);
    return rc;
}

/* Queue `op` (op->x.op set, one reference for the connection taken here) on the control
 * connection and wait for its end until `deadline`. 0 when it ended (op->status says how), or a
 * negative status (not queued, or the deadline passed). Drops the caller's reference only on the
 * error paths that never queued it. */
#define CALL_SLICE_NS (50ull * 1000000ull) /* a waiting call looks at tcp_abandon_calls this often */

static int call_run(struct tcp_peer *p, struct tcp_call_op *op, uint64_t deadline, const char *what)
{
    if (atomic_load(&p->tp->stopping))
        return orb_fail(ORB_ECLOSED, "the TCP transport is stopped");
    int dead = atomic_load(&p->dead);
    if (dead != 0)
        return orb_fail(dead, "the connection to %s was %s", p->endpoint, dead == ORB_EPEER ? "lost" : "broken");
    op->refs = 2;
    int rc = req_enqueue(&p->conns[0], &op->x, &op->x, 0);
    if (rc != 0) {
        op->refs = 1;
        return rc;
    }
    pthread_mutex_lock(&op->lock);
    bool abandoned = false;
    while (!op->done) {
        /* In slices, so that an engine that stops (tcp_abandon_calls) is seen within one. */
        uint64_t slice = orb_deadline_after(CALL_SLICE_NS);
        struct timespec ts = orb_deadline_timespec(slice < deadline ? slice : deadline);
        int w = pthread_cond_timedwait(&op->cond, &op->lock, &ts);
        if (op->done)
            break;
        if ((abandoned = atomic_load(&p->tp->calls_abandoned) != 0))
            break;
        if (w == ETIMEDOUT && orb_now_ns() >= deadline)
            break;
    }
    int done = op->done;
    pthread_mutex_unlock(&op->lock);
    if (!done && abandoned)
        return orb_fail(ORB_ECLOSED, "%s of %s: abandoned, the engine stops", what, p->endpoint);
    if (!done)
        return orb_fail(ORB_ETIMEDOUT, "%s of %s: deadline passed", what, p->endpoint);
    return 0;
}

void tcp_abandon_calls(void *tp_)
{
    struct tcp_transport *tp = tp_;
    atomic_store(&tp->calls_abandoned, 1);
}

static struct tcp_call_op *call_new(uint8_t op_code)
{
    struct tcp_call_op *op = calloc(1, sizeof *op);
    if (op == NULL)
        return NULL;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&op->cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&op->lock, NULL);
    op->refs = 1;
    op->x.op = op_code;
    return op;
}

int tcp_peer_describe(void *peer_, uint64_t deadline, struct orb_region_desc **regions_out,
                      size_t *count_out)
{
    struct tcp_peer *p = peer_;
    if (regions_out == NULL || count_out == NULL)
        return orb_fail(ORB_EINVAL, "peer_describe: NULL argument");
    struct tcp_call_op *op = call_new(TCP_OP_DESCRIBE);
    if (op == NULL)
        return orb_fail(ORB_ENOMEM, "cannot allocate a DESCRIBE");
    int rc = call_run(p, op, deadline, "DESCRIBE");
    if (rc != 0) {
        call_put(op);
        return rc;
    }
    pthread_mutex_lock(&op->lock);
    int status = op->status;
    struct orb_region_desc *regions = NULL;
    size_t count = op->count;
    char text[sizeof op->text];
    snprintf(text, sizeof text, "%s", op->text);
    if (status == 0) {
        regions = op->regions;
        op->regions = NULL; /* now the caller's */
    }
    pthread_mutex_unlock(&op->lock);
    call_put(op);
    if (status != 0)
        return orb_fail(status, "DESCRIBE of %s failed: %s", p->endpoint, text);
    *regions_out = regions;
    *count_out = count;
    return 0;
}

int tcp_peer_lost(void *peer_)
{
    const struct tcp_peer *p = peer_;
    return atomic_load(&p->dead);
}

int tcp_peer_control(void *peer_, uint8_t transport, const uint8_t *req, size_t len, uint8_t *resp,
                     size_t cap, size_t *resp_len, uint64_t deadline)
{
    struct tcp_peer *p = peer_;
    if (p == NULL || req == NULL || resp == NULL || resp_len == NULL || len == 0 || len > ORB_WIRE_MAX_CONTROL ||
        cap < ORB_WIRE_MAX_CONTROL || transport == ORB_TRANSPORT_TCP || transport >= ORB_TRANSPORT_SLOTS)
        return orb_fail(ORB_EINVAL, "control call: NULL argument, bad transport, or a length outside 1..%u",
                        ORB_WIRE_MAX_CONTROL);
    struct tcp_call_op *op = call_new(TCP_OP_CONTROL);
    if (op == NULL)
        return orb_fail(ORB_ENOMEM, "cannot allocate a control call");
    op->transport = transport;
    op->req[0] = transport;
    memcpy(op->req + 4, req, len);
    op->x.notify_data = op->req;
    op->x.length = 4 + len;
    int rc = call_run(p, op, deadline, "a control call");
    if (rc != 0) {
        call_put(op);
        return rc;
    }
    pthread_mutex_lock(&op->lock);
    int status = op->status;
    size_t got = op->resp_len;
    char text[sizeof op->text];
    snprintf(text, sizeof text, "%s", op->text);
    if (status == 0)
        memcpy(resp, op->resp, got);
    pthread_mutex_unlock(&op->lock);
    call_put(op);
    if (status != 0)
        return orb_fail(status, "%s", text);
    *resp_len = got;
    return 0;
}

void tcp_peer_release(void *peer_)
{
    struct tcp_peer *p = peer_;
    if (p == NULL)
        return;
    atomic_store(&p->released, 1);
    for (uint32_t i = 0; i < p->nconns; i++)
        if (p->conns[i].base.worker != NULL)
            tcp_worker_kick(p->conns[i].base.worker);
    peer_unref(p);
}
