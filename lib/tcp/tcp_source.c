/* The TCP source service: the listener and one state machine per accepted connection.
 *
 * A connection must open with HELLO naming this engine's epoch; nothing touches registered
 * memory before HELLO_OK. Requests are served in order, one after the other: receive the request
 * (and a WRITE's payload), act, and queue its response. Responses wait in a small queue, so that
 * every response that is ready (and the acknowledgements of a run of WRITEs) leaves in one
 * sendmsg(); when the queue is full the connection stops reading until it drains, which is its
 * back-pressure. READ payloads leave straight from the pinned registered range; WRITE payloads
 * land straight in it (or, while they are small, through the receive stage). Memory without a
 * CPU view (device memory) goes through chunks of the engine's staging pool (stage_pool.h),
 * shared with the other transports and held only while staged bytes move, never while the
 * connection waits for its peer: a READ's payload is copied out chunk by chunk as the socket
 * takes it (a chunk the socket would not take whole goes back, and its unsent bytes are copied
 * again when the socket has room; those of the payload's last chunk, whose range loan ended when
 * it was copied out, move to a heap copy instead); a WRITE's is received chunk by chunk and
 * copied in (a chunk the peer has not filled yet is copied in as far as it got, and goes back).
 * When the pool has no chunk, the connection waits (it neither sends the staged answer nor reads
 * the payload) until one comes back and it is poked. So a peer that stops reading or sending
 * holds no staging. Any malformed or out-of-place frame closes only its connection, with a
 * logged reason. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/registry.h"
#include "core/stage_pool.h"
#include "tcp_internal.h"

/* An ERROR frame with the longest text. */
#define SRC_TX_SMALL (ORB_WIRE_HEADER_LEN + 8u + ORB_WIRE_MAX_ERROR_TEXT + 32u)
/* Responses queued for one sendmsg() (two iovecs each, well below IOV_MAX). */
#define SRC_TX_SLOTS 32u
/* Built answers (DESCRIBE_RESP, CONTROL_RESP) waiting to go out on one connection: no new frame
 * is read while they hold this many bytes, so that a peer that asks and does not read holds
 * one DESCRIBE_RESP of every registration (up to 1.5 MiB) at most, not one per slot. */
#define SRC_TX_HEAP_MAX (256u * 1024u)

/* A queued response: its header and body, then (READ_RESP) the payload from registered memory. */
struct src_resp {
    const uint8_t *head;            /* head_buf, or heap */
    size_t head_len;
    const uint8_t *payload;         /* NULL for a staged payload (device memory) */
    uint64_t payload_len;
    uint64_t payload_addr;          /* a staged payload's first byte in pin */
    uint64_t tag;                   /* READ_RESP: the request's */
    struct orb_reg *pin;            /* READ_RESP: released once the payload is out */
    void *loan;                     /* a staged payload's range loan, given back with the pin */
    bool lent_range;                /* it had one: once it ended, its bytes are not copied again */
    uint8_t *heap;                  /* DESCRIBE_RESP (owned) */
    uint8_t head_buf[SRC_TX_SMALL];
};

enum src_rx_state {
    SRX_HEADER,  /* waiting for a frame header */
    SRX_BODY,    /* header decoded, waiting for its body */
    SRX_PAYLOAD, /* receiving an admitted WRITE's payload into registered memory */
    SRX_DISCARD  /* draining a refused WRITE's payload into the worker's scratch buffer */
};

struct tcp_source_conn {
    struct tcp_conn base;           /* first member */
    struct tcp_transport *tp;
    int can_send;                   /* cleared on EAGAIN, set by EPOLLOUT */
    int authed;                     /* HELLO accepted (counted in authed_conns) */
    int stranger;                   /* on the strangers list (worker 0) */
    int migrate;                    /* move to its own worker once HELLO_OK is out */
    int closing;                    /* close once the response being sent is out */
    uint64_t accepted_ns;           /* when HELLO's deadline started */
    struct tcp_source_conn *s_prev, *s_next; /* the strangers list, oldest first */
    struct orb_epoch sender;        /* the requester engine's epoch, from HELLO */

    enum src_rx_state rx_state;
    struct orb_wire_header hdr;     /* the request being served */
    struct orb_reg *rx_pin;         /* SRX_PAYLOAD: pin of the target range */
    void *rx_loan;                  /* SRX_PAYLOAD: its range loan (staged memory) */
    uint8_t *rx_mem;                /* SRX_PAYLOAD: CPU view of the target range; NULL: staged */
    uint64_t rx_addr;               /* SRX_PAYLOAD: the payload's first byte in rx_pin */
    uint64_t rx_len, rx_off;        /* payload bytes expected / received */
    int rx_ends_request;            /* the WRITE's piece is its request's last (metrics) */

    /* Staging for memory without a CPU view: chunks (ORB_STAGE_CHUNK bytes) of the engine's pool,
     * taken when staged bytes are due and given back as soon as the connection waits for its
     * peer. The bytes [stage_from, +stage_len) of the payload of the response at the head of the
     * queue (READ). A payload's tail whose loan ended cannot be copied again: when its peer
     * stops reading, what it has not sent of it moves to a heap copy (`spilled`), so that a
     * stalled reader holds no chunk. */
    uint8_t *stage;                 /* READ payloads: a chunk, or the heap copy */
    uint64_t stage_from, stage_len;
    bool spilled;                   /* stage is the heap copy */
    uint8_t *rx_stage;              /* WRITE payloads: bytes from rx_stage_from on */
    uint64_t rx_stage_from;
    struct orb_stage_waiter stage_waiter; /* the pool had no chunk: it pokes the connection */
    int refused_status;             /* SRX_DISCARD: the answer once drained */
    int refused_effect_unknown;     /* SRX_DISCARD: some of the WRITE reached memory first */
    char refused_text[ORB_WIRE_MAX_ERROR_TEXT + 1];

