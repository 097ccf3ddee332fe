/* The NVLink transport's source: HELLO, QUERY, and groups held from BEGIN to END or to the end
 * of their lease. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/thread_name.h"
#include "cuda/cuda_kind.h"
#include "cuda/cuda_memory.h"
#include "nvlink/nvlink_internal.h"

struct nvl_group {
    struct nvl_group *next;
    struct orb_epoch sender;
    uint64_t id;
    uint64_t expires;
    uint32_t n;
    struct orb_reg *pins[ORB_NVL_GROUP_MAX];
    void *loans[ORB_NVL_GROUP_MAX];
    uint8_t ops[ORB_NVL_GROUP_MAX];       /* each held range's operation and length: counted */
    uint64_t lengths[ORB_NVL_GROUP_MAX];  /* as served when the requester ends the group */
    /* The allocations of its BEGIN_OK in their order (each held by a pin above), and the token
     * that fetches the descriptor of one shared by descriptor (has_token: one is). */
    orb_cuda_memory *owners[ORB_NVL_GROUP_MAX];
    uint32_t nowners;
    bool has_token;
    uint8_t token[ORB_NVL_TOKEN_LEN];
};

static void group_free(struct nvl_group *g)
{
    for (uint32_t i = 0; i < g->n; i++) {
        orb_reg_loan_end(g->pins[i], g->loans[i]);
        orb_registry_release(g->pins[i]);
    }
    free(g);
}

/* The group (sender, id), unlinked, or NULL (tp->lock held). */
static struct nvl_group *group_take_locked(struct nvl_tp *tp, const struct orb_epoch *sender, uint64_t id)
{
    for (struct nvl_group **pp = &tp->groups; *pp != NULL; pp = &(*pp)->next) {
        struct nvl_group *g = *pp;
        if (g->id == id && memcmp(g->sender.bytes, sender->bytes, sizeof sender->bytes) == 0) {
            *pp = g->next;
            tp->ngroups--;
            pthread_cond_broadcast(&tp->changed);
            return g;
        }
    }
    return NULL;
}

static void *lease_main(void *arg)
{
    struct nvl_tp *tp = arg;
    orb_thread_name("nvl-lease");
    pthread_mutex_lock(&tp->lock);
    while (!tp->lease_quit) { /* leases keep ending while the engine stops, until it is destroyed */
        uint64_t now = orb_now_ns(), next = ORB_DEADLINE_NONE;
        uint32_t expired = 0;
        for (struct nvl_group **pp = &tp->groups; *pp != NULL;) {
            struct nvl_group *g = *pp;
            if (g->expires <= now) {
                *pp = g->next;
                tp->ngroups--;
                expired++;
                group_free(g);
                pthread_cond_broadcast(&tp->changed);
                continue;
            }
            if (g->expires < next)
                next = g->expires;
            pp = &g->next;
        }
        if (expired > 0) /* once per sweep: a requester that never ends its groups cannot flood the log */
            ORB_LOGW("nvlink source: %u groups of requests were not ended within their lease of %llu ms: their "
                     "ranges are let go, and their requesters' ends will be refused", expired,
                     (unsigned long long)(tp->lease_ns / 1000000));
        nvl_wait_locked(tp, next);
    }
    pthread_mutex_unlock(&tp->lock);
    return NULL;
}

int nvl_source_start(struct nvl_tp *tp)
{
    if (pthread_create(&tp->lease_thread, NULL, lease_main, tp) != 0)
        return orb_fail(ORB_ENOMEM, "nvlink: cannot start the source's lease thread");
    tp->lease_thread_started = true;
    return 0;
}

int nvl_source_stop(struct nvl_tp *tp, uint64_t deadline)
{
    pthread_mutex_lock(&tp->lock);
    /* Requesters end their groups after their copies; until they do (or the leases run out) the
     * ranges may still be copied. */
    while (tp->ngroups > 0 && orb_now_ns() < deadline)
        nvl_wait_locked(tp, deadline);
    uint32_t held = tp->ngroups;
    pthread_mutex_unlock(&tp->lock);
    if (held > 0)
        return orb_fail(ORB_EUNQUIESCED, "nvlink: %u groups of requests are still held by their requesters", held);
    return 0;
}

