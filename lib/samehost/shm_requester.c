/* The same-host transport's requester: per peer, the proved connection to the source's Unix
 * socket, the two rings, the buffers handed over, and one thread that takes completions. */
#include <errno.h>
#include <fcntl.h>
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
#include "core/range_memo.h"
#include "core/thread_name.h"
#include "samehost/shm_internal.h"

#define WHY_LEN 256
#define MAP_WAIT_NS (5ull * ORB_NS_PER_SEC) /* the longest a MAP waits for its answer */

/* A buffer handed to this peer's source. */
struct shm_pmap {
    uint64_t serial;            /* the registration's (struct shm_reg_state) */
    uint32_t map_id;
    bool writable;
};

struct shm_slot {
    struct orb_xfer *x;         /* NULL: free */
    uint32_t gen;
};

/* Locks, outermost first: sock_lock, consume_lock, the transport's lock, lock. */
struct shm_peer {
    struct shm_peer *next;      /* tp->peers */
    struct shm_tp *tp;
    struct orb_control_path ctl;
    char endpoint[ORB_ENDPOINT_MAX];
    int sock;
    uint8_t *rings;
    size_t rings_len;
    pthread_mutex_t lock;       /* everything below but the ring consumer and sock_lock */
    pthread_mutex_t sock_lock;  /* one MAP round trip at a time */
    struct orb_sh_ring req;     /* producer, under lock */
    struct orb_sh_ring cpl;     /* consumer, under consume_lock: the thread's or a polling caller's */
    pthread_mutex_t consume_lock;
    atomic_uint pollers;        /* callers polling completions now (shm_peer_poll) */
    _Atomic uint64_t handoff_at; /* the thread takes completions over from callers from then on */
    atomic_uint inflight_now;   /* nflight, readable without the lock */
    struct shm_slot slots[SHM_RING_CAPACITY];
    uint32_t nflight;
    struct orb_xfer *backlog, *backlog_tail;
    struct shm_pmap *maps;
    uint32_t nmaps, maps_cap;
    uint64_t ids_used[ORB_SHM_MAPS_MAX / 64];
    struct orb_range_memo known; /* QUERY answers: host registrations' extents, refusals for a while */
    uint64_t last_progress;
    int dead;                   /* 0, or the status every later xfer fails with */
    char dead_why[WHY_LEN];
    bool released, stopping, finished;
    pthread_t thread;
};

