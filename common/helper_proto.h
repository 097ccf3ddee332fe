/* The library <-> orbite-helper protocol, linked by both sides. No I/O except the two datagram
 * functions at the end.
 *
 * One message per SOCK_SEQPACKET datagram, at most ORB_HP_MAX_MSG bytes: a 16-byte header
 * (u32 magic | u16 version | u16 type | u32 length (whole datagram) | u32 sequence), then the
 * body. Explicit little-endian. Even types are requests (library -> helper), odd types are their
 * replies (type + 1). Every reply body starts with an i32 status (0 or negative ORB_E*); the
 * rest of a reply body is present only when the status is 0. Strings are u16 length + bytes,
 * no NUL. Device and slot names are one path component matching [A-Za-z0-9_.-]{1,64}.
 * Trailing bytes, a wrong length, magic or version, MSG_TRUNC or MSG_CTRUNC end the session.
 * File descriptors travel only helper -> library, as SCM_RIGHTS on a reply that declares
 * exactly how many it carries. */
#ifndef ORB_COMMON_HELPER_PROTO_H
#define ORB_COMMON_HELPER_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <orbite/orbite.h>

#include "topo/inventory.h"

#define ORB_HP_MAGIC 0x4F524248u /* "HBRO" little-endian bytes 'H','B','R','O' */
#define ORB_HP_VERSION 1u
#define ORB_HP_HEADER_LEN 16u
#define ORB_HP_MAX_MSG 4096u
#define ORB_HP_NAME_MAX 64u       /* device and slot names */
#define ORB_HP_MAX_FDS 1u         /* fds on one reply */
#define ORB_HP_MAX_SLOTS 16u      /* slot names in a POLICY reply */
#define ORB_HP_FD 3               /* the helper's end of the socketpair */

enum orb_hp_type {
    ORB_HP_HELLO = 2,            /* req: u32 version                       */
    ORB_HP_HELLO_REPLY = 3,      /* rep: status | u32 version | u32 uid | u32 gid | u32 caps_kept */
    ORB_HP_INVENTORY = 4,        /* req: u8 kind (enum orb_hp_inv_kind) | u8 pad[3] | u32 index */
    ORB_HP_INVENTORY_REPLY = 5,  /* rep: status | u32 total | one item of `kind` (see below) */
    ORB_HP_POLICY = 6,           /* req: empty */
    ORB_HP_POLICY_REPLY = 7,     /* rep: status | struct orb_hp_policy fields in order */
    ORB_HP_OPEN_DEVICE = 8,      /* req: str nic_name */
    ORB_HP_OPEN_DEVICE_REPLY = 9,/* rep: status | u32 nfds (1 on success) + SCM_RIGHTS uverbs fd */
    ORB_HP_PEERMEM_PROBE = 10,   /* req: empty */
    ORB_HP_PEERMEM_REPLY = 11,   /* rep: status | u32 found (bit i: candidate file i exists) */
    ORB_HP_SLOT_ATTACH = 12,     /* req: str slot_name | u64 interval_ns */
    ORB_HP_SLOT_REPLY = 13,      /* rep: status | u32 nfds (1) + SCM_RIGHTS read-only slot fd */
    ORB_HP_DEVX_VERIFY = 14,     /* req: struct orb_hp_devx_verify */
    ORB_HP_DEVX_REPLY = 15,      /* rep: status (ORB_EUNAVAILABLE without an mlx5 device) */
    ORB_HP_TYPE_MAX = 15
};

enum orb_hp_inv_kind { ORB_HP_INV_NIC = 0, ORB_HP_INV_GPU = 1, ORB_HP_INV_NUMA = 2 };

/* Transports and GPUDirect routes a policy may grant (bit masks). */
enum orb_hp_transport_bits { ORB_HP_T_TCP = 1u << 0, ORB_HP_T_RDMA = 1u << 1, ORB_HP_T_NVLINK = 1u << 2 };
enum orb_hp_route_bits { ORB_HP_R_DMABUF = 1u << 0, ORB_HP_R_PEERMEM = 1u << 1 };

/* What this tenant may use, by inventory ids (the helper's inventory order). */
struct orb_hp_policy {
    uint64_t nic_mask;             /* bit i: inventory NIC id i allowed */
    uint64_t gpu_mask;             /* bit i: GPU ordinal i allowed */
    uint32_t transports;           /* enum orb_hp_transport_bits */
    uint32_t gpudirect_routes;     /* enum orb_hp_route_bits */
    uint64_t max_registered_bytes; /* budgets; 0 = no access, UINT64_MAX = unlimited */
    uint32_t max_endpoints;
    uint32_t max_grants;
    uint32_t nslots;
    char slots[ORB_HP_MAX_SLOTS][ORB_HP_NAME_MAX + 1]; /* NUL-terminated after decode */
};

