/* One-use memory windows and their key history (see window.h). */
#include "rdma/window.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

#include "core/error.h"
#include "core/log.h"

/* Through the loaded verbs table (`impl`, a const struct orb_verbs *). */
static struct ibv_mw *verbs_alloc_mw(void *impl, struct ibv_pd *pd)
{
    const struct orb_verbs *v = impl;
    return v->alloc_mw(pd, IBV_MW_TYPE_2);
}

static int verbs_dealloc_mw(void *impl, struct ibv_mw *mw)
{
    const struct orb_verbs *v = impl;
    return v->dealloc_mw(mw);
}

const struct orb_rdma_mw_ops orb_rdma_verbs_mw_ops = {
    .alloc_mw = verbs_alloc_mw,
    .dealloc_mw = verbs_dealloc_mw,
};

void orb_rdma_window_pool_init(struct orb_rdma_window_pool *p, const struct orb_rdma_mw_ops *ops, void *impl,
                               struct ibv_pd *pd, uint32_t max_indices)
{
    memset(p, 0, sizeof *p);
    p->ops = ops;
    p->impl = impl;
    p->pd = pd;
    p->max_indices = max_indices;
}

/* ---- key history ------------------------------------------------------------------------------ */

#define HIST_EMPTY UINT32_MAX /* no index is 2^32 - 1 (indices have 24 bits) */

static uint32_t hash_index(uint32_t index)
{
    return index * 2654435761u;
}

static struct orb_rdma_key_history *hist_find(const struct orb_rdma_window_pool *p, uint32_t index)
{
    if (p->hist_cap == 0)
        return NULL;
    for (uint32_t i = hash_index(index) & (p->hist_cap - 1);; i = (i + 1) & (p->hist_cap - 1)) {
        struct orb_rdma_key_history *h = &p->hist[i];
        if (h->index == index)
            return h;
        if (h->index == HIST_EMPTY)
            return NULL;
    }
}