    /* The response queue: tx_count responses from tx_first on (a ring), tx_off bytes of the
     * first one sent. A frame is started only when a slot is free for its response. */
    unsigned tx_first, tx_count;
    uint64_t tx_off;
    size_t tx_heap_bytes;           /* of the queued responses' built answers (heap) */
    struct src_resp tx[SRC_TX_SLOTS];
};

/* ---- pins ------------------------------------------------------------------------------------ */

/* Pin the registration that contains the whole request [req_addr, +req_len) with permission
 * `need`, and find the CPU view of this frame's piece at `addr`. Counted in inflight() while
 * held. Authorising the whole request, not just the piece, is what keeps a request that is cut
 * into several frames from applying its in-range pieces when the rest is out of range. */
static int src_pin(struct tcp_source_conn *s, const struct orb_wire_xfer *req, enum orb_perm need,
                   struct orb_reg **pin_out, void **loan_out, uint8_t **mem_out)
{
    struct tcp_transport *tp = s->tp;
    struct orb_reg *pin;
    atomic_fetch_add(&tp->source_pins, 1);
    int rc = orb_registry_acquire(orb_engine_registry(tp->engine), req->request_addr,
                                  req->request_length, need, &pin);
    if (rc != 0) {
        atomic_fetch_sub(&tp->source_pins, 1);
        return rc;
    }
    /* A producer's recorded GPU work on the bytes ends first (this worker waits). */
    if ((rc = orb_reg_ready(pin)) != 0) {
        orb_registry_release(pin);
        atomic_fetch_sub(&tp->source_pins, 1);
        return rc;
    }
    /* NULL for memory without a CPU view: staged through the pool's chunks. */
    uint8_t *mem = pin->kind->cpu_view(pin, req->addr);
    if (mem == NULL) {
        const char *kind = pin->kind->name;
        if (pin->kind->to_host == NULL)
            rc = orb_fail(ORB_EUNAVAILABLE, "the %s registration at 0x%llx has no CPU view", kind,
                          (unsigned long long)req->addr);
        else /* the frame's bytes are this operation's while it copies them */
            rc = orb_reg_loan(pin, req->addr, req->length, need == ORB_PERM_REMOTE_WRITE, loan_out);
        if (rc != 0) {
            orb_registry_release(pin);
            atomic_fetch_sub(&tp->source_pins, 1);
            return rc;
        }
    }
    *pin_out = pin;
    *mem_out = mem;
    return 0;
}

static void src_unpin(struct tcp_source_conn *s, struct orb_reg **pin, void **loan)
{
    if (*pin == NULL)
        return;
    orb_reg_loan_end(*pin, *loan);
    *loan = NULL;
    orb_registry_release(*pin);
    *pin = NULL;
    atomic_fetch_sub(&s->tp->source_pins, 1);
}

/* ---- connection life ------------------------------------------------------------------------- */

/* ---- strangers (worker 0 only) -------------------------------------------------------------- */

static void stranger_add(struct tcp_source_conn *s)
{
    struct tcp_transport *tp = s->tp;
    s->stranger = 1;
    s->s_next = NULL;
    s->s_prev = tp->strangers_tail;
    if (tp->strangers_tail != NULL)
        tp->strangers_tail->s_next = s;
    else
        tp->strangers_head = s;
    tp->strangers_tail = s;
    tp->nstrangers++;
}

static void stranger_remove(struct tcp_source_conn *s)
{
    struct tcp_transport *tp = s->tp;
    if (!s->stranger)
        return;
    if (s->s_prev != NULL)
        s->s_prev->s_next = s->s_next;
    else
        tp->strangers_head = s->s_next;
    if (s->s_next != NULL)
        s->s_next->s_prev = s->s_prev;
    else
        tp->strangers_tail = s->s_prev;
    s->s_prev = s->s_next = NULL;
    s->stranger = 0;
    tp->nstrangers--;
}

/* Give the READ chunk back (its bytes not sent yet are copied again when they are due). */
static void src_stage_drop(struct tcp_source_conn *s)
{
    if (s->stage == NULL)
        return;
    if (s->spilled)
        free(s->stage);
    else
        orb_stage_pool_put(orb_engine_stage_pool(s->tp->engine), s->stage);
    s->stage = NULL;
    s->spilled = false;
    s->stage_from = s->stage_len = 0;
}

void tcp_source_conn_kill(struct tcp_source_conn *s, const char *why)
{
    ORB_LOGD("tcp source: closing %s: %s", s->base.name, why);
    src_unpin(s, &s->rx_pin, &s->rx_loan);
    for (unsigned i = 0; i < s->tx_count; i++) {
        struct src_resp *r = &s->tx[(s->tx_first + i) % SRC_TX_SLOTS];
        src_unpin(s, &r->pin, &r->loan);
        free(r->heap);
    }
    stranger_remove(s);
    struct orb_stage_pool *pool = orb_engine_stage_pool(s->tp->engine);
    orb_stage_pool_unwait(pool, &s->stage_waiter);
    src_stage_drop(s);
    orb_stage_pool_put(pool, s->rx_stage);
    if (s->authed)
        atomic_fetch_sub(&s->tp->authed_conns, 1);
    if (s->base.worker != NULL)
        tcp_worker_forget(s->base.worker, &s->base);
    if (s->base.fd >= 0)
        close(s->base.fd);
    atomic_fetch_sub(&s->tp->source_conns, 1);
    free(s);
}

/* Nothing half received, nothing queued or being sent. */
static int src_idle(const struct tcp_source_conn *s)
{
    return s->tx_count == 0 && s->rx_state == SRX_HEADER && tcp_rx_empty(&s->base);
}

/* Log a protocol violation (the caller then closes). Returns ORB_EPROTO. */
static int src_violation(struct tcp_source_conn *s, const char *what, const char *detail)
{
    ORB_LOGW("tcp source: closing %s: %s%s%s", s->base.name, what, detail[0] ? ": " : "", detail);
    return ORB_EPROTO;
}

/* ---- responses ------------------------------------------------------------------------------- */

/* The slot for the next response. The caller checked that one is free (src_rx_step does not
 * start a frame otherwise) and commits it with src_tx_push(). */
