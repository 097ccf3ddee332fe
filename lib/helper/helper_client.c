/* The library's side of orbite-helper: spawn, HELLO, request/reply under deadlines, fd receipt,
 * and reaping. See helper_client.h for the contract. */
#include "helper_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

#ifndef ORB_HELPER_INSTALLED_PATH
#error "ORB_HELPER_INSTALLED_PATH must be defined by the build (the installed orbite-helper)"
#endif

#define HELPER_ARGV0 "orbite-helper"
#define HELPER_MAX_TEST_ARGS 15
/* The child's descriptor for reporting a failed execve: above ORB_HP_FD, close-on-exec. */
#define CHILD_EXEC_ERROR_FD 4
/* Every descriptor the child needs is first moved at or above this, so that the dup2 calls
 * that build fds 0..4 can never overwrite one still to be copied. */
#define CHILD_FIRST_FREE_FD 5
/* The longest orb_helper_close() waits for a helper to exit on EOF before killing it, even when
 * the session's timeout is longer (or infinite). */
#define CLOSE_GRACE_MAX_NS (5ull * ORB_NS_PER_SEC)

_Static_assert(ORB_HP_FD == 3, "the helper's socket is fd 3, right after stdio");

struct orb_helper {
    pthread_mutex_t lock;     /* one exchange at a time */
    int sock;                 /* our end of the socketpair; -1 once the session ended */
    pid_t pid;
    int pidfd;                /* -1 where the kernel has no pidfd_open */
    uint32_t next_seq;
    int failed;               /* 0 while usable; else the status that ended the session */
    uint64_t timeout_ns;      /* per call, and for the helper's exit at close */
    struct orb_helper_info info;
    uint8_t buf[ORB_HP_MAX_MSG]; /* request and reply datagrams, used under `lock` */
};

/* ---- the command (installed path, or a test's override) -------------------------------------- */

static pthread_mutex_t command_lock = PTHREAD_MUTEX_INITIALIZER;
static char *test_path;                             /* NULL: the installed helper */
static char *test_args[HELPER_MAX_TEST_ARGS + 1];   /* NULL-terminated */

/* What one fork + execve needs, prepared before fork: the child only copies descriptors and
 * calls execve. */
struct spawn_plan {
    char *path;
    char *argv[HELPER_MAX_TEST_ARGS + 2];
    char *envp[1];
};

const char *orb_helper_installed_path(void)
{
    return ORB_HELPER_INSTALLED_PATH;
}

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i]);
        v[i] = NULL;
    }
}

int orb_helper_test_set_command(const char *path, const char *const *args)
{
    size_t nargs = 0;
    while (args != NULL && args[nargs] != NULL)
        if (++nargs > HELPER_MAX_TEST_ARGS)
            return orb_fail(ORB_EINVAL, "helper test command: more than %d arguments",
                            HELPER_MAX_TEST_ARGS);
    char *new_path = NULL;
    char *new_args[HELPER_MAX_TEST_ARGS + 1] = { NULL };
    if (path != NULL) {
        new_path = strdup(path);
        if (new_path == NULL)
            return orb_fail(ORB_ENOMEM, "helper test command: out of memory");
        for (size_t i = 0; i < nargs; i++) {
            new_args[i] = strdup(args[i]);
            if (new_args[i] == NULL) {
                free_strings(new_args, i);
                free(new_path);
                return orb_fail(ORB_ENOMEM, "helper test command: out of memory");
            }
        }
    }
    pthread_mutex_lock(&command_lock);
    free(test_path);
    free_strings(test_args, HELPER_MAX_TEST_ARGS);
    test_path = new_path;
    memcpy(test_args, new_args, sizeof new_args);
    pthread_mutex_unlock(&command_lock);
    return 0;
}

static void spawn_plan_free(struct spawn_plan *plan)
{
    free(plan->path);
    free_strings(plan->argv, sizeof plan->argv / sizeof plan->argv[0]);
}

