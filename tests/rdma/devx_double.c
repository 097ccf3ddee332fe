/* The DevX key double (devx_double.h). */
#include "devx_double.h"

#include <endian.h>
#include <pthread.h>
#include <string.h>

#include "common/mlx5_mkey.h"
#include "core/error.h"
#include "helper/devx.h"
#include "rdma/verbs.h"
#include "verbs_interposer.h"

#define MAX_PDS 64u

struct key_record {
    struct devx_double_key k;
    uint8_t cmd[ORB_DEVX_CREATE_IN_MAX]; /* the device's record: what QUERY_MKEY reads back */
    size_t cmd_len;
    uint32_t handle;                     /* its DevX object (numbered apart from the key) */
    struct ibv_context *ctx;             /* the device it lives on */
    bool remote_inval;                   /* en_rinval: a peer's SEND_WITH_INV may end it */
    bool routed;                         /* its QP was connected when it was made: */
    union ibv_gid qp_gid;                /* that QP's own GID */
    struct ibv_mr *mr;                   /* the key's access; NULL once revoked */
};

/* Object handles: apart from key indices, so that confusing the two fails. */
#define HANDLE_BASE 0x10000u
#define HANDLE_STEP 7u

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *(*device_view)(unsigned long long addr, size_t len);
static struct key_record keys[DEVX_DOUBLE_MAX_KEYS];
static size_t nkeys;
static struct {
    struct ibv_pd *pd;
    uint32_t pdn;
} pds[MAX_PDS];
static struct {
    uint32_t skip, count;
} faults[DEVX_DOUBLE_FAULTS];
static struct devx_double_counts counts;

void devx_double_fault(enum devx_double_fault f, uint32_t skip, uint32_t count)
{
    pthread_mutex_lock(&lock);
    faults[f].skip = count > 0 ? skip : 0;
    faults[f].count = count;
    pthread_mutex_unlock(&lock);
}

/* Whether this call has fault `f` (caller holds the lock). */
static bool take_fault(enum devx_double_fault f)
{
    if (faults[f].count == 0)
        return false;
    if (faults[f].skip > 0) {
        faults[f].skip--;
        return false;
    }
    faults[f].count--;
    return true;
}

struct devx_double_counts devx_double_counts(void)
{
    pthread_mutex_lock(&lock);
    struct devx_double_counts c = counts;
    pthread_mutex_unlock(&lock);
    return c;
}

bool devx_double_key(size_t n, struct devx_double_key *out)
{
    pthread_mutex_lock(&lock);
    bool ok = n < nkeys;
    if (ok)
        *out = keys[n].k;
    pthread_mutex_unlock(&lock);
    return ok;
}

/* The record of key `key`, NULL when the double did not make it (caller holds the lock). */
static struct key_record *record_of(uint32_t key)
{
    uint32_t index = key >> 8;
    if (index < DEVX_DOUBLE_INDEX_BASE || index - DEVX_DOUBLE_INDEX_BASE >= nkeys)
        return NULL;
    struct key_record *r = &keys[index - DEVX_DOUBLE_INDEX_BASE];
    return r->k.key == key ? r : NULL;
}

/* The record of the object `handle`, NULL when there is none (caller holds the lock). */
static struct key_record *record_of_handle(uint32_t handle)
{
    if (handle < HANDLE_BASE || (handle - HANDLE_BASE) % HANDLE_STEP != 0)
        return NULL;
    size_t n = (handle - HANDLE_BASE) / HANDLE_STEP;
    return n < nkeys ? &keys[n] : NULL;
}

/* Revoke a key's access (caller holds the lock): its region goes. */
static void revoke(struct key_record *r)
{
    if (r->mr != NULL && itp_real()->dereg_mr(r->mr) == 0)
        r->mr = NULL;
}

/* ---- the device's calls ------------------------------------------------------------------------ */

static int dd_pdn(void *impl, struct ibv_pd *pd, uint32_t *pdn_out)
{
    (void)impl;
    pthread_mutex_lock(&lock);
    size_t i = 0;
    while (i < MAX_PDS && pds[i].pd != NULL && pds[i].pd != pd)
        i++;
    if (i == MAX_PDS) {
        pthread_mutex_unlock(&lock);
        return orb_fail(ORB_EUNAVAILABLE, "devx double: too many protection domains");
    }
    pds[i].pd = pd;
    pds[i].pdn = (uint32_t)i + 1;
    *pdn_out = pds[i].pdn;
    pthread_mutex_unlock(&lock);
    return 0;
}

