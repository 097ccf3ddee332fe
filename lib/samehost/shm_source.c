/* The same-host transport's source: the Unix socket requesters connect to, and per connection a
 * socket thread (the proof, SETUP, MAP/UNMAP) and a ring thread that serves requests by copying
 * between this engine's registrations and the requester's mapped buffers. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/thread_name.h"
#include "samehost/shm_internal.h"

#define ACCEPT_POLL_MS 100
#define SOCKET_SLICE_NS (100ull * 1000 * 1000)

/* A requester buffer mapped here; slot `map_id - 1` of its connection's table. */
struct shm_map {
    uint8_t *ptr;               /* NULL: the slot is free */
    uint64_t length;
    bool writable;
    bool retired;               /* UNMAP came while the ring thread used it */
    uint32_t users;
};

struct shm_conn {
    struct shm_conn *next;
    struct shm_tp *tp;
    int sock;
    pthread_t thread;           /* the socket thread */
    pthread_t ring_thread;
    bool ring_started;
    atomic_bool quit;           /* both threads end */
    atomic_bool finished;       /* the socket thread ended: join and free */
    /* Under the transport's lock: a stranger (not yet proved) draws from max_unauthenticated,
     * a proved connection from max_connections; an evicted stranger is on its way out. Atomic
     * only so that no wider load of them touches the fields beside them, which the
     * connection's own thread writes without that lock. */
    atomic_bool proved, evicted;
    uint64_t accepted_ns;
    uint32_t peer_pid;
    /* The rings, once SETUP mapped them. */
    uint8_t *rings;
    uint64_t rings_len;
    struct orb_sh_ring req;     /* consumer */
    struct orb_sh_ring cpl;     /* producer */
    pthread_mutex_t maps_lock;
    struct shm_map *maps;       /* ORB_SHM_MAPS_MAX slots */
    uint64_t mapped_bytes;
};

/* ---- maps ------------------------------------------------------------------------------------ */

static void map_unmap_locked(struct shm_conn *c, struct shm_map *m)
{
    munmap(m->ptr, (size_t)m->length);
    c->mapped_bytes -= m->length;
    pthread_mutex_lock(&c->tp->lock);
    c->tp->mapped_bytes -= m->length;
    pthread_mutex_unlock(&c->tp->lock);
    memset(m, 0, sizeof *m);
}

static int map_add(struct shm_conn *c, const struct orb_shm_map *mm, uint64_t file_offset, int fd)
{
    if (mm->map_id == 0 || mm->map_id > ORB_SHM_MAPS_MAX)
        return orb_fail(ORB_EINVAL, "shm: buffer id %u is outside 1..%u", mm->map_id, ORB_SHM_MAPS_MAX);
    struct shm_tp *tp = c->tp;
    pthread_mutex_lock(&c->maps_lock);
    struct shm_map *m = &c->maps[mm->map_id - 1];
    int rc = 0;
    if (m->ptr != NULL) {
        rc = orb_fail(ORB_EEXIST, "shm: buffer id %u is in use", mm->map_id);
        goto unlock_maps;
    }
    pthread_mutex_lock(&tp->lock);
    bool over = c->mapped_bytes + mm->length > SHM_CONN_MAP_BYTES_MAX ||
                tp->mapped_bytes + mm->length > SHM_MAP_BYTES_MAX;
    if (!over)
        tp->mapped_bytes += mm->length; /* reserved before the map, given back if it fails */
    pthread_mutex_unlock(&tp->lock);
    if (over) {
        rc = orb_fail(ORB_ERESOURCE, "shm: mapping %llu more bytes would pass the source's budget of mapped "
                      "requester memory", (unsigned long long)mm->length);
        goto unlock_maps;
    }
    void *p = NULL;
    rc = shm_map_peer_file(fd, file_offset, mm->length, mm->writable, &p);
    if (rc != 0) {
        pthread_mutex_lock(&tp->lock);
        tp->mapped_bytes -= mm->length;
        pthread_mutex_unlock(&tp->lock);
        goto unlock_maps;
    }
    *m = (struct shm_map){.ptr = p, .length = mm->length, .writable = mm->writable != 0};
    c->mapped_bytes += mm->length;
unlock_maps:
    pthread_mutex_unlock(&c->maps_lock);
    return rc;
}

