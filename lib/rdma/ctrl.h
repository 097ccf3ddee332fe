/* Internal: the RDMA transport's own messages.
 *
 *  - On the TCP control connection (wire CONTROL_REQ/CONTROL_RESP, transport 2): CONNECT and
 *    CONNECT_OK (each end's queue-pair address per rail), GRANT_REQ and GRANT (for each of up
 *    to ORB_RDMA_GRANT_BATCH requests, a one-use window key per rail for exactly its range and
 *    direction, or the refusal and its cause), DISCONNECT, and PING (whether the source process
 *    still answers, asked after its device refused an access to a window it granted), PIN and
 *    UNPIN (a whole request's range held across its slots), and PGRANT_REQ and PGRANT (a
 *    private grant: device memory a source lends on queue pairs and a memory region of that
 *    grant alone, never a window).
 *  - On the queue pairs themselves: the requester's BINDING, the 141-byte body of the
 *    SEND_WITH_INV that ends a grant on one rail, and the source's ACK, the SEND that says
 *    which grants are over (up to ORB_RDMA_ACKS_MAX) and their requests may complete.
 *
 * Every control message starts u8 kind | u8 version | u16 0. Little-endian, packed, every length
 * and count checked against fixed maxima before use; decoders never read past `len` and fail
 * closed with ORB_EPROTO naming the field. Documented in docs/wire-protocol.md. */
#ifndef ORB_RDMA_CTRL_H
#define ORB_RDMA_CTRL_H

#include <stddef.h>
#include <stdint.h>

#include <stdbool.h>

#include <orbite/orbite.h>

#include "rdma/qp.h"

#define ORB_RDMA_CTRL_VERSION 11u
#define ORB_RDMA_MAX_RAILS 16u        /* rails, and queue pairs per connection */
#define ORB_RDMA_NONCE_LEN 32u
#define ORB_RDMA_GRANT_BATCH 16u      /* requests one GRANT_REQ carries at most */
/* A staging source's slot: 2^shift bytes, the most one grant of staged memory moves there. */
#define ORB_RDMA_SLOT_SHIFT_MIN 12u   /* 4 KiB */
#define ORB_RDMA_SLOT_SHIFT_MAX 40u   /* 1 TiB */
#define ORB_RDMA_WHY_MAX 120u         /* bytes of a refusal's cause in a GRANT */
#define ORB_RDMA_BINDING_LEN 141u
#define ORB_RDMA_ACK_ENTRY_LEN 24u
#define ORB_RDMA_ACKS_MAX 8u          /* grants one ACK ends at most */
#define ORB_RDMA_ACKS_LEN(n) (8u + ORB_RDMA_ACK_ENTRY_LEN * (n))
#define ORB_RDMA_ACK_LEN ORB_RDMA_ACKS_LEN(1u)                   /* 32: one grant */
#define ORB_RDMA_ACKS_LEN_MAX ORB_RDMA_ACKS_LEN(ORB_RDMA_ACKS_MAX) /* 200 */
#define ORB_RDMA_BINDING_MAGIC 0x4242524Fu /* "ORBB" */
#define ORB_RDMA_ACK_MAGIC 0x4142524Fu     /* "ORBA" */

enum orb_rdma_ctrl_kind {
    ORB_RDMA_CONNECT = 1,
    ORB_RDMA_CONNECT_OK = 2,
    ORB_RDMA_GRANT_REQ = 3,
    ORB_RDMA_GRANT = 4,
    ORB_RDMA_DISCONNECT = 5,          /* requester -> source, and the source's echo */
    ORB_RDMA_PING = 6,                /* requester -> source, and the source's echo: is it alive */
    ORB_RDMA_PIN = 7,                 /* requester -> source: hold a whole request's range */
    ORB_RDMA_PINNED = 8,              /* source -> requester: the pin, or why not */
    ORB_RDMA_UNPIN = 9,               /* requester -> source: the request ended */
    ORB_RDMA_UNPINNED = 10,           /* source -> requester */
    ORB_RDMA_PGRANT_REQ = 11,         /* requester -> source: a private grant, with its queue pairs */
    ORB_RDMA_PGRANT = 12,             /* source -> requester: the private grant, or why not */
};

#define ORB_RDMA_MAX_PINS 16u         /* pins a connection holds at once at the source */

struct orb_rdma_rail_addr {
    uint8_t nic;                      /* the sender's NIC slot (for logs and stats), < 64 */
    bool unconnected;                 /* the sender does not connect this queue pair (its port is
                                       * down, or connecting it failed): nothing may use it */
    struct orb_rdma_qp_addr qp;
};

#define ORB_RDMA_RAIL_UNCONNECTED 0x80u /* in a queue pair's NIC byte */

