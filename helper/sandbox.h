/* orbite-helper's confinement steps: environment, descriptors, process attributes, capabilities
 * and the two seccomp filters. main.c calls them in the documented start-up order; each step
 * either succeeds or the helper exits before serving anyone.
 *
 * Privilege separation. Once start-up is done the helper is two processes:
 *  - the worker (the process the library spawned) reads the library's datagrams. It holds no
 *    capability at all, and its filter admits no openat(), unlinkat(), fchown(), fchmod() or
 *    capset(): a memory-safety bug in the message codec gains nothing the tenant lacks, beyond
 *    the descriptors the policy already granted;
 *  - the monitor (its child) holds the capabilities, effective, and does only two privileged
 *    steps for the worker, each checked against the decision made at start-up: open a granted
 *    NIC's uverbs node, and create or attach a granted slot object. It reads nothing but the
 *    worker's fixed-size requests. Its filter admits openat() only on its held directory
 *    descriptors with fixed flags, renameat2() only from the private directory into /dev/shm
 *    without replacing, unlinkat() only in the private directory, fchown() only to the
 *    administrator, and no capset().
 *
 * Capabilities the monitor keeps (at most these two, permitted):
 *  - CAP_DAC_OVERRIDE: open a NIC's uverbs node, so that a site can restrict the nodes (udev
 *    MODE/GROUP) and make the helper the only way to them; use the administrator's private
 *    directory in /dev/shm; open administrator-owned slot objects read-write to publish them;
 *  - CAP_CHOWN: give a new slot object (and the private directory) to the administrator, which
 *    is what makes a slot name impossible to squat: only a helper can produce an object with
 *    that owner and mode.
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

/* openat() flags of the monitor's one call that creates a slot object (in the private directory). */
#define ORB_SANDBOX_SLOT_CREATE_FLAGS (O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC)

/* The ioctl request numbers the filter admits, compared on their low 32 bits. */
extern const unsigned long orb_sandbox_ioctls[];
extern const unsigned orb_sandbox_nioctls;

/* 2. Empty the environment (before any library call can read it), and wipe the whole initial
 * environment block that /proc/PID/environ shows, strings the dynamic loader already dropped
 * from `environ` in secure mode (LD_AUDIT, LD_PRELOAD, ...) included. Errors: ORB_EUNAVAILABLE. */
int orb_sandbox_clear_environment(void);

/* 1. Close every descriptor from `first` up (close_range, or a /proc/self/fd walk on kernels
 * without it). Errors: ORB_EUNAVAILABLE. */
int orb_sandbox_close_fds_from(int first);

/* 2. stdin, stdout and stderr to /dev/null. Errors: ORB_EUNAVAILABLE. */
int orb_sandbox_null_stdio(void);

/* 3. Not dumpable: no core file, no ptrace or /proc/PID/mem by the tenant. */
int orb_sandbox_set_undumpable(void);

/* 4. Die with the parent (PR_SET_PDEATHSIG SIGKILL) and check it is still there: the parent pid
 * cannot be passed safely, so a helper re-parented to init (getppid() == 1) exits, as does one
 * whose fd `sock` is not an AF_UNIX SOCK_SEQPACKET socket. Errors: ORB_EPEER (orphan),
 * ORB_EINVAL (not our socket). */
int orb_sandbox_bind_to_parent(int sock);

/* 5. PR_SET_NO_NEW_PRIVS. */
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

/* 7. Keep only the expected capabilities that are permitted now: permitted = that set,
 * effective, inheritable and ambient empty; verified by reading them back. *kept_out receives
 * the permitted set. Errors: ORB_EUNAVAILABLE, ORB_ENOMEM. */
int orb_sandbox_drop_caps(uint64_t *kept_out);

/* The monitor, once forked: effective = permitted (the kept set), in one capset() made before
 * its filter forbids capset(). Verified by reading back. Errors: ORB_EUNAVAILABLE. */
int orb_sandbox_caps_effective(void);

/* The worker, once forked: every capability set empty (permitted included), verified.
 * Errors: ORB_EUNAVAILABLE, ORB_ENOMEM. */
int orb_sandbox_drop_all_caps(void);

/* What Landlock leaves reachable (orb_sandbox_restrict_paths); -1 and 0: nothing of that kind. */
struct orb_sandbox_paths {
    int sysfs_fd;         /* read-only, beneath */
    int shm_fd;           /* /dev/shm: new names only (create, rename into), no reading or writing */
    const int *slot_dir_fds; /* the granted slots' directories in the private one: read, write, */
    unsigned nslot_dirs;     /* create, link, remove, rename */
    int proc_fd;          /* the test build's /proc/self: read-only, beneath */
    const int *node_fds;  /* single files (O_PATH descriptors of the granted uverbs nodes): read-write */
    unsigned nnodes;
};

/* Landlock, before the filter: from now on this process reaches only the files `p` names, with
 * those rights, whatever names it is made to use ("../" included) and whatever CAP_DAC_OVERRIDE
 * would allow: seccomp cannot see names, Landlock can. With nothing named it reaches no file at
 * all. Returns 1 when applied, 0 when the kernel has no Landlock (the seccomp rules still
 * hold), negative (ORB_EUNAVAILABLE) on failure. Needs no_new_privs. */
int orb_sandbox_restrict_paths(const struct orb_sandbox_paths *p);

/* The worker's filter (default: kill the process). `sysfs_fd` is the one directory fstatat()
 * may name; `test_proc_fd` (the test build's /proc/self, -1 as installed) the one openat()
 * may, read-only. Errors: ORB_EUNAVAILABLE, ORB_ENOMEM. */
int orb_sandbox_load_worker_filter(int sysfs_fd, int test_proc_fd);

/* What the monitor's filter admits as arguments: its held directories (-1: absent, then no
 * rule names it) and the one owner fchown() may give (when `chown` is set). */
struct orb_sandbox_monitor_rules {
    int sysfs_fd;   /* sysfs attributes, read-only */
    int devib_fd;   /* uverbs nodes, O_RDWR, never created */
    int shm_fd;     /* slot names: looked at (O_PATH), never read, written, created or removed */
    const int *slot_dir_fds; /* the granted slots' directories in the private one: new objects, */
    unsigned nslot_dirs;     /* their links, lock files */
    bool chown;
    uint32_t chown_uid;
    uint32_t chown_gid; /* (uint32_t)-1: unchanged */
};
int orb_sandbox_load_monitor_filter(const struct orb_sandbox_monitor_rules *rules);

/* The exact flags of the monitor's calls, which its filter compares. */
#define ORB_SANDBOX_NODE_FLAGS (O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY)
#define ORB_SANDBOX_ATTR_FLAGS (O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)
#define ORB_SANDBOX_SLOT_OPEN_BASE (O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)
#define ORB_SANDBOX_LOCK_FLAGS (O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY)
/* What /dev/shm itself is opened with: a name looked at, never read or written through. */
#define ORB_SANDBOX_SLOT_NAME_FLAGS (O_PATH | O_NOFOLLOW | O_CLOEXEC)

#endif