static void map_remove(struct shm_conn *c, uint32_t map_id)
{
    if (map_id == 0 || map_id > ORB_SHM_MAPS_MAX)
        return;
    pthread_mutex_lock(&c->maps_lock);
    struct shm_map *m = &c->maps[map_id - 1];
    if (m->ptr != NULL) {
        if (m->users > 0)
            m->retired = true;
        else
            map_unmap_locked(c, m);
    }
    pthread_mutex_unlock(&c->maps_lock);
}

/* Whether a request fits buffer `m` (held, so its length and access cannot change): NULL, or
 * why not, with the status in *rc. */
static const char *map_refuses(const struct shm_map *m, const struct orb_shm_request *rq, int *rc)
{
    *rc = ORB_EINVAL;
    if (rq->map_offset > m->length || rq->length > m->length - rq->map_offset)
        return "is shorter than the request";
    if (rq->op == ORB_OP_READ && !m->writable) {
        *rc = ORB_EPERM;
        return "was handed over read-only";
    }
    return NULL;
}

/* The map a request names, held until map_put(). 0 with *out, or the refusal. */
static int map_get(struct shm_conn *c, const struct orb_shm_request *rq, struct shm_map **out)
{
    if (rq->map_id == 0 || rq->map_id > ORB_SHM_MAPS_MAX)
        return orb_fail(ORB_EINVAL, "shm: buffer id %u is outside 1..%u", rq->map_id, ORB_SHM_MAPS_MAX);
    pthread_mutex_lock(&c->maps_lock);
    struct shm_map *m = &c->maps[rq->map_id - 1];
    int rc = ORB_EINVAL;
    const char *why = m->ptr == NULL || m->retired ? "was never handed over" : map_refuses(m, rq, &rc);
    if (why == NULL)
        m->users++;
    pthread_mutex_unlock(&c->maps_lock);
    if (why != NULL)
        return orb_fail(rc, "shm: requester buffer %u %s", rq->map_id, why);
    *out = m;
    return 0;
}

static void map_put(struct shm_conn *c, struct shm_map *m)
{
    pthread_mutex_lock(&c->maps_lock);
    if (--m->users == 0 && m->retired)
        map_unmap_locked(c, m);
    pthread_mutex_unlock(&c->maps_lock);
}

/* ---- serving requests ------------------------------------------------------------------------ */

/* What a run of requests served back to back holds from one request to the next: the source's
 * busy count, the last requester buffer, and the last registration with the table's unpublish
 * count read before it was pinned (while that count stands, the registration is published and
 * admits what it admitted: no table lock per request). A run ends when the ring runs dry or the
 * fence goes up, so an UNMAP, an unregistration or a stop waits for no more than the requests
 * already taken off the ring. */
struct serve_run {
    bool busy;
    struct shm_map *m;
    uint32_t map_id;
    struct orb_reg *pin;
    uint64_t unpublished;
};

static void run_end(struct shm_conn *c, struct serve_run *run)
{
    orb_registry_release(run->pin);
    run->pin = NULL;
    if (run->m != NULL)
        map_put(c, run->m);
    run->m = NULL;
    if (run->busy)
        atomic_fetch_sub(&c->tp->source_busy, 1);
    run->busy = false;
}

/* The requester buffer of `rq`, held by the run. */
static int run_map(struct shm_conn *c, struct serve_run *run, const struct orb_shm_request *rq)
{
    if (run->m != NULL && run->map_id == rq->map_id) {
        int rc;
        const char *why = map_refuses(run->m, rq, &rc);
        return why == NULL ? 0 : orb_fail(rc, "shm: requester buffer %u %s", rq->map_id, why);
    }
    if (run->m != NULL)
        map_put(c, run->m);
    run->m = NULL;
    int rc = map_get(c, rq, &run->m);
    if (rc == 0)
        run->map_id = rq->map_id;
    return rc;
}