static int spawn_plan_init(struct spawn_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    pthread_mutex_lock(&command_lock);
    plan->path = strdup(test_path != NULL ? test_path : ORB_HELPER_INSTALLED_PATH);
    int ok = plan->path != NULL;
    plan->argv[0] = strdup(HELPER_ARGV0);
    ok = ok && plan->argv[0] != NULL;
    for (size_t i = 0; ok && test_path != NULL && test_args[i] != NULL; i++) {
        plan->argv[i + 1] = strdup(test_args[i]);
        ok = plan->argv[i + 1] != NULL;
    }
    pthread_mutex_unlock(&command_lock);
    plan->envp[0] = NULL; /* the helper starts with an empty environment */
    if (!ok) {
        spawn_plan_free(plan);
        return orb_fail(ORB_ENOMEM, "helper: out of memory preparing its command");
    }
    return 0;
}

/* ---- the child, between fork and execve: async-signal-safe calls only ------------------------ */

struct child_fds {
    int devnull;   /* becomes 0, 1, 2 */
    int sock;      /* becomes ORB_HP_FD */
    int exec_err;  /* becomes CHILD_EXEC_ERROR_FD (close-on-exec) */
    int max_fd;    /* closing by hand up to here if close_range is missing */
};

static void child_close_from(int first, int max_fd)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)first, ~0u, 0u) == 0)
        return;
#endif
    for (int fd = first; fd < max_fd; fd++)
        close(fd);
}

__attribute__((noreturn)) static void child_exec(const struct spawn_plan *plan,
                                                 const struct child_fds *fds)
{
    int err_fd = fds->exec_err;

    /* Default dispositions: the application's handlers must not run here, and the helper
     * should not inherit ignored signals. Every signal stays blocked until just before exec. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            (void)sigaction(sig, &dfl, NULL); /* EINVAL for the C library's own signals */

    /* dup2 leaves the new descriptor without FD_CLOEXEC, so 0..3 survive execve; fd 4 reports
     * a failed execve and closes on a successful one. */
    if (dup2(fds->devnull, 0) < 0 || dup2(fds->devnull, 1) < 0 || dup2(fds->devnull, 2) < 0 ||
        dup2(fds->sock, ORB_HP_FD) < 0)
        goto report;
    if (dup3(fds->exec_err, CHILD_EXEC_ERROR_FD, O_CLOEXEC) < 0)
        goto report;
    err_fd = CHILD_EXEC_ERROR_FD;
    child_close_from(CHILD_FIRST_FREE_FD, fds->max_fd);

    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(plan->path, plan->argv, plan->envp);

report:;
    int err = errno;
    ssize_t w = write(err_fd, &err, sizeof err);
    (void)w;
    _exit(127);
}

/* ---- the parent ------------------------------------------------------------------------------ */

/* Move `*fd` to a close-on-exec descriptor >= CHILD_FIRST_FREE_FD. */
static int raise_fd(int *fd)
{
    if (*fd >= CHILD_FIRST_FREE_FD)
        return 0;
    int moved = fcntl(*fd, F_DUPFD_CLOEXEC, CHILD_FIRST_FREE_FD);
    if (moved < 0)
        return -1;
    close(*fd);
    *fd = moved;
    return 0;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

static int open_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
    long fd = syscall(SYS_pidfd_open, pid, 0u); /* always close-on-exec */
    if (fd >= 0)
        return (int)fd;
#else
    (void)pid;
#endif
    return -1;
}

static void kill_child(pid_t pid, int pidfd)
{
#ifdef SYS_pidfd_send_signal
    /* Through the pidfd the signal cannot reach a recycled pid. */
    if (pidfd >= 0 && syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0u) == 0)
        return;
    if (pidfd >= 0 && errno == ESRCH)
        return;
#else
    (void)pidfd;
#endif
    kill(pid, SIGKILL);
}

