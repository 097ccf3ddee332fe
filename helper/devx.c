/* DEVX_VERIFY: decode and check a key's device context (see devx.h). */
#include "helper/devx.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/mlx5_user_ioctl_cmds.h>

#include "core/error.h"
#include "common/uverbs.h"

int orb_devx_decode_mkey(const uint8_t *out, size_t len, struct orb_devx_mkey *m)
{
    if (out == NULL || m == NULL || len < ORB_DEVX_QUERY_OUT_LEN)
        return orb_fail(ORB_EINVAL, "devx: QUERY_MKEY output of %zu bytes, need %u", len, ORB_DEVX_QUERY_OUT_LEN);
    memset(m, 0, sizeof *m);
    m->status = out[0];
    m->syndrome = orb_be32_get(out + 4);
    const uint8_t *mkc = out + ORB_DEVX_MKC_OFFSET;
    m->free = (mkc[ORB_MKC_FLAGS0] >> 6) & 1u;
    uint8_t mode_hi = (mkc[ORB_MKC_FLAGS0] >> 2) & 7u;
    uint8_t f2 = mkc[ORB_MKC_FLAGS2];
    m->umr_en = (f2 >> 7) & 1u;
    m->atomic = (f2 >> 6) & 1u;
    m->rw = (f2 >> 5) & 1u;
    m->rr = (f2 >> 4) & 1u;
    m->access_mode = (uint8_t)(mode_hi << 2 | (f2 & 3u));
    uint32_t qpn_word = orb_be32_get(mkc + ORB_MKC_QPN);
    m->qpn = qpn_word >> 8;
    m->variant = (uint8_t)(qpn_word & 0xFFu);
    m->length64 = (mkc[ORB_MKC_FLAGS12] >> 7) & 1u;
    m->bsf_en = (mkc[ORB_MKC_FLAGS12] >> 6) & 1u;
    m->start_addr = orb_be64_get(mkc + ORB_MKC_START_ADDR);
    m->len = orb_be64_get(mkc + ORB_MKC_LEN);
    m->translations = orb_be32_get(mkc + ORB_MKC_TRANSLATIONS);
    for (unsigned i = 0; i < ORB_DEVX_KLM_MAX; i++) {
        const uint8_t *k = out + ORB_DEVX_KLM_OFFSET + i * ORB_DEVX_KLM_SIZE;
        m->klm[i].byte_count = orb_be32_get(k);
        m->klm[i].key = orb_be32_get(k + 4);
        m->klm[i].addr = orb_be64_get(k + 8);
    }
    return 0;
}

static int mismatch(const struct orb_hp_devx_verify *req, const char *what)
{
    return orb_fail(ORB_EPERM, "devx: key 0x%08x on %s: %s", req->key, req->nic, what);
}

int orb_devx_check_mkey(const struct orb_devx_mkey *m, const struct orb_hp_devx_verify *req)
{
    if (m == NULL || req == NULL)
        return orb_fail(ORB_EINVAL, "devx: NULL key or request");
    if (req->access != ORB_DEVX_READ && req->access != ORB_DEVX_WRITE)
        return orb_fail(ORB_EINVAL, "devx: access %u is neither READ nor WRITE", req->access);
    if (m->status != 0)
        return mismatch(req, "the device does not know this key in this context");
    if (m->free)
        return mismatch(req, "key is free");
    if (m->variant != (req->key & 0xFFu))
        return mismatch(req, "key variant differs");
    if (m->access_mode != ORB_DEVX_ACCESS_MODE_KLMS)
        return mismatch(req, "not an indirect KLM key");
    if (m->umr_en)
        return mismatch(req, "key can be re-programmed by UMR");
    if (m->bsf_en || m->length64)
        return mismatch(req, "signature or 64-bit length enabled");
    if (m->atomic)
        return mismatch(req, "remote atomics enabled");
    if (m->qpn == ORB_DEVX_QPN_WILDCARD)
        return mismatch(req, "key is not bound to one QP");
    if (m->qpn != req->qpn)
        return mismatch(req, "key is bound to another QP");
    bool want_read = req->access == ORB_DEVX_READ;
    if (m->rr != want_read || m->rw != !want_read)
        return mismatch(req, "remote access differs from the requested direction");
    if (m->start_addr != req->addr || m->len != req->length)
        return mismatch(req, "range differs from the requested one");
    if (m->translations == 0 || m->translations > ORB_DEVX_KLM_MAX)
        return mismatch(req, "KLM list empty or longer than can be checked");
    uint64_t next = req->addr, total = 0;
    for (uint32_t i = 0; i < m->translations; i++) {
        if (m->klm[i].byte_count == 0)
            return mismatch(req, "empty KLM entry");
        if ((m->klm[i].key >> 8) == (req->key >> 8))
            return mismatch(req, "KLM entry points at the key itself");
        if (m->klm[i].addr != next)
            return mismatch(req, "KLM entries are not the contiguous requested range");
        next += m->klm[i].byte_count;
        total += m->klm[i].byte_count;
    }
    if (total != req->length)
        return mismatch(req, "KLM byte counts do not add up to the length");
    return 0;
}