/* The registration that admits the whole request `rq` (not only this piece), held by the run. */
static int run_admit(struct shm_conn *c, struct serve_run *run, const struct orb_shm_request *rq)
{
    struct orb_registry *table = orb_engine_registry(c->tp->engine);
    enum orb_perm need = rq->op == ORB_OP_READ ? ORB_PERM_REMOTE_READ : ORB_PERM_REMOTE_WRITE;
    uint64_t unpublished = orb_registry_unpublished(table);
    if (run->pin != NULL && run->unpublished == unpublished &&
        orb_reg_admits(run->pin, rq->request_addr, rq->request_length, need))
        return 0;
    orb_registry_release(run->pin);
    run->pin = NULL;
    struct orb_reg *pin = NULL;
    int rc = orb_registry_acquire(table, rq->request_addr, rq->request_length, need, &pin);
    if (rc != 0)
        return rc;
    if (pin->kind != &orb_memkind_host) {
        rc = orb_fail(ORB_EUNAVAILABLE, "shm: [0x%llx, +%llu) is %s memory: the same-host transport moves "
                      "host memory", (unsigned long long)rq->request_addr, (unsigned long long)rq->request_length,
                      pin->kind->name);
        orb_registry_release(pin);
        return rc;
    }
    run->pin = pin;
    run->unpublished = unpublished;
    return 0;
}

/* A completion's cause in its ORB_SHM_WHY_MAX bytes: the message when it fits; else, for a range
 * that no registration open to peers holds or allows (the requester names the range), those
 * words; else the message cut at a word, marked so. */
static void put_cause(struct orb_shm_completion *out, int rc, int op, const char *msg)
{
    size_t cap = sizeof out->why;
    if (strlen(msg) < cap) {
        snprintf(out->why, cap, "%s", msg);
        return;
    }
    if (rc == ORB_ENOENT || rc == ORB_EPERM) {
        snprintf(out->why, cap, "%s",
                 rc == ORB_ENOENT ? "no registration open to peers holds all of it"
                 : op == ORB_OP_READ ? "its registration does not allow remote READ"
                                     : "its registration does not allow remote WRITE");
        return;
    }
    size_t keep = cap - 5; /* room for " ..." and the NUL */
    while (keep > 0 && msg[keep] != ' ')
        keep--;
    snprintf(out->why, cap, "%.*s ...", (int)keep, msg);
}

/* Authorise and copy one request; the completion's status and cause into *out. */
static void serve(struct shm_conn *c, struct serve_run *run, const struct orb_shm_request *rq,
                  struct orb_shm_completion *out)
{
    struct shm_tp *tp = c->tp;
    out->tag = rq->tag;
    out->status = 0;
    out->effect = ORB_REMOTE_EFFECT_NONE;
    out->why[0] = '\0';
    /* Counted before the fence is looked at: stop() waits for the count after fencing, so a
     * request either sees the fence or is waited for. */
    if (!run->busy) {
        atomic_fetch_add(&tp->source_busy, 1);
        run->busy = true;
    }
    int rc;
    if (!orb_engine_source_open(tp->engine)) {
        run_end(c, run);
        rc = orb_fail(ORB_ECLOSED, "shm: the source is closing");
        goto answer;
    }
    if ((rc = run_map(c, run, rq)) != 0 || (rc = run_admit(c, run, rq)) != 0 || (rc = orb_reg_ready(run->pin)) != 0)
        goto answer;
    uint8_t *mine = run->pin->kind->cpu_view(run->pin, rq->remote_addr);
    if (mine == NULL) {
        rc = orb_fail(ORB_EUNAVAILABLE, "shm: [0x%llx, +%llu) has no CPU view here",
                      (unsigned long long)rq->remote_addr, (unsigned long long)rq->length);
        goto answer;
    }
    if (rq->op == ORB_OP_READ)
        memcpy(run->m->ptr + rq->map_offset, mine, (size_t)rq->length);
    else
        memcpy(mine, run->m->ptr + rq->map_offset, (size_t)rq->length);
answer:
    out->status = rc;
    if (rc != 0)
        put_cause(out, rc, rq->op, orb_last_error());
    orb_engine_count_served(tp->engine, ORB_TRANSPORT_SHM, rq->op == ORB_OP_READ ? ORB_OP_READ : ORB_OP_WRITE,
                            rq->length, rq->remote_addr + rq->length == rq->request_addr + rq->request_length, rc);
}