/* CONNECT / CONNECT_OK: u64 incarnation | u8 nqps | u8 read_depth | u8 lanes | u8 0 | nqps x
 * (u8 nic | u8 mtu | u16 lid | u32 qpn | u32 psn | 16 gid), the NIC byte's bit 7
 * ORB_RDMA_RAIL_UNCONNECTED, bit 6 zero. A connection is `lanes` sets of one
 * queue pair per rail, lane by lane: queue pair j * (nqps / lanes) + k is lane j's of rail k
 * (lanes: 1..nqps, dividing it). read_depth: the fewest RDMA READs any of the sender's queue
 * pairs answers at once (0: not stated); decoded into every queue pair's qp.read_depth. */
struct orb_rdma_connect {
    uint64_t incarnation;             /* the requester's: names this set of queue pairs */
    uint32_t nqps;                    /* 1..ORB_RDMA_MAX_RAILS */
    uint32_t lanes;                   /* 1..nqps, a divisor of it */
    struct orb_rdma_rail_addr qps[ORB_RDMA_MAX_RAILS];
};

/* GRANT_REQ: u64 incarnation | u8 count (1..ORB_RDMA_GRANT_BATCH) | 3 x u8 0 | count x
 * (u64 request | u8 op | u8 pin | u16 pin_generation | u32 rail_mask | u64 addr | u64 length):
 * several requests of one connection granted in one round trip. */
struct orb_rdma_grant_ask {
    uint64_t request;                 /* the requester's id for the request */
    uint8_t op;                       /* ORB_OP_READ or ORB_OP_WRITE: the peer's access */
    uint8_t pin;                      /* 0, or a slot of a pinned request: its pin (1..16) */
    uint16_t pin_generation;          /* with a pin: its generation (non-zero); else 0 */
    uint32_t rail_mask;               /* rails that carry slices: non-zero, below ORB_RDMA_MAX_RAILS */
    uint64_t addr, length;            /* the whole request's remote range: length > 0, no overflow */
};

struct orb_rdma_grant_req {
    uint64_t incarnation;             /* the requester's connection */
    uint32_t count;
    struct orb_rdma_grant_ask ask[ORB_RDMA_GRANT_BATCH];
};

/* GRANT: u8 count | 3 x u8 0 | count x entry, one per GRANT_REQ request in its order. An entry:
 *   granted:  i32 0 | u8 nkeys (1..16) | 3 x u8 0 | u64 grant | u64 generation | 32 nonce |
 *             u64 target | nkeys x u32 rkey (non-zero, in rail_mask order)
 *   refused:  i32 status (an ORB_E* code) | u8 why_len (0..ORB_RDMA_WHY_MAX) | u8 hint |
 *             u16 lost_qps | why_len printable ASCII bytes: the cause
 * hint is 0; or, with ORB_ERESOURCE only, ORB_RDMA_SLOT_SHIFT_MIN..MAX: the source stages the
 * range in slots of 2^hint bytes, fewer than were asked for, and each grant may move one; or,
 * with ORB_EUNAVAILABLE only, ORB_RDMA_HINT_PRIVATE: the range is device memory the source
 * grants only on queue pairs of the grant's own (PGRANT_REQ). */
#define ORB_RDMA_HINT_PRIVATE 0xffu
struct orb_rdma_grant {
    int32_t status;                   /* 0: granted; else why not */
    char why[ORB_RDMA_WHY_MAX + 1];   /* a refusal's cause, NUL-terminated */
    uint32_t lost_qps;                /* a refusal with ORB_EPEER only (else 0): the asked queue
                                       * pairs that are dead at the source (their places in the
                                       * connection); nothing was granted */
    uint32_t slot_shift;              /* a refusal with ORB_ERESOURCE only (else 0): the source's
                                       * staging slot is 2^slot_shift bytes, less than the length
                                       * asked for; ask again slot by slot */
    bool private_only;                /* a refusal with ORB_EUNAVAILABLE only: ask again with
                                       * PGRANT_REQ (hint ORB_RDMA_HINT_PRIVATE) */
    uint64_t grant, generation;
    uint8_t nonce[ORB_RDMA_NONCE_LEN];
    uint64_t target;                  /* where the windows start: the request's first byte there
                                         (its own address, or a staging extent's) */
    uint32_t nkeys;                   /* the popcount of the request's rail_mask */
    uint32_t rkeys[ORB_RDMA_MAX_RAILS];
};

struct orb_rdma_grants {
    uint32_t count;
    struct orb_rdma_grant g[ORB_RDMA_GRANT_BATCH];
};

/* BINDING (141 bytes): u32 magic | u8 version | u8 kind (1) | u16 rail | 16 requester epoch |
 * 16 source epoch | u64 incarnation | u64 request | u64 grant | u64 generation | 32 nonce |
 * u64 addr | u64 length | u32 rkey | u8 op | u32 rail_wrs | u64 rail_bytes | u32 0 */