static struct src_resp *src_tx_slot(struct tcp_source_conn *s)
{
    struct src_resp *r = &s->tx[(s->tx_first + s->tx_count) % SRC_TX_SLOTS];
    r->head = r->head_buf;
    r->head_len = 0;
    r->payload = NULL;
    r->payload_len = 0;
    r->pin = NULL;
    r->loan = NULL;
    r->lent_range = false;
    r->heap = NULL;
    return r;
}

static void src_tx_push(struct tcp_source_conn *s)
{
    s->tx_count++;
}

/* Queue an ERROR answering `tag` (0: the connection), saying whether the request may have
 * changed memory before it failed. */
static int src_tx_error_effect(struct tcp_source_conn *s, uint64_t tag, int status, int effect_unknown,
                               const char *text)
{
    struct orb_wire_error e;
    memset(&e, 0, sizeof e);
    e.status = status;
    e.effect_unknown = effect_unknown != 0;
    snprintf(e.text, sizeof e.text, "%s", text);
    struct src_resp *r = src_tx_slot(s);
    if (orb_wire_error_encode(tag, &e, r->head_buf, sizeof r->head_buf, &r->head_len) != 0)
        return src_violation(s, "cannot encode an ERROR", orb_last_error());
    src_tx_push(s);
    return 0;
}

/* Queue an ERROR for a request that changed nothing. */
static int src_tx_error(struct tcp_source_conn *s, uint64_t tag, int status, const char *text)
{
    return src_tx_error_effect(s, tag, status, 0, text);
}

/* Queue an ERROR carrying the calling thread's detail message. */
static int src_tx_failure(struct tcp_source_conn *s, uint64_t tag, int status)
{
    char text[ORB_WIRE_MAX_ERROR_TEXT + 1];
    snprintf(text, sizeof text, "%s", orb_last_error());
    return src_tx_error(s, tag, status, text);
}

/* Queue a response encoded in `buf` (len bytes, malloc'd): freed once it is sent. */
static int src_tx_heap(struct tcp_source_conn *s, uint8_t *buf, size_t len)
{
    struct src_resp *r = src_tx_slot(s);
    r->heap = buf;
    r->head = buf;
    r->head_len = len;
    s->tx_heap_bytes += len;
    src_tx_push(s);
    return 0;
}

static int src_tx_empty(struct tcp_source_conn *s, uint8_t type, uint64_t tag)
{
    struct src_resp *r = src_tx_slot(s);
    if (orb_wire_empty_encode(type, tag, r->head_buf, sizeof r->head_buf, &r->head_len) != 0)
        return src_violation(s, "cannot encode a response", orb_last_error());
    src_tx_push(s);
    return 0;
}

/* A chunk of the pool into *chunk for staging pin's bytes: 0, ORB_EAGAIN when there is none now
 * (the connection is poked when one comes back), or why none can be had (ORB_ENOMEM,
 * ORB_ECLOSED). */
static int src_stage_take(struct tcp_source_conn *s, const struct orb_reg *pin, uint8_t **chunk)
{
    return orb_stage_pool_take(orb_engine_stage_pool(s->tp->engine), pin, ORB_STAGE_FOR_SOURCE, &s->stage_waiter,
                               chunk, NULL);
}

/* The pool's wake-up: serve the connection again on its worker (under the pool's lock; the
 * connection cannot go meanwhile: it leaves the waiters before it is freed). */
static void src_stage_wake(struct orb_stage_waiter *w)
{
    struct tcp_source_conn *s =
        (struct tcp_source_conn *)(void *)((char *)w - offsetof(struct tcp_source_conn, stage_waiter));
    if (s->base.worker != NULL)
        tcp_worker_poke(s->base.worker, &s->base);
}

/* The socket blocked at byte `at` of a payload whose loan ended (its tail is staged, or it became
 * an ERROR): move what the chunk holds from `at` on to the heap and give the chunk back (on no
 * memory, the chunk stays); a chunk that holds none of the unsent bytes just goes back. */
static void src_stage_spill(struct tcp_source_conn *s, uint64_t at)
{
    if (s->stage == NULL || s->spilled)
        return;
    if (at < s->stage_from || at >= s->stage_from + s->stage_len) {
        src_stage_drop(s);
        return;
    }
    size_t keep = (size_t)(s->stage_from + s->stage_len - at);
    uint8_t *copy = malloc(keep);
    if (copy == NULL)
        return;
    memcpy(copy, s->stage + (at - s->stage_from), keep);
    orb_stage_pool_put(orb_engine_stage_pool(s->tp->engine), s->stage);
    s->stage = copy;
    s->spilled = true;
    s->stage_from = at;
    s->stage_len = keep;
}

/* Stage the bytes from `at` of the payload of `r`, the response at the head of the queue, into
 * a chunk of the pool (*wait set, and 0, when the pool has none now). A failure before any byte
 * of the response went out (`unsent`) turns it into an ERROR naming the cause; later, the
 * response cannot be taken back and the connection ends (the requester's READ fails). 0 or a
 * negative status. */
