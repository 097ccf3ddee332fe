/* The core's transport boundary, over two scripted transports (one in the TCP slot, one in the
 * RDMA slot): which transport carries a request, what a piece names (registration, offset,
 * memory kind, rail, per-request space), groups split across transports, per-transport
 * registration state (attached before visibility, retired on the release thread after the last
 * pin and before the owner's release, before the transport goes), and the public request's
 * room to grow. */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/engine_internal.h"
#include "core/error.h"

/* ---- two scripted transports ------------------------------------------------------------- */

#define MAX_PENDING 256
#define TOKEN_MAGIC 0x5eedf00du

struct script {
    enum orb_transport id;
    const char *name;
    int start_status;             /* start() answers it */
    int retire_fail;              /* reg_retire keeps its state and says so */
    struct token *kept;           /* the state it kept (one) */
    int open_status;              /* peer_open() answers it */
    int submit_status;            /* peer_submit() refuses with it */
    uint32_t rails;               /* > 0: plan ceil(length / 1000) pieces over this many rails */
    int attach_fail_at;           /* > 0: the n-th reg_attach fails */
    atomic_int attaches, retires, retire_violations;
    atomic_int destroyed;
    pthread_t retire_thread;
    int retire_seq;
    int visible_at_attach;        /* a reg_attach found its range already resolvable */
    int unquiesced_stops;         /* stop() answers ORB_EUNQUIESCED this many times */
    atomic_int stops;
    struct orb_xfer *pending[MAX_PENDING];
    size_t npending;
};

static pthread_mutex_t script_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int event_seq;
static orb_engine *current_engine;
static struct script tcp_script = {.id = ORB_TRANSPORT_TCP, .name = "scripted-tcp"};
static struct script rdma_script = {.id = ORB_TRANSPORT_RDMA, .name = "scripted-rdma"};

struct token {
    uint32_t magic;
    uint64_t base;
};

static int s_start(struct script *s, void **tp)
{
    if (s->start_status == ORB_TP_NOT_HERE) {
        (void)orb_fail(ORB_EUNAVAILABLE, "%s is not here", s->name);
        return ORB_TP_NOT_HERE;
    }
    if (s->start_status != 0)
        return orb_fail(s->start_status, "%s cannot start", s->name);
    *tp = s;
    return 0;
}
static int tcp_start(orb_engine *e, void **tp) { (void)e; return s_start(&tcp_script, tp); }
static int rdma_start(orb_engine *e, void **tp) { (void)e; return s_start(&rdma_script, tp); }
static int s_endpoint(void *tp, char *buf, size_t len)
{
    (void)tp;
    snprintf(buf, len, "script:1");
    return 0;
}
static void s_close_source(void *tp) { (void)tp; }

