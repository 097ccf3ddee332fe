/* The two seccomp filters of orbite-helper, loaded for real: each case forks a child that opens
 * its directory descriptors in a fresh fixture tree, loads the worker's or the monitor's filter,
 * makes the calls of the case and exits. A case either runs to exit 0 (every call passed the
 * filter and did what it should) or is killed with SIGSYS by its one forbidden call.
 *
 * Between loading the filter and _exit() a child makes only the calls of its case: no stdio, no
 * assertions, no allocation that could need a system call the filter does not admit. A wrong
 * result is reported as the child's exit status (the number of the step that went wrong).
 *
 * Each refused call is also made once without any filter (where it can succeed there: some only
 * as root), so that a refusal shows the filter stopping a call that would otherwise have worked,
 * not a fixture that was never going to let it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/capability.h>

#include "helper/helper.h"
#include "helper/sandbox.h"

/* Child exit statuses of the harness itself (a case's own steps use 1..99). */
#define EXIT_FIXTURE 100 /* a fixture descriptor could not be opened */
#define EXIT_NO_DUMP 101 /* the core-dump guard could not be set */
#define EXIT_LOAD 102    /* the filter did not load */

enum filter_kind {
    F_MONITOR,          /* every directory, fchown() to the test's own uid and gid */
    F_MONITOR_KEEP_GID, /* every directory, fchown() to the test's uid, group unchanged */
    F_MONITOR_NO_CHOWN, /* every directory, no fchown() rule */
    F_WORKER,           /* the sysfs directory, no test /proc directory (as installed) */
    F_WORKER_PROC,      /* the sysfs directory and the test build's /proc/self */
    F_MONITOR_PATHS,    /* as F_MONITOR, after Landlock confined it beneath its directories */
};

/* Whether a refused call is expected to succeed once without the filter. */
enum control {
    CTL_NONE,    /* it cannot (or need not) succeed on its own */
    CTL_OK,      /* it succeeds for any user */
    CTL_OK_ROOT, /* it succeeds with root's capabilities (checked only when run as root) */
};

/* The descriptors a child holds before its filter is loaded. */
struct env {
    int root_fd;  /* the fixture root: a directory no rule names */
    int sysfs_fd; /* root/sysfs */
    int devib_fd; /* root/dev */
    int shm_fd;   /* root/shm (01777) */
    int priv_fd;  /* root/shm/priv (0700) */
    int proc_fd;  /* /proc/self */
    int file_fd;  /* root/x, O_RDWR: the test's own regular file */
    uid_t uid;
    gid_t gid;
};

struct filter_case {
    const char *name;
    enum filter_kind filter;
    int (*call)(const struct env *e); /* 0: every step did what it should; n: step n did not */
    bool expect_sigsys;
    enum control control; /* refused cases only */
};

static const char *filter_name(enum filter_kind k)
{
    switch (k) {
    case F_MONITOR:
        return "monitor";
    case F_MONITOR_KEEP_GID:
        return "monitor, group unchanged";
    case F_MONITOR_NO_CHOWN:
        return "monitor, no chown";
    case F_WORKER:
        return "worker";
    case F_WORKER_PROC:
        return "worker, test /proc";
    case F_MONITOR_PATHS:
        return "monitor under Landlock";
    }
    return "?";
}

/* ---- the fixture tree ------------------------------------------------------------------------ */

static void make_file(const char *root, const char *rel, mode_t mode, const char *content)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    size_t len = strlen(content);
    assert_int_equal(write(fd, content, len), (ssize_t)len);
    assert_int_equal(fchmod(fd, mode), 0);
    assert_int_equal(close(fd), 0);
}

static void make_dir(const char *root, const char *rel, mode_t mode)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(chmod(path, mode), 0); /* past the umask, sticky bit included */
}

/* root/{x, sysfs/attr, dev/uverbs0, shm/{planted, a, priv/{a, d/}}}. priv lies inside shm so
 * that renameat2() between them stays on one filesystem. */
