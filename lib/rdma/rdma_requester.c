/* The RDMA transport's requester side: peers, plans, grants, posting and completion (see
 * rdma_data.h). */
#include "rdma/rdma_data.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <linux/futex.h>
#include <sys/syscall.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/thread_name.h"
#include "cuda/cuda_memory.h"
#include "rdma/outcome.h"
#include "rdma/rdma_transport.h"

/* How long a source whose device refused a granted window has to answer a PING. */
#define RDMA_PING_NS (1000ull * 1000000ull)

#define DISCONNECT_WAIT_NS (1ull * 1000000000ull)
#define HEAL_SPACING_NS (1ull * 1000000000ull) /* rebuilds for a rail others stand in for */
#define FENCE_NAP_NS (10ull * 1000000ull)     /* fence waits look at stop this often */
#define MAX_REQUEST_BYTES (64ull << 30) /* 64 slices of at most 1 GiB: one WR each */

static uint32_t popcount(uint32_t v)
{
    return (uint32_t)__builtin_popcount(v);
}

/* The offset of piece `x` in its request (local and remote offsets move together). */
static uint64_t piece_offset(const struct rdma_req *r, const struct orb_xfer *x)
{
    return x->remote_addr - r->addr;
}

/* The part of live piece `x` inside r's current slot: its offset in the request and its length.
 * false: the piece has no byte in the slot. */
static bool piece_part(const struct rdma_req *r, const struct orb_xfer *x, uint64_t *off, uint64_t *len)
{
    if (x == NULL)
        return false;
    uint64_t lo = piece_offset(r, x), hi = lo + x->length;
    uint64_t slo = r->slot_off, shi = r->slot_off + r->slot_len;
    if (hi <= slo || lo >= shi)
        return false;
    *off = lo > slo ? lo : slo;
    *len = (hi < shi ? hi : shi) - *off;
    return true;
}

/* The length of r's slot starting at r->slot_off. */
static uint64_t slot_length(const struct rdma_req *r)
{
    uint64_t left = r->length - r->slot_off;
    return r->slot_max != 0 && r->slot_max < left ? r->slot_max : left;
}

/* ---- peers ------------------------------------------------------------------------------------- */

/* Rail k of a connection to the health table: the pair of this engine's NIC and the source's
 * behind it, under the source's epoch. */
static struct orb_rail_key rail_key(const struct rdma_peer *p, uint32_t rail)
{
    return (struct orb_rail_key){.peer = p->source_epoch,
                                 .local_nic = (uint16_t)p->tp->rail_nic[rail],
                                 .remote_nic = p->remote_nic[rail]};
}

/* The rails of `rails` whose NIC pair with p's source is healthy. */
static uint32_t healthy_rails(struct orb_rdma_tp *tp, const struct rdma_peer *p, uint32_t rails)
{
    uint16_t remote_of_local[ORB_RAIL_MAX_NICS] = {0};
    uint64_t nics = 0;
    for (uint32_t m = rails; m != 0; m &= m - 1) {
        uint32_t k = (uint32_t)__builtin_ctz(m);
        nics |= 1ull << tp->rail_nic[k];
        remote_of_local[tp->rail_nic[k]] = p->remote_nic[k];
    }
    uint64_t ok = orb_rail_usable_mask(tp->health, &p->source_epoch, nics, remote_of_local);
    uint32_t out = 0;
    for (uint32_t m = rails; m != 0; m &= m - 1) {
        uint32_t k = (uint32_t)__builtin_ctz(m);
        if (ok & (1ull << tp->rail_nic[k]))
            out |= 1u << k;
    }
    return out;
}


