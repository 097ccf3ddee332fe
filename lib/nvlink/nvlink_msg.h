/* Internal: the NVLink (CUDA IPC) transport's control messages, carried over the segment's TCP
 * control connection (wire CONTROL_REQ/CONTROL_RESP, transport 3).
 *
 *  - HELLO / HELLO_OK: where each side runs (the kernel's boot id and its IPC namespace): IPC
 *    needs one host and one namespace. Whether the source is this very process is never taken
 *    from the wire (nvlink_requester.c finds it among this process's own engines).
 *  - BEGIN / BEGIN_OK: a group of up to ORB_NVL_GROUP_MAX requests, each authorised by the source
 *    as a whole, with the IPC handle of each allocation they touch, or the refusal and its cause.
 *    The source holds the group's ranges (pinned, lent, producer work waited for) until END or
 *    until the group's lease runs out.
 *  - END / END_OK: the requester's copies of the group are over; the source lets the ranges go.
 *  - QUERY / QUERY_OK: BEGIN's question without its hold or handles, for choosing a transport:
 *    whether each range could travel here, and the extent of its allocation.
 *  - FETCH / FETCH_OK, on the source's descriptor channel (a Unix socket of the host, since a
 *    descriptor cannot cross TCP): the descriptor of an allocation that has no legacy IPC handle
 *    (a virtual memory management one), for the token of a group that holds it.
 *
 * Every message starts u8 kind | u8 version | u16 0. Little-endian, packed; every count and
 * length is checked against fixed maxima before use, decoders never read past `len`, and fail
 * closed with ORB_EPROTO naming the field. Documented in docs/wire-protocol.md. */
#ifndef ORB_NVLINK_NVLINK_MSG_H
#define ORB_NVLINK_NVLINK_MSG_H

#include <stddef.h>
#include <stdint.h>

#define ORB_NVL_VERSION 2u
#define ORB_NVL_GROUP_MAX 16u      /* requests of one BEGIN */
#define ORB_NVL_HANDLE_LEN 64u     /* a legacy CUDA IPC handle, or a descriptor's (below) */
#define ORB_NVL_TOKEN_LEN 32u      /* a held group's descriptor token */
#define ORB_NVL_WHY_MAX 96u        /* bytes of a refusal's cause */
#define ORB_NVL_ID_LEN 16u

enum orb_nvl_kind {
    ORB_NVL_HELLO = 1,
    ORB_NVL_HELLO_OK = 2,
    ORB_NVL_BEGIN = 3,
    ORB_NVL_BEGIN_OK = 4,
    ORB_NVL_END = 5,
    ORB_NVL_END_OK = 6,
    ORB_NVL_QUERY = 7,     /* a BEGIN's body: may these ranges travel here? Nothing is held */
    ORB_NVL_QUERY_OK = 8,  /* a BEGIN_OK's body, its handles zero */
    /* On the source's descriptor channel (nvlink_fdchan.c), never on the control connection: */
    ORB_NVL_FETCH = 9,     /* a held group's token and an allocation's index in its BEGIN_OK */
    ORB_NVL_FETCH_OK = 10  /* the status, the allocation's size, and its descriptor (SCM_RIGHTS) */
};

/* How an allocation is shared. */
enum orb_nvl_share {
    ORB_NVL_SHARE_LEGACY = 1,      /* handle: the legacy CUDA IPC handle */
    ORB_NVL_SHARE_FD = 2           /* handle: a descriptor's, fetched on the source's channel */
};

/* A descriptor's handle: where to fetch it, and what names the allocation for the importer's cache. */
struct orb_nvl_fd_handle {
    uint8_t channel[ORB_NVL_ID_LEN]; /* the source's channel: abstract socket "orbite-nvl-<hex>" */
    uint64_t serial;                 /* the allocation's owner at the source, never reused there */
    uint8_t token[ORB_NVL_TOKEN_LEN];/* the group's: a FETCH with it is served while the group is held */
};

/* Where a process runs. */
struct orb_nvl_hello {
    uint8_t boot[ORB_NVL_ID_LEN];    /* /proc/sys/kernel/random/boot_id */
    uint64_t ipc_namespace;          /* the inode of /proc/self/ns/ipc */
};

