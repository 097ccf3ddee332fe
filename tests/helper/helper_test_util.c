/* Fixture trees and a protocol client for the orbite-helper tests. */
#include "helper_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "helper/testing.h"
#include "tenant.h"

#define CALL_TIMEOUT_MS 5000

/* ---- files ------------------------------------------------------------------------------------ */

int hp_write_file(const char *dir, const char *name, const char *text, mode_t mode)
{
    char path[600];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path)
        return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -1;
    size_t len = strlen(text);
    bool ok = write(fd, text, len) == (ssize_t)len && fchmod(fd, mode) == 0;
    close(fd);
    return ok ? 0 : -1;
}

int hp_give_to_tenant(const char *path)
{
    if (getuid() != 0)
        return 0;
    return chown(path, hp_tenant_uid(), hp_tenant_gid());
}

int hp_mkdirs(const char *dir, const char *rel, mode_t mode)
{
    char path[600];
    int n = snprintf(path, sizeof path, "%s/%s", dir, rel);
    if (n < 0 || (size_t)n >= sizeof path)
        return -1;
    for (char *p = path + strlen(dir) + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, mode) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(path, mode) != 0 && errno != EEXIST)
        return -1;
    return chmod(path, mode);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        (void)rmdir(path);
    else
        (void)unlink(path);
    return 0;
}

