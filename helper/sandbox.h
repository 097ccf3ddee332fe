/* orbite-helper's confinement: environment, descriptors, process attributes, capabilities and
 * the seccomp filter. main.c calls these in the documented start-up order; each step either
 * succeeds or the helper exits before serving anyone.
 *
 * Capabilities. The helper keeps at most two, permitted only, and raises one to effective just
 * around the call that needs it:
 *  - CAP_DAC_OVERRIDE around openat() of a NIC's uverbs node, so that a site can restrict the
 *    nodes (udev MODE/GROUP) and make the helper the only way to them, and around the read-write
 *    re-open of a shared slot object owned by the administrator;
 *  - CAP_CHOWN around fchown() of a newly created slot object to the administrator, which is
 *    what makes a slot name impossible to squat: only a helper can produce an object with that
 *    owner and mode.
 * CAP_NET_RAW is deliberately not kept: mlx5 grants a DevX context raw-packet rights when its
 * creator holds CAP_NET_RAW at creation, and the tenant's context must never get them. DevX
 * itself and the key queries need no capability. */
#ifndef ORB_HELPER_SANDBOX_H
#define ORB_HELPER_SANDBOX_H

#include <stdbool.h>
#include <fcntl.h>
#include <stdint.h>

#include <linux/capability.h>

/* Bit n: capability n. The only capabilities orbite-helper may hold. */
#define ORB_SANDBOX_CAPS_EXPECTED ((UINT64_C(1) << CAP_DAC_OVERRIDE) | (UINT64_C(1) << CAP_CHOWN))

/* openat() flags of the one call allowed to create a file (a new slot object). */
#define ORB_SANDBOX_SLOT_CREATE_FLAGS (O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC)

/* The ioctl request numbers the filter admits, compared on their low 32 bits. */
extern const unsigned long orb_sandbox_ioctls[];
extern const unsigned orb_sandbox_nioctls;

/* 1. Empty the environment (before any library call can read it). Errors: ORB_EUNAVAILABLE. */
int orb_sandbox_clear_environment(void);

/* 2. Close every descriptor from `first` up (close_range, or a /proc/self/fd walk on kernels
 * without it). Errors: ORB_EUNAVAILABLE. */
int orb_sandbox_close_fds_from(int first);

/* 3. stdin, stdout and stderr to /dev/null. Errors: ORB_EUNAVAILABLE. */
int orb_sandbox_null_stdio(void);

/* 4. Not dumpable: no core file, no ptrace or /proc/PID/mem by the tenant. */
int orb_sandbox_set_undumpable(void);

/* 5. Die with the parent (PR_SET_PDEATHSIG SIGKILL) and check it is still there: the parent pid
 * cannot be passed safely, so a helper re-parented to init (getppid() == 1) exits, as does one
 * whose fd `sock` is not an AF_UNIX SOCK_SEQPACKET socket. Errors: ORB_EPEER (orphan),
 * ORB_EINVAL (not our socket). */
int orb_sandbox_bind_to_parent(int sock);

/* 6. PR_SET_NO_NEW_PRIVS. */
int orb_sandbox_no_new_privs(void);

/* Read the process's capabilities (bit n: capability n). */
struct orb_sandbox_caps {
    uint64_t effective, permitted, inheritable, ambient;
};
int orb_sandbox_read_caps(struct orb_sandbox_caps *out);

/* Refuse capabilities the helper does not expect, and clear the effective set at once.
 * A non-root process (real uid != 0) holding anything outside ORB_SANDBOX_CAPS_EXPECTED is a
 * wrong installation (a file capability too many) and fails with ORB_EPERM; a root process has
 * every capability by being root, and drops the others in orb_sandbox_drop_caps(). The real and
 * effective ids must be equal (never setuid or setgid): ORB_EPERM otherwise. */
int orb_sandbox_check_caps(void);

/* 8. Keep only the expected capabilities that are permitted now: permitted = that set,
 * effective, inheritable and ambient empty; verified by reading them back. *kept_out receives
 * the permitted set. Prepares the raise/lower states used later (no allocation after this).
 * Errors: ORB_EUNAVAILABLE, ORB_ENOMEM. */
int orb_sandbox_drop_caps(uint64_t *kept_out);

/* Raise `cap` to effective around one privileged call: 1 when raised, 0 when the helper does not
 * hold it (the call then runs unprivileged), negative on failure. */
int orb_sandbox_raise(int cap);

/* Clear the effective set again. A failure here would leave a capability effective: the helper
 * exits rather than serve in that state. */
void orb_sandbox_lower(void);

/* 9. Load the seccomp allow-list (default: kill the process). Errors: ORB_EUNAVAILABLE,
 * ORB_ENOMEM. */
int orb_sandbox_load_filter(void);

#endif
