/* The verbs interposer (verbs_interposer.h). The process's table lives in lib/rdma/verbs.c as a
 * writable object handed out as const: the interposer keeps a copy of the real entries and
 * writes its wrappers over them. */
#include "verbs_interposer.h"

#include <sys/mman.h>

#include <fcntl.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "device_util.h"
#include "rdma/verbs.h"

static struct orb_verbs real;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int install_rc = -1;

struct armed {
    bool on;
    uint64_t left;   /* matching calls until the failing one */
    int err;
    int opcode;
    enum itp_post_failure how;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct armed armed[ITP_VERBS];
static atomic_uint_fast64_t calls[ITP_VERBS], failures[ITP_VERBS];

/* Whether this call of `verb` (of `opcode` for posts) is the armed one; counts it. */
static bool fails_now(enum itp_verb verb, int opcode, int *err, enum itp_post_failure *how)
{
    atomic_fetch_add(&calls[verb], 1);
    bool fail = false;
    pthread_mutex_lock(&lock);
    struct armed *a = &armed[verb];
    if (a->on && (a->opcode < 0 || a->opcode == opcode) && --a->left == 0) {
        a->on = false;
        fail = true;
        *err = a->err;
        if (how != NULL)
            *how = a->how;
    }
    pthread_mutex_unlock(&lock);
    if (fail)
        atomic_fetch_add(&failures[verb], 1);
    return fail;
}

static void (*post_hook)(void *);
static void *post_hook_arg;

void itp_on_armed_post(void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&lock);
    post_hook = fn;
    post_hook_arg = arg;
    pthread_mutex_unlock(&lock);
}

/* Payload WRs watched against one range (itp_watch_payload). */
static struct {
    bool on;
    uint64_t lo, hi;
    struct itp_payload_watch seen;
} watch;

static struct itp_wr_counts wr_counts;

struct itp_wr_counts itp_wrs_posted(void)
{
    pthread_mutex_lock(&lock);
    struct itp_wr_counts c = wr_counts;
    pthread_mutex_unlock(&lock);
    return c;
}

static void watch_wrs(const struct ibv_send_wr *wr)
{
    pthread_mutex_lock(&lock);
    for (const struct ibv_send_wr *w = wr; w != NULL; w = w->next) {
        wr_counts.binds += w->opcode == IBV_WR_BIND_MW;
        wr_counts.sends += w->opcode == IBV_WR_SEND;
        wr_counts.fenced_sends += w->opcode == IBV_WR_SEND && (w->send_flags & IBV_SEND_FENCE) != 0;
        wr_counts.sends_with_inv += w->opcode == IBV_WR_SEND_WITH_INV;
    }
    for (; watch.on && wr != NULL; wr = wr->next) {
        if (wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE &&
            wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM)
            continue;
        for (int i = 0; i < wr->num_sge; i++) {
            const struct ibv_sge *g = &wr->sg_list[i];
            bool in = g->addr >= watch.lo && g->length <= watch.hi - watch.lo && g->addr - watch.lo <= watch.hi - watch.lo - g->length;
            if (in) {
                watch.seen.inside++;
                watch.seen.bytes_inside += g->length;
            } else {
                watch.seen.outside++;
            }
        }
    }
    pthread_mutex_unlock(&lock);
}

void itp_watch_payload(uint64_t lo, uint64_t hi)
{
    pthread_mutex_lock(&lock);
    watch.on = hi > lo;
    watch.lo = lo;
    watch.hi = hi;
    memset(&watch.seen, 0, sizeof watch.seen);
    pthread_mutex_unlock(&lock);
}

struct itp_payload_watch itp_payload_seen(void)
{
    pthread_mutex_lock(&lock);
    struct itp_payload_watch w = watch.seen;
    pthread_mutex_unlock(&lock);
    return w;
}