uint64_t nvl_source_groups(struct nvl_tp *tp)
{
    pthread_mutex_lock(&tp->lock);
    uint64_t n = tp->ngroups;
    pthread_mutex_unlock(&tp->lock);
    return n;
}

/* Whether range `r` may travel by IPC, and when `hold`, its pin, loan and producer wait.
 * 0 with *pin_out (and *loan_out when holding), or the refusal with the detail message. */
static int authorise(struct nvl_tp *tp, const struct orb_nvl_range *r, bool hold, struct orb_reg **pin_out,
                     void **loan_out)
{
    struct orb_reg *pin = NULL;
    int rc = orb_registry_acquire(orb_engine_registry(tp->engine), r->addr, r->length,
                                  r->op == ORB_OP_READ ? ORB_PERM_REMOTE_READ : ORB_PERM_REMOTE_WRITE, &pin);
    if (rc != 0)
        return rc;
    if (pin->kind != &orb_memkind_cuda) {
        rc = orb_fail(ORB_EUNAVAILABLE, "nvlink: [0x%llx, +%llu) is %s memory: only device memory is shared by IPC",
                      (unsigned long long)r->addr, (unsigned long long)r->length, pin->kind->name);
        goto release_pin;
    }
    uint64_t base = pin->kind->owner_base(pin->owner);
    uint64_t size = pin->kind->owner_size(pin->owner);
    /* An import maps the whole allocation, writable: only what the owner opened to remote writes
     * as a whole may be mapped. */
    if (pin->perm != ORB_PERM_REMOTE_WRITE || pin->base != base || pin->len != size) {
        rc = orb_fail(ORB_EPERM, "nvlink: sharing [0x%llx, +%llu) would map its whole allocation [0x%llx, +%llu) "
                      "writable into the peer: only allocations registered whole with remote write permission "
                      "are shared", (unsigned long long)r->addr, (unsigned long long)r->length,
                      (unsigned long long)base, (unsigned long long)size);
        goto release_pin;
    }
    if (hold) {
        if ((rc = orb_reg_ready(pin)) != 0) /* a producer's recorded work ends first */
            goto release_pin;
        if ((rc = orb_reg_loan(pin, r->addr, r->length, r->op == ORB_OP_WRITE, loan_out)) != 0)
            goto release_pin;
    }
    *pin_out = pin;
    return 0;

release_pin:
    orb_registry_release(pin);
    return rc;
}

static int answer_hello(struct nvl_tp *tp, const uint8_t *req, size_t len, uint8_t *resp, size_t cap,
                        size_t *resp_len)
{
    struct orb_nvl_hello peer;
    int rc = orb_nvl_hello_decode(ORB_NVL_HELLO, req, len, &peer);
    return rc != 0 ? rc : orb_nvl_hello_encode(ORB_NVL_HELLO_OK, &tp->self, resp, cap, resp_len);
}

/* How allocation `owner` travels to the requester (al->share), and for a held group its handle:
 * the legacy IPC handle, or a descriptor's (the channel open, the group's token made). 0, or
 * the refusal with the detail message. */
static int share(struct nvl_tp *tp, struct nvl_group *g, orb_cuda_memory *owner, bool hold, struct orb_nvl_alloc *al)
{
    enum orb_cuda_share kind = 0;
    int rc = orb_cuda_memory_share_kind(owner, &kind);
    if (rc != 0)
        return rc;
    al->share = kind == ORB_CUDA_SHARE_FD ? ORB_NVL_SHARE_FD : ORB_NVL_SHARE_LEGACY;
    if (!hold)
        return 0;
    if (kind == ORB_CUDA_SHARE_LEGACY)
        return orb_cuda_memory_ipc_handle(owner, al->handle);
    if ((rc = nvl_fdchan_open(tp)) != 0)
        return rc;
    if (!g->has_token) {
        if ((rc = orb_random_bytes(g->token, sizeof g->token)) != 0)
            return rc;
        g->has_token = true;
    }
    struct orb_nvl_fd_handle h;
    memcpy(h.channel, tp->chan_id, sizeof h.channel);
    h.serial = orb_cuda_memory_serial(owner);
    memcpy(h.token, g->token, sizeof h.token);
    orb_nvl_fd_handle_pack(&h, al->handle);
    return 0;
}