/* Stage a completion, waiting while the ring is full (a requester keeps no more requests in
 * flight than the ring holds, so only a stalled one makes this wait); what is staged is
 * published then. 0, or -1 to end. */
static int answer(struct shm_conn *c, const struct orb_shm_completion *cp)
{
    uint8_t entry[ORB_SH_RING_ENTRY];
    if (orb_shm_completion_encode(cp, entry) != 0)
        return -1;
    uint64_t deadline = orb_deadline_after(c->tp->io_timeout_ns);
    for (;;) {
        int rc = orb_sh_ring_stage(&c->cpl, entry);
        if (rc == 0)
            return 0;
        orb_sh_ring_publish(&c->cpl);
        if (rc != ORB_EAGAIN || atomic_load(&c->quit) || orb_now_ns() >= deadline) {
            ORB_LOGW("shm: requester %u: %s; the connection ends", c->peer_pid,
                     rc == ORB_EAGAIN ? "it stopped taking completions" : orb_last_error());
            return -1;
        }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

/* Completions staged before one publication: while more requests wait, a few answers go out
 * together (one store the requester's poller sees, not one per entry), but never so many that
 * the requester waits long for the first. */
#define PUBLISH_EVERY 8u

/* Requests taken off the ring at once: their entries' cache lines come over together, and the
 * run's buffer and registration serve them all. */
#define TAKE_MAX 32u

static void *ring_main(void *arg)
{
    struct shm_conn *c = arg;
    orb_thread_name("shm-ring");
    uint8_t entries[TAKE_MAX][ORB_SH_RING_ENTRY];
    struct serve_run run = {0};
    unsigned staged = 0;
    bool end = false;
    /* Sleeps of an idle connection grow up to SHM_IDLE_SLICE_MAX_NS and spin no more (a slice
     * past the first is idle time): the requester's futex wake (or the connection's end) brings
     * the thread back, and an idle connection costs about a wake-up a second rather than fifty
     * and their spins. */
    uint64_t slice = SHM_SLEEP_SLICE_NS;
    while (!end && !atomic_load(&c->quit)) {
        unsigned n = 0;
        int rc = 0;
        while (n < TAKE_MAX && (rc = orb_sh_ring_pop(&c->req, entries[n])) == 0)
            n++;
        if (n == 0 && rc == ORB_EAGAIN) {
            /* Dry: let go of what the run holds before waiting. */
            run_end(c, &run);
            uint64_t poll = slice > SHM_SLEEP_SLICE_NS ? 0 : c->tp->poll_ns;
            if (orb_sh_ring_wait(&c->req, poll, orb_deadline_after(slice)) == ORB_ETIMEDOUT)
                slice = slice < SHM_IDLE_SLICE_MAX_NS / 2 ? slice * 2 : SHM_IDLE_SLICE_MAX_NS;
            continue;
        }
        slice = SHM_SLEEP_SLICE_NS;
        if (rc != 0 && rc != ORB_EAGAIN) {
            ORB_LOGW("shm: requester %u broke the protocol (%s); the connection ends", c->peer_pid,
                     orb_last_error());
            break;
        }
        SHM_ORDER_ACQUIRE();
        for (unsigned k = 0; k < n; k++) {
            struct orb_shm_request rq;
            if (orb_shm_request_decode(entries[k], &rq) != 0) {
                ORB_LOGW("shm: requester %u broke the protocol (%s); the connection ends", c->peer_pid,
                         orb_last_error());
                end = true;
                break;
            }
            struct orb_shm_completion cp;
            serve(c, &run, &rq, &cp);
            SHM_ORDER_RELEASE();
            if (answer(c, &cp) != 0) {
                end = true;
                break;
            }
            if (++staged >= PUBLISH_EVERY || (k + 1 == n && !orb_sh_ring_pending(&c->req))) {
                orb_sh_ring_publish(&c->cpl);
                staged = 0;
            }
        }
    }
    run_end(c, &run);
    orb_sh_ring_publish(&c->cpl);
    atomic_store(&c->quit, true);
    shutdown(c->sock, SHUT_RDWR); /* the socket thread ends too */
    return NULL;
}

/* ---- the socket thread ------------------------------------------------------------------------ */

/* A requester that passed the proof takes a slot of max_connections and is no longer a
 * stranger. 0, or ORB_ERESOURCE (none is free, or it was dropped as a stranger meanwhile). */
static int claim_slot(struct shm_conn *c)
{
    struct shm_tp *tp = c->tp;
    uint32_t max = orb_engine_cfg(tp->engine)->max_connections;
    int rc = 0;
    pthread_mutex_lock(&tp->lock);
    if (atomic_load_explicit(&c->evicted, memory_order_relaxed)) {
        rc = orb_fail(ORB_ERESOURCE, "shm: dropped for a newer connection (max_unauthenticated)");
    } else if (tp->nproved >= max) {
        rc = orb_fail(ORB_ERESOURCE, "shm: max_connections (%u) same-host connections are open", max);
    } else {
        atomic_store_explicit(&c->proved, true, memory_order_relaxed);
        tp->nproved++;
    }
    pthread_mutex_unlock(&tp->lock);
    return rc;
}

static int handshake(struct shm_conn *c)
{
    struct shm_tp *tp = c->tp;
    uint64_t deadline = orb_deadline_after(tp->hello_timeout_ns);
    uint8_t buf[256];
    size_t n = 0;
    int rc = shm_sock_recv(c->sock, buf, sizeof buf, &n, NULL, deadline);
    struct orb_samehost_hello peer, self = {.epoch = tp->epoch, .pid = tp->pid};
    uint32_t cred_pid = 0, cred_uid = 0;
    if (rc == 0)
        rc = orb_samehost_hello_decode(buf, n, &peer);
    if (rc == 0)
        rc = orb_samehost_peer_cred(c->sock, &cred_pid, &cred_uid);
    /* The requester names the epoch it expects of this source: it must be this one. */
    if (rc == 0)
        rc = orb_samehost_check(&peer, tp->boot_id, cred_pid, &tp->epoch);
    if (rc == 0)
        rc = claim_slot(c);
    if (rc != 0)
        return rc;
    c->peer_pid = cred_pid;
    memcpy(self.boot_id, tp->boot_id, sizeof self.boot_id);
    uint8_t hello[ORB_SAMEHOST_HELLO_LEN];
    if ((rc = orb_samehost_hello_encode(&self, hello)) != 0 ||
        (rc = shm_sock_send(c->sock, hello, sizeof hello, -1, deadline)) != 0)
        return rc;

    int fd = -1;
    struct orb_shm_setup su;
    if ((rc = shm_sock_recv(c->sock, buf, sizeof buf, &n, &fd, deadline)) != 0)
        return rc;
    rc = orb_shm_setup_decode(buf, n, &su);
    if (rc == 0 && fd < 0)
        rc = orb_fail(ORB_EPROTO, "shm: SETUP came without its memory file");
    void *rings = NULL;
    if (rc == 0)
        rc = shm_map_peer_file(fd, 0, su.bytes, 1, &rings);
    if (fd >= 0)
        close(fd);
    if (rc != 0)
        return rc;
    c->rings = rings;
    c->rings_len = su.bytes;
    uint64_t at = orb_shm_setup_completion_offset(su.request_capacity);
    if ((rc = orb_sh_ring_open(&c->req, c->rings, (size_t)at, su.request_capacity, ORB_SH_RING_CONSUMER, 0)) != 0 ||
        (rc = orb_sh_ring_open(&c->cpl, c->rings + at, (size_t)(su.bytes - at), su.completion_capacity,
                               ORB_SH_RING_PRODUCER, 0)) != 0)
        return rc;
    struct orb_shm_status ok = {0};
    uint8_t out[ORB_SHM_SETUP_OK_LEN];
    size_t len = 0;
    if ((rc = orb_shm_status_encode(ORB_SHM_SETUP_OK, &ok, out, sizeof out, &len)) != 0)
        return rc;
    return shm_sock_send(c->sock, out, len, -1, deadline);
}

/* One MAP or UNMAP. 0, or non-zero to end the connection (anything else is a protocol error). */
static int handle_message(struct shm_conn *c, const uint8_t *buf, size_t n, int fd)
{
    uint8_t kind = 0;
    int rc = orb_shm_peek_kind(buf, n, &kind);
    if (rc == 0 && kind == ORB_SHM_UNMAP && fd < 0) {
        uint32_t id = 0;
        if ((rc = orb_shm_unmap_decode(buf, n, &id)) == 0)
            map_remove(c, id);
        return rc;
    }
    if (rc == 0 && kind == ORB_SHM_MAP && fd >= 0) {
        struct orb_shm_map mm;
        if ((rc = orb_shm_map_decode(buf, n, &mm)) != 0)
            return rc;
        int st = map_add(c, &mm, mm.file_offset, fd);
        if (st != 0)
            ORB_LOGI("shm: requester %u: buffer %u refused: %s", c->peer_pid, mm.map_id, orb_last_error());
        struct orb_shm_status s = {.map_id = mm.map_id, .status = st};
        uint8_t out[ORB_SHM_MAP_OK_LEN];
        size_t len = 0;
        if ((rc = orb_shm_status_encode(ORB_SHM_MAP_OK, &s, out, sizeof out, &len)) != 0)
            return rc;
        return shm_sock_send(c->sock, out, len, -1, orb_deadline_after(c->tp->io_timeout_ns));
    }
    return rc != 0 ? rc : orb_fail(ORB_EPROTO, "shm: unexpected message kind %u", kind);
}

static void *conn_main(void *arg)
{
    struct shm_conn *c = arg;
    orb_thread_name("shm-conn");
    struct shm_tp *tp = c->tp;
    int rc = handshake(c);
    if (rc != 0) {
        ORB_LOGI("shm: a same-host connection was refused: %s", orb_last_error());
        goto end;
    }
    if (pthread_create(&c->ring_thread, NULL, ring_main, c) != 0) {
        ORB_LOGW("shm: cannot start a connection's thread");
        goto end;
    }
    c->ring_started = true;
    uint8_t buf[256];
    while (!atomic_load(&c->quit)) {
        size_t n = 0;
        int fd = -1;
        rc = shm_sock_recv(c->sock, buf, sizeof buf, &n, &fd, orb_deadline_after(SOCKET_SLICE_NS));
        if (rc == ORB_ETIMEDOUT)
            continue;
        if (rc == 0)
            rc = handle_message(c, buf, n, fd);
        if (fd >= 0)
            close(fd);
        if (rc != 0) {
            if (rc != ORB_EPEER)
                ORB_LOGW("shm: requester %u: %s; the connection ends", c->peer_pid, orb_last_error());
            break;
        }
    }
end:
    atomic_store(&c->quit, true);
    if (c->ring_started) {
        orb_sh_ring_wake(&c->req);
        pthread_join(c->ring_thread, NULL);
    }
    pthread_mutex_lock(&c->maps_lock);
    for (uint32_t i = 0; i < ORB_SHM_MAPS_MAX; i++)
        if (c->maps[i].ptr != NULL)
            map_unmap_locked(c, &c->maps[i]);
    pthread_mutex_unlock(&c->maps_lock);
    if (c->rings != NULL)
        munmap(c->rings, (size_t)c->rings_len);
    c->rings = NULL;
    /* Closed only now: the requester takes the end of the socket as proof that nothing here
     * touches its memory any more. Under the lock: stop() shuts live sockets down under it. */
    pthread_mutex_lock(&tp->lock);
    close(c->sock);
    c->sock = -1;
    if (atomic_load_explicit(&c->proved, memory_order_relaxed))
        tp->nproved--;
    atomic_store_explicit(&c->proved, false, memory_order_relaxed);
    atomic_store(&c->finished, true);
    pthread_cond_broadcast(&tp->changed);
    pthread_mutex_unlock(&tp->lock);
    return NULL;
}

static void conn_free(struct shm_conn *c)
{
    pthread_mutex_destroy(&c->maps_lock);
    free(c->maps);
    free(c);
}

/* Join and free the connections that ended (tp->lock held). */
static void reap_locked(struct shm_tp *tp)
{
    for (struct shm_conn **pp = &tp->conns; *pp != NULL;) {
        struct shm_conn *c = *pp;
        if (!atomic_load(&c->finished)) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        tp->nconns--;
        pthread_join(c->thread, NULL);
        conn_free(c);
    }
}

/* Strangers (connections whose requester has not passed the proof yet) draw from their own
 * budget, max_unauthenticated, never from max_connections: when it is full, the oldest stranger
 * is shut down to make room, so that processes that connect and say nothing cannot keep a
 * proved requester out (tp->lock held). */
static void make_room_locked(struct shm_tp *tp, uint32_t max_strangers)
{
    for (;;) {
        uint32_t strangers = 0;
        struct shm_conn *oldest = NULL;
        for (struct shm_conn *c = tp->conns; c != NULL; c = c->next) {
            if (atomic_load_explicit(&c->proved, memory_order_relaxed) ||
                atomic_load_explicit(&c->evicted, memory_order_relaxed) || c->sock < 0)
                continue;
            strangers++;
            if (oldest == NULL || c->accepted_ns < oldest->accepted_ns)
                oldest = c;
        }
        if (strangers < max_strangers || oldest == NULL)
            return;
        ORB_LOGD("shm: dropping the oldest of %u same-host connections without a proof", strangers);
        atomic_store_explicit(&oldest->evicted, true, memory_order_relaxed);
        shutdown(oldest->sock, SHUT_RDWR); /* its handshake ends at once */
    }
}

static void accept_one(struct shm_tp *tp, int sock)
{
    const struct orb_engine_config *cfg = orb_engine_cfg(tp->engine);
    if (!orb_engine_source_open(tp->engine)) {
        ORB_LOGI("shm: a same-host connection was refused: the source is closed");
        close(sock);
        return;
    }
    struct shm_conn *c = calloc(1, sizeof *c);
    struct shm_map *maps = calloc(ORB_SHM_MAPS_MAX, sizeof *maps);
    if (c == NULL || maps == NULL) {
        free(c);
        free(maps);
        close(sock);
        return;
    }
    c->tp = tp;
    c->sock = sock;
    c->maps = maps;
    c->accepted_ns = orb_now_ns();
    atomic_init(&c->quit, false);
    atomic_init(&c->finished, false);
    atomic_init(&c->proved, false);
    atomic_init(&c->evicted, false);
    pthread_mutex_init(&c->maps_lock, NULL);
    pthread_mutex_lock(&tp->lock);
    reap_locked(tp);
    make_room_locked(tp, cfg->max_unauthenticated);
    if (pthread_create(&c->thread, NULL, conn_main, c) != 0) {
        pthread_mutex_unlock(&tp->lock);
        close(sock);
        conn_free(c);
        return;
    }
    c->next = tp->conns;
    tp->conns = c;
    tp->nconns++;
    pthread_mutex_unlock(&tp->lock);
}

static void *accept_main(void *arg)
{
    struct shm_tp *tp = arg;
    orb_thread_name("shm-accept");
    while (!atomic_load(&tp->accept_quit)) {
        struct pollfd p = {.fd = tp->listen_fd, .events = POLLIN};
        if (poll(&p, 1, ACCEPT_POLL_MS) <= 0)
            continue;
        int sock = accept4(tp->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (sock >= 0)
            accept_one(tp, sock);
    }
    return NULL;
}

int shm_source_start(struct shm_tp *tp)
{
    tp->listen_fd = -1;
    if (!orb_engine_cfg(tp->engine)->enable_source || !tp->enabled)
        return 0;
    int rc = orb_random_bytes(tp->id, sizeof tp->id);
    if (rc == 0)
        rc = shm_sock_listen(tp->id, &tp->listen_fd);
    if (rc != 0) {
        /* Requesters of this host then use another transport: not a reason to fail the engine. */
        ORB_LOGI("shm: no same-host source: %s", orb_last_error());
        tp->listen_fd = -1;
        return 0;
    }
    atomic_init(&tp->accept_quit, false);
    if (pthread_create(&tp->accept_thread, NULL, accept_main, tp) != 0) {
        close(tp->listen_fd);
        tp->listen_fd = -1;
        return orb_fail(ORB_ENOMEM, "shm: cannot start the source's thread");
    }
    tp->accept_started = true;
    return 0;
}

int shm_source_control(void *tp_, const struct orb_epoch *sender, const uint8_t *req, size_t len, uint8_t *resp,
                       size_t cap, size_t *resp_len)
{
    (void)sender;
    struct shm_tp *tp = tp_;
    uint8_t kind = 0;
    int rc = orb_shm_peek_kind(req, len, &kind);
    if (rc != 0)
        return rc;
    if (kind == ORB_SHM_INFO) {
        if ((rc = orb_shm_info_decode(req, len)) != 0)
            return rc;
        if (tp->listen_fd < 0)
            return orb_fail(ORB_EUNAVAILABLE, "shm: this source serves no same-host peer%s",
                            tp->enabled ? "" : " (enable_shm is off)");
        struct orb_shm_info in;
        memcpy(in.boot_id, tp->boot_id, sizeof in.boot_id);
        memcpy(in.id, tp->id, sizeof in.id);
        return orb_shm_info_ok_encode(&in, resp, cap, resp_len);
    }
    if (kind == ORB_SHM_QUERY) {
        struct orb_shm_query q;
        if ((rc = orb_shm_query_decode(req, len, &q)) != 0)
            return rc;
        struct orb_shm_query_ok a = {0};
        struct orb_reg *pin = NULL;
        a.status = orb_registry_acquire(orb_engine_registry(tp->engine), q.addr, q.length,
                                        q.op == ORB_OP_READ ? ORB_PERM_REMOTE_READ : ORB_PERM_REMOTE_WRITE, &pin);
        if (a.status == 0) {
            if (pin->kind == &orb_memkind_host) {
                a.base = pin->base;
                a.length = pin->len;
            } else {
                a.status = ORB_EUNAVAILABLE;
            }
            orb_registry_release(pin);
        }
        return orb_shm_query_ok_encode(&a, resp, cap, resp_len);
    }
    return orb_fail(ORB_EPROTO, "shm: control message kind %u is not one a source answers", kind);
}

/* Quiescent once the fence is up and no copy runs: a request served later sees the fence
 * (serve()). The connections are told to end and are joined by shm_source_free(). */
int shm_source_stop(struct shm_tp *tp, uint64_t deadline)
{
    if (tp->accept_started) {
        atomic_store(&tp->accept_quit, true);
        pthread_join(tp->accept_thread, NULL);
        tp->accept_started = false;
    }
    if (tp->listen_fd >= 0) {
        close(tp->listen_fd);
        tp->listen_fd = -1;
    }
    pthread_mutex_lock(&tp->lock);
    for (struct shm_conn *c = tp->conns; c != NULL; c = c->next) {
        atomic_store(&c->quit, true);
        if (c->sock >= 0)
            shutdown(c->sock, SHUT_RDWR);
    }
    reap_locked(tp);
    pthread_mutex_unlock(&tp->lock);
    while (atomic_load(&tp->source_busy) > 0 && orb_now_ns() < deadline) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    uint64_t busy = atomic_load(&tp->source_busy);
    if (busy > 0)
        return orb_fail(ORB_EUNQUIESCED, "shm: %llu copies for same-host requesters are still running",
                        (unsigned long long)busy);
    return 0;
}

void shm_source_free(struct shm_tp *tp)
{
    (void)shm_source_stop(tp, ORB_DEADLINE_NONE);
    pthread_mutex_lock(&tp->lock);
    reap_locked(tp);
    while (tp->conns != NULL) {
        pthread_cond_wait(&tp->changed, &tp->lock);
        reap_locked(tp);
    }
    pthread_mutex_unlock(&tp->lock);
}
