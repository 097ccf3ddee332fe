/* orbite-helper: start-up in a fixed order, then one serve loop for one library instance.
 *
 *   1. close every fd but 0-3          6. read the policy, open /sys, /dev/infiniband, /dev/shm,
 *   2. check the descriptor limit,        resolve the tenant's names, discover, decide
 *      clear the environment, fds 0-2  7. keep only the expected capabilities, permitted
 *      to /dev/null, connect the log   8. fork the monitor (monitor.c), which keeps them; the
 *   3. PR_SET_DUMPABLE 0                  worker drops every capability and the monitor's fds
 *   4. PR_SET_PDEATHSIG, parent and    9. Landlock (no file at all), then the worker's seccomp
 *      socket checks                      filter
 *   5. PR_SET_NO_NEW_PRIVS; refuse    10. serve until EOF (exit 0) or a violation (exit 2..6)
 *      unexpected capabilities (the test build: any)
 *
 * Nothing the library sends is read before step 10: by then the process that reads it holds no
 * capability and no descriptor beyond what the policy grants (sandbox.h).
 *
 * The installed helper takes no arguments. The test build (ORB_HELPER_TESTING, installed
 * nowhere) also accepts directory overrides for fixture trees, the policy owner, and a fake
 * device context creation (parse_options), and answers test-only requests (testing.c). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/resource.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include "common/policy.h"
#include "core/error.h"
#include "helper/helper.h"
#include "helper/monitor.h"
#include "helper/sandbox.h"
#include "topo/sysfs.h"

#ifdef ORB_HELPER_TESTING
#include "helper/testing.h"
#endif

#define NAME_BUF_MAX (1u << 20) /* getpwuid_r/getgrgid_r buffer ceiling */
/* Descriptors the helper may need at once: stdio, the socket, the log, the held directories,
 * the monitor's socket pair, and per slot the object, its lock and the library's copy, per NIC
 * a device duplicate, with room for a reply in flight. */
#define FDS_NEEDED (16u + 3u * ORB_HP_MAX_SLOTS + ORB_TOPO_MAX_NICS)
#define GROUPS_MAX 65536u       /* NGROUPS_MAX on Linux */

struct helper_paths {
    const char *sysfs;
    const char *policy_dir;
    const char *dev_ib;
    const char *shm;
    uid_t admin_uid;
    bool admin_uid_given;
    bool fake_device_context; /* test build only: OPEN_DEVICE creates no kernel context */
};

/* ---- start-up log (syslog, only before the filter: its reconnects would need socket()) -------- */

static void startup_log(int priority, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void startup_log(int priority, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsyslog(priority, fmt, ap);
    va_end(ap);
}

/* ---- options ---------------------------------------------------------------------------------- */

/* The test build's options: --sysfs-root, --policy-dir, --dev-dir (for /dev/infiniband),
 * --shm-dir DIR, --policy-owner UID, the administrator the policy files and slot objects
 * must belong to (new slot objects then keep their group), and --device-context kernel|fake
 * (fake: OPEN_DEVICE hands over the verified node without creating a device context, so that
 * fixture nodes that are no uverbs files can stand in for one). */
static int parse_options(int argc, char **argv, struct helper_paths *p)
{
    p->sysfs = "/sys";
    p->policy_dir = "/etc/orbite/policy.d";
    p->dev_ib = "/dev/infiniband";
    p->shm = "/dev/shm";
    p->admin_uid = 0;
    p->admin_uid_given = false;
    p->fake_device_context = false;
#ifdef ORB_HELPER_TESTING
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc)
            return -1;
        const char *opt = argv[i], *val = argv[i + 1];
        if (strcmp(opt, "--sysfs-root") == 0) {
            p->sysfs = val;
        } else if (strcmp(opt, "--policy-dir") == 0) {
            p->policy_dir = val;
        } else if (strcmp(opt, "--dev-dir") == 0) {
            p->dev_ib = val;
        } else if (strcmp(opt, "--shm-dir") == 0) {
            p->shm = val;
        } else if (strcmp(opt, "--device-context") == 0) {
            if (strcmp(val, "fake") != 0 && strcmp(val, "kernel") != 0)
                return -1;
            p->fake_device_context = strcmp(val, "fake") == 0;
        } else if (strcmp(opt, "--policy-owner") == 0) {
            char *end = NULL;
            errno = 0;
            unsigned long v = strtoul(val, &end, 10);
            if (errno != 0 || end == val || *end != '\0' || v > UINT32_MAX - 1)
                return -1;
            p->admin_uid = (uid_t)v;
            p->admin_uid_given = true;
        } else {
            return -1;
        }
    }
    return 0;
