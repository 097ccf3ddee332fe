/* gpu_source_reuse: grants of Direct device memory on the connection's own queue pairs, by DevX
 * keys (rdma/devx_key.h), where each NIC proved at registration that it can make them.
 *
 * The probe, per NIC of a new Direct device registration: make one key exactly as a grant would
 * (a READ key over the registration's first bytes, bound to a queue pair made for the probe, on
 * the registration's own local-only MR), have the helper read it back and check it, destroy it.
 * Only a NIC that passes serves the registration's grants by keys; any other (not mlx5, no DevX,
 * opened without the helper, a device that binds keys only to the wildcard QP, a check that
 * fails) keeps the private grant path for it, and the log says why. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "helper/helper_client.h"
#include "rdma/devx_key.h"
#include "rdma/rdma_data.h"
#include "rdma/rdma_transport.h"

static int helper_verify(void *impl, const struct orb_hp_devx_verify *v)
{
    if (impl == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "devx: no helper session to verify the key");
    return orb_helper_devx_verify(impl, v);
}

int rdma_reuse_site(struct orb_rdma_tp *tp, uint32_t nic, struct orb_devx_key_site *out)
{
    struct rdma_ctx *x = nic < ORB_TOPO_MAX_NICS ? tp->dctx[nic] : NULL;
    if (x == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: NIC %u carries no rails", nic);
    bool scripted = tp->env.devx_ops != NULL;
    if (!scripted && tp->dev.nics[nic].route != ORB_RDMA_ROUTE_IMPORTED)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: NIC %s was opened here, not through the helper, which alone can "
                        "verify its keys", tp->dev.nics[nic].name);
    *out = (struct orb_devx_key_site){
        .ops = scripted ? tp->env.devx_ops : &orb_devx_key_kernel_ops,
        .impl = scripted ? tp->env.impl : NULL,
        .verify = scripted && tp->env.devx_verify != NULL ? tp->env.devx_verify : helper_verify,
        .verify_impl = scripted && tp->env.devx_verify != NULL ? tp->env.impl : (void *)tp->disc.helper,
        .ctx = x->ctx,
        .pd = x->pd,
        .nic = tp->dev.nics[nic].name,
        .history = &x->windows,
    };
    return 0;
}

/* One NIC's probe: 0 when a key made and checked as a grant's would be passed. */
static int probe_nic(struct orb_rdma_tp *tp, uint32_t nic, uint32_t lkey, uint64_t base, uint64_t len)
{
    struct orb_devx_key_site site;
    int rc = rdma_reuse_site(tp, nic, &site);
    if (rc != 0)
        return rc;
    struct rdma_ctx *x = tp->dctx[nic];
    struct ibv_cq *cq = tp->v->create_cq(x->ctx, 1, NULL, NULL, 0);
    if (cq == NULL)
        return orb_fail(ORB_ERESOURCE, "rdma: no completion queue for the key probe on %s", site.nic);
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 1;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    struct ibv_qp *qp = tp->v->create_qp(x->pd, &ia);
    if (qp == NULL) {
        rc = orb_fail(ORB_ERESOURCE, "rdma: no queue pair for the key probe on %s", site.nic);
        goto destroy_cq;
    }
    struct orb_devx_key k;
    uint64_t n = len < ORB_DEVX_KEY_LEN_MAX ? len : ORB_DEVX_KEY_LEN_MAX;
    pthread_mutex_lock(&x->wlock);
    rc = orb_devx_key_make(&site, qp->qp_num, lkey, base, n, ORB_OP_READ, &k);
    if (rc == 0 && orb_devx_key_destroy(&site, &k) != 0)
        rc = orb_fail(ORB_EUNQUIESCED, "rdma: the probe key on %s could not be destroyed: %s", site.nic,
                      orb_last_error());
    pthread_mutex_unlock(&x->wlock);
    if (tp->v->destroy_qp(qp) != 0)
        atomic_fetch_add(&tp->kept_qps, 1); /* a QP of no connection: kept, harmless */
destroy_cq:
    if (tp->v->destroy_cq(cq) != 0)
        ORB_LOGW("rdma: the key probe's completion queue on %s could not be destroyed", site.nic);
    return rc;
}

uint64_t rdma_reuse_probe(struct orb_rdma_tp *tp, const struct orb_rdma_reg_mrs *m, uint64_t base, uint64_t len,
                          bool *keep_out)
{
    uint64_t ok = 0;
    bool failed = false;
    *keep_out = false;
    for (uint32_t nic = 0; nic < m->nslots && nic < ORB_TOPO_MAX_NICS; nic++) {
        /* A NIC that carries no rails serves no grant: nothing to prove there. */
        if (!(m->nic_mask & (UINT64_C(1) << nic)) || m->mr[nic].local == NULL || tp->dctx[nic] == NULL)
            continue;
        int rc = probe_nic(tp, nic, m->mr[nic].local->lkey, base, len);
        if (rc == 0) {
            ok |= UINT64_C(1) << nic;
            continue;
        }
        failed = true;
        if (rc == ORB_EUNQUIESCED) {
            atomic_fetch_add(&tp->kept_keys, 1);
            *keep_out = true; /* a key over these bytes may be in force: they stay */
        }
        ORB_LOGI("rdma: gpu_source_reuse is not available on NIC %s for this registration (its grants stay "
                 "private): %s", tp->dev.nics[nic].name, orb_last_error());
    }
    if (failed)
        atomic_fetch_add(&tp->reuse_probe_failures, 1);
    return ok;
}
