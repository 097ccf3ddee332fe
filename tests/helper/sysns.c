/* A private test system for root-only tests of the installed orbite-helper (see sysns.h). */
#include "sysns.h"
#include "util/fdio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#define SCRATCH_TEMPLATE "/tmp/orbite-sysns-XXXXXX"
#define POLICY_PARENT "/etc/orbite"
#define POLICY_DIR "/etc/orbite/policy.d"
#define PROBE_NODE "/dev/orbite-sysns-probe"

/* Print "sysns: <step> <what>: <strerror>" and return -1, errno unchanged. */
static int fail(const char *step, const char *what)
{
    int saved = errno;
    fprintf(stderr, "sysns: %s %s: %s\n", step, what ? what : "", strerror(saved));
    errno = saved;
    return -1;
}

static int fail_errno(int err, const char *step, const char *what)
{
    errno = err;
    return fail(step, what);
}

/* ---- the namespace ----------------------------------------------------------------------------- */

int sysns_prepare(struct sysns *ns)
{
    if (!ns)
        return fail_errno(EINVAL, "prepare", "(no struct)");
    snprintf(ns->scratch, sizeof ns->scratch, "%s", SCRATCH_TEMPLATE);
    if (!mkdtemp(ns->scratch)) {
        ns->scratch[0] = '\0';
        return fail("mkdtemp", SCRATCH_TEMPLATE);
    }
    return 0;
}

void sysns_cleanup_host(struct sysns *ns)
{
    if (!ns || ns->scratch[0] == '\0')
        return;
    if (rmdir(ns->scratch) != 0 && errno != ENOENT)
        fail("rmdir", ns->scratch);
    ns->scratch[0] = '\0';
}

/* Give dir the owner and mode of ref: an overlay's root directory shows its upper directory's. */
static int mkdir_like(const char *dir, const char *ref)
{
    struct stat st;
    if (stat(ref, &st) != 0)
        return fail("stat", ref);
    if (mkdir(dir, 0700) != 0)
        return fail("mkdir", dir);
    if (chown(dir, st.st_uid, st.st_gid) != 0)
        return fail("chown", dir);
    if (chmod(dir, st.st_mode & 07777) != 0)
        return fail("chmod", dir);
    return 0;
}

/* An overlay on target (lower target itself) with upper and work directories <name>-up and
 * <name>-work in the scratch tmpfs. */
static int mount_overlay(const char *scratch, const char *target, const char *name)
{
    char up[320], work[320], opts[1024];
    if (snprintf(up, sizeof up, "%s/%s-up", scratch, name) >= (int)sizeof up ||
        snprintf(work, sizeof work, "%s/%s-work", scratch, name) >= (int)sizeof work)
        return fail_errno(ENAMETOOLONG, "overlay paths for", target);
    if (mkdir_like(up, target) != 0)
        return -1;
    if (mkdir(work, 0700) != 0)
        return fail("mkdir", work);
    int n = snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s", target, up, work);
    if (n < 0 || (size_t)n >= sizeof opts)
        return fail_errno(ENAMETOOLONG, "overlay options for", target);
    unsigned long flags = strcmp(target, "/dev") == 0 ? MS_NOSUID : 0;
    if (mount("overlay", target, "overlay", flags, opts) != 0)
        return fail("mount overlay on", target);
    return 0;
}

/* Remove everything below the directory dfd (not following symlinks); dfd stays open. In the
 * overlay this leaves whiteouts in the upper layer, the host's files are untouched. */
static int clear_dir(int dfd, const char *what)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return fail("open", what);
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return fail("fdopendir", what);
    }
    int rc = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno != 0)
                rc = fail("readdir", what);
            break;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            continue;
        if (errno != EISDIR) {
            rc = fail("unlink in", what);
            break;
        }
        int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
            rc = fail("open below", what);
            break;
        }
        rc = clear_dir(sub, e->d_name);
        close(sub);
        if (rc == 0 && unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) != 0)
            rc = fail("rmdir in", what);
        if (rc != 0)
            break;
    }
    closedir(d);
    return rc;
}

/* mkdir, or accept an existing directory; then root-owned with `mode` exactly. */
static int ensure_dir(const char *path, mode_t mode)
{
    if (mkdir(path, mode) != 0 && errno != EEXIST)
        return fail("mkdir", path);
    struct stat st;
    if (lstat(path, &st) != 0)
        return fail("lstat", path);
    if (!S_ISDIR(st.st_mode))
        return fail_errno(ENOTDIR, "check", path);
    if (chown(path, 0, 0) != 0)
        return fail("chown", path);
    if (chmod(path, mode) != 0)
        return fail("chmod", path);
    return 0;
}

