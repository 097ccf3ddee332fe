/* Internal: hardware-revocable grant keys on mlx5 (the opt-in gpu_source_reuse path for GPU
 * sources), made with DevX so that a connected queue pair and the registration's local-only MR
 * serve a grant without a private queue pair and without a memory window on device memory.
 *
 * A key is an indirect memory key (CREATE_MKEY, KLM translation) of the NIC's PD:
 *  - bound to one queue pair (the qpn of the source's connected QP on that rail; the device
 *    refuses the key on any other QP), never the 0xFFFFFF wildcard;
 *  - exactly [addr, +len), through one or two KLM entries onto the parent MR (each at most
 *    ORB_DEVX_KLM_BYTES_MAX bytes, so a key covers at most twice that);
 *  - remote read for the peer's READ or remote write for its WRITE, never both, no atomics,
 *    no UMR re-programming, no signature;
 *  - remotely invalidatable (en_rinval): the peer's SEND_WITH_INV ends it as it ends a window.
 * The device chooses the key's index; the low byte is ours, and every full key is claimed in the
 * PD's key history (rdma/window.h) before it is shown to anyone, so that no key ever carries
 * authority twice. The helper then reads the key's context back from the device (DEVX_VERIFY)
 * and the key is published only if it grants exactly that; a key that fails is destroyed.
 *
 * Destroying the DevX object revokes the key. A destruction that fails leaves the key's
 * authority uncertain: the caller keeps everything the key could reach (the registration's
 * owner and admission) for good.
 *
 * The device calls are an operation table: the kernel's (the mlx5 DevX uverbs methods on the
 * context's command fd, the PD number from libmlx5), or a test's; the check is the caller's
 * (the helper session's DEVX_VERIFY). */
#ifndef ORB_RDMA_DEVX_KEY_H
#define ORB_RDMA_DEVX_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/helper_proto.h"
#include "common/mlx5_mkey.h"
#include "rdma/verbs.h"
#include "rdma/window.h"

/* CREATE_MKEY input: command header (16) + key context (64) + 16 reserved + actual size (4) +
 * 172 reserved, then the KLM entries (16 each); output: status, syndrome, mkey_index. The key
 * context and the KLM entries sit at the same offsets as in QUERY_MKEY's output, which is what
 * the helper checks. */
#define ORB_DEVX_CREATE_MKC_OFFSET ORB_MKEY_CMD_MKC_OFFSET
#define ORB_DEVX_CREATE_ACTUAL_SIZE_OFFSET 96u
#define ORB_DEVX_CREATE_KLM_OFFSET ORB_MKEY_CMD_KLM_OFFSET
#define ORB_DEVX_CREATE_KLM_MAX 2u
#define ORB_DEVX_CREATE_IN_MAX (ORB_DEVX_CREATE_KLM_OFFSET + ORB_DEVX_CREATE_KLM_MAX * ORB_MKEY_KLM_SIZE)
#define ORB_DEVX_CREATE_OUT_LEN 16u
#define ORB_DEVX_CMD_CREATE_MKEY 0x200u
/* A KLM entry's byte count: mlx5 takes at most 2 GiB per entry. */
#define ORB_DEVX_KLM_BYTES_MAX (UINT64_C(1) << 31)
#define ORB_DEVX_KEY_LEN_MAX (ORB_DEVX_CREATE_KLM_MAX * ORB_DEVX_KLM_BYTES_MAX)

/* What one key grants. */
struct orb_devx_key_spec {
    uint32_t pdn;          /* the PD's number (24 bits) */
    uint32_t qpn;          /* the one QP it answers (24 bits, never the wildcard) */
    uint32_t parent_lkey;  /* the registration's MR on that PD */
    uint8_t variant;       /* the key's low byte */
    uint64_t addr;         /* in the parent MR's address space (its iova) */
    uint64_t len;          /* 1..ORB_DEVX_KEY_LEN_MAX */
    int op;                /* ORB_OP_READ: remote read; ORB_OP_WRITE: remote write */
};

/* The CREATE_MKEY input for `s` into in[0..*len_out). Errors: ORB_EINVAL (a field out of
 * range: qpn or pdn over 24 bits, the wildcard qpn, len 0 or above ORB_DEVX_KEY_LEN_MAX, a range
 * that wraps, an op that is neither READ nor WRITE). */
int orb_devx_key_encode(const struct orb_devx_key_spec *s, uint8_t in[ORB_DEVX_CREATE_IN_MAX], size_t *len_out);

/* The key index CREATE_MKEY's output names. Errors: ORB_EUNAVAILABLE (the command failed:
 * status and syndrome named). */
int orb_devx_key_decode_created(const uint8_t out[ORB_DEVX_CREATE_OUT_LEN], uint32_t *index_out);

struct orb_devx_key_ops {
    /* The number of `pd` (libmlx5's mlx5dv_init_obj). ORB_EUNAVAILABLE when it cannot say. */
    int (*pdn)(void *impl, struct ibv_pd *pd, uint32_t *pdn_out);
    /* Create a DevX object by the command in[0..in_len) on `ctx`; the command's output into
     * out[0..out_len) and the object's handle into *handle_out. Errors: ORB_EUNAVAILABLE (no
     * DevX here: not mlx5, a context without DevX; or the device refused the command, its
     * status and syndrome named), ORB_ENOMEM. */
    int (*create)(void *impl, struct ibv_context *ctx, const uint8_t *in, size_t in_len, uint8_t *out,
                  size_t out_len, uint32_t *handle_out);
    /* Destroy the object `handle` of `ctx` (revoking its key): 0, or the refusal. */
    int (*destroy)(void *impl, struct ibv_context *ctx, uint32_t handle);
};

/* The kernel's table (impl unused). */
extern const struct orb_devx_key_ops orb_devx_key_kernel_ops;

/* Where a key is made and checked. */
struct orb_devx_key_site {
    const struct orb_devx_key_ops *ops;
    void *impl;
    /* The helper's DEVX_VERIFY of `v` (0 when the key grants exactly that), with verify_impl. */
    int (*verify)(void *verify_impl, const struct orb_hp_devx_verify *v);
    void *verify_impl;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    const char *nic;                     /* the NIC's name, for the helper */
    struct orb_rdma_window_pool *history; /* the PD's key history (its lock held by the caller) */
};

struct orb_devx_key {
    uint32_t handle;     /* the DevX object */
    uint32_t key;        /* the rkey to publish */
};

/* Make a key granting [addr, +len) of the MR `parent_lkey` for `op` on QP `qpn`, claim it in the
 * history, have the helper verify it, and return it in *out. A key that fails any step is
 * destroyed before the call returns (its low byte stays spent). Errors: ORB_EINVAL (arguments),
 * ORB_EUNAVAILABLE (no DevX here, the PD number unknown), ORB_ERESOURCE (the key history is
 * full, or the device keeps returning spent keys), ORB_EPERM (the helper found the key grants
 * something else: a device that binds keys only to the wildcard QP fails here),
 * ORB_EUNQUIESCED (a failed key could not be destroyed: its authority is uncertain, so the
 * caller keeps what it reaches for good), ORB_ENOMEM. */
int orb_devx_key_make(const struct orb_devx_key_site *site, uint32_t qpn, uint32_t parent_lkey, uint64_t addr,
                      uint64_t len, int op, struct orb_devx_key *out);

/* Destroy `k` (its key is revoked). Errors: the refusal of the destroy call (the key may still
 * be in force: keep what it reaches). */
int orb_devx_key_destroy(const struct orb_devx_key_site *site, const struct orb_devx_key *k);

#endif