static int src_stage_read(struct tcp_source_conn *s, struct src_resp *r, uint64_t at, bool unsent, bool *wait)
{
    const struct orb_reg *pin = r->pin;
    uint64_t len = r->payload_len - at < ORB_STAGE_CHUNK ? r->payload_len - at : ORB_STAGE_CHUNK;
    if (s->spilled)
        src_stage_drop(s); /* a heap copy is no chunk to stage into */
    s->stage_from = s->stage_len = 0;
    bool held = false;
    int rc = s->stage == NULL ? src_stage_take(s, pin, &s->stage) : 0;
    if (rc == ORB_EAGAIN) {
        *wait = true; /* poked when a chunk comes back */
        return 0;
    }
    bool staged = rc == 0;
    if (staged)
        rc = pin->kind->to_host(pin, r->payload_addr + at, s->stage, (size_t)len, &held);
    if (rc == 0) {
        s->stage_from = at;
        s->stage_len = len;
        /* The device bytes are all copied out: their loan ends before the last of them can
         * reach the requester, so its next request finds them free. */
        if (at + len == r->payload_len) {
            orb_reg_loan_end(pin, r->loan);
            r->loan = NULL;
        }
        return 0;
    }
    char text[ORB_WIRE_MAX_ERROR_TEXT + 1];
    snprintf(text, sizeof text, "%s the READ's bytes from %s memory failed: %s", staged ? "copying" : "staging",
             pin->kind->name, orb_last_error());
    if (held) {
        orb_stage_pool_keep(orb_engine_stage_pool(s->tp->engine), pin, s->stage);
        s->stage = NULL; /* the device may still write it: kept, never reused */
    }
    if (!unsent) {
        ORB_LOGW("tcp source: closing %s: %s", s->base.name, text);
        return rc;
    }
    src_unpin(s, &r->pin, &r->loan);
    r->payload_len = 0;
    struct orb_wire_error e;
    memset(&e, 0, sizeof e);
    e.status = rc;
    snprintf(e.text, sizeof e.text, "%s", text);
    if (orb_wire_error_encode(r->tag, &e, r->head_buf, sizeof r->head_buf, &r->head_len) != 0)
        return src_violation(s, "cannot encode an ERROR", orb_last_error());
    r->head = r->head_buf;
    return 0;
}

/* Send what the socket takes of the queued responses, as many as fit in one sendmsg(). 0 (all
 * sent, or blocked, or the turn is spent) or a negative status. */
static int src_tx(struct tcp_source_conn *s)
{
    while (s->tx_count > 0 && s->can_send) {
        struct iovec iov[2 * SRC_TX_SLOTS];
        int n = 0;
        uint64_t off = s->tx_off; /* only the first response is partly sent */
        for (unsigned i = 0; i < s->tx_count; i++) {
            struct src_resp *r = &s->tx[(s->tx_first + i) % SRC_TX_SLOTS];
            /* What of the payload can go now: all of it, or a staged payload's chunk. */
            const uint8_t *payload = r->payload;
            uint64_t payload_from = 0, payload_end = r->payload_len;
            if (r->payload == NULL && r->payload_len > 0) {
                if (i > 0)
                    break; /* staged when it heads the queue */
                uint64_t at = off > r->head_len ? off - r->head_len : 0;
                if (at < s->stage_from || at >= s->stage_from + s->stage_len) {
                    bool wait = false;
                    int rc = src_stage_read(s, r, at, off == 0, &wait);
                    if (rc != 0 || wait)
                        return rc;
                }
                if (r->payload_len > 0) {
                    payload = s->stage;
                    payload_from = s->stage_from;
                    payload_end = s->stage_from + s->stage_len;
                } else {
                    payload_end = 0; /* it became an ERROR */
                }
            }
            if (off < r->head_len) {
                iov[n].iov_base = (void *)(uintptr_t)(r->head + off);
                iov[n].iov_len = r->head_len - off;
                n++;
                off = 0;
            } else {
                off -= r->head_len;
            }
            if (payload_end > off) {
                iov[n].iov_base = (void *)(uintptr_t)(payload + (off - payload_from));
                iov[n].iov_len = payload_end - off;
                n++;
            }
            off = 0;
            if (payload_end < r->payload_len)
                break; /* the rest after the next chunk is staged */
        }
        n = tcp_iov_clip(iov, n, tcp_turn_room(&s->base));
        if (n == 0)
            return 0; /* the turn is spent */
        ssize_t sent = tcp_send_iov(s->base.fd, iov, n);
        if (sent < 0)
            return (int)sent;
        if (sent == 0) {
            s->can_send = 0;
            /* The peer may never read on: it holds no staging meanwhile. The tail of a payload
             * whose range loan ended when it was copied cannot be copied again (others may
             * change those bytes now): what is unsent of it goes to the heap. */
            const struct src_resp *head = &s->tx[s->tx_first];
            if (head->lent_range && head->loan == NULL)
                src_stage_spill(s, s->tx_off > head->head_len ? s->tx_off - head->head_len : 0);
            else
                src_stage_drop(s);
            return 0;
        }
        tcp_conn_touch(&s->base);
        tcp_turn_spend(&s->base, (uint64_t)sent);
        /* Retire the responses that are fully out. */
        uint64_t left = (uint64_t)sent;
        while (left > 0 && s->tx_count > 0) {
            struct src_resp *r = &s->tx[s->tx_first];
            uint64_t rest = r->head_len + r->payload_len - s->tx_off;
            if (left < rest) {
                s->tx_off += left;
                break;
            }
            left -= rest;
            s->tx_off = 0;
            if (r->payload == NULL) /* the staged chunk is the next payload's */
                s->stage_from = s->stage_len = 0;
            src_unpin(s, &r->pin, &r->loan);
            if (r->heap != NULL)
                s->tx_heap_bytes -= r->head_len;
            free(r->heap);
            r->heap = NULL;
            s->tx_first = (s->tx_first + 1) % SRC_TX_SLOTS;
            s->tx_count--;
        }
    }
    if (s->tx_count == 0)
        src_stage_drop(s); /* all sent: nothing waits in the chunk */
    return 0;
}

/* ---- requests -------------------------------------------------------------------------------- */

