/* Internal: the same-host transport's messages.
 *
 * Three channels, each with its own messages:
 *  - the segment's TCP control connection (wire CONTROL_REQ/CONTROL_RESP, transport 4):
 *    INFO / INFO_OK (the source's boot id and the name of its Unix socket) and QUERY / QUERY_OK
 *    (whether a range is host memory the source would move this way, and its registration's
 *    extent, for choosing a transport);
 *  - the source's Unix socket (SOCK_SEQPACKET, abstract name "orbite-shm-" and the 16-byte id in
 *    hex): the proof's HELLO (samehost/proof.h) both ways, then SETUP (the rings' memory file,
 *    SCM_RIGHTS) / SETUP_OK, MAP (a requester buffer's memory file, SCM_RIGHTS) / MAP_OK, UNMAP;
 *  - the two rings in the SETUP memory (samehost/ring.h): REQUEST entries from the requester,
 *    COMPLETION entries from the source, ORB_SH_RING_ENTRY (64) bytes each.
 *
 * Every message starts u8 kind | u8 version | u16 0 (ring entries have no header: the ring says
 * what they are). Integers little-endian, fields packed in the order declared below. Decoders take
 * exactly the message's length, never read past it, check every reserved byte is zero and every
 * field against its limits, and fail closed with ORB_EPROTO naming the field; the output is
 * written only on success. Documented in docs/wire-protocol.md. */
#ifndef ORB_SAMEHOST_SHM_MSG_H
#define ORB_SAMEHOST_SHM_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "samehost/proof.h"

#define ORB_SHM_VERSION 1u
#define ORB_SHM_ID_LEN 16u          /* the source socket's random id */
#define ORB_SHM_WHY_MAX 48u         /* bytes of a completion's cause (NUL-padded, not terminated) */
#define ORB_SHM_MAPS_MAX 4096u      /* maps one connection may hold at the source */
#define ORB_SHM_RING_MIN 1u         /* ring capacities a SETUP may ask for */
#define ORB_SHM_RING_MAX 4096u

enum orb_shm_kind {
    /* control connection */
    ORB_SHM_INFO = 1,
    ORB_SHM_INFO_OK = 2,
    ORB_SHM_QUERY = 3,
    ORB_SHM_QUERY_OK = 4,
    /* Unix socket, after the HELLOs */
    ORB_SHM_SETUP = 16,
    ORB_SHM_SETUP_OK = 17,
    ORB_SHM_MAP = 18,
    ORB_SHM_MAP_OK = 19,
    ORB_SHM_UNMAP = 20
};

/* Encoded lengths. */
#define ORB_SHM_INFO_LEN 8u
#define ORB_SHM_INFO_OK_LEN 64u     /* header 8 | boot id 36 (ASCII) | u32 0 | id 16 */
#define ORB_SHM_QUERY_LEN 24u       /* header 4 | u8 op | 3 zero | u64 addr | u64 length */
#define ORB_SHM_QUERY_OK_LEN 24u    /* header 4 | i32 status | u64 base | u64 length */
#define ORB_SHM_SETUP_LEN 24u       /* header 4 | u32 request capacity | u32 completion capacity |
                                     * u32 0 | u64 bytes */
#define ORB_SHM_SETUP_OK_LEN 8u     /* header 4 | i32 status */
#define ORB_SHM_MAP_LEN 32u         /* header 4 | u32 map id | u8 writable | 7 zero | u64 file offset |
                                     * u64 length */
#define ORB_SHM_MAP_OK_LEN 16u      /* header 4 | u32 map id | i32 status | u32 0 */
#define ORB_SHM_UNMAP_LEN 8u        /* header 4 | u32 map id */

/* INFO_OK: where the source runs and how to reach it. */
struct orb_shm_info {
    char boot_id[ORB_BOOT_ID_LEN + 1]; /* a valid boot id (orb_samehost_boot_id_valid), NUL-terminated */
    uint8_t id[ORB_SHM_ID_LEN];
};

/* QUERY: may [addr, +length) (length > 0, no overflow) be moved by `op` (ORB_OP_READ/WRITE)? */
struct orb_shm_query {
    uint8_t op;
    uint64_t addr;
    uint64_t length;
};

/* QUERY_OK: status 0 (host memory the op may touch; [base, +length) is its registration, which
 * contains the asked range) or a negative ORB_E* (base and length 0). */
struct orb_shm_query_ok {
    int32_t status;
    uint64_t base;
    uint64_t length;
};

/* SETUP: the memory file sent with it holds the request ring (requester produces) at offset 0,
 * then the completion ring (source produces) at orb_shm_setup_completion_offset(); `bytes` is
 * orb_shm_setup_bytes() of the two capacities, exactly. Capacities are powers of two in
 * [ORB_SHM_RING_MIN, ORB_SHM_RING_MAX]. */
struct orb_shm_setup {
    uint32_t request_capacity;
    uint32_t completion_capacity;
    uint64_t bytes;
};

/* MAP: [file offset, +length) of the memory file sent with it is a requester buffer (both
 * multiples of 4096, length > 0 and at most ORB_SHM_MAP_LEN_MAX, no overflow); named `map_id`
 * (1..ORB_SHM_MAPS_MAX) in REQUEST entries, whose map offsets count from the buffer's start;
 * `writable` 1 when the source is to write it (READ requests land there), 0 read-only. */
