/* What the privileged helper costs the library: starting a session (fork, exec, the helper's
 * start-up up to its seccomp filter, HELLO), ending it (EOF, exit, reap), and one request/reply
 * exchange of each kind, through the library's own client (lib/helper/) against the helper's
 * test build on the two-socket sysfs fixture.
 *
 *   helper_bench [--sessions N] [--iterations N]
 *
 * Prints p50/p99/max per operation in microseconds. Exits 1 when any call answers other than
 * expected (the smoke run in ctest relies on that), 2 on a usage error. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "helper/helper_client.h"
#include "topo/slots.h"
#include "helperlib/common.h"
#include "../helper/tenant.h"

#ifndef HELPER_TEST_PATH
#error "HELPER_TEST_PATH must name the orbite-helper test build"
#endif
#ifndef FIXTURE_DIR
#error "FIXTURE_DIR must name tests/data/sysfs"
#endif

#define TIMEOUT_NS (10ull * 1000000000ull)
#define GRANTED_NIC "mlx5_0"
#define DENIED_NIC "mlx5_1"
#define GRANTED_SLOT "bench-slot"

static int failures;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, uint64_t *ns, size_t n)
{
    if (n == 0)
        return;
    qsort(ns, n, sizeof *ns, cmp_u64);
    size_t p99 = (n * 99 + 99) / 100;
    if (p99 > n)
        p99 = n;
    printf("%-40s %8zu %10.1f %10.1f %10.1f\n", what, n, (double)ns[n / 2] / 1e3, (double)ns[p99 - 1] / 1e3,
           (double)ns[n - 1] / 1e3);
}

static void expect(int got, int want, const char *what)
{
    if (got != want) {
        fprintf(stderr, "%s: got %d (%s), expected %d: %s\n", what, got, orb_strerror(got), want, orb_last_error());
        failures++;
    }
}

/* The timed exchanges, each with the answer it must get. */
enum exchange_kind { EX_POLICY, EX_PEERMEM, EX_OPEN_DENIED, EX_DEVX, EX_SLOT, EX_INVENTORY };

struct exchange {
    struct orb_helper *h;
    struct orb_topo_inventory *inv;
};

static void time_exchanges(struct exchange *ex, enum exchange_kind kind, size_t count, uint64_t *ns)
{
    static const struct {
        const char *label;
        int want;
    } kinds[] = {
        [EX_POLICY] = {"POLICY", 0},
        [EX_PEERMEM] = {"PEERMEM_PROBE (three fstatat)", 0},
        [EX_OPEN_DENIED] = {"OPEN_DEVICE refused by policy", ORB_EPERM},
        [EX_DEVX] = {"DEVX_VERIFY refused (no mlx5 device)", ORB_EUNAVAILABLE},
        [EX_SLOT] = {"SLOT_ATTACH (through the monitor)", 0},
        [EX_INVENTORY] = {"INVENTORY", 0},
    };
    struct orb_hp_policy pol;
    uint32_t found = 0;
    int fd = -1;
    const struct orb_hp_devx_verify v = {.nic = GRANTED_NIC, .obj_handle = 1, .key = 0x100, .qpn = 7,
                                         .addr = 4096, .length = 4096, .access = 1};
    for (size_t i = 0; i < count; i++) {
        uint64_t t0 = now_ns();
        int rc = kind == EX_POLICY        ? orb_helper_policy(ex->h, &pol)
                 : kind == EX_PEERMEM     ? orb_helper_peermem_probe(ex->h, &found)
                 : kind == EX_OPEN_DENIED ? orb_helper_open_device(ex->h, DENIED_NIC, &fd)
                 : kind == EX_DEVX        ? orb_helper_devx_verify(ex->h, &v)
                 : kind == EX_SLOT        ? orb_helper_slot_attach(ex->h, GRANTED_SLOT, ORB_SLOTS_DEFAULT_INTERVAL_NS, &fd)
                                          : orb_helper_inventory(ex->h, ex->inv);
        ns[i] = now_ns() - t0;
        if (kind == EX_SLOT && rc == 0)
            close(fd);
        expect(rc, kinds[kind].want, kinds[kind].label);
    }
    char label[64];
    if (kind == EX_INVENTORY)
        snprintf(label, sizeof label, "INVENTORY (%u NIC, %u GPU, %u NUMA items)", ex->inv->nnics,
                 ex->inv->ngpus, ex->inv->nnuma);
    else
        snprintf(label, sizeof label, "%s", kinds[kind].label);
    report(label, ns, count);
}

static bool parse_count(const char *s, size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v == 0 || v > 10000000ul)
        return false;
    *out = v;
    return true;
}

