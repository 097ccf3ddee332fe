/* orbite-helper's confinement steps (see sandbox.h for the capability decision). */
#include "helper/sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <linux/landlock.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <sys/syscall.h>

#include "core/error.h"
#include "helper/helper.h"

#define CAP_BITS 64

extern char **environ;

const unsigned long orb_sandbox_ioctls[] = {
    RDMA_VERBS_IOCTL, /* uverbs methods (uverbs.c): device contexts, DevX key queries */
};
const unsigned orb_sandbox_nioctls = sizeof orb_sandbox_ioctls / sizeof orb_sandbox_ioctls[0];

/* ---- environment, descriptors, process attributes ------------------------------------------- */

/* The bounds of the initial environment block, fields 50 and 51 (env_start, env_end) of
 * /proc/self/stat. The command name (field 2) may hold spaces and parentheses: fields are
 * counted from its last ')'. */
static bool environment_block(uintptr_t *start, uintptr_t *end)
{
    char text[2048];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return false;
    size_t used = 0;
    ssize_t n;
    while (used < sizeof text - 1 && (n = read(fd, text + used, sizeof text - 1 - used)) > 0)
        used += (size_t)n;
    (void)close(fd);
    text[used] = '\0';
    char *p = strrchr(text, ')');
    if (p == NULL)
        return false;
    unsigned long long v[2] = {0, 0};
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p + 1, " \n", &save); tok != NULL; tok = strtok_r(NULL, " \n", &save)) {
        field++;
        if (field == 50 || field == 51)
            v[field - 50] = strtoull(tok, NULL, 10);
    }
    if (v[0] == 0 || v[1] < v[0] || v[1] - v[0] > (64ull << 20))
        return false;
    *start = (uintptr_t)v[0];
    *end = (uintptr_t)v[1];
    return true;
}