static struct orb_xfer *take(struct script *s, size_t i)
{
    pthread_mutex_lock(&script_lock);
    assert_true(i < s->npending);
    struct orb_xfer *x = s->pending[i];
    memmove(&s->pending[i], &s->pending[i + 1], (s->npending - i - 1) * sizeof s->pending[0]);
    s->npending--;
    pthread_mutex_unlock(&script_lock);
    return x;
}
static void complete_all(struct script *s, int status)
{
    while (s->npending > 0) {
        struct orb_xfer *x = take(s, 0);
        int started = orb_xfer_may_start(x);
        orb_xfer_done(x, started ? status : ORB_ETIMEDOUT, ORB_REMOTE_EFFECT_NONE);
    }
}
/* Unquiesced while unquiesced_stops > 0 (each stop counts one down), keeping its work pending. */
static int s_stop(void *tp, uint64_t deadline)
{
    (void)deadline;
    struct script *s = tp;
    atomic_fetch_add(&s->stops, 1);
    if (s->unquiesced_stops > 0) {
        s->unquiesced_stops--;
        return orb_fail(ORB_EUNQUIESCED, "%s: a work request may still touch memory", s->name);
    }
    complete_all(tp, ORB_ECLOSED);
    return 0;
}
static void s_destroy(void *tp)
{
    struct script *s = tp;
    atomic_store(&s->destroyed, 1);
}
static uint64_t s_inflight(void *tp)
{
    struct script *s = tp;
    pthread_mutex_lock(&script_lock);
    uint64_t n = s->npending;
    pthread_mutex_unlock(&script_lock);
    return n;
}
static int s_peer_open(void *tp, const char *endpoint, const struct orb_epoch *expected,
                       uint64_t deadline, const struct orb_control_path *ctl, void **peer)
{
    (void)endpoint, (void)expected, (void)deadline, (void)ctl;
    struct script *s = tp;
    if (s->open_status != 0)
        return orb_fail(s->open_status, "%s: no path", s->name);
    *peer = s;
    return 0;
}
static int s_peer_describe(void *peer, uint64_t deadline, struct orb_region_desc **r, size_t *n)
{
    (void)peer, (void)deadline;
    *r = NULL;
    *n = 0;
    return 0;
}
static int s_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan)
{
    struct script *s = peer;
    if (in->request_private != NULL) {
        /* The space is zeroed before the plan and the transport's own afterwards. */
        const uint8_t *p = in->request_private;
        for (size_t k = 0; k < 40; k++)
            assert_int_equal(p[k], 0);
        memcpy(in->request_private, &in->length, sizeof in->length);
    }
    if (s->rails == 0)
        return orb_plan_even(plan, in->length, 0);
    int rc = orb_plan_even(plan, in->length, 1000);
    if (rc != 0)
        return rc;
    for (uint32_t k = 0; k < plan->count; k++)
        plan->pieces[k].rail = k % s->rails;
    return 0;
}
static int s_peer_submit(void *peer, struct orb_xfer *const *xfers, size_t n)
{
    struct script *s = peer;
    if (s->submit_status != 0)
        return orb_fail(s->submit_status, "%s refuses", s->name);
    pthread_mutex_lock(&script_lock);
    assert_true(s->npending + n <= MAX_PENDING);
    for (size_t i = 0; i < n; i++)
        s->pending[s->npending++] = xfers[i];
    pthread_mutex_unlock(&script_lock);
    return 0;
}
static void s_peer_release(void *peer) { (void)peer; }

static int rdma_reg_attach(void *tp, const struct orb_reg *reg, void **state_out)
{
    struct script *s = tp;
    int n = atomic_fetch_add(&s->attaches, 1) + 1;
    /* Not visible yet: admission cannot find the range while its state is being made. */
    struct orb_local_region region;
    if (current_engine != NULL &&
        orb_registry_resolve(current_engine->registry, reg->base, reg->len, &region) == 0 &&
        region.base == reg->base && region.length == reg->len)
        s->visible_at_attach = 1;
    if (s->attach_fail_at > 0 && n == s->attach_fail_at)
        return orb_fail(ORB_ERESOURCE, "scripted memory-region budget exhausted");
    struct token *t = malloc(sizeof *t);
    assert_non_null(t);
    t->magic = TOKEN_MAGIC;
    t->base = reg->base;
    *state_out = t;
    return 0;
}
static int rdma_reg_retire(void *tp, const struct orb_reg *reg, void *state)
{
    struct script *s = tp;
    struct token *t = state;
    if (t == NULL || t->magic != TOKEN_MAGIC || t->base != reg->base || atomic_load(&s->destroyed))
        atomic_fetch_add(&s->retire_violations, 1);
    int rc = 0;
    if (s->retire_fail && s->kept == NULL) {
        s->kept = t; /* what a device would not let go of */
        rc = orb_fail(ORB_EBUSY, "scripted deregistration refused");
    } else {
        free(t);
    }
    s->retire_thread = pthread_self();
    s->retire_seq = atomic_fetch_add(&event_seq, 1);
    atomic_fetch_add(&s->retires, 1);
    return rc;
}