#else
    (void)argv;
    return argc <= 1 ? 0 : -1; /* no options: every path is fixed */
#endif
}

/* ---- identity ---------------------------------------------------------------------------------- */

/* The tenant's names, resolved before the filter (NSS may read files or talk to a daemon). */
struct identity {
    char *user;
    uint32_t ngroups;
    uint32_t *gids;
    char **group_names;
};

static void identity_free(struct identity *id)
{
    free(id->user);
    for (uint32_t i = 0; id->group_names && i < id->ngroups; i++)
        free(id->group_names[i]);
    free(id->group_names);
    free(id->gids);
    memset(id, 0, sizeof *id);
}

/* The account's name in *out (NULL: no such account, which is not an error: `[user:NAME]` and
 * `[group:NAME]` sections then simply do not match). A lookup that fails (an NSS source that is
 * down, unreadable or broken) is an error, so that a section which might restrict the tenant is
 * never skipped for it: ORB_EUNAVAILABLE naming the cause. */
static int user_name(uid_t uid, char **out)
{
    size_t cap = 1024;
    for (;;) {
        char *buf = malloc(cap);
        if (buf == NULL)
            return orb_fail(ORB_ENOMEM, "identity: out of memory");
        struct passwd pw, *res = NULL;
        errno = 0;
        int rc = getpwuid_r(uid, &pw, buf, cap, &res);
        if (rc == 0) {
            char *name = res ? strdup(res->pw_name) : NULL;
            free(buf);
            if (res != NULL && name == NULL)
                return orb_fail(ORB_ENOMEM, "identity: out of memory");
            *out = name;
            return 0;
        }
        free(buf);
        if (rc != ERANGE || cap >= NAME_BUF_MAX)
            return orb_fail(ORB_EUNAVAILABLE, "identity: looking up uid %u failed: %s", (unsigned)uid, strerror(rc));
        cap *= 2;
    }
}

static int group_name(gid_t gid, char **out)
{
    size_t cap = 1024;
    for (;;) {
        char *buf = malloc(cap);
        if (buf == NULL)
            return orb_fail(ORB_ENOMEM, "identity: out of memory");
        struct group gr, *res = NULL;
        errno = 0;
        int rc = getgrgid_r(gid, &gr, buf, cap, &res);
        if (rc == 0) {
            char *name = res ? strdup(res->gr_name) : NULL;
            free(buf);
            if (res != NULL && name == NULL)
                return orb_fail(ORB_ENOMEM, "identity: out of memory");
            *out = name;
            return 0;
        }
        free(buf);
        if (rc != ERANGE || cap >= NAME_BUF_MAX)
            return orb_fail(ORB_EUNAVAILABLE, "identity: looking up gid %u failed: %s", (unsigned)gid, strerror(rc));
        cap *= 2;
    }
}

static int identity_load(uid_t uid, gid_t gid, struct identity *out)
{
    memset(out, 0, sizeof *out);
    int n = getgroups(0, NULL);
    if (n < 0 || (unsigned)n > GROUPS_MAX)
        return orb_fail(ORB_EUNAVAILABLE, "identity: getgroups: %s", strerror(errno));
    gid_t *list = calloc((size_t)n + 1, sizeof *list);
    out->gids = calloc((size_t)n + 1, sizeof *out->gids);
    out->group_names = calloc((size_t)n + 1, sizeof *out->group_names);
    if (list == NULL || out->gids == NULL || out->group_names == NULL) {
        free(list);
        identity_free(out);
        return orb_fail(ORB_ENOMEM, "identity: out of memory");
    }
    int got = n > 0 ? getgroups(n, list) : 0;
    if (got < 0) {
        free(list);
        identity_free(out);
        return orb_fail(ORB_EUNAVAILABLE, "identity: getgroups: %s", strerror(errno));
    }
    list[got++] = gid; /* the primary group counts even when not in the supplementary list */
    int rc = 0;
    for (int i = 0; i < got && rc == 0; i++) {
        bool dup = false;
        for (uint32_t j = 0; j < out->ngroups; j++)
            dup = dup || out->gids[j] == (uint32_t)list[i];
        if (dup)
            continue;
        out->gids[out->ngroups] = (uint32_t)list[i];
        rc = group_name(list[i], &out->group_names[out->ngroups]);
        out->ngroups++;
    }
    free(list);
    if (rc == 0)
        rc = user_name(uid, &out->user);
    if (rc != 0)
        identity_free(out);
    return rc;
}

/* ---- step 6: policy, directories, discovery, decision ------------------------------------------ */