int nvl_source_fetch(struct nvl_tp *tp, const struct orb_nvl_fetch *f, int *fd_out, uint64_t *size_out)
{
    pthread_mutex_lock(&tp->lock);
    struct nvl_group *found = NULL;
    for (struct nvl_group *g = tp->groups; g != NULL; g = g->next) {
        uint8_t diff = 0; /* every byte compared, whatever the first difference */
        for (uint32_t i = 0; i < ORB_NVL_TOKEN_LEN; i++)
            diff |= (uint8_t)(g->token[i] ^ f->token[i]);
        if (g->has_token && diff == 0)
            found = g;
    }
    int rc;
    if (found == NULL)
        rc = orb_fail(ORB_ENOENT, "nvlink: no group held here has that token (its lease ran out, or it ended)");
    else if (f->alloc >= found->nowners)
        rc = orb_fail(ORB_EINVAL, "nvlink: the group has %u allocations, not %u", found->nowners, f->alloc + 1);
    else {
        /* The group's pin holds the owner while the lock keeps the group. */
        orb_cuda_memory *owner = found->owners[f->alloc];
        if ((rc = orb_cuda_memory_export_fd(owner, fd_out)) == 0)
            *size_out = orb_cuda_memory_size(owner);
    }
    pthread_mutex_unlock(&tp->lock);
    return rc;
}

/* BEGIN (hold) or QUERY. */
static int answer_begin(struct nvl_tp *tp, const struct orb_epoch *sender, uint8_t kind, const uint8_t *req,
                        size_t len, uint8_t *resp, size_t cap, size_t *resp_len)
{
    bool hold = kind == ORB_NVL_BEGIN;
    struct orb_nvl_begin in;
    int rc = orb_nvl_begin_decode(kind, req, len, &in);
    if (rc != 0)
        return rc;
    struct nvl_group *g = calloc(1, sizeof *g);
    struct orb_nvl_begin_ok *out = calloc(1, sizeof *out);
    if (g == NULL || out == NULL) {
        rc = orb_fail(ORB_ENOMEM, "nvlink: out of memory for a group");
        goto free_group;
    }
    if (hold) {
        pthread_mutex_lock(&tp->lock);
        bool exists = false;
        uint32_t theirs = 0;
        for (struct nvl_group *h = tp->groups; h != NULL && !exists; h = h->next) {
            bool same = memcmp(h->sender.bytes, sender->bytes, sizeof sender->bytes) == 0;
            exists = same && h->id == in.group;
            theirs += same;
        }
        uint32_t held = tp->ngroups;
        pthread_mutex_unlock(&tp->lock);
        if (exists) {
            rc = orb_fail(ORB_EPROTO, "nvlink: group %llu is held already", (unsigned long long)in.group);
            goto free_group;
        }
        if (theirs >= NVL_GROUPS_PER_SENDER) {
            rc = orb_fail(ORB_ERESOURCE, "nvlink: this requester holds %u groups of requests here, the most one may",
                          NVL_GROUPS_PER_SENDER);
            goto free_group;
        }
        if (held >= NVL_GROUPS_MAX) {
            rc = orb_fail(ORB_ERESOURCE, "nvlink: %u groups of requests are held here, the most at once",
                          NVL_GROUPS_MAX);
            goto free_group;
        }
    }
    out->group = in.group;
    out->count = in.count;
    orb_cuda_memory *owners[ORB_NVL_GROUP_MAX];
    /* A tenant the policy does not give NVLink shares nothing by it, as source either. */
    int denied = nvl_policy_check(tp);
    for (uint32_t i = 0; i < in.count; i++) {
        struct orb_nvl_grant *gr = &out->grants[i];
        struct orb_reg *pin = NULL;
        void *loan = NULL;
        int st = denied != 0 ? orb_fail(denied, "%s", tp->policy_why) : authorise(tp, &in.ranges[i], hold, &pin, &loan);
        uint32_t a = 0;
        if (st == 0) {
            while (a < out->nallocs && owners[a] != pin->owner)
                a++;
            if (a == out->nallocs) {
                struct orb_nvl_alloc *al = &out->allocs[a];
                al->base = pin->kind->owner_base(pin->owner);
                al->size = pin->kind->owner_size(pin->owner);
                st = share(tp, g, pin->owner, hold, al);
                if (st == 0)
                    owners[out->nallocs++] = pin->owner;
            }
        }
        if (st != 0 && pin != NULL) {
            orb_reg_loan_end(pin, loan);
            orb_registry_release(pin);
            pin = NULL;
        }
        gr->status = st;
        gr->alloc = st == 0 ? (uint16_t)a : 0;
        if (st != 0)
            snprintf(gr->why, sizeof gr->why, "%s", orb_last_error());
        if (st != 0 && hold)
            orb_engine_count_served(tp->engine, ORB_TRANSPORT_NVLINK, in.ranges[i].op == ORB_OP_READ ? 0 : 1, 0, 0, st);
        if (pin != NULL && hold) {
            g->pins[g->n] = pin;
            g->loans[g->n] = loan;
            g->ops[g->n] = in.ranges[i].op == ORB_OP_READ ? ORB_OP_READ : ORB_OP_WRITE;
            g->lengths[g->n] = in.ranges[i].length;
            g->n++;
        } else if (pin != NULL)
            orb_registry_release(pin);
    }
    kind = hold ? ORB_NVL_BEGIN_OK : ORB_NVL_QUERY_OK;
    if ((rc = orb_nvl_begin_ok_encode(kind, out, resp, cap, resp_len)) != 0)
        goto free_group;
    uint32_t out_nallocs = out->nallocs;
    free(out);
    if (g->n == 0) { /* nothing held: nothing to end */
        free(g);
        return 0;
    }
    memcpy(g->owners, owners, out_nallocs * sizeof owners[0]);
    g->nowners = out_nallocs;
    g->sender = *sender;
    g->id = in.group;
    g->expires = orb_deadline_after(tp->lease_ns);
    pthread_mutex_lock(&tp->lock);
    g->next = tp->groups;
    tp->groups = g;
    tp->ngroups++;
    pthread_cond_broadcast(&tp->changed);
    pthread_mutex_unlock(&tp->lock);
    return 0;

free_group:
    if (g != NULL)
        group_free(g);
    free(out);
    return rc;
}