const struct orb_transport_ops orb_tcp_transport = {
    .id = ORB_TRANSPORT_TCP, .name = "scripted-tcp", .start = tcp_start,
    .endpoint = s_endpoint, .close_source = s_close_source, .stop = s_stop,
    .destroy = s_destroy, .inflight = s_inflight, .peer_open = s_peer_open,
    .peer_describe = s_peer_describe, .peer_plan = s_peer_plan, .peer_submit = s_peer_submit,
    .peer_release = s_peer_release,
};
/* Also the builtin RDMA table for orb_engine_create(). */
const struct orb_transport_ops orb_rdma_transport = {
    .id = ORB_TRANSPORT_RDMA, .name = "scripted-rdma", .request_private_size = 40,
    .start = rdma_start, .close_source = s_close_source, .stop = s_stop,
    .destroy = s_destroy, .inflight = s_inflight, .reg_attach = rdma_reg_attach,
    .reg_retire = rdma_reg_retire, .peer_open = s_peer_open, .peer_plan = s_peer_plan,
    .peer_submit = s_peer_submit, .peer_release = s_peer_release,
};
/* And no NVLink transport (orb_engine_create() starts it; here it is not on this host). */
static int nvlink_start(orb_engine *engine, void **tp)
{
    (void)engine, (void)tp;
    (void)orb_fail(ORB_EUNAVAILABLE, "no NVLink in this test");
    return ORB_TP_NOT_HERE;
}
const struct orb_transport_ops orb_nvlink_transport = {
    .id = ORB_TRANSPORT_NVLINK, .name = "absent", .start = nvlink_start,
};
/* Nor a same-host one. */
const struct orb_transport_ops orb_shm_transport = {
    .id = ORB_TRANSPORT_SHM, .name = "absent", .start = nvlink_start,
};

/* ---- fixture ----------------------------------------------------------------------------- */

#define MEM_LEN 65536

struct fx {
    orb_engine *engine;
    orb_segment *seg;
    uint8_t *mem;
    uint64_t base;
    orb_reg_id id;
    atomic_int released;
    pthread_t release_thread;
    int release_seq;
};

static void note_release(void *ptr, size_t len, void *ctx)
{
    (void)len;
    free(ptr);
    struct fx *f = ctx;
    f->release_thread = pthread_self();
    f->release_seq = atomic_fetch_add(&event_seq, 1);
    atomic_fetch_add(&f->released, 1);
}

static void wait_for(atomic_int *v, int n)
{
    for (int i = 0; i < 5000 && atomic_load(v) < n; i++)
        usleep(1000);
    assert_int_equal(atomic_load(v), n);
}

static void reset_script(struct script *s)
{
    s->start_status = s->open_status = s->submit_status = 0;
    s->retire_fail = 0;
    free(s->kept);
    s->kept = NULL;
    s->rails = 0;
    s->attach_fail_at = 0;
    atomic_store(&s->attaches, 0);
    atomic_store(&s->retires, 0);
    atomic_store(&s->retire_violations, 0);
    atomic_store(&s->destroyed, 0);
    s->visible_at_attach = 0;
    s->unquiesced_stops = 0;
    atomic_store(&s->stops, 0);
    s->npending = 0;
}

static orb_engine *engine_new(void)
{
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.busy_poll_us = 0;
    const struct orb_transport_ops *ops[] = {&orb_tcp_transport, &orb_rdma_transport};
    orb_engine *e = NULL;
    assert_int_equal(orb_engine_create_with(&cfg, NULL, ops, 2, &e), 0);
    current_engine = e;
    return e;
}

static int setup(void **state)
{
    reset_script(&tcp_script);
    reset_script(&rdma_script);
    struct fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    *state = f;
    return 0;
}

/* Engine, one registration of MEM_LEN bytes and a segment, after the scripts were set. */
static void open_all(struct fx *f)
{
    f->engine = engine_new();
    f->mem = malloc(MEM_LEN);
    assert_non_null(f->mem);
    f->base = (uint64_t)(uintptr_t)f->mem;
    assert_int_equal(orb_register_memory(f->engine, f->mem, MEM_LEN, ORB_PERM_REMOTE_WRITE,
                                         note_release, f, &f->id), 0);
    struct orb_epoch e = {{1}};
    assert_int_equal(orb_open_segment(f->engine, "script:1", &e, 1000000000ull, &f->seg), 0);
}

static int teardown(void **state)
{
    struct fx *f = *state;
    orb_segment_close(f->seg);
    if (f->engine != NULL) {
        orb_unregister_memory(f->engine, f->id);
        orb_engine_free(f->engine);
    }
    current_engine = NULL;
    assert_int_equal(atomic_load(&rdma_script.retire_violations), 0);
    free(f);
    return 0;
}

static struct orb_request rq(struct fx *f, enum orb_transport t, uint64_t off, uint64_t len)
{
    struct orb_request r;
    memset(&r, 0, sizeof r);
    r.transport = t;
    r.op = ORB_OP_WRITE;
    r.local_addr = f->base + off;
    r.remote_addr = 0x10000 + off;
    r.length = len;
    return r;
}

