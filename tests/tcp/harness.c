/* Test doubles for the engine side of the TCP transport (see harness.h). */
#include "harness.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/config.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/stage_pool.h"
#include "wire/wire.h"

static pthread_mutex_t th_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t th_cond;
static pthread_once_t th_once = PTHREAD_ONCE_INIT;
static int th_notify_status;

static void th_init_once(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&th_cond, &attr);
    pthread_condattr_destroy(&attr);
}

/* ---- what the transport calls ---------------------------------------------------------------- */

const struct orb_engine_config *orb_engine_cfg(const orb_engine *engine)
{
    return &engine->cfg;
}

struct orb_registry *orb_engine_registry(orb_engine *engine)
{
    return engine->registry;
}

struct orb_stage_pool *orb_engine_stage_pool(orb_engine *engine)
{
    return engine->stage_pool;
}

const struct orb_epoch *orb_engine_epoch(const orb_engine *engine)
{
    return &engine->epoch;
}

int orb_engine_source_open(const orb_engine *engine)
{
    return atomic_load(&engine->source_open);
}

/* The source's metrics: counted here so that tests can see what the transport reports. */
void orb_engine_count_served(orb_engine *engine, unsigned tp, unsigned op, uint64_t bytes, int ends, int status)
{
    (void)tp;
    pthread_mutex_lock(&th_lock);
    if (status == 0) {
        engine->served_bytes[op & 1] += bytes;
        engine->served_requests[op & 1] += ends != 0;
    } else {
        engine->served_failed[op & 1]++;
    }
    pthread_mutex_unlock(&th_lock);
}

int orb_engine_deliver_notification(orb_engine *engine, const struct orb_epoch *sender,
                                    const uint8_t *data, uint32_t len)
{
    int rc = 0;
    pthread_mutex_lock(&th_lock);
    if (!atomic_load(&engine->source_open))
        rc = ORB_ECLOSED;
    else if (th_notify_status != 0)
        rc = th_notify_status;
    else if (engine->nnotes == TH_MAX_NOTES || len > ORB_NOTIFY_MAX)
        rc = ORB_ERESOURCE;
    if (rc == 0) {
        struct orb_notification_msg *m = &engine->notes[engine->nnotes++];
        m->sender = *sender;
        m->length = len;
        memcpy(m->data, data, len);
    }
    pthread_mutex_unlock(&th_lock);
    return rc;
}

int orb_engine_control(orb_engine *engine, uint8_t transport, const struct orb_epoch *sender,
                       const uint8_t *req, size_t len, uint8_t *resp, size_t cap, size_t *resp_len)
{
    pthread_mutex_lock(&th_lock);
    engine->control_sender = *sender;
    engine->control_calls++;
    pthread_mutex_unlock(&th_lock);
    if (engine->control == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "harness: no transport %u here", (unsigned)transport);
    return engine->control(engine, transport, req, len, resp, cap, resp_len);
}

int orb_xfer_may_start(struct orb_xfer *x)
{
    atomic_fetch_add(&((struct th_xfer *)x)->may_start_calls, 1);
    return x->batch == NULL || !atomic_load(&x->batch->withdraw);
}

void orb_xfer_done(struct orb_xfer *x, int status, enum orb_remote_effect effect)
{
    orb_xfer_done_why(x, status, effect, NULL);
}

void orb_xfer_done_why(struct orb_xfer *x, int status, enum orb_remote_effect effect, const char *why)
{
    struct th_xfer *t = (struct th_xfer *)x;
    pthread_mutex_lock(&th_lock);
    t->done_calls++;
    t->status = status;
    t->effect = effect;
    snprintf(t->why, sizeof t->why, "%s", why != NULL ? why : "");
    pthread_cond_broadcast(&th_cond);
    pthread_mutex_unlock(&th_lock);
}

/* ---- engines --------------------------------------------------------------------------------- */

