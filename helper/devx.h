/* DEVX_VERIFY: before the library publishes a grant key, the helper reads the key's device
 * context back from the NIC and checks it grants exactly what the library says, nothing more.
 *
 * The device access is an operation table so that the checks run against a fake in tests; the
 * real table issues the mlx5 QUERY_MKEY command with the uverbs ioctl on the uverbs fd the
 * helper handed over (it keeps a dup of it: both share the tenant's device context, hence its
 * object handles). The kernel takes QUERY_MKEY only as an object query
 * (MLX5_IB_METHOD_DEVX_OBJ_QUERY) on the handle of the DevX object that created the key, and
 * refuses the query unless that object is the key named in the command (same mkey index); the
 * general DevX command path refuses QUERY_MKEY. This is the ioctl mlx5dv_devx_obj_query() sends
 * for an object that mlx5dv_devx_obj_import() (rdma-core 63 and later; Debian 12 ships 44) built
 * from a handle without any kernel call. The helper sends it itself rather than loading mlx5dv:
 * the ioctl is the one request number its seccomp filter admits, while the ibv_context that
 * mlx5dv needs would come from ibv_import_device(), which rescans the devices over a netlink
 * socket and maps provider libraries executable, both of which the filter forbids.
 *
 * A key passes only when all of these hold (QUERY_MKEY output, mlx5 PRM layout):
 *  - the kernel accepted the handle as the DevX object of this key in this context;
 *  - the command succeeded, the key is in use (free = 0) and its variant byte matches;
 *  - indirect KLM translation (access mode 2), no UMR re-programming (umr_en = 0), no
 *    signature (bsf_en = 0), no 64-bit length, no atomics;
 *  - bound to the requested QP (qpn, never the 0xFFFFFF wildcard);
 *  - remote read iff READ was requested, remote write iff WRITE (never both);
 *  - start_addr and len equal to the requested range;
 *  - one or two KLM entries (the output buffer holds two; the device returns as many as fit, so
 *    a key with more fails closed), each non-empty, none pointing at the key itself, contiguous
 *    from the requested address, byte counts summing to the length. */
#ifndef ORB_HELPER_DEVX_H
#define ORB_HELPER_DEVX_H

#include <stddef.h>
#include <stdint.h>

#include "common/helper_proto.h"
#include "common/mlx5_mkey.h"

/* QUERY_MKEY output: header (16) + key context (64) + reserved (192) + two KLM entries (32). */
#define ORB_DEVX_MKC_OFFSET ORB_MKEY_CMD_MKC_OFFSET
#define ORB_DEVX_KLM_OFFSET ORB_MKEY_CMD_KLM_OFFSET
#define ORB_DEVX_KLM_SIZE ORB_MKEY_KLM_SIZE
#define ORB_DEVX_KLM_MAX 2u
#define ORB_DEVX_QUERY_OUT_LEN (ORB_DEVX_KLM_OFFSET + ORB_DEVX_KLM_MAX * ORB_DEVX_KLM_SIZE)
#define ORB_DEVX_QUERY_IN_LEN 16u
#define ORB_DEVX_OP_QUERY_MKEY 0x201u
#define ORB_DEVX_ACCESS_MODE_KLMS ORB_MKC_ACCESS_MODE_KLMS
#define ORB_DEVX_QPN_WILDCARD ORB_MKC_QPN_WILDCARD

enum orb_devx_access { ORB_DEVX_READ = 1, ORB_DEVX_WRITE = 2 };

struct orb_devx_ops {
    /* Run QUERY_MKEY for `key` through the DevX object `obj_handle` of the device context
     * behind `dev_fd` and copy the command's output (out_len == ORB_DEVX_QUERY_OUT_LEN bytes).
     * Returns 0 when the command succeeded (its status byte is then 0), ORB_EPERM when the
     * kernel refuses the handle for this key (no such object in the context, or an object that
     * is not this key) or the device fails the command (EREMOTEIO since Linux 5.18, with the
     * command's status and syndrome in the message), ORB_EUNAVAILABLE when there is no DevX
     * object query (not an mlx5 device, no ioctl support), or another negative status. */
    int (*query_mkey)(void *impl, int dev_fd, uint32_t obj_handle, uint32_t key, uint8_t *out, size_t out_len);
};

/* The real table: MLX5_IB_METHOD_DEVX_OBJ_QUERY on the uverbs fd (impl unused, may be NULL). */
extern const struct orb_devx_ops orb_devx_kernel_ops;

/* The status query_mkey reports for an errno of the object query ioctl (err > 0; exposed so
 * that fakes answer as the real table does): ORB_EUNAVAILABLE for ENOTTY, EOPNOTSUPP,
 * EPROTONOSUPPORT and ENOSYS (no such method here); ORB_EPERM for every other errno, among
 * them ENOENT (no object of that handle), EINVAL (the object is not this key, or the context
 * has no DevX) and EREMOTEIO (the device failed the command). Sets the detail message. */
int orb_devx_query_errno_status(int err, uint32_t obj_handle, uint32_t key);

/* The decoded fields the checks use (exposed for tests and messages). */
struct orb_devx_mkey {
    uint8_t status;
    uint32_t syndrome;
    uint8_t free, umr_en, atomic, rw, rr, access_mode, length64, bsf_en;
    uint32_t qpn;
    uint8_t variant;                /* mkey_7_0 */
    uint64_t start_addr, len;
    uint32_t translations;          /* translations_octword_size: KLM entries */
    struct {
        uint32_t byte_count, key;
        uint64_t addr;
    } klm[ORB_DEVX_KLM_MAX];
};

/* Decode a QUERY_MKEY output. Errors: ORB_EINVAL (NULL or short buffer). */
int orb_devx_decode_mkey(const uint8_t *out, size_t len, struct orb_devx_mkey *m);

/* Check a decoded key against the request: 0, or ORB_EPERM naming the first mismatch. */
int orb_devx_check_mkey(const struct orb_devx_mkey *m, const struct orb_hp_devx_verify *req);

/* Query `req->key` through its object `req->obj_handle` with `ops` and check it. Errors:
 * ORB_EPERM (the key grants anything else, the handle is not this key's object, or the device
 * does not know it), ORB_EUNAVAILABLE (no DevX), ORB_EINVAL. */
int orb_devx_verify(const struct orb_devx_ops *ops, void *impl, int dev_fd, const struct orb_hp_devx_verify *req);

/* The QUERY_MKEY input for `key` (for the real table and the fakes of the tests). */
void orb_devx_encode_query(uint32_t key, uint8_t in[ORB_DEVX_QUERY_IN_LEN]);

#endif