static void peer_free_now(struct rdma_peer *p)
{
    struct orb_rdma_tp *tp = p->tp;
    pthread_mutex_lock(&tp->lock);
    for (struct rdma_peer **pp = &tp->peers; *pp != NULL; pp = &(*pp)->all_next) {
        if (*pp == p) {
            *pp = p->all_next;
            break;
        }
    }
    pthread_mutex_unlock(&tp->lock);
    rdma_links_drop(p->links, 0, p->nrails * p->width);
    if (tp->health != NULL)
        (void)orb_rail_forget_peer(tp->health, &p->source_epoch);
    pthread_cond_destroy(&p->fence_cond);
    pthread_mutex_destroy(&p->reconnect_lock);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* A connection for `p` under a fresh incarnation, through CONNECT/CONNECT_OK on `ctl`: `width`
 * lanes of one queue pair per rail (lane j's of rail k at links[j * tp->nrails + k], each on its
 * own lane thread as far as there are lanes), the width being the smaller lane count of the two
 * engines and at most ORB_RDMA_MAX_RAILS queue pairs, narrower where a budget (max_endpoints,
 * max_cqes) at either end cannot hold more; at least one lane, or the connection fails. Into
 * links, *width_out and *incarnation_out; on failure nothing of it is left. */
static int connect_rails(struct orb_rdma_tp *tp, struct rdma_peer *p, const struct orb_control_path *ctl,
                         uint64_t deadline, struct rdma_link *links[ORB_RDMA_MAX_RAILS], uint32_t *width_out,
                         uint64_t *incarnation_out)
{
    struct orb_rdma_connect c;
    memset(&c, 0, sizeof c);
    c.incarnation = orb_random_u64();
    const uint32_t rails = tp->nrails;
    uint32_t width = tp->nlanes < ORB_RDMA_MAX_RAILS / rails ? tp->nlanes : ORB_RDMA_MAX_RAILS / rails;
    uint32_t base = (uint32_t)(c.incarnation % tp->nlanes); /* connections start on different lanes */
    uint32_t made = 0;
    int rc = 0;
    for (uint32_t q = 0; q < rails * width; q++) {
        uint32_t k = q % rails, j = q / rails;
        struct rdma_ctx *x = tp->dctx[tp->rail_nic[k]];
        rc = rdma_link_new(tp, x, RDMA_ROLE_REQUESTER, k, (base + k + j) % tp->nlanes, p, &links[q]);
        if (rc == ORB_ERESOURCE && j > 0) {
            ORB_LOGD("rdma: %s: %u lane(s) of %u: %s", p->endpoint, j, width, orb_last_error());
            width = j;
            break;
        }
        if (rc != 0)
            goto free_links;
        made++;
        c.qps[q].nic = (uint8_t)x->nic;
        c.qps[q].qp = links[q]->qp->local;
        /* A rail whose port is down here is made (the places of the others depend on it) but
         * not connected. */
        c.qps[q].unconnected = (atomic_load(&tp->routes_down) & (1u << k)) != 0;
    }
    rdma_links_drop(links, rails * width, made); /* a lane cut short */
    made = rails * width;
    c.nqps = made;
    c.lanes = width;
    uint8_t msg[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
    size_t len = 0, rlen = 0;
    if ((rc = orb_rdma_connect_encode(ORB_RDMA_CONNECT, &c, msg, sizeof msg, &len)) != 0)
        goto free_links;
    rc = ctl->call(ctl->peer, ORB_TRANSPORT_RDMA, msg, len, resp, sizeof resp, &rlen, deadline);
    if (rc != 0) {
        rc = orb_fail_wrap(rc, "rdma: CONNECT to %s", p->endpoint);
        goto free_links;
    }
    struct orb_rdma_connect ok;
    if (orb_rdma_connect_decode(ORB_RDMA_CONNECT_OK, resp, rlen, &ok) != 0 || ok.incarnation != c.incarnation ||
        ok.lanes > width || ok.nqps != rails * ok.lanes) {
        rc = orb_fail(ORB_EPROTO, "rdma: %s answered CONNECT with a malformed CONNECT_OK", p->endpoint);
        goto free_links;
    }
    /* The source may hold fewer lanes (its own lane count or budget): the rest go. */
    rdma_links_drop(links, ok.nqps, made);
    made = ok.nqps;
    width = ok.lanes;
    /* Every lane of a rail is the same NIC at the source, and a rebuild keeps the NICs: the
     * rail's health is theirs. */
    bool first = p->nrails == 0;
    for (uint32_t q = 0; q < made; q++) {
        uint32_t k = q % rails;
        uint8_t known = q < rails && first ? ok.qps[q].nic : p->remote_nic[k];
        if (ok.qps[q].nic != known) {
            rc = orb_fail(ORB_EPROTO, "rdma: %s put NIC %u behind rail %u where it had NIC %u", p->endpoint,
                          ok.qps[q].nic, k, known);
            goto free_links;
        }
        if (q < rails && first)
            p->remote_nic[k] = known;
    }
    /* A rail either end leaves unconnected, or that fails to connect here, is out of this
     * connection on every lane (its queue pairs fail at once); the others carry it. One the
     * source left out, or that failed here, counts against the rail's health; a port down here
     * does not (the monitor brings that back). */
    uint32_t dead = 0, path = 0;
    char dead_why[200] = "";
    for (uint32_t q = 0; q < made; q++) {
        uint32_t k = q % rails, bit = 1u << k;
        if (c.qps[q].unconnected) {
            dead |= bit;
            snprintf(dead_why, sizeof dead_why, "rail %u's port is down here", k);
            continue;
        }
        if (ok.qps[q].unconnected) {
            dead |= bit;
            path |= bit;
            snprintf(dead_why, sizeof dead_why, "the source left rail %u unconnected", k);
            continue;
        }
        if ((dead & bit) == 0 && rdma_link_connect(links[q], &ok.qps[q].qp) != 0) {
            dead |= bit;
            path |= bit;
            snprintf(dead_why, sizeof dead_why, "%s", orb_last_error());
        }
    }
    if (dead == (1u << rails) - 1) {
        rc = orb_fail(ORB_EUNAVAILABLE, "rdma: %s: no rail of the connection could be connected (%s)", p->endpoint, dead_why);
        goto free_links;
    }
    if (dead != 0) {
        ORB_LOGI("rdma: %s: rails 0x%x are left out of the connection for now: %s", p->endpoint, dead, dead_why);
        for (uint32_t q = 0; q < made; q++)
            if (dead & (1u << (q % rails)))
                rdma_link_fail(links[q], ORB_EUNAVAILABLE);
        for (uint32_t m = path; m != 0 && tp->health != NULL; m &= m - 1) {
            struct orb_rail_key key = rail_key(p, (uint32_t)__builtin_ctz(m));
            (void)orb_rail_record_failure(tp->health, &key);
        }
        pthread_mutex_lock(&p->lock);
        p->suspect |= path;
        pthread_mutex_unlock(&p->lock);
    }
    *width_out = width;
    *incarnation_out = c.incarnation;
    return 0;

free_links:
    {
        char why[256];
        snprintf(why, sizeof why, "%s", orb_last_error());
        rdma_links_drop(links, 0, made);
        (void)orb_fail(rc, "%s", why);
    }
    return rc;
}

/* Tell the source, briefly, on `ctl`, that connection `incarnation` of p is done with. */
static void send_disconnect(struct rdma_peer *p, const struct orb_control_path *ctl, uint64_t incarnation)
{
    uint8_t msg[16], resp[ORB_CONTROL_MAX];
    size_t len = 0, rlen = 0;
    if (orb_rdma_disconnect_encode(incarnation, msg, sizeof msg, &len) == 0 &&
        ctl->call(ctl->peer, ORB_TRANSPORT_RDMA, msg, len, resp, sizeof resp, &rlen,
                  orb_deadline_after(DISCONNECT_WAIT_NS)) != 0)
        ORB_LOGD("rdma: DISCONNECT of %s: %s", p->endpoint, orb_last_error());
}

/* The connection segments to (endpoint, epoch) may share, or NULL (tp->lock held). */
static struct rdma_peer *find_shared(struct orb_rdma_tp *tp, const char *endpoint, const struct orb_epoch *epoch)
{
    for (struct rdma_peer *p = tp->peers; p != NULL; p = p->all_next)
        if (p->shared && !p->released && strcmp(p->endpoint, endpoint) == 0 &&
            memcmp(p->source_epoch.bytes, epoch->bytes, sizeof epoch->bytes) == 0)
            return p;
    return NULL;
}

int rdma_peer_open(void *tp_, const char *endpoint, const struct orb_epoch *expected, uint64_t deadline,
                   const struct orb_control_path *ctl, void **peer_out)
{
    struct orb_rdma_tp *tp = tp_;
    if (!tp->data)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: no NIC of this engine carries requests");
    if (ctl == NULL || ctl->call == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: no control path to %s", endpoint);
    if (atomic_load(&tp->stopping))
        return orb_fail(ORB_ECLOSED, "rdma: the transport stopped");
    struct rdma_seg *s = calloc(1, sizeof *s);
    if (s == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for a segment");
    s->ctl = *ctl;
    /* Staging moves each request through extents of one arena, and the specification keeps such
     * connections apart: only engines that do not stage host memory share. */
    bool share = !tp->host_staged;
    int rc = 0;
    pthread_mutex_lock(&tp->lock);
    for (struct rdma_peer *p; share && (p = find_shared(tp, endpoint, expected)) != NULL;) {
        if (!p->building) {
            p->users++;
            pthread_mutex_unlock(&tp->lock);
            s->p = p;
            *peer_out = s;
            return 0;
        }
        /* Another segment is connecting it: wait for that (without holding anything across its
         * I/O); should it fail, this one builds its own. */
        if (atomic_load(&tp->stopping)) {
            pthread_mutex_unlock(&tp->lock);
            rc = orb_fail(ORB_ECLOSED, "rdma: the transport stopped");
            goto free_seg;
        }
        if (orb_now_ns() >= deadline) {
            pthread_mutex_unlock(&tp->lock);
            rc = orb_fail(ORB_ETIMEDOUT, "rdma: the connection to %s that another segment is making did not "
                                         "come up in time", endpoint);
            goto free_seg;
        }
        struct timespec ts = orb_deadline_timespec(deadline);
        pthread_cond_timedwait(&tp->built, &tp->lock, &ts);
    }
    /* Cold: this segment builds the connection; it is published as building first, so that a
     * segment opened meanwhile waits for it instead of making queue pairs of its own. */
    struct rdma_peer *p = calloc(1, sizeof *p);
    if (p == NULL) {
        pthread_mutex_unlock(&tp->lock);
        rc = orb_fail(ORB_ENOMEM, "rdma: out of memory for a connection");
        goto free_seg;
    }
    p->tp = tp;
    snprintf(p->endpoint, sizeof p->endpoint, "%s", endpoint);
    p->source_epoch = *expected;
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->reconnect_lock, NULL);
    (void)orb_cond_init_monotonic(&p->fence_cond);
    p->users = 1;
    p->building = true;
    p->shared = share;
    p->all_next = tp->peers;
    tp->peers = p;
    pthread_mutex_unlock(&tp->lock);
    uint32_t width = 0;
    rc = connect_rails(tp, p, &s->ctl, deadline, p->links, &width, &p->incarnation);
    pthread_mutex_lock(&tp->lock);
    p->building = false;
    if (rc == 0) {
        p->nrails = tp->nrails;
        p->width = width;
        atomic_fetch_add(&tp->connections, 1);
    } else
        p->released = true; /* nobody joins it; peer_free_now() unlinks it */
    pthread_cond_broadcast(&tp->built);
    pthread_mutex_unlock(&tp->lock);
    if (rc != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", orb_last_error());
        peer_free_now(p);
        (void)orb_fail(rc, "%s", why);
        goto free_seg;
    }
    ORB_LOGI("rdma: %s: %u rail(s) connected, %u lane(s)", endpoint, p->nrails, width);
    s->p = p;
    *peer_out = s;
    return 0;

free_seg:
    free(s);
    return rc;
}

void rdma_peer_release(void *peer)
{
    struct rdma_seg *s = peer;
    if (s == NULL)
        return;
    struct rdma_peer *p = s->p;
    struct orb_rdma_tp *tp = p->tp;
    pthread_mutex_lock(&tp->lock);
    bool last = --p->users == 0;
    if (last) {
        p->released = true; /* no segment joins it any more */
        atomic_fetch_sub(&tp->connections, 1);
    }
    pthread_mutex_unlock(&tp->lock);
    if (!last) {
        free(s);
        return;
    }
    /* The last segment: tell the source, briefly, on its control path (still open: the core
     * releases this transport's peer first); its queue pairs and their receives go. No grant
     * thread rebuilds the connection any more (every segment's requests ended). */
    if (!atomic_load(&tp->stopping)) {
        pthread_mutex_lock(&p->lock);
        uint64_t incarnation = p->incarnation;
        pthread_mutex_unlock(&p->lock);
        send_disconnect(p, &s->ctl, incarnation);
    }
    free(s);
    pthread_mutex_lock(&tp->lock);
    p->reap_next = tp->reap_peers;
    tp->reap_peers = p;
    bool lane = tp->lane_started;
    pthread_mutex_unlock(&tp->lock);
    if (!lane)
        rdma_req_reap(tp, true);
}

/* Free the retired queue pairs of private grants whose work requests are all in (`force`: all):
 * one with some still outstanding is failed first, so that they flush. */
static void reap_private_links(struct orb_rdma_tp *tp, bool force)
{
    pthread_mutex_lock(&tp->priv_lock);
    struct rdma_link *list = tp->priv_reap, *keep = NULL;
    tp->priv_reap = NULL;
    pthread_mutex_unlock(&tp->priv_lock);
    while (list != NULL) {
        struct rdma_link *l = list;
        list = l->reap_next;
        pthread_mutex_lock(&l->lock);
        uint32_t left = l->qp->track.count;
        int failed = l->failed;
        pthread_mutex_unlock(&l->lock);
        if (left > 0 && !force) {
            if (failed == 0)
                rdma_link_fail(l, ORB_ECLOSED);
            l->reap_next = keep;
            keep = l;
            continue;
        }
        (void)rdma_link_free(l); /* what the device keeps is counted there */
    }
    if (keep != NULL) {
        pthread_mutex_lock(&tp->priv_lock);
        struct rdma_link *tail = keep;
        while (tail->reap_next != NULL)
            tail = tail->reap_next;
        tail->reap_next = tp->priv_reap;
        tp->priv_reap = keep;
        pthread_mutex_unlock(&tp->priv_lock);
    }
}

void rdma_req_reap(struct orb_rdma_tp *tp, bool force)
{
    reap_private_links(tp, force);
    pthread_mutex_lock(&tp->lock);
    if (tp->reap_peers == NULL) {
        pthread_mutex_unlock(&tp->lock);
        return;
    }
    struct rdma_peer *ready = NULL, *keep = NULL;
    while (tp->reap_peers != NULL) {
        struct rdma_peer *p = tp->reap_peers;
        tp->reap_peers = p->reap_next;
        pthread_mutex_lock(&p->lock);
        bool idle = p->inflight == 0 && p->active == NULL && p->serving == 0;
        pthread_mutex_unlock(&p->lock);
        if (idle || force) {
            p->reap_next = ready;
            ready = p;
        } else {
            p->reap_next = keep;
            keep = p;
        }
    }
    tp->reap_peers = keep;
    pthread_mutex_unlock(&tp->lock);
    while (ready != NULL) {
        struct rdma_peer *next = ready->reap_next;
        peer_free_now(ready);
        ready = next;
    }
}

/* ---- plans and submission --------------------------------------------------------------------- */

int rdma_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan)
{
    const struct rdma_seg *seg = peer;
    struct rdma_peer *p = seg->p;
    struct orb_rdma_tp *tp = p->tp;
    /* Direct: the registration's own MRs on every rail. Staged (host memory by the host_memory
     * policy, device memory by cuda_memory): none, the staging arena's, the bytes copied with the
     * memory kind's own copies. */
    bool device = in->mem_kind != ORB_MEM_HOST;
    bool staged = device ? tp->cfg->cuda_memory == ORB_RDMA_CUDA_STAGED : tp->host_staged;
    if (device && staged) {
        const struct orb_memkind_ops *k = in->local_reg->kind;
        if (tp->staging == NULL || k->to_host == NULL || k->from_host == NULL)
            return orb_fail(ORB_EUNAVAILABLE, "rdma: %s memory cannot be staged here", k->name);
    }
    if (!staged) {
        const struct orb_rdma_reg_mrs *m = orb_rdma_tp_reg_mrs(in->local_reg);
        if (m == NULL)
            return orb_fail(ORB_EUNAVAILABLE, "rdma: the local registration has no memory regions");
        for (uint32_t k = 0; k < p->nrails; k++)
            if (orb_rdma_reg_mrs_on(m, tp->rail_nic[k]) == NULL)
                return orb_fail(ORB_EUNAVAILABLE, "rdma: the local registration has no memory region on rail %u",
                                k);
    }
    if (in->length > MAX_REQUEST_BYTES)
        return orb_fail(ORB_EINVAL, "rdma: a request of %llu bytes is above the %llu this release moves in one",
                        (unsigned long long)in->length, (unsigned long long)MAX_REQUEST_BYTES);
    struct orb_slice s[ORB_SLICE_MAX];
    uint32_t count = 0;
    int rc = orb_slice_plan(in->length, orb_slice_limit(in->op == ORB_XFER_WRITE, false), s, &count, NULL);
    if (rc != 0)
        return rc;
    struct orb_plan_piece *pieces;
    if ((rc = orb_plan_pieces(plan, count, &pieces)) != 0)
        return rc;
    struct rdma_req *r = in->request_private;
    r->peer = p;
    r->ctl = &seg->ctl;
    r->priority = in->priority <= ORB_PRIORITY_LOW ? in->priority : ORB_PRIORITY_HIGH;
    r->staged = staged;
    /* The specification keeps staged bytes off shared connections: a grant's own queue pairs. */
    r->per_grant = staged;
    r->priv_windows = false;
    r->op = in->op;
    r->addr = in->remote_addr;
    r->length = in->length;
    r->slot_max = staged ? 1ull << rdma_stage_slot_shift(tp, in->local_reg) : 0;
    r->slot_off = 0;
    r->slot_len = slot_length(r);
    r->npieces = count;
    for (uint32_t i = 0; i < count; i++) {
        pieces[i].offset = s[i].offset;
        pieces[i].length = s[i].length;
        pieces[i].rail = 0; /* chosen at dispatch (choose_rails) */
    }
    return 0;
}

/* The rails' tiers for the memory of `x`: its registration's node's row, else (staging, an
 * unknown node) the row of unknown locality. */
static const uint8_t *tier_row(const struct orb_rdma_tp *tp, const struct orb_xfer *x)
{
    const struct orb_rdma_reg_mrs *m = x->local_reg != NULL ? orb_rdma_tp_reg_mrs(x->local_reg) : NULL;
    int32_t node = m != NULL ? m->numa_node : ORB_TOPO_NUMA_UNKNOWN;
    if (node >= 0 && node < ORB_TOPO_MAX_NUMA && ((tp->numa_rows >> node) & 1u) != 0)
        return tp->rail_tier[1 + node];
    return tp->rail_tier[0];
}

/* Each live piece's rail, from the selector (grant thread, before the GRANT_REQ): the charges
 * go into r->lease, returned piece by piece as their WRs complete and the rest when the request
 * ends. */
static int choose_rails(struct orb_rdma_tp *tp, struct rdma_req *r, uint32_t allowed)
{
    struct orb_slice s[ORB_SLICE_MAX];
    uint32_t n = 0;
    const struct orb_xfer *first = NULL;
    for (uint32_t i = 0; i < r->npieces; i++) {
        const struct orb_xfer *x = r->pieces[i];
        if (!piece_part(r, x, &s[n].offset, &s[n].length))
            continue;
        first = first != NULL ? first : x;
        r->lease_slot[i] = (uint8_t)n++;
    }
    if (first == NULL)
        return orb_fail(ORB_EINVAL, "rdma: a request without pieces");
    int rc = orb_selector_select(tp->sel, tier_row(tp, first), allowed, s, n, &r->lease);
    if (rc != 0)
        return orb_fail_wrap(rc, "rdma: no rail for the request (the priority matrix, filters and rails "
                             "leave none for its memory)");
    r->leased = true;
    r->rail_mask = 0;
    for (uint32_t i = 0; i < r->npieces; i++) {
        struct orb_xfer *x = r->pieces[i];
        uint64_t off, len;
        if (!piece_part(r, x, &off, &len))
            continue;
        x->rail = orb_lease_nic(&r->lease, r->lease_slot[i]);
        r->rail_mask |= 1u << x->rail;
        if (tp->cfg->log_slice_affinity)
            ORB_LOGD("rdma: slice of %llu bytes at +%llu on rail %u (%s)", (unsigned long long)len,
                     (unsigned long long)off, x->rail, tp->dev.nics[tp->rail_nic[x->rail]].name);
    }
    return 0;
}

/* Append the requests linked from `first` (through next), whole and in order, to the grant
 * queue (glock held). */
static void enqueue_for_grants_locked(struct orb_rdma_tp *tp, struct rdma_req *first)
{
    while (first != NULL) {
        struct orb_qos_entry *e[64];
        size_t n = 0;
        for (; first != NULL && n < 64; first = first->next) {
            first->qe.priority = first->priority;
            first->qe.bytes = first->length;
            first->qe.deadline_ns = 0;
            e[n++] = &first->qe;
        }
        if (orb_qos_enqueue(&tp->gq, e, n) != 0) /* a request queued twice: a bug, said loudly */
            ORB_LOGE("rdma: requests could not be queued for their grants: %s", orb_last_error());
    }
}

/* Queue the requests linked from `first` for their grants and wake a grant thread. Called
 * without any peer's lock: the grant threads take the queue's lock, then a peer's. */
static void queue_for_grants(struct orb_rdma_tp *tp, struct rdma_req *first)
{
    pthread_mutex_lock(&tp->glock);
    enqueue_for_grants_locked(tp, first);
    rdma_grant_wake(tp, false);
    pthread_mutex_unlock(&tp->glock);
}

int rdma_peer_submit(void *peer, struct orb_xfer *const *xfers, size_t n)
{
    const struct rdma_seg *s = peer;
    struct rdma_peer *p = s->p;
    struct orb_rdma_tp *tp = p->tp;
    if (atomic_load(&tp->stopping))
        return orb_fail(ORB_ECLOSED, "rdma: the transport is stopped");
    /* No grant can be asked for on a dead control connection: refused whole, now, so that the
     * engine can tell a restarted source (ORB_ESTALE) from a lost one. */
    int lost = s->ctl.lost != NULL ? s->ctl.lost(s->ctl.peer) : 0;
    if (lost != 0)
        return orb_fail(lost, "rdma: the control connection to %s was lost (%s)", p->endpoint, orb_strerror(lost));
    struct rdma_req *first = NULL, **last = &first; /* whole requests, linked through next */
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < n; i++) {
        struct orb_xfer *x = xfers[i];
        struct rdma_req *r = x->request_private;
        if (x->piece_index >= r->npieces || r->pieces[x->piece_index] != NULL) {
            pthread_mutex_unlock(&p->lock);
            return orb_fail(ORB_EINVAL, "rdma: piece %u of a request is not its plan's", x->piece_index);
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct orb_xfer *x = xfers[i];
        struct rdma_req *r = x->request_private;
        r->pieces[x->piece_index] = x;
        if (++r->arrived == r->npieces) {
            r->next = NULL;
            *last = r;
            last = &r->next;
            atomic_fetch_add(&tp->inflight_reqs, 1);
        }
    }
    pthread_mutex_unlock(&p->lock);
    if (first != NULL)
        queue_for_grants(tp, first);
    return 0;
}

/* ---- ending requests -------------------------------------------------------------------------- */

/* End `r` (peer lock held): unhook it and collect its pieces; the caller reports them with
 * report_pieces() after unlocking (the core frees `r` with its last piece). */
struct rdma_ending {
    struct rdma_req *r;
    struct orb_xfer *pieces[ORB_SLICE_MAX];
    uint32_t n;
    int status;
    enum orb_remote_effect effect;
    bool replay;                   /* not ended: asked for again (report_pieces queues it) */
    bool advance;                  /* not ended: its slot did, the next one is asked for */
    char why[320];
};

/* Rail health's verdicts as `r` ends (p->lock held; the table's own lock nests inside it, and
 * the table calls nothing back): its trial's outcome; a failure for each rail where the path failed it; a
 * success for its rails with failures on record when it succeeded. */
static void judge_rails(struct rdma_req *r, int status)
{
    struct rdma_peer *p = r->peer;
    struct orb_rail_table *t = p->tp->health;
    if (t == NULL)
        return;
    uint32_t trial_bit = 0;
    if (r->trial_token != 0) {
        struct orb_rail_key key = rail_key(p, r->trial_rail);
        trial_bit = 1u << r->trial_rail;
        if (status == 0 && !(r->rail_failed & trial_bit)) {
            if (orb_rail_trial_succeeded(t, &key, r->trial_token) == 0)
                ORB_LOGI("rdma: %s: rail %u passed its trial: it carries requests again", p->endpoint, r->trial_rail);
            p->suspect &= ~trial_bit;
        } else if (r->trial_posted) {
            if (orb_rail_trial_failed(t, &key, r->trial_token) == 0)
                ORB_LOGW("rdma: %s: rail %u failed its trial (%s): it stays paused, its cooldown doubled", p->endpoint,
                         r->trial_rail, r->why);
        } else {
            (void)orb_rail_trial_cancel(t, &key, r->trial_token);
        }
        r->trial_token = 0;
    }
    for (uint32_t m = r->rail_failed & ~trial_bit; m != 0; m &= m - 1) {
        uint32_t k = (uint32_t)__builtin_ctz(m);
        struct orb_rail_key key = rail_key(p, k);
        struct orb_rail_pair_info before, after;
        bool known = orb_rail_pair_info(t, &key, &before) == 0;
        if (orb_rail_record_failure(t, &key) != 0) {
            ORB_LOGW("rdma: %s: rail %u: %s", p->endpoint, k, orb_last_error());
            continue;
        }
        p->suspect |= 1u << k;
        if (known && before.state == ORB_RAIL_HEALTHY && orb_rail_pair_info(t, &key, &after) == 0 &&
            after.state != ORB_RAIL_HEALTHY)
            ORB_LOGW("rdma: %s: rail %u reached rail_error_threshold (%u failure(s) within rail_error_window): "
                     "paused for %llu ms, then one request tries it", p->endpoint, k, p->tp->cfg->rail_error_threshold,
                     (unsigned long long)(after.cooldown_ns / 1000000u));
    }
    if (status == 0) /* a rail whose path failed under it (its request succeeded still) earns nothing */
        for (uint32_t m = r->rail_mask & p->suspect & ~trial_bit & ~r->rail_failed; m != 0; m &= m - 1) {
            uint32_t k = (uint32_t)__builtin_ctz(m);
            struct orb_rail_key key = rail_key(p, k);
            orb_rail_record_success(t, &key);
            p->suspect &= ~(1u << k);
        }
}

/* The queue pairs of r's private grant go to lane 0, which frees them once nothing of theirs is
 * outstanding (p->lock held; priv_lock is a leaf). */
static void retire_private_locked(struct rdma_req *r)
{
    struct orb_rdma_tp *tp = r->peer->tp;
    pthread_mutex_lock(&tp->priv_lock);
    for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++) {
        if (r->priv[k] == NULL)
            continue;
        r->priv[k]->reap_next = tp->priv_reap;
        tp->priv_reap = r->priv[k];
        r->priv[k] = NULL;
    }
    pthread_mutex_unlock(&tp->priv_lock);
    r->private_grant = false;
    r->priv_windows = false;
}

/* A request of p's leaves the places past the grant queue (p->lock held). The one that makes
 * RDMA_GRANT_MIN_ROOM of them free wakes a grant thread (one that has just found the peer short
 * of room naps on the count this moves, so it cannot miss it). */
static void uncount_locked(struct rdma_peer *p)
{
    p->inflight--;
    if (p->inflight == RDMA_RQ_DEPTH - RDMA_GRANT_MIN_ROOM)
        rdma_grant_wake(p->tp, false);
}

/* `r` leaves its attempt (p->lock held): its rails judged, out of the connection's granted
 * requests and its count, the connection marked when the source still holds its grant. */
static void leave_locked(struct rdma_req *r, int status)
{
    struct rdma_peer *p = r->peer;
    judge_rails(r, status);
    /* A private grant holds nothing on the connection's queue pairs: it expires alone there. */
    if (r->granted && status != 0 && !r->acked && r->incarnation == p->incarnation && !r->private_grant)
        p->poisoned = true;
    retire_private_locked(r);
    if (r->granted) {
        for (struct rdma_req **pp = &p->active; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == r) {
                *pp = r->next;
                break;
            }
        }
        if (p->fenced && p->active == NULL)
            pthread_cond_broadcast(&p->fence_cond);
    }
    if (r->counted) {
        r->counted = false;
        uncount_locked(p);
    }
}