struct orb_hp_devx_verify {
    char nic[ORB_HP_NAME_MAX + 1];
    uint32_t obj_handle;           /* the key's DevX object handle in the tenant's device context */
    uint32_t key;                  /* the memory key about to be published */
    uint32_t qpn;                  /* the QP it must be bound to */
    uint64_t addr;                 /* exact range and direction it must grant */
    uint64_t length;
    uint32_t access;               /* 1 READ, 2 WRITE */
};

struct orb_hp_header {
    uint16_t type;
    uint32_t length;               /* whole datagram, header included */
    uint32_t sequence;             /* replies echo the request's sequence */
};

/* A decoded message: header + the body bytes (borrowed from the datagram buffer). */
struct orb_hp_msg {
    struct orb_hp_header hdr;
    const uint8_t *body;
    size_t body_len;
};

/* Validate and split a received datagram of `len` bytes: magic, version, known type,
 * length == len, len <= ORB_HP_MAX_MSG, body length within orb_hp_body_limits() of the type.
 * Errors: ORB_EPROTO naming the field. */
int orb_hp_parse(const uint8_t *buf, size_t len, struct orb_hp_msg *out);

/* Smallest and largest body (bytes after the header) a message of `type` can have; 0 and 0 for
 * unknown types. For dispatch tables and for orb_hp_parse. */
void orb_hp_body_limits(uint16_t type, uint32_t *min_len, uint32_t *max_len);

/* "HELLO", "INVENTORY_REPLY", ... for logs; "unknown" otherwise. Never NULL. */
const char *orb_hp_type_name(uint16_t type);

/* Names: 1..64 of [A-Za-z0-9_.-], not "." or "..". Returns 1 when valid, else 0. */
int orb_hp_name_valid(const char *name, size_t len);

/* Encoders write a whole datagram (header + body) into buf[ORB_HP_MAX_MSG] and set *len_out;
 * ORB_EINVAL on an out-of-range field (nothing is written then). Encoders check the same rules
 * as decoders, so whatever encodes also decodes, to the same values. Decoders take a parsed
 * message of the right type (another type is ORB_EPROTO) and return ORB_EPROTO on any
 * malformed, out-of-range or trailing byte; outputs are written only on success. A reply with a
 * non-zero status decodes with that status and every other output zeroed. */

/* HELLO and HELLO_REPLY carry ORB_HP_VERSION; their decoders refuse any other version. */
int orb_hp_encode_hello(uint32_t seq, uint8_t *buf, size_t *len_out);
int orb_hp_decode_hello(const struct orb_hp_msg *m, uint32_t *version);
int orb_hp_encode_hello_reply(uint32_t seq, int32_t status, uint32_t uid, uint32_t gid,
                              uint32_t caps_kept, uint8_t *buf, size_t *len_out);
int orb_hp_decode_hello_reply(const struct orb_hp_msg *m, int32_t *status, uint32_t *version,
                              uint32_t *uid, uint32_t *gid, uint32_t *caps_kept);

int orb_hp_encode_inventory(uint32_t seq, uint8_t kind, uint32_t index, uint8_t *buf, size_t *len_out);
int orb_hp_decode_inventory(const struct orb_hp_msg *m, uint8_t *kind, uint32_t *index);
/* Exactly one of nic/gpu/numa is used, per `kind` (the reply does not repeat it: the caller
 * passes the kind it asked for). On success total is 1..64 (the model's maximum for the kind).
 * Items go field by field, counted arrays sending only their first nports ports, ngids GIDs
 * and depth hops (see docs/helper-protocol.md); a NIC with every port and GID fits.
 * Rules: NIC id < 64, usable 0/1, name a valid name of at most 63 bytes (empty only when
 * unusable), PCI strings lowercase hex, ':' and '.' (roots "pci..."), NUMA node -1..65535,
 * port numbers non-zero, known port states, link layers and GID types, no all-zero GID;
 * GPU ordinal < 64; NUMA node id 0..65535 with at most 64 distances. */
int orb_hp_encode_inventory_reply(uint32_t seq, int32_t status, uint32_t total, uint8_t kind,
                                  const struct orb_topo_nic *nic, const struct orb_topo_gpu *gpu,
                                  const struct orb_topo_numa *numa, uint8_t *buf, size_t *len_out);
