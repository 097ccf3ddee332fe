/* The NVLink transport's requester: one thread per peer runs its groups (BEGIN, copies, END) and
 * keeps its imports of the peer's allocations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/range_memo.h"
#include "core/thread_name.h"
#include "cuda/cuda_kind.h"
#include "cuda/cuda_memory.h"
#include "nvlink/nvlink_internal.h"

#define WHY_LEN 320

enum hello_state { HELLO_UNKNOWN = 0, HELLO_SAME_PROCESS, HELLO_SAME_HOST, HELLO_ELSEWHERE, HELLO_FAILED,
                   HELLO_DENIED /* this tenant may not use the transport (nvl_policy_check) */ };

/* One of the peer's allocations mapped here, by the device it is mapped for. */
struct nvl_import {
    uint64_t base, size;           /* the peer's extent */
    uint8_t share;                 /* enum orb_nvl_share: how it was mapped */
    uint8_t handle[ORB_NVL_HANDLE_LEN];
    int device;
    uint64_t ptr;                  /* its first byte here */
    uint64_t used;                 /* the group that last used it */
};

struct nvl_peer {
    struct nvl_peer *next;         /* tp->peers */
    struct nvl_tp *tp;
    struct orb_control_path ctl;
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch expected;     /* the segment's source epoch */
    pthread_mutex_t lock;          /* the queue, the states below */
    pthread_cond_t changed;
    struct orb_xfer *head, *tail;
    bool released, thread_started, finished;
    pthread_t thread;
    enum hello_state hello;
    uint64_t hello_retry;          /* when a failed HELLO may be tried again */
    char hello_why[WHY_LEN];
    struct orb_range_memo known;   /* QUERY answers: allocations' extents, refusals for a while */
    uint64_t query_pause;          /* until then, unknown ranges are not asked about (no answer came) */
    /* The peer's thread only: */
    struct nvl_import imports[NVL_IMPORTS_MAX];
    uint32_t nimports;
};

static void peer_free(struct nvl_peer *p)
{
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->changed);
    free(p);
}

/* Free the peers whose thread finished, or that never had one and were released (tp->lock
 * held). */
static void reap_peers_locked(struct nvl_tp *tp)
{
    for (struct nvl_peer **pp = &tp->peers; *pp != NULL;) {
        struct nvl_peer *p = *pp;
        pthread_mutex_lock(&p->lock);
        bool done = p->released && (p->thread_started ? p->finished : true);
        pthread_mutex_unlock(&p->lock);
        if (!done) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        if (p->thread_started)
            pthread_join(p->thread, NULL);
        peer_free(p);
    }
}

int nvl_peer_open(void *tp_, const char *endpoint, const struct orb_epoch *expected, uint64_t deadline,
                  const struct orb_control_path *ctl, void **peer_out)
{
    (void)deadline; /* nothing is asked until device memory needs it */
    struct nvl_tp *tp = tp_;
    if (ctl == NULL)
        return orb_fail(ORB_EINVAL, "nvlink: a peer needs the segment's control path");
    struct nvl_peer *p = calloc(1, sizeof *p);
    if (p == NULL)
        return orb_fail(ORB_ENOMEM, "nvlink: out of memory for a peer");
    p->tp = tp;
    p->ctl = *ctl;
    snprintf(p->endpoint, sizeof p->endpoint, "%s", endpoint);
    p->expected = *expected;
    pthread_mutex_init(&p->lock, NULL);
    if (orb_cond_init_monotonic(&p->changed) != 0) {
        pthread_mutex_destroy(&p->lock);
        free(p);
        return orb_fail(ORB_ENOMEM, "nvlink: cannot make a peer's condition variable");
    }
    pthread_mutex_lock(&tp->lock);
    if (atomic_load(&tp->stopping)) {
        pthread_mutex_unlock(&tp->lock);
        peer_free(p);
        return orb_fail(ORB_ECLOSED, "nvlink: the transport is stopping");
    }
    reap_peers_locked(tp);
    p->next = tp->peers;
    tp->peers = p;
    pthread_mutex_unlock(&tp->lock);
    *peer_out = p;
    return 0;
}