static void peer_free(struct shm_peer *p)
{
    if (p->rings != NULL)
        munmap(p->rings, p->rings_len);
    if (p->sock >= 0)
        close(p->sock);
    free(p->maps);
    pthread_mutex_destroy(&p->consume_lock);
    pthread_mutex_destroy(&p->sock_lock);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* Join and free the peers whose thread finished and whose segment let them go (tp->lock held). */
static void reap_locked(struct shm_tp *tp)
{
    for (struct shm_peer **pp = &tp->peers; *pp != NULL;) {
        struct shm_peer *p = *pp;
        pthread_mutex_lock(&p->lock);
        bool done = p->finished && p->released;
        pthread_mutex_unlock(&p->lock);
        if (!done) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        pthread_join(p->thread, NULL);
        peer_free(p);
    }
}

/* Publish nflight to lock-free readers (p->lock held). A release store, not a full barrier: it
 * must not wait for the ring entries just written to leave this CPU. */
static void set_inflight_locked(struct shm_peer *p)
{
    atomic_store_explicit(&p->inflight_now, p->nflight, memory_order_release);
}

static void xfer_end(struct shm_tp *tp, struct orb_xfer *x, int status, enum orb_remote_effect effect, const char *why)
{
    orb_xfer_done_why(x, status, effect, why);
    atomic_fetch_sub(&tp->inflight, 1);
}

/* Wake the peer's thread wherever it sleeps (p->lock held: the thread unmaps the rings under it). */
static void wake_thread_locked(struct shm_peer *p)
{
    if (p->rings != NULL)
        orb_sh_ring_wake(&p->cpl);
}

/* The connection cannot go on: every xfer in flight or queued fails with `status` (p->lock held).
 * The write side is shut so that the source ends the connection; its close then tells the
 * thread nothing there touches this process's memory any more. */
static void kill_locked(struct shm_peer *p, int status, const char *why)
{
    if (p->dead == 0) {
        p->dead = status;
        snprintf(p->dead_why, sizeof p->dead_why, "%s", why);
        ORB_LOGI("shm: the same-host path to %s ends: %s", p->endpoint, why);
        shutdown(p->sock, SHUT_WR);
    }
    for (uint32_t i = 0; i < SHM_RING_CAPACITY; i++) {
        struct orb_xfer *x = p->slots[i].x;
        if (x == NULL)
            continue;
        p->slots[i].x = NULL;
        p->slots[i].gen++;
        p->nflight--;
        set_inflight_locked(p);
        xfer_end(p->tp, x, p->dead,
                 x->op == ORB_XFER_WRITE ? ORB_REMOTE_EFFECT_UNKNOWN : ORB_REMOTE_EFFECT_NONE, p->dead_why);
    }
    while (p->backlog != NULL) {
        struct orb_xfer *x = p->backlog;
        p->backlog = x->next;
        xfer_end(p->tp, x, p->dead, ORB_REMOTE_EFFECT_NONE, p->dead_why);
    }
    p->backlog_tail = NULL;
    wake_thread_locked(p);
}

/* ---- the handshake ----------------------------------------------------------------------------- */

static int ask_info(struct shm_peer *p, uint64_t deadline, struct orb_shm_info *info)
{
    uint8_t req[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
    size_t len = 0, resp_len = 0;
    int rc = orb_shm_info_encode(req, sizeof req, &len);
    if (rc == 0)
        rc = p->ctl.call(p->ctl.peer, ORB_TRANSPORT_SHM, req, len, resp, sizeof resp, &resp_len, deadline);
    if (rc == 0)
        rc = orb_shm_info_ok_decode(resp, resp_len, info);
    return rc;
}

static int make_rings(struct shm_peer *p, int *fd_out)
{
    uint64_t bytes = orb_shm_setup_bytes(SHM_RING_CAPACITY, SHM_RING_CAPACITY);
    int fd = memfd_create("orbite-shm-rings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "shm: cannot make the rings' memory file: %s", strerror(errno));
    if (ftruncate(fd, (off_t)bytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        int e = errno;
        close(fd);
        return orb_fail(ORB_EUNAVAILABLE, "shm: cannot size and seal the rings' memory file: %s", strerror(e));
    }
    void *m = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        return orb_fail(ORB_ENOMEM, "shm: cannot map the rings: %s", strerror(e));
    }
    p->rings = m;
    p->rings_len = (size_t)bytes;
    uint64_t at = orb_shm_setup_completion_offset(SHM_RING_CAPACITY);
    int rc = orb_sh_ring_open(&p->req, p->rings, (size_t)at, SHM_RING_CAPACITY, ORB_SH_RING_PRODUCER, 1);
    if (rc == 0)
        rc = orb_sh_ring_open(&p->cpl, p->rings + at, (size_t)(bytes - at), SHM_RING_CAPACITY,
                              ORB_SH_RING_CONSUMER, 1);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

/* Prove the source runs on this host and set the rings up. */
static int connect_source(struct shm_peer *p, const struct orb_epoch *expected, uint64_t deadline)
{
    struct shm_tp *tp = p->tp;
    struct orb_shm_info info;
    int rc = ask_info(p, deadline, &info);
    if (rc != 0)
        return rc == ORB_ESTALE || rc == ORB_ECLOSED ? orb_fail_wrap(ORB_EUNAVAILABLE, "shm") : rc;
    if (strcmp(info.boot_id, tp->boot_id) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "shm: the source runs under boot %s, this process under %s: another "
                        "host", info.boot_id, tp->boot_id);
    if ((rc = shm_sock_connect(info.id, deadline, &p->sock)) != 0)
        return rc;
    struct orb_samehost_hello self = {.epoch = *expected, .pid = tp->pid}, peer;
    memcpy(self.boot_id, tp->boot_id, sizeof self.boot_id);
    uint8_t hello[ORB_SAMEHOST_HELLO_LEN], buf[256];
    size_t n = 0;
    uint32_t cred_pid = 0, cred_uid = 0;
    if ((rc = orb_samehost_hello_encode(&self, hello)) != 0 ||
        (rc = shm_sock_send(p->sock, hello, sizeof hello, -1, deadline)) != 0 ||
        (rc = shm_sock_recv(p->sock, buf, sizeof buf, &n, NULL, deadline)) != 0 ||
        (rc = orb_samehost_hello_decode(buf, n, &peer)) != 0 ||
        (rc = orb_samehost_peer_cred(p->sock, &cred_pid, &cred_uid)) != 0 ||
        (rc = orb_samehost_check(&peer, tp->boot_id, cred_pid, expected)) != 0)
        return rc == ORB_EPEER ? orb_fail_wrap(ORB_EUNAVAILABLE, "shm: the source refused the proof") : rc;
    int fd = -1;
    if ((rc = make_rings(p, &fd)) != 0)
        return rc;
    struct orb_shm_setup su = {.request_capacity = SHM_RING_CAPACITY, .completion_capacity = SHM_RING_CAPACITY,
                               .bytes = p->rings_len};
    uint8_t msg[ORB_SHM_SETUP_LEN];
    size_t len = 0;
    struct orb_shm_status st;
    rc = orb_shm_setup_encode(&su, msg, sizeof msg, &len);
    if (rc == 0)
        rc = shm_sock_send(p->sock, msg, len, fd, deadline);
    close(fd); /* the source holds its own once it took the message */
    if (rc == 0)
        rc = shm_sock_recv(p->sock, buf, sizeof buf, &n, NULL, deadline);
    if (rc == 0)
        rc = orb_shm_status_decode(ORB_SHM_SETUP_OK, buf, n, &st);
    if (rc == 0 && st.status != 0)
        rc = orb_fail(ORB_EUNAVAILABLE, "shm: the source refused the rings (%s)", orb_strerror(st.status));
    return rc;
}

static void *peer_main(void *arg);

int shm_peer_open(void *tp_, const char *endpoint, const struct orb_epoch *expected, uint64_t deadline,
                  const struct orb_control_path *ctl, void **peer_out)
{
    struct shm_tp *tp = tp_;
    if (ctl == NULL)
        return orb_fail(ORB_EINVAL, "shm: a peer needs the segment's control path");
    if (!tp->enabled)
        return orb_fail(ORB_EUNAVAILABLE, "shm: enable_shm is off in this engine");
    struct shm_peer *p = calloc(1, sizeof *p);
    if (p == NULL)
        return orb_fail(ORB_ENOMEM, "shm: out of memory for a peer");
    p->tp = tp;
    p->ctl = *ctl;
    p->sock = -1;
    snprintf(p->endpoint, sizeof p->endpoint, "%s", endpoint);
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->sock_lock, NULL);
    pthread_mutex_init(&p->consume_lock, NULL);
    atomic_init(&p->pollers, 0);
    atomic_init(&p->handoff_at, 0);
    atomic_init(&p->inflight_now, 0);
    int rc = connect_source(p, expected, deadline);
    if (rc != 0)
        goto free_peer;
    p->last_progress = orb_now_ns();
    pthread_mutex_lock(&tp->lock);
    if (atomic_load(&tp->stopping)) {
        pthread_mutex_unlock(&tp->lock);
        rc = orb_fail(ORB_ECLOSED, "shm: the transport is stopping");
        goto free_peer;
    }
    reap_locked(tp);
    if (pthread_create(&p->thread, NULL, peer_main, p) != 0) {
        pthread_mutex_unlock(&tp->lock);
        rc = orb_fail(ORB_ENOMEM, "shm: cannot start a peer's thread");
        goto free_peer;
    }
    p->next = tp->peers;
    tp->peers = p;
    pthread_mutex_unlock(&tp->lock);
    *peer_out = p;
    return 0;

free_peer:
    peer_free(p);
    return rc;
}

/* ---- buffers --------------------------------------------------------------------------------- */

static struct shm_pmap *map_find_locked(struct shm_peer *p, uint64_t serial, bool writable)
{
    for (uint32_t i = 0; i < p->nmaps; i++)
        if (p->maps[i].serial == serial && p->maps[i].writable == writable)
            return &p->maps[i];
    return NULL;
}

static uint32_t id_take_locked(struct shm_peer *p)
{
    for (uint32_t w = 0; w < ORB_SHM_MAPS_MAX / 64; w++)
        if (~p->ids_used[w] != 0) {
            uint32_t b = (uint32_t)__builtin_ctzll(~p->ids_used[w]);
            p->ids_used[w] |= 1ull << b;
            return w * 64 + b + 1;
        }
    return 0;
}

static void id_give_locked(struct shm_peer *p, uint32_t id)
{
    p->ids_used[(id - 1) / 64] &= ~(1ull << ((id - 1) % 64));
}

/* Hand the source the buffer behind `st` (once per direction and connection). 0 with its id. */
static int map_ensure(struct shm_peer *p, const struct shm_reg_state *st, bool writable, uint32_t *id_out)
{
    pthread_mutex_lock(&p->lock);
    struct shm_pmap *m = map_find_locked(p, st->serial, writable);
    if (m != NULL) {
        *id_out = m->map_id;
        pthread_mutex_unlock(&p->lock);
        return 0;
    }
    pthread_mutex_unlock(&p->lock);

    pthread_mutex_lock(&p->sock_lock);
    pthread_mutex_lock(&p->lock);
    int rc = p->dead;
    uint32_t id = 0;
    if ((m = map_find_locked(p, st->serial, writable)) != NULL) /* another thread was quicker */
        id = m->map_id;
    else if (rc == 0 && p->nmaps == p->maps_cap) {
        uint32_t cap = p->maps_cap == 0 ? 16 : p->maps_cap * 2;
        struct shm_pmap *grown = realloc(p->maps, cap * sizeof *grown);
        if (grown == NULL)
            rc = orb_fail(ORB_ENOMEM, "shm: out of memory for a buffer's record");
        else {
            p->maps = grown;
            p->maps_cap = cap;
        }
    }
    if (rc == 0 && id == 0 && (id = id_take_locked(p)) == 0)
        rc = orb_fail(ORB_ERESOURCE, "shm: %u buffers are handed to %s already", ORB_SHM_MAPS_MAX, p->endpoint);
    else if (rc != 0 && p->dead != 0)
        rc = orb_fail(p->dead, "%s", p->dead_why);
    bool fresh = rc == 0 && m == NULL;
    pthread_mutex_unlock(&p->lock);
    if (!fresh) {
        pthread_mutex_unlock(&p->sock_lock);
        if (rc == 0)
            *id_out = id;
        return rc;
    }

    struct orb_shm_map mm = {.map_id = id, .writable = writable, .file_offset = st->file_offset,
                             .length = st->length};
    uint8_t msg[ORB_SHM_MAP_LEN], buf[64];
    size_t len = 0, n = 0;
    uint64_t deadline = orb_deadline_after(MAP_WAIT_NS);
    rc = orb_shm_map_encode(&mm, msg, sizeof msg, &len);
    if (rc == 0)
        rc = shm_sock_send(p->sock, msg, len, st->fd, deadline);
    struct orb_shm_status ans = {0};
    while (rc == 0) {
        if ((rc = shm_sock_recv(p->sock, buf, sizeof buf, &n, NULL, deadline)) != 0 ||
            (rc = orb_shm_status_decode(ORB_SHM_MAP_OK, buf, n, &ans)) != 0)
            break;
        if (ans.map_id == id)
            break;
    }
    pthread_mutex_lock(&p->lock);
    if (rc != 0) {
        /* The socket's state is in doubt (an answer may come late): the connection ends. */
        char why[WHY_LEN];
        snprintf(why, sizeof why, "handing a buffer over failed: %s", orb_last_error());
        id_give_locked(p, id);
        kill_locked(p, ORB_EPEER, why);
        rc = orb_fail(ORB_EPEER, "shm: %s", why);
    } else if (ans.status != 0) {
        id_give_locked(p, id);
        rc = orb_fail(ans.status, "shm: the source refused the buffer [%llu, +%llu) of a memory file (%s)",
                      (unsigned long long)st->file_offset, (unsigned long long)st->length, orb_strerror(ans.status));
    } else {
        p->maps[p->nmaps++] = (struct shm_pmap){.serial = st->serial, .map_id = id, .writable = writable};
        *id_out = id;
    }
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->sock_lock);
    return rc;
}

void shm_requester_forget(struct shm_tp *tp, const struct shm_reg_state *st)
{
    pthread_mutex_lock(&tp->lock);
    for (struct shm_peer *p = tp->peers; p != NULL; p = p->next) {
        pthread_mutex_lock(&p->lock);
        for (uint32_t i = 0; i < p->nmaps;) {
            if (p->maps[i].serial != st->serial) {
                i++;
                continue;
            }
            uint32_t id = p->maps[i].map_id;
            p->maps[i] = p->maps[--p->nmaps];
            uint8_t msg[ORB_SHM_UNMAP_LEN];
            size_t len = 0;
            /* A message either goes at once or the connection ends: retiring never waits on a peer. */
            if (p->dead == 0 && (orb_shm_unmap_encode(id, msg, sizeof msg, &len) != 0 ||
                                 shm_sock_send(p->sock, msg, len, -1, 0) != 0))
                kill_locked(p, ORB_EPEER, "a retired buffer's UNMAP could not be sent");
            if (p->dead == 0)
                id_give_locked(p, id);
        }
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&tp->lock);
}

/* ---- requests ---------------------------------------------------------------------------------- */

int shm_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan)
{
    (void)peer;
    if (in->local_reg == NULL || in->local_reg->tp_state[ORB_TRANSPORT_SHM] == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "shm: the same-host transport moves only local memory from "
                        "orb_host_memory_alloc_shared() (a buffer its source can map)");
    return orb_plan_even(plan, in->length, 0);
}

/* Put queued xfers on the ring while slots are free (p->lock held). */
static void pump_locked(struct shm_peer *p)
{
    while (p->backlog != NULL && p->nflight < SHM_RING_CAPACITY && p->dead == 0) {
        struct orb_xfer *x = p->backlog;
        p->backlog = x->next;
        if (p->backlog == NULL)
            p->backlog_tail = NULL;
        if (!orb_xfer_may_start(x)) {
            xfer_end(p->tp, x, ORB_ETIMEDOUT, ORB_REMOTE_EFFECT_NONE, NULL);
            continue;
        }
        uint32_t i = 0;
        while (p->slots[i].x != NULL)
            i++;
        struct shm_slot *s = &p->slots[i];
        /* x->tag holds the buffer's id at this source (shm_peer_submit). */
        const struct shm_reg_state *st = x->local_reg->tp_state[ORB_TRANSPORT_SHM];
        struct orb_shm_request rq = {.tag = (uint64_t)s->gen << 32 | i,
                                     .op = x->op == ORB_XFER_READ ? ORB_OP_READ : ORB_OP_WRITE,
                                     .map_id = (uint32_t)x->tag,
                                     .map_offset = st->reg_offset + x->local_offset,
                                     .remote_addr = x->remote_addr,
                                     .length = x->length,
                                     .request_addr = x->request_remote_addr,
                                     .request_length = x->request_length};
        uint8_t entry[ORB_SH_RING_ENTRY];
        int rc = orb_shm_request_encode(&rq, entry);
        SHM_ORDER_RELEASE();
        if (rc == 0)
            rc = orb_sh_ring_stage(&p->req, entry);
        if (rc != 0) {
            orb_sh_ring_publish(&p->req);
            /* The ring has room for every slot: anything else is the source breaking it. */
            char why[WHY_LEN];
            snprintf(why, sizeof why, "the request ring: %s", orb_last_error());
            xfer_end(p->tp, x, ORB_EPROTO, ORB_REMOTE_EFFECT_NONE, why);
            kill_locked(p, ORB_EPROTO, why);
            return;
        }
        s->x = x;
        if (p->nflight++ == 0)
            p->last_progress = orb_now_ns();
    }
    set_inflight_locked(p);
    orb_sh_ring_publish(&p->req); /* what this call staged, with one store */
}

int shm_peer_submit(void *peer, struct orb_xfer *const *xfers, size_t n)
{
    struct shm_peer *p = peer;
    struct shm_tp *tp = p->tp;
    pthread_mutex_lock(&p->lock);
    int dead = p->dead;
    bool stopping = p->stopping;
    /* An idle connection's thread looks at the socket only every few slices, so a source that
     * went (or was restarted) meanwhile would take these requests and fail them later. Refused
     * here, they fail whole at submission, where the segment can tell a restart (ESTALE) from a
     * death. A connection busy within the last millisecond is not asked: no source restarts
     * that fast, and the pipelined path makes no system call for it. */
    if (dead == 0 && !stopping && p->nflight == 0 && p->backlog == NULL &&
        orb_now_ns() - p->last_progress > SHM_IDLE_CHECK_NS && shm_sock_closed(p->sock)) {
        kill_locked(p, ORB_EPEER, "the same-host source closed the connection");
        dead = p->dead;
    }
    pthread_mutex_unlock(&p->lock);
    if (dead != 0)
        return orb_fail(dead, "shm: %s", p->dead_why);
    if (stopping || atomic_load(&tp->stopping))
        return orb_fail(ORB_ECLOSED, "shm: the transport is stopping");
    atomic_fetch_add(&tp->inflight, n);
    struct orb_xfer *head = NULL, **tail = &head;
    for (size_t i = 0; i < n; i++) {
        struct orb_xfer *x = xfers[i];
        const struct shm_reg_state *st =
            x->local_reg != NULL ? x->local_reg->tp_state[ORB_TRANSPORT_SHM] : NULL;
        uint32_t id = 0;
        int rc = st == NULL ? orb_fail(ORB_EUNAVAILABLE, "shm: the local bytes are not shareable memory")
                            : map_ensure(p, st, x->op == ORB_XFER_READ, &id);
        if (rc != 0) {
            char why[WHY_LEN];
            snprintf(why, sizeof why, "%s", orb_last_error());
            xfer_end(tp, x, rc, ORB_REMOTE_EFFECT_NONE, why);
            continue;
        }
        x->tag = id;
        x->next = NULL;
        *tail = x;
        tail = &x->next;
    }
    pthread_mutex_lock(&p->lock);
    if (head != NULL) {
        if (p->backlog_tail != NULL)
            p->backlog_tail->next = head;
        else
            p->backlog = head;
        p->backlog_tail = (struct orb_xfer *)((char *)tail - offsetof(struct orb_xfer, next));
        if (p->dead != 0)
            kill_locked(p, p->dead, p->dead_why);
        else
            pump_locked(p);
    }
    pthread_mutex_unlock(&p->lock);
    return 0;
}

void shm_peer_release(void *peer)
{
    struct shm_peer *p = peer;
    struct shm_tp *tp = p->tp;
    pthread_mutex_lock(&tp->lock);
    pthread_mutex_lock(&p->lock);
    p->released = true;
    wake_thread_locked(p);
    pthread_mutex_unlock(&p->lock);
    pthread_cond_broadcast(&tp->changed); /* a finished peer may be freed now */
    pthread_mutex_unlock(&tp->lock);
}

/* ---- choosing the transport ------------------------------------------------------------------- */

static void remember(struct shm_peer *p, uint64_t addr, uint64_t length, bool ok)
{
    pthread_mutex_lock(&p->lock);
    orb_range_memo_remember(&p->known, addr, length, ok, orb_deadline_after(SHM_REFUSAL_TTL_NS));
    pthread_mutex_unlock(&p->lock);
}

int shm_peer_accepts(void *peer, uint8_t op, const struct orb_reg *local, uint64_t remote_addr, uint64_t length,
                     uint64_t deadline)
{
    struct shm_peer *p = peer;
    if (local == NULL || local->tp_state[ORB_TRANSPORT_SHM] == NULL)
        return 0;
    uint64_t now = orb_now_ns();
    pthread_mutex_lock(&p->lock);
    int verdict = p->dead != 0 || p->stopping ? 0 : orb_range_memo_lookup(&p->known, remote_addr, length, now);
    pthread_mutex_unlock(&p->lock);
    if (verdict >= 0)
        return verdict;
    uint64_t probe = orb_deadline_after(SHM_PROBE_NS);
    if (deadline > probe) /* a choice of transport never waits long */
        deadline = probe;
    struct orb_shm_query q = {.op = op, .addr = remote_addr, .length = length};
    struct orb_shm_query_ok a;
    uint8_t req[ORB_CONTROL_MAX], resp[ORB_CONTROL_MAX];
    size_t len = 0, resp_len = 0;
    int rc = orb_shm_query_encode(&q, req, sizeof req, &len);
    if (rc == 0)
        rc = p->ctl.call(p->ctl.peer, ORB_TRANSPORT_SHM, req, len, resp, sizeof resp, &resp_len, deadline);
    if (rc == 0)
        rc = orb_shm_query_ok_decode(resp, resp_len, &a);
    /* Only host memory the source holds whole for this range travels here; anything else (device
     * memory, a range it does not know) goes where the others decide, and fails there if it must. */
    bool ok = rc == 0 && a.status == 0 && remote_addr >= a.base && length <= a.length &&
              remote_addr - a.base <= a.length - length;
    if (ok)
        remember(p, a.base, a.length, true);
    else
        remember(p, remote_addr, length, false);
    return ok ? 1 : 0;
}

/* ---- completions ------------------------------------------------------------------------------- */

static void take_completions(struct shm_peer *p);

/* The thread takes completions over from now on: the source wakes it at its next publication,
 * and what came before that (it woke no one) is taken here. */
static void hand_over(struct shm_peer *p)
{
    atomic_store(&p->handoff_at, 0);
    pthread_mutex_lock(&p->consume_lock);
    if (p->rings != NULL) { /* still there: the thread unmaps them only under this lock */
        orb_sh_ring_want_wake(&p->cpl, 1);
        take_completions(p);
    }
    pthread_mutex_unlock(&p->consume_lock);
}

int shm_peer_poll(void *peer, int step)
{
    struct shm_peer *p = peer;
    switch (step) {
    case ORB_POLL_BEGIN:
        /* The first poller tells the source that nobody needs waking: its completions cost it
         * no system call and this process no context switch. */
        if (atomic_fetch_add(&p->pollers, 1) == 0) {
            pthread_mutex_lock(&p->consume_lock);
            if (p->rings != NULL)
                orb_sh_ring_want_wake(&p->cpl, 0);
            pthread_mutex_unlock(&p->consume_lock);
        }
        return 0;
    case ORB_POLL_END:
        /* What the caller waited for settled: it is likely back within busy_poll_us (a pipeline
         * of batches), so the thread takes over only then, and no completion in between costs a
         * wake-up on either side. */
        if (atomic_fetch_sub(&p->pollers, 1) == 1)
            atomic_store(&p->handoff_at, orb_now_ns() + p->tp->handoff_ns);
        return 0;
    case ORB_POLL_HANDOFF:
        /* The caller goes on waiting, asleep: the thread takes over now. */
        if (atomic_fetch_sub(&p->pollers, 1) == 1)
            hand_over(p);
        return 0;
    default:
        break;
    }
    if (atomic_load(&p->inflight_now) == 0)
        return 0;
    if (pthread_mutex_trylock(&p->consume_lock) == 0) {
        if (p->rings != NULL) /* still there: the thread unmaps them only under this lock */
            take_completions(p);
        pthread_mutex_unlock(&p->consume_lock);
    }
    return atomic_load(&p->inflight_now) > 0;
}

/* Take every completion on the ring (consume_lock held, p->lock not). */
static void take_completions(struct shm_peer *p)
{
    enum { GROUP = 32 };
    uint8_t entries[GROUP][ORB_SH_RING_ENTRY];
    for (;;) {
        /* Take what is there (up to a group) off the ring, then settle it under one lock. */
        unsigned n = 0;
        int ring_rc = 0, rc = 0;
        while (n < GROUP && (ring_rc = orb_sh_ring_pop(&p->cpl, entries[n])) == 0)
            n++;
        if (n == 0 && ring_rc == ORB_EAGAIN)
            return;
        SHM_ORDER_ACQUIRE();
        pthread_mutex_lock(&p->lock);
        for (unsigned k = 0; k < n; k++) {
            struct orb_shm_completion cp;
            int bad = orb_shm_completion_decode(entries[k], &cp);
            uint32_t i = (uint32_t)cp.tag;
            if (bad == 0 &&
                (i >= SHM_RING_CAPACITY || p->slots[i].x == NULL || p->slots[i].gen != (uint32_t)(cp.tag >> 32)))
                bad = orb_fail(ORB_EPROTO, "shm: the source completed request tag 0x%llx, which is not in flight",
                               (unsigned long long)cp.tag);
            if (bad != 0) {
                rc = ORB_EPROTO;
                break;
            }
            struct orb_xfer *x = p->slots[i].x;
            p->slots[i].x = NULL;
            p->slots[i].gen++;
            p->nflight--;
            /* The cause travels in ORB_SHM_WHY_MAX bytes, which may cut off the range it names:
             * the range asked for is named here. */
            char why[ORB_SHM_WHY_MAX + 96];
            if (cp.status != 0)
                snprintf(why, sizeof why, "the source answered for [0x%llx, +%llu): %s",
                         (unsigned long long)x->request_remote_addr, (unsigned long long)x->request_length, cp.why);
            /* The source no longer serves that range as remembered: UNSPEC asks again next time. */
            if (cp.status == ORB_ENOENT || cp.status == ORB_EUNAVAILABLE)
                orb_range_memo_forget(&p->known, x->request_remote_addr, x->request_length);
            xfer_end(p->tp, x, cp.status, (enum orb_remote_effect)cp.effect, cp.status != 0 ? why : NULL);
        }
        if (rc == 0 && ring_rc != 0 && ring_rc != ORB_EAGAIN)
            rc = ring_rc; /* an impossible index: the message says which */
        if (rc != 0) {
            char why[WHY_LEN];
            snprintf(why, sizeof why, "the source broke the protocol: %s", orb_last_error());
            kill_locked(p, ORB_EPROTO, why);
            set_inflight_locked(p);
            pthread_mutex_unlock(&p->lock);
            return;
        }
        set_inflight_locked(p);
        p->last_progress = orb_now_ns();
        pump_locked(p);
        pthread_mutex_unlock(&p->lock);
        if (ring_rc == ORB_EAGAIN)
            return;
    }
}

static void *peer_main(void *arg)
{
    struct shm_peer *p = arg;
    orb_thread_name("shm-peer");
    struct shm_tp *tp = p->tp;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        if (p->nflight == 0 && p->backlog == NULL && (p->released || p->stopping || p->dead != 0))
            break;
        /* Idle, the thread looks at the socket now and then; busy, at the clock too. */
        uint64_t slice = orb_deadline_after(p->nflight == 0 ? SHM_SLEEP_SLICE_NS * 5 : SHM_SLEEP_SLICE_NS);
        pthread_mutex_unlock(&p->lock);
        uint64_t now = orb_now_ns(), handoff = atomic_load(&p->handoff_at);
        if (atomic_load(&p->pollers) > 0 || now < handoff) {
            /* Callers take the completions (or were doing so a moment ago and are likely back
             * soon): stand back, with the source waking no one, and look again after the
             * hand-over delay. A caller that stops polling but goes on waiting wakes this
             * thread (ORB_POLL_HANDOFF). */
            orb_sh_ring_want_wake(&p->cpl, 0);
            uint64_t until = atomic_load(&p->pollers) > 0 ? now + tp->handoff_ns : handoff;
            (void)orb_sh_ring_doze(&p->cpl, until < slice ? until : slice);
        } else {
            /* Nobody polls: sleep until the source publishes completions (it wakes this thread).
             * Never polling here: a caller that waits polls itself, and this thread spinning
             * beside it would take the CPU one of the two sides needs. A polling caller may pop
             * meanwhile: wait past the index read under its lock. */
            pthread_mutex_lock(&p->consume_lock);
            uint32_t at = p->cpl.index;
            pthread_mutex_unlock(&p->consume_lock);
            (void)orb_sh_ring_wait_at(&p->cpl, at, 0, slice);
            pthread_mutex_lock(&p->consume_lock);
            take_completions(p);
            pthread_mutex_unlock(&p->consume_lock);
        }
        pthread_mutex_lock(&p->lock);
        if (p->dead != 0)
            continue;
        if (shm_sock_closed(p->sock)) {
            /* Its last completions may have come just before it went. */
            pthread_mutex_unlock(&p->lock);
            pthread_mutex_lock(&p->consume_lock);
            take_completions(p);
            pthread_mutex_unlock(&p->consume_lock);
            pthread_mutex_lock(&p->lock);
            kill_locked(p, ORB_EPEER, p->nflight > 0 ? "the same-host source closed the connection (it may have "
                                                       "been restarted)"
                                                     : "the same-host source closed the connection");
        } else if (p->nflight > 0 && orb_now_ns() - p->last_progress > tp->io_timeout_ns) {
            kill_locked(p, ORB_EPEER, "the same-host source completed nothing within io_timeout_s");
        }
    }
    /* Ask the source to end the connection and wait (bounded) for it to, so that it has
     * stopped touching this process's buffers when the peer goes. */
    if (p->dead == 0)
        shutdown(p->sock, SHUT_WR);
    pthread_mutex_unlock(&p->lock);
    uint64_t deadline = orb_deadline_after(tp->io_timeout_ns);
    while (!shm_sock_closed(p->sock) && orb_now_ns() < deadline) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    /* The connection's descriptor and rings go now, not when the peer is freed (the next open or
     * the transport's stop): nothing uses them once the thread ends. sock_lock first: a MAP
     * round trip of a submission still under way ends before the descriptor does. */
    pthread_mutex_lock(&p->sock_lock);
    pthread_mutex_lock(&p->consume_lock); /* and a caller still taking completions */
    pthread_mutex_lock(&tp->lock);
    pthread_mutex_lock(&p->lock);
    if (p->dead == 0) {
        p->dead = ORB_ECLOSED;
        snprintf(p->dead_why, sizeof p->dead_why, "the same-host connection was closed");
    }
    close(p->sock);
    p->sock = -1;
    munmap(p->rings, p->rings_len);
    p->rings = NULL;
    p->finished = true;
    pthread_mutex_unlock(&p->lock);
    pthread_cond_broadcast(&tp->changed);
    pthread_mutex_unlock(&tp->lock);
    pthread_mutex_unlock(&p->consume_lock);
    pthread_mutex_unlock(&p->sock_lock);
    return NULL;
}