int orb_sandbox_clear_environment(void)
{
    /* clearenv() only drops the pointers, and in secure mode ld.so has already removed some
     * pointers (LD_AUDIT, LD_PRELOAD, ...) while their strings stay in the initial block, which
     * /proc/PID/environ keeps showing. Wipe the block itself, and whatever environ points at. */
    uintptr_t start = 0, end = 0;
    bool have_block = environment_block(&start, &end);
    for (char **e = environ; e != NULL && *e != NULL; e++)
        memset(*e, 0, strlen(*e));
    if (have_block)
        memset((void *)start, 0, end - start);
    if (clearenv() != 0 || (environ != NULL && environ[0] != NULL))
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot clear the environment");
    if (!have_block)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot find the initial environment block in /proc/self/stat");
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

/* permitted and effective as given, inheritable and ambient empty; verified by reading back. */
static int set_caps(uint64_t permitted, uint64_t effective, const char *what)
{
    cap_t state = make_state(permitted, effective);
    if (state == NULL)
        return orb_fail(ORB_ENOMEM, "sandbox: out of memory for capability state");
    int rc = 0;
    if (cap_set_proc(state) != 0)
        rc = orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot %s: %s", what, strerror(errno));
    cap_free(state);
    if (rc == 0 && CAP_AMBIENT_SUPPORTED() && cap_reset_ambient() != 0)
        rc = orb_fail(ORB_EUNAVAILABLE, "sandbox: cannot clear ambient capabilities");
    struct orb_sandbox_caps after;
    if (rc == 0)
        rc = orb_sandbox_read_caps(&after);
    if (rc == 0 && (after.permitted != permitted || after.effective != effective || after.inheritable != 0 ||
                    after.ambient != 0))
        rc = orb_fail(ORB_EUNAVAILABLE, "sandbox: capabilities did not change as asked (%s)", what);
    return rc;
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
    /* Nothing runs with an effective capability from here on; only the monitor makes its two
     * effective again, once, after the fork. */
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
    rc = set_caps(kept, 0, "drop capabilities");
    if (rc != 0)
        return rc;
    *kept_out = kept;
    return 0;
}

int orb_sandbox_caps_effective(void)
{
    struct orb_sandbox_caps c;
    int rc = orb_sandbox_read_caps(&c);
    if (rc != 0)
        return rc;
    return set_caps(c.permitted, c.permitted, "make the monitor's capabilities effective");
}

int orb_sandbox_drop_all_caps(void)
{
    return set_caps(0, 0, "drop every capability");
}

/* ---- landlock ------------------------------------------------------------------------------- */

/* Kernel 6.2's right (ABI 3), older than some build machines' headers. */
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif

/* The filesystem rights this build knows, for the kernel's Landlock ABI `abi` (ioctl rights are
 * left alone: the worker's ioctls are on descriptors opened by the monitor). */
static uint64_t landlock_handled(long abi)
{
    uint64_t fs = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1; /* ABI 1: bits 0..12 */
    if (abi >= 2)
        fs |= LANDLOCK_ACCESS_FS_REFER;
    if (abi >= 3)
        fs |= LANDLOCK_ACCESS_FS_TRUNCATE;
    return fs;
}

static int landlock_allow(int ruleset, int dirfd, uint64_t access, uint64_t handled)
{
    if (dirfd < 0)
        return 0;
    struct landlock_path_beneath_attr rule = {.allowed_access = access & handled, .parent_fd = dirfd};
    if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: landlock_add_rule: %s", strerror(errno));
    return 0;
}

int orb_sandbox_restrict_paths(const struct orb_sandbox_paths *p)
{
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 1)
        return errno == ENOSYS || errno == EOPNOTSUPP ? 0 : orb_fail(ORB_EUNAVAILABLE, "sandbox: landlock: %s",
                                                                        strerror(errno));
    uint64_t handled = landlock_handled(abi);
    struct landlock_ruleset_attr attr = {.handled_access_fs = handled};
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    if (ruleset < 0)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: landlock_create_ruleset: %s", strerror(errno));
    const uint64_t read = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
    /* In a granted slot's directory: everything building and publishing its objects takes. */
    const uint64_t priv = read | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_MAKE_REG |
                          LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_REFER | LANDLOCK_ACCESS_FS_TRUNCATE;
    /* In /dev/shm itself: new names only. Files of other users there stay out of reach. */
    const uint64_t names = LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_REFER;
    const uint64_t node = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE;
    int rc = landlock_allow(ruleset, p->sysfs_fd, read, handled);
    if (rc == 0)
        rc = landlock_allow(ruleset, p->shm_fd, names, handled);
    for (unsigned i = 0; rc == 0 && i < p->nslot_dirs; i++)
        rc = landlock_allow(ruleset, p->slot_dir_fds[i], priv, handled);
    if (rc == 0)
        rc = landlock_allow(ruleset, p->proc_fd, LANDLOCK_ACCESS_FS_READ_FILE, handled);
    for (unsigned i = 0; rc == 0 && i < p->nnodes; i++)
        rc = landlock_allow(ruleset, p->node_fds[i], node, handled);
    if (rc == 0 && syscall(SYS_landlock_restrict_self, ruleset, 0) != 0)
        rc = orb_fail(ORB_EUNAVAILABLE, "sandbox: landlock_restrict_self: %s", strerror(errno));
    (void)close(ruleset);
    return rc == 0 ? 1 : rc;
}

/* ---- seccomp --------------------------------------------------------------------------------- */

/* Ints travel in 64-bit registers whose upper half the kernel ignores for them: compare the low
 * half only, so that garbage there can neither pass nor fail a rule by accident. */
#define LOW32 ((scmp_datum_t)0xFFFFFFFFu)
#define ARG_INT_EQ(n, v) SCMP_CMP64(n, SCMP_CMP_MASKED_EQ, LOW32, (scmp_datum_t)(uint32_t)(v))