/* ---- tests ------------------------------------------------------------------------------- */

/* The request's transport field is honoured; UNSPEC takes the fastest transport with a path. */
static void test_requests_honour_transport(void **state)
{
    struct fx *f = *state;
    open_all(f);
    struct orb_request r[3] = {rq(f, ORB_TRANSPORT_TCP, 0, 10), rq(f, ORB_TRANSPORT_RDMA, 100, 20),
                               rq(f, ORB_TRANSPORT_UNSPEC, 200, 30)};
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_submit(b, r, 3), 0);
    assert_int_equal(tcp_script.npending, 1);
    assert_int_equal(tcp_script.pending[0]->request_index, 0);
    assert_int_equal(rdma_script.npending, 2);
    assert_int_equal(rdma_script.pending[0]->request_index, 1);
    assert_int_equal(rdma_script.pending[1]->request_index, 2);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    complete_all(&tcp_script, 0);
    complete_all(&rdma_script, 0);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), 0);
    assert_int_equal(rep.completed_requests, 3);
    assert_int_equal(rep.completed_bytes, 60);
    assert_int_equal(rep.comp_mask, 0);
    assert_int_equal(orb_batch_free(b), 0);
}

/* A peer without an RDMA path: UNSPEC falls back to TCP, an explicit RDMA request is refused
 * with the reason, and nothing is queued anywhere. */
static void test_no_rdma_path(void **state)
{
    struct fx *f = *state;
    rdma_script.open_status = ORB_EUNAVAILABLE;
    open_all(f);
    struct orb_request r = rq(f, ORB_TRANSPORT_UNSPEC, 0, 10);
    struct orb_batch_report rep;
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_submit(b, &r, 1), 0);
    assert_int_equal(tcp_script.npending, 1);
    assert_int_equal(rdma_script.npending, 0);
    r.transport = ORB_TRANSPORT_RDMA;
    assert_int_equal(orb_batch_submit(b, &r, 1), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "no path"));
    assert_non_null(strstr(orb_last_error(), "request 1"));
    assert_int_equal(rdma_script.npending, 0);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    complete_all(&tcp_script, 0);
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), 0);
    assert_int_equal(rep.submitted_requests, 1);
    assert_int_equal(orb_batch_free(b), 0);
    /* An unknown transport is an argument error, not an absent one. */
    r.transport = (enum orb_transport)7;
    assert_int_equal(orb_submit_and_wait(f->engine, f->seg, &r, 1, NULL, 1000000000ull, &rep),
                     ORB_EINVAL);
    /* A transport that finds another epoch at the endpoint fails the whole open. */
    rdma_script.open_status = ORB_ESTALE;
    struct orb_epoch e = {{1}};
    orb_segment *seg = NULL;
    assert_int_equal(orb_open_segment(f->engine, "script:1", &e, 1000000000ull, &seg), ORB_ESTALE);
    assert_null(seg);
}

/* A transport whose start() says "not on this host" is left out: the engine runs on TCP, RDMA
 * requests name the cause, and registrations never reach the absent transport. */
static void test_transport_not_on_this_host(void **state)
{
    struct fx *f = *state;
    rdma_script.start_status = ORB_TP_NOT_HERE;
    open_all(f);
    assert_int_equal(atomic_load(&rdma_script.attaches), 0);
    struct orb_request r = rq(f, ORB_TRANSPORT_RDMA, 0, 10);
    struct orb_batch_report rep;
    assert_int_equal(orb_submit_and_wait(f->engine, f->seg, &r, 1, NULL, 1000000000ull, &rep),
                     ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "not available in this engine"));
    assert_int_equal(rep.submitted_requests, 0);
    /* Any other start failure fails the engine. */
    rdma_script.start_status = ORB_ENOMEM;
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    const struct orb_transport_ops *ops[] = {&orb_tcp_transport, &orb_rdma_transport};
    orb_engine *e = NULL;
    assert_int_equal(orb_engine_create_with(&cfg, NULL, ops, 2, &e), ORB_ENOMEM);
    assert_null(e);
    /* So does a table set without TCP, or with a slot twice. */
    const struct orb_transport_ops *no_tcp[] = {&orb_rdma_transport};
    rdma_script.start_status = 0;
    assert_int_equal(orb_engine_create_with(&cfg, NULL, no_tcp, 1, &e), ORB_EINVAL);
    const struct orb_transport_ops *twice[] = {&orb_tcp_transport, &orb_tcp_transport};
    assert_int_equal(orb_engine_create_with(&cfg, NULL, twice, 2, &e), ORB_EINVAL);
    assert_null(e);
}