static _Atomic(void (*)(struct ibv_qp *, struct ibv_send_wr *)) post_filter;
static _Atomic(void (*)(struct ibv_cq *, struct ibv_wc *, int)) completion_filter;

void itp_filter_posts(void (*fn)(struct ibv_qp *qp, struct ibv_send_wr *wr))
{
    atomic_store(&post_filter, fn);
}

void itp_filter_completions(void (*fn)(struct ibv_cq *cq, struct ibv_wc *wc, int n))
{
    atomic_store(&completion_filter, fn);
}

const struct orb_verbs *itp_real(void)
{
    return &real;
}

/* The real post, after the filter (a double's rewrite of what reaches the device). */
static int post_filtered(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    void (*filter)(struct ibv_qp *, struct ibv_send_wr *) = atomic_load(&post_filter);
    if (filter != NULL)
        filter(qp, wr);
    return real.post_send(qp, wr, bad_wr);
}

static int w_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    int err = 0;
    watch_wrs(wr); /* what the caller posts, before any double rewrites it */
    enum itp_post_failure how = ITP_REFUSED_NAMED;
    if (!fails_now(ITP_POST_SEND, wr != NULL ? (int)wr->opcode : -1, &err, &how))
        return post_filtered(qp, wr, bad_wr);
    pthread_mutex_lock(&lock);
    void (*hook)(void *) = post_hook;
    void *hook_arg = post_hook_arg;
    post_hook = NULL;
    pthread_mutex_unlock(&lock);
    if (hook != NULL)
        hook(hook_arg);
    switch (how) {
    case ITP_WRONG_KEY:
        wr->wr.rdma.rkey ^= 0x00a5a500u; /* another key index: never one the peer granted */
        return post_filtered(qp, wr, bad_wr);
    case ITP_QP_TO_ERROR: {
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_ERR;
        (void)real.modify_qp(qp, &a, IBV_QP_STATE);
        /* Said, so that a log tells this forced error from one the device made. */
        fprintf(stderr, "verbs interposer: qp %u moved to the error state before a post (opcode %d)\n", qp->qp_num,
                (int)wr->opcode);
        return post_filtered(qp, wr, bad_wr);
    }
    case ITP_TAKEN_UNNAMED:
        (void)post_filtered(qp, wr, bad_wr);
        break;
    case ITP_REFUSED_NAMED:
    case ITP_REFUSED_UNNAMED:
        break;
    }
    *bad_wr = how == ITP_REFUSED_NAMED ? wr : NULL;
    return err;
}

static int w_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    int err = 0;
    if (!fails_now(ITP_POST_RECV, -1, &err, NULL))
        return real.post_recv(qp, wr, bad_wr);
    *bad_wr = wr;
    return err;
}

/* Where each queue pair was last connected to: its peer's number and GID, and its own GID. */
#define MAX_QPS 1024
static struct {
    const struct ibv_qp *qp;
    struct itp_qp_route route;
} qp_routes[MAX_QPS];

static int w_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    int rc = real.modify_qp(qp, attr, mask);
    if (rc != 0 || !(mask & IBV_QP_DEST_QPN) || !(mask & IBV_QP_AV))
        return rc;
    struct itp_qp_route r = {.qpn = qp->qp_num, .dest_qpn = attr->dest_qp_num, .dgid = attr->ah_attr.grh.dgid};
    if (real.query_gid(qp->context, attr->ah_attr.port_num, attr->ah_attr.grh.sgid_index, &r.sgid) != 0)
        return rc; /* unknown: no double takes it for connected */
    pthread_mutex_lock(&lock);
    size_t slot = MAX_QPS;
    for (size_t i = 0; i < MAX_QPS; i++) {
        if (qp_routes[i].qp == qp) {
            slot = i;
            break;
        }
        if (qp_routes[i].qp == NULL && slot == MAX_QPS)
            slot = i;
    }
    if (slot < MAX_QPS) {
        qp_routes[slot].qp = qp;
        qp_routes[slot].route = r;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

bool itp_qp_route(const struct ibv_context *ctx, uint32_t qpn, struct itp_qp_route *out)
{
    bool found = false;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_QPS && !found; i++)
        if (qp_routes[i].qp != NULL && qp_routes[i].route.qpn == qpn && (ctx == NULL || qp_routes[i].qp->context == ctx)) {
            *out = qp_routes[i].route;
            found = true;
        }
    pthread_mutex_unlock(&lock);
    return found;
}