/* Requests in flight to every peer (tp->lock held). */
static uint32_t in_flight_locked(struct shm_tp *tp)
{
    uint32_t n = 0;
    for (struct shm_peer *p = tp->peers; p != NULL; p = p->next) {
        pthread_mutex_lock(&p->lock);
        n += p->nflight;
        pthread_mutex_unlock(&p->lock);
    }
    return n;
}

/* Quiescent once no request is in flight at any source: a source touches a requester's buffer
 * only while it serves one of its requests. Queued work fails now; the peers' threads then end
 * their connections on their own (joined by shm_requester_free). */
int shm_requester_stop(struct shm_tp *tp, uint64_t deadline)
{
    pthread_mutex_lock(&tp->lock);
    for (struct shm_peer *p = tp->peers; p != NULL; p = p->next) {
        pthread_mutex_lock(&p->lock);
        p->stopping = true;
        while (p->backlog != NULL) {
            struct orb_xfer *x = p->backlog;
            p->backlog = x->next;
            xfer_end(tp, x, ORB_ECLOSED, ORB_REMOTE_EFFECT_NONE, "shm: the engine is closing");
        }
        p->backlog_tail = NULL;
        wake_thread_locked(p);
        pthread_mutex_unlock(&p->lock);
    }
    uint32_t left;
    while ((left = in_flight_locked(tp)) > 0 && orb_now_ns() < deadline) {
        /* Peers signal tp->changed only when they finish: look again every millisecond. */
        struct timespec ts = orb_deadline_timespec(orb_deadline_after(1000000));
        pthread_cond_timedwait(&tp->changed, &tp->lock, &ts);
    }
    pthread_mutex_unlock(&tp->lock);
    if (left > 0)
        return orb_fail(ORB_EUNQUIESCED, "shm: %u requests are in flight at a same-host source, which writes and "
                        "reads this process's buffers itself until it completes them", left);
    return 0;
}

void shm_requester_free(struct shm_tp *tp)
{
    (void)shm_requester_stop(tp, ORB_DEADLINE_NONE);
    pthread_mutex_lock(&tp->lock);
    reap_locked(tp);
    while (tp->peers != NULL) {
        pthread_cond_wait(&tp->changed, &tp->lock);
        reap_locked(tp);
    }
    pthread_mutex_unlock(&tp->lock);
}