/* Pieces come from the transport's one plan: rails, offsets into the registration, the memory
 * kind, and one zeroed per-request space shared by the request's pieces. */
static void test_pieces_follow_the_plan(void **state)
{
    struct fx *f = *state;
    rdma_script.rails = 3;
    open_all(f);
    /* 6 pieces (more than a plan holds inline) and 2 pieces. */
    struct orb_request r[2] = {rq(f, ORB_TRANSPORT_RDMA, 5, 5500), rq(f, ORB_TRANSPORT_RDMA, 9000, 1500)};
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_submit(b, r, 2), 0);
    assert_int_equal(rdma_script.npending, 8);
    void *priv[2] = {NULL, NULL};
    uint64_t next[2] = {0, 0};
    for (size_t i = 0; i < 8; i++) {
        const struct orb_xfer *x = rdma_script.pending[i];
        uint32_t q = x->request_index;
        assert_true(q < 2);
        assert_ptr_equal(x->local_reg->base, f->base);
        assert_int_equal(x->mem_kind, ORB_MEM_HOST);
        assert_int_equal(x->local_offset, r[q].local_addr - f->base + next[q]);
        assert_int_equal(x->remote_addr, r[q].remote_addr + next[q]);
        assert_int_equal(x->rail, x->piece_index % 3);
        assert_int_equal(x->request_remote_addr, r[q].remote_addr);
        assert_int_equal(x->request_length, r[q].length);
        assert_ptr_equal(orb_xfer_local_cpu(x), f->mem + (r[q].local_addr - f->base) + next[q]);
        next[q] += x->length;
        assert_non_null(x->request_private);
        assert_int_equal((uintptr_t)x->request_private % _Alignof(max_align_t), 0);
        if (priv[q] == NULL)
            priv[q] = x->request_private;
        assert_ptr_equal(x->request_private, priv[q]);
        uint64_t written;
        memcpy(&written, x->request_private, sizeof written);
        assert_int_equal(written, r[q].length); /* what the plan left there */
    }
    assert_ptr_not_equal(priv[0], priv[1]);
    assert_int_equal(next[0], 5500);
    assert_int_equal(next[1], 1500);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    complete_all(&rdma_script, 0);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), 0);
    assert_int_equal(rep.completed_bytes, 7000);
    assert_int_equal(orb_batch_free(b), 0);
}

/* A group split across transports: if the first transport refuses, nothing was accepted and
 * the group is rejected; once one accepted, a later refusal fails its requests in the report,
 * unattempted. */
static void test_group_across_transports(void **state)
{
    struct fx *f = *state;
    open_all(f);
    struct orb_request r[2] = {rq(f, ORB_TRANSPORT_RDMA, 0, 10), rq(f, ORB_TRANSPORT_TCP, 100, 10)};
    orb_batch *b;
    struct orb_batch_report rep;

    tcp_script.submit_status = ORB_EPEER; /* TCP submits first (lower slot) */
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_not_equal(orb_batch_submit(b, r, 2), 0);
    assert_int_equal(rdma_script.npending, 0);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), 0);
    assert_int_equal(rep.submitted_requests, 0);
    assert_int_equal(orb_batch_free(b), 0);

    tcp_script.submit_status = 0;
    rdma_script.submit_status = ORB_EPEER;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_submit(b, r, 2), 0);
    assert_int_equal(tcp_script.npending, 1);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    complete_all(&tcp_script, 0);
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), ORB_EPEER);
    assert_int_equal(rep.submitted_requests, 2);
    assert_int_equal(rep.completed_requests, 0);
    assert_true(rep.has_failure);
    assert_int_equal(rep.failure.request_index, 0);
    assert_int_equal(rep.failure.status, ORB_EPEER);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    assert_true(rep.local_drained);
    assert_int_equal(orb_batch_free(b), 0);
}

/* Transport state is made before the range is visible and undone on the release thread after
 * the last pin, before the owner's bytes are released. */
