/* The TCP transport: its operation table, start/stop, and the epoll workers that own every
 * connection's I/O. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/cpus.h"
#include "core/error.h"
#include "core/log.h"
#include "tcp_internal.h"
#include "core/thread_name.h"

#define TCP_EPOLL_BATCH 64

/* ---- workers -------------------------------------------------------------------------------- */

struct tcp_worker *tcp_next_worker(struct tcp_transport *tp)
{
    unsigned i = atomic_fetch_add_explicit(&tp->next_worker, 1, memory_order_relaxed);
    return &tp->workers[i % tp->nworkers];
}

static void worker_wake(struct tcp_worker *w)
{
    uint64_t one = 1;
    ssize_t n;
    do {
        n = write(w->wakefd, &one, sizeof one);
    } while (n < 0 && errno == EINTR);
    /* EAGAIN means the counter is already non-zero: the worker will wake anyway. */
}

void tcp_worker_kick(struct tcp_worker *w)
{
    atomic_store(&w->scan_requested, 1);
    worker_wake(w);
}

void tcp_worker_poke(struct tcp_worker *w, struct tcp_conn *c)
{
    pthread_mutex_lock(&w->lock);
    int wake = !c->poked;
    if (wake) {
        c->poked = 1;
        c->poke_next = w->pokes;
        w->pokes = c;
    }
    pthread_mutex_unlock(&w->lock);
    if (wake)
        worker_wake(w);
}

/* The next poked connection, or NULL (worker thread). */
static struct tcp_conn *worker_pop_poke(struct tcp_worker *w)
{
    pthread_mutex_lock(&w->lock);
    struct tcp_conn *c = w->pokes;
    if (c != NULL) {
        w->pokes = c->poke_next;
        c->poke_next = NULL;
        c->poked = 0;
    }
    pthread_mutex_unlock(&w->lock);
    return c;
}

int tcp_worker_handover(struct tcp_worker *w, struct tcp_conn *c)
{
    pthread_mutex_lock(&w->lock);
    if (w->exiting) {
        pthread_mutex_unlock(&w->lock);
        return orb_fail(ORB_ECLOSED, "the TCP transport is stopping");
    }
    c->worker = w;
    c->turn_left = &w->turn_left;
    c->inbox_next = w->inbox;
    w->inbox = c;
    pthread_mutex_unlock(&w->lock);
    worker_wake(w);
    return 0;
}

void tcp_worker_defer(struct tcp_worker *w, struct tcp_conn *c)
{
    if (c->in_ready)
        return;
    c->in_ready = 1;
    c->ready_next = NULL;
    if (w->ready_tail != NULL)
        w->ready_tail->ready_next = c;
    else
        w->ready_head = c;
    w->ready_tail = c;
}

static struct tcp_conn *worker_pop_ready(struct tcp_worker *w)
{
    struct tcp_conn *c = w->ready_head;
    if (c == NULL)
        return NULL;
    w->ready_head = c->ready_next;
    if (w->ready_head == NULL)
        w->ready_tail = NULL;
    c->ready_next = NULL;
    c->in_ready = 0;
    return c;
}