int orb_hp_decode_inventory_reply(const struct orb_hp_msg *m, uint8_t kind, int32_t *status,
                                  uint32_t *total, struct orb_topo_nic *nic,
                                  struct orb_topo_gpu *gpu, struct orb_topo_numa *numa);

/* POLICY and PEERMEM_PROBE have empty bodies. */
int orb_hp_encode_empty(uint16_t type, uint32_t seq, uint8_t *buf, size_t *len_out);
int orb_hp_decode_empty(const struct orb_hp_msg *m); /* 0 for an empty POLICY or PEERMEM_PROBE */
/* A bare status: DEVX_REPLY, or the failure reply (status != 0) of any reply type. */
int orb_hp_encode_status(uint16_t type, uint32_t seq, int32_t status, uint8_t *buf, size_t *len_out);
int orb_hp_decode_status(const struct orb_hp_msg *m, int32_t *status); /* status-only replies */

int orb_hp_encode_policy_reply(uint32_t seq, int32_t status, const struct orb_hp_policy *p,
                               uint8_t *buf, size_t *len_out);
int orb_hp_decode_policy_reply(const struct orb_hp_msg *m, int32_t *status, struct orb_hp_policy *p);

int orb_hp_encode_open_device(uint32_t seq, const char *nic, uint8_t *buf, size_t *len_out);
int orb_hp_decode_open_device(const struct orb_hp_msg *m, char nic[ORB_HP_NAME_MAX + 1]);
/* OPEN_DEVICE_REPLY and SLOT_REPLY: status | u32 nfds (1..ORB_HP_MAX_FDS on success; a
 * failure carries none and decodes as nfds 0). */
int orb_hp_encode_fd_reply(uint16_t type, uint32_t seq, int32_t status, uint32_t nfds, uint8_t *buf,
                           size_t *len_out);
int orb_hp_decode_fd_reply(const struct orb_hp_msg *m, int32_t *status, uint32_t *nfds);

int orb_hp_encode_peermem_reply(uint32_t seq, int32_t status, uint32_t found, uint8_t *buf, size_t *len_out);
int orb_hp_decode_peermem_reply(const struct orb_hp_msg *m, int32_t *status, uint32_t *found);

int orb_hp_encode_slot_attach(uint32_t seq, const char *slot, uint64_t interval_ns, uint8_t *buf,
                              size_t *len_out);
int orb_hp_decode_slot_attach(const struct orb_hp_msg *m, char slot[ORB_HP_NAME_MAX + 1],
                              uint64_t *interval_ns);

int orb_hp_encode_devx_verify(uint32_t seq, const struct orb_hp_devx_verify *v, uint8_t *buf,
                              size_t *len_out);
int orb_hp_decode_devx_verify(const struct orb_hp_msg *m, struct orb_hp_devx_verify *v);

/* ---- datagram I/O ------------------------------------------------------------------------ */

/* Send one datagram, with `nfds` (0..ORB_HP_MAX_FDS) descriptors as SCM_RIGHTS (the caller
 * keeps its own copies). EINTR is retried; a closed peer is ORB_EPEER (never SIGPIPE). */
int orb_hp_send(int sock, const uint8_t *buf, size_t len, const int *fds, size_t nfds);

/* orb_hp_send without ever blocking longer than `timeout_ms` (>= 0) in all: the datagram is
 * offered with MSG_DONTWAIT and, while the peer's queue is full, again when poll() says there is
 * room. ORB_ETIMEDOUT when the peer took nothing by then (nothing was sent), ORB_EINVAL for a
 * negative timeout; otherwise as orb_hp_send. */
int orb_hp_send_deadline(int sock, const uint8_t *buf, size_t len, const int *fds, size_t nfds, int timeout_ms);

/* Receive one datagram into buf[ORB_HP_MAX_MSG] within `timeout_ms` (-1: none), with
 * MSG_CMSG_CLOEXEC. At most `max_fds` descriptors are accepted; any other control message,
 * more descriptors, MSG_TRUNC or MSG_CTRUNC is ORB_EPROTO (and every received fd is closed).
 * EOF is ORB_EPEER, a timeout ORB_ETIMEDOUT. EINTR is retried within the same deadline.
 * On success the caller owns fds[0..*nfds_out) and must still compare *nfds_out with the
 * count the reply declares (orb_hp_close_fds on a mismatch). */
int orb_hp_recv(int sock, uint8_t *buf, size_t *len_out, int *fds, size_t max_fds, size_t *nfds_out,
                int timeout_ms);

/* Close fds[0..n) that are >= 0 and set them to -1. NULL-safe. */
void orb_hp_close_fds(int *fds, size_t n);

#endif