void hp_remove_tree(const char *path)
{
    if (path[0] != '\0')
        (void)nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Copy the directory src_fd into dst_fd: directories, regular files and symlinks. */
static int copy_dir(int src_fd, int dst_fd)
{
    int walk_fd = dup(src_fd);
    DIR *d = walk_fd >= 0 ? fdopendir(walk_fd) : NULL;
    if (d == NULL) {
        if (walk_fd >= 0)
            close(walk_fd);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(src_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            rc = -1;
        } else if (S_ISLNK(st.st_mode)) {
            char target[1024];
            ssize_t n = readlinkat(src_fd, e->d_name, target, sizeof target - 1);
            if (n < 0)
                rc = -1;
            else {
                target[n] = '\0';
                rc = symlinkat(target, dst_fd, e->d_name);
            }
        } else if (S_ISDIR(st.st_mode)) {
            int s = openat(src_fd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            int made = mkdirat(dst_fd, e->d_name, 0755);
            int t = made == 0 ? openat(dst_fd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
            rc = s >= 0 && t >= 0 ? copy_dir(s, t) : -1;
            if (s >= 0)
                close(s);
            if (t >= 0)
                close(t);
        } else if (S_ISREG(st.st_mode)) {
            int s = openat(src_fd, e->d_name, O_RDONLY | O_CLOEXEC);
            int t = openat(dst_fd, e->d_name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            char buf[4096];
            ssize_t n;
            rc = s >= 0 && t >= 0 ? 0 : -1;
            while (rc == 0 && (n = read(s, buf, sizeof buf)) > 0)
                rc = write(t, buf, (size_t)n) == n ? 0 : -1;
            if (s >= 0)
                close(s);
            if (t >= 0)
                close(t);
        }
    }
    closedir(d);
    return rc;
}

int hp_fixture_create(struct hp_fixture *f, const char *fixture)
{
    memset(f, 0, sizeof *f);
    snprintf(f->root, sizeof f->root, "/tmp/orbite-helper-test-XXXXXX");
    if (mkdtemp(f->root) == NULL)
        return -1;
    (void)chmod(f->root, 0755); /* the capability test runs the helper as another user */
    snprintf(f->sysfs, sizeof f->sysfs, "%s/sys", f->root);
    snprintf(f->policy, sizeof f->policy, "%s/policy", f->root);
    snprintf(f->dev, sizeof f->dev, "%s/dev", f->root);
    snprintf(f->shm, sizeof f->shm, "%s/shm", f->root);
    if (mkdir(f->sysfs, 0755) != 0 || mkdir(f->policy, 0755) != 0 || mkdir(f->dev, 0755) != 0 ||
        mkdir(f->shm, 0755) != 0 || chmod(f->shm, 01777) != 0 || hp_give_to_tenant(f->policy) != 0)
        goto fail;
    char src[600];
    snprintf(src, sizeof src, "%s/%s", FIXTURE_DIR, fixture);
    int s = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int t = open(f->sysfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = s >= 0 && t >= 0 ? copy_dir(s, t) : -1;
    if (s >= 0)
        close(s);
    if (t >= 0)
        close(t);
    if (rc != 0)
        goto fail;
    static const struct {
        const char *node, *ibdev, *dev;
    } verbs[] = {{"uverbs0", "mlx5_0\n", "1:3\n"}, {"uverbs1", "mlx5_1\n", "1:5\n"}};
    for (size_t i = 0; i < 2; i++) {
        char rel[128], dir[600];
        snprintf(rel, sizeof rel, "class/infiniband_verbs/%s", verbs[i].node);
        snprintf(dir, sizeof dir, "%s/%s", f->sysfs, rel);
        if (hp_mkdirs(f->sysfs, rel, 0755) != 0 || hp_write_file(dir, "ibdev", verbs[i].ibdev, 0644) != 0 ||
            hp_write_file(dir, "dev", verbs[i].dev, 0644) != 0)
            goto fail;
    }
    return 0;
fail:
    hp_remove_tree(f->root);
    f->root[0] = '\0';
    return -1;
}

int hp_fixture_mark_mlx5(struct hp_fixture *f, const char *nic)
{
    char link[700];
    snprintf(link, sizeof link, "%s/class/infiniband/%s/device/driver", f->sysfs, nic);
    return symlink("../../../../bus/pci/drivers/mlx5_core", link) == 0 ? 0 : -1;
}

void hp_fixture_destroy(struct hp_fixture *f)
{
    hp_remove_tree(f->root);
    f->root[0] = '\0';
}

/* ---- processes -------------------------------------------------------------------------------- */

int hp_spawn(struct hp_proc *p, const struct hp_spawn_opts *opts)
{
    static const char *const default_env[] = {"ORBITE_TEST_SECRET=do-not-leak", "RDMAV_DRIVERS=/tmp/evil", NULL};
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    if (pid == 0) {
        int three = sv[1];
        if (opts->fd3_not_socket) {
            three = open("/dev/null", O_RDWR | O_CLOEXEC);
            if (three < 0)
                _exit(126);
        }
        if (dup2(three, 3) != 3) /* dup2 clears CLOEXEC on fd 3 */
            _exit(126);
        if (opts->leak_fd) {
            int leak = open("/dev/null", O_RDONLY);
            if (leak < 0 || dup2(leak, 9) != 9)
                _exit(126);
        }
        if (opts->nofile != 0) {
            struct rlimit lim = {.rlim_cur = opts->nofile, .rlim_max = opts->nofile};
            if (setrlimit(RLIMIT_NOFILE, &lim) != 0)
                _exit(124);
        }
        if (!opts->keep_ids && hp_become_tenant() != 0)
            _exit(125);
        execve(opts->argv[0], (char *const *)opts->argv, (char *const *)(opts->envp ? opts->envp : default_env));
        _exit(127);
    }
    close(sv[1]);
    p->pid = pid;
    p->sock = sv[0];
    p->seq = 1;
    return 0;
}

int hp_wait(struct hp_proc *p, int timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    int status = 0;
    for (int waited = 0;; waited += 5) {
        pid_t r = waitpid(p->pid, &status, WNOHANG);
        if (r == p->pid)
            break;
        if (r < 0)
            return -1;
        if (waited >= timeout_ms) {
            kill(p->pid, SIGKILL);
            (void)waitpid(p->pid, &status, 0);
            p->pid = 0;
            return -1;
        }
        (void)poll(NULL, 0, 5);
    }
    p->pid = 0;
    return status;
}

void hp_close(struct hp_proc *p)
{
    if (p->sock >= 0)
        close(p->sock);
    p->sock = -1;
}

int hp_call(struct hp_proc *p, const uint8_t *req, size_t req_len, const int *send_fds, size_t nsend,
            struct orb_hp_msg *reply, uint8_t reply_buf[ORB_HP_MAX_MSG], int *fd_out)
{
    int rc;
    if (nsend == 0 && req_len >= ORB_HP_HEADER_LEN && req_len <= ORB_HP_MAX_MSG) {
        rc = orb_hp_send(p->sock, req, req_len, NULL, 0);
    } else {
        /* What orb_hp_send refuses to send: descriptors from the library's side, datagrams of
         * impossible sizes. */
        struct iovec iov = {.iov_base = (void *)(uintptr_t)req, .iov_len = req_len};
        union {
            struct cmsghdr align;
            char bytes[CMSG_SPACE(sizeof(int) * 4)];
        } control;
        memset(&control, 0, sizeof control);
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (nsend > 0) {
            msg.msg_control = control.bytes;
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * nsend);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int) * nsend);
            memcpy(CMSG_DATA(cm), send_fds, sizeof(int) * nsend);
        }
        rc = sendmsg(p->sock, &msg, MSG_NOSIGNAL) == (ssize_t)req_len ? 0 : ORB_EPEER;
    }
    if (rc != 0)
        return rc;
    size_t len = 0, nfds = 0;
    int fds[1] = {-1};
    rc = orb_hp_recv(p->sock, reply_buf, &len, fds, 1, &nfds, CALL_TIMEOUT_MS);
    if (rc != 0)
        return rc;
    if (fd_out)
        *fd_out = nfds ? fds[0] : -1;
    else if (nfds)
        close(fds[0]);
    /* Test-only replies have types the parser does not know: split them by hand. */
    uint16_t type = (uint16_t)(reply_buf[6] | reply_buf[7] << 8);
    if (type >= ORB_HELPER_TEST_SELF_REPORT) {
        reply->hdr.type = type;
        reply->hdr.length = (uint32_t)len;
        reply->hdr.sequence = (uint32_t)reply_buf[12] | (uint32_t)reply_buf[13] << 8 |
                              (uint32_t)reply_buf[14] << 16 | (uint32_t)reply_buf[15] << 24;
        reply->body = reply_buf + ORB_HP_HEADER_LEN;
        reply->body_len = len - ORB_HP_HEADER_LEN;
        return 0;
    }
    return orb_hp_parse(reply_buf, len, reply);
}

int hp_hello(struct hp_proc *p)
{
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    if (orb_hp_encode_hello(p->seq++, req, &len) != 0 || hp_call(p, req, len, NULL, 0, &m, rep, NULL) != 0)
        return -1;
    int32_t status = -1;
    uint32_t version = 0, uid = 0, gid = 0, caps = 0;
    if (orb_hp_decode_hello_reply(&m, &status, &version, &uid, &gid, &caps) != 0 || status != 0)
        return -1;
    return version == ORB_HP_VERSION && uid == (uint32_t)hp_tenant_uid() ? 0 : -1;
}

size_t hp_raw_header(uint8_t *buf, uint16_t type, uint32_t length, uint32_t seq)
{
    const uint32_t magic = ORB_HP_MAGIC;
    const uint16_t version = ORB_HP_VERSION;
    uint8_t *b = buf;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(magic >> (8 * i));
    b[4] = (uint8_t)version;
    b[5] = (uint8_t)(version >> 8);
    b[6] = (uint8_t)type;
    b[7] = (uint8_t)(type >> 8);
    for (int i = 0; i < 4; i++) {
        b[8 + i] = (uint8_t)(length >> (8 * i));
        b[12 + i] = (uint8_t)(seq >> (8 * i));
    }
    return ORB_HP_HEADER_LEN;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int hp_self_report(struct hp_proc *p, struct hp_self_report *out)
{
    uint8_t req[ORB_HP_HEADER_LEN], rep[ORB_HP_MAX_MSG];
    struct orb_hp_msg m;
    hp_raw_header(req, ORB_HELPER_TEST_SELF_REPORT, ORB_HP_HEADER_LEN, p->seq++);
    if (hp_call(p, req, sizeof req, NULL, 0, &m, rep, NULL) != 0 || m.hdr.type != ORB_HELPER_TEST_SELF_REPORT_REPLY)
        return -1;
    const uint8_t *b = m.body;
    size_t n = m.body_len;
    if (n < 8)
        return -1;
    memset(out, 0, sizeof *out);
    out->environ_bytes = le32(b);
    out->nfds = le32(b + 4);
    if (out->nfds > 64 || n < 8 + 4u * out->nfds + 2)
        return -1;
    for (uint32_t i = 0; i < out->nfds; i++)
        out->fds[i] = (int)le32(b + 8 + 4 * i);
    size_t off = 8 + 4u * out->nfds;
    size_t slen = (size_t)(b[off] | b[off + 1] << 8);
    if (off + 2 + slen != n || slen >= sizeof out->status)
        return -1;
    memcpy(out->status, b + off + 2, slen);
    out->status[slen] = '\0';
    return 0;
}

bool hp_status_field(const char *status, const char *key, int base, uint64_t *out)
{
    size_t klen = strlen(key);
    for (const char *line = status; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, key, klen) != 0)
            continue;
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(line + klen, &end, base);
        if (errno != 0 || end == line + klen)
            return false;
        *out = v;
        return true;
    }
    return false;
}

/* One pass over /proc: a process whose PPid is `parent`, or -1. */
static pid_t scan_for_child(pid_t parent)
{
    DIR *d = opendir("/proc");
    if (d == NULL)
        return -1;
    pid_t found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d)) != NULL) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0')
            continue;
        char status[4096];
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/status", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, status, sizeof status - 1);
        close(fd);
        if (n <= 0)
            continue;
        status[n] = '\0';
        uint64_t ppid = 0;
        if (hp_status_field(status, "PPid:", 10, &ppid) && ppid == (uint64_t)parent)
            found = (pid_t)pid;
    }
    closedir(d);
    return found;
}

pid_t hp_child_of(pid_t parent, int timeout_ms)
{
    for (int waited = 0;; waited += 5) {
        pid_t found = scan_for_child(parent);
        if (found > 0 || waited >= timeout_ms)
            return found;
        (void)poll(NULL, 0, 5);
    }
}
