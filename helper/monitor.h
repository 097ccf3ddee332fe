/* orbite-helper's privileged monitor (see sandbox.h for why there are two processes).
 *
 * The worker asks, the monitor answers, over a SOCK_SEQPACKET socketpair made at start-up:
 *
 *   request  (24 bytes): u32 magic | u32 type | u32 index | u32 zero | u64 interval_ns
 *   reply     (8 bytes): u32 magic | i32 status, with one descriptor when status is 0
 *
 *   ORB_MON_OPEN_NODE  index = NIC id; the descriptor is the NIC's uverbs node, O_RDWR
 *   ORB_MON_SLOT       index = position in the policy's slot list, interval_ns the slot's
 *                      interval; the descriptor is the object, read-only, for the library
 *
 * The monitor decides from what was fixed at start-up alone (the tenant's policy, the NIC
 * table), never from the worker's word: a NIC the policy does not grant, a slot index past the
 * list, a datagram of another size, a descriptor or any other control message from the worker
 * ends the monitor, and with it every privileged step of the session. It also publishes the
 * slots it holds the lock of, every millisecond, whatever the worker or the library does. */
#ifndef ORB_HELPER_MONITOR_H
#define ORB_HELPER_MONITOR_H

#include <stdint.h>
#include <sys/types.h>

struct orb_helper_state;

#define ORB_MON_MAGIC 0x4e4f4d4fu /* "OMON" */
#define ORB_MON_TIMEOUT_MS 10000  /* the worker's bound on one answer */

enum orb_mon_type {
    ORB_MON_OPEN_NODE = 1,
    ORB_MON_SLOT = 2,
};

/* The two privileged steps, as the request handlers call them. Each returns 0 with a new
 * descriptor in *fd_out (the caller owns it), a refusal status (the reply's), or ORB_EPEER when
 * the monitor is gone or misbehaved (the session then ends with st->exit_code set). */
struct orb_helper_priv_ops {
    int (*open_node)(struct orb_helper_state *st, int nic_id, int *fd_out);
    int (*open_slot)(struct orb_helper_state *st, uint32_t slot_index, uint64_t interval_ns, int *fd_out);
};

/* In this process, with this process's descriptors and capabilities: what the monitor runs,
 * and what in-process tests use. The policy checks are made here too. */
extern const struct orb_helper_priv_ops orb_helper_priv_local;

/* Through st->monitor_sock, waiting at most ORB_MON_TIMEOUT_MS for each answer. */
extern const struct orb_helper_priv_ops orb_helper_priv_remote;

/* Fork the monitor. In the worker (the caller) it returns 0 with st->monitor_sock set and
 * st->priv = &orb_helper_priv_remote; the child never returns: it drops the library's socket,
 * dies with the worker (PR_SET_PDEATHSIG), makes its capabilities effective, prepares the
 * private directory, loads its filter, serves, and _exits. Errors: ORB_EUNAVAILABLE. */
int orb_helper_monitor_start(struct orb_helper_state *st);

/* The monitor's loop on `sock`: requests and slot publication. Returns when the worker closes
 * its end (0) or breaks the rules (negative, the reason in the detail message). */
int orb_helper_monitor_serve(struct orb_helper_state *st, int sock);

#endif
