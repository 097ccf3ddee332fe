/* orbite-helper's confinement steps (see sandbox.h for the capability decision). */
#include "helper/sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <seccomp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <rdma/rdma_user_ioctl_cmds.h>

#include "core/error.h"
#include "helper/helper.h"

#define CAP_BITS 64
/* The kernel's own O_TMPFILE bit: glibc's __O_TMPFILE also carries O_DIRECTORY. */
#define KERNEL_O_TMPFILE_BIT 020000000

extern char **environ;

const unsigned long orb_sandbox_ioctls[] = {
    RDMA_VERBS_IOCTL, /* uverbs methods (uverbs.c): device contexts, DevX key queries */
};
const unsigned orb_sandbox_nioctls = sizeof orb_sandbox_ioctls / sizeof orb_sandbox_ioctls[0];

/* ---- environment, descriptors, process attributes ------------------------------------------- */

int orb_sandbox_clear_environment(void)
{
    /* clearenv() only drops the pointers: the strings stay in the initial stack block, which
     * /proc/PID/environ keeps showing. Wipe them first. */
    for (char **e = environ; e != NULL && *e != NULL; e++)
        memset(*e, 0, strlen(*e));
    if (clearenv() != 0 || (environ != NULL && environ[0] != NULL))
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot clear the environment");
    return 0;
}

/* The fallback for kernels without close_range(): collect, then close, so that closing does
 * not disturb the directory walk. */
static int close_fds_by_walk(int first)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot list /proc/self/fd: %s", strerror(errno));
    int self = dirfd(d);
    int *victims = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end = NULL;
        long fd = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd < first || fd == self || fd > INT32_MAX)
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            int *grown = realloc(victims, ncap * sizeof *grown);
            if (grown == NULL) {
                rc = orb_fail(ORB_ENOMEM, "sandbox: out of memory listing descriptors");
                goto free_list;
            }
            victims = grown;
            cap = ncap;
        }
        victims[n++] = (int)fd;
    }
    for (size_t i = 0; i < n; i++)
        (void)close(victims[i]);
free_list:
    free(victims);
    closedir(d);
    return rc;
}

int orb_sandbox_close_fds_from(int first)
{
    if (close_range((unsigned)first, ~0u, 0) == 0)
        return 0;
    if (errno != ENOSYS && errno != EINVAL)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: close_range: %s", strerror(errno));
    return close_fds_by_walk(first);
}

int orb_sandbox_null_stdio(void)
{
    int fd = open("/dev/null", O_RDWR | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot open /dev/null: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode) || major(st.st_rdev) != 1 || minor(st.st_rdev) != 3) {
        (void)close(fd);
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: /dev/null is not the null device");
    }
    for (int target = 0; target <= 2; target++) {
        if (fd != target && dup2(fd, target) != target) {
            int err = errno;
            (void)close(fd);
            return orb_fail(ORB_EUNAVAILABLE, "sandbox: dup2 to %d: %s", target, strerror(err));
        }
    }
    if (fd > 2)
        (void)close(fd);
    return 0;
}

int orb_sandbox_set_undumpable(void)
{
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 || prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot clear the dumpable flag");
    return 0;
}

int orb_sandbox_bind_to_parent(int sock)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: PR_SET_PDEATHSIG: %s", strerror(errno));
    int type = 0, domain = 0;
    socklen_t len = sizeof type;
    if (getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET)
        return orb_fail(ORB_EINVAL, "sandbox: fd %d is not a SOCK_SEQPACKET socket", sock);
    len = sizeof domain;
    if (getsockopt(sock, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX)
        return orb_fail(ORB_EINVAL, "sandbox: fd %d is not an AF_UNIX socket", sock);
    /* On a socketpair both ends report the process that created it: the library that then
     * forked us. A different parent now means it died before PDEATHSIG was armed and we were
     * re-parented (to init or a subreaper); its pid cannot come from anywhere we could trust
     * more. A library that is itself pid 1 (a container's main process) passes this check. */
    struct ucred cred;
    len = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred)
        return orb_fail(ORB_EINVAL, "sandbox: SO_PEERCRED on fd %d: %s", sock, strerror(errno));
    pid_t parent = getppid();
    if (parent != cred.pid)
        return orb_fail(ORB_EPEER, "sandbox: parent %d is not the socket's creator %d", (int)parent,
                        (int)cred.pid);
    return 0;
}

int orb_sandbox_no_new_privs(void)
{
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot set no_new_privs");
    return 0;
}

/* ---- capabilities ---------------------------------------------------------------------------- */

/* Prepared by orb_sandbox_drop_caps(): after it nothing is allocated, so raising and lowering
 * make exactly one capset() each. */
static uint64_t g_kept;
static cap_t g_lowered;
static cap_t g_raised[CAP_BITS];

static int cap_count(void)
{
    int n = (int)cap_max_bits();
    return n > CAP_BITS ? CAP_BITS : n;
}

