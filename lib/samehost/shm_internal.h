/* Internal: the same-host transport (ORB_TRANSPORT_SHM), for host memory of processes on one host.
 *
 * A request's bytes move by one copy, made by the *source*, between its own registered memory
 * and the requester's buffer, which the requester's memory file (orb_host_memory_alloc_shared)
 * lets the source map. So the source's memory is never handed to anyone: it checks every
 * request against its registry exactly as for TCP (the whole request, the operation's
 * permission, pinned while it copies), unregistering keeps the bytes until the copy ends, and
 * nothing of it outlives a request. What the requester hands over is its own buffer, mapped at
 * the source read-only for WRITEs and writable only for READs, unmapped when the requester's
 * registration is retired or the connection ends.
 *
 * Path of a segment: over the TCP control connection the requester asks INFO (the source's boot
 * id and Unix socket); on the same boot it connects to that socket, and the proof
 * (samehost/proof.h: HELLOs checked against SO_PEERCRED and the TCP handshake's epoch) makes it
 * a same-host path. The requester then sends the memory of two rings (SETUP): requests one way,
 * completions the other (samehost/ring.h), polled for busy_poll_us and then slept on a futex,
 * so that a waiter that can poll pays no wake-up. Each of its buffers is handed over once per
 * connection (MAP) before the first request that uses it. Messages: samehost/shm_msg.h. */
#ifndef ORB_SAMEHOST_SHM_INTERNAL_H
#define ORB_SAMEHOST_SHM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/transport.h"
#include "samehost/proof.h"
#include "samehost/ring.h"
#include "samehost/shm_msg.h"

#define SHM_RING_CAPACITY 256u                  /* entries of each ring; also a peer's in-flight bound */
#define SHM_SLEEP_SLICE_NS (20ull * 1000 * 1000) /* longest futex sleep before a thread looks around */
#define SHM_IDLE_CHECK_NS (1000ull * 1000) /* idle this long, a submission checks the socket first */
#define SHM_IDLE_SLICE_MAX_NS (1000ull * 1000 * 1000) /* the same for a connection with nothing to do */
#define SHM_HANDOFF_MIN_NS (50ull * 1000)        /* the shortest doze of a requester's thread beside pollers */
#define SHM_REFUSAL_TTL_NS (1000ull * 1000 * 1000)
#define SHM_PROBE_NS (1000ull * 1000 * 1000)     /* the longest a transport choice waits */
#define SHM_CONN_MAP_BYTES_MAX (1ull << 40)      /* bytes one connection may have mapped at the source */
#define SHM_MAP_BYTES_MAX (1ull << 43)           /* and every connection of a source together */

struct shm_conn;    /* a source connection (shm_source.c) */
struct shm_peer;    /* a requester's connection (shm_requester.c) */

/* A requester registration's shareable bytes (reg_attach's state): the memory file and the
 * page-aligned window of it that covers the registration. */
struct shm_reg_state {
    uint64_t serial;            /* never reused in this process: names the registration to peers */
    int fd;                     /* the owner's memory file, borrowed (the registration holds the owner) */
    uint64_t file_offset;       /* of the window, page-aligned */
    uint64_t length;            /* of the window, whole pages */
    uint64_t reg_offset;        /* the registration's first byte within the window */
};

struct shm_tp {
    orb_engine *engine;
    struct orb_epoch epoch;
    char boot_id[ORB_BOOT_ID_LEN + 1];
    uint32_t pid;
    uint64_t poll_ns;           /* busy_poll_us, when the CPUs allow spinning; else 0 */
    uint64_t handoff_ns;        /* how long a requester's thread stands back after callers polled */
    uint64_t io_timeout_ns;
    uint64_t hello_timeout_ns;
    bool enabled;               /* enable_shm */
    pthread_mutex_t lock;       /* the lists and counters below */
    pthread_cond_t changed;     /* monotonic clock */
    atomic_bool stopping;
    /* Source: the listening socket (-1 without a source) and its id, the accept thread, the
     * live connections. */
    int listen_fd;
    uint8_t id[ORB_SHM_ID_LEN];
    pthread_t accept_thread;
    bool accept_started;
    atomic_bool accept_quit;
    struct shm_conn *conns;
    uint32_t nconns;            /* every connection not yet reaped */
    uint32_t nproved;           /* those whose requester passed the proof: max_connections */
    uint64_t mapped_bytes;      /* every connection's maps */
    atomic_uint_fast64_t source_busy; /* requests being copied at the source */
    /* Requester: every peer not yet freed. */
    struct shm_peer *peers;
    atomic_uint_fast64_t inflight;    /* xfers accepted and not reported */
    atomic_uint_fast64_t next_serial;
};

