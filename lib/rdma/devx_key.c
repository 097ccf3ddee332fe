/* mlx5 DevX grant keys (see devx_key.h). */
#include "rdma/devx_key.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/mlx5dv.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/mlx5_user_ioctl_cmds.h>

#include <orbite/orbite.h>

#include "common/mlx5_mkey.h"
#include "common/uverbs.h"
#include "core/dynlib.h"
#include "core/error.h"

/* ---- the command ------------------------------------------------------------------------------ */

int orb_devx_key_encode(const struct orb_devx_key_spec *s, uint8_t in[ORB_DEVX_CREATE_IN_MAX], size_t *len_out)
{
    if (s == NULL || in == NULL || len_out == NULL)
        return orb_fail(ORB_EINVAL, "devx: NULL key, command or length");
    if (s->qpn > 0xFFFFFFu || s->qpn == ORB_MKC_QPN_WILDCARD)
        return orb_fail(ORB_EINVAL, "devx: qpn 0x%x is not one queue pair", s->qpn);
    if (s->pdn > 0xFFFFFFu)
        return orb_fail(ORB_EINVAL, "devx: pd number 0x%x over 24 bits", s->pdn);
    if (s->len == 0 || s->len > ORB_DEVX_KEY_LEN_MAX || s->addr > UINT64_MAX - s->len)
        return orb_fail(ORB_EINVAL, "devx: a key of %llu bytes at 0x%llx (1..%llu bytes, no wrap)",
                        (unsigned long long)s->len, (unsigned long long)s->addr,
                        (unsigned long long)ORB_DEVX_KEY_LEN_MAX);
    if (s->op != ORB_OP_READ && s->op != ORB_OP_WRITE)
        return orb_fail(ORB_EINVAL, "devx: op %d is neither READ nor WRITE", s->op);
    uint32_t entries = s->len > ORB_DEVX_KLM_BYTES_MAX ? 2u : 1u;
    size_t len = ORB_DEVX_CREATE_KLM_OFFSET + entries * ORB_MKEY_KLM_SIZE;
    memset(in, 0, ORB_DEVX_CREATE_IN_MAX);
    in[0] = (uint8_t)(ORB_DEVX_CMD_CREATE_MKEY >> 8); /* opcode; uid is the kernel's to set */
    in[1] = (uint8_t)(ORB_DEVX_CMD_CREATE_MKEY & 0xFFu);
    uint8_t *mkc = in + ORB_DEVX_CREATE_MKC_OFFSET;
    /* free 0, access_mode_4_2 0; umr_en 0, a 0; one remote right; local rights for the NIC's
     * own access through the parent; access_mode_1_0 = KLMs. */
    mkc[ORB_MKC_FLAGS2] = (uint8_t)((s->op == ORB_OP_READ ? ORB_MKC_RR : ORB_MKC_RW) | ORB_MKC_LR | ORB_MKC_LW |
                                    ORB_MKC_ACCESS_MODE_KLMS);
    orb_be32_put(mkc + ORB_MKC_QPN, s->qpn << 8 | s->variant);
    orb_be32_put(mkc + ORB_MKC_FLAGS12, s->pdn); /* length64 0, bsf_en 0 in the top byte ... */
    mkc[ORB_MKC_FLAGS12] = ORB_MKC_EN_RINVAL; /* ... and en_rinval set */
    orb_be64_put(mkc + ORB_MKC_START_ADDR, s->addr);
    orb_be64_put(mkc + ORB_MKC_LEN, s->len);
    orb_be32_put(mkc + ORB_MKC_TRANSLATIONS, entries);
    orb_be32_put(in + ORB_DEVX_CREATE_ACTUAL_SIZE_OFFSET, entries);
    uint64_t at = s->addr, left = s->len;
    for (uint32_t i = 0; i < entries; i++) {
        uint8_t *klm = in + ORB_DEVX_CREATE_KLM_OFFSET + i * ORB_MKEY_KLM_SIZE;
        uint64_t n = left > ORB_DEVX_KLM_BYTES_MAX ? ORB_DEVX_KLM_BYTES_MAX : left;
        orb_be32_put(klm, (uint32_t)n);
        orb_be32_put(klm + 4, s->parent_lkey);
        orb_be64_put(klm + 8, at);
        at += n;
        left -= n;
    }
    *len_out = len;
    return 0;
}