/* The outcome of `r`'s finished attempt, ended with `status` (p->lock held; outcome.h has the
 * rules). */
static struct orb_rdma_outcome outcome_locked(struct rdma_req *r, int status)
{
    struct orb_rdma_tp *tp = r->peer->tp;
    struct orb_rdma_attempt a = {.read = r->op == ORB_XFER_READ, .status = status, .qp_died = r->rail_lost != 0,
                                 .acked = r->acked, .payload_posted = atomic_load(&r->payload_posted),
                                 .replays = r->replays, .max_replays = tp->cfg->read_replays,
                                 .stopping = atomic_load(&tp->stopping)};
    uint64_t now = orb_now_ns();
    for (uint32_t i = 0; i < r->npieces; i++) {
        const struct orb_xfer *x = r->pieces[i];
        if (x != NULL && x->deadline_ns != 0 && now >= x->deadline_ns)
            a.deadline_passed = true;
    }
    return orb_rdma_attempt_outcome(&a);
}

static void end_locked(struct rdma_req *r, int status, struct rdma_ending *e)
{
    r->ended = true;
    leave_locked(r, status);
    e->r = r;
    e->replay = e->advance = false;
    e->n = 0;
    for (uint32_t i = 0; i < r->npieces; i++)
        if (r->pieces[i] != NULL)
            e->pieces[e->n++] = r->pieces[i];
    e->status = status;
    snprintf(e->why, sizeof e->why, "%s", status != 0 ? r->why : "");
    e->effect = outcome_locked(r, status).effect;
    /* A failure after a WRITE slot ended: that slot's bytes are the peer's already. */
    if (status != 0 && r->slot_wrote)
        e->effect = ORB_REMOTE_EFFECT_UNKNOWN;
}


/* `r` back to before its grant (p->lock held, its attempt left). */
static void reset_attempt_locked(struct rdma_req *r)
{
    r->rail_failed = r->rail_lost = 0;
    r->status = 0;
    r->why[0] = '\0';
    r->device_refused = false;
    r->granted = r->acked = r->expired = r->send_failure_only = false;
    r->trial_token = 0;
    r->trial_posted = false;
    r->rail_mask = 0;
    r->outstanding = r->sends_left = 0;
    memset(r->rail_left, 0, sizeof r->rail_left);
    memset(r->rail_wrs, 0, sizeof r->rail_wrs);
    memset(r->rail_bytes, 0, sizeof r->rail_bytes);
    memset(r->first_post_ns, 0, sizeof r->first_post_ns);
}

/* `r`'s slot ended well and another follows (p->lock held): its attempt is judged and left, and
 * report_pieces() lands the slot (a staged READ's bytes) and queues the request for the next. */
static void advance_locked(struct rdma_req *r, struct rdma_ending *e)
{
    leave_locked(r, 0);
    e->r = r;
    e->replay = false;
    e->advance = true;
    e->n = 0;
    e->status = 0;
    e->effect = ORB_REMOTE_EFFECT_NONE;
    e->why[0] = '\0';
    reset_attempt_locked(r);
}

/* Take failed `r` back to before its grant (p->lock held): its attempt is judged and left as an
 * ending one would be, and it starts over with the rails that failed it avoided; report_pieces()
 * queues it for its new grant. */
static void replay_locked(struct rdma_req *r, struct rdma_ending *e)
{
    leave_locked(r, r->status);
    e->r = r;
    e->replay = true;
    e->advance = false;
    e->n = 0;
    e->status = r->status;
    e->effect = ORB_REMOTE_EFFECT_NONE;
    snprintf(e->why, sizeof e->why, "%s", r->why);
    r->replays++;
    r->avoid |= r->rail_lost;
    reset_attempt_locked(r);
}

static void end_now(struct orb_rdma_tp *tp, struct rdma_req *r, int status, const char *why);

/* Queue `r` (back to before its grant) for a new one; a transport that began to stop meanwhile
 * ends it with `status` and `why` (its grant threads drain the queue once, under glock). */
static void requeue(struct orb_rdma_tp *tp, struct rdma_req *r, int status, const char *why)
{
    r->next = NULL;
    pthread_mutex_lock(&tp->glock);
    bool stopping = atomic_load(&tp->stopping);
    if (!stopping) {
        enqueue_for_grants_locked(tp, r);
        rdma_grant_wake(tp, false);
    }
    pthread_mutex_unlock(&tp->glock);
    if (stopping)
        end_now(tp, r, status, why);
}

/* Queue replayed `r` for its new grant (or end it with the failure that made it replay). */
static void ask_again(struct orb_rdma_tp *tp, struct rdma_req *r, const struct rdma_ending *e)
{
    ORB_LOGI("rdma: %s: a READ of %llu bytes failed on rail(s) 0x%x (%s): asked again (replay %u of %u)",
             r->peer->endpoint, (unsigned long long)r->length, r->avoid, e->why, r->replays, tp->cfg->read_replays);
    atomic_fetch_add(&tp->read_replays, 1);
    requeue(tp, r, e->status, e->why);
}

/* `r` was refused because queue pairs it asked for are dead at the source (`lost`, places in
 * the connection of incarnation `incarnation`): nothing of it exists there, so it goes back to
 * the grant queue, and pick_rails() gives it rails without a dead queue pair. Those queue pairs
 * are failed here too (their rails count the path failure and stay out until the connection
 * heals). false, with nothing changed: it was rerouted as often as the connection has queue
 * pairs already (a source that names live ones again and again), and the caller ends it. */
static bool reroute(struct orb_rdma_tp *tp, struct rdma_req *r, uint32_t lost, uint64_t incarnation)
{
    struct rdma_peer *p = r->peer;
    uint32_t rails = 0, nfault = 0;
    struct rdma_link *fault[ORB_RDMA_MAX_RAILS];
    /* The links are failed after p->lock is let go (a lane posting on one takes p->lock under
     * the link's lock), under tp->lock, which keeps a reconnect from freeing them meanwhile. */
    pthread_mutex_lock(&tp->lock);
    pthread_mutex_lock(&p->lock);
    if (r->reroutes >= p->nrails * p->width) {
        pthread_mutex_unlock(&p->lock);
        pthread_mutex_unlock(&tp->lock);
        return false;
    }
    r->reroutes++;
    for (uint32_t m = incarnation == p->incarnation ? lost : 0; m != 0; m &= m - 1) {
        struct rdma_link *l = p->links[__builtin_ctz(m)];
        if (l != NULL && !atomic_load(&l->down)) {
            fault[nfault++] = l;
            rails |= 1u << l->rail;
        }
    }
    r->rail_failed = rails; /* judged as the path's failures (once, by whoever saw them first) */
    leave_locked(r, ORB_EPEER);
    reset_attempt_locked(r);
    r->avoid |= rails;
    pthread_mutex_unlock(&p->lock);
    for (uint32_t i = 0; i < nfault; i++)
        rdma_link_fault(fault[i], ORB_EPEER);
    pthread_mutex_unlock(&tp->lock);
    if (r->leased) {
        (void)orb_lease_abandon(&r->lease); /* nothing of it was posted */
        r->leased = false;
    }
    if (rails != 0)
        ORB_LOGI("rdma: %s: queue pair(s) 0x%x of the connection are dead at the source: rails 0x%x are out of it "
                 "here too, and the requests asked for on them are given other rails", p->endpoint, lost, rails);
    requeue(tp, r, ORB_ECLOSED, "rdma: the transport stopped before the request was granted");
    return true;
}

/* A staging source refused `r`'s slot because it stages that range in slots of 2^shift bytes, and
 * fewer than r asked for (remote staging): r goes back to the grant queue and moves slot by slot
 * at that size. Nothing of it exists at the source. false, with nothing changed: the source named
 * a slot no smaller than the one refused, and the caller ends r. */
static bool resize_slot(struct orb_rdma_tp *tp, struct rdma_req *r, uint32_t shift)
{
    struct rdma_peer *p = r->peer;
    uint64_t slot = 1ull << shift;
    pthread_mutex_lock(&p->lock);
    if (slot >= r->slot_len) {
        pthread_mutex_unlock(&p->lock);
        return false;
    }
    leave_locked(r, ORB_EAGAIN);
    reset_attempt_locked(r);
    r->slot_max = slot;
    r->slot_len = slot_length(r);
    pthread_mutex_unlock(&p->lock);
    if (r->leased) {
        (void)orb_lease_abandon(&r->lease); /* nothing of it was posted */
        r->leased = false;
    }
    rdma_stage_put(tp, &r->stage); /* this side's extent, taken again for the shorter slot */
    ORB_LOGD("rdma: %s stages the range in slots of %llu bytes: a request of %llu moves slot by slot", p->endpoint,
             (unsigned long long)slot, (unsigned long long)r->length);
    requeue(tp, r, ORB_ECLOSED, "rdma: the transport stopped before the request was granted");
    return true;
}

/* The local bytes of piece `x`'s part in r's slot into their place in the slot's extent (`in`, a
 * WRITE's) or back out of it (a READ's): memcpy where the memory has a CPU view, its kind's own
 * copy (device memory) where not. 0 (also for a piece without a part in the slot), or the copy's
 * failure. */
static int stage_copy(struct rdma_req *r, const struct orb_xfer *x, bool in)
{
    uint64_t off, len;
    if (!piece_part(r, x, &off, &len))
        return 0;
    uint8_t *stage = r->stage.cpu + (off - r->slot_off);
    uint64_t in_piece = off - piece_offset(r, x);
    uint8_t *cpu = orb_xfer_local_cpu(x);
    if (cpu != NULL) {
        memcpy(in ? stage : cpu + in_piece, in ? cpu + in_piece : stage, len);
        return 0;
    }
    const struct orb_reg *reg = x->local_reg;
    uint64_t addr = reg->base + x->local_offset + in_piece;
    bool held = false;
    int rc = in ? reg->kind->to_host(reg, addr, stage, (size_t)len, &held)
                : reg->kind->from_host(reg, addr, stage, (size_t)len, &held);
    r->stage.held |= held; /* the extent goes nowhere once the request lets go of it */
    return rc == 0 ? 0 : orb_fail_wrap(rc, "rdma: copying a staged piece %s %s memory", in ? "out of" : "into",
                                       reg->kind->name);
}

/* An ending that needs a word with the source first waits, kept in r->verdict, for a grant
 * thread (see settle_ending): a device's refusal of a window the source granted (ORB_EPERM from a
 * remote access error), to ask the source whether it lives; a pinned request's, to UNPIN it.
 * false: report it as it is (the transport stops, or no memory to keep it). */
static bool defer_refusal(struct orb_rdma_tp *tp, struct rdma_req *r, const struct rdma_ending *e)
{
    struct rdma_ending *v = malloc(sizeof *v);
    if (v == NULL)
        return false;
    *v = *e;
    pthread_mutex_lock(&tp->glock);
    bool stopping = atomic_load(&tp->stopping);
    if (!stopping) {
        r->verdict = v;
        r->next = tp->verdicts; /* out of p->active since it ended */
        tp->verdicts = r;
        rdma_grant_wake(tp, false);
    }
    pthread_mutex_unlock(&tp->glock);
    if (stopping)
        free(v);
    return !stopping;
}

/* After slot [slot_off, +slot_len) of `r` ended well (its attempt left, nothing of it at the
 * source any more): a staged READ's slot lands in the application's bytes, its extent goes back,
 * and the request is queued for its next slot's grant. A copy that fails ends the request with
 * it. */
static void next_slot(struct orb_rdma_tp *tp, struct rdma_req *r)
{
    int rc = 0;
    if (r->stage.cpu != NULL) {
        for (uint32_t i = 0; i < r->npieces && rc == 0 && r->op == ORB_XFER_READ; i++)
            rc = stage_copy(r, r->pieces[i], false);
        rdma_stage_put(tp, &r->stage);
    }
    if (rc != 0) {
        char why[320];
        snprintf(why, sizeof why, "%s", orb_last_error());
        end_now(tp, r, rc, why);
        return;
    }
    pthread_mutex_lock(&r->peer->lock);
    r->slot_wrote = r->slot_wrote || r->op == ORB_XFER_WRITE;
    r->slot_off += r->slot_len;
    r->slot_len = slot_length(r);
    pthread_mutex_unlock(&r->peer->lock);
    atomic_fetch_add(&tp->slots_moved, 1);
    requeue(tp, r, ORB_ECLOSED, "rdma: the transport stopped between two slots of the request");
}

static void report_pieces(struct orb_rdma_tp *tp, const struct rdma_ending *e)
{
    struct rdma_req *r = e->r;
    if (!e->replay && !e->advance && ((e->status == ORB_EPERM && r->device_refused) || r->pin != 0) &&
        defer_refusal(tp, r, e))
        return;
    if (r->leased) {
        (void)orb_lease_abandon(&r->lease); /* the charges of pieces that never completed */
        r->leased = false;
    }
    if (e->replay) {
        ask_again(tp, r, e);
        return;
    }
    if (e->advance) {
        next_slot(tp, r);
        return;
    }
    int copied[ORB_SLICE_MAX] = {0};
    char copy_why[320] = "";
    if (r->stage.cpu != NULL) {
        /* A staged READ that succeeded lands in the application's bytes now; a failed one leaves
         * them as they were. A piece whose copy fails (device memory) fails alone, as a READ with
         * no remote effect. */
        if (e->status == 0 && r->op == ORB_XFER_READ)
            for (uint32_t i = 0; i < e->n; i++)
                if ((copied[i] = stage_copy(r, e->pieces[i], false)) != 0 &&
                    copy_why[0] == '\0')
                    snprintf(copy_why, sizeof copy_why, "%s", orb_last_error());
        rdma_stage_put(tp, &r->stage);
    } else if (e->status == 0 && r->op == ORB_XFER_READ && e->n > 0) {
        /* A READ into device memory whose device does not order NIC writes: visible to it only
         * after a flush (every piece is of one registration). */
        const struct orb_reg *reg = e->pieces[0]->local_reg;
        const struct orb_rdma_reg_mrs *m = reg != NULL ? orb_rdma_tp_reg_mrs(reg) : NULL;
        int fl = m != NULL && m->gdr_flush ? orb_cuda_memory_gdr_flush(reg->owner) : 0;
        if (fl != 0) {
            snprintf(copy_why, sizeof copy_why, "rdma: %s", orb_last_error());
            for (uint32_t i = 0; i < e->n; i++)
                copied[i] = fl;
        }
    }
    for (uint32_t i = 0; i < e->n; i++) {
        if (copied[i] != 0)
            orb_xfer_done_why(e->pieces[i], copied[i], ORB_REMOTE_EFFECT_NONE, copy_why);
        else
            orb_xfer_done_why(e->pieces[i], e->status, e->effect, e->why);
    }
    atomic_fetch_sub(&tp->inflight_reqs, 1);
}