orb_engine *th_engine_new(const struct orb_engine_config *cfg)
{
    pthread_once(&th_once, th_init_once);
    orb_engine *e = calloc(1, sizeof *e);
    assert_non_null(e);
    if (cfg != NULL) {
        e->cfg = *cfg;
    } else {
        assert_int_equal(orb_engine_config_init(&e->cfg), 0);
        e->cfg.tcp_stripes = 2;
        e->cfg.tcp_local_stripes = 2; /* two stripes whatever the CPUs */
        e->cfg.tcp_workers = 2;
        e->cfg.io_timeout_s = 5;
    }
    assert_int_equal(getrandom(e->epoch.bytes, sizeof e->epoch.bytes, 0),
                     (ssize_t)sizeof e->epoch.bytes);
    assert_int_equal(orb_registry_new(e->cfg.max_registrations, NULL, NULL, &e->registry), 0);
    assert_int_equal(orb_stage_pool_new(ORB_STAGE_CHUNK, ORB_STAGE_POOL_BYTES, ORB_STAGE_SOURCE_RESERVE,
                                        &e->stage_pool), 0);
    atomic_init(&e->source_open, e->cfg.enable_source ? 1 : 0);
    assert_int_equal(orb_tcp_transport.start(e, &e->tp), 0);
    return e;
}

void th_engine_free(orb_engine *e)
{
    if (e == NULL)
        return;
    (void)orb_tcp_transport.stop(e->tp, 0);
    assert_int_equal(orb_tcp_transport.inflight(e->tp), 0);
    orb_tcp_transport.destroy(e->tp);
    orb_stage_pool_free(e->stage_pool);
    orb_registry_free(e->registry);
    free(e);
}

void th_endpoint(orb_engine *e, char *buf, size_t len)
{
    assert_int_equal(orb_tcp_transport.endpoint(e->tp, buf, len), 0);
}

void th_fill(uint8_t *p, size_t len, uint8_t seed)
{
    uint32_t v = 0x9e3779b9u * (seed + 1u);
    for (size_t i = 0; i < len; i++) {
        v = v * 1664525u + 1013904223u;
        p[i] = (uint8_t)(v >> 24);
    }
}

uint8_t *th_region(orb_engine *e, size_t len, enum orb_perm perm, uint8_t seed,
                   orb_host_memory **owner_out)
{
    orb_host_memory *owner = NULL;
    assert_int_equal(orb_host_memory_alloc(len, 0, &owner), 0);
    orb_reg_id id;
    assert_int_equal(orb_registry_add(e->registry, owner, 0, len, perm, &id), 0);
    uint8_t *p = orb_host_memory_data(owner);
    th_fill(p, len, seed);
    *owner_out = owner;
    return p;
}

void *th_open(orb_engine *req, orb_engine *src)
{
    char ep[ORB_ENDPOINT_MAX];
    th_endpoint(src, ep, sizeof ep);
    void *peer = NULL;
    assert_int_equal(orb_tcp_transport.peer_open(req->tp, ep, &src->epoch,
                                                 orb_deadline_after(5 * TH_SEC), NULL, &peer),
                     0);
    assert_non_null(peer);
    return peer;
}

/* ---- xfers ----------------------------------------------------------------------------------- */

void th_xfer_init(struct th_xfer *t, enum orb_xfer_op op, void *local, const void *remote,
                  uint64_t length, struct orb_batch *batch)
{
    memset(t, 0, sizeof *t);
    atomic_init(&t->may_start_calls, 0);
    t->x.op = (uint8_t)op;
    /* The transport sees local bytes as a registration and an offset, as the core hands them. */
    t->reg.base = (uint64_t)(uintptr_t)local;
    t->reg.len = length;
    t->reg.kind = &orb_memkind_host;
    if (op == ORB_XFER_NOTIFY) {
        t->x.notify_data = local;
    } else {
        t->x.local_reg = &t->reg;
        t->x.local_offset = 0;
    }
    t->x.remote_addr = (uint64_t)(uintptr_t)remote;
    t->x.length = length;
    t->x.request_remote_addr = t->x.remote_addr; /* a request of one slice */
    t->x.request_length = length;
    t->x.batch = batch;
    t->status = 1; /* not a status: "not completed" */
}

int th_wait(struct th_xfer *t, size_t n, uint64_t timeout_ns)
{
    uint64_t deadline = orb_deadline_after(timeout_ns);
    struct timespec ts = orb_deadline_timespec(deadline);
    pthread_mutex_lock(&th_lock);
    size_t i = 0;
    int rc = 0;
    while (i < n) {
        if (t[i].done_calls > 0) {
            i++;
            continue;
        }
        if (pthread_cond_timedwait(&th_cond, &th_lock, &ts) == ETIMEDOUT) {
            rc = t[i].done_calls > 0 ? 0 : -1;
            if (rc != 0)
                break;
        }
    }
    pthread_mutex_unlock(&th_lock);
    return rc;
}