/* ---- where the peer runs ------------------------------------------------------------------- */

/* The peer's HELLO answer, asked once (again after NVL_HELLO_RETRY_NS when it failed). Returns
 * the state; *why says why it is not this host. */
static enum hello_state peer_hello(struct nvl_peer *p, uint64_t deadline, char *why, size_t why_len)
{
    pthread_mutex_lock(&p->lock);
    enum hello_state st = p->hello;
    if (st == HELLO_FAILED && orb_now_ns() >= p->hello_retry)
        st = HELLO_UNKNOWN;
    snprintf(why, why_len, "%s", p->hello_why);
    pthread_mutex_unlock(&p->lock);
    if (st != HELLO_UNKNOWN)
        return st;
    if (nvl_policy_check(p->tp) != 0) { /* for good: the policy is read once per engine */
        snprintf(why, why_len, "%s", orb_last_error());
        pthread_mutex_lock(&p->lock);
        p->hello = HELLO_DENIED;
        snprintf(p->hello_why, sizeof p->hello_why, "%s", why);
        pthread_mutex_unlock(&p->lock);
        return HELLO_DENIED;
    }

    uint8_t req[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
    size_t len = 0, resp_len = 0;
    struct orb_nvl_hello theirs;
    int rc = orb_nvl_hello_encode(ORB_NVL_HELLO, &p->tp->self, req, sizeof req, &len);
    if (rc == 0)
        rc = p->ctl.call(p->ctl.peer, ORB_TRANSPORT_NVLINK, req, len, resp, sizeof resp, &resp_len, deadline);
    if (rc == 0)
        rc = orb_nvl_hello_decode(ORB_NVL_HELLO_OK, resp, resp_len, &theirs);
    if (rc != 0) {
        st = HELLO_FAILED;
        snprintf(why, why_len, "its NVLink transport did not answer (%s: %.160s)", orb_strerror(rc),
                 orb_last_error());
    } else if (memcmp(theirs.boot, p->tp->self.boot, ORB_NVL_ID_LEN) != 0) {
        st = HELLO_ELSEWHERE;
        snprintf(why, why_len, "it runs on another host");
    } else if (theirs.ipc_namespace != p->tp->self.ipc_namespace) {
        st = HELLO_ELSEWHERE;
        snprintf(why, why_len, "it runs in another IPC namespace of this host");
    } else
        st = nvl_source_in_this_process(&p->expected, p->endpoint) ? HELLO_SAME_PROCESS : HELLO_SAME_HOST;
    pthread_mutex_lock(&p->lock);
    p->hello = st;
    p->hello_retry = orb_deadline_after(NVL_HELLO_RETRY_NS);
    snprintf(p->hello_why, sizeof p->hello_why, "%s", why);
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* ---- choosing this transport ---------------------------------------------------------------- */

static void remember(struct nvl_peer *p, uint64_t addr, uint64_t length, bool ok)
{
    pthread_mutex_lock(&p->lock);
    orb_range_memo_remember(&p->known, addr, length, ok, orb_deadline_after(NVL_REFUSAL_TTL_NS));
    pthread_mutex_unlock(&p->lock);
}

/* Forget what was remembered about ranges overlapping [addr, +length). */
static void forget(struct nvl_peer *p, uint64_t addr, uint64_t length)
{
    pthread_mutex_lock(&p->lock);
    orb_range_memo_forget(&p->known, addr, length);
    pthread_mutex_unlock(&p->lock);
}

int nvl_peer_accepts(void *peer, uint8_t op, const struct orb_reg *local, uint64_t remote_addr, uint64_t length,
                     uint64_t deadline)
{
    struct nvl_peer *p = peer;
    if (local == NULL || local->kind != &orb_memkind_cuda)
        return 0;
    uint64_t probe_deadline = orb_deadline_after(NVL_PROBE_NS);
    if (deadline > probe_deadline) /* a choice of transport never waits long */
        deadline = probe_deadline;
    char why[WHY_LEN];
    enum hello_state st = peer_hello(p, deadline, why, sizeof why);
    if (st != HELLO_SAME_HOST && st != HELLO_SAME_PROCESS)
        return 0;
    uint64_t now = orb_now_ns();
    pthread_mutex_lock(&p->lock);
    int verdict = orb_range_memo_lookup(&p->known, remote_addr, length, now);
    if (verdict < 0 && now < p->query_pause)
        verdict = 0;
    pthread_mutex_unlock(&p->lock);
    if (verdict >= 0)
        return verdict;

    struct orb_nvl_begin q = {.group = 1, .count = 1, .ranges = {{.op = op, .addr = remote_addr, .length = length}}};
    uint8_t req[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
    size_t len = 0, resp_len = 0;
    struct orb_nvl_begin_ok *a = malloc(sizeof *a);
    int rc = a == NULL ? ORB_ENOMEM : orb_nvl_begin_encode(ORB_NVL_QUERY, &q, req, sizeof req, &len);
    if (rc == 0)
        rc = p->ctl.call(p->ctl.peer, ORB_TRANSPORT_NVLINK, req, len, resp, sizeof resp, &resp_len, deadline);
    if (rc != 0 && rc != ORB_ENOMEM) {
        /* A peer that does not answer (or answers nonsense) is asked nothing more for a while:
         * choosing a transport must not wait on it request after request. */
        pthread_mutex_lock(&p->lock);
        p->query_pause = orb_deadline_after(NVL_HELLO_RETRY_NS);
        pthread_mutex_unlock(&p->lock);
    }
    if (rc == 0)
        rc = orb_nvl_begin_ok_decode(ORB_NVL_QUERY_OK, resp, resp_len, a);
    if (rc == 0 && (a->count != 1 || a->group != 1))
        rc = ORB_EPROTO;
    bool ok = rc == 0 && a->grants[0].status == 0;
    if (ok) {
        const struct orb_nvl_alloc *al = &a->allocs[a->grants[0].alloc];
        if (remote_addr >= al->base && length <= al->size && remote_addr - al->base <= al->size - length)
            remember(p, al->base, al->size, true);
        else
            ok = false;
    }
    if (!ok)
        remember(p, remote_addr, length, false);
    free(a);
    return ok ? 1 : 0;
}

/* ---- plans and submission ------------------------------------------------------------------ */

int nvl_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan)
{
    (void)peer;
    if (in->local_reg == NULL || in->local_reg->kind != &orb_memkind_cuda)
        return orb_fail(ORB_EINVAL, "nvlink moves device memory to device memory: the local range is %s memory "
                        "(use TCP, or let the engine choose)",
                        in->local_reg != NULL ? in->local_reg->kind->name : "no");
    return orb_plan_even(plan, in->length, 0); /* one copy per request */
}

static void *peer_main(void *arg);

int nvl_peer_submit(void *peer, struct orb_xfer *const *xfers, size_t n)
{
    struct nvl_peer *p = peer;
    struct nvl_tp *tp = p->tp;
    if (n == 0)
        return 0;
    if (atomic_load(&tp->stopping))
        return orb_fail(ORB_ECLOSED, "nvlink: the transport is stopping");
    /* Lock order: the transport's lock, then a peer's. */
    pthread_mutex_lock(&tp->lock);
    pthread_mutex_lock(&p->lock);
    if (!p->thread_started) {
        if (pthread_create(&p->thread, NULL, peer_main, p) != 0) {
            pthread_mutex_unlock(&p->lock);
            pthread_mutex_unlock(&tp->lock);
            return orb_fail(ORB_ENOMEM, "nvlink: cannot start a peer's thread");
        }
        p->thread_started = true;
        tp->live_threads++;
    }
    pthread_mutex_unlock(&tp->lock);
    for (size_t i = 0; i < n; i++) {
        struct orb_xfer *x = xfers[i];
        x->next = NULL;
        if (p->tail != NULL)
            p->tail->next = x;
        else
            p->head = x;
        p->tail = x;
    }
    atomic_fetch_add(&tp->inflight, n);
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

void nvl_peer_release(void *peer)
{
    struct nvl_peer *p = peer;
    pthread_mutex_lock(&p->lock);
    p->released = true;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
}

/* ---- groups -------------------------------------------------------------------------------- */

static void xfer_end(struct nvl_tp *tp, struct orb_xfer *x, int status, enum orb_remote_effect effect,
                     const char *why)
{
    orb_xfer_done_why(x, status, effect, why);
    atomic_fetch_sub(&tp->inflight, 1);
}

/* Unmap an import: 0, or the failure (logged; the mapping is kept for good). */
static int close_import(struct nvl_peer *p, struct nvl_import *im)
{
    int rc = im->share == ORB_NVL_SHARE_FD ? orb_cuda_vmm_unimport(im->device, im->ptr, im->size)
                                           : orb_cuda_ipc_unimport(im->device, im->ptr);
    if (rc != 0)
        ORB_LOGE("nvlink: peer %s's allocation [0x%llx, +%llu) could not be unmapped (%s): its mapping is kept",
                 p->endpoint, (unsigned long long)im->base, (unsigned long long)im->size, orb_last_error());
    return rc;
}

/* The peer's allocation `al` mapped for `device`, imported now if it is not yet (or was
 * replaced since). 0 with *ptr_out, or the failure with the detail message. An import closed on
 * the way (replaced, or the least recently used one) that the driver would not close sets
 * *close_rc: the group it was shared by cannot be counted complete. */
/* Whether import `im` is the allocation `al` names: its extent and how it is shared, and the
 * handle, of which a descriptor's token is not part (it changes with every group). */
static bool same_allocation(const struct nvl_import *im, const struct orb_nvl_alloc *al)
{
    size_t cmp = al->share == ORB_NVL_SHARE_FD ? ORB_NVL_HANDLE_LEN - ORB_NVL_TOKEN_LEN : ORB_NVL_HANDLE_LEN;
    return im->base == al->base && im->size == al->size && im->share == al->share &&
           memcmp(im->handle, al->handle, cmp) == 0;
}

/* Map allocation `al` (index `index` of its BEGIN_OK) for `device`: by its legacy handle, or by
 * the descriptor fetched from the source's channel until `deadline`. */
static int import_new(struct nvl_peer *p, const struct orb_nvl_alloc *al, uint32_t index, int device,
                      uint64_t deadline, uint64_t *ptr_out)
{
    if (al->share == ORB_NVL_SHARE_LEGACY) {
        size_t mapped = 0;
        int rc = orb_cuda_ipc_import(device, al->handle, ptr_out, &mapped);
        if (rc != 0)
            return rc;
        if (mapped < al->size) { /* a copy would run past the mapping into this process's memory */
            struct nvl_import im = {.device = device, .ptr = *ptr_out, .base = al->base, .size = al->size,
                                    .share = ORB_NVL_SHARE_LEGACY};
            (void)close_import(p, &im); /* never shared: its own request fails */
            return orb_fail(ORB_EPROTO, "nvlink: peer %s said its allocation at 0x%llx holds %llu bytes; its handle "
                            "maps %zu", p->endpoint, (unsigned long long)al->base, (unsigned long long)al->size,
                            mapped);
        }
        return 0;
    }
    struct orb_nvl_fd_handle h;
    int rc = orb_nvl_fd_handle_unpack(al->handle, &h);
    if (rc != 0)
        return rc;
    struct orb_nvl_fetch f = {.alloc = index};
    memcpy(f.token, h.token, sizeof f.token);
    int fd = -1;
    uint64_t size = 0;
    if ((rc = nvl_fdchan_fetch(h.channel, &f, deadline, &fd, &size)) != 0)
        return rc;
    if (size < al->size) /* the mapping would end before the extent the peer claims */
        rc = orb_fail(ORB_EPROTO, "nvlink: peer %s said its allocation at 0x%llx holds %llu bytes; its descriptor "
                      "holds %llu", p->endpoint, (unsigned long long)al->base, (unsigned long long)al->size,
                      (unsigned long long)size);
    else
        rc = orb_cuda_vmm_import(device, fd, al->size, ptr_out);
    (void)close(fd); /* the mapping keeps the allocation */
    return rc;
}

static int import_get(struct nvl_peer *p, const struct orb_nvl_alloc *al, uint32_t index, int device, uint64_t group,
                      uint64_t deadline, uint64_t *ptr_out, int *close_rc)
{
    struct nvl_import *slot = NULL;
    for (uint32_t i = 0; i < p->nimports; i++) {
        struct nvl_import *im = &p->imports[i];
        if (im->device != device || im->base >= al->base + al->size || al->base >= im->base + im->size)
            continue;
        if (same_allocation(im, al)) {
            im->used = group;
            *ptr_out = im->ptr;
            return 0;
        }
        /* The peer freed that allocation and made another where it was: the old mapping goes. */
        int rc = close_import(p, im);
        if (rc != 0 && *close_rc == 0)
            *close_rc = rc;
        *im = p->imports[--p->nimports];
        i--;
    }
    if (p->nimports < NVL_IMPORTS_MAX)
        slot = &p->imports[p->nimports];
    else {
        slot = &p->imports[0];
        for (uint32_t i = 1; i < p->nimports; i++)
            if (p->imports[i].used < slot->used)
                slot = &p->imports[i];
        int rc = close_import(p, slot);
        if (rc != 0 && *close_rc == 0)
            *close_rc = rc;
        *slot = p->imports[--p->nimports];
        slot = &p->imports[p->nimports];
    }
    uint64_t ptr = 0;
    int rc = import_new(p, al, index, device, deadline, &ptr);
    if (rc != 0)
        return orb_fail_wrap(rc, "nvlink: mapping peer %s's allocation [0x%llx, +%llu)", p->endpoint,
                             (unsigned long long)al->base, (unsigned long long)al->size);
    *slot = (struct nvl_import){.base = al->base, .size = al->size, .share = al->share, .device = device, .ptr = ptr,
                                .used = group};
    memcpy(slot->handle, al->handle, ORB_NVL_HANDLE_LEN);
    p->nimports++;
    *ptr_out = ptr;
    return 0;
}

/* The earliest deadline of the group, bounded by the engine's I/O timeout. */
static uint64_t group_deadline(struct nvl_tp *tp, struct orb_xfer *const *xs, uint32_t n)
{
    uint64_t d = orb_deadline_after(tp->lease_ns);
    for (uint32_t i = 0; i < n; i++)
        if (xs[i]->deadline_ns < d)
            d = xs[i]->deadline_ns;
    return d;
}

static void fail_all(struct nvl_tp *tp, struct orb_xfer *const *xs, uint32_t n, int status, const char *why)
{
    for (uint32_t i = 0; i < n; i++)
        xfer_end(tp, xs[i], status, ORB_REMOTE_EFFECT_NONE, why);
}

struct copy_result {
    int status;
    bool attempted;                /* a copy was submitted: a WRITE may have changed peer bytes */
    char why[WHY_LEN];
};

/* One group: BEGIN, the copies, END; every xfer reported. */
static void run_group(struct nvl_peer *p, struct orb_xfer **in, uint32_t n_in)
{
    struct nvl_tp *tp = p->tp;
    struct orb_xfer *xs[ORB_NVL_GROUP_MAX];
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_in; i++) {
        if (orb_xfer_may_start(in[i]))
            xs[n++] = in[i];
        else
            xfer_end(tp, in[i], ORB_ETIMEDOUT, ORB_REMOTE_EFFECT_NONE, "withdrawn before it started");
    }
    if (n == 0)
        return;
    uint64_t deadline = group_deadline(tp, xs, n);
    char why[WHY_LEN];
    enum hello_state st = peer_hello(p, deadline, why, sizeof why);
    if (st != HELLO_SAME_HOST && st != HELLO_SAME_PROCESS) {
        char text[WHY_LEN];
        snprintf(text, sizeof text, "nvlink: no IPC path to %.64s: %.200s", p->endpoint, why);
        fail_all(tp, xs, n, st == HELLO_FAILED ? ORB_EPEER : ORB_EUNAVAILABLE, text);
        return;
    }

    struct orb_nvl_begin *b = calloc(1, sizeof *b);
    struct orb_nvl_begin_ok *a = calloc(1, sizeof *a);
    struct copy_result *res = calloc(n, sizeof *res);
    uint8_t *req = malloc(ORB_CONTROL_MAX), *resp = malloc(ORB_CONTROL_MAX);
    int rc = 0;
    if (b == NULL || a == NULL || res == NULL || req == NULL || resp == NULL) {
        fail_all(tp, xs, n, ORB_ENOMEM, "nvlink: out of memory for a group");
        goto free_buffers;
    }
    /* A random id, not a count: a process that learns this engine's epoch (the source's only
     * check on END besides the id) cannot end its groups early by guessing. */
    while (b->group == 0 && orb_random_bytes(&b->group, sizeof b->group) != 0)
        b->group = orb_random_u64();
    b->count = n;
    for (uint32_t i = 0; i < n; i++)
        b->ranges[i] = (struct orb_nvl_range){.op = xs[i]->op, .addr = xs[i]->remote_addr, .length = xs[i]->length};
    size_t len = 0, resp_len = 0;
    rc = orb_nvl_begin_encode(ORB_NVL_BEGIN, b, req, ORB_CONTROL_MAX, &len);
    if (rc == 0)
        rc = p->ctl.call(p->ctl.peer, ORB_TRANSPORT_NVLINK, req, len, resp, ORB_CONTROL_MAX, &resp_len, deadline);
    if (rc == 0)
        rc = orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, resp, resp_len, a);
    if (rc == 0 && (a->group != b->group || a->count != n))
        rc = orb_fail(ORB_EPROTO, "nvlink: peer %s answered group %llu of %u requests for group %llu of %u",
                      p->endpoint, (unsigned long long)a->group, a->count, (unsigned long long)b->group, n);
    if (rc != 0) {
        /* Nothing is held when BEGIN failed; a lost answer's hold ends with its lease. */
        char text[WHY_LEN];
        snprintf(text, sizeof text, "nvlink: peer %.64s did not begin the group: %.160s", p->endpoint,
                 orb_last_error());
        fail_all(tp, xs, n, rc, text);
        goto free_buffers;
    }

    bool held = false;
    int close_rc = 0;
    char close_why[WHY_LEN] = "";
    struct orb_cuda_dtod ops[ORB_NVL_GROUP_MAX];
    orb_cuda_memory *owners[ORB_NVL_GROUP_MAX] = {NULL};
    for (uint32_t i = 0; i < n; i++) {
        struct orb_xfer *x = xs[i];
        const struct orb_nvl_grant *g = &a->grants[i];
        struct copy_result *r = &res[i];
        if (g->status != 0) {
            r->status = g->status;
            snprintf(r->why, sizeof r->why, "nvlink: peer %.64s refused: %.96s", p->endpoint, g->why);
            forget(p, x->remote_addr, x->length);
            continue;
        }
        held = true;
        const struct orb_nvl_alloc *al = &a->allocs[g->alloc];
        if (x->remote_addr < al->base || x->length > al->size || x->remote_addr - al->base > al->size - x->length) {
            r->status = orb_fail(ORB_EPROTO, "nvlink: peer %s granted [0x%llx, +%llu) in allocation [0x%llx, +%llu)",
                                 p->endpoint, (unsigned long long)x->remote_addr, (unsigned long long)x->length,
                                 (unsigned long long)al->base, (unsigned long long)al->size);
            snprintf(r->why, sizeof r->why, "%s", orb_last_error());
            continue;
        }
        const struct orb_reg *local = x->local_reg;
        orb_cuda_memory *mem = local->owner;
        uint64_t ptr = 0;
        if (st == HELLO_SAME_PROCESS)
            ptr = x->remote_addr; /* the source's address is this process's */
        else if ((r->status = import_get(p, al, g->alloc, orb_cuda_memory_device(mem), b->group,
                                               group_deadline(p->tp, xs, n), &ptr, &close_rc)) != 0) {
            snprintf(r->why, sizeof r->why, "%s", orb_last_error());
            continue;
        } else
            ptr += x->remote_addr - al->base;
        ops[i] = (struct orb_cuda_dtod){.offset = (size_t)(local->base + x->local_offset - orb_cuda_memory_ptr(mem)),
                                        .peer = ptr, .len = (size_t)x->length, .to_peer = x->op == ORB_XFER_WRITE};
        owners[i] = mem;
        r->attempted = true;
    }
    /* The copies of each local allocation go on its stream together and are waited for once. */
    for (uint32_t i = 0; i < n; i++) {
        if (owners[i] == NULL)
            continue;
        struct orb_cuda_dtod batch[ORB_NVL_GROUP_MAX];
        uint32_t which[ORB_NVL_GROUP_MAX], k = 0;
        orb_cuda_memory *mem = owners[i];
        for (uint32_t j = i; j < n; j++)
            if (owners[j] == mem) {
                batch[k] = ops[j];
                which[k++] = j;
                owners[j] = NULL;
            }
        (void)orb_cuda_memory_dtod_many(mem, batch, k);
        for (uint32_t m = 0; m < k; m++) {
            struct copy_result *r = &res[which[m]];
            if ((r->status = batch[m].status) != 0)
                snprintf(r->why, sizeof r->why, "nvlink: the copy %s peer %.64s failed: %.150s",
                         batch[m].to_peer ? "to" : "from", p->endpoint, orb_last_error());
        }
    }

    /* The source holds the group's ranges until it hears the copies are over. */
    if (close_rc != 0)
        snprintf(close_why, sizeof close_why, "nvlink: a mapping of peer %.64s's memory that this group of %u "
                 "requests shared could not be closed (%s): the group does not count as complete", p->endpoint, n,
                 orb_strerror(close_rc));
    int end_rc = 0;
    char end_why[WHY_LEN] = "";
    /* A copy whose end is not proven may still touch the source's memory: the END that lets the
     * source give its ranges back is not sent; they stay held until the group's lease runs out. */
    bool unproven = false;
    for (uint32_t i = 0; i < n; i++)
        unproven |= res[i].attempted && res[i].status == ORB_EUNQUIESCED;
    if (held && unproven) {
        end_rc = ORB_EUNQUIESCED;
        snprintf(end_why, sizeof end_why, "nvlink: a copy of this group of %u requests was not proven to end: its END "
                 "is not sent, and peer %.64s holds its ranges until their lease runs out", n, p->endpoint);
    } else if (held) {
        end_rc = orb_nvl_end_encode(ORB_NVL_END, b->group, req, ORB_CONTROL_MAX, &len);
        uint64_t end_deadline = orb_deadline_after(tp->lease_ns); /* the source must hear it even late */
        if (end_rc == 0)
            end_rc = p->ctl.call(p->ctl.peer, ORB_TRANSPORT_NVLINK, req, len, resp, ORB_CONTROL_MAX, &resp_len,
                                 end_deadline);
        uint64_t id = 0;
        if (end_rc == 0 && (end_rc = orb_nvl_end_decode(ORB_NVL_END_OK, resp, resp_len, &id)) == 0 && id != b->group)
            end_rc = orb_fail(ORB_EPROTO, "nvlink: peer %s ended group %llu for %llu", p->endpoint,
                              (unsigned long long)id, (unsigned long long)b->group);
        if (end_rc != 0)
            snprintf(end_why, sizeof end_why, "nvlink: peer %.64s did not acknowledge the end of the group of %u "
                     "requests: %.110s", p->endpoint, n, orb_last_error());
    }
    for (uint32_t i = 0; i < n; i++) {
        struct orb_xfer *x = xs[i];
        enum orb_remote_effect effect = x->op == ORB_XFER_WRITE && res[i].attempted ? ORB_REMOTE_EFFECT_UNKNOWN
                                                                                    : ORB_REMOTE_EFFECT_NONE;
        if (end_rc != 0)
            xfer_end(tp, x, end_rc, effect, end_why);
        else if (close_rc != 0)
            xfer_end(tp, x, close_rc, effect, close_why);
        else
            xfer_end(tp, x, res[i].status, res[i].status != 0 ? effect : ORB_REMOTE_EFFECT_NONE, res[i].why);
    }

free_buffers:
    free(b);
    free(a);
    free(res);
    free(req);
    free(resp);
}

static void *peer_main(void *arg)
{
    struct nvl_peer *p = arg;
    orb_thread_name("nvl-peer");
    struct nvl_tp *tp = p->tp;
    struct orb_xfer *batch[ORB_NVL_GROUP_MAX];
    pthread_mutex_lock(&p->lock);
    for (;;) {
        bool stopping = atomic_load(&tp->stopping);
        if (p->head == NULL && (p->released || stopping))
            break;
        if (p->head == NULL) {
            pthread_cond_wait(&p->changed, &p->lock);
            continue;
        }
        uint32_t n = 0;
        while (p->head != NULL && n < ORB_NVL_GROUP_MAX) {
            batch[n++] = p->head;
            p->head = p->head->next;
        }
        if (p->head == NULL)
            p->tail = NULL;
        pthread_mutex_unlock(&p->lock);
        if (stopping)
            fail_all(tp, batch, n, ORB_ECLOSED, "nvlink: the engine is closing");
        else
            run_group(p, batch, n);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    for (uint32_t i = 0; i < p->nimports; i++)
        (void)close_import(p, &p->imports[i]); /* logged and kept; no group is left to fail */
    p->nimports = 0;
    pthread_mutex_lock(&p->lock);
    p->finished = true;
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_lock(&tp->lock);
    tp->live_threads--;
    pthread_cond_broadcast(&tp->changed);
    pthread_mutex_unlock(&tp->lock);
    return NULL;
}

int nvl_requester_stop(struct nvl_tp *tp, uint64_t deadline)
{
    pthread_mutex_lock(&tp->lock);
    atomic_store(&tp->stopping, true);
    pthread_cond_broadcast(&tp->changed);
    for (struct nvl_peer *p = tp->peers; p != NULL; p = p->next) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->lock);
    }
    while (tp->live_threads > 0 && orb_now_ns() < deadline)
        nvl_wait_locked(tp, deadline);
    uint32_t live = tp->live_threads;
    pthread_mutex_unlock(&tp->lock);
    if (live > 0)
        return orb_fail(ORB_EUNQUIESCED, "nvlink: %u peers' copies did not end in time", live);
    return 0;
}

void nvl_requester_free(struct nvl_tp *tp)
{
    /* Every segment, hence every peer, was released before the engine is destroyed. */
    pthread_mutex_lock(&tp->lock);
    reap_peers_locked(tp);
    if (tp->peers != NULL)
        ORB_LOGE("nvlink: a peer outlives its transport");
    pthread_mutex_unlock(&tp->lock);
}
