/* The installed orbite-helper against a hostile tenant racing it for shared slot objects. In a
 * private test system (sysns.h) a copy of the installed build carries its file capabilities, and
 * the policy grants the victim (uid VICTIM_UID) the slot "victim" and the hostile tenant
 * (HOSTILE_UID) the slot "hostile". For ATTACK_NS, concurrently:
 *
 *  - the victim runs one helper session after another, each attaching "victim", and accepts
 *    only an administrator-owned, read-only, mode 0644 object of one page with a valid header,
 *    or a refusal (ORB_EPERM) while the hostile tenant holds the name;
 *  - the hostile tenant watches /dev/shm with inotify and opens every new name for writing,
 *    lists /dev/shm and opens every entry, probes the helpers' private directory and the lock
 *    files in it, opens whatever /proc/PID/fd offers, squats the victim's name (a file with a
 *    perfect header, a staged rename, a symbolic link to /etc/shadow, hard links, a FIFO, a
 *    directory) and runs its own helper sessions that keep creating "hostile";
 *  - the administrator (this test, root) removes the objects every ADMIN_TICK_MS, so that the
 *    victim's helpers keep creating fresh ones.
 *
 * Time is cut into PHASE_NS phases: quiet (no squats), squats, the victim's helpers at
 * SCHED_IDLE (slow, to widen any window they have), the hostile tenant's watchers at SCHED_IDLE;
 * every other session of the hostile tenant's own helper runs at SCHED_IDLE as well. At the end
 * every hostile process reports every descriptor it holds: none may be a writable descriptor of
 * an administrator-owned object, as a tenant got from a helper that created the object under
 * its final name and gave it to root only afterwards. The attack is extended (up to
 * MAX_ATTACK_NS) while the victim has had fewer than MIN_FRESH fresh objects, which only a very
 * busy machine causes. Needs root: exits 77 (skipped) otherwise. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "common/helper_proto.h"
#include "helper_test_util.h"
#include "sysns.h"
#include "util/fdio.h"
#include "topo/slots.h"

#define VICTIM_UID 61001u
#define HOSTILE_UID 61002u
#define HELPER_PATH "/etc/orbite/orbite-helper"
#define HELPER_CAPS "cap_chown,cap_dac_override=p"
#define POLICY_FILE "50-race.ini"
#define SHM_DIR "/dev/shm"
#define PRIVATE_NAME "orbite+helper" /* ORB_HELPER_PRIVATE_DIR */
#define VICTIM_SLOT "victim"
#define HOSTILE_SLOT "hostile"
#define LITTER_PREFIX "h-"           /* every other name the hostile tenant makes */
#define SLOT_SIZE 4096u
#define SLOT_MODE 0644u

#define MS 1000000ull
#define ATTACK_NS (10000ull * MS)      /* the attack, at least */
#define MAX_ATTACK_NS (20000ull * MS)  /* ... at most, on a machine too busy for MIN_FRESH rounds */
#define EXTEND_NS (1000ull * MS)
#define PHASE_NS (250ull * MS)
#define ADMIN_TICK_MS 50
#define SESSION_WAIT_MS 5000
#define CHILD_GRACE_MS 15000
#define WORLD_WAIT_MS 50000
#define MIN_FRESH 20u
#define ATTACH_WAIT_MS 20000
/* A helper at SCHED_IDLE on a saturated machine waits seconds for each time slice: on a busy
 * machine (machine_busy), and for IDLE_PAUSE sessions after a slowed SLOT_ATTACH that took longer
 * than SLOW_IDLE_NS (a few ms on an idle machine), helpers run at normal priority, so that the
 * run stays short and within its timeouts. */
#define SLOW_IDLE_NS (500ull * MS)
#define IDLE_PAUSE 20u
#define MAX_HELD 8192u
#define NOTE_LEN 480

static const char policy_text[] = "[user:#61001]\n"
                                  "slots = " VICTIM_SLOT "\n"
                                  "transports = tcp\n"
                                  "\n"
                                  "[user:#61002]\n"
                                  "slots = " HOSTILE_SLOT "\n"
                                  "transports = tcp\n";

enum phase { PHASE_QUIET, PHASE_SQUAT, PHASE_HELPER_IDLE, PHASE_TENANT_IDLE, PHASE_COUNT };

enum hostile_role { ROLE_WATCH, ROLE_SCAN, ROLE_SQUAT, ROLE_SESSION, ROLE_COUNT };

static const char *const role_names[ROLE_COUNT] = {"watcher", "scanner", "squatter", "sessions"};

/* What one hostile process did and holds. Counters a role does not use stay 0. */
struct hostile_report {
    uint32_t started;        /* 1 once the process runs as the hostile tenant */
    uint64_t events;         /* inotify events */
    uint64_t overflows;      /* IN_Q_OVERFLOW */
    uint64_t open_tries;     /* write opens attempted */
    uint64_t open_denied;    /* EACCES / EPERM */
    uint64_t open_other;     /* any other error (ENOENT, ELOOP, EISDIR, ENXIO, ...) */
    uint64_t opened;         /* write opens that succeeded (its own objects) */
    uint32_t root_writable_at_open; /* a writable open of an administrator-owned object */
    uint32_t not_kept;       /* descriptors closed because MAX_HELD were held */
    uint64_t privdir_denied; /* the private directory refused to open or list */
    uint32_t privdir_opened; /* ... or opened */
    uint32_t privdir_watch;  /* an inotify watch on the private directory was accepted */
    uint64_t lock_tries;     /* guessed lock file names in the private directory */
    uint32_t lock_opened;
    uint64_t privdir_mkdir_tries;
    uint32_t privdir_mkdir;  /* the private directory could be created */
    uint64_t proc_dirs;      /* /proc/PID/fd directories listed */
    uint64_t proc_denied;
    uint64_t squat_tries;
    uint32_t squat_created, squat_renamed, squat_symlink, squat_link_own, squat_link_etc, squat_fifo, squat_dir;
    uint64_t link_tries;     /* hard links to the administrator's object attempted */
    uint32_t link_stolen;    /* ... and made */
    uint32_t sessions, idle_sessions, idle_skipped, session_fail, bad_exit;
    uint32_t hostile_attached, hostile_eperm, hostile_other, hostile_bad_fd;
    uint32_t victim_eperm, victim_other;
    /* the final count of every descriptor held */
    uint32_t held, held_shm, held_shm_root, held_writable, held_root_writable;
    char note[NOTE_LEN];
};