void tcp_worker_forget(struct tcp_worker *w, struct tcp_conn *c)
{
    pthread_mutex_lock(&w->lock);
    if (c->poked) {
        struct tcp_conn **pp = &w->pokes;
        while (*pp != NULL && *pp != c)
            pp = &(*pp)->poke_next;
        if (*pp == c)
            *pp = c->poke_next;
        c->poke_next = NULL;
        c->poked = 0;
    }
    pthread_mutex_unlock(&w->lock);
    if (c->in_ready) {
        struct tcp_conn *prev = NULL;
        for (struct tcp_conn *r = w->ready_head; r != NULL; prev = r, r = r->ready_next) {
            if (r != c)
                continue;
            if (prev != NULL)
                prev->ready_next = c->ready_next;
            else
                w->ready_head = c->ready_next;
            if (w->ready_tail == c)
                w->ready_tail = prev;
            break;
        }
        c->in_ready = 0;
        c->ready_next = NULL;
    }
    if (c->adopted && c->fd >= 0)
        (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    c->adopted = 0;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else if (w->conns == c)
        w->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

/* Tear a connection down for good (worker thread). */
static void conn_kill(struct tcp_conn *c, int status)
{
    if (c->kind == TCP_KIND_SOURCE)
        tcp_source_conn_kill((struct tcp_source_conn *)(void *)c, "the transport is stopping");
    else
        tcp_req_conn_kill((struct tcp_req_conn *)(void *)c, status);
}

static void worker_link(struct tcp_worker *w, struct tcp_conn *c)
{
    c->prev = NULL;
    c->next = w->conns;
    if (w->conns != NULL)
        w->conns->prev = c;
    w->conns = c;
}

static void worker_serve(struct tcp_worker *w, struct tcp_conn *c, uint32_t events);

/* Link and watch `c`. Returns 0, or -1 when it could not be watched and was torn down. */
static int worker_adopt(struct tcp_worker *w, struct tcp_conn *c)
{
    worker_link(w, c);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c};
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
        ORB_LOGE("tcp: cannot watch connection %s: %s", c->name, strerror(errno));
        conn_kill(c, ORB_EUNAVAILABLE);
        return -1;
    }
    c->adopted = 1;
    tcp_conn_touch(c);
    if (c->serve_on_adopt) {
        /* Bytes may be staged already, with no new data to raise an event. */
        c->serve_on_adopt = 0;
        worker_serve(w, c, 0);
    }
    return 0;
}

int tcp_worker_adopt_now(struct tcp_worker *w, struct tcp_conn *c)
{
    c->worker = w;
    c->turn_left = &w->turn_left;
    c->serve_on_adopt = 1;
    return worker_adopt(w, c);
}

static struct tcp_conn *worker_take_inbox(struct tcp_worker *w, int exiting)
{
    pthread_mutex_lock(&w->lock);
    struct tcp_conn *list = w->inbox;
    w->inbox = NULL;
    if (exiting)
        w->exiting = 1;
    pthread_mutex_unlock(&w->lock);
    return list;
}

static void worker_scan(struct tcp_worker *w, uint64_t now)
{
    if (w->index == 0 && !tcp_source_admits(w->tp))
        tcp_listener_close(w->tp);
    /* Also picks up connections an accept failure (EMFILE) left waiting without a new edge.
     * Before the walk below: accepting may drop a stranger the walk would visit. */
    if (w->index == 0 && w->tp->listen_fd >= 0)
        tcp_listener_on_event(w);
    struct tcp_conn *c = w->conns;
    while (c != NULL) {
        struct tcp_conn *next = c->next; /* the scan may tear `c` down */
        w->turn_left = TCP_TURN_BYTES;
        if (c->kind == TCP_KIND_SOURCE)
            tcp_source_conn_scan((struct tcp_source_conn *)(void *)c, now);
        else
            tcp_req_conn_scan((struct tcp_req_conn *)(void *)c, now);
        c = next;
    }
}

/* Serve one connection for one turn. */
static void worker_serve(struct tcp_worker *w, struct tcp_conn *c, uint32_t events)
{
    w->turn_left = TCP_TURN_BYTES;
    if (c->kind == TCP_KIND_SOURCE)
        tcp_source_conn_on_event((struct tcp_source_conn *)(void *)c, events);
    else
        tcp_req_conn_on_event((struct tcp_req_conn *)(void *)c, events);
}