static void test_registration_state_lifecycle(void **state)
{
    struct fx *f = *state;
    open_all(f);
    assert_int_equal(atomic_load(&rdma_script.attaches), 1);
    assert_false(rdma_script.visible_at_attach);
    /* Registering the same range again shares the registration: no second attach. */
    orb_host_memory *owner;
    assert_int_equal(orb_host_memory_alloc(8192, 0, &owner), 0);
    orb_reg_id a, a2;
    assert_int_equal(orb_register_host_memory(f->engine, owner, 0, 8192, ORB_PERM_LOCAL, &a), 0);
    assert_int_equal(orb_register_host_memory(f->engine, owner, 0, 8192, ORB_PERM_LOCAL, &a2), 0);
    assert_int_equal(a, a2);
    assert_int_equal(atomic_load(&rdma_script.attaches), 2);
    assert_int_equal(orb_unregister_memory(f->engine, a), 0);
    assert_int_equal(orb_unregister_memory(f->engine, a), 0);
    wait_for(&rdma_script.retires, 1);
    orb_host_memory_unref(owner);

    /* A piece in flight holds the pin: unregistering retires nothing until it ends. */
    struct orb_request r = rq(f, ORB_TRANSPORT_RDMA, 0, 100);
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_submit(b, &r, 1), 0);
    assert_int_equal(orb_unregister_memory(f->engine, f->id), 0);
    usleep(20000);
    assert_int_equal(atomic_load(&rdma_script.retires), 1);
    assert_int_equal(atomic_load(&f->released), 0);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    complete_all(&rdma_script, 0);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), 0);
    wait_for(&f->released, 1);
    assert_int_equal(atomic_load(&rdma_script.retires), 2);
    assert_true(rdma_script.retire_seq < f->release_seq);
    assert_true(pthread_equal(rdma_script.retire_thread, f->release_thread));
    assert_false(pthread_equal(rdma_script.retire_thread, pthread_self()));
    assert_int_equal(orb_batch_free(b), 0);
    orb_segment_close(f->seg);
    f->seg = NULL;
    orb_engine_free(f->engine);
    f->engine = NULL;
}

/* A transport that cannot attach refuses the registration: nothing is visible, only the new
 * copies are undone, ownership stays with the caller. */
static void test_registration_attach_failure(void **state)
{
    struct fx *f = *state;
    open_all(f);
    /* A single registration. */
    rdma_script.attach_fail_at = 2;
    uint8_t *bytes = malloc(4096);
    assert_non_null(bytes);
    orb_reg_id id;
    assert_int_equal(orb_register_memory(f->engine, bytes, 4096, ORB_PERM_LOCAL, note_release, f,
                                         &id), ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "scripted-rdma"));
    assert_non_null(strstr(orb_last_error(), "budget exhausted"));
    struct orb_local_region region;
    assert_int_equal(orb_resolve_local_address(f->engine, (uint64_t)(uintptr_t)bytes, 1, &region),
                     ORB_ENOENT);
    usleep(10000);
    assert_int_equal(atomic_load(&f->released), 0); /* the caller still owns the bytes */
    free(bytes);

    /* A batch: [existing, new, new, new(fails)]: the two new ones that attached are undone, the
     * existing one keeps exactly its references. */
    orb_host_memory *owner;
    assert_int_equal(orb_host_memory_alloc(4 * 4096, 0, &owner), 0);
    struct orb_host_range ranges[4];
    for (int i = 0; i < 4; i++)
        ranges[i] = (struct orb_host_range){.owner = owner, .offset = (size_t)i * 4096,
                                            .length = 4096, .perm = ORB_PERM_LOCAL};
    orb_reg_id first;
    assert_int_equal(orb_register_host_memory(f->engine, owner, 0, 4096, ORB_PERM_LOCAL, &first), 0);
    int before = atomic_load(&rdma_script.attaches);
    int retired_before = atomic_load(&rdma_script.retires);
    rdma_script.attach_fail_at = before + 3;
    orb_reg_id ids[4] = {0, 0, 0, 0};
    assert_int_equal(orb_register_host_memory_batch(f->engine, ranges, 4, ids), ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "range 3"));
    assert_int_equal(ids[0], 0);
    assert_int_equal(atomic_load(&rdma_script.attaches), before + 3);
    assert_int_equal(atomic_load(&rdma_script.retires), retired_before + 2);
    for (int i = 1; i < 4; i++)
        assert_int_equal(orb_resolve_local_address(f->engine,
                             (uint64_t)(uintptr_t)orb_host_memory_data(owner) + (uint64_t)i * 4096,
                             4096, &region), ORB_ENOENT);
    assert_int_equal(orb_unregister_memory(f->engine, first), 0);
    assert_int_equal(orb_unregister_memory(f->engine, first), ORB_ENOENT);
    rdma_script.attach_fail_at = 0;
    assert_int_equal(orb_register_host_memory_batch(f->engine, ranges, 4, ids), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(orb_unregister_memory(f->engine, ids[i]), 0);
    orb_host_memory_unref(owner);
}

