/* Test-only requests (see testing.h). Everything here runs under the real seccomp filter. */
#include "helper/testing.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <linux/capability.h>
#include <unistd.h>

#include "core/error.h"
#include "helper/helper.h"
#include "wire/wire.h"

static int g_proc_fd = -1;

int orb_helper_testing_open_proc(void)
{
    g_proc_fd = open("/proc/self", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return g_proc_fd;
}

static uint16_t le16_at(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32_at(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void begin(struct orb_writer *w, uint8_t *buf, uint16_t type, uint32_t seq)
{
    orb_writer_init(w, buf, ORB_HP_MAX_MSG);
    orb_writer_u32(w, ORB_HP_MAGIC);
    orb_writer_u16(w, ORB_HP_VERSION);
    orb_writer_u16(w, type);
    orb_writer_u32(w, 0);
    orb_writer_u32(w, seq);
}

static int finish_and_send(struct orb_helper_state *st, struct orb_writer *w)
{
    if (w->failed)
        return orb_fail(ORB_EINVAL, "testing: reply does not fit");
    struct orb_writer len_w;
    orb_writer_init(&len_w, w->buf + 8, 4);
    orb_writer_u32(&len_w, (uint32_t)w->pos);
    return orb_hp_send(st->sock, w->buf, w->pos, NULL, 0);
}

/* Non-NUL bytes left in the initial environment block, the memory /proc/PID/environ shows: 0
 * once wiped. The block's bounds are fields 50 and 51 of /proc/self/stat (a non-dumpable
 * process cannot open its own environ file, which then belongs to root with mode 0400). */
static uint32_t environ_bytes(void)
{
    static char stat_text[2048];
    int fd = openat(g_proc_fd, "stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return UINT32_MAX;
    ssize_t n = read(fd, stat_text, sizeof stat_text - 1);
    close(fd);
    if (n <= 0)
        return UINT32_MAX;
    stat_text[n] = '\0';
    char *p = strrchr(stat_text, ')'); /* after the command name, which may hold spaces */
    if (p == NULL)
        return UINT32_MAX;
    unsigned long long start = 0, end = 0;
    int field = 2;
    for (char *tok = strtok(p + 1, " "); tok != NULL; tok = strtok(NULL, " ")) {
        field++;
        if (field == 50)
            start = strtoull(tok, NULL, 10);
        if (field == 51)
            end = strtoull(tok, NULL, 10);
    }
    if (start == 0 || end < start)
        return UINT32_MAX;
    uint32_t total = 0;
    for (const volatile char *c = (const char *)(uintptr_t)start; c < (const char *)(uintptr_t)end; c++)
        total += *c != '\0';
    return total;
}

/* Open descriptors, ascending (a probe of each number: /proc/self/fd is root's once the
 * process is not dumpable). */
static uint32_t open_fds(int *fds, uint32_t cap)
{
    uint32_t n = 0;
    for (int fd = 0; fd < 4096 && n < cap; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            fds[n++] = fd;
    return n;
}

static int self_report(struct orb_helper_state *st, uint32_t seq)
{
    static uint8_t buf[ORB_HP_MAX_MSG];
    static char status[ORB_HP_MAX_MSG];
    int fds[ORB_HELPER_TEST_MAX_FDS];
    uint32_t nfds = open_fds(fds, ORB_HELPER_TEST_MAX_FDS);
    size_t status_len = 0;
    int fd = openat(g_proc_fd, "status", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n;
        while (status_len < sizeof status && (n = read(fd, status + status_len, sizeof status - status_len)) > 0)
            status_len += (size_t)n;
        close(fd);
    }
    struct orb_writer w;
    begin(&w, buf, ORB_HELPER_TEST_SELF_REPORT_REPLY, seq);
    orb_writer_u32(&w, environ_bytes());
    orb_writer_u32(&w, nfds);
    for (uint32_t i = 0; i < nfds; i++)
        orb_writer_u32(&w, (uint32_t)fds[i]);
    size_t room = ORB_HP_MAX_MSG - w.pos - 2;
    if (status_len > room)
        status_len = room;
    orb_writer_u16(&w, (uint16_t)status_len);
    orb_writer_bytes(&w, status, status_len);
    return finish_and_send(st, &w);
}

static int forbidden_syscall(struct orb_helper_state *st, uint16_t type, uint32_t seq)
{
    int s = -1;
    switch (type) {
    case ORB_HELPER_TEST_FORBIDDEN:
        s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        break;
    case ORB_HELPER_TEST_FORBIDDEN_OPENAT:
        s = openat(AT_FDCWD, "/etc/passwd", O_RDONLY | O_CLOEXEC);
        break;
    case ORB_HELPER_TEST_FORBIDDEN_UNLINKAT:
        s = unlinkat(st->sysfs_fd, "no-such-entry", 0);
        break;
    default: { /* capset: raise nothing, which needs no privilege, so only the filter can stop it */
        struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
        struct __user_cap_data_struct data[2];
        memset(data, 0, sizeof data);
        s = (int)syscall(SYS_capset, &hdr, data);
        break;
    }
    }
    int err = errno;
    if (s >= 0)
        close(s);
    static uint8_t buf[ORB_HP_MAX_MSG];
    struct orb_writer w;
    begin(&w, buf, ORB_HELPER_TEST_FORBIDDEN_REPLY, seq);
    orb_writer_u32(&w, (uint32_t)s);
    orb_writer_u32(&w, (uint32_t)err);
    return finish_and_send(st, &w);
}

int orb_helper_testing_request(struct orb_helper_state *st, const uint8_t *buf, size_t len)
{
    if (len != ORB_HP_HEADER_LEN || le32_at(buf) != ORB_HP_MAGIC || le16_at(buf + 4) != ORB_HP_VERSION ||
        le32_at(buf + 8) != len)
        return 0;
    uint16_t type = le16_at(buf + 6);
    uint32_t seq = le32_at(buf + 12);
    if (type == ORB_HELPER_TEST_SELF_REPORT)
        return self_report(st, seq) == 0 ? 1 : -1;
    if (type == ORB_HELPER_TEST_FORBIDDEN || type == ORB_HELPER_TEST_FORBIDDEN_OPENAT ||
        type == ORB_HELPER_TEST_FORBIDDEN_UNLINKAT || type == ORB_HELPER_TEST_FORBIDDEN_CAPSET)
        return forbidden_syscall(st, type, seq) == 0 ? 1 : -1;
    return 0;
}

static int fake_create(void *impl, int dev_fd, bool devx)
{
    (void)impl;
    (void)devx;
    return dev_fd >= 0 ? 0 : EBADF;
}

const struct orb_uctx_ops orb_helper_testing_uctx_ops = {.create = fake_create};