struct victim_report {
    uint32_t started;
    uint32_t rounds, idle_tries, idle_rounds, idle_skipped;
    uint32_t attached;       /* status 0 with a sound object */
    uint32_t fresh;          /* ... one not attached by the round before */
    uint32_t refused;        /* ORB_EPERM */
    uint32_t foreign;        /* status 0 with an object not owned by root */
    uint32_t bad_object;     /* status 0 with a wrong type, mode, size, link count or access */
    uint32_t bad_header;     /* status 0 with a header that does not validate */
    uint32_t writable_map;   /* the descriptor could be mapped writable */
    uint32_t unlinked_early; /* the administrator removed the name before the check (nlink 1) */
    uint32_t linked_early;   /* the tenant linked it before the check (unprotected hard links) */
    uint32_t other_status;
    int32_t first_other_status;
    uint32_t spawn_fail, hello_fail, call_fail, bad_exit;
    int32_t first_bad_exit;
    uint64_t slowest_round_ns, total_round_ns;
    char note[NOTE_LEN];
};

struct world_report {
    uint32_t setup_ok;
    uint32_t reports_ok;     /* every child reported and exited 0 */
    uint32_t children_failed;
    uint32_t hardlinks_protected;
    struct victim_report warmup;
    struct victim_report victim;
    struct hostile_report hostile[ROLE_COUNT];
    uint32_t ticks, removed_root, removed_squat, removed_hostile, removed_litter, admin_errors;
    uint32_t privdir_ok;
    uint32_t idle_switches;  /* the hostile watchers moved in or out of SCHED_IDLE */
    uint32_t extensions;     /* EXTEND_NS added to the attack */
    uint64_t attack_ns;
    char note[NOTE_LEN];
};

/* ---- small things ------------------------------------------------------------------------------ */

static dev_t shm_dev;             /* the namespace's /dev/shm */
static bool hardlinks_protected;  /* fs.protected_hardlinks */

/* Shared by the administrator and every tenant process (an anonymous shared mapping): the end
 * of the attack, which the administrator extends while the victim has too few fresh objects. */
struct shared_state {
    _Atomic uint64_t deadline;
    _Atomic uint32_t fresh;
};
static struct shared_state *shared;

static uint64_t now_ns(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool attack_over(void)
{
    return now_ns() >= atomic_load(&shared->deadline);
}

static enum phase phase_at(uint64_t t0, uint64_t now)
{
    return now < t0 ? PHASE_QUIET : (enum phase)(((now - t0) / PHASE_NS) % PHASE_COUNT);
}

static void note(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(char *buf, const char *fmt, ...)
{
    size_t used = strnlen(buf, NOTE_LEN);
    if (used + 2 >= NOTE_LEN)
        return;
    if (used > 0) {
        buf[used++] = ';';
        buf[used] = '\0';
    }
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(buf + used, NOTE_LEN - used, fmt, ap);
    va_end(ap);
}

/* waitpid with a deadline, SIGKILL past it. The wait status, or -1 (killed or lost). */
static int wait_child(pid_t pid, uint64_t deadline)
{
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 && errno != EINTR)
            return -1;
        if (now_ns() >= deadline) {
            (void)kill(pid, SIGKILL);
            (void)waitpid(pid, &status, 0);
            return -1;
        }
        sleep_ns(2 * MS);
    }
}

static bool set_policy(pid_t pid, int policy)
{
    struct sched_param sp = {.sched_priority = 0};
    return sched_setscheduler(pid, policy, &sp) == 0;
}

/* Move the helper `worker` and its monitor (the worker's child) to `policy`. For SCHED_IDLE only
 * root may: the monitor holds capabilities its tenant does not, which the kernel takes as a
 * reason to refuse the tenant. Whether both were moved. */
static bool move_helper(pid_t worker, int policy)
{
    bool worker_moved = set_policy(worker, policy);
    pid_t monitor = hp_child_of(worker, 0);
    return worker_moved && monitor > 0 && set_policy(monitor, policy);
}

/* The administrator's service that slows helpers down for one tenant process: it reads a worker's
 * pid, moves it and its monitor to SCHED_IDLE (a negative pid: back to SCHED_OTHER) and answers
 * one byte (1: done). The tenant asks after HELLO and again after SLOT_ATTACH, so that the
 * helper starts up and exits at normal priority (a busy machine must not stretch those past the
 * call timeouts) while the slot object's creation runs as slowly as the machine makes it. */
struct idler {
    pid_t pid;
    int req[2], ack[2];
};

static int idle_req_fd = -1, idle_ack_fd = -1; /* the tenant's ends, in the tenant's process */

static void idler_main(struct idler *id)
{
    close(id->req[1]);
    close(id->ack[0]);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        _exit(20);
    for (;;) {
        int32_t pid = 0;
        if (test_read_all(id->req[0], &pid, sizeof pid, WORLD_WAIT_MS) != 0 || pid == 0 || pid == INT32_MIN)
            _exit(0);
        char done = move_helper((pid_t)(pid > 0 ? pid : -pid), pid > 0 ? SCHED_IDLE : SCHED_OTHER) ? 1 : 0;
        if (test_write_all(id->ack[1], &done, 1) != 0)
            _exit(0);
    }
}