void orb_devx_encode_query(uint32_t key, uint8_t in[ORB_DEVX_QUERY_IN_LEN])
{
    memset(in, 0, ORB_DEVX_QUERY_IN_LEN);
    in[0] = (uint8_t)(ORB_DEVX_OP_QUERY_MKEY >> 8);
    in[1] = (uint8_t)(ORB_DEVX_OP_QUERY_MKEY & 0xFFu);
    uint32_t index = key >> 8; /* mkey_index, 24 bits at byte 9 */
    in[9] = (uint8_t)(index >> 16);
    in[10] = (uint8_t)(index >> 8);
    in[11] = (uint8_t)index;
}

int orb_devx_verify(const struct orb_devx_ops *ops, void *impl, int dev_fd, const struct orb_hp_devx_verify *req)
{
    if (ops == NULL || ops->query_mkey == NULL || req == NULL)
        return orb_fail(ORB_EINVAL, "devx: no device operations or request");
    uint8_t out[ORB_DEVX_QUERY_OUT_LEN];
    memset(out, 0, sizeof out);
    int rc = ops->query_mkey(impl, dev_fd, req->obj_handle, req->key, out, sizeof out);
    if (rc != 0)
        return rc;
    struct orb_devx_mkey m;
    rc = orb_devx_decode_mkey(out, sizeof out, &m);
    if (rc != 0)
        return rc;
    return orb_devx_check_mkey(&m, req);
}

/* ---- the real device access ------------------------------------------------------------------ */

int orb_devx_query_errno_status(int err, uint32_t obj_handle, uint32_t key)
{
    switch (err) {
    case ENOTTY:          /* no uverbs ioctl on this file */
    case EOPNOTSUPP:      /* the driver has no such object or method */
    case EPROTONOSUPPORT: /* the uverbs core knows no such object or method */
    case ENOSYS:
        return orb_fail(ORB_EUNAVAILABLE, "devx: no DevX object query on this device: %s", strerror(err));
    case ENOENT:
        return orb_fail(ORB_EPERM, "devx: key 0x%08x: no object with handle %u in this device context", key,
                        obj_handle);
    case EINVAL:
        return orb_fail(ORB_EPERM, "devx: key 0x%08x: object %u is not this key (or the context has no DevX)",
                        key, obj_handle);
    case EREMOTEIO:
        return orb_fail(ORB_EPERM, "devx: key 0x%08x: the device failed QUERY_MKEY on object %u", key, obj_handle);
    default:
        /* Fail closed: whatever else the kernel says, the key is not shown to be what was asked. */
        return orb_fail(ORB_EPERM, "devx: key 0x%08x: QUERY_MKEY on object %u refused: %s", key, obj_handle,
                        strerror(err));
    }
}

/* MLX5_IB_METHOD_DEVX_OBJ_QUERY: the object handle (an IDR attribute: the handle is the data,
 * the length 0) and the command in and out buffers, as rdma-core builds it. */
static int kernel_query_mkey(void *impl, int dev_fd, uint32_t obj_handle, uint32_t key, uint8_t *out, size_t out_len)
{
    (void)impl;
    if (dev_fd < 0 || out == NULL || out_len != ORB_DEVX_QUERY_OUT_LEN)
        return orb_fail(ORB_EINVAL, "devx: bad query arguments");
    uint8_t in[ORB_DEVX_QUERY_IN_LEN];
    orb_devx_encode_query(key, in);
    struct orb_uverbs_attr attrs[] = {
        {MLX5_IB_ATTR_DEVX_OBJ_QUERY_HANDLE, 0, obj_handle},
        {MLX5_IB_ATTR_DEVX_OBJ_QUERY_CMD_IN, sizeof in, orb_uverbs_ptr(in)},
        {MLX5_IB_ATTR_DEVX_OBJ_QUERY_CMD_OUT, (uint16_t)out_len, orb_uverbs_ptr(out)},
    };
    int err = orb_uverbs_call(dev_fd, RDMA_DRIVER_MLX5, MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_METHOD_DEVX_OBJ_QUERY,
                              attrs, sizeof attrs / sizeof attrs[0]);
    if (err == 0)
        return 0;
    if (err == EREMOTEIO) /* the kernel copied the failed command's output: name the failure */
        return orb_fail(ORB_EPERM, "devx: key 0x%08x: the device failed QUERY_MKEY on object %u (status 0x%02x, "
                        "syndrome 0x%08x)", key, obj_handle, out[0], orb_be32_get(out + 4));
    return orb_devx_query_errno_status(err, obj_handle, key);
}

const struct orb_devx_ops orb_devx_kernel_ops = {.query_mkey = kernel_query_mkey};