/* Allowed with any arguments in both processes. */
static const int common_syscalls[] = {
    /* the socket(s) and waiting on them */
    SCMP_SYS(recvmsg), SCMP_SYS(sendmsg), SCMP_SYS(poll), SCMP_SYS(ppoll),
    /* descriptors already held */
    SCMP_SYS(read), SCMP_SYS(close), SCMP_SYS(fstat),
    /* memory (mmap and mprotect are restricted below) */
    SCMP_SYS(munmap), SCMP_SYS(brk), SCMP_SYS(madvise), SCMP_SYS(mremap),
    /* time, identity, process end */
    SCMP_SYS(clock_gettime), SCMP_SYS(getpid), SCMP_SYS(getuid), SCMP_SYS(geteuid), SCMP_SYS(futex),
    SCMP_SYS(sched_yield), SCMP_SYS(restart_syscall), SCMP_SYS(rt_sigreturn), SCMP_SYS(exit),
    SCMP_SYS(exit_group),
};

struct filter {
    scmp_filter_ctx ctx;
    int rc;
    const char *what;
};

static void allow(struct filter *f, const char *what, int nr, unsigned n, const struct scmp_arg_cmp *args)
{
    if (f->rc != 0)
        return;
    f->what = what;
    f->rc = seccomp_rule_add_array(f->ctx, SCMP_ACT_ALLOW, nr, n, args);
}

static void allow_common(struct filter *f)
{
    for (size_t i = 0; i < sizeof common_syscalls / sizeof common_syscalls[0]; i++)
        allow(f, "plain syscall", common_syscalls[i], 0, NULL);
    /* No executable memory, ever. */
    struct scmp_arg_cmp no_exec = SCMP_CMP64(2, SCMP_CMP_MASKED_EQ, (scmp_datum_t)PROT_EXEC, 0);
    allow(f, "mmap", SCMP_SYS(mmap), 1, &no_exec);
    allow(f, "mprotect", SCMP_SYS(mprotect), 1, &no_exec);
    static const int fcntl_cmds[] = {F_GETFD, F_SETFD, F_GETFL, F_DUPFD_CLOEXEC};
    for (size_t i = 0; i < sizeof fcntl_cmds / sizeof fcntl_cmds[0]; i++) {
        struct scmp_arg_cmp cmd = ARG_INT_EQ(1, fcntl_cmds[i]);
        allow(f, "fcntl", SCMP_SYS(fcntl), 1, &cmd);
    }
}

/* openat(dirfd, any name, flags) with exactly `flags`; nothing when dirfd is absent. */
static void allow_openat(struct filter *f, int dirfd, int flags)
{
    if (dirfd < 0)
        return;
    struct scmp_arg_cmp args[2] = {ARG_INT_EQ(0, dirfd), ARG_INT_EQ(2, flags)};
    allow(f, "openat", SCMP_SYS(openat), 2, args);
}

static int filter_load(struct filter *f)
{
    if (f->rc == 0) {
        f->what = "load";
        f->rc = seccomp_load(f->ctx);
    }
    seccomp_release(f->ctx);
    if (f->rc != 0)
        return orb_fail(ORB_EUNAVAILABLE, "sandbox: seccomp %s: %s", f->what ? f->what : "setup", strerror(-f->rc));
    return 0;
}

static int filter_init(struct filter *f)
{
    f->rc = 0;
    f->what = NULL;
    f->ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
    if (f->ctx == NULL)
        return orb_fail(ORB_ENOMEM, "sandbox: seccomp_init failed");
    allow_common(f);
    return 0;
}

int orb_sandbox_load_worker_filter(int sysfs_fd, int test_proc_fd)
{
    struct filter f;
    int rc = filter_init(&f);
    if (rc != 0)
        return rc;
    /* The peer-memory probe: fstatat() below the held sysfs directory. */
    if (sysfs_fd >= 0) {
        struct scmp_arg_cmp below_sysfs = ARG_INT_EQ(0, sysfs_fd);
        allow(&f, "newfstatat", SCMP_SYS(newfstatat), 1, &below_sysfs);
    }
    allow_openat(&f, test_proc_fd, O_RDONLY | O_CLOEXEC);
    for (unsigned i = 0; i < orb_sandbox_nioctls; i++) {
        /* The kernel takes the request as a 32-bit int: compare the low half only, so that
         * garbage in the upper half cannot slip a different request past the filter. */
        struct scmp_arg_cmp req = ARG_INT_EQ(1, orb_sandbox_ioctls[i] & 0xFFFFFFFFu);
        allow(&f, "ioctl", SCMP_SYS(ioctl), 1, &req);
    }
    return filter_load(&f);
}