/* State a transport cannot undo keeps the bytes: the owner's release never runs, neither after
 * the last pin (release thread) nor when another transport's attach failure rolls it back. */
static void test_retire_failure_keeps_bytes(void **state)
{
    struct fx *f = *state;
    open_all(f);
    rdma_script.retire_fail = 1;
    orb_host_memory *owner;
    uint8_t *bytes = malloc(4096);
    assert_non_null(bytes);
    memset(bytes, 0x5a, 4096);
    assert_int_equal(orb_host_memory_wrap(bytes, 4096, note_release, f, &owner), 0);
    orb_reg_id id;
    assert_int_equal(orb_register_host_memory(f->engine, owner, 0, 4096, ORB_PERM_LOCAL, &id), 0);
    int retired = atomic_load(&rdma_script.retires);
    assert_int_equal(orb_unregister_memory(f->engine, id), 0);
    orb_host_memory_unref(owner); /* ours; the registration's is the last one */
    wait_for(&rdma_script.retires, retired + 1);
    usleep(20000);
    assert_non_null(rdma_script.kept);
    assert_int_equal(atomic_load(&f->released), 0);
    assert_int_equal(bytes[4095], 0x5a); /* still ours to read: never released */
    /* The engine kept the registration's reference on purpose; drop it here so the test ends
     * without a leak, and the release runs exactly once. */
    orb_host_memory_unref(owner);
    assert_int_equal(atomic_load(&f->released), 1);

    /* A batch refused at its second range rolls the first back; that undo fails too. */
    free(rdma_script.kept);
    rdma_script.kept = NULL;
    bytes = malloc(8192);
    assert_non_null(bytes);
    assert_int_equal(orb_host_memory_wrap(bytes, 8192, note_release, f, &owner), 0);
    struct orb_host_range ranges[2] = {
        {.owner = owner, .offset = 0, .length = 4096, .perm = ORB_PERM_LOCAL},
        {.owner = owner, .offset = 4096, .length = 4096, .perm = ORB_PERM_LOCAL},
    };
    rdma_script.attach_fail_at = atomic_load(&rdma_script.attaches) + 2;
    orb_reg_id ids[2];
    assert_int_equal(orb_register_host_memory_batch(f->engine, ranges, 2, ids), ORB_ERESOURCE);
    assert_non_null(rdma_script.kept);
    orb_host_memory_unref(owner);
    usleep(10000);
    assert_int_equal(atomic_load(&f->released), 1); /* the first release only */
    orb_host_memory_unref(owner);                   /* the reference the rollback kept */
    assert_int_equal(atomic_load(&f->released), 2);
    rdma_script.attach_fail_at = 0;
    rdma_script.retire_fail = 0;
}

/* Freeing the engine retires every registration's state before its transports are destroyed,
 * also when the last handle drops inside a release callback on the release thread. */