bool itp_qp_route_of(const struct ibv_qp *qp, struct itp_qp_route *out)
{
    bool found = false;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_QPS && !found; i++)
        if (qp_routes[i].qp == qp) {
            *out = qp_routes[i].route;
            found = true;
        }
    pthread_mutex_unlock(&lock);
    return found;
}

static int w_destroy_qp(struct ibv_qp *qp)
{
    int err = 0;
    if (fails_now(ITP_DESTROY_QP, -1, &err, NULL))
        return err;
    pthread_mutex_lock(&lock); /* before: a QP made at once may reuse its address */
    for (size_t i = 0; i < MAX_QPS; i++)
        if (qp_routes[i].qp == qp)
            qp_routes[i].qp = NULL;
    pthread_mutex_unlock(&lock);
    return real.destroy_qp(qp);
}

static struct itp_dmabuf_call last_dmabuf;
static int dmabuf_as_host;

struct itp_dmabuf_call itp_last_dmabuf(void)
{
    pthread_mutex_lock(&lock);
    struct itp_dmabuf_call c = last_dmabuf;
    pthread_mutex_unlock(&lock);
    return c;
}

void itp_dmabuf_as_host(int on)
{
    pthread_mutex_lock(&lock);
    dmabuf_as_host = on;
    pthread_mutex_unlock(&lock);
}

static struct itp_reg_mr_call last_reg_mr;

struct itp_reg_mr_call itp_last_reg_mr(void)
{
    pthread_mutex_lock(&lock);
    struct itp_reg_mr_call c = last_reg_mr;
    pthread_mutex_unlock(&lock);
    return c;
}

static void *(*device_view)(unsigned long long addr, size_t len);

void itp_device_as_host(void *(*view)(unsigned long long addr, size_t len))
{
    pthread_mutex_lock(&lock);
    device_view = view;
    pthread_mutex_unlock(&lock);
}

/* The memory regions made through the table and not deregistered. */
#define MAX_MRS 4096
static struct {
    struct ibv_mr *mr;
    uint64_t iova; /* the start of its address space (mr->addr is the host address or offset) */
} live_mrs[MAX_MRS];

static struct ibv_mr *mr_made(struct ibv_mr *mr, uint64_t iova)
{
    if (mr == NULL)
        return NULL;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_MRS; i++)
        if (live_mrs[i].mr == NULL) {
            live_mrs[i].mr = mr;
            live_mrs[i].iova = iova;
            break;
        }
    pthread_mutex_unlock(&lock);
    return mr;
}

bool itp_mr_covers(const struct ibv_pd *pd, uint32_t lkey, uint64_t addr, uint64_t len)
{
    bool ok = false;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_MRS && !ok; i++) {
        const struct ibv_mr *mr = live_mrs[i].mr;
        if (mr == NULL || mr->pd != pd || mr->lkey != lkey)
            continue;
        uint64_t lo = live_mrs[i].iova;
        ok = addr >= lo && len <= mr->length && addr - lo <= mr->length - len;
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

static struct ibv_mr *w_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
    int err = 0;
    pthread_mutex_lock(&lock);
    last_reg_mr = (struct itp_reg_mr_call){.addr = (uint64_t)(uintptr_t)addr, .length = length, .iova = iova,
                                           .access = (int)access};
    void *(*view)(unsigned long long, size_t) = device_view;
    pthread_mutex_unlock(&lock);
    if (fails_now(ITP_REG_MR, -1, &err, NULL)) {
        errno = err;
        return NULL;
    }
    void *host = view != NULL ? view((unsigned long long)(uintptr_t)addr, length) : NULL;
    return mr_made(real.reg_mr_iova2(pd, host != NULL ? host : addr, length, iova, access), iova);
}