/* Whether `r` may end now (peer lock held); fills `e` when it does. */
static bool maybe_end(struct rdma_req *r, struct rdma_ending *e)
{
    if (r->ended)
        return false;
    if (r->status != 0 && r->outstanding == 0) {
        if (outcome_locked(r, r->status).replay)
            replay_locked(r, e);
        else
            end_locked(r, r->status, e);
        return true;
    }
    if (r->status == 0 && r->outstanding == 0 && r->sends_left == 0 && r->acked) {
        if (r->slot_off + r->slot_len < r->length)
            advance_locked(r, e);
        else
            end_locked(r, r->status, e);
        return true;
    }
    return false;
}

/* The request's first failure and its cause (peer lock held); later ones are dropped. */
__attribute__((format(printf, 3, 4))) static void fail_locked(struct rdma_req *r, int status, const char *fmt, ...)
{
    r->send_failure_only = false; /* rdma_req_on_send sets it again for a SEND's completion */
    if (r->status != 0)
        return;
    r->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
}

/* ---- posting ------------------------------------------------------------------------------------- */

/* The WR of piece `x`'s part in r's slot (one it has: start() posts no other). */
static void build_piece(const struct rdma_req *r, const struct rdma_link *l, struct orb_xfer *x,
                        struct ibv_send_wr *wr, struct ibv_sge *sge)
{
    uint64_t off = 0, len = 0;
    (void)piece_part(r, x, &off, &len);
    if (r->staged) {
        sge->addr = (uint64_t)(uintptr_t)(r->stage.cpu + (off - r->slot_off));
        sge->lkey = rdma_stage_mr(l->tp, &r->stage, l->ctx->nic)->local->lkey;
    } else {
        const struct orb_rdma_reg_mrs *m = orb_rdma_tp_reg_mrs(x->local_reg);
        const uint8_t *cpu = orb_xfer_local_cpu(x);
        uint64_t in_piece = off - piece_offset(r, x);
        /* Device memory (GPUDirect) has no CPU view: its MRs map it at its device address. */
        sge->addr = cpu != NULL ? (uint64_t)(uintptr_t)(cpu + in_piece)
                                : x->local_reg->base + x->local_offset + in_piece;
        sge->lkey = orb_rdma_reg_mrs_on(m, l->ctx->nic)->local->lkey;
    }
    sge->length = (uint32_t)len;
    memset(wr, 0, sizeof *wr);
    wr->opcode = x->op == ORB_XFER_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    wr->sg_list = sge;
    wr->num_sge = 1;
    wr->wr.rdma.remote_addr = r->remote_target + (off - r->slot_off);
    wr->wr.rdma.rkey = r->key_of_rail[x->rail];
}

static void build_sendinv(struct rdma_req *r, uint32_t rail, struct ibv_send_wr *wr, uint8_t *msg, uint32_t *len)
{
    struct rdma_peer *p = r->peer;
    struct orb_rdma_binding b;
    memset(&b, 0, sizeof b);
    b.rail = (uint16_t)(r->lane * p->nrails + rail); /* the queue pair's place in the connection */
    b.requester = *orb_engine_epoch(p->tp->engine);
    b.source = p->source_epoch;
    b.incarnation = p->incarnation;
    b.request = r->id;
    b.grant = r->grant.grant;
    b.generation = r->grant.generation;
    memcpy(b.nonce, r->grant.nonce, sizeof b.nonce);
    b.addr = r->addr + r->slot_off; /* the slot's grant */
    b.length = r->slot_len;
    b.rkey = r->key_of_rail[rail];
    b.op = r->op == ORB_XFER_READ ? ORB_OP_READ : ORB_OP_WRITE;
    b.rail_wrs = r->rail_wrs[rail];
    b.rail_bytes = r->rail_bytes[rail];
    orb_rdma_binding_encode(&b, msg);
    *len = ORB_RDMA_BINDING_LEN;
    memset(wr, 0, sizeof *wr);
    r->send_ctx[rail].kind = RDMA_WR_SENDINV;
    r->send_ctx[rail].rail = (uint8_t)rail;
    r->send_ctx[rail].owner = r;
    if (r->private_grant && !r->priv_windows) {
        /* A private grant's region is no window: a plain SEND, fenced behind the rail's payload
         * (alone on its queue pair, so behind nothing else), ends it; the source destroys the
         * region with its queue pair. */
        wr->opcode = IBV_WR_SEND;
        wr->send_flags = IBV_SEND_FENCE;
        return;
    }
    wr->opcode = IBV_WR_SEND_WITH_INV;
    /* Posted only once every payload WR of the rail completed, which orders it after them more
     * strictly than IBV_SEND_FENCE would. A fence would also hold it behind other requests' READs
     * on the queue pair; under soft-RoCE (Linux 6.1) queue pairs with fenced WRs stalled under
     * load (a lost wake-up of the fenced WR is the likely cause). */
    wr->send_flags = 0;
    wr->invalidate_rkey = r->key_of_rail[rail];
}

void rdma_req_build(struct rdma_wait *w, const struct rdma_link *l, struct ibv_send_wr *wr, struct ibv_sge *sge,
                    uint64_t *cookie, uint8_t *msg, uint32_t *msg_len)
{
    if (w->x != NULL) {
        build_piece(w->req, l, w->x, wr, sge);
        *cookie = (uint64_t)(uintptr_t)w->x;
        *msg_len = 0;
        return;
    }
    pthread_mutex_lock(&w->req->peer->lock);
    build_sendinv(w->req, w->rail, wr, msg, msg_len);
    pthread_mutex_unlock(&w->req->peer->lock);
    *cookie = (uint64_t)(uintptr_t)&w->req->send_ctx[w->rail] | RDMA_COOKIE_CTX;
}

void rdma_req_posted(struct rdma_wait *w, const struct rdma_link *l)
{
    if (w->x == NULL)
        return; /* a SEND_WITH_INV: no payload */
    struct rdma_req *r = w->req;
    atomic_store(&r->payload_posted, true);
    if (r->first_post_ns[l->rail] == 0)
        r->first_post_ns[l->rail] = orb_now_ns();
    uint64_t off = 0, len = 0;
    (void)piece_part(r, w->x, &off, &len);
    (void)orb_selector_note_posted(l->tp->sel, l->rail, len);
}

void rdma_req_wait_failed(struct rdma_wait *w, int status, bool path_failed)
{
    struct rdma_req *r = w->req;
    struct rdma_peer *p = r->peer;
    struct rdma_ending e;
    pthread_mutex_lock(&p->lock);
    r->outstanding--;
    if (w->x == NULL)
        r->sends_left--;
    /* A post fails only on a dead queue pair; one that failed on the path counts as for a
     * flushed WR (rdma_req_on_send). */
    r->rail_lost |= 1u << w->rail;
    if (path_failed && (r->status == 0 || r->rail_failed != 0))
        r->rail_failed |= 1u << w->rail;
    fail_locked(r, status, "rdma: rail %u: a work request could not be posted (%s)", w->rail, orb_strerror(status));
    bool end = maybe_end(r, &e);
    pthread_mutex_unlock(&p->lock);
    if (end)
        report_pieces(p->tp, &e);
}

/* Hand `w` to its rail's link, in order behind what waits there. Only the lane posts (one thread
 * per queue pair's doorbell: soft-RoCE stalls queue pairs rung from several threads at once), so
 * the lane posts what fits now and a grant thread kicks the lane, never waiting for its posts. */
static void submit_wait(struct rdma_req *r, struct rdma_wait *w)
{
    struct rdma_link *l = r->priv[w->rail] != NULL ? r->priv[w->rail] : r->peer->links[r->lane * r->peer->nrails + w->rail];
    rdma_link_hand_over(l, w);
    rdma_link_kick(l);
}

/* Post piece `index` of `r`. */
static void post_piece(struct rdma_req *r, uint32_t index)
{
    struct rdma_wait *w = &r->waits[index];
    w->x = r->pieces[index];
    w->req = r;
    w->rail = w->x->rail;
    submit_wait(r, w);
}

/* Post the SEND_WITH_INV that ends rail `rail` of `r`. */
static void post_sendinv(struct rdma_req *r, uint32_t rail)
{
    pthread_mutex_lock(&r->peer->lock);
    r->outstanding++;
    pthread_mutex_unlock(&r->peer->lock);
    struct rdma_wait *w = &r->waits[ORB_SLICE_MAX + rail];
    w->x = NULL;
    w->req = r;
    w->rail = rail;
    submit_wait(r, w);
}

/* ---- grants ----------------------------------------------------------------------------------- */

/* End `r` now with `status` and its cause (the grant thread, before anything was posted). */
static void end_now(struct orb_rdma_tp *tp, struct rdma_req *r, int status, const char *why)
{
    struct rdma_ending e;
    pthread_mutex_lock(&r->peer->lock);
    fail_locked(r, status, "%s", why);
    end_locked(r, status, &e);
    pthread_mutex_unlock(&r->peer->lock);
    report_pieces(tp, &e);
}

/* A staged request's extent, waiting for room up to io_timeout (`wait`) or not at all
 * (ORB_EAGAIN); a WRITE's bytes copied in (only the pieces that will move). */
static int stage_in(struct orb_rdma_tp *tp, struct rdma_req *r, bool wait)
{
    int rc = rdma_stage_take(tp, r->pieces[0]->local_reg, r->slot_len, wait ? orb_deadline_after(tp->io_timeout_ns) : 0,
                             false, &r->stage);
    if (rc != 0 || r->op != ORB_XFER_WRITE)
        return rc;
    for (uint32_t i = 0; i < r->npieces; i++) {
        if ((rc = stage_copy(r, r->pieces[i], true)) != 0) {
            rdma_stage_put(tp, &r->stage); /* nothing of it was posted */
            return rc;
        }
    }
    return 0;
}

/* Pre-dispatch admission (deadline_bw_arbitration; lib/topo/qos.h, TENT's DeadlineMlu): whether
 * `r` (its live pieces, `bytes` of them) can still end by its deadline, given the payload
 * bytes already dispatched and unfinished on the rails it may use and their transmit estimates.
 * false: it cannot, and `why` says by how much; nothing of it exists at the source yet. */
static bool admitted(struct orb_rdma_tp *tp, const struct rdma_req *r, const struct orb_xfer *first,
                     uint64_t bytes, char *why, size_t why_len)
{
    if (!tp->cfg->deadline_bw_arbitration)
        return true;
    struct orb_nic_load load[ORB_RDMA_MAX_RAILS];
    uint32_t count = 0;
    if (orb_selector_load_stats(tp->sel, load, ORB_RDMA_MAX_RAILS, &count) != 0)
        return true; /* nothing to predict with */
    const uint8_t *row = tier_row(tp, first);
    struct orb_qos_admission in = {.length = bytes, .deadline_ns = first->deadline_ns, .now_ns = orb_now_ns(),
                                   .mlu_threshold = RDMA_ADMISSION_MLU};
    for (uint32_t k = 0; k < count && k < r->peer->nrails; k++) {
        if (!load[k].healthy || row[k] >= ORB_SELECT_TIERS)
            continue;
        double bw = orb_nic_load_rate(&load[k]);
        if (!(bw > 0))
            in.nic_unmeasured = true;
        else
            in.bw_bytes_per_s += bw;
        in.bytes_ahead += load[k].charged_bytes;
    }
    enum orb_qos_verdict v = ORB_QOS_ADMIT;
    double mlu = 0;
    if (orb_qos_admit(&in, &v, &mlu) != 0)
        return true;
    if (v == ORB_QOS_DROP_EXPIRED)
        snprintf(why, why_len, "rdma: the request's deadline passed before it was dispatched");
    else if (v == ORB_QOS_DROP_INFEASIBLE)
        snprintf(why, why_len,
                 "rdma: the request cannot end by its deadline: %llu bytes behind %llu dispatched at %.0f B/s "
                 "need %.2f times the time left (admission drops at %.2f)",
                 (unsigned long long)bytes, (unsigned long long)in.bytes_ahead, in.bw_bytes_per_s, mlu,
                 RDMA_ADMISSION_MLU);
    else
        return true;
    return false;
}

static int reconnect(struct orb_rdma_tp *tp, struct rdma_peer *p, const struct orb_control_path *ctl,
                     uint64_t seen, uint64_t deadline, const char *cause);

void rdma_req_rail_fenced(struct rdma_peer *p, uint32_t rail)
{
    struct orb_rail_table *t = p->tp->health;
    struct orb_rail_key key = rail_key(p, rail);
    pthread_mutex_lock(&p->lock);
    if (t != NULL && orb_rail_record_failure(t, &key) == 0)
        p->suspect |= 1u << rail;
    pthread_mutex_unlock(&p->lock);
}

/* Rails of p whose queue pair died on any lane (p->lock held, which keeps the links in place). */
static uint32_t dead_rails_locked(const struct rdma_peer *p)
{
    uint32_t dead = 0;
    for (uint32_t q = 0; q < p->nrails * p->width; q++)
        if (atomic_load(&p->links[q]->down))
            dead |= 1u << (q % p->nrails);
    return dead;
}

/* Wait on p's fence condition (p->lock held) for a while, at most until `deadline`. */
static void fence_wait(struct rdma_peer *p, uint64_t deadline)
{
    uint64_t until = orb_deadline_after(FENCE_NAP_NS);
    struct timespec ts = orb_deadline_timespec(until < deadline ? until : deadline);
    pthread_cond_timedwait(&p->fence_cond, &p->lock, &ts);
}

/* Rebuild p's connection because queue pairs of it died: fence it (no GRANT_REQ starts on it),
 * wait until no request is granted or being granted on it, then reconnect; the fence lifts
 * either way. Another thread healing it already: wait for that one instead. Every wait ends by
 * `deadline` or at stop. 0: the queue pairs are new. */
static int heal(struct orb_rdma_tp *tp, struct rdma_peer *p, const struct orb_control_path *ctl, uint64_t deadline,
                const char *cause)
{
    pthread_mutex_lock(&p->lock);
    if (p->fenced) {
        while (p->fenced && !atomic_load(&tp->stopping) && orb_now_ns() < deadline)
            fence_wait(p, deadline);
        bool lifted = !p->fenced;
        pthread_mutex_unlock(&p->lock);
        return lifted ? 0 : orb_fail(ORB_ETIMEDOUT, "rdma: %s: the connection's rebuild did not end in time", p->endpoint);
    }
    p->fenced = true;
    uint64_t seen = p->incarnation;
    while ((p->active != NULL || p->granting > 0) && !atomic_load(&tp->stopping) && orb_now_ns() < deadline)
        fence_wait(p, deadline);
    bool drained = p->active == NULL && p->granting == 0;
    pthread_mutex_unlock(&p->lock);
    int rc = drained ? reconnect(tp, p, ctl, seen, deadline, cause)
                     : orb_fail(ORB_ETIMEDOUT, "rdma: %s: the requests on the connection did not end in time for its rebuild",
                                p->endpoint);
    pthread_mutex_lock(&p->lock);
    p->fenced = false;
    p->heal_after_ns = orb_now_ns() + HEAL_SPACING_NS;
    pthread_cond_broadcast(&p->fence_cond);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* The rails `r` may use, into *allowed: those whose port is active and whose pair with the
 * peer is healthy; or a paused pair's half-open trial, once its cooldown is over, alone (the
 * request carries it). Rails whose queue pairs died are rebuilt first when nothing else can
 * carry the request, and otherwise at most once a HEAL_SPACING_NS; while they stay dead the
 * others carry it. Nothing left: ORB_EUNAVAILABLE, before any payload, naming why. */