static int open_dir(const char *path)
{
    return open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static int load_policy(const struct helper_paths *paths, struct orb_policy **out)
{
    int dfd = open_dir(paths->policy_dir);
    if (dfd < 0) {
        /* No policy directory is no policy file: the documented defaults (RDMA denied). */
        if (errno == ENOENT)
            return orb_policy_load_string("", paths->policy_dir, out);
        const char *why = errno == ELOOP || errno == ENOTDIR ? "is not a directory (a symbolic link?)" : strerror(errno);
        return orb_policy_deny_all(paths->policy_dir, why, out);
    }
    int rc = orb_policy_load_dir(dfd, paths->policy_dir, (uint32_t)paths->admin_uid, out);
    close(dfd);
    return rc;
}

static int prepare(struct orb_helper_state *st, const struct helper_paths *paths)
{
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    if (inv == NULL)
        return orb_fail(ORB_ENOMEM, "start-up: out of memory");
    st->inv = inv;
    st->uid = getuid();
    st->gid = getgid();
    st->admin_uid = paths->admin_uid;
    st->admin_gid = paths->admin_uid_given ? (gid_t)-1 : 0;

    st->sysfs_fd = open_dir(paths->sysfs);
    st->devib_fd = open_dir(paths->dev_ib);
    st->shm_fd = open_dir(paths->shm);

    struct orb_policy *policy = NULL;
    int rc = load_policy(paths, &policy);
    if (policy == NULL)
        return rc != 0 ? rc : orb_fail(ORB_ENOMEM, "start-up: no policy");
    if (orb_policy_error(policy) != NULL)
        startup_log(LOG_WARNING, "policy denies everything: %s", orb_policy_error(policy));

    if (st->sysfs_fd >= 0 && orb_topo_load_sysfs(st->sysfs_fd, inv) != 0) {
        startup_log(LOG_WARNING, "discovery failed, no devices offered: %s", orb_last_error());
        memset(inv, 0, sizeof *inv);
    }
    orb_helper_map_devices(st);
    st->domain_ok = orb_clock_domain_current(&st->domain) == 0;
    st->uctx_ops = &orb_uctx_kernel_ops;
#ifdef ORB_HELPER_TESTING
    if (paths->fake_device_context)
        st->uctx_ops = &orb_helper_testing_uctx_ops;
#endif
    st->devx_ops = &orb_devx_kernel_ops;

    struct identity id;
    rc = identity_load(st->uid, st->gid, &id);
    if (rc == ORB_EUNAVAILABLE) {
        /* The accounts cannot be read: decide nothing for this tenant. */
        startup_log(LOG_WARNING, "denying everything to uid %u: %s", (unsigned)st->uid, orb_last_error());
        memset(&st->allowed, 0, sizeof st->allowed);
        orb_policy_free(policy);
        return 0;
    }
    if (rc == 0) {
        struct orb_policy_subject who = {
            .uid = (uint32_t)st->uid,
            .user = id.user,
            .ngroups = id.ngroups,
            .gids = id.gids,
            .group_names = (const char *const *)id.group_names,
        };
        rc = orb_policy_decide(policy, &who, inv, &st->allowed, NULL, 0, NULL);
        identity_free(&id);
    }
    orb_policy_free(policy);
    return rc;
}

/* ---- dispatch ---------------------------------------------------------------------------------- */

enum dispatch_flags {
    DISPATCH_ONCE = 1u << 0,   /* a second request of this type ends the session */
    DISPATCH_PERMIT = 1u << 1, /* permitted before HELLO (only HELLO itself) */
};

struct dispatch_entry {
    uint16_t type;
    uint16_t flags;
    uint32_t min_body, max_body; /* body bytes, as helper_proto.h lays them out */
    int (*handler)(struct orb_helper_state *st, const struct orb_hp_msg *m);
};

/* str = u16 length + 1..64 bytes */
#define STR_MIN 3u
#define STR_MAX (2u + ORB_HP_NAME_MAX)

static const struct dispatch_entry dispatch_table[] = {
    {ORB_HP_HELLO, DISPATCH_ONCE | DISPATCH_PERMIT, 4, 4, orb_helper_on_hello},
    {ORB_HP_INVENTORY, 0, 8, 8, orb_helper_on_inventory},
    {ORB_HP_POLICY, 0, 0, 0, orb_helper_on_policy},
    {ORB_HP_OPEN_DEVICE, 0, STR_MIN, STR_MAX, orb_helper_on_open_device},
    {ORB_HP_PEERMEM_PROBE, 0, 0, 0, orb_helper_on_peermem},
    {ORB_HP_SLOT_ATTACH, 0, STR_MIN + 8, STR_MAX + 8, orb_helper_on_slot_attach},
    {ORB_HP_DEVX_VERIFY, 0, STR_MIN + 32, STR_MAX + 32, orb_helper_on_devx_verify},
};

/* Handle one datagram. Negative: the session ends (the reason is the detail message). */
static int dispatch(struct orb_helper_state *st, const uint8_t *buf, size_t len, uint32_t *seen)
{
#ifdef ORB_HELPER_TESTING
    int handled = orb_helper_testing_request(st, buf, len);
    if (handled != 0)
        return handled < 0 ? handled : 0;
#endif
    struct orb_hp_msg m;
    int rc = orb_hp_parse(buf, len, &m);
    if (rc != 0)
        return rc;
    const struct dispatch_entry *e = NULL;
    for (size_t i = 0; i < sizeof dispatch_table / sizeof dispatch_table[0]; i++)
        if (dispatch_table[i].type == m.hdr.type)
            e = &dispatch_table[i];
    if (e == NULL)
        return orb_fail(ORB_EPROTO, "helper: %s is not a request", orb_hp_type_name(m.hdr.type));
    if (!st->hello_done && !(e->flags & DISPATCH_PERMIT))
        return orb_fail(ORB_EPROTO, "helper: %s before HELLO", orb_hp_type_name(m.hdr.type));
    uint32_t bit = 1u << (e - dispatch_table);
    if ((e->flags & DISPATCH_ONCE) && (*seen & bit))
        return orb_fail(ORB_EPROTO, "helper: repeated %s", orb_hp_type_name(m.hdr.type));
    *seen |= bit;
    if (m.body_len < e->min_body || m.body_len > e->max_body)
        return orb_fail(ORB_EPROTO, "helper: %s body of %zu bytes", orb_hp_type_name(m.hdr.type), m.body_len);
    return e->handler(st, &m);
}

/* ---- step 10: serve ---------------------------------------------------------------------------- */

static int serve(struct orb_helper_state *st)
{
    uint8_t buf[ORB_HP_MAX_MSG];
    uint32_t seen = 0;
    for (;;) {
        /* Slots are published by the monitor: this loop waits on the library alone. */
        struct pollfd p = {.fd = st->sock, .events = POLLIN, .revents = 0};
        int ready = poll(&p, 1, -1);
        if (ready < 0 && errno != EINTR)
            return ORB_HELPER_EXIT_PROTOCOL;
        if (ready <= 0)
            continue;
        size_t len = 0, nfds = 0;
        int rc = orb_hp_recv(st->sock, buf, &len, NULL, 0, &nfds, 0);
        if (rc == ORB_EPEER)
            return ORB_HELPER_EXIT_EOF;
        if (rc == ORB_ETIMEDOUT)
            continue;
        if (rc != 0) /* fds from the library, truncation, control messages */
            return ORB_HELPER_EXIT_PROTOCOL;
        if (dispatch(st, buf, len, &seen) != 0)
            return st->exit_code != 0 ? st->exit_code : ORB_HELPER_EXIT_PROTOCOL;
    }
}

/* ---- step 2: the descriptor limit and the log --------------------------------------------- */

/* Raise the soft RLIMIT_NOFILE (up to the hard limit, which needs no privilege) so that the
 * helper never runs short mid-session. Errors: ORB_ERESOURCE naming both figures. */
static int ensure_descriptors(void)
{
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "start-up: getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < FDS_NEEDED && lim.rlim_max > lim.rlim_cur) {
        lim.rlim_cur = lim.rlim_max == RLIM_INFINITY || lim.rlim_max > FDS_NEEDED ? FDS_NEEDED : lim.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &lim);
        (void)getrlimit(RLIMIT_NOFILE, &lim);
    }
    if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < FDS_NEEDED)
        return orb_fail(ORB_ERESOURCE, "start-up: RLIMIT_NOFILE allows %llu descriptors (hard limit %llu), the helper needs %u",
                        (unsigned long long)lim.rlim_cur, (unsigned long long)lim.rlim_max, FDS_NEEDED);
    return 0;
}