static int answer_end(struct nvl_tp *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len,
                      uint8_t *resp, size_t cap, size_t *resp_len)
{
    uint64_t id = 0;
    int rc = orb_nvl_end_decode(ORB_NVL_END, req, len, &id);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&tp->lock);
    struct nvl_group *g = group_take_locked(tp, sender, id);
    pthread_mutex_unlock(&tp->lock);
    if (g == NULL)
        return orb_fail(ORB_ETIMEDOUT, "nvlink: group %llu is not held here: its lease of %llu ms ran out (or it "
                        "was never begun)", (unsigned long long)id, (unsigned long long)(tp->lease_ns / 1000000));
    for (uint32_t i = 0; i < g->n; i++) /* the requester copied them while the group was held */
        orb_engine_count_served(tp->engine, ORB_TRANSPORT_NVLINK, g->ops[i], g->lengths[i], 1, 0);
    group_free(g);
    return orb_nvl_end_encode(ORB_NVL_END_OK, id, resp, cap, resp_len);
}

int nvl_source_control(void *tp_, const struct orb_epoch *sender, const uint8_t *req, size_t len, uint8_t *resp,
                       size_t cap, size_t *resp_len)
{
    struct nvl_tp *tp = tp_;
    uint8_t kind = 0;
    int rc = orb_nvl_kind_of(req, len, &kind);
    if (rc != 0)
        return rc;
    switch (kind) {
    case ORB_NVL_HELLO:
        return answer_hello(tp, req, len, resp, cap, resp_len);
    case ORB_NVL_BEGIN:
    case ORB_NVL_QUERY:
        return answer_begin(tp, sender, kind, req, len, resp, cap, resp_len);
    case ORB_NVL_END:
        return answer_end(tp, sender, req, len, resp, cap, resp_len);
    default:
        return orb_fail(ORB_EPROTO, "nvlink: message kind %u is an answer, not a request", kind);
    }
}

void nvl_source_free(struct nvl_tp *tp)
{
    pthread_mutex_lock(&tp->lock);
    tp->lease_quit = true;
    pthread_cond_broadcast(&tp->changed);
    pthread_mutex_unlock(&tp->lock);
    if (tp->lease_thread_started)
        pthread_join(tp->lease_thread, NULL);
    tp->lease_thread_started = false;
    while (tp->groups != NULL) {
        struct nvl_group *g = tp->groups;
        tp->groups = g->next;
        group_free(g);
    }
    tp->ngroups = 0;
}