static int dd_create(void *impl, struct ibv_context *ctx, const uint8_t *in, size_t in_len, uint8_t *out,
                     size_t out_len, uint32_t *handle_out)
{
    (void)impl;
    if (in_len < ORB_DEVX_CREATE_KLM_OFFSET + ORB_MKEY_KLM_SIZE || in_len > ORB_DEVX_CREATE_IN_MAX ||
        out_len < ORB_DEVX_CREATE_OUT_LEN || ((uint32_t)in[0] << 8 | in[1]) != ORB_DEVX_CMD_CREATE_MKEY)
        return orb_fail(ORB_EUNAVAILABLE, "devx double: not a CREATE_MKEY command");
    const uint8_t *mkc = in + ORB_DEVX_CREATE_MKC_OFFSET;
    uint32_t pdn = orb_be32_get(mkc + ORB_MKC_FLAGS12) & 0xFFFFFFu;
    uint64_t addr = orb_be64_get(mkc + ORB_MKC_START_ADDR), len = orb_be64_get(mkc + ORB_MKC_LEN);
    bool rr = (mkc[ORB_MKC_FLAGS2] & ORB_MKC_RR) != 0, rw = (mkc[ORB_MKC_FLAGS2] & ORB_MKC_RW) != 0;
    uint32_t translations = orb_be32_get(mkc + ORB_MKC_TRANSLATIONS);
    pthread_mutex_lock(&lock);
    int rc = 0;
    if (take_fault(DEVX_DOUBLE_CREATE_REFUSED)) {
        rc = orb_fail(ORB_EUNAVAILABLE, "devx double: CREATE_MKEY failed (status 0x%x, syndrome 0x%x)", 0x3u, 0xBADu);
        goto unlock;
    }
    if (nkeys == DEVX_DOUBLE_MAX_KEYS) {
        rc = orb_fail(ORB_ENOMEM, "devx double: no room for another key");
        goto unlock;
    }
    struct ibv_pd *pd = pdn >= 1 && pdn <= MAX_PDS ? pds[pdn - 1].pd : NULL;
    if (pd == NULL || pd->context != ctx) {
        rc = orb_fail(ORB_EUNAVAILABLE, "devx double: PD %u is not of this device", pdn);
        goto unlock;
    }
    /* The translation: each KLM entry inside a live MR of this PD, the entries one after the
     * other from the key's start to its end. */
    uint64_t next = addr;
    for (uint32_t i = 0; i < translations; i++) {
        const uint8_t *klm = in + ORB_DEVX_CREATE_KLM_OFFSET + i * ORB_MKEY_KLM_SIZE;
        uint32_t bytes = orb_be32_get(klm), lkey = orb_be32_get(klm + 4);
        uint64_t at = orb_be64_get(klm + 8);
        if (ORB_DEVX_CREATE_KLM_OFFSET + (i + 1) * ORB_MKEY_KLM_SIZE > in_len || at != next ||
            !itp_mr_covers(pd, lkey, at, bytes)) {
            rc = orb_fail(ORB_EUNAVAILABLE, "devx double: KLM entry %u (lkey 0x%x, 0x%llx +%u) is no range of an MR "
                          "of the PD", i, lkey, (unsigned long long)at, bytes);
            goto unlock;
        }
        next = at + bytes;
    }
    void *host = device_view != NULL && len > 0 ? device_view(addr, (size_t)len) : NULL;
    if (translations == 0 || next != addr + len || host == NULL) {
        rc = orb_fail(ORB_EUNAVAILABLE, "devx double: %u KLM entries do not translate 0x%llx +%llu", translations,
                      (unsigned long long)addr, (unsigned long long)len);
        goto unlock;
    }
    unsigned access = (rr ? IBV_ACCESS_REMOTE_READ : 0) | (rw ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE : 0);
    struct ibv_mr *mr = itp_real()->reg_mr_iova2(pd, host, (size_t)len, addr, access);
    if (mr == NULL) {
        rc = orb_fail(ORB_EUNAVAILABLE, "devx double: the key's region could not be registered");
        goto unlock;
    }
    struct key_record *r = &keys[nkeys];
    memset(r, 0, sizeof *r);
    memcpy(r->cmd, in, in_len);
    r->cmd_len = in_len;
    uint8_t *qpn_word = r->cmd + ORB_DEVX_CREATE_MKC_OFFSET + ORB_MKC_QPN;
    if (take_fault(DEVX_DOUBLE_WILDCARD))
        orb_be32_put(qpn_word, ORB_MKC_QPN_WILDCARD << 8 | qpn_word[3]);
    uint32_t index = DEVX_DOUBLE_INDEX_BASE + (uint32_t)nkeys;
    r->k = (struct devx_double_key){
        .key = index << 8 | qpn_word[3], .qpn = orb_be32_get(qpn_word) >> 8, .pdn = pdn, .addr = addr, .len = len,
        .remote_read = rr, .remote_write = rw,
    };
    r->mr = mr;
    r->ctx = ctx;
    r->handle = HANDLE_BASE + (uint32_t)nkeys * HANDLE_STEP;
    r->remote_inval = (mkc[ORB_MKC_FLAGS12] & ORB_MKC_EN_RINVAL) != 0;
    struct itp_qp_route route;
    r->routed = itp_qp_route(ctx, r->k.qpn, &route);
    if (r->routed)
        r->qp_gid = route.sgid;
    nkeys++;
    counts.creates++;
    counts.live++;
    memset(out, 0, out_len);
    orb_be32_put(out + 8, index);
    *handle_out = r->handle;
unlock:
    pthread_mutex_unlock(&lock);
    return rc;
}