int th_done_calls(const struct th_xfer *t)
{
    pthread_mutex_lock(&th_lock);
    int calls = t->done_calls;
    pthread_mutex_unlock(&th_lock);
    return calls;
}

int th_run(void *peer, struct th_xfer *t, uint64_t timeout_ns)
{
    struct orb_xfer *xp = &t->x;
    assert_int_equal(orb_tcp_transport.peer_submit(peer, &xp, 1), 0);
    assert_int_equal(th_wait(t, 1, timeout_ns), 0);
    assert_int_equal(th_done_calls(t), 1);
    return t->status;
}

/* ---- logs ------------------------------------------------------------------------------------ */

static char th_log_buf[16384];
static size_t th_log_len;

static void th_log_sink(enum orb_log_level level, const char *message, void *ctx)
{
    (void)ctx;
    if (level > ORB_LOG_WARN)
        return;
    pthread_mutex_lock(&th_lock);
    int n = snprintf(th_log_buf + th_log_len, sizeof th_log_buf - th_log_len, "%s\n", message);
    if (n > 0 && (size_t)n < sizeof th_log_buf - th_log_len)
        th_log_len += (size_t)n;
    pthread_mutex_unlock(&th_lock);
}

void th_log_capture(void)
{
    pthread_mutex_lock(&th_lock);
    th_log_len = 0;
    th_log_buf[0] = '\0';
    pthread_mutex_unlock(&th_lock);
    orb_log_set_handler(th_log_sink, NULL);
}

int th_log_contains(const char *needle)
{
    pthread_mutex_lock(&th_lock);
    int found = strstr(th_log_buf, needle) != NULL;
    pthread_mutex_unlock(&th_lock);
    return found;
}

void th_log_stop(void)
{
    orb_log_set_handler(NULL, NULL);
}

/* ---- notifications --------------------------------------------------------------------------- */

size_t th_notes(orb_engine *e, struct orb_notification_msg *out, size_t index)
{
    pthread_mutex_lock(&th_lock);
    size_t n = e->nnotes;
    if (out != NULL && index < n)
        *out = e->notes[index];
    pthread_mutex_unlock(&th_lock);
    return n;
}

void th_set_notify_status(int status)
{
    pthread_mutex_lock(&th_lock);
    th_notify_status = status;
    pthread_mutex_unlock(&th_lock);
}

/* ---- raw sockets ----------------------------------------------------------------------------- */

int th_raw_connect(orb_engine *e)
{
    char ep[ORB_ENDPOINT_MAX], host[ORB_ENDPOINT_MAX];
    uint16_t port;
    th_endpoint(e, ep, sizeof ep);
    assert_int_equal(orb_endpoint_split(ep, host, sizeof host, &port), 0);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    assert_int_equal(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

int th_raw_hello(int fd, orb_engine *e, int right_epoch)
{
    struct orb_wire_hello h = {.expected = e->epoch, .role = ORB_WIRE_ROLE_CONTROL};
    if (!right_epoch)
        h.expected.bytes[0] ^= 0xff;
    uint8_t buf[ORB_WIRE_HEADER_LEN + 512];
    size_t len;
    assert_int_equal(orb_wire_hello_encode(&h, buf, sizeof buf, &len), 0);
    assert_int_equal(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
    assert_int_equal(recv(fd, buf, ORB_WIRE_HEADER_LEN, MSG_WAITALL), ORB_WIRE_HEADER_LEN);
    struct orb_wire_header hdr;
    assert_int_equal(orb_wire_header_decode(buf, &hdr), 0);
    assert_true(hdr.body_len <= 512);
    assert_int_equal(recv(fd, buf, hdr.body_len, MSG_WAITALL), (ssize_t)hdr.body_len);
    return hdr.type;
}

int th_raw_closed(int fd, uint64_t timeout_ns)
{
    uint64_t deadline = orb_deadline_after(timeout_ns);
    uint8_t sink[4096];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = orb_deadline_poll_ms(deadline);
        if (poll(&p, 1, ms) <= 0)
            return 0;
        ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return 1;
    }
}