int orb_sandbox_load_monitor_filter(const struct orb_sandbox_monitor_rules *r)
{
    struct filter f;
    int rc = filter_init(&f);
    if (rc != 0)
        return rc;
    /* fstat() is newfstatat(fd, "", AT_EMPTY_PATH) in glibc. The filter cannot tell an empty
     * path from another, so this also admits stat of any path (metadata, never contents). */
    struct scmp_arg_cmp empty_path = SCMP_CMP64(3, SCMP_CMP_MASKED_EQ, AT_EMPTY_PATH, AT_EMPTY_PATH);
    allow(&f, "newfstatat", SCMP_SYS(newfstatat), 1, &empty_path);
    allow_openat(&f, r->sysfs_fd, ORB_SANDBOX_ATTR_FLAGS);
    allow_openat(&f, r->devib_fd, ORB_SANDBOX_NODE_FLAGS);
    allow_openat(&f, r->shm_fd, ORB_SANDBOX_SLOT_NAME_FLAGS);
    for (unsigned i = 0; i < r->nslot_dirs && r->shm_fd >= 0; i++) {
        int dir = r->slot_dir_fds[i];
        allow_openat(&f, dir, ORB_SANDBOX_SLOT_OPEN_BASE | O_RDWR);
        allow_openat(&f, dir, ORB_SANDBOX_SLOT_OPEN_BASE | O_RDONLY);
        allow_openat(&f, dir, ORB_SANDBOX_SLOT_CREATE_FLAGS);
        allow_openat(&f, dir, ORB_SANDBOX_LOCK_FLAGS);
        /* A finished object enters /dev/shm under its name, never replacing anything. */
        struct scmp_arg_cmp move[3] = {ARG_INT_EQ(0, dir), ARG_INT_EQ(2, r->shm_fd), ARG_INT_EQ(4, RENAME_NOREPLACE)};
        allow(&f, "renameat2", SCMP_SYS(renameat2), 3, move);
        /* Each object's second link, made in its slot's directory. */
        struct scmp_arg_cmp link_args[3] = {ARG_INT_EQ(0, dir), ARG_INT_EQ(2, dir), ARG_INT_EQ(4, 0)};
        allow(&f, "linkat", SCMP_SYS(linkat), 3, link_args);
        /* Looking up links and orphans there. */
        struct scmp_arg_cmp in_dir = ARG_INT_EQ(0, dir);
        allow(&f, "newfstatat", SCMP_SYS(newfstatat), 1, &in_dir);
        /* An unfinished object or an orphaned link is removed from there; never a directory. */
        struct scmp_arg_cmp unlink_args[2] = {ARG_INT_EQ(0, dir), ARG_INT_EQ(2, 0)};
        allow(&f, "unlinkat", SCMP_SYS(unlinkat), 2, unlink_args);
    }
    if (r->nslot_dirs > 0 && r->shm_fd >= 0) {
        allow(&f, "getdents64", SCMP_SYS(getdents64), 0, NULL);
        struct scmp_arg_cmp mode = ARG_INT_EQ(1, ORB_HELPER_SLOT_MODE);
        allow(&f, "fchmod", SCMP_SYS(fchmod), 1, &mode);
        struct scmp_arg_cmp size = SCMP_CMP64(1, SCMP_CMP_EQ, (scmp_datum_t)ORB_HELPER_SLOT_SIZE, 0);
        allow(&f, "ftruncate", SCMP_SYS(ftruncate), 1, &size);
        allow(&f, "flock", SCMP_SYS(flock), 0, NULL);
        allow(&f, "getrandom", SCMP_SYS(getrandom), 0, NULL);
        if (r->chown) {
            struct scmp_arg_cmp owner[2] = {ARG_INT_EQ(1, r->chown_uid), ARG_INT_EQ(2, r->chown_gid)};
            allow(&f, "fchown", SCMP_SYS(fchown), 2, owner);
        }
    }
    return filter_load(&f);
}