static int write_policy(const char *dir)
{
    char path[600], text[400];
    snprintf(path, sizeof path, "%s/bench.ini", dir);
    snprintf(text, sizeof text, "[user:#%u]\nnics = " GRANTED_NIC "\ntransports = tcp, rdma\nslots = " GRANTED_SLOT "\n",
             (unsigned)getuid());
    return write_file(path, text, 0644);
}

int main(int argc, char **argv)
{
    /* The helper's test build runs as an ordinary user only. */
    if (hp_become_tenant() != 0) {
        fprintf(stderr, "helper_bench: cannot run as an ordinary user\n");
        return 1;
    }
    size_t sessions = 30, iterations = 5000;
    for (int i = 1; i < argc; i++) {
        bool ok = i + 1 < argc;
        if (ok && strcmp(argv[i], "--sessions") == 0)
            ok = parse_count(argv[++i], &sessions);
        else if (ok && strcmp(argv[i], "--iterations") == 0)
            ok = parse_count(argv[++i], &iterations);
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "usage: %s [--sessions N] [--iterations N]\n", argv[0]);
            return 2;
        }
    }

    char tmpdir[] = "/tmp/orbite-helper-bench-XXXXXX", policy_dir[64], shm_dir[64], sysfs[600], owner[16];
    if (mkdtemp(tmpdir) == NULL)
        return 1;
    snprintf(policy_dir, sizeof policy_dir, "%s/policy.d", tmpdir);
    snprintf(shm_dir, sizeof shm_dir, "%s/shm", tmpdir);
    snprintf(sysfs, sizeof sysfs, "%s/two-socket", FIXTURE_DIR);
    snprintf(owner, sizeof owner, "%u", (unsigned)getuid());
    if (mkdir(policy_dir, 0755) != 0 || mkdir(shm_dir, 0755) != 0 || write_policy(policy_dir) != 0)
        return 1;
    const char *args[] = {"--sysfs-root", sysfs, "--policy-dir", policy_dir, "--shm-dir", shm_dir,
                          "--policy-owner", owner, NULL};
    if (orb_helper_test_set_command(HELPER_TEST_PATH, args) != 0)
        return 1;

    size_t n = sessions > iterations ? sessions : iterations;
    uint64_t *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b);
    struct orb_topo_inventory *inv = malloc(sizeof *inv);
    if (a == NULL || b == NULL || inv == NULL)
        return 1;

    printf("%-40s %8s %10s %10s %10s\n", "operation (microseconds)", "count", "p50", "p99", "max");
    for (size_t i = 0; i < sessions; i++) {
        struct orb_helper *h = NULL;
        uint64_t t0 = now_ns();
        int rc = orb_helper_open(ORB_HELPER_REQUIRED, TIMEOUT_NS, &h);
        uint64_t t1 = now_ns();
        expect(rc, 0, "open");
        if (rc != 0)
            break;
        orb_helper_close(h);
        a[i] = t1 - t0;
        b[i] = now_ns() - t1;
    }
    report("session start (spawn .. HELLO reply)", a, sessions);
    report("session end (EOF .. exit reaped)", b, sessions);

    struct orb_helper *h = NULL;
    expect(orb_helper_open(ORB_HELPER_REQUIRED, TIMEOUT_NS, &h), 0, "open");
    if (h == NULL)
        return 1;
    struct exchange ex = {.h = h, .inv = inv};
    time_exchanges(&ex, EX_POLICY, iterations, a);
    time_exchanges(&ex, EX_PEERMEM, iterations, a);
    time_exchanges(&ex, EX_OPEN_DENIED, iterations, a);
    time_exchanges(&ex, EX_DEVX, iterations, a);
    /* The first SLOT_ATTACH creates the object (and the private directory); the timed ones
     * find it attached. */
    int slot_fd = -1;
    expect(orb_helper_slot_attach(h, GRANTED_SLOT, ORB_SLOTS_DEFAULT_INTERVAL_NS, &slot_fd), 0, "first SLOT_ATTACH");
    if (slot_fd >= 0)
        close(slot_fd);
    time_exchanges(&ex, EX_SLOT, iterations, a);
    size_t inv_rounds = iterations / 10 ? iterations / 10 : 1;
    time_exchanges(&ex, EX_INVENTORY, inv_rounds, a);
    orb_helper_close(h);

    orb_helper_test_set_command(NULL, NULL);
    char rm[200];
    snprintf(rm, sizeof rm, "rm -rf '%s'", shm_dir); /* the slot object and the private directory */
    if (system(rm) != 0)
        failures++;
    char path[600];
    snprintf(path, sizeof path, "%s/bench.ini", policy_dir);
    unlink(path);
    rmdir(policy_dir);
    rmdir(tmpdir);
    free(a);
    free(b);
    free(inv);
    if (failures)
        fprintf(stderr, "%d unexpected answer(s)\n", failures);
    return failures ? 1 : 0;
}