static int src_hello(struct tcp_source_conn *s, const uint8_t *body, size_t len)
{
    struct orb_wire_hello hello;
    if (orb_wire_hello_decode(body, len, &hello) != 0)
        return src_violation(s, "malformed HELLO", orb_last_error());
    const struct orb_epoch *mine = orb_engine_epoch(s->tp->engine);
    if (memcmp(hello.expected.bytes, mine->bytes, sizeof mine->bytes) != 0) {
        ORB_LOGI("tcp source: %s expected another source epoch; refusing", s->base.name);
        s->closing = 1;
        return src_tx_error(s, 0, ORB_ESTALE,
                            "this endpoint runs another source epoch than the one expected");
    }
    struct tcp_transport *tp = s->tp;
    /* Only worker 0 admits strangers, so the check and the count cannot race. */
    if (atomic_load(&tp->authed_conns) >= tp->max_connections) {
        ORB_LOGW("tcp source: refusing %s: max_connections (%u) authenticated connections",
                 s->base.name, tp->max_connections);
        s->closing = 1;
        return src_tx_error(s, 0, ORB_ERESOURCE,
                            "the source serves max_connections authenticated connections");
    }
    struct orb_wire_hello_ok ok = {.epoch = *mine, .max_payload = ORB_WIRE_MAX_PAYLOAD};
    struct src_resp *r = src_tx_slot(s);
    if (orb_wire_hello_ok_encode(&ok, r->head_buf, sizeof r->head_buf, &r->head_len) != 0)
        return src_violation(s, "cannot encode HELLO_OK", orb_last_error());
    atomic_fetch_add(&tp->authed_conns, 1);
    s->authed = 1;
    stranger_remove(s);
    s->migrate = 1;
    s->sender = hello.sender;
    src_tx_push(s);
    return 0;
}

static int src_describe(struct tcp_source_conn *s, uint64_t tag)
{
    struct orb_region_desc *regions = NULL;
    size_t count = 0;
    int rc = orb_registry_describe_remote(orb_engine_registry(s->tp->engine), &regions, &count);
    if (rc != 0)
        return src_tx_failure(s, tag, rc);
    if (count > ORB_WIRE_MAX_REGIONS) {
        free(regions);
        return src_tx_error(s, tag, ORB_ERESOURCE, "more remote regions than one DESCRIBE_RESP holds");
    }
    size_t cap = orb_wire_describe_resp_size(count);
    uint8_t *buf = malloc(cap);
    if (buf == NULL) {
        free(regions);
        return src_tx_error(s, tag, ORB_ENOMEM, "out of memory for DESCRIBE_RESP");
    }
    size_t len;
    rc = orb_wire_describe_resp_encode(tag, regions, count, buf, cap, &len);
    free(regions);
    if (rc != 0) {
        free(buf);
        return src_tx_failure(s, tag, rc);
    }
    return src_tx_heap(s, buf, len);
}

/* This frame's piece ends its request (the request counts in the metrics then). */
static int ends_request(const struct orb_wire_xfer *req)
{
    return req->addr + req->length == req->request_addr + req->request_length;
}

static int src_read(struct tcp_source_conn *s, const uint8_t *body, size_t len)
{
    struct orb_wire_xfer req;
    if (orb_wire_xfer_decode(ORB_WIRE_READ_REQ, body, len, &req) != 0)
        return src_violation(s, "malformed READ_REQ", orb_last_error());
    tcp_rx_note_payload(&s->base, 0);
    struct orb_reg *pin;
    uint8_t *mem;
    void *loan = NULL;
    int rc = src_pin(s, &req, ORB_PERM_REMOTE_READ, &pin, &loan, &mem);
    orb_engine_count_served(s->tp->engine, ORB_TRANSPORT_TCP, ORB_OP_READ, req.length, ends_request(&req), rc);
    if (rc != 0)
        return src_tx_failure(s, s->hdr.tag, rc);
    struct src_resp *r = src_tx_slot(s);
    rc = orb_wire_xfer_encode(ORB_WIRE_READ_RESP, s->hdr.tag, &req, r->head_buf,
                              sizeof r->head_buf, &r->head_len);
    if (rc != 0) {
        src_unpin(s, &pin, &loan);
        return src_violation(s, "cannot encode READ_RESP", orb_last_error());
    }
    r->payload = mem;
    r->payload_len = req.length;
    r->payload_addr = req.addr;
    r->tag = s->hdr.tag;
    r->pin = pin;
    r->loan = loan;
    r->lent_range = loan != NULL;
    src_tx_push(s);
    return 0;
}

static int src_write(struct tcp_source_conn *s, const uint8_t *body, size_t len)
{
    struct orb_wire_xfer req;
    if (orb_wire_xfer_decode(ORB_WIRE_WRITE_REQ, body, len, &req) != 0)
        return src_violation(s, "malformed WRITE_REQ", orb_last_error());
    s->rx_len = req.length;
    s->rx_off = 0;
    s->rx_ends_request = ends_request(&req);
    tcp_rx_note_payload(&s->base, req.length);
    int rc = src_pin(s, &req, ORB_PERM_REMOTE_WRITE, &s->rx_pin, &s->rx_loan, &s->rx_mem);
    if (rc != 0) {
        /* Drain the payload without touching registered memory, then answer. */
        s->refused_status = rc;
        s->refused_effect_unknown = 0;
        snprintf(s->refused_text, sizeof s->refused_text, "%s", orb_last_error());
        s->rx_state = SRX_DISCARD;
        return 0;
    }
    s->rx_addr = req.addr;
    s->rx_stage_from = 0;
    s->rx_state = SRX_PAYLOAD;
    return 0;
}

static int src_notify(struct tcp_source_conn *s, const uint8_t *body, size_t len)
{
    struct orb_wire_notify m;
    if (orb_wire_notify_decode(body, len, &m) != 0)
        return src_violation(s, "malformed NOTIFY", orb_last_error());
    int rc = orb_engine_deliver_notification(s->tp->engine, &s->sender, m.data, m.length);
    if (rc != 0)
        return src_tx_failure(s, s->hdr.tag, rc);
    return src_tx_empty(s, ORB_WIRE_NOTIFY_RESP, s->hdr.tag);
}