static int pick_rails(struct orb_rdma_tp *tp, struct rdma_req *r, uint32_t *allowed)
{
    struct rdma_peer *p = r->peer;
    uint32_t all = (uint32_t)((1ull << p->nrails) - 1);
    uint32_t down = atomic_load(&tp->routes_down) & all;
    uint32_t up = all & ~down;
    uint32_t healthy = healthy_rails(tp, p, up);
    r->trial_token = 0;
    r->trial_posted = false;
    /* A replay carries no trial: it needs a rail that works. */
    for (uint32_t m = r->replays == 0 ? up & ~healthy : 0; m != 0 && r->trial_token == 0; m &= m - 1) {
        uint32_t k = (uint32_t)__builtin_ctz(m);
        struct orb_rail_key key = rail_key(p, k);
        uint64_t token = 0;
        if (orb_rail_trial_begin(tp->health, &key, &token) == 0) {
            r->trial_token = token;
            r->trial_rail = k;
            ORB_LOGI("rdma: %s: rail %u's cooldown is over: a request tries it", p->endpoint, k);
        }
    }
    uint32_t want = r->trial_token != 0 ? 1u << r->trial_rail : healthy;
    pthread_mutex_lock(&p->lock);
    uint32_t dead = dead_rails_locked(p);
    bool spaced = orb_now_ns() >= p->heal_after_ns, poisoned = p->poisoned;
    pthread_mutex_unlock(&p->lock);
    char why[200] = "";
    if (((want & dead) != 0 && ((want & ~dead) == 0 || spaced)) || (poisoned && spaced)) {
        const char *cause = (want & dead) != 0 ? "queue pairs of a rail died"
                                               : "a failed request left its grant at the source";
        if (heal(tp, p, r->ctl, orb_deadline_after(tp->io_timeout_ns), cause) != 0) {
            snprintf(why, sizeof why, ": %s", orb_last_error());
            ORB_LOGD("rdma: %s: rails 0x%x stay dead%s", p->endpoint, want & dead, why);
        }
        pthread_mutex_lock(&p->lock);
        dead = dead_rails_locked(p);
        pthread_mutex_unlock(&p->lock);
    }
    if ((want & ~dead) == 0 && r->trial_token != 0) {
        /* The trial cannot run: its slot goes back, and the healthy rails carry the request. */
        struct orb_rail_key key = rail_key(p, r->trial_rail);
        (void)orb_rail_trial_cancel(tp->health, &key, r->trial_token);
        r->trial_token = 0;
        want = healthy;
    }
    if ((want & ~dead) == 0)
        return orb_fail(ORB_EUNAVAILABLE,
                        "rdma: %s: no rail can carry the request (%u rail(s); ports down 0x%x, paused by errors 0x%x, "
                        "queue pairs dead 0x%x)%s",
                        p->endpoint, p->nrails, down, up & ~healthy, dead & healthy, why);
    *allowed = want & ~dead;
    if ((*allowed & ~r->avoid) != 0) /* a replay goes elsewhere than where it failed, when it can */
        *allowed &= ~r->avoid;
    return 0;
}

/* Ask each piece of `r` once whether it may still start (right before anything of the request
 * moves): those that may not end now, withdrawn. false: none may, and `r` ended with them. */
static bool may_start_pieces(struct orb_rdma_tp *tp, struct rdma_req *r)
{
    struct rdma_peer *p = r->peer;
    struct orb_xfer *withdrawn[ORB_SLICE_MAX];
    uint32_t live = 0, nw = 0;
    pthread_mutex_lock(&p->lock);
    for (uint32_t i = 0; i < r->npieces; i++) {
        if (orb_xfer_may_start(r->pieces[i])) {
            live++;
        } else {
            withdrawn[nw++] = r->pieces[i];
            r->pieces[i] = NULL;
        }
    }
    if (live == 0) {
        uncount_locked(p);
        r->counted = false;
    }
    pthread_mutex_unlock(&p->lock);
    if (live == 0) /* the request's space goes with its last piece: count it out first */
        atomic_fetch_sub(&tp->inflight_reqs, 1);
    for (uint32_t i = 0; i < nw; i++) /* live pieces, if any, keep the space alive */
        orb_xfer_done(withdrawn[i], ORB_ETIMEDOUT, ORB_REMOTE_EFFECT_NONE);
    return live > 0;
}

/* PIN `r` (a request of several slots, before its first): the source checks its authority over
 * the whole range once and holds it, its staging slot (when it stages the range) bounding r's.
 * false: r ended here (refused, or the control path failed), nothing of it having moved. A
 * source whose pins are all in use ("not now") leaves r without one: each slot is then checked
 * on its own. */
