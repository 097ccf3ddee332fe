/* orbite-policy: the administrator's view of /etc/orbite/policy.d.
 *
 *   orbite-policy check   [--dir DIR] [--owner UID]
 *   orbite-policy explain --user USER [--dir DIR] [--sysfs DIR] [--owner UID]
 *
 * `check` validates every policy file the way orbite-helper reads them and prints each file
 * with "OK" or its first problem. `explain` shows what USER would get on this host (or on the
 * sysfs tree given): every transport, GPUDirect route, NIC, GPU, slot and budget, with the
 * file, line and section that decided it. Exit status: 0 clean, 1 a problem in the policy (the
 * helper would deny everything), 2 a usage or system error. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/policy.h"
#include "core/error.h"
#include "topo/sysfs.h"

#define DEFAULT_DIR "/etc/orbite/policy.d"
#define DEFAULT_SYSFS "/sys"
#define EXIT_PROBLEM 1
#define EXIT_USAGE 2

static const char usage_text[] =
    "usage: orbite-policy check [--dir DIR] [--owner UID]\n"
    "       orbite-policy explain --user USER [--dir DIR] [--sysfs DIR] [--owner UID]\n"
    "\n"
    "check    validate every *.ini file of DIR as orbite-helper reads them: each file is\n"
    "         printed with OK or its first problem\n"
    "explain  what USER (name or uid) may use on this host, with the line that decided each item\n"
    "\n"
    "  --dir DIR     policy directory (default " DEFAULT_DIR ")\n"
    "  --owner UID   owner the directory and files must have (default 0, root)\n"
    "  --user USER   the tenant to explain\n"
    "  --sysfs DIR   sysfs tree to discover NICs and GPUs from (default " DEFAULT_SYSFS ")\n"
    "\n"
    "Exit status: 0 clean, 1 the policy has a problem (every tenant is denied everything),\n"
    "2 a usage or system error.\n";

struct options {
    const char *command;
    const char *dir;
    const char *sysfs;
    const char *user;
    uint32_t owner;
};

static int usage_error(const char *what)
{
    fprintf(stderr, "orbite-policy: %s\n%s", what, usage_text);
    return EXIT_USAGE;
}

/* `arg` (as given) and what is wrong with it. */
static int usage_error_about(const char *what, const char *arg)
{
    fprintf(stderr, "orbite-policy: '%s' %s\n%s", arg, what, usage_text);
    return EXIT_USAGE;
}

/* Strict decimal id below UINT32_MAX (which is "no id" to the kernel). */
static int parse_id(const char *s, uint32_t *out)
{
    if (*s == '\0' || strlen(s) > 10)
        return -1;
    unsigned long long v = 0;
    for (const char *c = s; *c; c++) {
        if (*c < '0' || *c > '9')
            return -1;
        v = v * 10 + (unsigned)(*c - '0');
    }
    if (v >= UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int parse_options(int argc, char **argv, struct options *o)
{
    static const struct option long_options[] = {
        {"dir", required_argument, NULL, 'd'},   {"owner", required_argument, NULL, 'o'},
        {"user", required_argument, NULL, 'u'},  {"sysfs", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0},
    };
    *o = (struct options){.dir = DEFAULT_DIR, .sysfs = DEFAULT_SYSFS};
    if (argc < 2)
        return usage_error("missing command");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage_text, stdout);
        exit(0);
    }
    o->command = argv[1];
    if (strcmp(o->command, "check") != 0 && strcmp(o->command, "explain") != 0)
        return usage_error("unknown command (check or explain)");
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, ":h", long_options, NULL)) != -1) {
        switch (c) {
        case 'd': o->dir = optarg; break;
        case 's': o->sysfs = optarg; break;
        case 'u': o->user = optarg; break;
        case 'o':
            if (parse_id(optarg, &o->owner) != 0)
                return usage_error("--owner takes a numeric uid");
            break;
        case 'h': fputs(usage_text, stdout); exit(0);
        case ':': return usage_error_about("is missing its value", argv[optind - 1]);
        default: return usage_error_about("is not an option", argv[optind - 1]);
        }
    }
    if (optind != argc)
        return usage_error_about("is an unexpected argument", argv[optind]);
    bool explain = strcmp(o->command, "explain") == 0;
    if (explain && !o->user)
        return usage_error("explain needs --user");
    if (!explain && o->user)
        return usage_error("--user is for explain");
    return 0;
}