static struct ibv_mr *w_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                      int access)
{
    int err = 0;
    bool fail = fails_now(ITP_REG_DMABUF_MR, -1, &err, NULL);
    pthread_mutex_lock(&lock);
    last_dmabuf = (struct itp_dmabuf_call){.offset = offset, .length = length, .iova = iova, .fd = fd,
                                           .access = access, .fd_was_open = fcntl(fd, F_GETFD) >= 0};
    int as_host = dmabuf_as_host;
    pthread_mutex_unlock(&lock);
    if (fail) {
        errno = err;
        return NULL;
    }
    if (!as_host) {
        if (real.reg_dmabuf_mr == NULL) {
            errno = ENOSYS;
            return NULL;
        }
        return mr_made(real.reg_dmabuf_mr(pd, offset, length, iova, fd, access), iova);
    }
    /* The pages stay mapped for the process's life: a test double. */
    uint8_t *p = mmap(NULL, (size_t)(offset + length), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return NULL;
    return mr_made(real.reg_mr_iova2(pd, p + offset, length, iova, (unsigned)access), iova);
}

static int w_dereg_mr(struct ibv_mr *mr)
{
    int err = 0;
    if (fails_now(ITP_DEREG_MR, -1, &err, NULL))
        return err;
    pthread_mutex_lock(&lock); /* before: a region made at once may reuse its address */
    for (size_t i = 0; i < MAX_MRS; i++)
        if (live_mrs[i].mr == mr)
            live_mrs[i].mr = NULL;
    pthread_mutex_unlock(&lock);
    return real.dereg_mr(mr);
}

static atomic_int_fast64_t live_mws;

static struct ibv_mw *w_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
    int err = 0;
    if (fails_now(ITP_ALLOC_MW, -1, &err, NULL)) {
        errno = err;
        return NULL;
    }
    struct ibv_mw *mw = real.alloc_mw(pd, type);
    if (mw != NULL)
        atomic_fetch_add(&live_mws, 1);
    return mw;
}

static int w_dealloc_mw(struct ibv_mw *mw)
{
    int err = 0;
    if (fails_now(ITP_DEALLOC_MW, -1, &err, NULL))
        return err;
    int rc = real.dealloc_mw(mw);
    if (rc == 0)
        atomic_fetch_sub(&live_mws, 1);
    return rc;
}

int64_t itp_live_mws(void)
{
    return atomic_load(&live_mws);
}

/* The completion queues made through the table, to report errors of on demand. */
#define MAX_CQS 256
static struct {
    struct ibv_cq *cq;
    uint64_t made;         /* its place in the order of creation, from 1 */
    bool error_due;        /* itp_break_cqs_since(): an error event to hand out */
} cqs[MAX_CQS];
static uint64_t cqs_made;
static struct ibv_cq *reported[MAX_CQS]; /* made-up events handed out and not acknowledged */

/* ---- held SEND completions (itp_hold_send_completions) ---- */

/* ibv_poll_cq is rdma-core's inline call through the context's operations: the wrapper takes
 * the place of the provider's entry in each context a completion queue is made on (one
 * provider per test process: every context has the same entry). */
typedef int (*poll_cq_fn)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
static _Atomic(poll_cq_fn) real_poll_cq; /* set before any context's entry points here */

#define MAX_HELD 8u
static struct {
    uint32_t left, delay_ms, handed_out;
    uint32_t n;
    struct {
        struct ibv_cq *cq;
        uint64_t due_ns;
        struct ibv_wc wc;
    } wc[MAX_HELD];
} held;
static atomic_bool held_active; /* left or n nonzero: polls take the lock only then */