int orb_devx_key_decode_created(const uint8_t out[ORB_DEVX_CREATE_OUT_LEN], uint32_t *index_out)
{
    if (out == NULL || index_out == NULL)
        return orb_fail(ORB_EINVAL, "devx: NULL output");
    if (out[0] != 0)
        return orb_fail(ORB_EUNAVAILABLE, "devx: the device failed CREATE_MKEY (status 0x%02x, syndrome 0x%08x)", out[0],
                        orb_be32_get(out + 4));
    *index_out = orb_be32_get(out + 8) & 0xFFFFFFu;
    return 0;
}

/* ---- the kernel's table ----------------------------------------------------------------------- */

/* libmlx5, for the PD number only: loaded once, the provider libibverbs already loaded for an
 * mlx5 context (the same object, so its PDs are the ones it knows). */
static pthread_once_t g_mlx5_once = PTHREAD_ONCE_INIT;
static struct mlx5_calls {
    int (*init_obj)(struct mlx5dv_obj *obj, uint64_t obj_type);
} g_mlx5;
static const struct orb_dl_symbol mlx5_symbols[] = {
    {"mlx5dv_init_obj", offsetof(struct mlx5_calls, init_obj), true},
};
static char g_mlx5_why[200];

static void mlx5_load(void)
{
    void *handle = NULL;
    if (orb_dl_open("devx", "libmlx5.so.1", mlx5_symbols, 1, &g_mlx5, sizeof g_mlx5, NULL, &handle) != 0)
        snprintf(g_mlx5_why, sizeof g_mlx5_why, "%s", orb_last_error());
}

static int kernel_pdn(void *impl, struct ibv_pd *pd, uint32_t *pdn_out)
{
    (void)impl;
    (void)pthread_once(&g_mlx5_once, mlx5_load);
    if (g_mlx5.init_obj == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "%s", g_mlx5_why);
    struct mlx5dv_pd dpd;
    memset(&dpd, 0, sizeof dpd);
    struct mlx5dv_obj obj;
    memset(&obj, 0, sizeof obj);
    obj.pd.in = pd;
    obj.pd.out = &dpd;
    int err = g_mlx5.init_obj(&obj, MLX5DV_OBJ_PD);
    if (err != 0)
        return orb_fail(ORB_EUNAVAILABLE, "devx: mlx5dv_init_obj(PD) failed: %s (not an mlx5 PD?)",
                        strerror(err < 0 ? -err : err));
    *pdn_out = dpd.pdn;
    return 0;
}

static int devx_errno(int err, const char *what)
{
    if (err == ENOMEM)
        return orb_fail(ORB_ENOMEM, "devx: %s: %s", what, strerror(err));
    return orb_fail(ORB_EUNAVAILABLE, "devx: %s refused: %s%s", what, strerror(err),
                    err == EOPNOTSUPP || err == EPROTONOSUPPORT || err == ENOTTY ? " (no DevX on this device)"
                    : err == EINVAL ? " (a context without DevX?)"
                                    : "");
}

static int kernel_create(void *impl, struct ibv_context *ctx, const uint8_t *in, size_t in_len, uint8_t *out,
                         size_t out_len, uint32_t *handle_out)
{
    (void)impl;
    if (ctx == NULL || in_len > UINT16_MAX || out_len > UINT16_MAX)
        return orb_fail(ORB_EINVAL, "devx: bad create arguments");
    struct orb_uverbs_attr attrs[] = {
        {MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE, 0, 0},
        {MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_IN, (uint16_t)in_len, orb_uverbs_ptr(in)},
        {MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT, (uint16_t)out_len, orb_uverbs_ptr(out)},
    };
    int err = orb_uverbs_call(ctx->cmd_fd, RDMA_DRIVER_MLX5, MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_METHOD_DEVX_OBJ_CREATE,
                              attrs, sizeof attrs / sizeof attrs[0]);
    if (err == EREMOTEIO) /* the kernel copied the failed command's output */
        return orb_fail(ORB_EUNAVAILABLE, "devx: the device failed CREATE_MKEY (status 0x%02x, syndrome 0x%08x)",
                        out_len > 0 ? out[0] : 0, out_len >= 8 ? orb_be32_get(out + 4) : 0);
    if (err != 0)
        return devx_errno(err, "DevX object creation");
    *handle_out = (uint32_t)attrs[0].data;
    return 0;
}

static int kernel_destroy(void *impl, struct ibv_context *ctx, uint32_t handle)
{
    (void)impl;
    if (ctx == NULL)
        return orb_fail(ORB_EINVAL, "devx: no context");
    struct orb_uverbs_attr attrs[] = {{MLX5_IB_ATTR_DEVX_OBJ_DESTROY_HANDLE, 0, handle}};
    int err = orb_uverbs_call(ctx->cmd_fd, RDMA_DRIVER_MLX5, MLX5_IB_OBJECT_DEVX_OBJ, MLX5_IB_METHOD_DEVX_OBJ_DESTROY,
                              attrs, 1);
    if (err != 0)
        return orb_fail(err == ENOMEM ? ORB_ENOMEM : ORB_EUNAVAILABLE, "devx: destroying object %u refused: %s",
                        handle, strerror(err));
    return 0;
}