/* SIGKILL the child and wait for it (it cannot outlive SIGKILL for long). */
static void kill_and_reap(pid_t pid, int pidfd)
{
    kill_child(pid, pidfd);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Wait until `deadline` for the child to exit, then SIGKILL it, and reap it. A child that the
 * application reaped already (waitpid(-1) or SIGCHLD ignored) gives ECHILD: nothing to do. */
static void reap_child(pid_t pid, int pidfd, uint64_t deadline)
{
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid || (r < 0 && errno != EINTR))
            return;
        if (r < 0)
            continue;
        int ms = orb_deadline_poll_ms(deadline);
        if (ms == 0)
            break;
        if (pidfd >= 0) {
            /* The pidfd becomes readable when the process exits. */
            struct pollfd p = { .fd = pidfd, .events = POLLIN };
            (void)poll(&p, 1, ms);
        } else {
            sleep_ms(ms < 5 ? ms : 5);
        }
    }
    ORB_LOGW("orbite-helper (pid %d) did not exit in time; killing it", (int)pid);
    kill_and_reap(pid, pidfd);
}

/* Read the child's execve report: 0 once execve succeeded (EOF on the pipe), else a status. */
static int await_exec(int err_r, const char *path, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = { .fd = err_r, .events = POLLIN };
        int n = poll(&p, 1, orb_deadline_poll_ms(deadline));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return orb_fail(ORB_EUNAVAILABLE, "helper %s: poll: %s", path, strerror(errno));
        if (n == 0)
            return orb_fail(ORB_ETIMEDOUT, "helper %s: not started before the deadline", path);
        int err = 0;
        ssize_t got = read(err_r, &err, sizeof err);
        if (got < 0 && errno == EINTR)
            continue;
        if (got == 0)
            return 0;
        if (got == (ssize_t)sizeof err)
            return orb_fail(ORB_EUNAVAILABLE, "helper %s cannot be executed: %s", path,
                            strerror(err));
        return orb_fail(ORB_EUNAVAILABLE, "helper %s: start-up failed", path);
    }
}

/* Fork and execute the helper with `child_sock` as its fd 3. On success the child runs the
 * helper (or a test's program) and *pid_out and *pidfd_out name it. */