static int hist_grow(struct orb_rdma_window_pool *p)
{
    uint32_t cap = p->hist_cap == 0 ? 64 : p->hist_cap * 2;
    struct orb_rdma_key_history *t = malloc((size_t)cap * sizeof *t);
    if (t == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for the window key history");
    for (uint32_t i = 0; i < cap; i++)
        t[i].index = HIST_EMPTY;
    for (uint32_t i = 0; i < p->hist_cap; i++) {
        const struct orb_rdma_key_history *h = &p->hist[i];
        if (h->index == HIST_EMPTY)
            continue;
        uint32_t j = hash_index(h->index) & (cap - 1);
        while (t[j].index != HIST_EMPTY)
            j = (j + 1) & (cap - 1);
        t[j] = *h;
    }
    free(p->hist);
    p->hist = t;
    p->hist_cap = cap;
    return 0;
}

/* The history of `index`, added when new. NULL with ORB_ERESOURCE at max_indices. */
static struct orb_rdma_key_history *hist_get(struct orb_rdma_window_pool *p, uint32_t index)
{
    struct orb_rdma_key_history *h = hist_find(p, index);
    if (h != NULL)
        return h;
    if (p->hist_count >= p->max_indices) {
        (void)orb_fail(ORB_ERESOURCE, "rdma: the memory-window key history holds %u indices already "
                       "(max_window_key_indices; %u windows parked)", p->hist_count, p->parked);
        return NULL;
    }
    if ((p->hist_count + 1) * 2 > p->hist_cap && hist_grow(p) != 0)
        return NULL;
    uint32_t i = hash_index(index) & (p->hist_cap - 1);
    while (p->hist[i].index != HIST_EMPTY)
        i = (i + 1) & (p->hist_cap - 1);
    h = &p->hist[i];
    memset(h, 0, sizeof *h);
    h->index = index;
    p->hist_count++;
    return h;
}

static bool key_used(const struct orb_rdma_key_history *h, uint32_t key)
{
    return (h->used[key >> 6] >> (key & 63)) & 1u;
}

static void mark_used(struct orb_rdma_key_history *h, uint32_t key)
{
    if (!key_used(h, key)) {
        h->used[key >> 6] |= UINT64_C(1) << (key & 63);
        h->used_count++;
    }
}

/* The next key byte after `from` that `h`'s index never carried and that does not make the whole
 * rkey 0, or -1. */
static int next_free_key(const struct orb_rdma_key_history *h, uint32_t from)
{
    for (uint32_t step = 1; step <= 256; step++) {
        uint32_t k = (from + step) & 0xffu;
        if (!key_used(h, k) && ((h->index << 8) | k) != 0)
            return (int)k;
    }
    return -1;
}

bool orb_rdma_key_history_used(const struct orb_rdma_window_pool *p, uint32_t key)
{
    if (key == 0)
        return true;
    const struct orb_rdma_key_history *h = hist_find(p, key >> 8);
    return h != NULL && key_used(h, key & 0xffu);
}

int orb_rdma_key_history_next(const struct orb_rdma_window_pool *p, uint32_t key, uint32_t from)
{
    const struct orb_rdma_key_history *h = hist_find(p, key >> 8);
    if (h == NULL) {
        uint32_t k = (from + 1) & 0xffu;
        return ((key >> 8) == 0 && k == 0) ? 1 : (int)k;
    }
    return next_free_key(h, from);
}

int orb_rdma_key_history_claim(struct orb_rdma_window_pool *p, uint32_t key)
{
    if (orb_rdma_key_history_used(p, key))
        return orb_fail(ORB_EINVAL, "rdma: key 0x%08x was handed out on this PD before", key);
    bool known = hist_find(p, key >> 8) != NULL;
    struct orb_rdma_key_history *h = hist_get(p, key >> 8);
    if (h == NULL) /* hist_get named the cause */
        return !known && p->hist_count >= p->max_indices ? ORB_ERESOURCE : ORB_ENOMEM;
    mark_used(h, key & 0xffu);
    return 0;
}

uint32_t orb_rdma_window_keys_left(const struct orb_rdma_window_pool *p, const struct orb_rdma_window *w)
{
    const struct orb_rdma_key_history *h = hist_find(p, w->rkey >> 8);
    if (h == NULL)
        return 0;
    uint32_t left = 256 - h->used_count;
    if (h->index == 0 && !key_used(h, 0))
        left--; /* rkey 0 is never handed out */
    return left;
}

/* ---- windows ------------------------------------------------------------------------------------ */

static uint32_t free_list(struct orb_rdma_window_pool *p, struct orb_rdma_window **head)
{
    uint32_t kept = 0;
    struct orb_rdma_window *keep = NULL;
    while (*head != NULL) {
        struct orb_rdma_window *w = *head;
        *head = w->next;
        int err = p->ops->dealloc_mw(p->impl, w->mw);
        if (err != 0) {
            ORB_LOGE("rdma: a memory window could not be freed (%s): it is kept", strerror(err));
            w->next = keep;
            keep = w;
            kept++;
            continue;
        }
        p->allocated--;
        free(w);
    }
    *head = keep;
    return kept;
}

uint32_t orb_rdma_window_pool_fini(struct orb_rdma_window_pool *p)
{
    if (p == NULL || p->ops == NULL)
        return 0;
    uint32_t kept = free_list(p, &p->free_list);
    uint32_t kept_parked = free_list(p, &p->parked_list);
    p->parked = kept_parked;
    if (kept + kept_parked == 0) {
        free(p->hist);
        p->hist = NULL;
        p->hist_cap = p->hist_count = 0;
    }
    return kept + kept_parked;
}

static void park(struct orb_rdma_window_pool *p, struct orb_rdma_window *w)
{
    w->next = p->parked_list;
    p->parked_list = w;
    p->parked++;
}

/* A window the device just allocated: its index's history takes the allocation's key. 0, or
 * parked/freed with the status. */
static int adopt(struct orb_rdma_window_pool *p, struct orb_rdma_window *w)
{
    struct orb_rdma_key_history *h = hist_get(p, w->rkey >> 8);
    if (h == NULL)
        return ORB_ERESOURCE;
    mark_used(h, w->rkey & 0xffu);
    if (next_free_key(h, w->rkey & 0xffu) < 0)
        return ORB_EAGAIN; /* a spent index handed out again */
    return 0;
}

int orb_rdma_window_take(struct orb_rdma_window_pool *p, struct orb_rdma_window **out)
{
    if (p->free_list != NULL) {
        struct orb_rdma_window *w = p->free_list;
        p->free_list = w->next;
        w->next = NULL;
        p->in_use++;
        *out = w;
        return 0;
    }
    /* A device may hand out a spent index again: such a window is parked (held, so it cannot
     * come back), and another one is asked for. */
    for (int attempt = 0; attempt < 8; attempt++) {
        struct orb_rdma_window *w = calloc(1, sizeof *w);
        if (w == NULL)
            return orb_fail(ORB_ENOMEM, "rdma: out of memory for a memory window");
        errno = 0;
        w->mw = p->ops->alloc_mw(p->impl, p->pd);
        if (w->mw == NULL) {
            int err = errno != 0 ? errno : EIO;
            free(w);
            return orb_fail(err == ENOMEM ? ORB_ERESOURCE : ORB_EUNAVAILABLE,
                            "rdma: cannot allocate a type-2 memory window: %s", strerror(err));
        }
        w->rkey = w->mw->rkey;
        p->allocated++;
        int rc = adopt(p, w);
        if (rc == 0) {
            p->in_use++;
            *out = w;
            return 0;
        }
        if (rc == ORB_EAGAIN) {
            park(p, w);
            continue;
        }
        /* The history is full: this index cannot be tracked, so it is not used. */
        char why[256];
        snprintf(why, sizeof why, "%s", orb_last_error());
        if (p->ops->dealloc_mw(p->impl, w->mw) == 0) {
            p->allocated--;
            free(w);
        } else {
            park(p, w);
        }
        /* Windows in use come back when their grants end, and a returned one with keys left
         * serves again: "not now" then, and "never" only when none is out. */
        if (p->in_use > 0)
            return orb_fail(ORB_EAGAIN, "%s; %u window(s) in use will come back", why, p->in_use);
        return orb_fail(rc, "%s", why);
    }
    return orb_fail(ORB_ERESOURCE, "rdma: the device keeps handing out memory windows whose keys are spent");
}

int orb_rdma_window_bind_wr(struct orb_rdma_window_pool *p, struct orb_rdma_window *w, struct ibv_mr *parent,
                            uint64_t addr, uint64_t len, int op, uint64_t wr_id, struct ibv_send_wr *wr,
                            uint32_t *key_out)
{
    if (p == NULL || w == NULL || parent == NULL || wr == NULL || key_out == NULL || len == 0)
        return orb_fail(ORB_EINVAL, "rdma: window bind: NULL argument or empty range");
    if (op != ORB_OP_READ && op != ORB_OP_WRITE)
        return orb_fail(ORB_EINVAL, "rdma: window bind: unknown operation %d", op);
    uint64_t base = (uint64_t)(uintptr_t)parent->addr;
    if (addr < base || addr - base > parent->length || len > parent->length - (addr - base))
        return orb_fail(ORB_EINVAL, "rdma: window bind: [0x%llx, +%llu) is not inside its parent MR",
                        (unsigned long long)addr, (unsigned long long)len);
    struct orb_rdma_key_history *h = hist_find(p, w->rkey >> 8);
    int k = h != NULL ? next_free_key(h, w->rkey & 0xffu) : -1;
    if (w->bound || k < 0)
        return orb_fail(ORB_EINVAL, "rdma: window bind: the window is bound or its keys are spent");
    mark_used(h, (uint32_t)k);
    uint32_t key = (w->rkey & 0xffffff00u) | (uint32_t)k;
    memset(wr, 0, sizeof *wr);
    wr->wr_id = wr_id;
    wr->opcode = IBV_WR_BIND_MW;
    wr->send_flags = IBV_SEND_SIGNALED;
    wr->bind_mw.mw = w->mw;
    wr->bind_mw.rkey = key;
    wr->bind_mw.bind_info.mr = parent;
    wr->bind_mw.bind_info.addr = addr;
    wr->bind_mw.bind_info.length = len;
    wr->bind_mw.bind_info.mw_access_flags =
        op == ORB_OP_READ ? (unsigned)IBV_ACCESS_REMOTE_READ : (unsigned)IBV_ACCESS_REMOTE_WRITE;
    w->binds++;
    w->rkey = key;
    *key_out = key;
    return 0;
}

void orb_rdma_window_bound(struct orb_rdma_window *w, uint32_t key)
{
    w->bound = true;
    w->rkey = key;
    w->mw->rkey = key; /* soft-RoCE compares it on the next bind */
}

bool orb_rdma_wc_invalidates(const struct ibv_wc *wc, uint32_t rkey)
{
    if (wc == NULL || wc->status != IBV_WC_SUCCESS || wc->opcode != IBV_WC_RECV || rkey == 0)
        return false;
    if (wc->invalidated_rkey != rkey)
        return false;
    if (wc->wc_flags & IBV_WC_WITH_INV)
        return true;
    /* Soft-RoCE reports the invalidation without the flag; immediate data shares the field. */
    return (wc->wc_flags & IBV_WC_WITH_IMM) == 0;
}

void orb_rdma_window_put(struct orb_rdma_window_pool *p, struct orb_rdma_window *w)
{
    w->bound = false;
    p->in_use--;
    if (orb_rdma_window_keys_left(p, w) == 0) {
        park(p, w);
        return;
    }
    w->next = p->free_list;
    p->free_list = w;
}

void orb_rdma_window_discard(struct orb_rdma_window_pool *p, struct orb_rdma_window *w)
{
    p->in_use--;
    int err = p->ops->dealloc_mw(p->impl, w->mw);
    if (err != 0) {
        ORB_LOGE("rdma: a memory window of unknown state could not be freed (%s): it is kept", strerror(err));
        park(p, w);
        return;
    }
    p->allocated--;
    free(w);
}