const struct orb_devx_key_ops orb_devx_key_kernel_ops = {
    .pdn = kernel_pdn,
    .create = kernel_create,
    .destroy = kernel_destroy,
};

/* ---- making and destroying keys --------------------------------------------------------------- */

/* The device hands back a spent key (its index reused with our low byte) at most this often in a
 * row before the key is refused. */
#define SPENT_RETRIES 4

/* Destroy a key that must not be published; the cause of the failure stays the message. */
static int discard(const struct orb_devx_key_site *site, uint32_t handle, int status)
{
    char why[256];
    snprintf(why, sizeof why, "%s", orb_last_error());
    if (site->ops->destroy(site->impl, site->ctx, handle) != 0)
        return orb_fail(ORB_EUNQUIESCED, "%s; and the failed key's object %u could not be destroyed (%s)", why,
                        handle, orb_last_error());
    return orb_fail(status, "%s", why);
}

int orb_devx_key_make(const struct orb_devx_key_site *site, uint32_t qpn, uint32_t parent_lkey, uint64_t addr,
                      uint64_t len, int op, struct orb_devx_key *out)
{
    if (site == NULL || site->ops == NULL || site->verify == NULL || site->history == NULL || site->nic == NULL ||
        out == NULL)
        return orb_fail(ORB_EINVAL, "devx: NULL site or output");
    struct orb_devx_key_spec s = {
        .qpn = qpn, .parent_lkey = parent_lkey, .addr = addr, .len = len, .op = op,
        /* A low byte that differs from one key to the next; the history decides what is spent. */
        .variant = ++site->history->next_variant,
    };
    int rc = site->ops->pdn(site->impl, site->pd, &s.pdn);
    if (rc != 0)
        return rc;
    for (int attempt = 0; attempt < SPENT_RETRIES; attempt++) {
        uint8_t in[ORB_DEVX_CREATE_IN_MAX], res[ORB_DEVX_CREATE_OUT_LEN];
        size_t in_len = 0;
        if ((rc = orb_devx_key_encode(&s, in, &in_len)) != 0)
            return rc;
        memset(res, 0, sizeof res);
        uint32_t handle = 0, index = 0;
        if ((rc = site->ops->create(site->impl, site->ctx, in, in_len, res, sizeof res, &handle)) != 0)
            return rc;
        if ((rc = orb_devx_key_decode_created(res, &index)) != 0)
            return discard(site, handle, rc);
        uint32_t key = index << 8 | s.variant;
        if (orb_rdma_key_history_used(site->history, key)) {
            /* The device reused an index whose key carried this byte before: that key must
             * never be in force again. Another byte the index never carried, another try. */
            int next = orb_rdma_key_history_next(site->history, key, s.variant);
            (void)orb_fail(ORB_ERESOURCE, "devx: the device handed out spent key 0x%08x again", key);
            if (discard(site, handle, ORB_ERESOURCE) == ORB_EUNQUIESCED)
                return ORB_EUNQUIESCED;
            if (next < 0)
                return orb_fail(ORB_ERESOURCE, "devx: key index 0x%06x has carried every low byte", index);
            s.variant = (uint8_t)next;
            continue;
        }
        if ((rc = orb_rdma_key_history_claim(site->history, key)) != 0)
            return discard(site, handle, rc);
        struct orb_hp_devx_verify v;
        memset(&v, 0, sizeof v);
        snprintf(v.nic, sizeof v.nic, "%s", site->nic);
        v.obj_handle = handle;
        v.key = key;
        v.qpn = qpn;
        v.addr = addr;
        v.length = len;
        v.access = op == ORB_OP_READ ? 1u : 2u; /* the helper's READ / WRITE */
        if ((rc = site->verify(site->verify_impl, &v)) != 0)
            return discard(site, handle, rc);
        *out = (struct orb_devx_key){.handle = handle, .key = key};
        return 0;
    }
    return orb_fail(ORB_ERESOURCE, "devx: the device handed out %d spent keys in a row", SPENT_RETRIES);
}

int orb_devx_key_destroy(const struct orb_devx_key_site *site, const struct orb_devx_key *k)
{
    if (site == NULL || site->ops == NULL || k == NULL)
        return orb_fail(ORB_EINVAL, "devx: NULL site or key");
    return site->ops->destroy(site->impl, site->ctx, k->handle);
}