struct orb_shm_map {
    uint32_t map_id;
    uint8_t writable;
    uint64_t file_offset;
    uint64_t length;
};

#define ORB_SHM_MAP_LEN_MAX (1ull << 46)

/* MAP_OK / SETUP_OK: 0 or the refusal. */
struct orb_shm_status {
    uint32_t map_id; /* MAP_OK only; 0 for SETUP_OK */
    int32_t status;
};

/* REQUEST ring entry (64 bytes):
 *   u64 tag | u8 op | 3 zero | u32 map id | u64 map offset | u64 remote addr | u64 length |
 *   u64 request addr | u64 request length | u64 0
 * One piece [remote addr, +length) of the request [request addr, +request length), which must
 * contain it; the requester's bytes are [map offset, +length) of map `map id`. */
struct orb_shm_request {
    uint64_t tag;
    uint8_t op;          /* ORB_OP_READ (source -> requester map) or ORB_OP_WRITE */
    uint32_t map_id;
    uint64_t map_offset;
    uint64_t remote_addr;
    uint64_t length;
    uint64_t request_addr;
    uint64_t request_length;
};

/* COMPLETION ring entry (64 bytes):
 *   u64 tag | i32 status | u8 effect | 3 zero | why (48 bytes, NUL-padded)
 * status 0 or a negative ORB_E* in [ORB_E* range]; effect an enum orb_remote_effect. */
struct orb_shm_completion {
    uint64_t tag;
    int32_t status;
    uint8_t effect;
    char why[ORB_SHM_WHY_MAX + 1]; /* decoded NUL-terminated; printable ASCII only */
};

/* Control-connection and socket messages. Encoders write exactly the kind's length into buf
 * (cap at least that) and return 0, or ORB_EINVAL (NULL, too small, a field out of its limits).
 * Decoders: see the top of this file. */
int orb_shm_info_encode(uint8_t *buf, size_t cap, size_t *len_out);
int orb_shm_info_decode(const uint8_t *buf, size_t len);
int orb_shm_info_ok_encode(const struct orb_shm_info *in, uint8_t *buf, size_t cap, size_t *len_out);
int orb_shm_info_ok_decode(const uint8_t *buf, size_t len, struct orb_shm_info *out);
int orb_shm_query_encode(const struct orb_shm_query *in, uint8_t *buf, size_t cap, size_t *len_out);
int orb_shm_query_decode(const uint8_t *buf, size_t len, struct orb_shm_query *out);
int orb_shm_query_ok_encode(const struct orb_shm_query_ok *in, uint8_t *buf, size_t cap, size_t *len_out);
int orb_shm_query_ok_decode(const uint8_t *buf, size_t len, struct orb_shm_query_ok *out);
int orb_shm_setup_encode(const struct orb_shm_setup *in, uint8_t *buf, size_t cap, size_t *len_out);
int orb_shm_setup_decode(const uint8_t *buf, size_t len, struct orb_shm_setup *out);
int orb_shm_map_encode(const struct orb_shm_map *in, uint8_t *buf, size_t cap, size_t *len_out);
int orb_shm_map_decode(const uint8_t *buf, size_t len, struct orb_shm_map *out);
/* kind: ORB_SHM_SETUP_OK or ORB_SHM_MAP_OK. */
int orb_shm_status_encode(uint8_t kind, const struct orb_shm_status *in, uint8_t *buf, size_t cap, size_t *len_out);
int orb_shm_status_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_shm_status *out);
int orb_shm_unmap_encode(uint32_t map_id, uint8_t *buf, size_t cap, size_t *len_out);
int orb_shm_unmap_decode(const uint8_t *buf, size_t len, uint32_t *map_id_out);
/* The kind of a socket message (its first byte) after checking version and reserved header
 * bytes; ORB_EPROTO when len < 4 or they are wrong. */
int orb_shm_peek_kind(const uint8_t *buf, size_t len, uint8_t *kind_out);

/* Ring entries: exactly ORB_SH_RING_ENTRY bytes. A REQUEST decodes only when op is READ or WRITE,
 * map id != 0, length > 0, map offset + length and both ranges do not overflow 2^64, and the
 * request range contains the piece; a COMPLETION only when status is 0 or a known negative code
 * (ORB_E* of orbite.h), effect is an enum orb_remote_effect, and why is printable ASCII then NULs. */
int orb_shm_request_encode(const struct orb_shm_request *in, uint8_t entry[64]);
int orb_shm_request_decode(const uint8_t entry[64], struct orb_shm_request *out);
int orb_shm_completion_encode(const struct orb_shm_completion *in, uint8_t entry[64]);
int orb_shm_completion_decode(const uint8_t entry[64], struct orb_shm_completion *out);

/* Bytes of the SETUP memory for these capacities (0 when either is not allowed), and where the
 * completion ring starts in it (a multiple of ORB_SH_RING_LINE). */
uint64_t orb_shm_setup_bytes(uint32_t request_capacity, uint32_t completion_capacity);
uint64_t orb_shm_setup_completion_offset(uint32_t request_capacity);

#endif