static void make_fixture(char *root, size_t len)
{
    snprintf(root, len, "/tmp/orbite-filters-XXXXXX");
    assert_non_null(mkdtemp(root));
    make_file(root, "x", 0600, "0123456789\n");
    make_dir(root, "sysfs", 0755);
    make_file(root, "sysfs/attr", 0444, "1\n");
    make_dir(root, "dev", 0755);
    make_file(root, "dev/uverbs0", 0666, "");
    make_file(root, "dev/issm0", 0666, ""); /* a node no policy grants */
    make_dir(root, "shm", 01777);
    make_file(root, "shm/planted", 0644, "slot\n");
    make_file(root, "shm/a", 0600, "a\n");
    make_dir(root, "shm/priv", 0700);
    make_file(root, "shm/priv/a", 0600, "a\n");
    make_dir(root, "shm/priv/d", 0700);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static void remove_tree(const char *root)
{
    (void)nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- the child ------------------------------------------------------------------------------- */

static int open_dir_at(int at, const char *name)
{
    return openat(at, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

static int load_filter(enum filter_kind k, const struct env *e)
{
    struct orb_sandbox_monitor_rules rules = {
        .sysfs_fd = e->sysfs_fd,
        .devib_fd = e->devib_fd,
        .shm_fd = e->shm_fd,
        .slot_dir_fds = &e->priv_fd,
        .nslot_dirs = 1,
        .chown = true,
        .chown_uid = (uint32_t)e->uid,
        .chown_gid = (uint32_t)e->gid,
    };
    switch (k) {
    case F_MONITOR:
        return orb_sandbox_load_monitor_filter(&rules);
    case F_MONITOR_KEEP_GID:
        rules.chown_gid = (uint32_t)-1;
        return orb_sandbox_load_monitor_filter(&rules);
    case F_MONITOR_NO_CHOWN:
        rules.chown = false;
        return orb_sandbox_load_monitor_filter(&rules);
    case F_WORKER:
        return orb_sandbox_load_worker_filter(e->sysfs_fd, -1);
    case F_WORKER_PROC:
        return orb_sandbox_load_worker_filter(e->sysfs_fd, e->proc_fd);
    case F_MONITOR_PATHS: {
        /* This kernel has Landlock (ABI 2 or later): a missing one would fail the case. The
         * node directory is reachable through its granted node alone. */
        int node = openat(e->devib_fd, "uverbs0", O_PATH | O_NOFOLLOW | O_CLOEXEC);
        struct orb_sandbox_paths reach = {
            .sysfs_fd = e->sysfs_fd, .shm_fd = e->shm_fd, .slot_dir_fds = &e->priv_fd, .nslot_dirs = 1,
            .proc_fd = -1, .node_fds = &node, .nnodes = 1};
        if (node < 0 || orb_sandbox_restrict_paths(&reach) != 1)
            return -1;
        close(node);
        return orb_sandbox_load_monitor_filter(&rules);
    }
    }
    return -1;
}

static _Noreturn void child(const struct filter_case *c, const char *root, bool filtered)
{
    struct env e;
    e.uid = getuid();
    e.gid = getgid();
    e.root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    e.sysfs_fd = open_dir_at(e.root_fd, "sysfs");
    e.devib_fd = open_dir_at(e.root_fd, "dev");
    e.shm_fd = open_dir_at(e.root_fd, "shm");
    e.priv_fd = open_dir_at(e.shm_fd, "priv");
    e.proc_fd = open("/proc/self", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    e.file_fd = openat(e.root_fd, "x", O_RDWR | O_CLOEXEC);
    if (e.root_fd < 0 || e.sysfs_fd < 0 || e.devib_fd < 0 || e.shm_fd < 0 || e.priv_fd < 0 || e.proc_fd < 0 ||
        e.file_fd < 0)
        _exit(EXIT_FIXTURE);
    /* A process killed by its filter would otherwise leave a core dump per refused case. */
    struct rlimit no_core = {0, 0};
    if (setrlimit(RLIMIT_CORE, &no_core) != 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        _exit(EXIT_NO_DUMP);
    if (filtered && load_filter(c->filter, &e) != 0)
        _exit(EXIT_LOAD);
    _exit(c->call(&e));
}

/* ---- the cases: monitor, admitted -------------------------------------------------------------- */

/* A slot object's whole life as slots.c lives it: created in the private directory, sized,
 * given its mode and owner, moved into /dev/shm without replacing, opened both ways; a lock file
 * created, locked and removed; a sysfs attribute and a uverbs node opened. */
static int mon_slot_lifecycle(const struct env *e)
{
    int fd = openat(e->priv_fd, "new+1", ORB_SANDBOX_SLOT_CREATE_FLAGS, 0600);
    if (fd < 0)
        return 1;
    if (linkat(e->priv_fd, "new+1", e->priv_fd, "obj+1", 0) != 0)
        return 17;
    if (ftruncate(fd, ORB_HELPER_SLOT_SIZE) != 0)
        return 2;
    if (fchmod(fd, ORB_HELPER_SLOT_MODE) != 0)
        return 3;
    if (fchown(fd, e->uid, e->gid) != 0)
        return 4;
    if (renameat2(e->priv_fd, "new+1", e->shm_fd, "slot", RENAME_NOREPLACE) != 0)
        return 5;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != ORB_HELPER_SLOT_SIZE || (st.st_mode & 07777) != ORB_HELPER_SLOT_MODE ||
        st.st_uid != e->uid || st.st_gid != e->gid || st.st_nlink != 2)
        return 6;
    if (close(fd) != 0)
        return 7;
    /* The name is only looked at; the object is opened through its private link. */
    int named = openat(e->shm_fd, "slot", ORB_SANDBOX_SLOT_NAME_FLAGS);
    struct stat ns, ls;
    if (named < 0 || fstat(named, &ns) != 0 || fstatat(e->priv_fd, "obj+1", &ls, AT_SYMLINK_NOFOLLOW) != 0 ||
        ns.st_ino != ls.st_ino)
        return 18;
    int ro = openat(e->priv_fd, "obj+1", O_RDONLY | ORB_SANDBOX_SLOT_OPEN_BASE);
    if (ro < 0)
        return 8;
    int rw = openat(e->priv_fd, "obj+1", O_RDWR | ORB_SANDBOX_SLOT_OPEN_BASE);
    if (rw < 0)
        return 9;
    int lock = openat(e->priv_fd, "slot+1.lock", ORB_SANDBOX_LOCK_FLAGS, 0600);
    if (lock < 0)
        return 10;
    if (flock(lock, LOCK_EX | LOCK_NB) != 0)
        return 11;
    if (unlinkat(e->priv_fd, "slot+1.lock", 0) != 0)
        return 12;
    /* Orphaned links are found by listing the private directory. */
    char dents[1024];
    if (syscall(SYS_getdents64, e->priv_fd, dents, sizeof dents) <= 0)
        return 19;
    int attr = openat(e->sysfs_fd, "attr", ORB_SANDBOX_ATTR_FLAGS);
    if (attr < 0)
        return 13;
    char buf[8];
    if (read(attr, buf, sizeof buf) != 2 || buf[0] != '1')
        return 14;
    int node = openat(e->devib_fd, "uverbs0", ORB_SANDBOX_NODE_FLAGS);
    if (node < 0)
        return 15;
    if (close(ro) != 0 || close(rw) != 0 || close(lock) != 0 || close(attr) != 0 || close(node) != 0 ||
        close(named) != 0)
        return 16;
    return 0;
}

/* What the monitor no longer does: read or write a /dev/shm file through its name, or link
 * anything into /dev/shm. */
static int mon_read_shm_name(const struct env *e)
{
    return openat(e->shm_fd, "planted", O_RDONLY | ORB_SANDBOX_SLOT_OPEN_BASE) >= 0 ? 0 : 1;
}

static int mon_link_into_shm(const struct env *e)
{
    return linkat(e->priv_fd, "a", e->shm_fd, "linked", 0) == 0 ? 0 : 1;
}

static int mon_unfinished_removed(const struct env *e)
{
    int fd = openat(e->priv_fd, "new+2", ORB_SANDBOX_SLOT_CREATE_FLAGS, 0600);
    if (fd < 0)
        return 1;
    if (unlinkat(e->priv_fd, "new+2", 0) != 0)
        return 2;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_nlink != 0)
        return 3;
    return close(fd) == 0 ? 0 : 4;
}

/* What both filters admit with any arguments, and the monitor's getrandom(). */
static int common_calls(const struct env *e)
{
    int dup = fcntl(e->file_fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
        return 2;
    if (fcntl(dup, F_GETFD) != FD_CLOEXEC || (fcntl(dup, F_GETFL) & O_ACCMODE) != O_RDWR)
        return 3;
    if (fcntl(dup, F_SETFD, 0) != 0 || close(dup) != 0)
        return 4;
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 5;
    if (mprotect(p, 4096, PROT_READ) != 0 || munmap(p, 4096) != 0)
        return 6;
    char buf[4];
    if (read(e->file_fd, buf, sizeof buf) != (ssize_t)sizeof buf || buf[0] != '0')
        return 7;
    if (getpid() <= 0)
        return 8;
    return 0;
}

static int mon_common_calls(const struct env *e)
{
    struct stat st;
    if (fstat(e->file_fd, &st) != 0 || !S_ISREG(st.st_mode))
        return 1;
    int rc = common_calls(e);
    if (rc != 0)
        return rc;
    char random[16];
    return getrandom(random, sizeof random, 0) == (ssize_t)sizeof random ? 0 : 20;
}

static int mon_fchown_keep_gid(const struct env *e)
{
    return fchown(e->file_fd, e->uid, (gid_t)-1) == 0 ? 0 : 1;
}

/* ---- the cases: refused calls (monitor and worker) ---------------------------------------------- */

static int open_passwd(const struct env *e)
{
    (void)e;
    int fd = openat(AT_FDCWD, "/etc/passwd", O_RDONLY);
    return fd >= 0 ? 0 : 1;
}

static int mon_create_in_shm(const struct env *e)
{
    return openat(e->shm_fd, "x", O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600) >= 0 ? 0 : 1;
}

static int mon_create_flags_in_shm(const struct env *e)
{
    return openat(e->shm_fd, "x", ORB_SANDBOX_SLOT_CREATE_FLAGS, 0600) >= 0 ? 0 : 1;
}

static int mon_slot_truncated(const struct env *e)
{
    return openat(e->shm_fd, "planted", O_RDWR | O_TRUNC | ORB_SANDBOX_SLOT_OPEN_BASE) >= 0 ? 0 : 1;
}

static int mon_node_other_flags(const struct env *e)
{
    return openat(e->devib_fd, "uverbs0", O_RDONLY | O_CLOEXEC) >= 0 ? 0 : 1;
}

static int mon_node_created(const struct env *e)
{
    return openat(e->devib_fd, "uverbs9", ORB_SANDBOX_NODE_FLAGS | O_CREAT, 0600) >= 0 ? 0 : 1;
}

static int mon_attr_writable(const struct env *e)
{
    return openat(e->sysfs_fd, "attr", (ORB_SANDBOX_ATTR_FLAGS & ~O_ACCMODE) | O_RDWR) >= 0 ? 0 : 1;
}

static int mon_create_elsewhere(const struct env *e)
{
    return openat(e->root_fd, "new", ORB_SANDBOX_SLOT_CREATE_FLAGS, 0600) >= 0 ? 0 : 1;
}

static int mon_lock_elsewhere(const struct env *e)
{
    return openat(e->shm_fd, "planted.lock", ORB_SANDBOX_LOCK_FLAGS, 0600) >= 0 ? 0 : 1;
}

static int mon_unlink_in_shm(const struct env *e)
{
    return unlinkat(e->shm_fd, "planted", 0) == 0 ? 0 : 1;
}

static int unlink_elsewhere(const struct env *e)
{
    return unlinkat(e->root_fd, "x", 0) == 0 ? 0 : 1;
}

static int mon_rmdir_in_priv(const struct env *e)
{
    return unlinkat(e->priv_fd, "d", AT_REMOVEDIR) == 0 ? 0 : 1;
}

/* The system call itself: glibc's renameat2() may make a flags-0 rename with renameat(). */
static int mon_rename_replacing(const struct env *e)
{
    return syscall(SYS_renameat2, e->priv_fd, "a", e->shm_fd, "b", 0) == 0 ? 0 : 1;
}

static int mon_rename_legacy(const struct env *e)
{
    return syscall(SYS_renameat, e->priv_fd, "a", e->shm_fd, "b") == 0 ? 0 : 1;
}

static int mon_rename_out_of_shm(const struct env *e)
{
    return renameat2(e->shm_fd, "a", e->priv_fd, "b", RENAME_NOREPLACE) == 0 ? 0 : 1;
}

static int mon_rename_within_priv(const struct env *e)
{
    return renameat2(e->priv_fd, "a", e->priv_fd, "b", RENAME_NOREPLACE) == 0 ? 0 : 1;
}

static int capset_nothing(const struct env *e)
{
    (void)e;
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    memset(data, 0, sizeof data);
    return syscall(SYS_capset, &hdr, data) == 0 ? 0 : 1;
}

static int mon_chown_other_uid(const struct env *e)
{
    return fchown(e->file_fd, e->uid + 1, e->gid) == 0 ? 0 : 1;
}

static int mon_chown_other_gid(const struct env *e)
{
    return fchown(e->file_fd, e->uid, e->gid + 1) == 0 ? 0 : 1;
}

static int chown_self(const struct env *e)
{
    return fchown(e->file_fd, e->uid, e->gid) == 0 ? 0 : 1;
}

static int mon_chmod_world_writable(const struct env *e)
{
    return fchmod(e->file_fd, 0666) == 0 ? 0 : 1;
}

static int mon_truncate_other_size(const struct env *e)
{
    return ftruncate(e->file_fd, 2 * ORB_HELPER_SLOT_SIZE) == 0 ? 0 : 1;
}

static int unix_socket(const struct env *e)
{
    (void)e;
    return socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0) >= 0 ? 0 : 1;
}

static int ioctl_fionread(const struct env *e)
{
    int n = -1;
    return ioctl(e->file_fd, FIONREAD, &n) == 0 && n > 0 ? 0 : 1;
}

/* The uverbs request on a regular file: past the filter, the file answers ENOTTY. */
static int ioctl_uverbs(const struct env *e)
{
    errno = 0;
    return ioctl(e->file_fd, orb_sandbox_ioctls[0], NULL) == -1 && errno == ENOTTY ? 0 : 1;
}

/* The same request with garbage in the upper half, which the kernel ignores for it. */
static int ioctl_uverbs_high_bits(const struct env *e)
{
    unsigned long req = (orb_sandbox_ioctls[0] & 0xFFFFFFFFul) | (0x5A5Aul << 32);
    errno = 0;
    return ioctl(e->file_fd, req, NULL) == -1 && errno == ENOTTY ? 0 : 1;
}

/* The admitted request in the upper half, another in the lower half (which the kernel uses). */
static int ioctl_uverbs_in_high_half(const struct env *e)
{
    unsigned long req = (unsigned long)FIONREAD | ((orb_sandbox_ioctls[0] & 0xFFFFFFFFul) << 32);
    int n = -1;
    return ioctl(e->file_fd, req, &n) == 0 && n > 0 ? 0 : 1;
}

static int ioctl_other(const struct env *e)
{
    return ioctl(e->file_fd, 0x1234, 0) == 0 ? 0 : 1;
}

static int mmap_exec(const struct env *e)
{
    (void)e;
    return mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED ? 0 : 1;
}

static int mprotect_exec(const struct env *e)
{
    (void)e;
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 1;
    return mprotect(p, 4096, PROT_READ | PROT_EXEC) == 0 ? 0 : 2;
}

/* Without the filter the child becomes /bin/true, which exits 0. */
static int exec_true(const struct env *e)
{
    (void)e;
    static char path[] = "/bin/true";
    char *argv[] = {path, NULL};
    char *envp[] = {NULL};
    (void)execve(path, argv, envp);
    return 1;
}

/* ---- the cases: worker ---------------------------------------------------------------------------- */

static int wrk_probe_sysfs(const struct env *e)
{
    struct stat st;
    if (fstatat(e->sysfs_fd, "attr", &st, 0) != 0 || !S_ISREG(st.st_mode) || st.st_size != 2)
        return 1;
    if (fstatat(e->sysfs_fd, "missing", &st, 0) != -1 || errno != ENOENT)
        return 2;
    return 0;
}

static int wrk_open_attr(const struct env *e)
{
    return openat(e->sysfs_fd, "attr", O_RDONLY) >= 0 ? 0 : 1;
}

static int wrk_open_attr_cloexec(const struct env *e)
{
    return openat(e->sysfs_fd, "attr", O_RDONLY | O_CLOEXEC) >= 0 ? 0 : 1;
}

static int wrk_chmod(const struct env *e)
{
    return fchmod(e->file_fd, 0644) == 0 ? 0 : 1;
}

static int wrk_flock(const struct env *e)
{
    return flock(e->file_fd, LOCK_EX) == 0 ? 0 : 1;
}

/* glibc's fstat(): newfstatat(fd, "", AT_EMPTY_PATH), which the worker does not need; with it
 * any path could be stat'ed, since the filter cannot see the path. */
static int wrk_fstat(const struct env *e)
{
    struct stat st;
    return fstat(e->file_fd, &st) == 0 ? 0 : 1;
}

/* Under Landlock, names that climb out of the held directories reach nothing, whatever the
 * monitor's capabilities: the node directory's parent, the fixture root from the private
 * directory, the files of /dev/shm itself (only the private directory's can be read or written),
 * and of the node directory only the granted node. */
static int mon_paths_escape_refused(const struct env *e)
{
    if (openat(e->devib_fd, "../x", ORB_SANDBOX_NODE_FLAGS) >= 0 || errno != EACCES)
        return 1;
    if (openat(e->devib_fd, "issm0", ORB_SANDBOX_NODE_FLAGS) >= 0 || errno != EACCES)
        return 6;
    if (openat(e->priv_fd, "../../x", ORB_SANDBOX_LOCK_FLAGS, 0600) >= 0 || errno != EACCES)
        return 2;
    /* A file of /dev/shm itself (another user's, say), through the private directory. */
    if (openat(e->priv_fd, "../planted", ORB_SANDBOX_SLOT_OPEN_BASE | O_RDWR) >= 0 || errno != EACCES)
        return 3;
    if (openat(e->priv_fd, "../planted", ORB_SANDBOX_SLOT_OPEN_BASE | O_RDONLY) >= 0 || errno != EACCES)
        return 7;
    if (openat(e->sysfs_fd, "../x", ORB_SANDBOX_ATTR_FLAGS) >= 0 || errno != EACCES)
        return 4;
    if (unlinkat(e->priv_fd, "../../x", 0) == 0 || errno != EACCES)
        return 5;
    return 0;
}

static int wrk_stat_elsewhere(const struct env *e)
{
    struct stat st;
    return fstatat(e->root_fd, "x", &st, 0) == 0 ? 0 : 1;
}

static int wrk_proc_status(const struct env *e)
{
    int fd = openat(e->proc_fd, "status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 1;
    char buf[5];
    if (read(fd, buf, sizeof buf) != (ssize_t)sizeof buf || memcmp(buf, "Name:", 5) != 0)
        return 2;
    return close(fd) == 0 ? 0 : 3;
}

static int wrk_proc_status_rw(const struct env *e)
{
    return openat(e->proc_fd, "status", O_RDWR) >= 0 ? 0 : 1;
}

/* ---- the table ------------------------------------------------------------------------------------ */

#define ADMITS(f, fn, what) {what, f, fn, false, CTL_NONE}
#define KILLS(f, fn, ctl, what) {what, f, fn, true, ctl}

static const struct filter_case cases[] = {
    /* monitor */
    ADMITS(F_MONITOR, mon_slot_lifecycle, "monitor: create, size, chmod, chown, publish and open a slot; lock file; "
                                          "sysfs attribute; uverbs node"),
    ADMITS(F_MONITOR, mon_unfinished_removed, "monitor: an unfinished object is removed from the private directory"),
    ADMITS(F_MONITOR_PATHS, mon_slot_lifecycle, "monitor under Landlock: the whole slot life cycle still works"),
    ADMITS(F_MONITOR_PATHS, mon_paths_escape_refused, "monitor under Landlock: ../ out of a held directory reaches nothing"),
    ADMITS(F_MONITOR, mon_common_calls, "monitor: fstat, fcntl, mmap, mprotect, read, getrandom"),
    ADMITS(F_MONITOR_KEEP_GID, mon_fchown_keep_gid, "monitor: fchown to the administrator, group unchanged"),
    KILLS(F_MONITOR, open_passwd, CTL_OK, "monitor: openat(AT_FDCWD, /etc/passwd)"),
    KILLS(F_MONITOR, mon_create_in_shm, CTL_OK, "monitor: creating an object directly in /dev/shm"),
    KILLS(F_MONITOR, mon_read_shm_name, CTL_OK, "monitor: opening a /dev/shm name for reading"),
    KILLS(F_MONITOR, mon_link_into_shm, CTL_OK, "monitor: linkat into /dev/shm"),
    KILLS(F_MONITOR, mon_create_flags_in_shm, CTL_OK, "monitor: the slot-creation flags on the /dev/shm directory"),
    KILLS(F_MONITOR, mon_slot_truncated, CTL_OK, "monitor: a slot object opened with O_TRUNC"),
    KILLS(F_MONITOR, mon_node_other_flags, CTL_OK, "monitor: a uverbs node opened with other flags"),
    KILLS(F_MONITOR, mon_node_created, CTL_OK, "monitor: a uverbs node created"),
    KILLS(F_MONITOR, mon_attr_writable, CTL_OK_ROOT, "monitor: a sysfs attribute opened read-write"),
    KILLS(F_MONITOR, mon_create_elsewhere, CTL_OK, "monitor: the slot-creation flags on another directory"),
    KILLS(F_MONITOR, mon_lock_elsewhere, CTL_OK, "monitor: a lock file created in /dev/shm"),
    KILLS(F_MONITOR, mon_unlink_in_shm, CTL_OK, "monitor: unlinkat in /dev/shm"),
    KILLS(F_MONITOR, unlink_elsewhere, CTL_OK, "monitor: unlinkat in another directory"),
    KILLS(F_MONITOR, mon_rmdir_in_priv, CTL_OK, "monitor: unlinkat(AT_REMOVEDIR) in the private directory"),
    KILLS(F_MONITOR, mon_rename_replacing, CTL_OK, "monitor: renameat2 into /dev/shm that may replace"),
    KILLS(F_MONITOR, mon_rename_legacy, CTL_OK, "monitor: renameat (no flags at all)"),
    KILLS(F_MONITOR, mon_rename_out_of_shm, CTL_OK, "monitor: renameat2 from /dev/shm into the private directory"),
    KILLS(F_MONITOR, mon_rename_within_priv, CTL_OK, "monitor: renameat2 within the private directory"),
    KILLS(F_MONITOR, capset_nothing, CTL_OK, "monitor: capset"),
    KILLS(F_MONITOR, mon_chown_other_uid, CTL_OK_ROOT, "monitor: fchown to another user"),
    KILLS(F_MONITOR, mon_chown_other_gid, CTL_OK_ROOT, "monitor: fchown to another group"),
    KILLS(F_MONITOR_KEEP_GID, chown_self, CTL_OK, "monitor, group unchanged: fchown that sets the group"),
    KILLS(F_MONITOR_NO_CHOWN, chown_self, CTL_OK, "monitor, no chown: fchown"),
    KILLS(F_MONITOR, mon_chmod_world_writable, CTL_OK, "monitor: fchmod 0666"),
    KILLS(F_MONITOR, mon_truncate_other_size, CTL_OK, "monitor: ftruncate to another size"),
    KILLS(F_MONITOR, unix_socket, CTL_OK, "monitor: socket(AF_UNIX)"),
    KILLS(F_MONITOR, ioctl_fionread, CTL_OK, "monitor: ioctl(FIONREAD)"),
    KILLS(F_MONITOR, ioctl_uverbs, CTL_NONE, "monitor: ioctl(RDMA_VERBS_IOCTL)"),
    KILLS(F_MONITOR, mmap_exec, CTL_OK, "monitor: mmap(PROT_EXEC)"),
    KILLS(F_MONITOR, mprotect_exec, CTL_OK, "monitor: mprotect(PROT_EXEC)"),
    KILLS(F_MONITOR, exec_true, CTL_OK, "monitor: execve"),
    /* worker */
    ADMITS(F_WORKER, wrk_probe_sysfs, "worker: fstatat below the sysfs directory"),
    ADMITS(F_WORKER, common_calls, "worker: fcntl, mmap, mprotect, read"),
    KILLS(F_WORKER, wrk_fstat, CTL_OK, "worker: fstat (newfstatat with AT_EMPTY_PATH)"),
    ADMITS(F_WORKER, ioctl_uverbs, "worker: ioctl(RDMA_VERBS_IOCTL)"),
    ADMITS(F_WORKER, ioctl_uverbs_high_bits, "worker: ioctl(RDMA_VERBS_IOCTL) with garbage in the upper half"),
    KILLS(F_WORKER, wrk_open_attr, CTL_OK, "worker: openat(sysfs, attr, O_RDONLY)"),
    KILLS(F_WORKER, open_passwd, CTL_OK, "worker: openat(AT_FDCWD, /etc/passwd)"),
    KILLS(F_WORKER, unlink_elsewhere, CTL_OK, "worker: unlinkat"),
    KILLS(F_WORKER, capset_nothing, CTL_OK, "worker: capset"),
    KILLS(F_WORKER, chown_self, CTL_OK, "worker: fchown"),
    KILLS(F_WORKER, wrk_chmod, CTL_OK, "worker: fchmod"),
    KILLS(F_WORKER, wrk_flock, CTL_OK, "worker: flock"),
    KILLS(F_WORKER, unix_socket, CTL_OK, "worker: socket(AF_UNIX)"),
    KILLS(F_WORKER, wrk_stat_elsewhere, CTL_OK, "worker: fstatat outside the sysfs directory"),
    KILLS(F_WORKER, ioctl_other, CTL_NONE, "worker: ioctl(0x1234)"),
    KILLS(F_WORKER, ioctl_fionread, CTL_OK, "worker: ioctl(FIONREAD)"),
    KILLS(F_WORKER, ioctl_uverbs_in_high_half, CTL_OK,
          "worker: ioctl with RDMA_VERBS_IOCTL in the upper half and FIONREAD in the lower"),
    KILLS(F_WORKER, mmap_exec, CTL_OK, "worker: mmap(PROT_EXEC)"),
    KILLS(F_WORKER, mprotect_exec, CTL_OK, "worker: mprotect(PROT_EXEC)"),
    KILLS(F_WORKER, exec_true, CTL_OK, "worker: execve"),
    /* the test build's worker */
    ADMITS(F_WORKER_PROC, wrk_proc_status, "worker, test /proc: openat(/proc/self, status, O_RDONLY|O_CLOEXEC)"),
    KILLS(F_WORKER_PROC, wrk_proc_status_rw, CTL_OK_ROOT, "worker, test /proc: openat(/proc/self, status, O_RDWR)"),
    KILLS(F_WORKER_PROC, wrk_open_attr_cloexec, CTL_OK, "worker, test /proc: openat(sysfs, attr, O_RDONLY|O_CLOEXEC)"),
};

#define NCASES (sizeof cases / sizeof cases[0])

/* ---- the parent ---------------------------------------------------------------------------------- */

static void describe(int status, char *buf, size_t len)
{
    if (WIFEXITED(status)) {
        int code = WEXITSTATUS(status);
        const char *why = code == 0              ? "every call succeeded"
                          : code == EXIT_FIXTURE ? "a fixture descriptor could not be opened"
                          : code == EXIT_NO_DUMP ? "the core-dump guard could not be set"
                          : code == EXIT_LOAD    ? "the filter did not load"
                                                 : "that step returned a wrong result";
        snprintf(buf, len, "exit %d (%s)", code, why);
    } else if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        snprintf(buf, len, "killed by signal %d (%s)%s", sig, strsignal(sig),
                 sig == SIGSYS ? ": the filter refused a call" : "");
    } else {
        snprintf(buf, len, "wait status 0x%x", (unsigned)status);
    }
}

/* Runs the case in a child, with or without its filter; returns the child's wait status. */
static int run_child(const struct filter_case *c, bool filtered)
{
    char root[64];
    make_fixture(root, sizeof root);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0)
        child(c, root, filtered);
    int status = 0;
    pid_t got = -1;
    if (pid > 0) {
        do {
            got = waitpid(pid, &status, 0);
        } while (got < 0 && errno == EINTR);
    }
    remove_tree(root);
    if (pid < 0 || got != pid)
        fail_msg("%s: fork or waitpid failed: %s", c->name, strerror(errno));
    return status;
}

static void test_case(void **state)
{
    const struct filter_case *c = *state;
    char what[160];
    int status = run_child(c, true);
    describe(status, what, sizeof what);
    if (c->expect_sigsys) {
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSYS)
            fail_msg("%s [%s filter]: expected SIGSYS, got %s", c->name, filter_name(c->filter), what);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fail_msg("%s [%s filter]: expected exit 0, got %s", c->name, filter_name(c->filter), what);
    }
    if (!c->expect_sigsys || c->control == CTL_NONE || (c->control == CTL_OK_ROOT && geteuid() != 0))
        return;
    status = run_child(c, false);
    describe(status, what, sizeof what);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("%s [no filter]: the call should succeed without the filter, got %s", c->name, what);
}

int main(void)
{
    static struct CMUnitTest tests[NCASES];
    for (size_t i = 0; i < NCASES; i++) {
        tests[i].name = cases[i].name;
        tests[i].test_func = test_case;
        tests[i].setup_func = NULL;
        tests[i].teardown_func = NULL;
        tests[i].initial_state = (void *)&cases[i];
    }
    return _cmocka_run_group_tests("helper_filters", tests, NCASES, NULL, NULL);
}