static int idler_start(struct idler *id)
{
    if (pipe2(id->req, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(id->ack, O_CLOEXEC) != 0) {
        close(id->req[0]);
        close(id->req[1]);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    id->pid = fork();
    if (id->pid == 0)
        idler_main(id);
    close(id->req[0]);
    close(id->ack[1]);
    return id->pid > 0 ? 0 : -1;
}

/* More runnable tasks than twice the CPUs (/proc/loadavg's fourth field): a helper at SCHED_IDLE
 * would wait seconds for each time slice, so none is slowed down. */
static bool machine_busy(void)
{
    char buf[128];
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    unsigned running = 0, threads = 0;
    if (n <= 0)
        return false;
    buf[n] = '\0';
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return sscanf(buf, "%*f %*f %*f %u/%u", &running, &threads) == 2 && cpus > 0 && running > 2u * (unsigned)cpus;
}

/* In the tenant's process: ask for the helper `worker` to be slowed down, or back to normal. */
static bool slow_down_helper(pid_t worker, bool slow)
{
    int32_t pid = slow ? (int32_t)worker : -(int32_t)worker;
    char done = 0;
    return idle_req_fd >= 0 && test_write_all(idle_req_fd, &pid, sizeof pid) == 0 &&
           test_read_all(idle_ack_fd, &done, 1, 2000) == 0 && done == 1;
}

/* A page with a valid version-1 header in this clock domain: what the hostile tenant squats with. */
static int plausible_page(uint64_t *page)
{
    memset(page, 0, SLOT_SIZE);
    struct orb_slots_params params = {.interval_ns = ORB_SLOTS_DEFAULT_INTERVAL_NS, .now_ns = now_ns()};
    if (orb_clock_domain_current(&params.domain) != 0 ||
        getrandom(&params.publisher_epoch, sizeof params.publisher_epoch, 0) != (ssize_t)sizeof params.publisher_epoch)
        return -1;
    params.publisher_epoch |= 1;
    return orb_slots_encode(page, SLOT_SIZE, &params) == 0 ? 0 : -1;
}

/* SLOT_ATTACH `name` with the default interval: 0 with *status and *fd (-1 without one), or -1
 * when the exchange itself failed or the reply broke the protocol. It waits up to ATTACH_WAIT_MS
 * for the reply (longer than hp_call): a helper at SCHED_IDLE on a busy machine is slow, not
 * wrong; the helper's own bound on its monitor (ORB_MON_TIMEOUT_MS) still applies. */
static int slot_attach(struct hp_proc *p, const char *name, int32_t *status, int *fd)
{
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0, nfds = 0;
    struct orb_hp_msg m;
    int got[1] = {-1};
    *fd = -1;
    if (orb_hp_encode_slot_attach(p->seq++, name, ORB_SLOTS_DEFAULT_INTERVAL_NS, req, &len) != 0 ||
        orb_hp_send(p->sock, req, len, NULL, 0) != 0 ||
        orb_hp_recv(p->sock, rep, &len, got, 1, &nfds, ATTACH_WAIT_MS) != 0)
        return -1;
    uint32_t declared = 0;
    if (orb_hp_parse(rep, len, &m) != 0 || m.hdr.type != ORB_HP_SLOT_REPLY ||
        orb_hp_decode_fd_reply(&m, status, &declared) != 0 || declared != (*status == 0 ? 1u : 0u) ||
        nfds != declared) {
        orb_hp_close_fds(got, nfds);
        return -1;
    }
    *fd = got[0];
    return 0;
}

static bool exited_zero(int ws)
{
    return ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
}

/* ---- the hostile tenant: descriptors ------------------------------------------------------------ */

static struct {
    unsigned n;
    int fd[MAX_HELD];
    dev_t dev[MAX_HELD];
    ino_t ino[MAX_HELD];
    int acc[MAX_HELD];
} held;

static bool is_writable(int acc)
{
    return acc == O_RDWR || acc == O_WRONLY;
}

/* An administrator-owned object the tenant must never write: anything on /dev/shm, and any
 * regular file (/etc/shadow through a link, say). */
static bool protected_object(const struct stat *s)
{
    return s->st_uid == 0 && (s->st_dev == shm_dev || S_ISREG(s->st_mode));
}

/* Keep fd, unless one to the same object with the same access is kept already. */
static void keep_fd(struct hostile_report *r, int fd, const char *where, const char *name)
{
    struct stat s;
    int fl = fcntl(fd, F_GETFL);
    if (fstat(fd, &s) != 0 || fl < 0) {
        close(fd);
        return;
    }
    int acc = fl & O_ACCMODE;
    bool violation = is_writable(acc) && protected_object(&s);
    if (violation) {
        r->root_writable_at_open++;
        note(r->note, "writable open of root-owned %s/%s: ino %llu mode %04o nlink %lu", where, name,
             (unsigned long long)s.st_ino, (unsigned)(s.st_mode & 07777), (unsigned long)s.st_nlink);
    }
    for (unsigned i = 0; i < held.n && !violation; i++) {
        if (held.dev[i] == s.st_dev && held.ino[i] == s.st_ino && held.acc[i] == acc) {
            close(fd);
            return;
        }
    }
    if (held.n >= MAX_HELD) {
        r->not_kept++;
        if (!violation)
            close(fd);
        return;
    }
    held.fd[held.n] = fd;
    held.dev[held.n] = s.st_dev;
    held.ino[held.n] = s.st_ino;
    held.acc[held.n] = acc;
    held.n++;
}

/* Open dirfd/name for writing (read-write, else write-only) and keep what it gives. */
static void try_write_open(struct hostile_report *r, int dirfd, const char *name, bool follow, const char *where)
{
    int base = O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW);
    r->open_tries++;
    int fd = openat(dirfd, name, O_RDWR | base);
    if (fd < 0 && (errno == EACCES || errno == EPERM))
        fd = openat(dirfd, name, O_WRONLY | base);
    if (fd < 0) {
        if (errno == EACCES || errno == EPERM)
            r->open_denied++;
        else
            r->open_other++;
        return;
    }
    r->opened++;
    keep_fd(r, fd, where, name);
}

/* Every descriptor of this process, as fstat and F_GETFL see it now. */
static void tally_fds(struct hostile_report *r)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) {
        note(r->note, "cannot list /proc/self/fd: %s", strerror(errno));
        r->held_root_writable = UINT32_MAX; /* unknown counts as failed */
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end = NULL;
        long fd = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == dirfd(d))
            continue;
        struct stat s;
        int fl = fcntl((int)fd, F_GETFL);
        if (fl < 0 || fstat((int)fd, &s) != 0)
            continue;
        int acc = fl & O_ACCMODE;
        r->held++;
        if (s.st_dev == shm_dev)
            r->held_shm++;
        if (s.st_dev == shm_dev && s.st_uid == 0)
            r->held_shm_root++;
        if (is_writable(acc))
            r->held_writable++;
        if (is_writable(acc) && protected_object(&s)) {
            r->held_root_writable++;
            char path[64], target[256] = "?";
            snprintf(path, sizeof path, "/proc/self/fd/%ld", fd);
            ssize_t n = readlink(path, target, sizeof target - 1);
            if (n > 0)
                target[n] = '\0';
            note(r->note, "holds writable fd %ld (flags %#o) of root-owned %s: ino %llu mode %04o nlink %lu", fd,
                 (unsigned)fl, target, (unsigned long long)s.st_ino, (unsigned)(s.st_mode & 07777),
                 (unsigned long)s.st_nlink);
        }
    }
    closedir(d);
}

/* ---- the hostile tenant: the tricks ------------------------------------------------------------- */