/* Another transport's control message: answered by this engine's same transport, at once. */
static int src_control(struct tcp_source_conn *s, const uint8_t *body, size_t len)
{
    uint64_t tag = s->hdr.tag;
    struct orb_wire_control m;
    if (orb_wire_control_decode(body, len, &m) != 0)
        return src_violation(s, "malformed CONTROL_REQ", orb_last_error());
    uint8_t answer[ORB_WIRE_MAX_CONTROL];
    size_t answer_len = 0;
    int rc = orb_engine_control(s->tp->engine, m.transport, &s->sender, m.data, m.length, answer, sizeof answer,
                                &answer_len);
    if (rc != 0)
        return src_tx_failure(s, tag, rc);
    if (answer_len == 0 || answer_len > sizeof answer)
        return src_tx_error(s, tag, ORB_EPROTO, "the transport gave an empty or oversized answer");
    size_t cap = ORB_WIRE_HEADER_LEN + 4u + answer_len;
    uint8_t *buf = malloc(cap);
    if (buf == NULL)
        return src_tx_error(s, tag, ORB_ENOMEM, "out of memory for CONTROL_RESP");
    struct orb_wire_control a = {.transport = m.transport, .length = (uint32_t)answer_len, .data = answer};
    size_t out_len = 0;
    rc = orb_wire_control_encode(ORB_WIRE_CONTROL_RESP, tag, &a, buf, cap, &out_len);
    if (rc != 0) {
        free(buf);
        return src_tx_failure(s, tag, rc);
    }
    return src_tx_heap(s, buf, out_len);
}

/* The frame header just decoded may start here. 0 or ORB_EPROTO (logged). A fenced source
 * never gets here: src_rx_step stops reading before the next header. */
static int src_admit_frame(struct tcp_source_conn *s)
{
    uint8_t type = s->hdr.type;
    char detail[64];
    snprintf(detail, sizeof detail, "%s (type %u)", orb_wire_type_name(type), (unsigned)type);
    if (!s->authed && type != ORB_WIRE_HELLO)
        return src_violation(s, "frame before HELLO", detail);
    if (s->authed && type == ORB_WIRE_HELLO)
        return src_violation(s, "second HELLO", "");
    if (type != ORB_WIRE_HELLO && type != ORB_WIRE_DESCRIBE_REQ && type != ORB_WIRE_READ_REQ &&
        type != ORB_WIRE_WRITE_REQ && type != ORB_WIRE_NOTIFY && type != ORB_WIRE_CONTROL_REQ)
        return src_violation(s, "not a request", detail);
    if (s->hdr.body_len > TCP_RX_STAGE - ORB_WIRE_HEADER_LEN)
        return src_violation(s, "oversized body", detail); /* the codec's limits are tighter */
    return 0;
}

/* Serve the request whose body is staged. */
static int src_dispatch(struct tcp_source_conn *s, const uint8_t *body, size_t len)
{
    s->rx_state = SRX_HEADER;
    switch (s->hdr.type) {
    case ORB_WIRE_HELLO: return src_hello(s, body, len);
    case ORB_WIRE_DESCRIBE_REQ: return src_describe(s, s->hdr.tag);
    case ORB_WIRE_READ_REQ: return src_read(s, body, len);
    case ORB_WIRE_WRITE_REQ: return src_write(s, body, len);
    case ORB_WIRE_NOTIFY: return src_notify(s, body, len);
    case ORB_WIRE_CONTROL_REQ: return src_control(s, body, len);
    default: return src_violation(s, "not a request", "");
    }
}

/* A staged WRITE that cannot go on (`what`: "copying" or "staging" its bytes failed with `rc`):
 * some of it may be in memory already, so the rest is drained and the answer says the effect is
 * unknown. The connection lives on. */
static void src_stage_write_fails(struct tcp_source_conn *s, int rc, const char *what)
{
    snprintf(s->refused_text, sizeof s->refused_text, "%s the WRITE's bytes to %s memory failed: %s", what,
             s->rx_pin->kind->name, orb_last_error());
    ORB_LOGW("tcp source: %s: %s", s->base.name, s->refused_text);
    s->refused_status = rc;
    s->refused_effect_unknown = 1;
    src_unpin(s, &s->rx_pin, &s->rx_loan);
    s->rx_state = SRX_DISCARD;
}

/* Copy the WRITE payload's staged chunk into its memory. A failure turns the rest of the payload
 * into a discard (SRX_DISCARD), answered with an ERROR whose effect is unknown. */
static void src_stage_write(struct tcp_source_conn *s)
{
    const struct orb_reg *pin = s->rx_pin;
    uint64_t len = s->rx_off - s->rx_stage_from;
    bool held = false;
    int rc = pin->kind->from_host(pin, s->rx_addr + s->rx_stage_from, s->rx_stage, (size_t)len, &held);
    if (rc == 0) {
        s->rx_stage_from = s->rx_off;
        return;
    }
    struct orb_stage_pool *pool = orb_engine_stage_pool(s->tp->engine);
    if (held)
        orb_stage_pool_keep(pool, pin, s->rx_stage); /* the device may still read it: never reused */
    else
        orb_stage_pool_put(pool, s->rx_stage);
    s->rx_stage = NULL;
    src_stage_write_fails(s, rc, "copying");
}

/* Receive into the payload target. 1 when the payload is complete, 0 blocked, negative status. */
static int src_rx_payload(struct tcp_source_conn *s, int discard)
{
    while (s->rx_off < s->rx_len) {
        uint64_t left = s->rx_len - s->rx_off;
        uint8_t *dst;
        if (!discard && s->rx_state == SRX_DISCARD)
            discard = 1; /* a staged copy failed: the rest is drained */
        bool staged = !discard && s->rx_mem == NULL;
        if (discard) {
            dst = s->base.worker->scratch;
            if (left > TCP_SCRATCH_LEN)
                left = TCP_SCRATCH_LEN;
        } else if (staged) {
            int rc = s->rx_stage == NULL ? src_stage_take(s, s->rx_pin, &s->rx_stage) : 0;
            if (rc == ORB_EAGAIN)
                return 0; /* poked when a chunk comes back; the payload waits in the socket */
            if (rc != 0) {
                src_stage_write_fails(s, rc, "staging");
                continue; /* the rest is drained */
            }
            uint64_t in_chunk = s->rx_off - s->rx_stage_from;
            dst = s->rx_stage + in_chunk;
            if (left > ORB_STAGE_CHUNK - in_chunk)
                left = ORB_STAGE_CHUNK - in_chunk;
        } else {
            dst = s->rx_mem + s->rx_off;
        }
        if (tcp_rx_empty(&s->base))
            tcp_rx_lowat(&s->base, s->rx_len - s->rx_off);
        ssize_t n = tcp_rx_into(&s->base, dst, (size_t)left);
        if (n == 0 && staged) {
            /* The peer has sent no more for now, and may never: what the chunk holds goes in,
             * and the chunk goes back. */
            if (s->rx_off > s->rx_stage_from)
                src_stage_write(s);
            orb_stage_pool_put(orb_engine_stage_pool(s->tp->engine), s->rx_stage);
            s->rx_stage = NULL;
        }
        if (n <= 0)
            return (int)n;
        s->rx_off += (uint64_t)n;
        if (staged && (s->rx_off - s->rx_stage_from == ORB_STAGE_CHUNK || s->rx_off == s->rx_len))
            src_stage_write(s);
    }
    return 1;
}