/* /etc/orbite/policy.d in the /etc overlay, empty whatever the host's copy holds. */
static int make_policy_dir(void)
{
    if (ensure_dir(POLICY_PARENT, 0755) != 0 || ensure_dir(POLICY_DIR, 0755) != 0)
        return -1;
    int dfd = open(POLICY_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return fail("open", POLICY_DIR);
    int rc = clear_dir(dfd, POLICY_DIR);
    close(dfd);
    return rc;
}

int sysns_enter(struct sysns *ns, const char *sysfs_fixture, bool with_dev_overlay)
{
    if (!ns)
        return fail_errno(EINVAL, "enter", "(no struct)");
    if (ns->scratch[0] == '\0' && sysns_prepare(ns) != 0)
        return -1;
    /* The scratch path goes into overlay options, where these characters are separators. */
    if (strpbrk(ns->scratch, ",:\\") != NULL)
        return fail_errno(EINVAL, "scratch path", ns->scratch);
    if (sysfs_fixture) {
        struct stat st;
        if (stat(sysfs_fixture, &st) != 0)
            return fail("stat sysfs fixture", sysfs_fixture);
        if (!S_ISDIR(st.st_mode))
            return fail_errno(ENOTDIR, "sysfs fixture", sysfs_fixture);
    }

    if (unshare(CLONE_NEWNS) != 0)
        return fail("unshare", "CLONE_NEWNS");
    /* Without this, mounts below would propagate to the host through shared peer groups. */
    if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return fail("make private", "/");
    if (mount("orbite-sysns", ns->scratch, "tmpfs", 0, "mode=0700") != 0)
        return fail("mount tmpfs on", ns->scratch);

    if (mount_overlay(ns->scratch, "/etc", "etc") != 0 || make_policy_dir() != 0)
        return -1;
    if (sysfs_fixture && mount(sysfs_fixture, "/sys", NULL, MS_BIND | MS_REC, NULL) != 0)
        return fail("bind-mount over /sys", sysfs_fixture);
    if (with_dev_overlay && mount_overlay(ns->scratch, "/dev", "dev") != 0)
        return -1;

    /* Last, so that the /dev overlay does not hide it. Without the overlay /dev is the host's:
     * do not create anything in it. */
    if (with_dev_overlay && mkdir("/dev/shm", 01777) != 0 && errno != EEXIST)
        return fail("mkdir", "/dev/shm");
    if (mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=01777") != 0)
        return fail("mount tmpfs on", "/dev/shm");

    /* The overlays hold private clones of their layers, so the scratch mount can go, and with it
     * the last trace on the host. */
    if (umount2(ns->scratch, MNT_DETACH) != 0)
        return fail("detach", ns->scratch);
    if (rmdir(ns->scratch) != 0)
        return fail("rmdir", ns->scratch);
    return 0;
}

/* ---- availability ------------------------------------------------------------------------------ */

/* In the probe's namespace: a policy file can be written, a device node made in the /dev overlay
 * can be opened (the overlay is not nodev) and removed again. */
static int probe_inside(void)
{
    if (sysns_write_policy("probe.conf", "") != 0)
        return -1;
    if (mknod(PROBE_NODE, S_IFCHR | 0600, makedev(1, 3)) != 0)
        return fail("mknod", PROBE_NODE);
    int fd = open(PROBE_NODE, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return fail("open", PROBE_NODE);
    close(fd);
    if (unlink(PROBE_NODE) != 0)
        return fail("unlink", PROBE_NODE);
    return 0;
}

bool sysns_available(void)
{
    if (geteuid() != 0)
        return false;
    struct sysns ns;
    if (sysns_prepare(&ns) != 0)
        return false;
    /* Nothing buffered may be written twice by the child. */
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fail("fork", "probe");
        sysns_cleanup_host(&ns);
        return false;
    }
    if (pid == 0)
        _exit(sysns_enter(&ns, NULL, true) == 0 && probe_inside() == 0 ? 0 : 1);
    int status;
    pid_t w;
    do
        w = waitpid(pid, &status, 0);
    while (w < 0 && errno == EINTR);
    if (w < 0)
        fail("waitpid", "probe");
    sysns_cleanup_host(&ns);
    return w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* ---- files ------------------------------------------------------------------------------------- */

int sysns_write_policy(const char *name, const char *text)
{
    if (!name || !text || name[0] == '\0' || strchr(name, '/') || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0)
        return fail_errno(EINVAL, "policy file name", name ? name : "(null)");
    int dfd = open(POLICY_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return fail("open", POLICY_DIR);
    int rc = -1;
    /* A fresh file, so that a previous symlink or hard link is replaced, not written through. */
    if (unlinkat(dfd, name, 0) != 0 && errno != ENOENT) {
        fail("unlink old policy", name);
        goto close_dir;
    }
    int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        fail("create policy", name);
        goto close_dir;
    }
    if (test_write_all(fd, text, strlen(text)) != 0)
        fail("write policy", name);
    else if (fchown(fd, 0, 0) != 0)
        fail("chown policy", name);
    else if (fchmod(fd, 0644) != 0)
        fail("chmod policy", name);
    else
        rc = 0;
    if (close(fd) != 0 && rc == 0)
        rc = fail("close policy", name);
    if (rc != 0)
        unlinkat(dfd, name, 0);
close_dir:
    close(dfd);
    return rc;
}

/* Set `text` as the file capabilities of fd and check they read back the same. */
static int set_file_caps(int fd, const char *dst, const char *text)
{
    struct statvfs vfs;
    if (fstatvfs(fd, &vfs) != 0)
        return fail("statvfs", dst);
    if (vfs.f_flag & ST_NOSUID)
        return fail_errno(EPERM, "file capabilities ignored on nosuid mount of", dst);
    cap_t want = cap_from_text(text);
    if (!want)
        return fail("cap_from_text", text);
    int rc = -1;
    if (cap_set_fd(fd, want) != 0) {
        fail("cap_set_fd", dst);
        goto free_want;
    }
    cap_t got = cap_get_fd(fd);
    if (!got) {
        fail("cap_get_fd", dst);
        goto free_want;
    }
    if (cap_compare(got, want) != 0)
        fail_errno(EIO, "capabilities read back differ on", dst);
    else
        rc = 0;
    cap_free(got);
free_want:
    cap_free(want);
    return rc;
}

int sysns_install_copy(const char *src, const char *dst, const char *caps)
{
    if (!src || !dst)
        return fail_errno(EINVAL, "install", "(no path)");
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return fail("open", src);
    int rc = -1;
    struct stat st;
    if (fstat(in, &st) != 0) {
        fail("stat", src);
        goto close_in;
    }
    if (!S_ISREG(st.st_mode)) {
        fail_errno(EINVAL, "not a regular file:", src);
        goto close_in;
    }
    /* A new inode: the old one may be running (ETXTBSY) or carry other capabilities. */
    if (unlink(dst) != 0 && errno != ENOENT) {
        fail("unlink", dst);
        goto close_in;
    }
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0700);
    if (out < 0) {
        fail("create", dst);
        goto close_in;
    }
    char buf[65536];
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fail("read", src);
            goto close_out;
        }
        if (n == 0)
            break;
        if (test_write_all(out, buf, (size_t)n) != 0) {
            fail("write", dst);
            goto close_out;
        }
    }
    /* Owner and mode first: a change of owner drops file capabilities. */
    if (fchown(out, 0, 0) != 0) {
        fail("chown", dst);
        goto close_out;
    }
    if (fchmod(out, 0755) != 0) {
        fail("chmod", dst);
        goto close_out;
    }
    if (caps && caps[0] != '\0' && set_file_caps(out, dst, caps) != 0)
        goto close_out;
    rc = 0;
close_out:
    if (close(out) != 0 && rc == 0)
        rc = fail("close", dst);
    if (rc != 0)
        unlink(dst);
close_in:
    close(in);
    return rc;
}