int orb_sandbox_read_caps(struct orb_sandbox_caps *out)
{
    cap_t now = cap_get_proc();
    if (now == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cap_get_proc: %s", strerror(errno));
    struct orb_sandbox_caps c = {0, 0, 0, 0};
    int n = cap_count();
    for (int i = 0; i < n; i++) {
        cap_flag_value_t v;
        uint64_t bit = UINT64_C(1) << i;
        if (cap_get_flag(now, (cap_value_t)i, CAP_EFFECTIVE, &v) == 0 && v == CAP_SET)
            c.effective |= bit;
        if (cap_get_flag(now, (cap_value_t)i, CAP_PERMITTED, &v) == 0 && v == CAP_SET)
            c.permitted |= bit;
        if (cap_get_flag(now, (cap_value_t)i, CAP_INHERITABLE, &v) == 0 && v == CAP_SET)
            c.inheritable |= bit;
        if (cap_get_ambient((cap_value_t)i) > 0)
            c.ambient |= bit;
    }
    cap_free(now);
    *out = c;
    return 0;
}

/* A capability state with `permitted` and `effective` (inheritable empty). */
static cap_t make_state(uint64_t permitted, uint64_t effective)
{
    cap_t c = cap_init();
    if (c == NULL)
        return NULL;
    int n = cap_count();
    for (int i = 0; i < n; i++) {
        cap_value_t v = (cap_value_t)i;
        if ((permitted >> i) & 1u) {
            if (cap_set_flag(c, CAP_PERMITTED, 1, &v, CAP_SET) != 0)
                goto free_state;
        }
        if ((effective >> i) & 1u) {
            if (cap_set_flag(c, CAP_EFFECTIVE, 1, &v, CAP_SET) != 0)
                goto free_state;
        }
    }
    return c;
free_state:
    cap_free(c);
    return NULL;
}

int orb_sandbox_check_caps(void)
{
    uid_t ruid, euid, suid;
    gid_t rgid, egid, sgid;
    if (getresuid(&ruid, &euid, &suid) != 0 || getresgid(&rgid, &egid, &sgid) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot read the process ids");
    if (ruid != euid || ruid != suid || rgid != egid || rgid != sgid)
        return orb_fail(ORB_EPERM, "sandbox: set-user-id or set-group-id execution is refused");
    struct orb_sandbox_caps c;
    int rc = orb_sandbox_read_caps(&c);
    if (rc != 0)
        return rc;
    uint64_t unexpected = (c.permitted | c.effective | c.inheritable | c.ambient) & ~ORB_SANDBOX_CAPS_EXPECTED;
    if (ruid != 0 && unexpected != 0)
        return orb_fail(ORB_EPERM, "sandbox: unexpected capabilities 0x%llx (expected at most 0x%llx)",
                        (unsigned long long)unexpected, (unsigned long long)ORB_SANDBOX_CAPS_EXPECTED);
    /* Nothing runs with an effective capability from here on unless raised explicitly. */
    cap_t lowered = make_state(c.permitted, 0);
    if (lowered == NULL)
        return orb_fail(ORB_ENOMEM, "sandbox: out of memory for capability state");
    rc = cap_set_proc(lowered) == 0 ? 0 : orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot clear effective capabilities");
    cap_free(lowered);
    return rc;
}

int orb_sandbox_drop_caps(uint64_t *kept_out)
{
    struct orb_sandbox_caps c;
    int rc = orb_sandbox_read_caps(&c);
    if (rc != 0)
        return rc;
    uint64_t kept = c.permitted & ORB_SANDBOX_CAPS_EXPECTED;
    cap_t lowered = make_state(kept, 0);
    if (lowered == NULL)
        return orb_fail(ORB_ENOMEM, "sandbox: out of memory for capability state");
    if (cap_set_proc(lowered) != 0) {
        cap_free(lowered);
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot drop capabilities: %s", strerror(errno));
    }
    if (CAP_AMBIENT_SUPPORTED() && cap_reset_ambient() != 0) {
        cap_free(lowered);
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot clear ambient capabilities");
    }
    struct orb_sandbox_caps after;
    rc = orb_sandbox_read_caps(&after);
    if (rc == 0 && (after.permitted != kept || after.effective != 0 || after.inheritable != 0 || after.ambient != 0))
        rc = orb_fail(ORB_EUNAVAILABLE, "sandbox: capabilities did not drop as asked");
    if (rc != 0) {
        cap_free(lowered);
        return rc;
    }
    for (int i = 0; i < CAP_BITS; i++) {
        if (!((kept >> i) & 1u))
            continue;
        g_raised[i] = make_state(kept, UINT64_C(1) << i);
        if (g_raised[i] == NULL) {
            cap_free(lowered);
            return orb_fail(ORB_ENOMEM, "sandbox: out of memory for capability state");
        }
    }
    g_lowered = lowered;
    g_kept = kept;
    *kept_out = kept;
    return 0;
}

int orb_sandbox_raise(int cap)
{
    if (cap < 0 || cap >= CAP_BITS || !((g_kept >> cap) & 1u) || g_raised[cap] == NULL)
        return 0;
    if (cap_set_proc(g_raised[cap]) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot raise capability %d", cap);
    return 1;
}

void orb_sandbox_lower(void)
{
    if (g_lowered == NULL)
        return; /* nothing was ever raised */
    if (cap_set_proc(g_lowered) != 0)
        _exit(ORB_HELPER_EXIT_CAPS);
}

/* ---- seccomp --------------------------------------------------------------------------------- */

/* Allowed with any arguments. */
static const int plain_syscalls[] = {
    /* the socket to the library and waiting on it */
    SCMP_SYS(recvmsg), SCMP_SYS(sendmsg), SCMP_SYS(poll), SCMP_SYS(ppoll),
    /* files through held directory fds (flags restricted below for openat) */
    SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(close), SCMP_SYS(fstat), SCMP_SYS(newfstatat),
    /* shared slot objects */
    SCMP_SYS(flock), SCMP_SYS(fchown), SCMP_SYS(fchmod), SCMP_SYS(ftruncate), SCMP_SYS(getrandom),
    /* memory (mmap and mprotect are restricted below) */
    SCMP_SYS(munmap), SCMP_SYS(brk), SCMP_SYS(madvise), SCMP_SYS(mremap),
    /* time, identity, capability brackets, process end */
    SCMP_SYS(clock_gettime), SCMP_SYS(getpid), SCMP_SYS(getuid), SCMP_SYS(geteuid), SCMP_SYS(capget),
    SCMP_SYS(capset), SCMP_SYS(futex), SCMP_SYS(sched_yield), SCMP_SYS(restart_syscall),
    SCMP_SYS(rt_sigreturn), SCMP_SYS(exit), SCMP_SYS(exit_group),
};

/* Syscalls some architectures lack (libseccomp then refuses the rule, which is fine). */
static const int optional_syscalls[] = {SCMP_SYS(statx)};

int orb_sandbox_load_filter(void)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
    if (ctx == NULL)
        return orb_fail(ORB_ENOMEM, "sandbox: seccomp_init failed");
    int rc = 0;
    const char *what = NULL;
    for (size_t i = 0; i < sizeof plain_syscalls / sizeof plain_syscalls[0] && rc == 0; i++) {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, plain_syscalls[i], 0);
        what = "plain syscall";
    }
    for (size_t i = 0; i < sizeof optional_syscalls / sizeof optional_syscalls[0] && rc == 0; i++)
        (void)seccomp_rule_add(ctx, SCMP_ACT_ALLOW, optional_syscalls[i], 0);
    if (rc == 0) {
        /* openat: never creates or truncates a file, except the exact slot-creation call. */
        what = "openat";
        const scmp_datum_t creating = O_CREAT | O_TRUNC | KERNEL_O_TMPFILE_BIT;
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(openat), 1, SCMP_A2(SCMP_CMP_MASKED_EQ, creating, 0));
    }
    if (rc == 0) {
        const scmp_datum_t mask = O_ACCMODE | O_CREAT | O_EXCL | O_NOFOLLOW | O_TRUNC | KERNEL_O_TMPFILE_BIT | O_DIRECTORY;
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(openat), 1,
                              SCMP_A2(SCMP_CMP_MASKED_EQ, mask,
                                      (scmp_datum_t)(ORB_SANDBOX_SLOT_CREATE_FLAGS & (int)mask)));
    }
    if (rc == 0) {
        /* Removing a slot object we created and failed to finish; never a directory. */
        what = "unlinkat";
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(unlinkat), 1, SCMP_A2(SCMP_CMP_EQ, 0, 0));
    }
    if (rc == 0) {
        /* No executable memory, ever. */
        what = "mmap/mprotect";
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mmap), 1,
                              SCMP_A2(SCMP_CMP_MASKED_EQ, (scmp_datum_t)PROT_EXEC, 0));
        if (rc == 0)
            rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mprotect), 1,
                                  SCMP_A2(SCMP_CMP_MASKED_EQ, (scmp_datum_t)PROT_EXEC, 0));
    }
    static const int fcntl_cmds[] = {F_GETFD, F_SETFD, F_GETFL, F_DUPFD_CLOEXEC};
    for (size_t i = 0; i < sizeof fcntl_cmds / sizeof fcntl_cmds[0] && rc == 0; i++) {
        what = "fcntl";
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(fcntl), 1,
                              SCMP_A1(SCMP_CMP_EQ, (scmp_datum_t)fcntl_cmds[i], 0));
    }
    for (unsigned i = 0; i < orb_sandbox_nioctls && rc == 0; i++) {
        /* The kernel takes the request as a 32-bit int: compare the low half only, so that
         * garbage in the upper half cannot slip a different request past the filter. */
        what = "ioctl";
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, (scmp_datum_t)0xFFFFFFFFu,
                                      (scmp_datum_t)(orb_sandbox_ioctls[i] & 0xFFFFFFFFu)));
    }
    if (rc == 0) {
        what = "load";
        rc = seccomp_load(ctx);
    }
    seccomp_release(ctx);
    if (rc != 0)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: seccomp %s: %s", what ? what : "setup", strerror(-rc));
    return 0;
}