struct orb_rdma_binding {
    uint16_t rail;
    struct orb_epoch requester, source;
    uint64_t incarnation, request, grant, generation;
    uint8_t nonce[ORB_RDMA_NONCE_LEN];
    uint64_t addr, length;
    uint32_t rkey;
    uint8_t op;
    uint32_t rail_wrs;                /* payload WRs the requester posted on this rail */
    uint64_t rail_bytes;              /* payload bytes they moved */
};

/* ACK (8 + 24 x count bytes): u32 magic | u8 version | u8 kind (2) | u16 count (1 to
 * ORB_RDMA_ACKS_MAX) | count x (u64 request | u64 grant | i32 status | u32 0): the ends of
 * grants of one connection, in one SEND. */
struct orb_rdma_ack {
    uint64_t request, grant;
    int32_t status;                   /* 0, or the negative ORB_E* the source ended the grant with */
};

/* PIN: u64 incarnation | u64 request | u8 op | 7 x u8 0 | u64 addr | u64 length (44 bytes in
 * all): hold [addr, +length) with the op's permission for the request's slots. */
struct orb_rdma_pin_req {
    uint64_t incarnation, request;
    uint8_t op;
    uint64_t addr, length;            /* length > 0, no overflow */
};

/* PINNED: i32 status | u8 pin | u8 slot_shift | u16 generation | u8 why_len | 3 x u8 0 | why.
 * Held: status 0, pin 1..ORB_RDMA_MAX_PINS, generation non-zero, slot_shift 0 (the source does
 * not stage the range) or ORB_RDMA_SLOT_SHIFT_MIN..MAX, no cause. Refused: an ORB_E* status,
 * the rest 0 but the cause (printable, at most ORB_RDMA_WHY_MAX). */
struct orb_rdma_pinned {
    int32_t status;
    uint32_t pin, slot_shift, generation;
    char why[ORB_RDMA_WHY_MAX + 1];
};

/* UNPIN: u64 incarnation | u8 pin (1..16) | u8 0 | u16 generation (non-zero) | u32 0 (20 bytes).
 * UNPINNED: i32 status (0 or an ORB_E* code) | u32 0 (12 bytes). */
struct orb_rdma_unpin {
    uint64_t incarnation;
    uint32_t pin, generation;
};

/* PGRANT_REQ: u64 incarnation | u64 request | u8 op | u8 nqps (1..16) | u8 pin | u8 0 |
 * u16 pin_generation | u16 0 | u32 rail_mask | u64 addr | u64 length | nqps x (u8 0 | u8 mtu |
 * u16 lid | u32 qpn | u32 psn | 16 gid), 48 + 28 x nqps bytes: a private grant for one request (or
 * one slot of a pinned request: its pin and generation, as in GRANT_REQ) on `rail_mask` of the
 * connection (as GRANT_REQ's; nqps is its popcount), the requester's queue pair for each of those
 * rails in mask order, made for this grant alone. */
struct orb_rdma_pgrant_req {
    uint64_t incarnation, request;
    uint8_t op;
    uint8_t pin;                      /* 0, or 1..ORB_RDMA_MAX_PINS */
    uint16_t pin_generation;          /* non-zero exactly with a pin */
    uint32_t rail_mask;
    uint64_t addr, length;            /* length > 0, no overflow */
    uint32_t nqps;
    struct orb_rdma_qp_addr qps[ORB_RDMA_MAX_RAILS];
};

/* PGRANT: granted: i32 0 | u8 nqps | 3 x u8 0 | u64 grant | u64 generation | 32 nonce | u64 target
 * | nqps x (u32 rkey | u8 0 | u8 mtu | u16 lid | u32 qpn | u32 psn | 16 gid): for each rail the
 * source's queue pair, on a protection domain of this grant alone, and the key of the memory
 * region that holds exactly the range there with the op's access only. Refused: i32 status | u8
 * why_len | 3 x u8 0 | why (printable, at most ORB_RDMA_WHY_MAX). */
/* What a PGRANT's keys are: the regions of the grant's own protection domains (ended by a plain
 * SEND), or one-use memory windows bound through the grant's own queue pairs (ended by
 * SEND_WITH_INV, as a GRANT's). */
#define ORB_RDMA_PGRANT_REGIONS 0u
#define ORB_RDMA_PGRANT_WINDOWS 1u