static void worker_dispatch(struct tcp_worker *w, const struct epoll_event *ev)
{
    enum tcp_kind *kind = ev->data.ptr;
    switch (*kind) {
    case TCP_KIND_WAKE: {
        uint64_t v;
        while (read(w->wakefd, &v, sizeof v) < 0 && errno == EINTR) {
        }
        break;
    }
    case TCP_KIND_LISTENER:
        /* Accepted after the batch: accepting may drop the oldest stranger, whose own event may
         * still be further down this batch. */
        w->tp->listen_more = 1;
        break;
    case TCP_KIND_SOURCE:
    case TCP_KIND_REQUESTER:
        worker_serve(w, (struct tcp_conn *)(void *)kind, ev->events);
        break;
    }
}

static void *worker_main(void *arg)
{
    struct tcp_worker *w = arg;
    orb_thread_name("tcp-%u", w->index);
    struct tcp_transport *tp = w->tp;
    struct epoll_event events[TCP_EPOLL_BATCH];
    uint64_t next_scan = orb_now_ns() + TCP_SCAN_NS;

    while (!atomic_load(&tp->stopping)) {
        int busy = w->ready_head != NULL || (w->index == 0 && tp->listen_more);
        int timeout = busy ? 0 : orb_deadline_poll_ms(next_scan);
        int n = epoll_wait(w->epfd, events, TCP_EPOLL_BATCH, timeout);
        if (n < 0 && errno != EINTR) {
            ORB_LOGE("tcp: epoll_wait failed: %s", strerror(errno));
            n = 0;
        }
        for (int i = 0; i < n; i++)
            worker_dispatch(w, &events[i]);
        /* The listener is edge-triggered: its event, or a batch that stopped early, is served
         * here, once no event of this batch can name a connection it drops. */
        if (w->index == 0 && tp->listen_more)
            tcp_listener_on_event(w);

        /* Connections that application threads handed back (a deferred response, a deferred
         * teardown). Popped one at a time: serving one may forget another. */
        for (struct tcp_conn *p; (p = worker_pop_poke(w)) != NULL;)
            worker_serve(w, p, 0);

        /* One more turn for each connection that had work left (they may queue again). */
        size_t ready = 0;
        for (struct tcp_conn *r = w->ready_head; r != NULL; r = r->ready_next)
            ready++;
        for (; ready > 0; ready--) {
            struct tcp_conn *r = worker_pop_ready(w);
            if (r == NULL)
                break;
            worker_serve(w, r, 0);
        }

        struct tcp_conn *c = worker_take_inbox(w, 0);
        while (c != NULL) {
            struct tcp_conn *next = c->inbox_next;
            (void)worker_adopt(w, c);
            c = next;
        }
        uint64_t now = orb_now_ns();
        if (atomic_exchange(&w->scan_requested, 0) || now >= next_scan) {
            worker_scan(w, now);
            next_scan = now + TCP_SCAN_NS;
        }
    }

    /* Stopping: take the last handovers, then end every connection. */
    struct tcp_conn *c = worker_take_inbox(w, 1);
    while (c != NULL) {
        struct tcp_conn *next = c->inbox_next;
        worker_link(w, c);
        c = next;
    }
    if (w->index == 0)
        tcp_listener_close(tp);
    while (w->conns != NULL)
        conn_kill(w->conns, ORB_ECLOSED);
    return NULL;
}

/* ---- transport life cycle ------------------------------------------------------------------- */

static void transport_free(struct tcp_transport *tp)
{
    if (tp->listen_fd >= 0)
        close(tp->listen_fd);
    for (uint32_t i = 0; tp->workers != NULL && i < tp->nworkers; i++) {
        struct tcp_worker *w = &tp->workers[i];
        if (w->epfd >= 0)
            close(w->epfd);
        if (w->wakefd >= 0)
            close(w->wakefd);
        free(w->scratch);
        pthread_mutex_destroy(&w->lock);
    }
    free(tp->workers);
    pthread_mutex_destroy(&tp->stop_lock);
    free(tp);
}

void tcp_transport_unref(struct tcp_transport *tp)
{
    if (tp != NULL && atomic_fetch_sub(&tp->refs, 1) == 1)
        transport_free(tp);
}