/* ---- check ------------------------------------------------------------------------------ */

struct check_tally {
    unsigned files;
    unsigned bad;
};

static void print_check(void *ctx, const char *file, const char *error)
{
    struct check_tally *t = ctx;
    t->files++;
    if (error) {
        t->bad++;
        printf("%s\n", error);
    } else {
        printf("%s: OK\n", file);
    }
}

static int run_check(const struct options *o)
{
    int dirfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW); /* as the helper */
    if (dirfd < 0) {
        /* As the helper: no folder is no policy file; any other failure denies everything. */
        if (errno == ENOENT) {
            printf("%s does not exist: no policy files: the built-in defaults apply\n", o->dir);
            return 0;
        }
        printf("%s: cannot open: %s: orbite-helper would deny everything to every tenant\n", o->dir,
               errno == ELOOP || errno == ENOTDIR ? "not a directory (a symbolic link?)" : strerror(errno));
        return EXIT_PROBLEM;
    }
    struct check_tally tally = {0};
    int rc = orb_policy_check_dir(dirfd, o->dir, o->owner, print_check, &tally);
    close(dirfd);
    if (rc == ORB_ECONFIG) {
        printf("%s: %u problem%s: orbite-helper would deny everything to every tenant\n", o->dir, tally.bad,
               tally.bad == 1 ? "" : "s");
        return EXIT_PROBLEM;
    }
    if (rc != 0) {
        fprintf(stderr, "orbite-policy: %s\n", orb_last_error());
        return EXIT_USAGE;
    }
    if (tally.files == 0)
        printf("%s: no policy files: the built-in defaults apply\n", o->dir);
    return 0;
}

/* ---- explain ---------------------------------------------------------------------------- */

struct tenant {
    struct passwd pw;
    char *name;
    uint32_t ngroups;
    uint32_t *gids;
    char **group_names;
};

static void tenant_free(struct tenant *t)
{
    for (uint32_t i = 0; i < t->ngroups; i++)
        free(t->group_names[i]);
    free(t->group_names);
    free(t->gids);
    free(t->name);
}

/* The account and every group it belongs to, as a login session of it would have them. */
static int tenant_load(const char *user, struct tenant *t)
{
    memset(t, 0, sizeof *t);
    struct passwd *pw = getpwnam(user);
    uint32_t uid;
    if (!pw && parse_id(user, &uid) == 0)
        pw = getpwuid(uid);
    if (!pw) {
        fprintf(stderr, "orbite-policy: no such user: %s\n", user);
        return -1;
    }
    t->pw = *pw;
    t->name = strdup(pw->pw_name);
    if (!t->name)
        goto out_of_memory;
    int n = 16;
    gid_t *groups = NULL;
    for (;;) {
        gid_t *grown = realloc(groups, (size_t)n * sizeof *grown);
        if (!grown) {
            free(groups);
            goto out_of_memory;
        }
        groups = grown;
        int want = n;
        if (getgrouplist(t->name, pw->pw_gid, groups, &want) >= 0) {
            n = want;
            break;
        }
        if (want <= n || want > 65536) {
            free(groups);
            fprintf(stderr, "orbite-policy: cannot list the groups of %s\n", t->name);
            return -1;
        }
        n = want;
    }
    t->gids = calloc((size_t)n, sizeof *t->gids);
    t->group_names = calloc((size_t)n, sizeof *t->group_names);
    if (!t->gids || !t->group_names) {
        free(groups);
        goto out_of_memory;
    }
    for (int i = 0; i < n; i++) {
        t->gids[i] = (uint32_t)groups[i];
        struct group *gr = getgrgid(groups[i]);
        t->ngroups = (uint32_t)i + 1;
        if (gr && !(t->group_names[i] = strdup(gr->gr_name))) {
            free(groups);
            goto out_of_memory;
        }
    }
    free(groups);
    return 0;
out_of_memory:
    fprintf(stderr, "orbite-policy: out of memory\n");
    return -1;
}