static int spawn(const struct spawn_plan *plan, int child_sock, uint64_t deadline, pid_t *pid_out,
                 int *pidfd_out)
{
    struct child_fds fds = { .devnull = -1, .sock = -1, .exec_err = -1, .max_fd = 0 };
    int err_pipe[2] = { -1, -1 };
    int rc;

    long open_max = sysconf(_SC_OPEN_MAX);
    fds.max_fd = open_max > 0 && open_max < 65536 ? (int)open_max : 65536;
    fds.sock = fcntl(child_sock, F_DUPFD_CLOEXEC, CHILD_FIRST_FREE_FD);
    fds.devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (fds.sock < 0 || fds.devnull < 0 || raise_fd(&fds.devnull) != 0 ||
        pipe2(err_pipe, O_CLOEXEC) != 0 || raise_fd(&err_pipe[1]) != 0) {
        rc = orb_fail(orb_status_from_errno(errno), "helper: cannot prepare descriptors: %s",
                      strerror(errno));
        goto close_fds;
    }
    fds.exec_err = err_pipe[1];

    /* No application signal handler may run in the child before execve. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0)
        child_exec(plan, &fds);
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        rc = orb_fail(orb_status_from_errno(fork_errno), "helper: fork failed: %s",
                      strerror(fork_errno));
        goto close_fds;
    }
    int pidfd = open_pidfd(pid);
    close_fd(&fds.exec_err);
    err_pipe[1] = -1;

    rc = await_exec(err_pipe[0], plan->path, deadline);
    if (rc != 0) {
        kill_and_reap(pid, pidfd);
        close_fd(&pidfd);
        goto close_fds;
    }
    *pid_out = pid;
    *pidfd_out = pidfd;

close_fds:
    close_fd(&err_pipe[0]);
    close_fd(&err_pipe[1]);
    close_fd(&fds.sock);
    close_fd(&fds.devnull);
    return rc;
}

/* ---- exchanges ------------------------------------------------------------------------------- */

/* End the session with `status` (kept for every later call): close our end and kill the
 * helper, which is reaped by orb_helper_close(). Returns `status` with the current message. */
static int session_fail(struct orb_helper *h, int status)
{
    if (h->failed == 0) {
        h->failed = status;
        close_fd(&h->sock);
        kill_child(h->pid, h->pidfd);
        ORB_LOGW("orbite-helper session ended: %s", orb_last_error());
    }
    return status;
}

static int session_usable(const struct orb_helper *h)
{
    if (h->failed != 0)
        return orb_fail(h->failed, "orbite-helper session already ended (%s)",
                        orb_strerror(h->failed));
    return 0;
}

/* A reply's status is 0 or one of ours; anything else is a broken helper. */
static int status_known(int32_t status)
{
    return status <= 0 && status >= ORB_EAGAIN;
}

/* One request/reply: send the `len`-byte request in h->buf (type `type`, sequence `seq`),
 * receive the reply into h->buf and check its type and sequence. The reply may carry up to
 * `max_fds` descriptors (into `fds`, count in *nfds). Any failure ends the session. */
static int exchange(struct orb_helper *h, uint16_t type, uint32_t seq, size_t len,
                    uint64_t deadline, int *fds, size_t max_fds, size_t *nfds,
                    struct orb_hp_msg *reply)
{
    int rc = orb_hp_send(h->sock, h->buf, len, NULL, 0);
    if (rc != 0)
        return session_fail(h, orb_fail_wrap(rc == ORB_EPROTO ? ORB_EPROTO : ORB_EPEER,
                                             "orbite-helper: sending %s", orb_hp_type_name(type)));
    size_t got = 0, received = 0;
    rc = orb_hp_recv(h->sock, h->buf, &got, fds, max_fds, &received,
                     orb_deadline_poll_ms(deadline));
    if (rc != 0) {
        if (rc != ORB_ETIMEDOUT && rc != ORB_EPEER)
            rc = ORB_EPROTO;
        return session_fail(h, orb_fail_wrap(rc, "orbite-helper: reply to %s",
                                             orb_hp_type_name(type)));
    }
    rc = orb_hp_parse(h->buf, got, reply);
    if (rc == 0 && reply->hdr.type != type + 1)
        rc = orb_fail(ORB_EPROTO, "reply type %u, expected %u", (unsigned)reply->hdr.type,
                      (unsigned)type + 1);
    if (rc == 0 && reply->hdr.sequence != seq)
        rc = orb_fail(ORB_EPROTO, "reply sequence %u, expected %u",
                      (unsigned)reply->hdr.sequence, (unsigned)seq);
    if (rc != 0) {
        for (size_t i = 0; i < received; i++)
            close(fds[i]);
        return session_fail(h, orb_fail_wrap(ORB_EPROTO, "orbite-helper: reply to %s",
                                             orb_hp_type_name(type)));
    }
    *nfds = received;
    return 0;
}

/* A decoder's failure, or a refused or nonsensical status, after a clean exchange. */
static int check_reply(struct orb_helper *h, uint16_t type, int decode_rc, int32_t status,
                       const char *what)
{
    if (decode_rc != 0)
        return session_fail(h, orb_fail_wrap(ORB_EPROTO, "orbite-helper: reply to %s",
                                             orb_hp_type_name(type)));
    if (!status_known(status))
        return session_fail(h, orb_fail(ORB_EPROTO, "orbite-helper: reply to %s: status %d is "
                                        "not an OrbiTE status", orb_hp_type_name(type),
                                        (int)status));
    if (status != 0)
        return orb_fail(status, "orbite-helper refused %s%s%s: %s", orb_hp_type_name(type),
                        what[0] != '\0' ? " " : "", what, orb_strerror(status));
    return 0;
}

static uint32_t take_seq(struct orb_helper *h)
{
    uint32_t seq = h->next_seq++;
    if (h->next_seq == 0)
        h->next_seq = 1;
    return seq;
}

/* ---- open and close -------------------------------------------------------------------------- */

static int say_hello(struct orb_helper *h, uint64_t deadline)
{
    uint32_t seq = take_seq(h);
    size_t len = 0, nfds = 0;
    int rc = orb_hp_encode_hello(seq, h->buf, &len);
    if (rc != 0)
        return rc;
    struct orb_hp_msg reply;
    rc = exchange(h, ORB_HP_HELLO, seq, len, deadline, NULL, 0, &nfds, &reply);
    if (rc != 0)
        return rc;
    int32_t status = 0;
    struct orb_helper_info info = { .pid = (int32_t)h->pid };
    rc = orb_hp_decode_hello_reply(&reply, &status, &info.version, &info.uid, &info.gid,
                                   &info.caps_kept);
    rc = check_reply(h, ORB_HP_HELLO, rc, status, "");
    if (rc != 0)
        return session_fail(h, rc);
    if (info.version != ORB_HP_VERSION)
        return session_fail(h, orb_fail(ORB_EPROTO, "orbite-helper speaks protocol version %u, "
                                        "this library %u", (unsigned)info.version, ORB_HP_VERSION));
    /* The helper's identity of the tenant is its real uid/gid, inherited from us. */
    if (info.uid != (uint32_t)getuid() || info.gid != (uint32_t)getgid())
        return session_fail(h, orb_fail(ORB_EPROTO, "orbite-helper reports uid %u gid %u, we run "
                                        "as uid %u gid %u", (unsigned)info.uid,
                                        (unsigned)info.gid, (unsigned)getuid(),
                                        (unsigned)getgid()));
    h->info = info;
    return 0;
}

int orb_helper_failure_tolerated(enum orb_helper_mode mode, int status)
{
    return mode != ORB_HELPER_REQUIRED && status == ORB_EUNAVAILABLE;
}

int orb_helper_open(enum orb_helper_mode mode, uint64_t timeout_ns, struct orb_helper **out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "orb_helper_open: out is NULL");
    if (mode == ORB_HELPER_OFF)
        return orb_fail(ORB_EUNAVAILABLE, "orbite-helper is disabled by the configuration "
                        "(helper = off)");
    if (mode != ORB_HELPER_AUTO && mode != ORB_HELPER_REQUIRED)
        return orb_fail(ORB_EINVAL, "orb_helper_open: mode %d is not an orb_helper_mode",
                        (int)mode);
    uint64_t deadline = orb_deadline_after(timeout_ns);

    struct orb_helper *h = calloc(1, sizeof *h);
    if (h == NULL)
        return orb_fail(ORB_ENOMEM, "orbite-helper: out of memory");
    h->sock = -1;
    h->pidfd = -1;
    h->next_seq = 1;
    h->timeout_ns = timeout_ns;
    int rc;
    if (pthread_mutex_init(&h->lock, NULL) != 0) {
        rc = orb_fail(ORB_ENOMEM, "orbite-helper: cannot initialise a mutex");
        goto free_handle;
    }
    struct spawn_plan plan;
    rc = spawn_plan_init(&plan);
    if (rc != 0)
        goto destroy_lock;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        rc = orb_fail(orb_status_from_errno(errno), "orbite-helper: socketpair: %s",
                      strerror(errno));
        goto free_plan;
    }
    h->sock = sv[0];
    rc = spawn(&plan, sv[1], deadline, &h->pid, &h->pidfd);
    close(sv[1]);
    if (rc != 0) {
        close_fd(&h->sock);
        goto free_plan;
    }
    spawn_plan_free(&plan);

    rc = say_hello(h, deadline);
    if (rc != 0) {
        int saved = rc;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", orb_last_error());
        orb_helper_close(h);
        return orb_fail(saved, "%s", msg);
    }
    ORB_LOGD("orbite-helper pid %d: uid %u, capabilities kept 0x%x", (int)h->pid,
             (unsigned)h->info.uid, (unsigned)h->info.caps_kept);
    *out = h;
    return 0;