struct orb_rdma_pgrant {
    int32_t status;
    char why[ORB_RDMA_WHY_MAX + 1];
    uint32_t slot_shift;              /* a refusal with ORB_ERESOURCE only (else 0), as GRANT's */
    uint8_t keys;                     /* ORB_RDMA_PGRANT_REGIONS or _WINDOWS (status 0) */
    uint64_t grant, generation;
    uint8_t nonce[ORB_RDMA_NONCE_LEN];
    uint64_t target;
    uint32_t nqps;
    uint32_t rkeys[ORB_RDMA_MAX_RAILS];
    struct orb_rdma_qp_addr qps[ORB_RDMA_MAX_RAILS];
};

/* The kind of a control message, or ORB_EPROTO (short, wrong version, reserved bytes). */
int orb_rdma_ctrl_kind(const uint8_t *buf, size_t len, uint8_t *kind_out);

/* Encoders write into `out` (capacity `cap`), set *len_out, and return 0 or ORB_EINVAL (a field
 * out of range, too small a buffer). Decoders return 0 or ORB_EPROTO. */
int orb_rdma_connect_encode(uint8_t kind, const struct orb_rdma_connect *m, uint8_t *out, size_t cap,
                            size_t *len_out);
int orb_rdma_connect_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_rdma_connect *m);
int orb_rdma_grant_req_encode(const struct orb_rdma_grant_req *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_grant_req_decode(const uint8_t *buf, size_t len, struct orb_rdma_grant_req *m);
/* A GRANT's encoder cuts each refusal's cause to ORB_RDMA_WHY_MAX bytes (non-printable bytes
 * become '?'); the decoder refuses an unknown status or a non-printable cause. */
int orb_rdma_grants_encode(const struct orb_rdma_grants *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_grants_decode(const uint8_t *buf, size_t len, struct orb_rdma_grants *m);
/* DISCONNECT: u64 incarnation (12 bytes in all). */
int orb_rdma_disconnect_encode(uint64_t incarnation, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_disconnect_decode(const uint8_t *buf, size_t len, uint64_t *incarnation);
/* PING: u64 nonce (12 bytes in all); the source answers with the same message. */
int orb_rdma_ping_encode(uint64_t nonce, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_ping_decode(const uint8_t *buf, size_t len, uint64_t *nonce);
int orb_rdma_pin_encode(const struct orb_rdma_pin_req *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_pin_decode(const uint8_t *buf, size_t len, struct orb_rdma_pin_req *m);
int orb_rdma_pinned_encode(const struct orb_rdma_pinned *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_pinned_decode(const uint8_t *buf, size_t len, struct orb_rdma_pinned *m);
int orb_rdma_unpin_encode(const struct orb_rdma_unpin *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_unpin_decode(const uint8_t *buf, size_t len, struct orb_rdma_unpin *m);
int orb_rdma_unpinned_encode(int32_t status, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_unpinned_decode(const uint8_t *buf, size_t len, int32_t *status);
int orb_rdma_pgrant_req_encode(const struct orb_rdma_pgrant_req *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_pgrant_req_decode(const uint8_t *buf, size_t len, struct orb_rdma_pgrant_req *m);
/* The GRANT_REQ entry that asks for what *m asks for (its range, op, pin and rails; not its queue
 * pairs): a private grant is admitted exactly as a shared one. */
struct orb_rdma_grant_ask orb_rdma_pgrant_ask(const struct orb_rdma_pgrant_req *m);
int orb_rdma_pgrant_encode(const struct orb_rdma_pgrant *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_rdma_pgrant_decode(const uint8_t *buf, size_t len, struct orb_rdma_pgrant *m);
/* Exactly ORB_RDMA_BINDING_LEN bytes. */
void orb_rdma_binding_encode(const struct orb_rdma_binding *m, uint8_t out[ORB_RDMA_BINDING_LEN]);
int orb_rdma_binding_decode(const uint8_t *buf, size_t len, struct orb_rdma_binding *m);
/* An ACK of the n (1 to ORB_RDMA_ACKS_MAX, else 0 is returned and nothing written) grants m[]:
 * its length, ORB_RDMA_ACKS_LEN(n). */
size_t orb_rdma_acks_encode(const struct orb_rdma_ack *m, uint32_t n, uint8_t out[ORB_RDMA_ACKS_LEN_MAX]);
/* The ACK of one grant (ORB_RDMA_ACK_LEN bytes). */
void orb_rdma_ack_encode(const struct orb_rdma_ack *m, uint8_t out[ORB_RDMA_ACK_LEN]);
/* An ACK's entries into out[] and their count into *n_out; exactly ORB_RDMA_ACKS_LEN(count)
 * bytes. ORB_EPROTO naming the field otherwise. */
int orb_rdma_acks_decode(const uint8_t *buf, size_t len, struct orb_rdma_ack out[ORB_RDMA_ACKS_MAX], uint32_t *n_out);
/* The length of an ACK this process encoded (from its count), 0 when `msg` is not one. */
size_t orb_rdma_acks_len(const uint8_t *msg, size_t cap);

#endif
