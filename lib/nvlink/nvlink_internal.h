/* Internal: the NVLink (CUDA IPC) transport, for processes on one host.
 *
 * A request's bytes move by one device-to-device copy on the requester's copy engines, between
 * its local device memory and the source's allocation mapped into the requester's process (an
 * IPC import, made once per peer allocation and cached). Over the segment's TCP control
 * connection (nvlink_msg.h) the requester sends the source each group of up to
 * ORB_NVL_GROUP_MAX requests; the source authorises each as a whole, waits for producer work
 * recorded on it, lends the range, and answers with the IPC handle of each allocation. After the
 * copies the requester ends the group; the source then lets the ranges go. When that end is not
 * acknowledged (the connection died, the group's lease ran out), no request of the group
 * completes: a copy into the source may have been changed or overlapped later work.
 *
 * An IPC handle maps a whole allocation, writable, into the peer: the source exports only
 * allocations one registration covers whole with remote write permission. The engine does not
 * load libcuda for this transport: only device memory, which loaded it already, travels here. */
#ifndef ORB_NVLINK_NVLINK_INTERNAL_H
#define ORB_NVLINK_NVLINK_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/transport.h"
#include "nvlink/nvlink_msg.h"

#define NVL_GROUPS_MAX 1024u       /* groups a source holds at once, for every requester */
#define NVL_GROUPS_PER_SENDER 256u /* and for one requester engine */
#define NVL_IMPORTS_MAX 64u        /* imports one peer keeps; the least recently used goes */
#define NVL_REFUSAL_TTL_NS (1000ull * 1000 * 1000) /* how long a refused range is remembered */
#define NVL_HELLO_RETRY_NS (5000ull * 1000 * 1000) /* how long a failed HELLO is remembered */
#define NVL_PROBE_NS (1000ull * 1000 * 1000)       /* the longest a transport choice waits */

struct nvl_group;                  /* a group held at the source */
struct nvl_peer;

struct nvl_tp {
    struct nvl_tp *next_in_process; /* every NVLink transport of this process (nvlink_transport.c) */
    orb_engine *engine;
    struct orb_epoch epoch;        /* the engine's source epoch and bound endpoint ("" without) */
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_nvl_hello self;
    uint64_t lease_ns;             /* a group's hold at the source without an END */
    pthread_mutex_t lock;
    pthread_cond_t changed;        /* groups, peers and stopping (monotonic clock) */
    atomic_bool stopping;
    /* Source: the groups held, and the thread that ends those whose lease ran out. */
    struct nvl_group *groups;
    uint32_t ngroups;
    pthread_t lease_thread;
    bool lease_thread_started;
    bool lease_quit;               /* under lock: the lease thread ends (destroy only) */
    /* Source: the descriptor channel (nvlink_fdchan.c), opened on the first BEGIN that shares an
     * allocation by descriptor; chan_fd -1 until then (under lock). */
    int chan_fd;
    uint8_t chan_id[ORB_NVL_ID_LEN];
    pthread_t chan_thread;
    bool chan_started;
    atomic_bool chan_quit;
    /* Whether the administrator's policy gives this tenant NVLink (nvlink_policy.c): 0 not asked
     * yet, 1 yes (or no helper applies), -1 no, with why. */
    pthread_mutex_t policy_lock;
    int policy_state;
    char policy_why[192];
    /* Requester: every peer not yet freed (those whose thread finished are freed by the next
     * peer_open or by stop). */
    struct nvl_peer *peers;
    uint32_t live_threads;
    atomic_uint_fast64_t inflight; /* xfers accepted and not reported */
};

/* Source: answer a control message (ops->control). */
int nvl_source_control(void *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len, uint8_t *resp,
                       size_t cap, size_t *resp_len);
int nvl_source_start(struct nvl_tp *tp);
/* Wait until `deadline` for requesters to end the groups held. 0, or ORB_EUNQUIESCED (held). */
int nvl_source_stop(struct nvl_tp *tp, uint64_t deadline);
uint64_t nvl_source_groups(struct nvl_tp *tp);
/* End the lease thread and let every group go (at destroy). */
void nvl_source_free(struct nvl_tp *tp);

/* The source's descriptor channel: a Unix SEQPACKET socket in the abstract namespace
 * ("orbite-nvl-" and tp->chan_id in hex), answering FETCH with FETCH_OK and the descriptor. */
#define NVL_FETCH_WAIT_NS (250ull * 1000000ull) /* the most a connection may take to send its FETCH */
/* Open it once (later calls: 0 at once). 0, or why it cannot be had (the message says). */
int nvl_fdchan_open(struct nvl_tp *tp);
/* End its thread and close it (at destroy). */
void nvl_fdchan_close(struct nvl_tp *tp);
/* Source (nvlink_source.c): the descriptor (the caller's to close) and size of allocation
 * f->alloc of the group held under f->token. 0, or the refusal with the detail message. */
int nvl_source_fetch(struct nvl_tp *tp, const struct orb_nvl_fetch *f, int *fd_out, uint64_t *size_out);
/* Requester: ask the channel `channel` of this host for `f` until `deadline`. 0 with the
 * descriptor (the caller's to close) and the allocation's size, or the failure. */
int nvl_fdchan_fetch(const uint8_t channel[ORB_NVL_ID_LEN], const struct orb_nvl_fetch *f, uint64_t deadline,
                     int *fd_out, uint64_t *size_out);

/* 0 when the transport may be used by this engine's tenant, else ORB_EUNAVAILABLE naming why
 * (asked of the helper on the first call, then remembered for the engine's life). */
int nvl_policy_check(struct nvl_tp *tp);

/* Requester (ops->peer_*). */
int nvl_peer_open(void *tp, const char *endpoint, const struct orb_epoch *expected, uint64_t deadline,
                  const struct orb_control_path *ctl, void **peer_out);
int nvl_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan);
int nvl_peer_submit(void *peer, struct orb_xfer *const *xfers, size_t n);
void nvl_peer_release(void *peer);
int nvl_peer_accepts(void *peer, uint8_t op, const struct orb_reg *local, uint64_t remote_addr, uint64_t length,
                     uint64_t deadline);
/* Fail every queued xfer with ORB_ECLOSED, wait for the peers' threads until `deadline` and free
 * the peers. 0, or ORB_EUNQUIESCED (a copy did not end by then: the peers stay). */
int nvl_requester_stop(struct nvl_tp *tp, uint64_t deadline);
/* Join and free every peer (at destroy, once every segment released its peers). */
void nvl_requester_free(struct nvl_tp *tp);

/* Wait for tp->changed (tp->lock held) until it is signalled or `deadline` (ORB_DEADLINE_NONE:
 * no bound) passes. */
void nvl_wait_locked(struct nvl_tp *tp, uint64_t deadline);
/* Where this process runs (nvlink_transport.c). */
int nvl_self_hello(struct orb_nvl_hello *out);
/* Whether an engine of this process serves `epoch` at `endpoint`: then a segment to it reaches
 * this very process. Never taken from the wire, where a peer could claim it. */
bool nvl_source_in_this_process(const struct orb_epoch *epoch, const char *endpoint);

#endif