static orb_engine *engine_to_drop;
static void drop_engine_in_release(void *ptr, size_t len, void *ctx)
{
    (void)len, (void)ctx;
    free(ptr);
    orb_engine_unref(engine_to_drop);
}
static void test_retire_before_transport_destroy(void **state)
{
    struct fx *f = *state;
    open_all(f);
    orb_engine *e = f->engine;
    /* A second registration stays registered, so the engine's end must retire it. */
    uint8_t *more = malloc(4096);
    assert_non_null(more);
    orb_reg_id keep;
    assert_int_equal(orb_register_memory(e, more, 4096, ORB_PERM_LOCAL, NULL, NULL, &keep), 0);
    uint8_t *trigger = malloc(4096);
    assert_non_null(trigger);
    orb_reg_id tid;
    assert_int_equal(orb_register_memory(e, trigger, 4096, ORB_PERM_LOCAL, drop_engine_in_release,
                                         NULL, &tid), 0);
    orb_segment_close(f->seg);
    f->seg = NULL;
    assert_int_equal(orb_engine_close(e, 1000000000ull), 0);
    /* The release callback holds the last handle: take one for it, drop the user's. */
    engine_to_drop = e;
    orb_engine_ref(e);
    orb_engine_free(e);
    f->engine = NULL;
    free(more); /* wrapped without a callback: the caller keeps ownership of the bytes */
    assert_int_equal(orb_unregister_memory(e, tid), 0); /* the engine lives: one handle left */
    wait_for(&rdma_script.destroyed, 1);
    /* Three registrations were attached (f->mem, more, trigger); all retired before destroy. */
    assert_int_equal(atomic_load(&rdma_script.retires), 3);
    assert_int_equal(atomic_load(&rdma_script.retire_violations), 0);
    assert_int_equal(atomic_load(&f->released), 1);
}

/* A transport that cannot prove its work ended makes close fail with ORB_EUNQUIESCED naming it:
 * the engine stays unstopped, the work stays pending and the registration's bytes stay held; a
 * later close asks again and, once the transport proves it, ends the work and stops. */
static void test_close_keeps_what_a_transport_cannot_prove_ended(void **state)
{
    struct fx *f = *state;
    open_all(f);
    struct orb_request r = rq(f, ORB_TRANSPORT_RDMA, 0, 100);
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_submit(b, &r, 1), 0);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    rdma_script.unquiesced_stops = 1;
    assert_int_equal(orb_engine_close(f->engine, 20000000ull), ORB_EUNQUIESCED);
    assert_non_null(strstr(orb_last_error(), "scripted-rdma"));
    assert_non_null(strstr(orb_last_error(), "quiescence"));
    assert_int_equal(atomic_load(&tcp_script.stops), 1); /* every transport was asked */
    assert_int_equal(rdma_script.npending, 1);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_poll(b, &rep), ORB_EAGAIN);
    assert_int_equal(orb_unregister_memory(f->engine, f->id), 0);
    assert_int_equal(atomic_load(&f->released), 0); /* the pending work still holds the bytes */
    assert_int_equal(orb_engine_close(f->engine, 20000000ull), 0);
    assert_int_equal(atomic_load(&rdma_script.stops), 2);
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), ORB_ECLOSED);
    assert_int_equal(orb_batch_free(b), 0);
    orb_segment_close(f->seg);
    f->seg = NULL;
    orb_engine_free(f->engine);
    f->engine = NULL;
    assert_int_equal(atomic_load(&f->released), 1);
}

/* The public request has room to grow: bits and words this library does not know refuse the
 * request instead of being ignored; the layout is fixed. */
static void test_request_room_to_grow(void **state)
{
    struct fx *f = *state;
    open_all(f);
    _Static_assert(sizeof(struct orb_request) == 72, "orb_request keeps its size");
    _Static_assert(sizeof(struct orb_region_desc) == 56, "orb_region_desc keeps its size");
    _Static_assert(offsetof(struct orb_request, comp_mask) == 36, "comp_mask after priority");
    struct orb_request r = rq(f, ORB_TRANSPORT_TCP, 0, 10);
    struct orb_batch_report rep;
    r.comp_mask = 0x4;
    assert_int_equal(orb_submit_and_wait(f->engine, f->seg, &r, 1, NULL, 1000000000ull, &rep),
                     ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "comp_mask 0x4"));
    assert_int_equal(rep.failure.request_index, 0);
    r.comp_mask = 0;
    r.reserved[3] = 1;
    assert_int_equal(orb_submit_and_wait(f->engine, f->seg, &r, 1, NULL, 1000000000ull, &rep),
                     ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "reserved[3]"));
    assert_int_equal(tcp_script.npending, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_requests_honour_transport, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_rdma_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_transport_not_on_this_host, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pieces_follow_the_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_across_transports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registration_state_lifecycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retire_failure_keeps_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registration_attach_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retire_before_transport_destroy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_keeps_what_a_transport_cannot_prove_ended, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_room_to_grow, setup, teardown),
    };
    return cmocka_run_group_tests_name("transports", tests, NULL, NULL);
}