static bool pin_request(struct orb_rdma_tp *tp, struct rdma_req *r)
{
    struct rdma_peer *p = r->peer;
    r->pin_asked = true;
    pthread_mutex_lock(&p->lock);
    struct orb_rdma_pin_req q = {.incarnation = p->incarnation, .request = r->id,
                                 .op = r->op == ORB_XFER_READ ? ORB_OP_READ : ORB_OP_WRITE, .addr = r->addr,
                                 .length = r->length};
    pthread_mutex_unlock(&p->lock);
    uint8_t msg[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
    size_t len = 0, rlen = 0;
    struct orb_rdma_pinned a;
    char why[320];
    int rc = orb_rdma_pin_encode(&q, msg, sizeof msg, &len);
    if (rc == 0)
        rc = r->ctl->call(r->ctl->peer, ORB_TRANSPORT_RDMA, msg, len, resp, sizeof resp, &rlen,
                          orb_deadline_after(tp->io_timeout_ns));
    if (rc == 0 && orb_rdma_pinned_decode(resp, rlen, &a) != 0)
        rc = orb_fail(ORB_EPROTO, "rdma: %s answered PIN with a malformed PINNED", p->endpoint);
    if (rc != 0) {
        snprintf(why, sizeof why, "rdma: PIN to %s: %s", p->endpoint, orb_last_error());
        end_now(tp, r, rc, why);
        return false;
    }
    if (a.status == ORB_EAGAIN)
        return true;
    if (a.status != 0) {
        snprintf(why, sizeof why, "rdma: %s refused the request: %s", p->endpoint, a.why);
        end_now(tp, r, a.status, why);
        return false;
    }
    r->pin = a.pin;
    r->pin_generation = a.generation;
    r->pin_incarnation = q.incarnation;
    uint64_t slot = a.slot_shift != 0 ? 1ull << a.slot_shift : 0;
    if (slot != 0 && (r->slot_max == 0 || slot < r->slot_max)) {
        r->slot_max = slot;
        r->slot_len = slot_length(r);
    }
    return true;
}

/* Ready `r` for its grant: its pieces asked whether they may start (once: a replay's or a
 * rerouted request's stay), a new id, admission, and the live pieces' rails. false: it ended
 * here. */
static bool prepare(struct orb_rdma_tp *tp, struct rdma_req *r)
{
    struct rdma_peer *p = r->peer;
    if (!r->pieces_asked && !may_start_pieces(tp, r))
        return false;
    r->pieces_asked = true;
    /* A new id for each grant asked for: late answers about a replay's old one match nothing. */
    pthread_mutex_lock(&p->lock);
    r->id = ++p->next_request;
    pthread_mutex_unlock(&p->lock);
    if (!r->pin_asked && r->slot_off == 0 && r->slot_len < r->length && !pin_request(tp, r))
        return false;
    const struct orb_xfer *first = NULL;
    uint64_t bytes = 0;
    for (;;) {
        for (uint32_t i = 0; i < r->npieces; i++) {
            uint64_t off, len;
            if (piece_part(r, r->pieces[i], &off, &len)) {
                first = first != NULL ? first : r->pieces[i];
                bytes += len;
            }
        }
        if (first != NULL || r->slot_off + r->slot_len >= r->length)
            break;
        r->slot_off += r->slot_len; /* a slot of withdrawn pieces only: nothing to move there */
        r->slot_len = slot_length(r);
    }
    char why[256];
    if (!admitted(tp, r, first, bytes, why, sizeof why)) {
        atomic_fetch_add(&tp->deadline_drops, 1);
        end_now(tp, r, ORB_ETIMEDOUT, why);
        return false;
    }
    uint32_t allowed = 0;
    int rc = pick_rails(tp, r, &allowed);
    if (rc == 0)
        rc = choose_rails(tp, r, allowed);
    if (rc != 0) {
        end_now(tp, r, rc, orb_last_error());
        return false;
    }
    return true;
}

/* Post a granted request: its pieces on their rails, and the end of each rail without any. */
static void start(struct orb_rdma_tp *tp, struct rdma_req *r)
{
    struct rdma_peer *p = r->peer;
    struct rdma_ending e;
    uint32_t empty_rails = r->rail_mask;
    pthread_mutex_lock(&p->lock);
    if (r->incarnation != p->incarnation) {
        /* Granted on a connection that was replaced meanwhile (reconnect): its keys belong to
         * queue pairs that are gone. Nothing of it was posted. */
        fail_locked(r, ORB_EPEER, "rdma: %s: the request's connection was replaced before it started", p->endpoint);
        end_locked(r, ORB_EPEER, &e);
        pthread_mutex_unlock(&p->lock);
        report_pieces(tp, &e);
        return;
    }
    r->granted = true;
    r->next = p->active;
    p->active = r;
    r->deadline = orb_deadline_after(tp->io_timeout_ns);
    r->sends_left = popcount(r->rail_mask);
    r->outstanding = 1; /* this thread's hold while it posts: the request cannot end under it */
    bool part[ORB_SLICE_MAX] = {false};
    for (uint32_t i = 0; i < r->npieces; i++) {
        const struct orb_xfer *x = r->pieces[i];
        uint64_t off, len;
        if (!(part[i] = piece_part(r, x, &off, &len)))
            continue;
        r->rail_left[x->rail]++;
        r->outstanding++;
        empty_rails &= ~(1u << x->rail);
    }
    if (r->trial_token != 0) {
        struct orb_rail_key key = rail_key(p, r->trial_rail);
        r->trial_posted = orb_rail_trial_posted(tp->health, &key, r->trial_token) == 0;
    }
    pthread_mutex_unlock(&p->lock);
    for (uint32_t i = 0; i < r->npieces; i++)
        if (part[i])
            post_piece(r, i);
    /* A rail whose pieces were all withdrawn still ends its window. */
    for (uint32_t rail = 0; rail < ORB_RDMA_MAX_RAILS; rail++)
        if (empty_rails & (1u << rail))
            post_sendinv(r, rail);
    pthread_mutex_lock(&p->lock);
    r->outstanding--;
    bool end = maybe_end(r, &e);
    pthread_mutex_unlock(&p->lock);
    if (end)
        report_pieces(tp, &e);
}

/* Take the source's answer for `r`: its keys by rail. */
static int accept_grant(struct rdma_req *r, const struct orb_rdma_grant *g)
{
    if (g->nkeys != popcount(r->rail_mask) || g->target > UINT64_MAX - r->slot_len)
        return orb_fail(ORB_EPROTO, "rdma: %s answered with a grant of %u keys for %u rails at 0x%llx",
                        r->peer->endpoint, g->nkeys, popcount(r->rail_mask), (unsigned long long)g->target);
    r->grant = *g;
    r->remote_target = g->target;
    uint32_t k = 0;
    for (uint32_t rail = 0; rail < ORB_RDMA_MAX_RAILS; rail++)
        if (r->rail_mask & (1u << rail))
            r->key_of_rail[rail] = g->rkeys[k++];
    return 0;
}

/* Ask for `r`'s private grant (its GRANT said the range is device memory the source lends only
 * on queue pairs of the grant's own) on connection `incarnation`: a queue pair per rail made for
 * it here, beside the connection's on the same NIC and lane, connected to the source's, which
 * then carry the request. 0: started (or ended); ORB_EAGAIN: the source's budget is spent, ask
 * again later (nothing was made); with `may_rebuild`, ORB_ENOENT: the source does not know the
 * connection or lost a queue pair of it (nothing was made or ended: the caller rebuilds it and
 * asks again). */
static int private_grant(struct orb_rdma_tp *tp, struct rdma_req *r, const struct orb_control_path *ctl,
                         uint64_t incarnation, bool may_rebuild)
{
    struct rdma_peer *p = r->peer;
    struct rdma_link *priv[ORB_RDMA_MAX_RAILS] = {NULL};
    bool refused = false;
    struct orb_rdma_pgrant_req q = {.incarnation = incarnation, .request = r->id,
                                    .op = r->op == ORB_XFER_READ ? ORB_OP_READ : ORB_OP_WRITE,
                                    .rail_mask = r->rail_mask << (r->lane * p->nrails), .addr = r->addr + r->slot_off,
                                    .length = r->slot_len};
    if (r->pin != 0 && r->pin_incarnation == incarnation) { /* a slot of a pinned request */
        q.pin = (uint8_t)r->pin;
        q.pin_generation = (uint16_t)r->pin_generation;
    }
    struct orb_rdma_pgrant *a = calloc(1, sizeof *a);
    char why[320];
    int rc = a == NULL ? orb_fail(ORB_ENOMEM, "rdma: out of memory for a private grant") : 0;
    for (uint32_t rail = 0; rail < ORB_RDMA_MAX_RAILS && rc == 0; rail++) {
        if (!(r->rail_mask & (1u << rail)))
            continue;
        pthread_mutex_lock(&p->lock);
        struct rdma_link *cl = p->links[r->lane * p->nrails + rail];
        pthread_mutex_unlock(&p->lock);
        if ((rc = rdma_link_new_on(tp, cl->ctx, cl->ctx->pd, RDMA_LINK_PRIVATE, RDMA_ROLE_REQUESTER, rail, cl->lane, p,
                                   &priv[rail])) != 0) {
            /* Full for now (other private grants' queue pairs go as their requests end): asked
             * again, backing off, until io_timeout_s. */
            if (rc == ORB_ERESOURCE)
                rc = ORB_EAGAIN;
            break;
        }
        q.qps[q.nqps++] = priv[rail]->qp->local;
    }
    uint8_t msg[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
    size_t len = 0, rlen = 0;
    if (rc == 0)
        rc = orb_rdma_pgrant_req_encode(&q, msg, sizeof msg, &len);
    if (rc == 0)
        atomic_fetch_add(&tp->grant_trips, 1);
    if (rc == 0)
        rc = ctl->call(ctl->peer, ORB_TRANSPORT_RDMA, msg, len, resp, sizeof resp, &rlen,
                       orb_deadline_after(tp->io_timeout_ns));
    if (rc == 0 && (orb_rdma_pgrant_decode(resp, rlen, a) != 0 || (a->status == 0 && a->nqps != q.nqps)))
        rc = orb_fail(ORB_EPROTO, "rdma: %s answered PGRANT_REQ with a malformed PGRANT", p->endpoint);
    if (rc == ORB_ENOENT && may_rebuild) {
        /* Kept as it is: freed below, the request neither ended nor started. */
    } else if (rc != 0) {
        snprintf(why, sizeof why, "rdma: a private grant from %s: %s", p->endpoint, orb_last_error());
    } else if (a->status == ORB_EAGAIN) {
        rc = ORB_EAGAIN; /* "not now": asked again, backing off */
    } else if (a->status == ORB_EPEER && may_rebuild) {
        rc = ORB_ENOENT; /* a queue pair of the connection died at the source: rebuilt, asked again */
    } else if (a->status == ORB_ERESOURCE && a->slot_shift != 0) {
        /* The source stages in smaller slots: the request comes back slot by slot. */
        uint32_t shift = a->slot_shift;
        for (uint32_t rail = 0; rail < ORB_RDMA_MAX_RAILS; rail++)
            (void)rdma_link_free(priv[rail]);
        free(a);
        if (!resize_slot(tp, r, shift)) {
            snprintf(why, sizeof why, "rdma: %s refused a slot of %llu bytes for slots of %llu", p->endpoint,
                     (unsigned long long)r->slot_len, 1ull << shift);
            end_now(tp, r, ORB_EPROTO, why);
        }
        return 0;
    } else if (a->status != 0) {
        /* A refusal of the request itself (its range, permission or pin): final, whatever its
         * status; only the control call's ORB_ENOENT says the connection is unknown there. */
        rc = a->status;
        refused = true;
        snprintf(why, sizeof why, "rdma: %s refused the private grant: %s", p->endpoint, a->why);
    }
    /* Connected to the source's queue pairs, in rail order. */
    for (uint32_t rail = 0, i = 0; rail < ORB_RDMA_MAX_RAILS && rc == 0; rail++) {
        if (priv[rail] == NULL)
            continue;
        if ((rc = rdma_link_connect(priv[rail], &a->qps[i++])) != 0)
            snprintf(why, sizeof why, "rdma: connecting a private grant's queue pair to %s: %s", p->endpoint,
                     orb_last_error());
    }
    if (rc != 0) {
        /* Never posted on: freed here (the source's side of it expires there). */
        for (uint32_t rail = 0; rail < ORB_RDMA_MAX_RAILS; rail++)
            (void)rdma_link_free(priv[rail]);
        free(a);
        if (!refused && (rc == ORB_EAGAIN || (rc == ORB_ENOENT && may_rebuild)))
            return rc;
        end_now(tp, r, rc, why);
        return 0;
    }
    struct orb_rdma_grant g = {.grant = a->grant, .generation = a->generation, .target = a->target, .nkeys = a->nqps};
    memcpy(g.nonce, a->nonce, sizeof g.nonce);
    memcpy(g.rkeys, a->rkeys, sizeof g.rkeys);
    bool windows = a->keys == ORB_RDMA_PGRANT_WINDOWS;
    free(a);
    if ((rc = accept_grant(r, &g)) != 0) {
        snprintf(why, sizeof why, "%s", orb_last_error());
        for (uint32_t rail = 0; rail < ORB_RDMA_MAX_RAILS; rail++)
            (void)rdma_link_free(priv[rail]);
        end_now(tp, r, rc, why);
        return 0;
    }
    pthread_mutex_lock(&p->lock);
    r->private_grant = true;
    r->priv_windows = windows;
    r->per_grant = true; /* the request's next slots ask PGRANT_REQ at once */
    memcpy(r->priv, priv, sizeof r->priv);
    pthread_mutex_unlock(&p->lock);
    start(tp, r);
    return 0;
}

/* Whether a queue pair of p's connection on one of `rails` is dead. */
static bool links_failed(struct rdma_peer *p, uint32_t rails)
{
    pthread_mutex_lock(&p->lock);
    bool dead = (dead_rails_locked(p) & rails) != 0;
    pthread_mutex_unlock(&p->lock);
    return dead;
}

/* Rebuild p's connection after the source answered that it no longer has connection `seen` (it
 * failed there, or is gone): a miss before any authority, so the requests it refused may ask
 * again on the new one. Only while no request of p holds a grant (the links are replaced under
 * p->lock, where start() checks that its request's connection is still p's); one builder at a
 * time, and once per lost incarnation; after a failed attempt none for a backoff (1 s, doubling
 * to 30 s). 0: p has a connection newer than `seen` now. */
static int reconnect(struct orb_rdma_tp *tp, struct rdma_peer *p, const struct orb_control_path *ctl,
                     uint64_t seen, uint64_t deadline, const char *cause)
{
    int rc = 0;
    pthread_mutex_lock(&p->reconnect_lock);
    pthread_mutex_lock(&p->lock);
    bool current = p->incarnation == seen, busy = p->active != NULL;
    bool waiting = orb_now_ns() < p->reconnect_after_ns;
    pthread_mutex_unlock(&p->lock);
    if (!current)
        goto unlock; /* another grant thread rebuilt it */
    if (busy) {
        rc = orb_fail(ORB_EPEER, "rdma: %s lost the connection; it is rebuilt once the requests granted on it end",
                      p->endpoint);
        goto unlock;
    }
    if (waiting) {
        rc = orb_fail(ORB_EPEER, "rdma: %s lost the connection and rebuilding it failed moments ago: %s",
                      p->endpoint, p->reconnect_why);
        goto unlock;
    }
    struct rdma_link *fresh[ORB_RDMA_MAX_RAILS] = {NULL}, *old[ORB_RDMA_MAX_RAILS] = {NULL};
    uint64_t incarnation = 0;
    uint32_t width = 0;
    rc = connect_rails(tp, p, ctl, deadline, fresh, &width, &incarnation);
    if (rc != 0) {
        pthread_mutex_lock(&p->lock);
        p->reconnect_backoff_ns = p->reconnect_backoff_ns == 0 ? ORB_NS_PER_SEC
                                  : p->reconnect_backoff_ns >= 15 * ORB_NS_PER_SEC ? 30 * ORB_NS_PER_SEC
                                                                                   : 2 * p->reconnect_backoff_ns;
        p->reconnect_after_ns = orb_now_ns() + p->reconnect_backoff_ns;
        snprintf(p->reconnect_why, sizeof p->reconnect_why, "%s", orb_last_error());
        pthread_mutex_unlock(&p->lock);
        rc = orb_fail_wrap(rc, "rdma: %s lost the connection and it could not be rebuilt", p->endpoint);
        goto unlock;
    }
    pthread_mutex_lock(&p->lock);
    busy = p->active != NULL;
    if (!busy) {
        for (uint32_t q = 0; q < ORB_RDMA_MAX_RAILS; q++) { /* unused places are NULL */
            old[q] = p->links[q];
            p->links[q] = fresh[q];
        }
        p->width = width;
        p->incarnation = incarnation;
        p->poisoned = false;
        p->reconnect_backoff_ns = 0;
    }
    pthread_mutex_unlock(&p->lock);
    send_disconnect(p, ctl, busy ? incarnation : seen);
    rdma_links_drop(busy ? fresh : old, 0, ORB_RDMA_MAX_RAILS);
    if (busy) {
        rc = orb_fail(ORB_EPEER, "rdma: %s lost the connection; it is rebuilt once the requests granted on it end",
                      p->endpoint);
        goto unlock;
    }
    atomic_fetch_add(&tp->reconnects, 1);
    ORB_LOGI("rdma: %s: %s; %u rail(s) connected again, %u lane(s)", p->endpoint, cause, p->nrails, width);

unlock:
    pthread_mutex_unlock(&p->reconnect_lock);
    return rc;
}

/* A grant thread begins asking p for grants: after a heal's fence lifted (or `deadline`), counted
 * in p->granting so that the next heal waits for it. */
static void granting_begin(struct orb_rdma_tp *tp, struct rdma_peer *p, uint64_t deadline)
{
    pthread_mutex_lock(&p->lock);
    while (p->fenced && !atomic_load(&tp->stopping) && orb_now_ns() < deadline)
        fence_wait(p, deadline);
    p->granting++;
    pthread_mutex_unlock(&p->lock);
}

static void granting_end(struct rdma_peer *p)
{
    pthread_mutex_lock(&p->lock);
    if (--p->granting == 0 && p->fenced)
        pthread_cond_broadcast(&p->fence_cond);
    pthread_mutex_unlock(&p->lock);
}

/* Sleep *nap before asking again after "not now", doubling it up to 25.6 ms. */
static void backoff(uint64_t *nap)
{
    struct timespec ts = {(time_t)(*nap / ORB_NS_PER_SEC), (long)(*nap % ORB_NS_PER_SEC)};
    nanosleep(&ts, NULL);
    if (*nap < 25600000)
        *nap *= 2;
}

/* Grant and start rs[0..n) (one peer's) with as few round trips as the source allows: one
 * GRANT_REQ for all of them; requests the source answers "not now" (ORB_EAGAIN: a budget of its
 * own is spent for the moment) are asked for again, backing off, until io_timeout; then they
 * fail with ORB_ERESOURCE. */
static void grant_batch(struct orb_rdma_tp *tp, struct rdma_req **rs, uint32_t n)
{
    struct rdma_peer *p = rs[0]->peer;
    /* The requests may come from several segments sharing p: any one's control path will do,
     * each stays open while its request is pending here. */
    const struct orb_control_path *ctl = rs[0]->ctl;
    uint64_t deadline = orb_deadline_after(tp->io_timeout_ns);
    uint64_t nap = 200000; /* 0.2 ms, doubling to 25.6 ms */
    struct orb_rdma_grant_req q;
    struct orb_rdma_grants *ans = malloc(sizeof *ans);
    char why[320];
    bool rebuilt = false; /* at most one reconnect per call */
    uint32_t rails = 0;
    for (uint32_t i = 0; i < n; i++)
        rails |= rs[i]->rail_mask;
    /* A connection being healed is asked nothing until it is new (or the wait is over). */
    granting_begin(tp, p, deadline);
    while (n > 0) {
        int rc = ans == NULL ? orb_fail(ORB_ENOMEM, "rdma: out of memory for a GRANT") : 0;
        memset(&q, 0, sizeof q);
        pthread_mutex_lock(&p->lock);
        q.incarnation = p->incarnation;
        /* Each request on one lane of the connection, in turn: its rails' queue pairs there. */
        for (uint32_t i = 0; i < n; i++)
            rs[i]->lane = p->next_lane++ % p->width;
        pthread_mutex_unlock(&p->lock);
        if (!rebuilt && links_failed(p, rails)) {
            /* A queue pair of ours is dead: the connection is rebuilt before anything is asked
             * on it (no grant can be used on it any more). */
            rebuilt = true;
            if (reconnect(tp, p, ctl, q.incarnation, deadline, "a queue pair of the connection died") != 0) {
                snprintf(why, sizeof why, "%s", orb_last_error());
                for (uint32_t i = 0; i < n; i++)
                    end_now(tp, rs[i], ORB_EPEER, why);
                break;
            }
            continue;
        }
        q.count = n;
        for (uint32_t i = 0; i < n; i++)
            rs[i]->incarnation = q.incarnation;
        for (uint32_t i = 0; i < n; i++)
            q.ask[i] = (struct orb_rdma_grant_ask){
                .request = rs[i]->id, .op = rs[i]->op == ORB_XFER_READ ? ORB_OP_READ : ORB_OP_WRITE,
                .rail_mask = rs[i]->rail_mask << (rs[i]->lane * p->nrails), .addr = rs[i]->addr + rs[i]->slot_off,
                .length = rs[i]->slot_len};
        for (uint32_t i = 0; i < n; i++)
            if (rs[i]->pin != 0 && rs[i]->pin_incarnation == q.incarnation) { /* else each slot on its own */
                q.ask[i].pin = (uint8_t)rs[i]->pin;
                q.ask[i].pin_generation = (uint16_t)rs[i]->pin_generation;
            }
        uint8_t msg[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
        size_t len = 0, rlen = 0;
        if (rc == 0)
            rc = orb_rdma_grant_req_encode(&q, msg, sizeof msg, &len);
        if (rc == 0)
            atomic_fetch_add(&tp->grant_trips, 1);
        if (rc == 0)
            rc = ctl->call(ctl->peer, ORB_TRANSPORT_RDMA, msg, len, resp, sizeof resp, &rlen, deadline);
        if (rc == 0 && (orb_rdma_grants_decode(resp, rlen, ans) != 0 || ans->count != n))
            rc = orb_fail(ORB_EPROTO, "rdma: %s answered GRANT_REQ with a malformed GRANT", p->endpoint);
        uint32_t again = 0, lost = 0;
        /* The source no longer has this connection (ENOENT: it does not know it; EPEER on an
         * entry: it failed there): nothing was granted, so the requests may ask again on a new
         * one. */
        bool gone = rc == ORB_ENOENT && !rebuilt;
        if (rc != 0 && rc != ORB_EAGAIN && !gone) {
            snprintf(why, sizeof why, "%s", orb_last_error());
            for (uint32_t i = 0; i < n; i++)
                end_now(tp, rs[i], rc, why);
            break;
        }
        struct rdma_req *refused[ORB_RDMA_GRANT_BATCH];
        for (uint32_t i = 0; i < n; i++) {
            struct rdma_req *r = rs[i];
            int st = rc != 0 ? rc : ans->g[i].status;
            if (st == ORB_EAGAIN) {
                rs[again++] = r;
                continue;
            }
            if (st == ORB_EPEER && rc == 0 && ans->g[i].lost_qps != 0) {
                if ((ans->g[i].lost_qps & ~q.ask[i].rail_mask) != 0) {
                    snprintf(why, sizeof why, "rdma: %s named queue pairs 0x%x lost for a request that asked for 0x%x",
                             p->endpoint, ans->g[i].lost_qps, q.ask[i].rail_mask);
                    end_now(tp, r, ORB_EPROTO, why);
                    continue;
                }
                if (reroute(tp, r, ans->g[i].lost_qps, q.incarnation))
                    continue;
                snprintf(why, sizeof why, "rdma: %s refused the grant: %s", p->endpoint, ans->g[i].why);
                end_now(tp, r, ORB_EPEER, why);
                continue;
            }
            if (st == ORB_ERESOURCE && rc == 0 && ans->g[i].slot_shift != 0) {
                if (resize_slot(tp, r, ans->g[i].slot_shift))
                    continue;
                snprintf(why, sizeof why, "rdma: %s refused a slot of %llu bytes for slots of %llu", p->endpoint,
                         (unsigned long long)r->slot_len, 1ull << ans->g[i].slot_shift);
                end_now(tp, r, ORB_EPROTO, why);
                continue;
            }
            if ((gone || st == ORB_EPEER) && !rebuilt) {
                refused[lost++] = r;
                continue;
            }
            if (st == ORB_EUNAVAILABLE && rc == 0 && ans->g[i].private_only) {
                int e = private_grant(tp, r, ctl, q.incarnation, !rebuilt);
                if (e == ORB_EAGAIN)
                    rs[again++] = r;
                else if (e == ORB_ENOENT) /* the source lost (a queue pair of) the connection */
                    refused[lost++] = r;
                continue;
            }
            if (st == 0 && (st = accept_grant(r, &ans->g[i])) == 0) {
                start(tp, r);
                continue;
            }
            if (ans->g[i].status != 0)
                snprintf(why, sizeof why, "rdma: %s refused the grant: %s", p->endpoint, ans->g[i].why);
            else
                snprintf(why, sizeof why, "%s", orb_last_error());
            end_now(tp, r, st, why);
        }
        if (lost > 0) {
            rebuilt = true;
            if (reconnect(tp, p, ctl, q.incarnation, deadline, "the source lost the connection") == 0) {
                for (uint32_t i = 0; i < lost; i++)
                    rs[again++] = refused[i];
                n = again;
                continue; /* ask at once, on the new connection */
            }
            snprintf(why, sizeof why, "%s", orb_last_error());
            for (uint32_t i = 0; i < lost; i++)
                end_now(tp, refused[i], ORB_EPEER, why);
        }
        n = again;
        if (n == 0)
            break;
        if (orb_now_ns() + nap >= deadline || atomic_load(&tp->stopping)) {
            snprintf(why, sizeof why, "rdma: %s: the source's budget stayed spent for io_timeout_s (%s)", p->endpoint,
                     rc != 0 ? orb_last_error() : ans->g[0].why);
            for (uint32_t i = 0; i < n; i++)
                end_now(tp, rs[i], ORB_ERESOURCE, why);
            break;
        }
        backoff(&nap);
    }
    granting_end(p);
    free(ans);
}

/* Grant and start `r` on queue pairs of its own (r->per_grant): PGRANT_REQ alone, asked again,
 * backing off, while the source answers "not now", until io_timeout_s; then it fails with
 * ORB_ERESOURCE. The connection's queue pairs carry only its ACK. */
static void grant_own(struct orb_rdma_tp *tp, struct rdma_req *r)
{
    struct rdma_peer *p = r->peer;
    const struct orb_control_path *ctl = r->ctl;
    uint64_t deadline = orb_deadline_after(tp->io_timeout_ns);
    uint64_t nap = 200000; /* 0.2 ms, doubling to 25.6 ms */
    bool rebuilt = false;
    granting_begin(tp, p, deadline);
    for (;;) {
        pthread_mutex_lock(&p->lock);
        uint64_t incarnation = p->incarnation;
        r->lane = p->next_lane++ % p->width;
        pthread_mutex_unlock(&p->lock);
        /* The ACK comes on the connection's queue pairs: rebuilt first when one of ours is
         * dead, or when the source lost (a queue pair of) it, which granted nothing. */
        const char *lost = NULL;
        if (!rebuilt && links_failed(p, r->rail_mask)) {
            lost = "a queue pair of the connection died";
        } else {
            r->incarnation = incarnation;
            int rc = private_grant(tp, r, ctl, incarnation, !rebuilt);
            if (rc == ORB_ENOENT)
                lost = "the source lost the connection";
            else if (rc != ORB_EAGAIN)
                break; /* started or ended */
        }
        if (lost != NULL) {
            rebuilt = true;
            if (reconnect(tp, p, ctl, incarnation, deadline, lost) != 0) {
                char why[320];
                snprintf(why, sizeof why, "%s", orb_last_error());
                end_now(tp, r, ORB_EPEER, why);
                break;
            }
            continue;
        }
        if (orb_now_ns() + nap >= deadline || atomic_load(&tp->stopping)) {
            end_now(tp, r, ORB_ERESOURCE,
                    "rdma: the source's budget for grants on queue pairs of their own stayed spent for io_timeout_s");
            break;
        }
        backoff(&nap);
    }
    granting_end(p);
}

/* Serve a batch the grant thread took (one peer's requests, each counted in its inflight). A
 * staged request that finds staging full first sends off the ones prepared before it, whose
 * extents come back only once they run, and only then waits. A request granted on queue pairs of
 * its own goes after the ones before it, in the batch's order. */
static void serve(struct orb_rdma_tp *tp, struct rdma_req **batch, uint32_t n)
{
    struct rdma_req *live[ORB_RDMA_GRANT_BATCH];
    uint32_t nlive = 0;
    /* A batch's rails are chosen against the other grant threads' charges of now. */
    if (tp->sel != NULL)
        orb_selector_refresh(tp->sel);
    for (uint32_t i = 0; i < n; i++) {
        struct rdma_req *r = batch[i];
        if (!prepare(tp, r))
            continue;
        if (r->staged && r->stage.cpu == NULL) { /* a replay keeps its extent */
            int rc = stage_in(tp, r, false);
            if (rc == ORB_EAGAIN) {
                if (nlive > 0)
                    grant_batch(tp, live, nlive);
                nlive = 0;
                rc = stage_in(tp, r, true);
            }
            if (rc != 0) {
                end_now(tp, r, rc, orb_last_error());
                continue;
            }
        }
        if (r->per_grant) {
            if (nlive > 0)
                grant_batch(tp, live, nlive);
            nlive = 0;
            grant_own(tp, r);
            continue;
        }
        live[nlive++] = r;
    }
    if (nlive > 0)
        grant_batch(tp, live, nlive);
}

/* What take_batch() is choosing (glock held): the peer and tier of the first request that can
 * go, its room, and the peers seen without room (checked once each per walk). */
struct batch_pick {
    struct rdma_peer *peer;
    uint8_t tier;
    uint32_t room, taken;
    struct rdma_peer *full[8];
    uint32_t nfull;
};

/* Whether p can take requests now (p->lock held): room for RDMA_RQ_DEPTH past the grant queue
 * (each may need an ACK receive), RDMA_GRANT_MIN_ROOM of it when requests are past it already
 * (so that a round trip carries many), and a grant thread of its share free. The room, or 0. */
static uint32_t peer_room_locked(const struct rdma_peer *p)
{
    if (p->serving >= RDMA_GRANT_THREADS_PER_PEER || p->inflight >= RDMA_RQ_DEPTH)
        return 0;
    uint32_t room = RDMA_RQ_DEPTH - p->inflight;
    return p->inflight > 0 && room < RDMA_GRANT_MIN_ROOM ? 0 : room;
}

static enum orb_qos_take pick_filter(void *ctx, struct orb_qos_entry *e)
{
    struct batch_pick *b = ctx;
    struct rdma_req *r = (struct rdma_req *)e;
    struct rdma_peer *p = r->peer;
    if (b->peer != NULL) {
        if (p != b->peer || r->qe.priority != b->tier)
            return ORB_QOS_LEAVE;
        if (b->taken >= b->room)
            return ORB_QOS_STOP;
        b->taken++;
        return ORB_QOS_TAKE;
    }
    for (uint32_t i = 0; i < b->nfull; i++)
        if (b->full[i] == p)
            return ORB_QOS_LEAVE;
    pthread_mutex_lock(&p->lock);
    uint32_t room = peer_room_locked(p);
    pthread_mutex_unlock(&p->lock);
    if (room == 0) {
        if (b->nfull < sizeof b->full / sizeof b->full[0])
            b->full[b->nfull++] = p;
        return ORB_QOS_LEAVE;
    }
    b->peer = p;
    b->tier = r->qe.priority;
    b->room = room;
    b->taken = 1;
    return ORB_QOS_TAKE;
}

/* Take a batch for one GRANT call (glock held): the most urgent request whose peer can take
 * requests now (peer_room_locked), and the ones behind it of the same peer and tier, in queue
 * order, up to ORB_RDMA_GRANT_BATCH and the peer's room. Requests of a peer without room stay
 * where they are and hold back no other peer's. Each taken request is counted in its peer's
 * inflight, and the peer's `serving` counts the batch until take_batch_done(); only grant threads
 * under glock add to either, so the room seen cannot shrink before it is taken. Returns how
 * many (0: no queued request can go now). */
static uint32_t take_batch(struct orb_rdma_tp *tp, struct rdma_req **out)
{
    (void)orb_qos_promote(&tp->gq);
    struct batch_pick b = {0};
    struct orb_qos_entry *taken[ORB_RDMA_GRANT_BATCH];
    size_t n = orb_qos_take_where(&tp->gq, ORB_QOS_ALL_TIERS, pick_filter, &b, taken, ORB_RDMA_GRANT_BATCH);
    if (n == 0)
        return 0;
    struct rdma_peer *p = b.peer;
    pthread_mutex_lock(&p->lock);
    p->inflight += (uint32_t)n;
    p->serving++;
    for (size_t i = 0; i < n; i++) {
        out[i] = (struct rdma_req *)taken[i];
        out[i]->counted = true;
    }
    pthread_mutex_unlock(&p->lock);
    return (uint32_t)n;
}

/* The batch take_batch() gave p is served: p may take another. */
static void take_batch_done(struct orb_rdma_tp *tp, struct rdma_peer *p)
{
    pthread_mutex_lock(&p->lock);
    p->serving--;
    pthread_mutex_unlock(&p->lock);
    rdma_grant_wake(tp, false);
}

/* Whether the source process still answers on r's control connection: 0 when it does (a
 * PING's echo, or any answer of its own), else ORB_EPEER with the reason in `why`. At most
 * RDMA_PING_NS (or io_timeout_s, when shorter). */
static int source_answers(struct orb_rdma_tp *tp, const struct rdma_req *r, char *why, size_t cap)
{
    const struct orb_control_path *ctl = r->ctl;
    int rc = ctl->lost(ctl->peer);
    if (rc != 0) {
        snprintf(why, cap, "its control connection is lost (%s)", orb_strerror(rc));
        return ORB_EPEER;
    }
    uint64_t wait = tp->io_timeout_ns < RDMA_PING_NS ? tp->io_timeout_ns : RDMA_PING_NS;
    uint64_t nonce = orb_random_u64();
    uint8_t msg[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
    size_t len = 0, rlen = 0;
    if ((rc = orb_rdma_ping_encode(nonce, msg, sizeof msg, &len)) == 0)
        rc = ctl->call(ctl->peer, ORB_TRANSPORT_RDMA, msg, len, resp, sizeof resp, &rlen, orb_deadline_after(wait));
    /* Anything the source itself says (a refusal, a message this code does not expect) shows
     * it alive; only silence, a lost connection or a stopped transport do not. */
    if (rc != ORB_EPEER && rc != ORB_ETIMEDOUT && rc != ORB_ECLOSED)
        return 0;
    snprintf(why, cap, "it did not answer a PING within %llu ms (%s)", (unsigned long long)(wait / 1000000u),
             orb_last_error());
    return ORB_EPEER;
}

/* UNPIN r's pin (grant thread): 0 once the source let go of it, else why not in `why`. Without
 * `ask` (the transport stops) nothing is sent. */
static int unpin(struct orb_rdma_tp *tp, struct rdma_req *r, bool ask, char *why, size_t cap)
{
    const struct orb_control_path *ctl = r->ctl;
    struct orb_rdma_unpin u = {.incarnation = r->pin_incarnation, .pin = r->pin, .generation = r->pin_generation};
    uint8_t msg[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
    size_t len = 0, rlen = 0;
    int32_t status = 0;
    int rc = ask ? orb_rdma_unpin_encode(&u, msg, sizeof msg, &len)
                 : orb_fail(ORB_ECLOSED, "rdma: the transport stopped before the request's UNPIN");
    if (rc == 0)
        rc = ctl->call(ctl->peer, ORB_TRANSPORT_RDMA, msg, len, resp, sizeof resp, &rlen,
                       orb_deadline_after(tp->io_timeout_ns));
    if (rc == 0 && orb_rdma_unpinned_decode(resp, rlen, &status) != 0)
        rc = orb_fail(ORB_EPROTO, "rdma: %s answered UNPIN with a malformed UNPINNED", r->peer->endpoint);
    if (rc == 0 && status != 0)
        rc = orb_fail(status, "rdma: %s no longer held the request's pin", r->peer->endpoint);
    if (rc != 0)
        snprintf(why, cap, "%s", orb_last_error());
    return rc;
}

/* Settle a deferred ending (grant thread), asking the source when `ask`.
 * A device's refusal: a live source never takes back a window before its grant ends (an
 * unregister waits for admitted work), so a device that refused one while its process answers
 * did refuse that key: ORB_EPERM stands. A source that no longer answers lost its windows with
 * its process or its transport: the peer failed (ORB_EPEER), which is what the report says then.
 * A pin: UNPIN goes whatever the ending; a request whose slots all moved but whose UNPIN is not
 * answered fails (its bytes moved: a WRITE's remote effect is unknown). */
static void settle_ending(struct orb_rdma_tp *tp, struct rdma_req *r, bool ask)
{
    struct rdma_ending *v = r->verdict;
    r->verdict = NULL;
    char why[200];
    if (r->device_refused) {
        r->device_refused = false;
        if (ask && source_answers(tp, r, why, sizeof why) != 0) {
            ORB_LOGI("rdma: %s: the source's device refused an access to a window it granted, and the source: %s; the "
                     "request fails as the peer's",
                     r->peer->endpoint, why);
            v->status = ORB_EPEER;
            char was[sizeof v->why];
            snprintf(was, sizeof was, "%s", v->why);
            snprintf(v->why, sizeof v->why, "rdma: the source is gone: %.150s (%.120s)", why, was);
        }
    }
    pthread_mutex_lock(&r->peer->lock);
    bool same_connection = r->pin_incarnation == r->peer->incarnation;
    pthread_mutex_unlock(&r->peer->lock);
    if (r->pin != 0 && !same_connection) {
        /* Pins live with their connection: the source let go of this one with it (the
         * requester replaced a connection it lost, or one the source no longer had). */
        ORB_LOGD("rdma: %s: a request's pin went with its connection", r->peer->endpoint);
        r->pin = 0;
    }
    if (r->pin != 0) {
        int rc = unpin(tp, r, ask, why, sizeof why);
        r->pin = 0;
        if (rc != 0 && v->status == 0) {
            ORB_LOGI("rdma: %s: a request's UNPIN failed (%s): the request fails", r->peer->endpoint, why);
            v->status = rc == ORB_ECLOSED ? ORB_ECLOSED : ORB_EPEER;
            v->effect = r->op == ORB_XFER_WRITE ? ORB_REMOTE_EFFECT_UNKNOWN : ORB_REMOTE_EFFECT_NONE;
            snprintf(v->why, sizeof v->why, "rdma: every slot moved, but the source did not confirm the request's "
                     "end: %.200s", why);
        }
    }
    report_pieces(tp, v); /* r may be gone after this */
    free(v);
}

/* The next deferred refusal, taken off the list (glock held); NULL: none. */
static struct rdma_req *take_refusal_locked(struct orb_rdma_tp *tp)
{
    struct rdma_req *r = tp->verdicts;
    if (r != NULL)
        tp->verdicts = r->next;
    return r;
}

/* A grant thread with queued requests none of which can go waits this long for a change at
 * first, twice as long after each wait that brought none, up to the maximum: every change
 * wakes it, the naps only bound the wait for what counts none (the queue's promotions). */
#define GRANT_IDLE_NAP_NS 1000000ull
#define GRANT_IDLE_NAP_MAX_NS 16000000ull

void rdma_grant_wake(struct orb_rdma_tp *tp, bool all)
{
    atomic_fetch_add(&tp->grant_gen, 1);
    /* A napper counts itself before it reads the count again (both sequentially consistent):
     * either it sees this change or this sees it, and FUTEX_WAIT refuses a changed word. */
    if (atomic_load(&tp->grant_nappers) > 0)
        (void)syscall(SYS_futex, (uint32_t *)(void *)&tp->grant_gen, FUTEX_WAKE_PRIVATE, all ? INT_MAX : 1, NULL,
                      NULL, 0);
    if (all)
        pthread_cond_broadcast(&tp->gcond);
    else
        pthread_cond_signal(&tp->gcond);
}

/* Nap until the count moves from `seen`, at most `ns` (glock held, let go meanwhile). */
static void grant_nap(struct orb_rdma_tp *tp, uint32_t seen, uint64_t ns)
{
    pthread_mutex_unlock(&tp->glock);
    atomic_fetch_add(&tp->grant_nappers, 1);
    if (atomic_load(&tp->grant_gen) == seen) {
        struct timespec ts = {.tv_sec = (time_t)(ns / ORB_NS_PER_SEC), .tv_nsec = (long)(ns % ORB_NS_PER_SEC)};
        (void)syscall(SYS_futex, (uint32_t *)(void *)&tp->grant_gen, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
    }
    atomic_fetch_sub(&tp->grant_nappers, 1);
    pthread_mutex_lock(&tp->glock);
}

void *rdma_grant_thread(void *arg)
{
    struct orb_rdma_tp *tp = arg;
    orb_thread_name("rdma-grant");
    struct rdma_req *batch[ORB_RDMA_GRANT_BATCH];
    uint64_t nap_ns = GRANT_IDLE_NAP_NS;
    pthread_mutex_lock(&tp->glock);
    while (!atomic_load(&tp->stopping)) {
        struct rdma_req *refused = take_refusal_locked(tp);
        if (refused != NULL) {
            pthread_mutex_unlock(&tp->glock);
            settle_ending(tp, refused, true);
            pthread_mutex_lock(&tp->glock);
            continue;
        }
        if (orb_qos_total(&tp->gq) == 0) {
            struct timespec ts = orb_deadline_timespec(orb_deadline_after(100ull * 1000000ull));
            pthread_cond_timedwait(&tp->gcond, &tp->glock, &ts);
            continue;
        }
        /* Nothing has changed since a walk found nothing to take: nap until a change (room
         * comes back under a peer's lock alone, so the nap is on the count, not on gcond). */
        uint32_t gen = atomic_load(&tp->grant_gen);
        if (tp->grant_idle && gen == tp->grant_idle_gen) {
            (void)orb_qos_promote(&tp->gq);
            grant_nap(tp, gen, nap_ns);
            if (nap_ns < GRANT_IDLE_NAP_MAX_NS)
                nap_ns *= 2;
            continue;
        }
        nap_ns = GRANT_IDLE_NAP_NS;
        uint32_t n = take_batch(tp, batch);
        if (n == 0) {
            tp->grant_idle = true;
            tp->grant_idle_gen = gen;
            continue;
        }
        pthread_mutex_unlock(&tp->glock);
        struct rdma_peer *p = batch[0]->peer; /* held by `serving` past its requests' ends */
        serve(tp, batch, n);
        take_batch_done(tp, p);
        pthread_mutex_lock(&tp->glock);
    }
    /* Stopping: what was never granted ends here. */
    for (;;) {
        struct rdma_req *left = (struct rdma_req *)orb_qos_pop(&tp->gq, ORB_QOS_ALL_TIERS);
        if (left == NULL)
            break;
        pthread_mutex_unlock(&tp->glock);
        end_now(tp, left, ORB_ECLOSED, "rdma: the transport stopped before the request was granted");
        pthread_mutex_lock(&tp->glock);
    }
    /* and a refusal still to be settled is reported as the device gave it. */
    for (struct rdma_req *refused; (refused = take_refusal_locked(tp)) != NULL;) {
        pthread_mutex_unlock(&tp->glock);
        settle_ending(tp, refused, false);
        pthread_mutex_lock(&tp->glock);
    }
    pthread_mutex_unlock(&tp->glock);
    return NULL;
}

/* ---- completions -------------------------------------------------------------------------------- */

void rdma_req_on_send(struct rdma_link *l, uint64_t cookie, const struct ibv_wc *wc, bool is_this)
{
    struct orb_rdma_tp *tp = l->tp;
    bool ok = !is_this || wc->status == IBV_WC_SUCCESS;
    struct rdma_req *r;
    bool sendinv = false;
    uint32_t rail = l->rail;
    struct orb_xfer *x = NULL;
    if (cookie & RDMA_COOKIE_CTX) {
        struct rdma_wr_ctx *c = (struct rdma_wr_ctx *)(uintptr_t)(cookie & ~(uint64_t)RDMA_COOKIE_CTX);
        r = c->owner;
        sendinv = true;
    } else {
        x = (struct orb_xfer *)(uintptr_t)cookie;
        r = x->request_private;
    }
    struct rdma_peer *p = r->peer;
    struct rdma_ending e;
    bool post_end_of_rail = false;
    pthread_mutex_lock(&p->lock);
    r->outstanding--;
    if (sendinv) {
        r->sends_left--;
    } else {
        uint64_t off = 0, len = 0;
        (void)piece_part(r, x, &off, &len); /* the WR's bytes: the piece's part in the slot */
        (void)orb_selector_note_post_ended(tp->sel, rail, len);
        (void)orb_lease_consume(&r->lease, r->lease_slot[x->piece_index]);
        if (ok) {
            r->rail_wrs[rail]++;
            r->rail_bytes[rail] += len;
            if (is_this) /* a physical completion; the WRs before it retire with it */
                atomic_fetch_add(&tp->payload_send_cqes, 1);
            atomic_fetch_add(x->op == ORB_XFER_READ ? &tp->completed_reads : &tp->completed_writes, 1);
            (void)orb_selector_note_completed(tp->sel, rail, len);
        }
    }
    if (!ok && sendinv && r->private_grant) {
        /* A private grant's end: the source destroys its queue pair once the binding is in, which
         * may leave this SEND without its transport acknowledgement. The source's ACK says whether
         * the grant ended (a SEND that never arrived leaves the request to its deadline). */
        ORB_LOGD("rdma: %s: rail %u: a private grant's end completed with %s; its ACK decides", p->endpoint, rail,
                 tp->v->wc_status_str(wc->status));
    } else if (!ok) {
        ORB_LOGD("rdma: %s: rail %u: %s", p->endpoint, rail, tp->v->wc_status_str(wc->status));
        /* The path failed (not the peer's authority): rail health counts it -- unless the
         * request had already failed otherwise, of which this is a consequence (a source that
         * drops its queue pairs after a refused access). */
        if (atomic_load(&l->fault) && (r->status == 0 || r->rail_failed != 0))
            r->rail_failed |= 1u << rail;
        if (sendinv && r->acked && r->status == 0) {
            /* The ACK came first and said the grant ended well (one that did not failed the
             * request): the binding arrived, and the queue pair died before the transport
             * acknowledged the SEND. The request stands. */
            ORB_LOGD("rdma: %s: rail %u: a rail's end completed with %s after the source's ACK; the request stands",
                     p->endpoint, rail, tp->v->wc_status_str(wc->status));
        } else {
            bool sends_only =
                sendinv && wc->status != IBV_WC_REM_ACCESS_ERR && (r->status == 0 || r->send_failure_only);
            r->rail_lost |= 1u << rail;
            if (r->status == 0 && wc->status == IBV_WC_REM_ACCESS_ERR)
                r->device_refused = true; /* settled by asking the source before it is reported */
            fail_locked(r, wc->status == IBV_WC_REM_ACCESS_ERR ? ORB_EPERM : ORB_EPEER,
                        "rdma: rail %u: the device completed a work request with \"%s\"", rail,
                        tp->v->wc_status_str(wc->status));
            r->send_failure_only = sends_only;
        }
    }
    if (!sendinv && --r->rail_left[rail] == 0 && r->status == 0) {
        post_end_of_rail = true;
        /* The rail's selection sample: its payload over the time from its first post to its
         * last completion (a failure on it anywhere offers none). */
        uint64_t now = orb_now_ns();
        if (now > r->first_post_ns[rail])
            (void)orb_selector_observe(tp->sel, rail, r->rail_bytes[rail], now - r->first_post_ns[rail]);
    }
    bool end = maybe_end(r, &e);
    pthread_mutex_unlock(&p->lock);
    if (end)
        report_pieces(tp, &e);
    else if (post_end_of_rail)
        post_sendinv(r, rail);
}

/* One grant's end from an ACK: its request completes (or fails with the source's status). */
static void on_ack(struct rdma_link *l, const struct orb_rdma_ack *a)
{
    struct rdma_peer *p = l->owner;
    struct rdma_ending e;
    bool end = false;
    pthread_mutex_lock(&p->lock);
    struct rdma_req *r = p->active;
    while (r != NULL && r->id != a->request)
        r = r->next;
    if (r != NULL && r->grant.grant == a->grant && !r->acked) {
        r->acked = true;
        if (a->status != 0) {
            fail_locked(r, a->status, "rdma: the source ended the grant with %s", orb_strerror(a->status));
        } else if (r->send_failure_only) {
            /* Only rail-ending SENDs failed here, and the source had every binding: they arrived,
             * and with them proof that every payload WR completed. */
            ORB_LOGD("rdma: %s: request %llu: the source ended its grant well after a rail's end failed here (%s): "
                     "the request stands",
                     p->endpoint, (unsigned long long)r->id, r->why);
            r->status = 0;
            r->why[0] = '\0';
            r->send_failure_only = false;
        }
        end = maybe_end(r, &e);
    } else {
        ORB_LOGD("rdma: %s: an ACK for request %llu, which is not waiting for one", p->endpoint,
                 (unsigned long long)a->request);
    }
    pthread_mutex_unlock(&p->lock);
    if (end)
        report_pieces(l->tp, &e);
}

void rdma_req_on_recv(struct rdma_link *l, const struct ibv_wc *wc, const uint8_t *msg)
{
    struct rdma_peer *p = l->owner;
    struct orb_rdma_ack a[ORB_RDMA_ACKS_MAX];
    uint32_t n = 0;
    if (orb_rdma_acks_decode(msg, wc->byte_len, a, &n) != 0) {
        ORB_LOGW("rdma: %s sent a malformed ACK (%s): rail %u is failed", p->endpoint, orb_last_error(), l->rail);
        rdma_link_fail(l, ORB_EPROTO);
        return;
    }
    for (uint32_t i = 0; i < n; i++)
        on_ack(l, &a[i]);
}

static const char *qp_state_name(enum ibv_qp_state st)
{
    switch (st) {
    case IBV_QPS_RESET: return "reset";
    case IBV_QPS_INIT: return "init";
    case IBV_QPS_RTR: return "ready to receive";
    case IBV_QPS_RTS: return "ready to send";
    case IBV_QPS_SQD: return "draining";
    case IBV_QPS_SQE: return "send queue error";
    case IBV_QPS_ERR: return "error";
    default: return "unknown";
    }
}

/* For the warning about a request that timed out: each rail of `r` with payload outstanding and
 * its queue pair's state as the device tells it now -- one still ready to send, with no
 * completion for io_timeout_s, points at the device or the path; one in error, at a completion
 * this side never saw (tp->lock and p->lock held). */
static void describe_stuck_rails(const struct orb_rdma_tp *tp, const struct rdma_peer *p, const struct rdma_req *r,
                                 char *out, size_t cap)
{
    size_t at = 0;
    out[0] = '\0';
    for (uint32_t k = 0; k < p->nrails && at < cap; k++) {
        if (!(r->rail_mask & (1u << k)) || r->rail_left[k] == 0)
            continue;
        const struct rdma_link *l = r->priv[k] != NULL ? r->priv[k] : p->links[r->lane * p->nrails + k];
        if (l == NULL)
            continue;
        struct ibv_qp_attr a;
        struct ibv_qp_init_attr init;
        memset(&a, 0, sizeof a);
        int err = tp->v->query_qp(l->qp->qp, &a, IBV_QP_STATE, &init);
        int n = snprintf(out + at, cap - at, "; rail %u: %u payload work request(s) without a completion, queue pair %u %s", k,
                         r->rail_left[k], l->qp->qp->qp_num,
                         err != 0 ? "(state not readable)" : qp_state_name(a.qp_state));
        if (n < 0)
            break;
        at += (size_t)n;
    }
}

void rdma_req_scan(struct orb_rdma_tp *tp, uint64_t now)
{
    pthread_mutex_lock(&tp->lock);
    for (struct rdma_peer *p = tp->peers; p != NULL; p = p->all_next) {
        struct rdma_ending e[8];
        uint32_t ne = 0;
        uint32_t fail_mask = 0, fault_mask = 0;
        struct rdma_link *priv_fail[ORB_RDMA_MAX_RAILS * 8];
        uint32_t npriv = 0;
        pthread_mutex_lock(&p->lock);
        /* At most 8 endings and 8 requests' own queue pairs a scan: the rest come next time
         * (they are not marked expired before they are handled). */
        for (struct rdma_req *r = p->active, *next; r != NULL && ne < 8 && npriv <= ORB_RDMA_MAX_RAILS * 7;
             r = next) {
            next = r->next;
            if (r->ended || r->expired || now < r->deadline)
                continue;
            r->expired = true; /* once: it may outlive its deadline, waiting for its WRs */
            char stuck[256];
            describe_stuck_rails(tp, p, r, stuck, sizeof stuck);
            ORB_LOGW("rdma: %s: request %llu got no ACK within io_timeout_s: it fails (%u work requests "
                     "outstanding, %u rail ends to send, ACK %s, rails 0x%x%s)",
                     p->endpoint, (unsigned long long)r->id, r->outstanding, r->sends_left,
                     r->acked ? "in" : "missing", r->rail_mask, stuck);
            fail_locked(r, ORB_ETIMEDOUT, "rdma: no ACK from the source within io_timeout_s");
            if (r->private_grant) {
                /* Its own queue pairs only (lane 0 frees them, after this scan, which it runs). */
                for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++)
                    if (r->priv[k] != NULL)
                        priv_fail[npriv++] = r->priv[k];
                if (maybe_end(r, &e[ne]))
                    ne++;
                continue;
            }
            fail_mask |= r->rail_mask << (r->lane * p->nrails); /* its queue pairs */
            /* Rails with work still outstanding failed on the path; an ACK alone missing is the
             * source's silence, not a rail's. */
            for (uint32_t k = 0; k < p->nrails; k++)
                if ((r->rail_mask & (1u << k)) && r->rail_left[k] > 0) {
                    r->rail_failed |= 1u << k;
                    fault_mask |= 1u << (r->lane * p->nrails + k);
                }
            if (maybe_end(r, &e[ne]))
                ne++;
        }
        /* Its links as they are now: a reconnect may replace them once p->lock is let go, and
         * frees the old ones only through tp->lock, held here. */
        struct rdma_link *fail_links[ORB_RDMA_MAX_RAILS] = {NULL};
        for (uint32_t q = 0; q < ORB_RDMA_MAX_RAILS && fail_mask != 0; q++) /* (a building peer has none) */
            fail_links[q] = p->links[q];
        pthread_mutex_unlock(&p->lock);
        for (uint32_t i = 0; i < npriv; i++)
            rdma_link_fault(priv_fail[i], ORB_ETIMEDOUT);
        /* Outstanding work of a timed-out request flushes once its rails are failed. */
        for (uint32_t q = 0; q < ORB_RDMA_MAX_RAILS; q++)
            if ((fail_mask & (1u << q)) && fail_links[q] != NULL) {
                if (fault_mask & (1u << q))
                    rdma_link_fault(fail_links[q], ORB_ETIMEDOUT);
                else
                    rdma_link_fail(fail_links[q], ORB_ETIMEDOUT);
            }
        for (uint32_t i = 0; i < ne; i++)
            report_pieces(tp, &e[i]);
    }
    pthread_mutex_unlock(&tp->lock);
}

void rdma_req_fail_all(struct orb_rdma_tp *tp, int status)
{
    pthread_mutex_lock(&tp->lock);
    for (struct rdma_peer *p = tp->peers; p != NULL; p = p->all_next) {
        for (;;) {
            struct rdma_ending e;
            pthread_mutex_lock(&p->lock);
            struct rdma_req *r = p->active;
            if (r == NULL) {
                pthread_mutex_unlock(&p->lock);
                break;
            }
            fail_locked(r, status, "rdma: the transport stopped (%s)", orb_strerror(status));
            end_locked(r, r->status, &e);
            pthread_mutex_unlock(&p->lock);
            report_pieces(tp, &e);
        }
    }
    pthread_mutex_unlock(&tp->lock);
}