void itp_hold_send_completions(uint32_t count, uint32_t delay_ms)
{
    pthread_mutex_lock(&lock);
    held.left = count;
    held.delay_ms = delay_ms;
    held.handed_out = 0;
    if (count == 0)
        held.n = 0; /* what a failed cell left held (its queues may be gone) */
    atomic_store(&held_active, count > 0);
    pthread_mutex_unlock(&lock);
}

uint32_t itp_held_send_completions(void)
{
    pthread_mutex_lock(&lock);
    uint32_t n = held.handed_out;
    pthread_mutex_unlock(&lock);
    return n;
}

static int poll_held(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
    poll_cq_fn real_poll = atomic_load(&real_poll_cq);
    if (!atomic_load(&held_active))
        return real_poll(cq, num_entries, wc);
    int k = 0;
    uint64_t now = now_ns();
    pthread_mutex_lock(&lock);
    for (uint32_t i = 0; i < held.n && k < num_entries;) {
        if (held.wc[i].cq != cq || held.wc[i].due_ns > now) {
            i++;
            continue;
        }
        wc[k++] = held.wc[i].wc;
        held.handed_out++;
        held.wc[i] = held.wc[--held.n];
    }
    pthread_mutex_unlock(&lock);
    if (k == num_entries)
        return k;
    int got = real_poll(cq, num_entries - k, wc + k);
    if (got <= 0)
        return k > 0 ? k : got;
    pthread_mutex_lock(&lock);
    int out = k;
    for (int i = k; i < k + got; i++) {
        if (held.left > 0 && held.n < MAX_HELD && wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_SEND) {
            held.left--;
            held.wc[held.n].cq = cq;
            held.wc[held.n].due_ns = now + (uint64_t)held.delay_ms * 1000000ull;
            held.wc[held.n].wc = wc[i];
            held.wc[held.n].wc.status = IBV_WC_WR_FLUSH_ERR;
            held.n++;
            continue;
        }
        wc[out++] = wc[i];
    }
    atomic_store(&held_active, held.left > 0 || held.n > 0);
    pthread_mutex_unlock(&lock);
    return out;
}

static int w_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
    int n = poll_held(cq, num_entries, wc);
    void (*filter)(struct ibv_cq *, struct ibv_wc *, int) = atomic_load(&completion_filter);
    if (filter != NULL && n > 0)
        filter(cq, wc, n);
    return n;
}

static void wrap_poll_cq(struct ibv_context *context)
{
    pthread_mutex_lock(&lock);
    if (atomic_load(&real_poll_cq) == NULL)
        atomic_store(&real_poll_cq, context->ops.poll_cq);
    if (context->ops.poll_cq == atomic_load(&real_poll_cq))
        context->ops.poll_cq = w_poll_cq;
    pthread_mutex_unlock(&lock);
}

static struct ibv_cq *w_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                  struct ibv_comp_channel *channel, int vector)
{
    struct ibv_cq *cq = real.create_cq(context, cqe, cq_context, channel, vector);
    if (cq == NULL)
        return NULL;
    wrap_poll_cq(context);
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_CQS; i++)
        if (cqs[i].cq == NULL) {
            cqs[i].cq = cq;
            cqs[i].made = ++cqs_made;
            cqs[i].error_due = false;
            break;
        }
    pthread_mutex_unlock(&lock);
    return cq;
}

static int w_destroy_cq(struct ibv_cq *cq)
{
    int err = 0;
    if (fails_now(ITP_DESTROY_CQ, -1, &err, NULL))
        return err;
    int rc = real.destroy_cq(cq);
    if (rc == 0) {
        pthread_mutex_lock(&lock);
        for (size_t i = 0; i < MAX_CQS; i++)
            if (cqs[i].cq == cq)
                cqs[i].cq = NULL;
        pthread_mutex_unlock(&lock);
    }
    return rc;
}