/* One step of receiving. 1 progressed, 0 blocked, negative: close. */
static int src_rx_step(struct tcp_source_conn *s)
{
    int rc;
    switch (s->rx_state) {
    case SRX_HEADER:
        /* A new frame needs a free slot for its answer, room for built answers, an open
         * source, and no HELLO answer or refusal still waiting to go out (those change what
         * comes next). */
        if (s->tx_count == SRC_TX_SLOTS || s->tx_heap_bytes >= SRC_TX_HEAP_MAX || s->closing || s->migrate ||
            !tcp_source_admits(s->tp))
            return 0;
        rc = tcp_rx_need(&s->base, ORB_WIRE_HEADER_LEN);
        if (rc <= 0)
            return rc;
        if (orb_wire_header_decode(tcp_rx_peek(&s->base), &s->hdr) != 0)
            return src_violation(s, "bad frame header", orb_last_error());
        rc = src_admit_frame(s);
        if (rc != 0)
            return rc;
        tcp_rx_consume(&s->base, ORB_WIRE_HEADER_LEN);
        s->rx_state = SRX_BODY;
        return 1;
    case SRX_BODY: {
        rc = tcp_rx_need(&s->base, s->hdr.body_len);
        if (rc <= 0)
            return rc;
        const uint8_t *body = tcp_rx_peek(&s->base);
        /* Consuming only moves indices: `body` stays valid until the next receive. */
        tcp_rx_consume(&s->base, s->hdr.body_len);
        rc = src_dispatch(s, body, s->hdr.body_len);
        return rc < 0 ? rc : 1;
    }
    case SRX_PAYLOAD:
        rc = src_rx_payload(s, 0);
        if (rc <= 0)
            return rc;
        if (s->rx_state == SRX_DISCARD) { /* a staged copy failed on the way */
            s->rx_state = SRX_HEADER;
            orb_engine_count_served(s->tp->engine, ORB_TRANSPORT_TCP, ORB_OP_WRITE, 0, 0, s->refused_status);
            rc = src_tx_error_effect(s, s->hdr.tag, s->refused_status, s->refused_effect_unknown, s->refused_text);
            return rc < 0 ? rc : 1;
        }
        src_unpin(s, &s->rx_pin, &s->rx_loan);
        orb_stage_pool_put(orb_engine_stage_pool(s->tp->engine), s->rx_stage);
        s->rx_stage = NULL;
        orb_engine_count_served(s->tp->engine, ORB_TRANSPORT_TCP, ORB_OP_WRITE, s->rx_len, s->rx_ends_request, 0);
        s->rx_mem = NULL;
        s->rx_state = SRX_HEADER;
        rc = src_tx_empty(s, ORB_WIRE_WRITE_RESP, s->hdr.tag);
        return rc < 0 ? rc : 1;
    case SRX_DISCARD:
        rc = src_rx_payload(s, 1);
        if (rc <= 0)
            return rc;
        s->rx_state = SRX_HEADER;
        orb_engine_count_served(s->tp->engine, ORB_TRANSPORT_TCP, ORB_OP_WRITE, 0, 0, s->refused_status);
        rc = src_tx_error_effect(s, s->hdr.tag, s->refused_status, s->refused_effect_unknown, s->refused_text);
        return rc < 0 ? rc : 1;
    }
    return ORB_EPROTO;
}

/* Fenced, with every answer out and no frame half received: the connection is done. Requests
 * still staged were never started. */
static int src_fenced_done(const struct tcp_source_conn *s)
{
    return !tcp_source_admits(s->tp) && s->tx_count == 0 && s->rx_state == SRX_HEADER;
}

/* Close after a failed step, logging why unless it was an orderly end. */
static void src_fail(struct tcp_source_conn *s, int status)
{
    if (status == ORB_EPROTO) {
        tcp_source_conn_kill(s, "protocol violation");
    } else if (src_idle(s)) {
        tcp_source_conn_kill(s, orb_last_error());
    } else {
        ORB_LOGW("tcp source: closing %s in the middle of a message: %s", s->base.name,
                 orb_last_error());
        tcp_source_conn_kill(s, "truncated message");
    }
}

/* The connection completed HELLO on worker 0: give it to its own worker. Returns 1 when it
 * left this worker (do not touch it any more). */
static int src_migrate(struct tcp_source_conn *s)
{
    s->migrate = 0;
    struct tcp_worker *to = tcp_next_worker(s->tp);
    if (to == s->base.worker)
        return 0;
    tcp_worker_forget(s->base.worker, &s->base);
    s->base.serve_on_adopt = 1; /* pipelined requests may be staged already */
    if (tcp_worker_handover(to, &s->base) != 0) {
        s->base.worker = NULL;
        tcp_source_conn_kill(s, "the transport is stopping");
    }
    return 1;
}