/* inotify on /dev/shm: every new name, moved-in name and attribute change is opened at once. */
static void run_watcher(struct hostile_report *r)
{
    int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    int shm = open(SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int wd = in >= 0 ? inotify_add_watch(in, SHM_DIR, IN_CREATE | IN_MOVED_TO | IN_ATTRIB) : -1;
    if (in < 0 || shm < 0 || wd < 0) {
        note(r->note, "watcher setup: %s", strerror(errno));
        r->started = 0;
        return;
    }
    if (inotify_add_watch(in, SHM_DIR "/" PRIVATE_NAME, IN_CREATE | IN_MOVED_TO | IN_ATTRIB | IN_OPEN) >= 0) {
        r->privdir_watch++;
        note(r->note, "inotify watch on the private directory accepted");
    } else {
        r->privdir_denied++;
    }
    _Alignas(struct inotify_event) char buf[32768];
    while (!attack_over()) {
        struct pollfd p = {.fd = in, .events = POLLIN, .revents = 0};
        (void)poll(&p, 1, 20);
        for (;;) {
            ssize_t n = read(in, buf, sizeof buf);
            if (n <= 0)
                break;
            for (ssize_t off = 0; off < n;) {
                const struct inotify_event *ev = (const struct inotify_event *)(const void *)(buf + off);
                r->events++;
                if (ev->mask & IN_Q_OVERFLOW)
                    r->overflows++;
                if (ev->len > 0 && ev->wd == wd && ev->name[0] != '\0')
                    try_write_open(r, shm, ev->name, false, SHM_DIR);
                off += (ssize_t)(sizeof *ev + ev->len);
            }
        }
    }
    close(shm);
    close(in);
}

/* The private directory: list it, guess its lock files through an O_PATH descriptor, create it. */
static void probe_private(struct hostile_report *r, int shm)
{
    int d = openat(shm, PRIVATE_NAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d >= 0) {
        r->privdir_opened++;
        int walk = dup(d);
        DIR *dir = walk >= 0 ? fdopendir(walk) : NULL;
        struct dirent *e;
        while (dir != NULL && (e = readdir(dir)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                try_write_open(r, d, e->d_name, false, SHM_DIR "/" PRIVATE_NAME);
        if (dir != NULL)
            closedir(dir);
        else if (walk >= 0)
            close(walk);
        close(d);
    } else {
        r->privdir_denied++;
    }
    int path = openat(shm, PRIVATE_NAME, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat vs;
    if (path >= 0 && fstatat(shm, VICTIM_SLOT, &vs, AT_SYMLINK_NOFOLLOW) == 0 && vs.st_uid == 0) {
        char lock[96];
        snprintf(lock, sizeof lock, "%s+%llx.lock", VICTIM_SLOT, (unsigned long long)vs.st_ino);
        r->lock_tries++;
        int fd = openat(path, lock, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) {
            r->lock_opened++;
            note(r->note, "opened lock file %s", lock);
            keep_fd(r, fd, SHM_DIR "/" PRIVATE_NAME, lock);
        }
        fd = openat(path, "new+0000000000000001", O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) {
            note(r->note, "created a file in the private directory");
            r->privdir_opened++;
            keep_fd(r, fd, SHM_DIR "/" PRIVATE_NAME, "new+");
        }
    }
    if (path >= 0)
        close(path);
    r->privdir_mkdir_tries++;
    if (mkdirat(shm, PRIVATE_NAME, 0777) == 0) {
        r->privdir_mkdir++;
        note(r->note, "created the private directory");
    }
}

/* Every /proc/PID/fd the tenant may list: each entry opened for writing. */
static void scan_proc(struct hostile_report *r)
{
    DIR *procs = opendir("/proc");
    if (procs == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(procs)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/%s/fd", e->d_name);
        int d = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (d < 0) {
            r->proc_denied++;
            continue;
        }
        r->proc_dirs++;
        int walk = dup(d);
        DIR *fds = walk >= 0 ? fdopendir(walk) : NULL;
        struct dirent *f;
        while (fds != NULL && (f = readdir(fds)) != NULL)
            if (f->d_name[0] >= '0' && f->d_name[0] <= '9')
                try_write_open(r, d, f->d_name, true, path);
        if (fds != NULL)
            closedir(fds);
        else if (walk >= 0)
            close(walk);
        close(d);
    }
    closedir(procs);
}

/* readdir /dev/shm and open every entry, probe the private directory, now and then /proc. */
static void run_scanner(struct hostile_report *r)
{
    int shm = open(SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (shm < 0) {
        note(r->note, "scanner setup: %s", strerror(errno));
        r->started = 0;
        return;
    }
    uint64_t next_proc = 0;
    while (!attack_over()) {
        uint64_t now = now_ns();
        int walk = openat(shm, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *d = walk >= 0 ? fdopendir(walk) : NULL;
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && strcmp(e->d_name, PRIVATE_NAME) != 0)
                try_write_open(r, shm, e->d_name, false, SHM_DIR);
        if (d != NULL)
            closedir(d);
        else if (walk >= 0)
            close(walk);
        probe_private(r, shm);
        if (now >= next_proc) {
            scan_proc(r);
            next_proc = now + 100 * MS;
        }
        sleep_ns(200000);
    }
    close(shm);
}

/* Create dir/name with the plausible page, mode 0644. The descriptor, or -1. */
static int make_squat_file(int shm, const char *name, const uint64_t *page)
{
    int fd = openat(shm, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    if (test_write_all(fd, page, SLOT_SIZE) != 0 || fchmod(fd, SLOT_MODE) != 0) {
        close(fd);
        (void)unlinkat(shm, name, 0);
        return -1;
    }
    return fd;
}

/* In the squat phases: take the victim's name, every way a tenant can. */
static void run_squatter(struct hostile_report *r, uint64_t t0)
{
    static uint64_t page[SLOT_SIZE / sizeof(uint64_t)];
    int shm = open(SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (shm < 0 || plausible_page(page) != 0) {
        note(r->note, "squatter setup failed");
        r->started = 0;
        return;
    }
    unsigned i = 0;
    while (!attack_over()) {
        if (phase_at(t0, now_ns()) != PHASE_SQUAT) {
            sleep_ns(2 * MS);
            continue;
        }
        /* Ours already (or anything but the administrator's object): wait for it to be removed. */
        struct stat vs;
        if (fstatat(shm, VICTIM_SLOT, &vs, AT_SYMLINK_NOFOLLOW) == 0 && (vs.st_uid != 0 || !S_ISREG(vs.st_mode))) {
            sleep_ns(100000);
            continue;
        }
        i++;
        char name[64];
        snprintf(name, sizeof name, LITTER_PREFIX "%u", i);
        r->squat_tries++;
        int fd = -1;
        switch (i % 8) {
        case 0: /* the name itself, with a perfect header */
            if ((fd = make_squat_file(shm, VICTIM_SLOT, page)) >= 0)
                r->squat_created++;
            break;
        case 1: /* complete first, then renamed over the name */
            if ((fd = make_squat_file(shm, name, page)) >= 0) {
                if (renameat(shm, name, shm, VICTIM_SLOT) == 0)
                    r->squat_renamed++;
                else
                    (void)unlinkat(shm, name, 0);
            }
            break;
        case 2:
            if (symlinkat("/etc/shadow", shm, VICTIM_SLOT) == 0)
                r->squat_symlink++;
            break;
        case 3: /* a second name for the administrator's object */
            r->link_tries++;
            if (linkat(shm, VICTIM_SLOT, shm, name, 0) == 0) {
                r->link_stolen++;
                try_write_open(r, shm, name, false, SHM_DIR);
            }
            break;
        case 4: /* our own file linked in, then its first name dropped: one link again */
            if ((fd = make_squat_file(shm, name, page)) >= 0) {
                if (linkat(shm, name, shm, VICTIM_SLOT, 0) == 0)
                    r->squat_link_own++;
                (void)unlinkat(shm, name, 0);
            }
            break;
        case 5:
            if (linkat(AT_FDCWD, "/etc/shadow", shm, VICTIM_SLOT, 0) == 0)
                r->squat_link_etc++;
            break;
        case 6:
            if (mkfifoat(shm, VICTIM_SLOT, 0644) == 0)
                r->squat_fifo++;
            break;
        default:
            if (mkdirat(shm, VICTIM_SLOT, 0755) == 0)
                r->squat_dir++;
            break;
        }
        if (fd >= 0)
            keep_fd(r, fd, SHM_DIR, VICTIM_SLOT);
        sleep_ns(100000);
    }
    close(shm);
}

/* The hostile tenant's own helper sessions: "hostile" (created again and again) and "victim"
 * (not granted). */
static void run_sessions(struct hostile_report *r)
{
    unsigned pause = 0;
    while (!attack_over()) {
        struct hp_proc p = {.pid = 0, .sock = -1, .seq = 1};
        const char *argv[] = {HELPER_PATH, NULL};
        struct hp_spawn_opts o = {.argv = argv, .keep_ids = true};
        if (hp_spawn(&p, &o) != 0) {
            r->session_fail++;
            note(r->note, "spawn: %s", strerror(errno));
            sleep_ns(10 * MS);
            continue;
        }
        r->sessions++;
        int32_t status = 1;
        int fd = -1;
        bool hello = hp_hello(&p) == 0;
        bool want = hello && r->sessions % 2 == 0, idle = false;
        if (want && (pause > 0 || machine_busy()))
            r->idle_skipped++;
        else if (want)
            idle = slow_down_helper(p.pid, true);
        pause -= pause > 0;
        r->idle_sessions += idle;
        uint64_t asked = now_ns();
        if (!hello) {
            r->session_fail++;
            note(r->note, "session %u: HELLO failed", r->sessions);
        } else if (slot_attach(&p, HOSTILE_SLOT, &status, &fd) != 0) {
            r->session_fail++;
            note(r->note, "session %u: SLOT_ATTACH " HOSTILE_SLOT " exchange failed", r->sessions);
        } else {
            if (status == 0) {
                struct stat s;
                int fl = fcntl(fd, F_GETFL);
                if (fstat(fd, &s) == 0 && fl >= 0 && s.st_uid == 0 && S_ISREG(s.st_mode) &&
                    (fl & O_ACCMODE) == O_RDONLY && (s.st_mode & 07777) == SLOT_MODE) {
                    r->hostile_attached++;
                } else {
                    r->hostile_bad_fd++;
                    note(r->note, "session %u: " HOSTILE_SLOT " fd uid %u mode %04o flags %#x", r->sessions,
                         (unsigned)s.st_uid, (unsigned)(s.st_mode & 07777), (unsigned)fl);
                }
                keep_fd(r, fd, "reply", HOSTILE_SLOT);
            } else if (status == ORB_EPERM) {
                r->hostile_eperm++;
            } else {
                r->hostile_other++;
                note(r->note, "session %u: " HOSTILE_SLOT " status %d", r->sessions, (int)status);
            }
            if (slot_attach(&p, VICTIM_SLOT, &status, &fd) != 0) {
                r->session_fail++;
                note(r->note, "session %u: SLOT_ATTACH " VICTIM_SLOT " exchange failed", r->sessions);
            } else if (status == ORB_EPERM && fd < 0) {
                r->victim_eperm++;
            } else {
                r->victim_other++;
                note(r->note, "session %u: " VICTIM_SLOT " (not granted) status %d", r->sessions, (int)status);
                if (fd >= 0)
                    keep_fd(r, fd, "reply", VICTIM_SLOT);
            }
        }
        if (idle) {
            (void)slow_down_helper(p.pid, false);
            if (now_ns() - asked > SLOW_IDLE_NS)
                pause = IDLE_PAUSE;
        }
        hp_close(&p);
        int ws = hp_wait(&p, SESSION_WAIT_MS);
        if (!exited_zero(ws)) {
            r->bad_exit++;
            note(r->note, "session %u: wait status %#x", r->sessions, (unsigned)ws);
        }
    }
}

/* Descriptors 0-2 on /dev/null, the report on 3, the idler's ends (if any) on 4 and 5, nothing
 * else: what the test harness left open (log files, terminals) is not the tenant's loot. Returns
 * the report descriptor or -1. */
static int strip_descriptors(int report_fd)
{
    int keep[3] = {report_fd, idle_req_fd, idle_ack_fd};
    int high[3] = {-1, -1, -1};
    for (int i = 0; i < 3; i++)
        if (keep[i] >= 0 && (high[i] = fcntl(keep[i], F_DUPFD_CLOEXEC, 64)) < 0)
            return -1;
    for (int i = 0; i < 3; i++)
        if (high[i] >= 0 && dup3(high[i], 3 + i, O_CLOEXEC) != 3 + i)
            return -1;
    if (close_range(6, ~0u, 0) != 0)
        return -1;
    for (int i = 1; i < 3; i++)
        if (keep[i] < 0)
            (void)close(3 + i);
    idle_req_fd = keep[1] >= 0 ? 4 : -1;
    idle_ack_fd = keep[2] >= 0 ? 5 : -1;
    int null = open("/dev/null", O_RDWR);
    if (null < 0)
        return -1;
    for (int i = 0; i < 3; i++)
        if (null != i && dup2(null, i) != i)
            return -1;
    if (null > 2)
        close(null);
    return 3;
}

/* A hostile process: never returns. */
static void hostile_main(enum hostile_role role, int report_fd, uint64_t t0)
{
    static struct hostile_report r;
    memset(&r, 0, sizeof r);
    if (sysns_become(HOSTILE_UID, HOSTILE_UID) != 0 || prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        _exit(20);
    report_fd = strip_descriptors(report_fd);
    if (report_fd < 0)
        _exit(21);
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &lim);
    }
    r.started = 1;
    switch (role) {
    case ROLE_WATCH: run_watcher(&r); break;
    case ROLE_SCAN: run_scanner(&r); break;
    case ROLE_SQUAT: run_squatter(&r, t0); break;
    default: run_sessions(&r); break;
    }
    tally_fds(&r);
    _exit(test_write_all(report_fd, &r, sizeof r) == 0 ? 0 : 22);
}

/* ---- the victim ---------------------------------------------------------------------------------- */

/* Check a successful attach's descriptor. */
static void check_victim_fd(struct victim_report *r, int fd, const struct orb_clock_domain *dom, ino_t *last)
{
    struct stat s;
    int fl = fcntl(fd, F_GETFL);
    if (fstat(fd, &s) != 0 || fl < 0) {
        r->bad_object++;
        note(r->note, "round %u: fstat/F_GETFL: %s", r->rounds, strerror(errno));
        return;
    }
    if (s.st_uid != 0) {
        r->foreign++;
        note(r->note, "round %u: status 0 with an object of uid %u (ino %llu mode %04o)", r->rounds,
             (unsigned)s.st_uid, (unsigned long long)s.st_ino, (unsigned)(s.st_mode & 07777));
        return;
    }
    if (!S_ISREG(s.st_mode) || (s.st_mode & 07777) != SLOT_MODE || s.st_size != (off_t)SLOT_SIZE ||
        (fl & O_ACCMODE) != O_RDONLY) {
        r->bad_object++;
        note(r->note, "round %u: object type/mode %06o size %lld flags %#x", r->rounds, (unsigned)s.st_mode,
             (long long)s.st_size, (unsigned)fl);
        return;
    }
    /* Two links: the name and the helper's private link. */
    if (s.st_nlink < 2) {
        r->unlinked_early++;
    } else if (s.st_nlink > 2) {
        if (hardlinks_protected) {
            r->bad_object++;
            note(r->note, "round %u: %lu links", r->rounds, (unsigned long)s.st_nlink);
            return;
        }
        r->linked_early++;
    }
    void *w = mmap(NULL, SLOT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w != MAP_FAILED) {
        r->writable_map++;
        note(r->note, "round %u: mapped writable", r->rounds);
        munmap(w, SLOT_SIZE);
        return;
    }
    void *map = mmap(NULL, SLOT_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    struct orb_slots_reader rd;
    int rc = map == MAP_FAILED ? -1 : orb_slots_reader_open(map, SLOT_SIZE, dom, ORB_SLOTS_DEFAULT_INTERVAL_NS, 0, &rd);
    if (map != MAP_FAILED)
        munmap(map, SLOT_SIZE);
    if (rc != 0) {
        r->bad_header++;
        note(r->note, "round %u: header check %d", r->rounds, rc);
        return;
    }
    r->attached++;
    if (s.st_ino != *last) {
        r->fresh++;
        atomic_fetch_add(&shared->fresh, 1);
    }
    *last = s.st_ino;
}

/* Helper sessions one after another until the attack is over (at least one). */
static void run_victim(struct victim_report *r, uint64_t t0)
{
    struct orb_clock_domain dom;
    if (orb_clock_domain_current(&dom) != 0) {
        note(r->note, "no clock domain");
        return;
    }
    r->started = 1;
    ino_t last = 0;
    uint64_t start;
    unsigned pause = 0;
    do {
        start = now_ns();
        r->rounds++;
        struct hp_proc p = {.pid = 0, .sock = -1, .seq = 1};
        const char *argv[] = {HELPER_PATH, NULL};
        struct hp_spawn_opts o = {.argv = argv, .keep_ids = true};
        if (hp_spawn(&p, &o) != 0) {
            r->spawn_fail++;
            note(r->note, "round %u: spawn: %s", r->rounds, strerror(errno));
            sleep_ns(10 * MS);
            continue;
        }
        int32_t status = 1;
        int fd = -1;
        bool hello = hp_hello(&p) == 0, idle = false;
        if (hello && phase_at(t0, start) == PHASE_HELPER_IDLE && (pause > 0 || machine_busy())) {
            r->idle_skipped++;
        } else if (hello && phase_at(t0, start) == PHASE_HELPER_IDLE) {
            r->idle_tries++;
            idle = slow_down_helper(p.pid, true);
            r->idle_rounds += idle;
        }
        pause -= pause > 0;
        uint64_t asked = now_ns();
        int exchange = hello ? slot_attach(&p, VICTIM_SLOT, &status, &fd) : -1;
        if (idle) {
            (void)slow_down_helper(p.pid, false);
            if (now_ns() - asked > SLOW_IDLE_NS)
                pause = IDLE_PAUSE;
        }
        if (!hello) {
            r->hello_fail++;
            note(r->note, "round %u: HELLO failed", r->rounds);
        } else if (exchange != 0) {
            r->call_fail++;
            note(r->note, "round %u: SLOT_ATTACH exchange failed", r->rounds);
        } else if (status == 0) {
            check_victim_fd(r, fd, &dom, &last);
            close(fd);
        } else if (status == ORB_EPERM) {
            r->refused++;
        } else {
            if (r->other_status++ == 0)
                r->first_other_status = status;
            note(r->note, "round %u: status %d", r->rounds, (int)status);
        }
        hp_close(&p);
        int ws = hp_wait(&p, SESSION_WAIT_MS);
        if (!exited_zero(ws)) {
            if (r->bad_exit++ == 0)
                r->first_bad_exit = ws;
            note(r->note, "round %u: wait status %#x", r->rounds, (unsigned)ws);
        }
        uint64_t took = now_ns() - start;
        r->total_round_ns += took;
        if (took > r->slowest_round_ns)
            r->slowest_round_ns = took;
    } while (!attack_over());
}

/* The victim process: never returns. */
static void victim_main(struct victim_report *r, int report_fd, uint64_t t0)
{
    if (sysns_become(VICTIM_UID, VICTIM_UID) != 0 || prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        _exit(20);
    run_victim(r, t0);
    _exit(test_write_all(report_fd, r, sizeof *r) == 0 ? 0 : 22);
}

/* ---- the administrator (the world: root in the private test system) ------------------------------- */

/* fork() with a report pipe: in the parent *end is the read end, in the child the write end. */
static pid_t fork_report(int *end)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        *end = p[1];
        return 0;
    }
    close(p[1]);
    *end = p[0];
    return pid;
}

/* Remove shm/name whatever it is. */
static void admin_remove(struct world_report *w, int shm, const char *name, uint32_t *root, uint32_t *other)
{
    struct stat s;
    if (fstatat(shm, name, &s, AT_SYMLINK_NOFOLLOW) != 0)
        return;
    if (unlinkat(shm, name, S_ISDIR(s.st_mode) ? AT_REMOVEDIR : 0) != 0) {
        if (errno != ENOENT)
            w->admin_errors++;
        return;
    }
    if (S_ISREG(s.st_mode) && s.st_uid == 0)
        (*root)++;
    else
        (*other)++;
}

static void admin_tick(struct world_report *w, int shm)
{
    w->ticks++;
    uint32_t ignored = 0;
    admin_remove(w, shm, VICTIM_SLOT, &w->removed_root, &w->removed_squat);
    if (w->ticks % 4 == 0)
        admin_remove(w, shm, HOSTILE_SLOT, &w->removed_hostile, &ignored);
    int walk = openat(shm, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = walk >= 0 ? fdopendir(walk) : NULL;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, LITTER_PREFIX, strlen(LITTER_PREFIX)) == 0)
            admin_remove(w, shm, e->d_name, &w->removed_litter, &w->removed_litter);
    if (d != NULL)
        closedir(d);
    else if (walk >= 0)
        close(walk);
}

static bool private_dir_sound(int shm)
{
    struct stat s;
    return fstatat(shm, PRIVATE_NAME, &s, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(s.st_mode) && s.st_uid == 0 &&
           (s.st_mode & 07777) == 0700;
}

static bool read_hardlink_protection(void)
{
    char c = '1';
    int fd = open("/proc/sys/fs/protected_hardlinks", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &c, 1) != 1)
            c = '1';
        close(fd);
    }
    return c != '0';
}

static int world_main(struct sysns *ns, struct world_report *w)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || sysns_enter(ns, NULL, false) != 0) {
        note(w->note, "cannot enter the private test system");
        return 1;
    }
    if (sysns_install_copy(ORB_HELPER_EXE, HELPER_PATH, HELPER_CAPS) != 0 ||
        sysns_write_policy(POLICY_FILE, policy_text) != 0) {
        note(w->note, "cannot install the helper or its policy");
        return 1;
    }
    struct stat s;
    int shm = open(SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (shm < 0 || fstat(shm, &s) != 0) {
        note(w->note, "cannot open " SHM_DIR);
        return 1;
    }
    shm_dev = s.st_dev;
    hardlinks_protected = read_hardlink_protection();
    w->hardlinks_protected = hardlinks_protected;
    void *page = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
        note(w->note, "mmap: %s", strerror(errno));
        return 1;
    }
    shared = page;
    atomic_store(&shared->deadline, 0); /* the first session: one round */
    atomic_store(&shared->fresh, 0);

    /* One session first: it makes the private directory and the victim's object. */
    int fd = -1;
    pid_t pid = fork_report(&fd);
    if (pid < 0) {
        note(w->note, "fork: %s", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        close(shm);
        victim_main(&w->warmup, fd, 0);
    }
    int rc = test_read_all(fd, &w->warmup, sizeof w->warmup, CHILD_GRACE_MS);
    int ws = wait_child(pid, now_ns() + (uint64_t)CHILD_GRACE_MS * MS);
    close(fd);
    if (rc != 0 || !exited_zero(ws) || w->warmup.attached != 1) {
        note(w->note, "the first victim session did not attach (wait status %#x)", (unsigned)ws);
        return 1;
    }
    w->setup_ok = 1;

    struct idler idlers[2]; /* for the victim, for the hostile sessions */
    if (idler_start(&idlers[0]) != 0 || idler_start(&idlers[1]) != 0) {
        note(w->note, "cannot start the idler: %s", strerror(errno));
        return 1;
    }
    uint64_t t0 = now_ns();
    atomic_store(&shared->fresh, 0);
    atomic_store(&shared->deadline, t0 + ATTACK_NS);
    pid_t pids[1 + ROLE_COUNT];
    int fds[1 + ROLE_COUNT];
    int started = 0;
    for (int i = 0; i < 1 + ROLE_COUNT; i++) {
        pids[i] = fork_report(&fds[i]);
        if (pids[i] < 0) {
            note(w->note, "fork: %s", strerror(errno));
            break;
        }
        if (pids[i] == 0) {
            close(shm);
            int mine = i == 0 ? 0 : i == 1 + ROLE_SESSION ? 1 : -1;
            for (int k = 0; k < 2; k++) {
                if (k == mine) {
                    idle_req_fd = idlers[k].req[1];
                    idle_ack_fd = idlers[k].ack[0];
                } else {
                    close(idlers[k].req[1]);
                    close(idlers[k].ack[0]);
                }
            }
            if (i == 0)
                victim_main(&w->victim, fds[i], t0);
            hostile_main((enum hostile_role)(i - 1), fds[i], t0);
        }
        started++;
    }
    for (int i = 0; i < 2; i++) {
        close(idlers[i].req[1]); /* the idlers end when their tenant process does */
        close(idlers[i].ack[0]);
    }

    /* The administrator at work; the hostile watchers slowed down in their phase; more time
     * while the victim has had too few fresh objects (a busy machine). */
    bool idle = false;
    while (!attack_over()) {
        sleep_ns((uint64_t)ADMIN_TICK_MS * MS);
        admin_tick(w, shm);
        uint64_t end = atomic_load(&shared->deadline), now = now_ns();
        if (end - t0 < MAX_ATTACK_NS && now + 5 * ADMIN_TICK_MS * MS >= end && atomic_load(&shared->fresh) < MIN_FRESH) {
            atomic_store(&shared->deadline, end + EXTEND_NS);
            w->extensions++;
        }
        bool want_idle = phase_at(t0, now_ns()) == PHASE_TENANT_IDLE;
        if (want_idle != idle && started == 1 + ROLE_COUNT) {
            set_policy(pids[1 + ROLE_WATCH], want_idle ? SCHED_IDLE : SCHED_OTHER);
            set_policy(pids[1 + ROLE_SCAN], want_idle ? SCHED_IDLE : SCHED_OTHER);
            idle = want_idle;
            w->idle_switches++;
        }
    }
    w->attack_ns = now_ns() - t0;

    bool all = started == 1 + ROLE_COUNT;
    uint64_t grace = now_ns() + (uint64_t)CHILD_GRACE_MS * MS;
    for (int i = 0; i < started; i++) {
        void *dst = i == 0 ? (void *)&w->victim : (void *)&w->hostile[i - 1];
        size_t len = i == 0 ? sizeof w->victim : sizeof w->hostile[0];
        uint64_t left = now_ns() < grace ? grace - now_ns() : 0;
        rc = test_read_all(fds[i], dst, len, (int)(left / MS) + 1);
        ws = wait_child(pids[i], grace);
        close(fds[i]);
        if (rc != 0 || !exited_zero(ws)) {
            all = false;
            w->children_failed++;
            note(w->note, "%s: report %s, wait status %#x", i == 0 ? "victim" : role_names[i - 1],
                 rc == 0 ? "read" : "missing", (unsigned)ws);
        }
    }
    for (int i = 0; i < 2; i++) {
        ws = wait_child(idlers[i].pid, grace);
        if (!exited_zero(ws)) {
            all = false;
            w->children_failed++;
            note(w->note, "idler %d: wait status %#x", i, (unsigned)ws);
        }
    }
    w->reports_ok = all;
    w->privdir_ok = private_dir_sound(shm);
    close(shm);
    return 0;
}

/* ---- the test ------------------------------------------------------------------------------------- */

static void print_hostile(enum hostile_role role, const struct hostile_report *h)
{
    print_message("hostile %s: started %u, inotify events %llu (overflows %llu), write opens %llu: denied %llu, "
                  "other errors %llu, succeeded %llu (its own objects), writable root-owned at open %u\n",
                  role_names[role], h->started, (unsigned long long)h->events, (unsigned long long)h->overflows,
                  (unsigned long long)h->open_tries, (unsigned long long)h->open_denied,
                  (unsigned long long)h->open_other, (unsigned long long)h->opened, h->root_writable_at_open);
    if (role == ROLE_SCAN || role == ROLE_WATCH)
        print_message("hostile %s: private directory denied %llu, opened %u, watched %u; lock guesses %llu, "
                      "opened %u; mkdir %u of %llu; /proc fd dirs listed %llu, denied %llu\n",
                      role_names[role], (unsigned long long)h->privdir_denied, h->privdir_opened, h->privdir_watch,
                      (unsigned long long)h->lock_tries, h->lock_opened, h->privdir_mkdir,
                      (unsigned long long)h->privdir_mkdir_tries, (unsigned long long)h->proc_dirs,
                      (unsigned long long)h->proc_denied);
    if (role == ROLE_SQUAT)
        print_message("hostile %s: %llu tries; squats: created %u, renamed %u, symlink %u, own link %u, "
                      "/etc link %u, fifo %u, dir %u; links to root's object %u of %llu\n",
                      role_names[role], (unsigned long long)h->squat_tries, h->squat_created, h->squat_renamed,
                      h->squat_symlink, h->squat_link_own, h->squat_link_etc, h->squat_fifo, h->squat_dir,
                      h->link_stolen, (unsigned long long)h->link_tries);
    if (role == ROLE_SESSION)
        print_message("hostile %s: %u sessions (%u at SCHED_IDLE, %u not for load, %u failed, %u bad exits); "
                      HOSTILE_SLOT " attached %u, EPERM %u, other %u, bad fd %u; " VICTIM_SLOT " EPERM %u, other %u\n",
                      role_names[role], h->sessions, h->idle_sessions, h->idle_skipped, h->session_fail, h->bad_exit, h->hostile_attached,
                      h->hostile_eperm, h->hostile_other, h->hostile_bad_fd, h->victim_eperm, h->victim_other);
    print_message("hostile %s: holds %u fds: %u on /dev/shm (%u root-owned), %u writable, %u writable root-owned%s%s\n",
                  role_names[role], h->held, h->held_shm, h->held_shm_root, h->held_writable, h->held_root_writable,
                  h->note[0] ? "; notes: " : "", h->note);
}

static void test_hostile_tenant_never_wins_the_slot_race(void **state)
{
    (void)state;
    struct sysns ns;
    assert_int_equal(sysns_prepare(&ns), 0);
    struct world_report *w = calloc(1, sizeof *w);
    assert_non_null(w);
    int fd = -1;
    uint64_t start = now_ns();
    pid_t pid = fork_report(&fd);
    assert_true(pid >= 0);
    if (pid == 0) {
        int rc = world_main(&ns, w);
        _exit(test_write_all(fd, w, sizeof *w) == 0 ? rc : 30);
    }
    int rc = test_read_all(fd, w, sizeof *w, WORLD_WAIT_MS);
    int ws = wait_child(pid, now_ns() + 5000 * MS);
    close(fd);
    sysns_cleanup_host(&ns);
    uint64_t took = now_ns() - start;

    print_message("world: report %s, wait status %#x, %.1f s in all, %.1f s of attack (%u extensions)%s%s\n",
                  rc == 0 ? "read" : "missing", (unsigned)ws, (double)took / 1e9, (double)w->attack_ns / 1e9,
                  w->extensions,
                  w->note[0] ? "; notes: " : "", w->note);
    assert_int_equal(rc, 0);
    assert_true(exited_zero(ws));
    assert_true(w->setup_ok);

    const struct victim_report *v = &w->victim;
    print_message("administrator: %u ticks; removed " VICTIM_SLOT " %u times as root's object, %u times a squat; "
                  HOSTILE_SLOT " %u; litter %u; errors %u; private directory %s; hard links %sprotected; "
                  "hostile watchers switched to or from SCHED_IDLE %u times\n",
                  w->ticks, w->removed_root, w->removed_squat, w->removed_hostile, w->removed_litter, w->admin_errors,
                  w->privdir_ok ? "sound" : "NOT SOUND", w->hardlinks_protected ? "" : "un", w->idle_switches);
    print_message("victim: %u rounds (%u of %u tried with the helper at SCHED_IDLE, %u not for load), mean %.1f ms, slowest %.1f ms; attached %u "
                  "(%u fresh objects), refused %u; foreign %u, bad object %u, bad header %u, writable map %u, "
                  "removed before check %u, linked before check %u; other status %u (first %d); spawn %u, hello %u, "
                  "exchange %u failures; bad exits %u (first %#x)%s%s\n",
                  v->rounds, v->idle_rounds, v->idle_tries, v->idle_skipped, v->rounds ? (double)v->total_round_ns / v->rounds / 1e6 : 0.0,
                  (double)v->slowest_round_ns / 1e6, v->attached, v->fresh, v->refused, v->foreign, v->bad_object,
                  v->bad_header, v->writable_map, v->unlinked_early, v->linked_early, v->other_status,
                  (int)v->first_other_status, v->spawn_fail, v->hello_fail, v->call_fail, v->bad_exit,
                  (unsigned)v->first_bad_exit, v->note[0] ? "; notes: " : "", v->note);
    for (int i = 0; i < ROLE_COUNT; i++)
        print_hostile((enum hostile_role)i, &w->hostile[i]);

    /* Every process ran to the end and reported. */
    assert_true(w->reports_ok);
    assert_true(v->started);
    for (int i = 0; i < ROLE_COUNT; i++)
        assert_int_equal(w->hostile[i].started, 1);

    /* The hostile tenant never held a writable descriptor of a root-owned object. */
    for (int i = 0; i < ROLE_COUNT; i++) {
        assert_int_equal(w->hostile[i].root_writable_at_open, 0);
        assert_int_equal(w->hostile[i].held_root_writable, 0);
        assert_int_equal(w->hostile[i].lock_opened, 0);
        assert_int_equal(w->hostile[i].privdir_opened, 0);
        assert_int_equal(w->hostile[i].privdir_watch, 0);
        assert_int_equal(w->hostile[i].privdir_mkdir, 0);
    }
    assert_true(w->privdir_ok);

    /* The victim never accepted anything but a sound administrator's object, or a refusal. */
    assert_int_equal(v->foreign, 0);
    assert_int_equal(v->bad_object, 0);
    assert_int_equal(v->bad_header, 0);
    assert_int_equal(v->writable_map, 0);
    assert_int_equal(v->other_status, 0);
    assert_int_equal(v->spawn_fail + v->hello_fail + v->call_fail, 0);
    assert_true(v->fresh >= MIN_FRESH);

    /* Nothing crashed: every helper session ended with exit 0 on EOF. */
    assert_int_equal(v->bad_exit, 0);
    const struct hostile_report *hs = &w->hostile[ROLE_SESSION];
    assert_int_equal(hs->bad_exit, 0);
    assert_int_equal(hs->session_fail, 0);
    assert_int_equal(hs->hostile_other + hs->hostile_bad_fd + hs->victim_other, 0);
    assert_true(hs->sessions > 0);
    assert_true(hs->hostile_attached > 0);

    /* The attack took place: squats were made and refused, the watcher saw the objects appear. */
    const struct hostile_report *sq = &w->hostile[ROLE_SQUAT];
    assert_true(sq->squat_created + sq->squat_renamed + sq->squat_symlink + sq->squat_link_own + sq->squat_fifo +
                    sq->squat_dir > 0);
    assert_true(v->refused > 0);
    assert_true(w->hostile[ROLE_WATCH].events > 0);
    assert_true(w->hostile[ROLE_SCAN].open_tries > 0);
    free(w);
}

int main(void)
{
    if (!sysns_available()) {
        fprintf(stderr, "test_helper_race: skipped: needs root and a private mount namespace "
                        "(installs a copy of orbite-helper with file capabilities as /etc/orbite/orbite-helper)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_tenant_never_wins_the_slot_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
