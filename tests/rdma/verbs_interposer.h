/* A test-only interposer over the process's loaded verbs table (lib/rdma/verbs.h), never part of
 * the installed library: it replaces entries of the table orb_verbs_get() hands out with
 * wrappers that count their calls and, once a failure is armed, fail the Nth matching call from
 * then on, the way a device would. Install it before any engine starts; it stays for the
 * process's lifetime. Thread-safe. */
#ifndef ORB_TESTS_RDMA_VERBS_INTERPOSER_H
#define ORB_TESTS_RDMA_VERBS_INTERPOSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

enum itp_verb {
    ITP_POST_SEND,
    ITP_POST_RECV,
    ITP_DESTROY_QP,
    ITP_DEREG_MR,
    ITP_ALLOC_MW,                 /* fails with NULL and errno `err` */
    ITP_DEALLOC_MW,
    ITP_DESTROY_CQ,
    ITP_DEALLOC_PD,
    ITP_REG_MR,                   /* ibv_reg_mr_iova2 (counted only) */
    ITP_REG_DMABUF_MR,            /* ibv_reg_dmabuf_mr (counted, recorded: itp_last_dmabuf) */
    ITP_VERBS
};

/* What the armed post_send does. */
enum itp_post_failure {
    ITP_REFUSED_NAMED,        /* not posted; bad_wr names the WR: proven not taken */
    ITP_REFUSED_UNNAMED,      /* not posted; bad_wr NULL: the caller cannot know */
    ITP_TAKEN_UNNAMED,        /* posted for real, then an error with bad_wr NULL */
    ITP_WRONG_KEY,            /* posted for real with its remote key altered: the peer refuses */
    ITP_QP_TO_ERROR,          /* the queue pair moved to the error state first, then posted for
                               * real: it and everything outstanding on the queue pair flush */
};

/* 0, or -1 when libibverbs cannot be loaded (the message says why). */
int itp_install(void);

/* From now on, the `nth` (1-based) call of `verb` that matches fails with errno value `err`
 * (destroy and dealloc calls do nothing else: the object stays); for ITP_POST_SEND only WRs of
 * `opcode` match (-1: any) and `how` says how it fails. One armed failure per verb: arming
 * again replaces it. */
void itp_arm(enum itp_verb verb, uint64_t nth, int err, int opcode, enum itp_post_failure how);
void itp_disarm(enum itp_verb verb);
/* `fn(arg)` runs once, in the posting thread, when the armed post_send fires and before it does
 * what it was armed to do (NULL: nothing). */
void itp_on_armed_post(void (*fn)(void *), void *arg);

/* Calls of `verb` since the interposer was installed, and how many of them it failed. */
uint64_t itp_calls(enum itp_verb verb);
uint64_t itp_failures(enum itp_verb verb);

/* The arguments of the last ibv_reg_dmabuf_mr call, and whether its descriptor was open then. */
struct itp_dmabuf_call {
    uint64_t offset, length, iova;
    int fd, access;
    int fd_was_open;
};
struct itp_dmabuf_call itp_last_dmabuf(void);
/* The arguments of the last ibv_reg_mr_iova2 call (ibv_reg_mr comes through it too). */
struct itp_reg_mr_call {
    uint64_t addr, length, iova;
    int access;
};
struct itp_reg_mr_call itp_last_reg_mr(void);
/* From now on, each scatter entry of the RDMA READ and WRITE work requests posted is counted as
 * inside [lo, hi) or not (hi <= lo: watch nothing); the counts start again at 0. */
struct itp_payload_watch {
    uint64_t inside, outside, bytes_inside;
};
void itp_watch_payload(uint64_t lo, uint64_t hi);
struct itp_payload_watch itp_payload_seen(void);
/* With `on`, ibv_reg_dmabuf_mr is served by mapping the descriptor (a memfd of the CUDA stand-in)
 * and registering those host pages at the same iova with ibv_reg_mr_iova2: a device that takes
 * dma-buf, for the data path's sake. Off (the default): the real call, which soft-RoCE refuses. */
void itp_dmabuf_as_host(int on);

/* With `view` set (NULL: off), ibv_reg_mr of an address `view` knows (device memory of the CUDA
 * stand-in) registers the host bytes it names, at the address asked for as the MR's iova: a NIC
 * reaching device memory through a peer-memory module, as a test double. */
void itp_device_as_host(void *(*view)(unsigned long long addr, size_t len));
/* Work requests posted since the interposer was installed, by kind: window binds, SENDs
 * (fenced: IBV_SEND_FENCE set) and SENDs with invalidate. */
struct itp_wr_counts {
    uint64_t binds, sends, fenced_sends, sends_with_inv;
};
struct itp_wr_counts itp_wrs_posted(void);

/* Memory windows allocated through the interposer and not deallocated (a failed dealloc keeps
 * its window). */
int64_t itp_live_mws(void);

/* Where the order of completion queue creation stands now (0 before the first). */
uint64_t itp_cq_mark(void);
/* Each completion queue of device `device` made after itp_cq_mark() returned `mark` (0: every
 * one) that exists now reports an error: the next get_async_event on its context returns
 * IBV_EVENT_CQ_ERR for it (made up: the queue still works, and acknowledging the event reaches
 * no device). How many queues. */
uint32_t itp_break_cqs_since(const char *device, uint64_t mark);

/* The next `count` successful SEND completions this process polls (a requester's rail-ending
 * SENDs) are held back for `delay_ms` from when they were polled, and then handed out by a
 * later poll of their queue as IBV_WC_WR_FLUSH_ERR: a queue pair that died right after its SEND
 * arrived, before the transport acknowledged it, seen after whatever the peer answered
 * meanwhile. Only a lane that polls again sees them (progress_mode polling). `count` 0: none
 * is held from now on, and those still held are dropped. */
void itp_hold_send_completions(uint32_t count, uint32_t delay_ms);
/* How many held completions were handed out since the last itp_hold_send_completions(). */
uint32_t itp_held_send_completions(void);

/* For doubles of device features built over the interposer (devx_double.h):
 *  - the real entries of the table, which neither count nor fail;
 *  - a filter run over each list of work requests as it goes to the device (after any armed
 *    failure was decided on what the caller posted; it may rewrite them in place), and one run
 *    over the completions each poll hands out (it may rewrite them); NULL: none;
 *  - the route a queue pair was last connected on (modify_qp to RTR: its own GID, the peer's
 *    number and GID), by the queue pair, or by its device context (NULL: any) and number. */
struct orb_verbs;
const struct orb_verbs *itp_real(void);
void itp_filter_posts(void (*fn)(struct ibv_qp *qp, struct ibv_send_wr *wr));
void itp_filter_completions(void (*fn)(struct ibv_cq *cq, struct ibv_wc *wc, int n));
struct itp_qp_route {
    uint32_t qpn, dest_qpn;
    union ibv_gid sgid, dgid;
};
bool itp_qp_route_of(const struct ibv_qp *qp, struct itp_qp_route *out);
bool itp_qp_route(const struct ibv_context *ctx, uint32_t qpn, struct itp_qp_route *out);
/* Whether a memory region made through the table on `pd`, of local key `lkey` and not
 * deregistered, covers [addr, +len) of its address space (its iova). */
bool itp_mr_covers(const struct ibv_pd *pd, uint32_t lkey, uint64_t addr, uint64_t len);

#endif
