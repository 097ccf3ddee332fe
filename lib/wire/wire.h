/* The OrbiTE wire protocol (TCP control and data): framing and explicit little-endian encoding
 * with a bounds-checked cursor. No I/O here. Documented in docs/wire-protocol.md.
 *
 * A frame is a 24-byte header, then `body_len` bytes of body, then, for READ_RESP and WRITE_REQ
 * only, exactly `length` payload bytes (the body's length field), which the transports move
 * straight between sockets and registered memory. */
#ifndef ORB_WIRE_WIRE_H
#define ORB_WIRE_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <orbite/orbite.h>

#define ORB_WIRE_MAGIC 0x5442524Fu /* "ORBT" as little-endian bytes 'O' 'R' 'B' 'T' */
#define ORB_WIRE_VERSION 5u
#define ORB_WIRE_HEADER_LEN 24u
#define ORB_WIRE_MAX_PAYLOAD (64u << 20)    /* payload bytes after one frame */
#define ORB_WIRE_MAX_REGIONS 65536u         /* entries in one DESCRIBE_RESP */
#define ORB_WIRE_REGION_LEN 24u             /* u64 addr, u64 length, u32 perm, u32 memory_kind */
#define ORB_WIRE_MAX_ERROR_TEXT 256u
#define ORB_WIRE_MAX_CONTROL 4096u          /* payload bytes of one CONTROL_REQ/CONTROL_RESP */
#define ORB_WIRE_MAX_BODY (8u + ORB_WIRE_MAX_REGIONS * ORB_WIRE_REGION_LEN)

enum orb_wire_type {
    ORB_WIRE_HELLO = 1,         /* requester -> source, first frame of every connection */
    ORB_WIRE_HELLO_OK = 2,      /* source -> requester */
    ORB_WIRE_ERROR = 3,         /* source -> requester: failure of the request `tag` (0: connection) */
    ORB_WIRE_DESCRIBE_REQ = 4,
    ORB_WIRE_DESCRIBE_RESP = 5,
    ORB_WIRE_READ_REQ = 6,
    ORB_WIRE_READ_RESP = 7,     /* followed by `length` payload bytes */
    ORB_WIRE_WRITE_REQ = 8,     /* followed by `length` payload bytes */
    ORB_WIRE_WRITE_RESP = 9,
    ORB_WIRE_NOTIFY = 10,
    ORB_WIRE_NOTIFY_RESP = 11,
    ORB_WIRE_CONTROL_REQ = 12,  /* another transport's control request (RDMA connections, grants) */
    ORB_WIRE_CONTROL_RESP = 13,
    ORB_WIRE_TYPE_MAX = 13
};

/* Connection roles announced in HELLO. */
enum orb_wire_role { ORB_WIRE_ROLE_CONTROL = 0, ORB_WIRE_ROLE_DATA = 1 };

struct orb_wire_header {
    uint8_t type;      /* enum orb_wire_type */
    uint32_t body_len; /* bytes of body after the header */
    uint64_t tag;      /* requester-chosen id echoed by the response; 0 for HELLO and HELLO_OK,
                        * non-zero for every other type except ERROR (where 0 means "the
                        * connection"), so that no request can be confused with the connection */
};

/* "HELLO", "READ_REQ", ... for logs; "unknown" for other values. Never NULL. */
const char *orb_wire_type_name(uint8_t type);

/* Layout: u32 magic | u8 version | u8 type | u16 flags (0) | u32 body_len | u32 reserved (0) |
 * u64 tag. Writes exactly ORB_WIRE_HEADER_LEN bytes. */
void orb_wire_header_encode(const struct orb_wire_header *h, uint8_t out[ORB_WIRE_HEADER_LEN]);

/* Decode and validate: magic, version, known type, zero flags and reserved, body_len within the
 * type's exact or maximum body size (DESCRIBE_RESP: 8 + a multiple of ORB_WIRE_REGION_LEN), tag
 * allowed for the type (see struct orb_wire_header). `out` is written only on success.
 * Errors: ORB_EPROTO (message names the field). */