static int w_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_CQS; i++) {
        if (cqs[i].cq == NULL || !cqs[i].error_due || cqs[i].cq->context != context)
            continue;
        for (size_t j = 0; j < MAX_CQS; j++)
            if (reported[j] == NULL) {
                reported[j] = cqs[i].cq;
                cqs[i].error_due = false;
                memset(event, 0, sizeof *event);
                event->event_type = IBV_EVENT_CQ_ERR;
                event->element.cq = reported[j];
                pthread_mutex_unlock(&lock);
                return 0;
            }
    }
    pthread_mutex_unlock(&lock);
    return real.get_async_event(context, event);
}

static void w_ack_async_event(struct ibv_async_event *event)
{
    if (event->event_type == IBV_EVENT_CQ_ERR) {
        pthread_mutex_lock(&lock);
        for (size_t j = 0; j < MAX_CQS; j++)
            if (reported[j] == event->element.cq) {
                reported[j] = NULL; /* made up here: the device has nothing to acknowledge */
                pthread_mutex_unlock(&lock);
                return;
            }
        pthread_mutex_unlock(&lock);
    }
    real.ack_async_event(event);
}

uint64_t itp_cq_mark(void)
{
    pthread_mutex_lock(&lock);
    uint64_t mark = cqs_made;
    pthread_mutex_unlock(&lock);
    return mark;
}

uint32_t itp_break_cqs_since(const char *device, uint64_t mark)
{
    uint32_t n = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_CQS; i++)
        if (cqs[i].cq != NULL && cqs[i].made > mark &&
            strcmp(real.get_device_name(cqs[i].cq->context->device), device) == 0) {
            cqs[i].error_due = true;
            n++;
        }
    pthread_mutex_unlock(&lock);
    return n;
}

static int w_dealloc_pd(struct ibv_pd *pd)
{
    int err = 0;
    return fails_now(ITP_DEALLOC_PD, -1, &err, NULL) ? err : real.dealloc_pd(pd);
}

static void install_once(void)
{
    const struct orb_verbs *v = NULL;
    if (orb_verbs_get(&v) != 0)
        return;
    real = *v;
    /* The table is a writable object that the loader hands out as const. */
    struct orb_verbs *t = (struct orb_verbs *)(uintptr_t)v;
    t->post_send = w_post_send;
    t->post_recv = w_post_recv;
    t->destroy_qp = w_destroy_qp;
    t->modify_qp = w_modify_qp;
    t->dereg_mr = w_dereg_mr;
    t->alloc_mw = w_alloc_mw;
    t->dealloc_mw = w_dealloc_mw;
    t->create_cq = w_create_cq;
    t->destroy_cq = w_destroy_cq;
    t->get_async_event = w_get_async_event;
    t->ack_async_event = w_ack_async_event;
    t->dealloc_pd = w_dealloc_pd;
    t->reg_mr_iova2 = w_reg_mr_iova2;
    t->reg_dmabuf_mr = w_reg_dmabuf_mr;
    install_rc = 0;
}

int itp_install(void)
{
    pthread_once(&once, install_once);
    return install_rc;
}

void itp_arm(enum itp_verb verb, uint64_t nth, int err, int opcode, enum itp_post_failure how)
{
    pthread_mutex_lock(&lock);
    armed[verb] = (struct armed){.on = nth > 0, .left = nth, .err = err, .opcode = opcode, .how = how};
    pthread_mutex_unlock(&lock);
}

void itp_disarm(enum itp_verb verb)
{
    pthread_mutex_lock(&lock);
    armed[verb].on = false;
    pthread_mutex_unlock(&lock);
}

uint64_t itp_calls(enum itp_verb verb)
{
    return atomic_load(&calls[verb]);
}

uint64_t itp_failures(enum itp_verb verb)
{
    return atomic_load(&failures[verb]);
}
