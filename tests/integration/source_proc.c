/* The source side of the two-process tests: a separate process (this binary re-executed with
 * --source) owning a source engine, answering memory inspection commands over a socketpair. */
#include "source_proc.h"
#include "util/fdio.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { CMD_GET = 1, CMD_SET = 2, CMD_NOTES = 3, CMD_QUIT = 4 };

/* The source process touches its registered memory on command, after the requester (another
 * process) saw its transfer acknowledged. That ordering runs through the peer process and a
 * socket, which ThreadSanitizer cannot see; the harness's own accesses are excluded from race
 * detection (only those: the library's threads are still checked). */
#ifdef ORB_TEST_TSAN
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define HARNESS_ACCESS_BEGIN()                       \
    do {                                             \
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);  \
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__); \
    } while (0)
#define HARNESS_ACCESS_END()                       \
    do {                                           \
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__); \
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);  \
    } while (0)
#else
#define HARNESS_ACCESS_BEGIN() do { } while (0)
#define HARNESS_ACCESS_END() do { } while (0)
#endif

struct cmd {
    uint64_t op;
    uint64_t addr;
    uint64_t len;
};

/* Every wait on the command channel is bounded. */
#define CMD_TIMEOUT_MS 30000

/* Read exactly `len` bytes of the command channel. */
static int read_all(int fd, void *buf, size_t len)
{
    return test_read_all(fd, buf, len, CMD_TIMEOUT_MS);
}

