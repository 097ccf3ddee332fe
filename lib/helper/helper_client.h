/* Internal: the library's side of orbite-helper.
 *
 * orb_helper_open() forks and executes the installed helper (a path fixed at build time, never
 * taken from the environment) with an empty environment, /dev/null as stdin/stdout/stderr and
 * one end of a SOCK_SEQPACKET socketpair as fd 3; nothing else is inherited. Then it says HELLO
 * (exact protocol version) and every later call is one or more request/reply exchanges
 * (common/helper_proto.h) under a deadline.
 *
 * Fail closed: a reply with the wrong type, sequence number, length or descriptor count, a
 * malformed body, an oversized or truncated datagram is ORB_EPROTO; a helper that hangs up or
 * dies is ORB_EPEER; a reply that does not arrive in time is ORB_ETIMEDOUT. Each of these ends
 * the session: the socket is closed at once and every later call returns the same status. A
 * reply that carries a refusal (for instance ORB_EPERM from the policy, or ORB_EPROTO for a
 * damaged slot object) is returned as that status and the session stays usable.
 *
 * Thread-safe: calls on one session may come from any thread; they are serialised (one
 * request in flight at a time). orb_helper_close() must not race with other calls on the same
 * session.
 *
 * The RDMA transport uses the helper, and the NVLink one asks it for the policy on first use; a
 * TCP-only engine never opens a session. */
#ifndef ORB_HELPER_HELPER_CLIENT_H
#define ORB_HELPER_HELPER_CLIENT_H

#include <stdint.h>

#include <orbite/orbite.h>

#include "common/helper_proto.h"
#include "topo/inventory.h"

struct orb_helper;

/* What the helper said about itself in its HELLO reply. */
struct orb_helper_info {
    uint32_t version;    /* ORB_HP_VERSION */
    uint32_t uid;        /* the tenant: the helper's real uid, equal to ours */
    uint32_t gid;        /* the helper's real gid, equal to ours */
    uint32_t caps_kept;  /* bit n: capability n is still permitted in the helper */
    int32_t pid;         /* the helper process */
};

/* Start a helper and say HELLO, within `timeout_ns` (also the deadline of every later call on
 * the session, and of the helper's exit at close). The caller owns `*out` and releases it with
 * orb_helper_close().
 * Errors: ORB_EINVAL (NULL, bad mode), ORB_EUNAVAILABLE (`mode` is ORB_HELPER_OFF, or the
 * helper is not installed or cannot be executed: the message names the path and errno),
 * ORB_EPEER (it exited before replying), ORB_EPROTO (bad reply, another protocol version, or an
 * identity other than our real uid/gid), ORB_ETIMEDOUT, ORB_ENOMEM, or the status of a HELLO the
 * helper refused. */
int orb_helper_open(enum orb_helper_mode mode, uint64_t timeout_ns, struct orb_helper **out);

/* Whether a failed orb_helper_open() lets the caller carry on without the helper: only when
 * the helper is absent or switched off (ORB_EUNAVAILABLE), and never in ORB_HELPER_REQUIRED. A
 * helper that is installed but misbehaves is an error in every mode. */
int orb_helper_failure_tolerated(enum orb_helper_mode mode, int status);

/* Copy the HELLO reply's facts. Errors: ORB_EINVAL. */
int orb_helper_info(const struct orb_helper *h, struct orb_helper_info *out);

/* The host inventory as the helper shows it to this tenant (filtered by policy): NICs, GPUs
 * and NUMA nodes, fetched one item per exchange (index 0 of a kind answered ORB_ENOENT means
 * none of that kind, since a successful reply always carries an item). `*out` is written only
 * on success.
 * Errors: ORB_EINVAL, ORB_EPROTO (a count above the model's maximum, a count that changes
 * between pages, ids out of order), the session errors above, or the helper's refusal. */
int orb_helper_inventory(struct orb_helper *h, struct orb_topo_inventory *out);

/* What this tenant may use. Errors: as orb_helper_inventory(). */
int orb_helper_policy(struct orb_helper *h, struct orb_hp_policy *out);

/* A uverbs command fd for mlx5 NIC `nic`, opened and checked by the helper after its policy
 * check, with a device context already created on it: adopt it with ibv_import_device(). The
 * caller owns `*fd_out` (O_CLOEXEC). Errors: ORB_EINVAL (NULL or a name that is not one path
 * component of [A-Za-z0-9_.-]{1,64}), the helper's refusal (ORB_EPERM denied by policy or a
 * node that failed its checks, ORB_ENOENT no such NIC, ORB_EUNAVAILABLE not an mlx5 device or
 * no node, ORB_EAGAIN, ORB_ENOMEM from the kernel; docs/helper-protocol.md), the session
 * errors. */
int orb_helper_open_device(struct orb_helper *h, const char *nic, int *fd_out);

/* Which of the GPU peer-memory module's version files exist (bit i: candidate i, in the order
 * of NCCL's probe). Errors: as orb_helper_inventory(). */
int orb_helper_peermem_probe(struct orb_helper *h, uint32_t *found_out);

/* Attach to (or create) the shared slot object `slot`, published every `interval_ns`; returns a
 * read-only fd the caller owns (O_CLOEXEC). Errors: ORB_EINVAL (NULL or a bad name here, or an
 * interval the helper does not accept), the helper's refusal (ORB_EPERM a name the policy does
 * not grant, or an object that fails its checks: squatted or symlinked name, wrong owner, mode,
 * link count, size or type, another boot or time namespace; ORB_EPROTO a damaged header;
 * ORB_ECONFIG an object of another interval; ORB_ERESOURCE 16 objects already attached;
 * ORB_EUNAVAILABLE no /dev/shm, no clock domain, or a capability the creation needs is
 * missing), the session errors. */
int orb_helper_slot_attach(struct orb_helper *h, const char *slot, uint64_t interval_ns,
                           int *fd_out);

/* Ask the helper to check a memory key's device context before it is published: 0 when the key
 * grants exactly what `v` says. `v->obj_handle` is the handle of the DevX object that created
 * `v->key`, in the device context of the fd OPEN_DEVICE returned for `v->nic` (the helper queries
 * the key through that object). Errors: ORB_ENOENT (no such NIC), ORB_EPERM (the policy does
 * not grant the NIC or the rdma transport, the key grants something else, or the handle is not
 * this key's object), ORB_EINVAL (bad arguments, or no OPEN_DEVICE of that NIC yet),
 * ORB_EUNAVAILABLE (not an mlx5 device, a context created without DevX, no DevX object query),
 * the session errors. */
int orb_helper_devx_verify(struct orb_helper *h, const struct orb_hp_devx_verify *v);

/* End the session: close the socket (the helper exits on EOF), wait up to the session's
 * timeout (at most 5 s) for it to exit, then SIGKILL and reap it. A helper the application
 * already reaped (SIGCHLD ignored, waitpid(-1)) is left alone. NULL is a no-op. */
void orb_helper_close(struct orb_helper *h);

/* The installed helper's absolute path, fixed at build time (static text). */
const char *orb_helper_installed_path(void);

/* ---- tests only ------------------------------------------------------------------------------ */

/* Run `path` with `args` (NULL-terminated, may be NULL) after argv[0] instead of the installed
 * helper, for this process's later orb_helper_open() calls; NULL `path` restores the installed
 * one. Not exported from liborbite.so; production code never calls it. Errors: ORB_EINVAL
 * (more than 15 arguments), ORB_ENOMEM. */
int orb_helper_test_set_command(const char *path, const char *const *args);

#endif