struct orb_nvl_range {
    uint8_t op;                      /* ORB_OP_READ or ORB_OP_WRITE */
    uint64_t addr;                   /* the source's address of the request's first byte */
    uint64_t length;                 /* > 0 */
};

struct orb_nvl_begin {
    uint64_t group;                  /* the requester's id of the group, non-zero */
    uint32_t count;                  /* 1..ORB_NVL_GROUP_MAX */
    struct orb_nvl_range ranges[ORB_NVL_GROUP_MAX];
};

/* One exported allocation: the whole of it is mapped by the importer. */
struct orb_nvl_alloc {
    uint64_t base;                   /* the source's address of its first byte */
    uint64_t size;
    uint8_t share;                   /* enum orb_nvl_share */
    uint8_t handle[ORB_NVL_HANDLE_LEN];
};

struct orb_nvl_fetch {
    uint32_t alloc;                  /* < ORB_NVL_GROUP_MAX */
    uint8_t token[ORB_NVL_TOKEN_LEN];
};

struct orb_nvl_fetch_ok {
    int32_t status;                  /* 0: one descriptor came with it; else the ORB_E* refusal */
    uint64_t size;                   /* the allocation's bytes (0 on a refusal) */
};

struct orb_nvl_grant {
    int32_t status;                  /* 0, or the ORB_E* refusal of this request */
    uint16_t alloc;                  /* index into allocs when status is 0 */
    char why[ORB_NVL_WHY_MAX + 1];   /* the refusal's cause, NUL-terminated ("" for none) */
};

struct orb_nvl_begin_ok {
    uint64_t group;
    uint32_t count;                  /* as the BEGIN's */
    uint32_t nallocs;                /* 0..count */
    struct orb_nvl_alloc allocs[ORB_NVL_GROUP_MAX];
    struct orb_nvl_grant grants[ORB_NVL_GROUP_MAX];
};

/* The kind of a message (its first byte) after checking its prefix: ORB_EPROTO otherwise. */
int orb_nvl_kind_of(const uint8_t *buf, size_t len, uint8_t *kind_out);

/* Encoders write at most `cap` bytes (ORB_EINVAL when it is too small or a field is out of
 * range); decoders check everything (ORB_EPROTO naming the field). */
int orb_nvl_hello_encode(uint8_t kind, const struct orb_nvl_hello *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_nvl_hello_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_nvl_hello *m);
/* BEGIN or QUERY, and BEGIN_OK or QUERY_OK (`kind`). */
int orb_nvl_begin_encode(uint8_t kind, const struct orb_nvl_begin *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_nvl_begin_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_nvl_begin *m);
int orb_nvl_begin_ok_encode(uint8_t kind, const struct orb_nvl_begin_ok *m, uint8_t *out, size_t cap,
                            size_t *len_out);
int orb_nvl_begin_ok_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_nvl_begin_ok *m);
/* A descriptor's handle into and out of the 64 handle bytes (channel | u64 serial | 8 x u8 0 |
 * token); the decoder refuses set reserved bytes. */
void orb_nvl_fd_handle_pack(const struct orb_nvl_fd_handle *h, uint8_t out[ORB_NVL_HANDLE_LEN]);
int orb_nvl_fd_handle_unpack(const uint8_t in[ORB_NVL_HANDLE_LEN], struct orb_nvl_fd_handle *h);
/* FETCH: u32 alloc | u32 0 | token (44 bytes in all). FETCH_OK: i32 status | u32 0 | u64 size (20). */
int orb_nvl_fetch_encode(const struct orb_nvl_fetch *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_nvl_fetch_decode(const uint8_t *buf, size_t len, struct orb_nvl_fetch *m);
int orb_nvl_fetch_ok_encode(const struct orb_nvl_fetch_ok *m, uint8_t *out, size_t cap, size_t *len_out);
int orb_nvl_fetch_ok_decode(const uint8_t *buf, size_t len, struct orb_nvl_fetch_ok *m);
/* END and END_OK: the group id only. */
int orb_nvl_end_encode(uint8_t kind, uint64_t group, uint8_t *out, size_t cap, size_t *len_out);
int orb_nvl_end_decode(uint8_t kind, const uint8_t *buf, size_t len, uint64_t *group_out);

#endif