/* Connect to the log now (LOG_NDELAY), while a descriptor is surely free, so that a refusal
 * later in start-up is never lost to a lazy connect that finds none. When even that one is
 * missing, stdin (nothing reads it) makes room. */
static void open_log(bool make_room)
{
    if (make_room)
        (void)close(STDIN_FILENO);
    openlog("orbite-helper", LOG_PID | LOG_NDELAY, LOG_AUTHPRIV);
}

int main(int argc, char **argv)
{
    struct helper_paths paths;
    if (parse_options(argc, argv, &paths) != 0)
        return ORB_HELPER_EXIT_USAGE;
    /* 1-2: nothing from the spawner's environment or descriptors reaches what follows. Closing
     * comes first so that the wipe, which reads /proc, has descriptors to use. */
    if (orb_sandbox_close_fds_from(ORB_HELPER_SOCK + 1) != 0)
        return ORB_HELPER_EXIT_STARTUP;
    int fds_rc = ensure_descriptors();
    if (fds_rc != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", orb_last_error());
        (void)orb_sandbox_clear_environment();
        open_log(true);
        startup_log(LOG_ERR, "refusing to run: %s", why);
        return ORB_HELPER_EXIT_STARTUP;
    }
    if (orb_sandbox_clear_environment() != 0 || orb_sandbox_null_stdio() != 0) {
        open_log(false);
        startup_log(LOG_ERR, "refusing to run: %s", orb_last_error());
        return ORB_HELPER_EXIT_STARTUP;
    }
    open_log(false);
    /* 3-5 */
    if (orb_sandbox_set_undumpable() != 0)
        return ORB_HELPER_EXIT_STARTUP;
    if (orb_sandbox_bind_to_parent(ORB_HELPER_SOCK) != 0) {
        startup_log(LOG_ERR, "refusing to run: %s", orb_last_error());
        return ORB_HELPER_EXIT_ORPHAN;
    }
    if (orb_sandbox_no_new_privs() != 0)
        return ORB_HELPER_EXIT_STARTUP;
    if (orb_sandbox_check_caps() != 0) {
        startup_log(LOG_ERR, "refusing to run: %s", orb_last_error());
        return ORB_HELPER_EXIT_CAPS;
    }
#ifdef ORB_HELPER_TESTING
    /* The test build takes fixture paths from its caller: with any capability, those options
     * would be a way to privilege. It runs only as an ordinary process. */
    struct orb_sandbox_caps now;
    if (orb_sandbox_read_caps(&now) != 0 || (now.permitted | now.effective | now.inheritable | now.ambient) != 0) {
        startup_log(LOG_ERR, "refusing to run: the test build runs without capabilities");
        return ORB_HELPER_EXIT_CAPS;
    }
#endif
    /* 6 */
    struct orb_helper_state st;
    orb_helper_state_init(&st, ORB_HELPER_SOCK, NULL);
    if (prepare(&st, &paths) != 0) {
        startup_log(LOG_ERR, "start-up failed: %s", orb_last_error());
        orb_helper_state_release(&st);
        return ORB_HELPER_EXIT_STARTUP;
    }
    /* 7 */
    if (orb_sandbox_drop_caps(&st.caps_kept) != 0) {
        startup_log(LOG_ERR, "refusing to run: %s", orb_last_error());
        orb_helper_state_release(&st);
        return ORB_HELPER_EXIT_CAPS;
    }
    /* 8: the monitor takes the capabilities and the directories only it uses. */
    if (orb_helper_monitor_start(&st) != 0) {
        startup_log(LOG_ERR, "start-up failed: %s", orb_last_error());
        orb_helper_state_release(&st);
        return ORB_HELPER_EXIT_STARTUP;
    }
    if (st.devib_fd >= 0)
        (void)close(st.devib_fd);
    if (st.shm_fd >= 0)
        (void)close(st.shm_fd);
    st.devib_fd = st.shm_fd = -1;
    if (orb_sandbox_drop_all_caps() != 0) {
        startup_log(LOG_ERR, "refusing to run: %s", orb_last_error());
        orb_helper_state_release(&st);
        return ORB_HELPER_EXIT_CAPS;
    }
    int test_proc_fd = -1;
#ifdef ORB_HELPER_TESTING
    test_proc_fd = orb_helper_testing_open_proc();
#endif
    /* 9: no file beyond what it holds (Landlock, where the kernel has it), then the filter. */
    struct orb_sandbox_paths reach = {.sysfs_fd = -1, .shm_fd = -1, .proc_fd = test_proc_fd};
    if (orb_sandbox_restrict_paths(&reach) < 0) {
        startup_log(LOG_ERR, "refusing to run: %s", orb_last_error());
        orb_helper_state_release(&st);
        return ORB_HELPER_EXIT_STARTUP;
    }
    closelog(); /* its reconnects would need socket(), which the filter forbids */
    if (orb_sandbox_load_worker_filter(st.sysfs_fd, test_proc_fd) != 0) {
        orb_helper_state_release(&st);
        return ORB_HELPER_EXIT_STARTUP;
    }
    /* 10 */
    int code = serve(&st);
    orb_helper_state_release(&st);
    return code;
}