static int load_inventory(const char *sysfs, struct orb_topo_inventory *inv)
{
    int fd = open(sysfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "orbite-policy: %s: %s\n", sysfs, strerror(errno));
        return -1;
    }
    int rc = orb_topo_load_sysfs(fd, inv);
    close(fd);
    if (rc != 0) {
        fprintf(stderr, "orbite-policy: %s: %s\n", sysfs, orb_last_error());
        return -1;
    }
    return 0;
}

/* The policy as the helper would load it; a missing directory is the same as an empty one. */
static int load_policy(const struct options *o, struct orb_policy **p, bool *missing)
{
    *missing = false;
    int dirfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW); /* as the helper */
    if (dirfd < 0 && errno == ENOENT) {
        *missing = true;
        return orb_policy_load_string("", o->dir, p);
    }
    if (dirfd < 0) {
        /* The helper denies everything then, with this reason: show the same decision. */
        fprintf(stderr, "orbite-policy: %s: %s: the helper would deny everything\n", o->dir, strerror(errno));
        return orb_policy_load_string("[defaults]\npolicy_directory_unreadable = yes\n", o->dir, p);
    }
    int rc = orb_policy_load_dir(dirfd, o->dir, o->owner, p);
    close(dirfd);
    return rc;
}

static int run_explain(const struct options *o)
{
    int status = EXIT_USAGE;
    struct tenant t;
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    struct orb_policy_reason *reasons = calloc(ORB_POLICY_MAX_REASONS, sizeof *reasons);
    struct orb_policy *p = NULL;
    if (!inv || !reasons) {
        fprintf(stderr, "orbite-policy: out of memory\n");
        goto free_buffers;
    }
    if (tenant_load(o->user, &t) != 0)
        goto free_tenant;
    if (load_inventory(o->sysfs, inv) != 0)
        goto free_tenant;
    bool missing = false;
    int rc = load_policy(o, &p, &missing);
    if (rc != 0 && rc != ORB_ECONFIG) {
        if (rc == ORB_ENOMEM)
            fprintf(stderr, "orbite-policy: out of memory\n");
        goto free_tenant;
    }

    struct orb_policy_subject who = {.uid = (uint32_t)t.pw.pw_uid, .user = t.name, .ngroups = t.ngroups,
                                     .gids = t.gids, .group_names = (const char *const *)t.group_names};
    struct orb_hp_policy decided;
    size_t n = 0;
    if (orb_policy_decide(p, &who, inv, &decided, reasons, ORB_POLICY_MAX_REASONS, &n) != 0) {
        fprintf(stderr, "orbite-policy: %s\n", orb_last_error());
        goto free_policy;
    }

    if (orb_policy_error(p))
        printf("policy:    %s: DENIES EVERYTHING: %s\n", o->dir, orb_policy_error(p));
    else if (missing)
        printf("policy:    %s does not exist: built-in defaults\n", o->dir);
    else
        printf("policy:    %s (%zu file%s)\n", o->dir, orb_policy_file_count(p),
               orb_policy_file_count(p) == 1 ? "" : "s");
    printf("user:      %s (uid %u)\n", t.name, (unsigned)t.pw.pw_uid);
    printf("groups:   ");
    for (uint32_t i = 0; i < t.ngroups; i++)
        printf("%s %s(%u)", i ? "," : "", t.group_names[i] ? t.group_names[i] : "?", t.gids[i]);
    printf("\n");
    printf("inventory: %s: %u NIC%s, %u GPU%s\n\n", o->sysfs, inv->nnics, inv->nnics == 1 ? "" : "s", inv->ngpus,
           inv->ngpus == 1 ? "" : "s");
    printf("%-24s %-20s %s\n", "ITEM", "VERDICT", "DECIDED BY");
    for (size_t i = 0; i < n; i++)
        printf("%-24s %-20s %s\n", reasons[i].item, reasons[i].verdict, reasons[i].source);
    status = orb_policy_error(p) ? EXIT_PROBLEM : 0;
free_policy:
    orb_policy_free(p);
free_tenant:
    tenant_free(&t);
free_buffers:
    free(reasons);
    free(inv);
    return status;
}

int main(int argc, char **argv)
{
    struct options o;
    int rc = parse_options(argc, argv, &o);
    if (rc != 0)
        return rc;
    rc = strcmp(o.command, "check") == 0 ? run_check(&o) : run_explain(&o);
    if (fflush(stdout) != 0)
        return EXIT_USAGE;
    return rc;
}