free_plan:
    spawn_plan_free(&plan);
destroy_lock:
    pthread_mutex_destroy(&h->lock);
free_handle:
    free(h);
    return rc;
}

int orb_helper_info(const struct orb_helper *h, struct orb_helper_info *out)
{
    if (h == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_helper_info: NULL argument");
    *out = h->info;
    return 0;
}

void orb_helper_close(struct orb_helper *h)
{
    if (h == NULL)
        return;
    /* EOF on its socket tells the helper to exit; it gets the session's timeout (at most
     * CLOSE_GRACE_MAX_NS) to do so. */
    close_fd(&h->sock);
    uint64_t grace = h->timeout_ns < CLOSE_GRACE_MAX_NS ? h->timeout_ns : CLOSE_GRACE_MAX_NS;
    if (h->pid > 0)
        reap_child(h->pid, h->pidfd, orb_deadline_after(grace));
    close_fd(&h->pidfd);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

/* ---- calls ----------------------------------------------------------------------------------- */

/* Lock the session and check it is still usable; on failure the lock is not held. */
static int begin_call(struct orb_helper *h)
{
    pthread_mutex_lock(&h->lock);
    int rc = session_usable(h);
    if (rc != 0)
        pthread_mutex_unlock(&h->lock);
    return rc;
}

/* Items are sent in the helper's order: ids strictly increasing. */
static int check_order(struct orb_helper *h, const char *kind, uint32_t index, int64_t previous,
                       int64_t id, int64_t limit)
{
    if (id < 0 || id >= limit || (index > 0 && id <= previous))
        return session_fail(h, orb_fail(ORB_EPROTO, "orbite-helper: inventory %s %u has id %lld "
                                        "(previous %lld, limit %lld)", kind, (unsigned)index,
                                        (long long)id, (long long)previous, (long long)limit));
    return 0;
}

/* Page through one kind of inventory item into `inv`. */
static int fetch_items(struct orb_helper *h, uint8_t kind, uint64_t deadline,
                       struct orb_topo_inventory *inv)
{
    static const char *const kind_names[] = { "NIC", "GPU", "NUMA node" };
    static const uint32_t limits[] = { ORB_TOPO_MAX_NICS, ORB_TOPO_MAX_GPUS, ORB_TOPO_MAX_NUMA };
    uint32_t total = 0;
    int64_t previous = -1;
    for (uint32_t index = 0; index == 0 || index < total; index++) {
        uint32_t seq = take_seq(h);
        size_t len = 0, nfds = 0;
        int rc = orb_hp_encode_inventory(seq, kind, index, h->buf, &len);
        if (rc != 0)
            return rc;
        struct orb_hp_msg reply;
        rc = exchange(h, ORB_HP_INVENTORY, seq, len, deadline, NULL, 0, &nfds, &reply);
        if (rc != 0)
            return rc;
        int32_t status = 0;
        uint32_t page_total = 0;
        struct orb_topo_nic nic;
        struct orb_topo_gpu gpu;
        struct orb_topo_numa numa;
        rc = orb_hp_decode_inventory_reply(&reply, kind, &status, &page_total, &nic, &gpu, &numa);
        /* A successful reply carries an item, so an empty list is ORB_ENOENT for index 0. */
        if (rc == 0 && index == 0 && status == ORB_ENOENT)
            break;
        rc = check_reply(h, ORB_HP_INVENTORY, rc, status, kind_names[kind]);
        if (rc != 0)
            return rc;
        if (index == 0 && page_total > limits[kind])
            return session_fail(h, orb_fail(ORB_EPROTO, "orbite-helper: %u %ss, at most %u",
                                            (unsigned)page_total, kind_names[kind],
                                            (unsigned)limits[kind]));
        if (index > 0 && page_total != total)
            return session_fail(h, orb_fail(ORB_EPROTO, "orbite-helper: %s count changed from %u "
                                            "to %u while paging", kind_names[kind],
                                            (unsigned)total, (unsigned)page_total));
        total = page_total;
        switch (kind) {
        case ORB_HP_INV_NIC:
            rc = check_order(h, kind_names[kind], index, previous, nic.id, ORB_TOPO_MAX_NICS);
            previous = nic.id;
            inv->nics[index] = nic;
            inv->nnics = index + 1;
            break;
        case ORB_HP_INV_GPU:
            rc = check_order(h, kind_names[kind], index, previous, gpu.ordinal, ORB_TOPO_MAX_GPUS);
            previous = gpu.ordinal;
            inv->gpus[index] = gpu;
            inv->ngpus = index + 1;
            break;
        default:
            rc = check_order(h, kind_names[kind], index, previous, numa.id, INT32_MAX);
            previous = numa.id;
            inv->numa[index] = numa;
            inv->nnuma = index + 1;
            break;
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

int orb_helper_inventory(struct orb_helper *h, struct orb_topo_inventory *out)
{
    if (h == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_helper_inventory: NULL argument");
    /* Built aside, so that *out is written only on success (the model is ~100 KiB). */
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    if (inv == NULL)
        return orb_fail(ORB_ENOMEM, "orbite-helper: out of memory for the inventory");
    int rc = begin_call(h);
    if (rc != 0)
        goto free_inv;
    uint64_t deadline = orb_deadline_after(h->timeout_ns);
    static const uint8_t kinds[] = { ORB_HP_INV_NIC, ORB_HP_INV_GPU, ORB_HP_INV_NUMA };
    for (size_t k = 0; rc == 0 && k < sizeof kinds; k++)
        rc = fetch_items(h, kinds[k], deadline, inv);
    pthread_mutex_unlock(&h->lock);
    if (rc == 0)
        memcpy(out, inv, sizeof *inv);
free_inv:
    free(inv);
    return rc;
}

int orb_helper_policy(struct orb_helper *h, struct orb_hp_policy *out)
{
    if (h == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_helper_policy: NULL argument");
    int rc = begin_call(h);
    if (rc != 0)
        return rc;
    uint32_t seq = take_seq(h);
    size_t len = 0, nfds = 0;
    struct orb_hp_msg reply;
    rc = orb_hp_encode_empty(ORB_HP_POLICY, seq, h->buf, &len);
    if (rc == 0)
        rc = exchange(h, ORB_HP_POLICY, seq, len, orb_deadline_after(h->timeout_ns), NULL, 0,
                      &nfds, &reply);
    if (rc == 0) {
        int32_t status = 0;
        struct orb_hp_policy policy;
        rc = orb_hp_decode_policy_reply(&reply, &status, &policy);
        rc = check_reply(h, ORB_HP_POLICY, rc, status, "");
        if (rc == 0)
            *out = policy;
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* An exchange whose successful reply carries exactly one descriptor: OPEN_DEVICE, SLOT_ATTACH.
 * The request is already encoded in h->buf. */
static int fd_call(struct orb_helper *h, uint16_t type, uint32_t seq, size_t len, const char *what,
                   int *fd_out)
{
    int fds[ORB_HP_MAX_FDS] = { -1 };
    size_t nfds = 0;
    struct orb_hp_msg reply;
    int rc = exchange(h, type, seq, len, orb_deadline_after(h->timeout_ns), fds, ORB_HP_MAX_FDS,
                      &nfds, &reply);
    if (rc != 0)
        return rc;
    int32_t status = 0;
    uint32_t declared = 0;
    rc = orb_hp_decode_fd_reply(&reply, &status, &declared);
    if (rc == 0 && declared != nfds)
        rc = orb_fail(ORB_EPROTO, "reply declares %u descriptors and carries %zu",
                      (unsigned)declared, nfds);
    if (rc == 0 && status == 0 && declared != 1)
        rc = orb_fail(ORB_EPROTO, "a successful reply must carry one descriptor, not %u",
                      (unsigned)declared);
    if (rc != 0 || status != 0) {
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
    }
    rc = check_reply(h, type, rc, status, what);
    if (rc != 0)
        return rc;
    *fd_out = fds[0];
    return 0;
}

static int check_name(const char *call, const char *name)
{
    if (name == NULL)
        return orb_fail(ORB_EINVAL, "%s: name is NULL", call);
    size_t len = strnlen(name, ORB_HP_NAME_MAX + 1);
    if (len > ORB_HP_NAME_MAX || !orb_hp_name_valid(name, len))
        return orb_fail(ORB_EINVAL,
                        "%s: '%.*s' is not a device or slot name ([A-Za-z0-9_.-]{1,%u})", call,
                        (int)(len > ORB_HP_NAME_MAX ? ORB_HP_NAME_MAX : len), name,
                        ORB_HP_NAME_MAX);
    return 0;
}

int orb_helper_open_device(struct orb_helper *h, const char *nic, int *fd_out)
{
    if (h == NULL || fd_out == NULL)
        return orb_fail(ORB_EINVAL, "orb_helper_open_device: NULL argument");
    int rc = check_name("orb_helper_open_device", nic);
    if (rc != 0)
        return rc;
    rc = begin_call(h);
    if (rc != 0)
        return rc;
    uint32_t seq = take_seq(h);
    size_t len = 0;
    rc = orb_hp_encode_open_device(seq, nic, h->buf, &len);
    if (rc == 0)
        rc = fd_call(h, ORB_HP_OPEN_DEVICE, seq, len, nic, fd_out);
    pthread_mutex_unlock(&h->lock);
    return rc;
}

int orb_helper_slot_attach(struct orb_helper *h, const char *slot, uint64_t interval_ns,
                           int *fd_out)
{
    if (h == NULL || fd_out == NULL)
        return orb_fail(ORB_EINVAL, "orb_helper_slot_attach: NULL argument");
    int rc = check_name("orb_helper_slot_attach", slot);
    if (rc != 0)
        return rc;
    rc = begin_call(h);
    if (rc != 0)
        return rc;
    uint32_t seq = take_seq(h);
    size_t len = 0;
    rc = orb_hp_encode_slot_attach(seq, slot, interval_ns, h->buf, &len);
    if (rc == 0)
        rc = fd_call(h, ORB_HP_SLOT_ATTACH, seq, len, slot, fd_out);
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* The peer-memory probe's candidate files (NCCL's order): bits above these are nonsense. */
#define PEERMEM_CANDIDATES 3u

int orb_helper_peermem_probe(struct orb_helper *h, uint32_t *found_out)
{
    if (h == NULL || found_out == NULL)
        return orb_fail(ORB_EINVAL, "orb_helper_peermem_probe: NULL argument");
    int rc = begin_call(h);
    if (rc != 0)
        return rc;
    uint32_t seq = take_seq(h);
    size_t len = 0, nfds = 0;
    struct orb_hp_msg reply;
    rc = orb_hp_encode_empty(ORB_HP_PEERMEM_PROBE, seq, h->buf, &len);
    if (rc == 0)
        rc = exchange(h, ORB_HP_PEERMEM_PROBE, seq, len, orb_deadline_after(h->timeout_ns), NULL,
                      0, &nfds, &reply);
    if (rc == 0) {
        int32_t status = 0;
        uint32_t found = 0;
        rc = orb_hp_decode_peermem_reply(&reply, &status, &found);
        if (rc == 0 && (found >> PEERMEM_CANDIDATES) != 0)
            rc = orb_fail(ORB_EPROTO, "peermem bits 0x%x name files that are not probed",
                          (unsigned)found);
        rc = check_reply(h, ORB_HP_PEERMEM_PROBE, rc, status, "");
        if (rc == 0)
            *found_out = found;
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

int orb_helper_devx_verify(struct orb_helper *h, const struct orb_hp_devx_verify *v)
{
    if (h == NULL || v == NULL)
        return orb_fail(ORB_EINVAL, "orb_helper_devx_verify: NULL argument");
    if (memchr(v->nic, '\0', sizeof v->nic) == NULL)
        return orb_fail(ORB_EINVAL, "orb_helper_devx_verify: NIC name is not NUL-terminated");
    int rc = check_name("orb_helper_devx_verify", v->nic);
    if (rc != 0)
        return rc;
    rc = begin_call(h);
    if (rc != 0)
        return rc;
    uint32_t seq = take_seq(h);
    size_t len = 0, nfds = 0;
    struct orb_hp_msg reply;
    rc = orb_hp_encode_devx_verify(seq, v, h->buf, &len);
    if (rc == 0)
        rc = exchange(h, ORB_HP_DEVX_VERIFY, seq, len, orb_deadline_after(h->timeout_ns), NULL, 0,
                      &nfds, &reply);
    if (rc == 0) {
        int32_t status = 0;
        rc = orb_hp_decode_status(&reply, &status);
        rc = check_reply(h, ORB_HP_DEVX_VERIFY, rc, status, v->nic);
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}