static int dd_destroy(void *impl, struct ibv_context *ctx, uint32_t handle)
{
    (void)impl;
    pthread_mutex_lock(&lock);
    int rc = 0;
    struct key_record *r = record_of_handle(handle);
    if (r == NULL || r->k.destroyed || r->ctx != ctx)
        rc = orb_fail(ORB_EUNAVAILABLE, "devx double: no object %u", handle);
    else if (take_fault(DEVX_DOUBLE_DESTROY_REFUSED))
        rc = orb_fail(ORB_EUNAVAILABLE, "devx double: destroying object %u refused", handle);
    if (rc == 0) {
        revoke(r);
        r->k.destroyed = true;
        counts.destroys++;
        counts.live--;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static const struct orb_devx_key_ops ops = {.pdn = dd_pdn, .create = dd_create, .destroy = dd_destroy};

const struct orb_devx_key_ops *devx_double_ops(void)
{
    return &ops;
}

/* The helper's DEVX_VERIFY: QUERY_MKEY through the object, then the helper's own check. */
int devx_double_verify(void *impl, const struct orb_hp_devx_verify *v)
{
    (void)impl;
    pthread_mutex_lock(&lock);
    counts.verifies++;
    struct key_record *r = record_of(v->key);
    int rc = 0;
    if (r == NULL || r->k.destroyed || record_of_handle(v->obj_handle) != r) {
        rc = orb_fail(ORB_EPERM, "devx double: object %u is not key 0x%08x", v->obj_handle, v->key);
    } else {
        uint8_t q[ORB_DEVX_QUERY_OUT_LEN];
        memset(q, 0, sizeof q);
        memcpy(q + ORB_DEVX_MKC_OFFSET, r->cmd + ORB_DEVX_CREATE_MKC_OFFSET,
               ORB_DEVX_CREATE_KLM_OFFSET - ORB_DEVX_CREATE_MKC_OFFSET);
        memcpy(q + ORB_DEVX_KLM_OFFSET, r->cmd + ORB_DEVX_CREATE_KLM_OFFSET, r->cmd_len - ORB_DEVX_CREATE_KLM_OFFSET);
        struct orb_devx_mkey m;
        rc = orb_devx_decode_mkey(q, sizeof q, &m);
        if (rc == 0)
            rc = orb_devx_check_mkey(&m, v);
        if (rc == 0)
            r->k.verified = true;
    }
    if (rc != 0)
        counts.verify_failures++;
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- the wire: the QP binding, and invalidation ---------------------------------------------- */

static void on_post(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
    pthread_mutex_lock(&lock);
    for (; wr != NULL; wr = wr->next) {
        if (wr->opcode == IBV_WR_SEND_WITH_INV) {
            if (record_of(wr->invalidate_rkey) != NULL) {
                uint32_t key = wr->invalidate_rkey;
                wr->opcode = IBV_WR_SEND_WITH_IMM;
                wr->imm_data = htobe32(key);
            }
            continue;
        }
        if (wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE &&
            wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM)
            continue;
        if ((wr->wr.rdma.rkey >> 8) < DEVX_DOUBLE_INDEX_BASE)
            continue;
        struct key_record *r = record_of(wr->wr.rdma.rkey);
        bool in_force = r != NULL && r->mr != NULL && !r->k.invalidated && !r->k.destroyed;
        /* The device takes the key only from its own QP's peer: the QP this post goes on must
         * be connected to that QP's number at that QP's GID. */
        struct itp_qp_route route;
        bool bound = in_force && r->routed && itp_qp_route_of(qp, &route) && route.dest_qpn == r->k.qpn &&
                     memcmp(&route.dgid, &r->qp_gid, sizeof route.dgid) == 0;
        if (!bound) {
            counts.refused_posts++; /* the made-up key goes out: the device refuses it */
            continue;
        }
        wr->wr.rdma.rkey = r->mr->rkey;
        r->k.posts++;
    }
    pthread_mutex_unlock(&lock);
}

static void on_completions(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_RECV || !(wc[i].wc_flags & IBV_WC_WITH_IMM))
            continue;
        uint32_t key = be32toh(wc[i].imm_data);
        struct key_record *r = record_of(key);
        if (r == NULL)
            continue;
        if (r->ctx != cq->context || r->k.qpn != wc[i].qp_num || !r->remote_inval || r->k.invalidated ||
            r->k.destroyed) {
            /* The device refuses to invalidate a key not bound to this QP, not remotely
             * invalidatable, or no longer valid. */
            wc[i].status = IBV_WC_REM_INV_REQ_ERR;
            continue;
        }
        revoke(r);
        r->k.invalidated = true;
        counts.invalidations++;
        wc[i].wc_flags = (wc[i].wc_flags & ~(unsigned)IBV_WC_WITH_IMM) | IBV_WC_WITH_INV;
        wc[i].invalidated_rkey = key;
    }
    pthread_mutex_unlock(&lock);
}

void devx_double_install(void *(*view)(unsigned long long addr, size_t len))
{
    pthread_mutex_lock(&lock);
    device_view = view;
    pthread_mutex_unlock(&lock);
    itp_filter_posts(on_post);
    itp_filter_completions(on_completions);
}