uint64_t checksum(const void *data, uint64_t len)
{
    const uint8_t *p = data;
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int src_start(struct src_proc *p, uint16_t port)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    if (pid == 0) {
        /* Re-execute: the parent may run engine threads, and a forked copy of their locks is
         * not safe to use. */
        int fd = dup(sv[1]); /* without CLOEXEC */
        char fdtxt[16], porttxt[16];
        snprintf(fdtxt, sizeof fdtxt, "%d", fd);
        snprintf(porttxt, sizeof porttxt, "%u", port);
        execl("/proc/self/exe", "source", "--source", fdtxt, porttxt, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    p->pid = pid;
    p->cmd_fd = sv[0];
    if (read_all(p->cmd_fd, &p->info, sizeof p->info) != 0) {
        src_kill(p);
        return -1;
    }
    return 0;
}

static void reap(struct src_proc *p)
{
    /* Bounded: SIGKILL after 10 s. */
    for (int i = 0; i < 1000; i++) {
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
            p->pid = 0;
            return;
        }
        usleep(10000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

void src_kill(struct src_proc *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
    if (p->cmd_fd >= 0) {
        close(p->cmd_fd);
        p->cmd_fd = -1;
    }
}

void src_stop(struct src_proc *p)
{
    if (p->pid > 0) {
        struct cmd c = {.op = CMD_QUIT};
        if (test_write_all(p->cmd_fd, &c, sizeof c) == 0)
            reap(p);
    }
    src_kill(p);
}

static int command(struct src_proc *p, uint64_t op, uint64_t addr, uint64_t len)
{
    struct cmd c = {.op = op, .addr = addr, .len = len};
    return test_write_all(p->cmd_fd, &c, sizeof c);
}

int src_get(struct src_proc *p, uint64_t addr, void *out, uint64_t len)
{
    int64_t status;
    if (command(p, CMD_GET, addr, len) != 0 || read_all(p->cmd_fd, &status, sizeof status) != 0 ||
        status != 0)
        return -1;
    return read_all(p->cmd_fd, out, len);
}

int src_set(struct src_proc *p, uint64_t addr, const void *data, uint64_t len)
{
    int64_t status;
    if (command(p, CMD_SET, addr, len) != 0 || test_write_all(p->cmd_fd, data, len) != 0 ||
        read_all(p->cmd_fd, &status, sizeof status) != 0)
        return -1;
    return status == 0 ? 0 : -1;
}

int src_notes(struct src_proc *p, uint64_t *ok, uint64_t *bad)
{
    uint64_t counts[2];
    if (command(p, CMD_NOTES, 0, 0) != 0 || read_all(p->cmd_fd, counts, sizeof counts) != 0)
        return -1;
    *ok = counts[0];
    *bad = counts[1];
    return 0;
}

/* ---- the source process ------------------------------------------------------------------ */

static int inside(uint64_t base, uint64_t blen, uint64_t addr, uint64_t len)
{
    return addr >= base && len <= blen && addr - base <= blen - len;
}

int src_main(int cmd_fd, uint16_t port)
{
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    snprintf(cfg.endpoint, sizeof cfg.endpoint, "127.0.0.1:%u", port);
    orb_engine *engine;
    if (orb_engine_create(&cfg, &engine) != 0) {
        fprintf(stderr, "source: %s\n", orb_last_error());
        return 1;
    }
    orb_host_memory *rw, *ro;
    if (orb_host_memory_alloc(SRC_RW_LEN, 0, &rw) != 0 || orb_host_memory_alloc(SRC_RO_LEN, 0, &ro) != 0)
        return 1;
    uint8_t *rwp = orb_host_memory_data(rw), *rop = orb_host_memory_data(ro);
    for (uint64_t i = 0; i < SRC_RW_LEN; i++)
        rwp[i] = pattern_byte(1, i);
    for (uint64_t i = 0; i < SRC_RO_LEN; i++)
        rop[i] = pattern_byte(2, i);
    orb_reg_id id_rw, id_ro;
    if (orb_register_host_memory(engine, rw, 0, SRC_RW_LEN, ORB_PERM_REMOTE_WRITE, &id_rw) != 0 ||
        orb_register_host_memory(engine, ro, 0, SRC_RO_LEN, ORB_PERM_REMOTE_READ, &id_ro) != 0) {
        fprintf(stderr, "source: %s\n", orb_last_error());
        return 1;
    }
    struct src_info info;
    memset(&info, 0, sizeof info);
    orb_engine_endpoint(engine, info.endpoint, sizeof info.endpoint);
    orb_engine_source_epoch(engine, &info.epoch);
    info.rw_addr = (uint64_t)(uintptr_t)rwp;
    info.ro_addr = (uint64_t)(uintptr_t)rop;
    if (test_write_all(cmd_fd, &info, sizeof info) != 0)
        return 1;

    uint64_t notes_ok = 0, notes_bad = 0;
    static struct orb_notification_msg msgs[16];
    for (;;) {
        /* Check each notification's range the moment it is taken: the data must already be
         * in place. */
        size_t got = 0;
        orb_engine_poll_notifications(engine, msgs, 16, &got);
        for (size_t i = 0; i < got; i++) {
            struct note_payload np;
            if (msgs[i].length != sizeof np) {
                notes_bad++;
                continue;
            }
            memcpy(&np, msgs[i].data, sizeof np);
            HARNESS_ACCESS_BEGIN();
            int match = inside(info.rw_addr, SRC_RW_LEN, np.addr, np.len) &&
                        checksum((const void *)(uintptr_t)np.addr, np.len) == np.sum;
            HARNESS_ACCESS_END();
            if (match)
                notes_ok++;
            else
                notes_bad++;
        }
        struct pollfd pfd = {.fd = cmd_fd, .events = POLLIN};
        int r = poll(&pfd, 1, 1);
        if (r <= 0)
            continue;
        struct cmd c;
        if (read_all(cmd_fd, &c, sizeof c) != 0)
            break;
        if (c.op == CMD_QUIT)
            break;
        int64_t status = 0;
        uint8_t *mem = NULL;
        if (inside(info.rw_addr, SRC_RW_LEN, c.addr, c.len) ||
            inside(info.ro_addr, SRC_RO_LEN, c.addr, c.len))
            mem = (uint8_t *)(uintptr_t)c.addr;
        if (c.op == CMD_GET) {
            status = mem != NULL ? 0 : -1;
            if (test_write_all(cmd_fd, &status, sizeof status) != 0)
                break;
            HARNESS_ACCESS_BEGIN();
            int sent = mem == NULL || test_write_all(cmd_fd, mem, c.len) == 0;
            HARNESS_ACCESS_END();
            if (!sent)
                break;
        } else if (c.op == CMD_SET) {
            if (mem == NULL)
                break;
            HARNESS_ACCESS_BEGIN();
            int got_all = read_all(cmd_fd, mem, c.len) == 0;
            HARNESS_ACCESS_END();
            if (!got_all || test_write_all(cmd_fd, &status, sizeof status) != 0)
                break;
        } else if (c.op == CMD_NOTES) {
            uint64_t counts[2] = {notes_ok, notes_bad};
            if (test_write_all(cmd_fd, counts, sizeof counts) != 0)
                break;
        } else {
            break;
        }
    }
    orb_unregister_memory(engine, id_rw);
    orb_unregister_memory(engine, id_ro);
    orb_host_memory_unref(rw);
    orb_host_memory_unref(ro);
    orb_engine_free(engine);
    return 0;
}