/* The rings order a source's copies with its requester's use of the buffers, through memory the
 * two map at different addresses, which ThreadSanitizer cannot follow when both engines share
 * one process (the tests): these tell it about that order (no code otherwise). */
#if defined(__SANITIZE_THREAD__)
#define SHM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SHM_TSAN 1
#endif
#endif
#ifdef SHM_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
extern char shm_tsan_order;
#define SHM_ORDER_RELEASE() __tsan_release(&shm_tsan_order)
#define SHM_ORDER_ACQUIRE() __tsan_acquire(&shm_tsan_order)
#else
#define SHM_ORDER_RELEASE() ((void)0)
#define SHM_ORDER_ACQUIRE() ((void)0)
#endif

/* Source (shm_source.c). */
int shm_source_start(struct shm_tp *tp);
int shm_source_stop(struct shm_tp *tp, uint64_t deadline);
void shm_source_free(struct shm_tp *tp);
int shm_source_control(void *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len, uint8_t *resp,
                       size_t cap, size_t *resp_len);

/* Requester (shm_requester.c). */
int shm_peer_open(void *tp, const char *endpoint, const struct orb_epoch *expected, uint64_t deadline,
                  const struct orb_control_path *ctl, void **peer_out);
int shm_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan);
int shm_peer_submit(void *peer, struct orb_xfer *const *xfers, size_t n);
void shm_peer_release(void *peer);
int shm_peer_poll(void *peer, int step);
int shm_peer_accepts(void *peer, uint8_t op, const struct orb_reg *local, uint64_t remote_addr, uint64_t length,
                     uint64_t deadline);
/* A registration retires: every peer that mapped it tells its source to unmap it. */
void shm_requester_forget(struct shm_tp *tp, const struct shm_reg_state *st);
int shm_requester_stop(struct shm_tp *tp, uint64_t deadline);
void shm_requester_free(struct shm_tp *tp);

/* Sockets and memory files (shm_sock.c). Every wait ends by `deadline` (ORB_ETIMEDOUT). */
/* The abstract name of the socket with `id`, "\0orbite-shm-<32 hex>", and its length. */
size_t shm_sock_name(const uint8_t id[ORB_SHM_ID_LEN], char *out, size_t cap);
int shm_sock_listen(const uint8_t id[ORB_SHM_ID_LEN], int *fd_out);
int shm_sock_connect(const uint8_t id[ORB_SHM_ID_LEN], uint64_t deadline, int *fd_out);
/* Send one message, with `fd` attached when >= 0. */
int shm_sock_send(int sock, const uint8_t *msg, size_t len, int fd, uint64_t deadline);
/* Receive one message of at most `cap` bytes; *fd_out gets an attached descriptor (-1: none; any
 * beyond one, or one when fd_out is NULL, is closed and the message refused, ORB_EPROTO).
 * ORB_EPEER when the other end closed; ORB_EPROTO for a truncated message. */
int shm_sock_recv(int sock, uint8_t *buf, size_t cap, size_t *len_out, int *fd_out, uint64_t deadline);
/* 1 when the other end closed (or the socket failed), 0 otherwise; never blocks. */
int shm_sock_closed(int sock);
/* Map `length` bytes at `offset` of the memory file `fd` a peer sent, after checking it is one
 * that cannot make this process fault: a regular file of tmpfs (not hugetlbfs) sealed against
 * shrinking, at least offset + length bytes long. `writable` 0 maps it read-only. */
int shm_map_peer_file(int fd, uint64_t offset, uint64_t length, int writable, void **out);

#endif