int orb_wire_header_decode(const uint8_t in[ORB_WIRE_HEADER_LEN], struct orb_wire_header *out);

/* Smallest and largest body_len allowed for `type` (0 and 0 for unknown types). */
void orb_wire_body_limits(uint8_t type, uint32_t *min_len, uint32_t *max_len);

/* ---- bodies ---------------------------------------------------------------------------------
 * Each *_encode writes header + body into `out` (capacity `cap`), sets *len_out, and returns 0 or
 * ORB_EINVAL (too small a buffer, an out-of-range field or a tag not allowed for the type; nothing
 * is written then). Each *_decode takes the body only
 * (after a successful header decode of that type) and returns 0 or ORB_EPROTO: wrong length,
 * trailing bytes, out-of-range values. Decoders never read past `len`. */

struct orb_wire_hello {          /* body: 16 expected | 16 sender | u32 role | u32 stripe = 40 */
    struct orb_epoch expected;   /* the epoch the requester was told the source has */
    struct orb_epoch sender;     /* the requester engine's own epoch (names notification senders) */
    uint32_t role;               /* enum orb_wire_role */
    uint32_t stripe;             /* stripe index for DATA, 0 for CONTROL; < 64 */
};
int orb_wire_hello_encode(const struct orb_wire_hello *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_wire_hello_decode(const uint8_t *body, size_t len, struct orb_wire_hello *m);

struct orb_wire_hello_ok {       /* body: 16 epoch | u32 max_payload = 20 */
    struct orb_epoch epoch;
    uint32_t max_payload;        /* >= 4096 and <= ORB_WIRE_MAX_PAYLOAD */
};
int orb_wire_hello_ok_encode(const struct orb_wire_hello_ok *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_wire_hello_ok_decode(const uint8_t *body, size_t len, struct orb_wire_hello_ok *m);

/* ERROR flag: the refused request's effect on the source's memory is unknown (a WRITE whose
 * bytes may have landed in part before it failed); without it, the request changed nothing. */
#define ORB_WIRE_ERROR_EFFECT_UNKNOWN 0x0001u
struct orb_wire_error {          /* body: i32 status | u16 flags | u16 text_len | text (no control bytes) */
    int32_t status;              /* negative ORB_E* (ORB_EAGAIN..ORB_EINVAL), never 0 */
    uint8_t effect_unknown;      /* 0 or 1: ORB_WIRE_ERROR_EFFECT_UNKNOWN */
    char text[ORB_WIRE_MAX_ERROR_TEXT + 1]; /* NUL-terminated after decode; encode truncates and
                                             * writes control bytes as '?', decode refuses them */
};
int orb_wire_error_encode(uint64_t tag, const struct orb_wire_error *m, uint8_t *out, size_t cap,
                          size_t *len_out);
int orb_wire_error_decode(const uint8_t *body, size_t len, struct orb_wire_error *m);

/* DESCRIBE_REQ has an empty body. */
int orb_wire_describe_req_encode(uint64_t tag, uint8_t *out, size_t cap, size_t *len_out);

/* body: u32 count | u32 reserved (0) | count x (u64 addr | u64 length | u32 perm). perm is
 * ORB_PERM_REMOTE_READ or ORB_PERM_REMOTE_WRITE; addr + length must not overflow; length > 0. */
size_t orb_wire_describe_resp_size(size_t count); /* header + body bytes; SIZE_MAX when count is
                                                   * over ORB_WIRE_MAX_REGIONS */
int orb_wire_describe_resp_encode(uint64_t tag, const struct orb_region_desc *regions, size_t count,
                                  uint8_t *out, size_t cap, size_t *len_out);
/* Allocates *regions_out (free()) with *count_out entries; NULL when 0. Errors also ORB_ENOMEM. */
int orb_wire_describe_resp_decode(const uint8_t *body, size_t len, struct orb_region_desc **regions_out,
                                  size_t *count_out);

/* READ_REQ / WRITE_REQ body (32 bytes): u64 addr | u64 length | u64 request_addr |
 * u64 request_length. READ_RESP body (16 bytes): u64 addr | u64 length.
 *
 * A requester may cut one request into several frames (slices over several connections); every
 * frame names the whole request's remote range as well as its own piece, so that the source
 * authorises the whole request (one registration contains all of it, with the permission the
 * operation needs) before it applies any piece, and an out-of-range request changes nothing. */
struct orb_wire_xfer {
    uint64_t addr;               /* this frame's remote address (READ_RESP: echoes the request's) */
    uint64_t length;             /* 1..ORB_WIRE_MAX_PAYLOAD; addr + length must not overflow */
    uint64_t request_addr;       /* requests: the whole request's remote range, which contains */
    uint64_t request_length;     /* [addr, +length); >= 1, no overflow. READ_RESP: not on the wire
                                  * (decode sets addr and length here, encode ignores them) */
};
/* `type` is READ_REQ, WRITE_REQ or READ_RESP; it selects the layout. */
int orb_wire_xfer_encode(uint8_t type, uint64_t tag, const struct orb_wire_xfer *m, uint8_t *out,
                         size_t cap, size_t *len_out);
int orb_wire_xfer_decode(uint8_t type, const uint8_t *body, size_t len, struct orb_wire_xfer *m);

/* WRITE_RESP and NOTIFY_RESP have an empty body. */
int orb_wire_empty_encode(uint8_t type, uint64_t tag, uint8_t *out, size_t cap, size_t *len_out);

struct orb_wire_notify {         /* body: u32 length | bytes; 1..ORB_NOTIFY_MAX */
    uint32_t length;
    const uint8_t *data;         /* decode: points into `body` */
};
int orb_wire_notify_encode(uint64_t tag, const struct orb_wire_notify *m, uint8_t *out, size_t cap,
                           size_t *len_out);
int orb_wire_notify_decode(const uint8_t *body, size_t len, struct orb_wire_notify *m);

/* CONTROL_REQ / CONTROL_RESP body: u8 transport (enum orb_transport, not TCP) | u8 0 | u16 0 |
 * 1..ORB_WIRE_MAX_CONTROL payload bytes, which the named transport encodes and decodes itself.
 * The TCP transport only carries them: another transport's handshakes and grants travel on the
 * control connection the segment already has. */
struct orb_wire_control {
    uint8_t transport;
    uint32_t length;
    const uint8_t *data;         /* decode: points into `body` */
};
/* `type` is CONTROL_REQ or CONTROL_RESP. */
int orb_wire_control_encode(uint8_t type, uint64_t tag, const struct orb_wire_control *m, uint8_t *out,
                            size_t cap, size_t *len_out);
int orb_wire_control_decode(const uint8_t *body, size_t len, struct orb_wire_control *m);

/* ---- cursor (exposed for tests and the helper codec later) ---------------------------------- */
struct orb_cursor {
    const uint8_t *buf;
    size_t len;
    size_t pos;
    int failed; /* sticky: set by any read past the end */
};
void orb_cursor_init(struct orb_cursor *c, const uint8_t *buf, size_t len);
uint8_t orb_cursor_u8(struct orb_cursor *c);
uint16_t orb_cursor_u16(struct orb_cursor *c);
uint32_t orb_cursor_u32(struct orb_cursor *c);
uint64_t orb_cursor_u64(struct orb_cursor *c);
/* Borrow `n` bytes; NULL (and failed) when fewer remain. */
const uint8_t *orb_cursor_bytes(struct orb_cursor *c, size_t n);
/* 0 when nothing failed and every byte was consumed; else ORB_EPROTO. */
int orb_cursor_finish(const struct orb_cursor *c);

struct orb_writer {
    uint8_t *buf;
    size_t cap;
    size_t pos;
    int failed; /* sticky: set by any write past cap */
};
void orb_writer_init(struct orb_writer *w, uint8_t *buf, size_t cap);
void orb_writer_u8(struct orb_writer *w, uint8_t v);
void orb_writer_u16(struct orb_writer *w, uint16_t v);
void orb_writer_u32(struct orb_writer *w, uint32_t v);
void orb_writer_u64(struct orb_writer *w, uint64_t v);
void orb_writer_bytes(struct orb_writer *w, const void *p, size_t n);

#endif