int tcp_source_admits(struct tcp_transport *tp)
{
    return !atomic_load(&tp->source_closed) && orb_engine_source_open(tp->engine);
}

static int worker_init(struct tcp_transport *tp, struct tcp_worker *w, uint32_t index)
{
    w->tp = tp;
    w->index = index;
    w->wake_kind = TCP_KIND_WAKE;
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    w->scratch = malloc(TCP_SCRATCH_LEN);
    pthread_mutex_init(&w->lock, NULL);
    atomic_init(&w->scan_requested, 0);
    if (w->epfd < 0 || w->wakefd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "tcp worker %u: cannot create epoll/eventfd: %s", index,
                        strerror(errno));
    if (w->scratch == NULL)
        return orb_fail(ORB_ENOMEM, "tcp worker %u: out of memory", index);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &w->wake_kind};
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->wakefd, &ev) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "tcp worker %u: cannot watch its eventfd: %s", index,
                        strerror(errno));
    return 0;
}

static uint32_t clamp_u32(uint32_t v, uint32_t lo, uint32_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static int tcp_stop(void *tp_, uint64_t deadline);

static int tcp_start(orb_engine *engine, void **tp_out)
{
    const struct orb_engine_config *cfg = orb_engine_cfg(engine);
    struct tcp_transport *tp = calloc(1, sizeof *tp);
    if (tp == NULL)
        return orb_fail(ORB_ENOMEM, "cannot allocate the TCP transport");
    tp->engine = engine;
    atomic_init(&tp->refs, 1);
    tp->nstripes = clamp_u32(cfg->tcp_stripes, 1, TCP_MAX_STRIPES);
    /* Both ends of a same-host stripe run on this host's CPUs: more stripes than half of them
     * only add threads that take turns on a CPU and pass the payload between caches. */
    tp->local_stripes = cfg->tcp_local_stripes != 0
                            ? clamp_u32(cfg->tcp_local_stripes, 1, TCP_MAX_STRIPES)
                            : clamp_u32(orb_usable_cpus() / 2, 1, tp->nstripes);
    tp->stripe_threshold = cfg->tcp_stripe_threshold;
    tp->socket_buffer = cfg->tcp_socket_buffer;
    tp->io_timeout_ns = (uint64_t)cfg->io_timeout_s * ORB_NS_PER_SEC;
    tp->max_connections = cfg->max_connections;
    tp->max_strangers = cfg->max_unauthenticated;
    tp->hello_timeout_ns = (uint64_t)cfg->hello_timeout_ms * 1000000ull;
    tp->listen_kind = TCP_KIND_LISTENER;
    tp->listen_fd = -1;
    atomic_init(&tp->next_worker, 0);
    atomic_init(&tp->source_closed, 0);
    atomic_init(&tp->source_conns, 0);
    atomic_init(&tp->authed_conns, 0);
    atomic_init(&tp->stopping, 0);
    atomic_init(&tp->calls_abandoned, 0);
    atomic_init(&tp->inflight_xfers, 0);
    atomic_init(&tp->source_pins, 0);
    pthread_mutex_init(&tp->stop_lock, NULL);

    tp->nworkers = clamp_u32(cfg->tcp_workers, 1, TCP_MAX_WORKERS);
    tp->workers = calloc(tp->nworkers, sizeof *tp->workers);
    if (tp->workers == NULL) {
        free(tp);
        return orb_fail(ORB_ENOMEM, "cannot allocate the TCP workers");
    }
    int rc = 0;
    for (uint32_t i = 0; i < tp->nworkers; i++) {
        tp->workers[i].epfd = tp->workers[i].wakefd = -1;
        if (rc == 0)
            rc = worker_init(tp, &tp->workers[i], i);
        else
            pthread_mutex_init(&tp->workers[i].lock, NULL); /* transport_free destroys it */
    }
    if (rc == 0 && cfg->enable_source) {
        tp->has_source = 1;
        rc = tcp_source_listen(tp);
    } else if (rc == 0) {
        atomic_store(&tp->source_closed, 1);
    }
    for (uint32_t i = 0; rc == 0 && i < tp->nworkers; i++) {
        struct tcp_worker *w = &tp->workers[i];
        int err = pthread_create(&w->thread, NULL, worker_main, w);
        if (err != 0)
            rc = orb_fail(ORB_EUNAVAILABLE, "cannot start TCP worker %u: %s", i, strerror(err));
        else
            w->thread_started = 1;
    }
    if (rc != 0) {
        (void)tcp_stop(tp, 0);
        tcp_transport_unref(tp);
        return rc;
    }
    *tp_out = tp;
    return 0;
}

static int tcp_endpoint(void *tp_, char *buf, size_t len)
{
    struct tcp_transport *tp = tp_;
    if (!tp->has_source)
        return orb_fail(ORB_EUNAVAILABLE, "this engine runs no source service");
    size_t need = strlen(tp->endpoint) + 1;
    if (buf == NULL || len < need)
        return orb_fail(ORB_EINVAL, "endpoint buffer of %zu bytes, need %zu", len, need);
    memcpy(buf, tp->endpoint, need);
    return 0;
}

static void tcp_close_source(void *tp_)
{
    struct tcp_transport *tp = tp_;
    if (atomic_exchange(&tp->source_closed, 1))
        return;
    pthread_mutex_lock(&tp->stop_lock);
    if (!tp->stopped)
        for (uint32_t i = 0; i < tp->nworkers; i++)
            tcp_worker_kick(&tp->workers[i]);
    pthread_mutex_unlock(&tp->stop_lock);
}

/* Joining the workers proves quiescence: only they touch memory (sockets copy out of it). */
static int tcp_stop(void *tp_, uint64_t deadline)
{
    (void)deadline;
    struct tcp_transport *tp = tp_;
    pthread_mutex_lock(&tp->stop_lock);
    if (!tp->stopped) {
        atomic_store(&tp->source_closed, 1);
        atomic_store(&tp->stopping, 1);
        for (uint32_t i = 0; i < tp->nworkers; i++)
            if (tp->workers[i].wakefd >= 0)
                tcp_worker_kick(&tp->workers[i]);
        for (uint32_t i = 0; i < tp->nworkers; i++) {
            struct tcp_worker *w = &tp->workers[i];
            if (w->thread_started)
                pthread_join(w->thread, NULL);
            w->thread_started = 0;
            pthread_mutex_lock(&w->lock);
            w->exiting = 1;
            pthread_mutex_unlock(&w->lock);
        }
        tp->stopped = 1;
    }
    pthread_mutex_unlock(&tp->stop_lock);
    return 0;
}

static void tcp_destroy(void *tp_)
{
    struct tcp_transport *tp = tp_;
    if (tp == NULL)
        return;
    (void)tcp_stop(tp, 0);
    tcp_transport_unref(tp);
}

static uint64_t tcp_inflight(void *tp_)
{
    struct tcp_transport *tp = tp_;
    return atomic_load(&tp->inflight_xfers) + atomic_load(&tp->source_pins);
}

const struct orb_transport_ops orb_tcp_transport = {
    .id = ORB_TRANSPORT_TCP,
    .name = "tcp",
    .stages_through_cpu = 1,
    .start = tcp_start,
    .endpoint = tcp_endpoint,
    .close_source = tcp_close_source,
    .stop = tcp_stop,
    .abandon_calls = tcp_abandon_calls,
    .destroy = tcp_destroy,
    .inflight = tcp_inflight,
    .peer_open = tcp_peer_open,
    .peer_describe = tcp_peer_describe,
    .peer_control = tcp_peer_control,
    .peer_lost = tcp_peer_lost,
    .peer_plan = tcp_peer_plan,
    .peer_submit = tcp_peer_submit,
    .peer_release = tcp_peer_release,
};