/* ---- credentials ------------------------------------------------------------------------------- */

int sysns_become(uid_t uid, gid_t gid)
{
    return sysns_become_groups(uid, gid, 0, NULL);
}

int sysns_become_groups(uid_t uid, gid_t gid, size_t ngroups, const gid_t *groups)
{
    if (uid == 0)
        return fail_errno(EINVAL, "become", "uid 0 (keeps its capabilities)");
    if (ngroups > 0 && !groups)
        return fail_errno(EINVAL, "become", "(no group list)");
    /* With keep-caps set, the uid switch would leave the permitted set in place. */
    if (prctl(PR_SET_KEEPCAPS, 0L, 0L, 0L, 0L) != 0)
        return fail("prctl", "PR_SET_KEEPCAPS");
    if (setgroups(ngroups, groups) != 0)
        return fail("setgroups", NULL);
    if (setresgid(gid, gid, gid) != 0)
        return fail("setresgid", NULL);
    if (setresuid(uid, uid, uid) != 0)
        return fail("setresuid", NULL);
    /* The switch away from uid 0 keeps the inheritable set; lowering it needs no capability. */
    cap_t none = cap_init();
    if (!none)
        return fail("cap_init", NULL);
    int rc = -1;
    if (cap_set_proc(none) != 0) {
        fail("cap_set_proc", "(clear)");
        goto free_none;
    }
    /* EINVAL: a kernel without ambient capabilities, so none to clear. */
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0L, 0L, 0L) != 0 && errno != EINVAL) {
        fail("prctl", "PR_CAP_AMBIENT_CLEAR_ALL");
        goto free_none;
    }

    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (getresuid(&ru, &eu, &su) != 0 || getresgid(&rg, &eg, &sg) != 0) {
        fail("getresuid/getresgid", NULL);
        goto free_none;
    }
    if (ru != uid || eu != uid || su != uid || rg != gid || eg != gid || sg != gid) {
        fail_errno(EPERM, "become", "(ids did not all change)");
        goto free_none;
    }
    int n = getgroups(0, NULL);
    if (n < 0 || (size_t)n != ngroups) {
        fail_errno(n < 0 ? errno : EPERM, "become", "(supplementary groups)");
        goto free_none;
    }
    cap_t now = cap_get_proc();
    if (!now) {
        fail("cap_get_proc", NULL);
        goto free_none;
    }
    if (cap_compare(now, none) != 0)
        fail_errno(EPERM, "become", "(capabilities remain)");
    else
        rc = 0;
    cap_free(now);
free_none:
    cap_free(none);
    return rc;
}