static void src_progress(struct tcp_source_conn *s)
{
    for (;;) {
        /* Take in every request that can be answered now, then send all answers at once. */
        int rc;
        while ((rc = src_rx_step(s)) > 0) {
        }
        if (rc < 0) {
            src_fail(s, rc);
            return;
        }
        unsigned queued = s->tx_count;
        int heap_full = s->tx_heap_bytes >= SRC_TX_HEAP_MAX;
        rc = src_tx(s);
        if (rc < 0) {
            src_fail(s, rc);
            return;
        }
        if (s->tx_count == 0) {
            if (s->closing) {
                tcp_source_conn_kill(s, "refused HELLO");
                return;
            }
            if (s->migrate && src_migrate(s))
                return;
            if (src_fenced_done(s)) {
                tcp_source_conn_kill(s, "the source is closed");
                return;
            }
        }
        /* Reading stopped for a full queue (or built answers) that has drained since, or for
         * a HELLO answer now out: read on, within the turn. */
        int freed = (s->tx_count < queued && queued == SRC_TX_SLOTS) ||
                    (heap_full && s->tx_heap_bytes < SRC_TX_HEAP_MAX);
        int unblocked = queued > 0 && s->tx_count == 0;
        if (!(freed || unblocked) || tcp_turn_room(&s->base) == 0)
            break;
    }
    if (tcp_turn_room(&s->base) == 0)
        tcp_worker_defer(s->base.worker, &s->base);
}

void tcp_source_conn_on_event(struct tcp_source_conn *s, uint32_t events)
{
    tcp_conn_rx_event(&s->base, events);
    if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
        s->can_send = 1;
    src_progress(s);
}

void tcp_source_conn_scan(struct tcp_source_conn *s, uint64_t now)
{
    if (src_fenced_done(s)) {
        tcp_source_conn_kill(s, "the source is closed");
        return;
    }
    if (s->stranger) {
        /* A deadline, not a progress timer: trickling bytes does not extend it. */
        if (now > s->accepted_ns && now - s->accepted_ns > s->tp->hello_timeout_ns) {
            ORB_LOGI("tcp source: closing %s: no HELLO within %llu ms", s->base.name,
                     (unsigned long long)(s->tp->hello_timeout_ns / 1000000u));
            tcp_source_conn_kill(s, "HELLO deadline");
        }
        return;
    }
    uint64_t timeout = s->tp->io_timeout_ns;
    uint64_t last = atomic_load_explicit(&s->base.last_progress_ns, memory_order_relaxed);
    if (timeout != 0 && !src_idle(s) && now > last && now - last > timeout) {
        ORB_LOGW("tcp source: closing %s: no progress for %llu s", s->base.name,
                 (unsigned long long)(timeout / ORB_NS_PER_SEC));
        tcp_source_conn_kill(s, "io timeout");
    }
}

/* ---- listener -------------------------------------------------------------------------------- */

int tcp_source_listen(struct tcp_transport *tp)
{
    const struct orb_engine_config *cfg = orb_engine_cfg(tp->engine);
    int rc = tcp_listen(cfg->endpoint, tp->socket_buffer, &tp->listen_fd, tp->endpoint,
                        sizeof tp->endpoint);
    if (rc != 0)
        return rc;
    struct tcp_worker *w = &tp->workers[0];
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.ptr = &tp->listen_kind};
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, tp->listen_fd, &ev) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "cannot watch the listener: %s", strerror(errno));
    return 0;
}

void tcp_listener_close(struct tcp_transport *tp)
{
    if (tp->listen_fd < 0)
        return;
    (void)epoll_ctl(tp->workers[0].epfd, EPOLL_CTL_DEL, tp->listen_fd, NULL);
    close(tp->listen_fd);
    tp->listen_fd = -1;
}

/* A new connection is a stranger on worker 0 until it completes HELLO. Strangers draw from their
 * own budget, never from max_connections: when it is full, the oldest stranger makes room. The
 * connection is served at once, since a good peer's HELLO is usually waiting already. */
static void src_accept_one(struct tcp_worker *w, int fd, const char *name)
{
    struct tcp_transport *tp = w->tp;
    if (!tcp_source_admits(tp)) {
        close(fd);
        return;
    }
    while (tp->nstrangers >= tp->max_strangers && tp->strangers_head != NULL) {
        /* Before the oldest stranger goes, it gets one more turn with what it has sent: a good
         * peer whose HELLO is waiting in its socket completes it and stops being a stranger. */
        struct tcp_source_conn *oldest = tp->strangers_head;
        oldest->base.can_recv = 1;
        w->turn_left = TCP_TURN_BYTES;
        src_progress(oldest); /* may authenticate it, or close it */
        if (tp->strangers_head != oldest)
            continue;
        ORB_LOGD("tcp source: dropping %s, the oldest of %u connections without HELLO, for %s",
                 oldest->base.name, tp->nstrangers, name);
        tcp_source_conn_kill(oldest, "the unauthenticated budget is full");
    }
    struct tcp_source_conn *s = calloc(1, sizeof *s);
    if (s == NULL) {
        ORB_LOGW("tcp source: refusing %s: out of memory", name);
        close(fd);
        return;
    }
    tcp_conn_init(&s->base, TCP_KIND_SOURCE, fd, name);
    s->tp = tp;
    s->can_send = 1;
    s->rx_state = SRX_HEADER;
    s->stage_waiter.wake = src_stage_wake;
    s->accepted_ns = orb_now_ns();
    tcp_socket_tune(fd, tp->socket_buffer);
    atomic_fetch_add(&tp->source_conns, 1);
    stranger_add(s);
    (void)tcp_worker_adopt_now(w, &s->base);
}

void tcp_listener_on_event(struct tcp_worker *w)
{
    struct tcp_transport *tp = w->tp;
    tp->listen_more = 0;
    for (unsigned n = 0; tp->listen_fd >= 0; n++) {
        if (n == TCP_ACCEPT_BATCH) {
            tp->listen_more = 1; /* the other connections' events first */
            return;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(tp->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                ORB_LOGW("tcp source: accept failed: %s", strerror(errno));
            /* EMFILE and friends: try again at the next event or scan rather than spin. */
            return;
        }
        char name[TCP_NAME_MAX];
        tcp_format_addr(&ss, name, sizeof name);
        src_accept_one(w, fd, name);
    }
}
