/* The endpoint directory against a real etcd (the Debian etcd-server package), started here on
 * loopback ports with a data directory of its own: publish and resolve (and a segment opened from
 * what was resolved), expiry of a killed publisher, a restarted engine's new epoch (a segment
 * opened from the stale entry gets ORB_ESTALE), watches, 1000 engines publishing at once, etcd
 * stopped and started again (with and without its data) mid-run, malformed entries, bad
 * arguments, and examples/cluster_directory run against it. Skips (77) where no etcd binary is
 * installed. Linked with the static library for the two internal hooks it needs (writing raw
 * values, naming the library to load). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "directory/entry.h"
#include "directory/etcd.h"

#define SEC 1000000000ull

static const char *etcd_binary;
static char data_dir[256];
static char client_url[64], peer_url[64];
static pid_t etcd_pid = -1;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static struct orb_directory_params params(uint32_t ttl)
{
    struct orb_directory_params p;
    memset(&p, 0, sizeof p);
    p.endpoints = client_url;
    p.prefix = "/orbite-test/";
    p.lease_ttl_s = ttl;
    p.timeout_ns = 3 * SEC;
    return p;
}

/* Start etcd on the ports chosen (data in data_dir) and wait until it answers. */
static void etcd_start(void)
{
    char peer_cluster[96];
    snprintf(peer_cluster, sizeof peer_cluster, "default=%s", peer_url);
    etcd_pid = fork();
    assert_true(etcd_pid >= 0);
    if (etcd_pid == 0) {
        char log[300];
        snprintf(log, sizeof log, "%s.log", data_dir);
        FILE *f = freopen(log, "a", stderr);
        (void)f;
        execl(etcd_binary, etcd_binary, "--data-dir", data_dir, "--listen-client-urls", client_url,
              "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls",
              peer_url, "--initial-cluster", peer_cluster, "--log-level", "error", (char *)NULL);
        _exit(127);
    }
    uint64_t deadline = now_ns() + 30 * SEC;
    for (;;) {
        struct orb_directory_params p = params(0);
        p.timeout_ns = SEC / 2;
        orb_directory *d = NULL;
        if (orb_directory_open(&p, &d) == 0) {
            orb_directory_close(d);
            return;
        }
        if (now_ns() > deadline)
            fail_msg("etcd did not answer at %s within 30 s: %s", client_url, orb_last_error());
        sleep_ms(100);
    }
}

/* An etcd that ended on its own (not by etcd_stop) says why in its log: show its end. */
static void etcd_report_if_gone(void)
{
    int status;
    if (etcd_pid <= 0 || waitpid(etcd_pid, &status, WNOHANG) != etcd_pid)
        return;
    fprintf(stderr, "etcd ended on its own (%s %d); the end of its log:\n",
            WIFEXITED(status) ? "exit status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    char cmd[400];
    snprintf(cmd, sizeof cmd, "tail -n 40 '%s.log' >&2", data_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log)\n");
    etcd_pid = -1;
}

static void etcd_stop(void)
{
    etcd_report_if_gone();
    if (etcd_pid > 0) {
        kill(etcd_pid, SIGTERM);
        kill(etcd_pid, SIGCONT); /* a frozen one (test_a_frozen_etcd failed) acts on it too */
        int status;
        waitpid(etcd_pid, &status, 0);
    }
    etcd_pid = -1;
}

static int group_setup(void **state)
{
    (void)state;
    static const char *const candidates[] = {"/usr/bin/etcd", "/usr/local/bin/etcd", NULL};
    for (const char *const *c = candidates; *c != NULL; c++)
        if (access(*c, X_OK) == 0)
            etcd_binary = *c;
    if (etcd_binary == NULL)
        return -1;
    /* On tmpfs where the host has it: etcd syncs every write. */
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(data_dir, sizeof data_dir, "%s/orbite-etcd-%d", base, (int)getpid());
    snprintf(client_url, sizeof client_url, "http://127.0.0.1:%d", free_port());
    snprintf(peer_url, sizeof peer_url, "http://127.0.0.1:%d", free_port());
    etcd_start();
    return 0;
}

static void remove_tree(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.log'", dir, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static int group_teardown(void **state)
{
    (void)state;
    etcd_stop();
    remove_tree(data_dir);
    return 0;
}

static orb_engine *engine_with_region(orb_host_memory **mem_out, size_t len, const char *endpoint)
{
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.tcp_workers = 1;
    cfg.enable_shm = 0;
    if (endpoint != NULL)
        snprintf(cfg.endpoint, sizeof cfg.endpoint, "%s", endpoint);
    orb_engine *e = NULL;
    if (orb_engine_create(&cfg, &e) != 0)
        return NULL;
    if (mem_out != NULL) {
        assert_int_equal(orb_host_memory_alloc(len, 0, mem_out), 0);
        memset(orb_host_memory_data(*mem_out), 0x5c, len);
        orb_reg_id id;
        assert_int_equal(orb_register_host_memory(e, *mem_out, 0, len, ORB_PERM_REMOTE_WRITE, &id), 0);
    }
    return e;
}

static orb_directory *dir_open(uint32_t ttl)
{
    struct orb_directory_params p = params(ttl);
    orb_directory *d = NULL;
    if (orb_directory_open(&p, &d) != 0)
        fail_msg("orb_directory_open: %s", orb_last_error());
    return d;
}

static struct orb_directory_entry entry; /* large: off the stack */

/* ---- cells ---------------------------------------------------------------------------------------- */

/* Resolve `name` every `poll_ms` until the answer is `want` (0: found, ORB_ENOENT: gone); fail
 * the test `limit_s` seconds after `since`, and on any other answer while waiting when `strict`
 * (not strict: etcd may be coming back, and a failed exchange is expected meanwhile). Returns the
 * seconds from `since`. */
static double wait_for_answer(orb_directory *d, const char *name, int want, uint64_t since,
                              unsigned limit_s, unsigned poll_ms, int strict)
{
    for (;;) {
        int rc = orb_directory_resolve(d, name, &entry);
        if (rc == want)
            return (double)(now_ns() - since) / 1e9;
        if (strict && rc != 0 && rc != ORB_ENOENT)
            fail_msg("resolving %s: %d (%s)", name, rc, orb_last_error());
        if (now_ns() - since >= (uint64_t)limit_s * SEC)
            fail_msg("resolving %s: still %d after %u s", name, rc, limit_s);
        sleep_ms(poll_ms);
    }
}

static void test_arguments(void **state)
{
    (void)state;
    orb_directory *d = NULL;
    struct orb_directory_params p = params(0);
    assert_int_equal(orb_directory_open(NULL, &d), ORB_EINVAL);
    assert_int_equal(orb_directory_open(&p, NULL), ORB_EINVAL);
    const char *bad_prefix[] = {"orbite/", "/orbite", "/a//b/", "/a/../b/", "/a/./", "/with space/", ""};
    for (size_t i = 0; i < sizeof bad_prefix / sizeof bad_prefix[0]; i++) {
        p = params(0);
        p.prefix = bad_prefix[i];
        assert_int_equal(orb_directory_open(&p, &d), ORB_EINVAL);
    }
    p = params(1);
    assert_int_equal(orb_directory_open(&p, &d), ORB_EINVAL);
    p = params(3601);
    assert_int_equal(orb_directory_open(&p, &d), ORB_EINVAL);
    p = params(0);
    p.reserved[2] = 1;
    assert_int_equal(orb_directory_open(&p, &d), ORB_EINVAL);
    p = params(0);
    p.endpoints = "ftp://127.0.0.1:2379";
    assert_int_equal(orb_directory_open(&p, &d), ORB_EINVAL);
    p.endpoints = "";
    assert_int_equal(orb_directory_open(&p, &d), ORB_EINVAL);
    p = params(0);
    p.username = "root";
    assert_int_equal(orb_directory_open(&p, &d), ORB_EINVAL); /* a user without a password */
    /* Nobody there: refused in time, naming the endpoint. */
    char nobody[64];
    snprintf(nobody, sizeof nobody, "http://127.0.0.1:%d", free_port());
    p = params(0);
    p.endpoints = nobody;
    p.timeout_ns = 2 * SEC;
    uint64_t t0 = now_ns();
    assert_int_equal(orb_directory_open(&p, &d), ORB_EPEER);
    assert_true(now_ns() - t0 < 3 * SEC);
    assert_non_null(strstr(orb_last_error(), nobody));
    /* A dead endpoint first, a live one second: the live one serves. */
    char both[160];
    snprintf(both, sizeof both, "%s,%s", nobody, client_url);
    p.endpoints = both;
    assert_int_equal(orb_directory_open(&p, &d), 0);
    const char *bad_names[] = {"", "has space", "slash/name", "a\nb"};
    orb_engine *e = engine_with_region(NULL, 0, NULL);
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        assert_int_equal(orb_directory_publish(d, bad_names[i], e), ORB_EINVAL);
        assert_int_equal(orb_directory_resolve(d, bad_names[i], &entry), ORB_EINVAL);
    }
    char long_name[200];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    assert_int_equal(orb_directory_publish(d, long_name, e), ORB_EINVAL);
    assert_int_equal(orb_directory_resolve(d, "never-published", &entry), ORB_ENOENT);
    assert_int_equal(orb_directory_unpublish(d, "never-published"), ORB_ENOENT);
    /* A requester-only engine has nothing to publish. */
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.enable_source = 0;
    orb_engine *req = NULL;
    assert_int_equal(orb_engine_create(&cfg, &req), 0);
    assert_int_equal(orb_directory_publish(d, "requester", req), ORB_EUNAVAILABLE);
    orb_engine_free(req);
    orb_engine_free(e);
    orb_directory_close(d);
    orb_directory_close(NULL);
}

static void test_publish_resolve_and_use(void **state)
{
    (void)state;
    orb_host_memory *mem = NULL;
    orb_engine *src = engine_with_region(&mem, 1 << 20, NULL);
    orb_directory *d = dir_open(0);
    assert_int_equal(orb_directory_publish(d, "prefill-0", src), 0);

    orb_directory *peer = dir_open(0); /* another process's view, as it were */
    assert_int_equal(orb_directory_resolve(peer, "prefill-0", &entry), 0);
    char ep[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    assert_int_equal(orb_engine_endpoint(src, ep, sizeof ep), 0);
    assert_int_equal(orb_engine_source_epoch(src, &epoch), 0);
    assert_string_equal(entry.name, "prefill-0");
    assert_string_equal(entry.endpoint, ep);
    assert_memory_equal(entry.epoch.bytes, epoch.bytes, 16);
    assert_true(entry.host[0] != '\0');
    assert_true(entry.revision > 0);
    assert_int_equal(entry.nregions, 1);
    assert_int_equal(entry.regions[0].addr, (uint64_t)(uintptr_t)orb_host_memory_data(mem));
    assert_int_equal(entry.regions[0].length, 1 << 20);
    assert_int_equal(entry.regions[0].perm, ORB_PERM_REMOTE_WRITE);

    /* The entry is enough to connect and move bytes (the segment proves the epoch). */
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.enable_source = 0;
    orb_engine *req = NULL;
    assert_int_equal(orb_engine_create(&cfg, &req), 0);
    orb_host_memory *local = NULL;
    assert_int_equal(orb_host_memory_alloc(4096, 0, &local), 0);
    orb_reg_id lid;
    assert_int_equal(orb_register_host_memory(req, local, 0, 4096, ORB_PERM_LOCAL, &lid), 0);
    orb_segment *seg = NULL;
    assert_int_equal(orb_open_segment(req, entry.endpoint, &entry.epoch, 5 * SEC, &seg), 0);
    struct orb_request r;
    memset(&r, 0, sizeof r);
    r.op = ORB_OP_READ;
    r.local_addr = (uint64_t)(uintptr_t)orb_host_memory_data(local);
    r.remote_addr = entry.regions[0].addr;
    r.length = 4096;
    struct orb_batch_report rep;
    assert_int_equal(orb_submit_and_wait(req, seg, &r, 1, NULL, 10 * SEC, &rep), 0);
    assert_int_equal(((uint8_t *)orb_host_memory_data(local))[4095], 0x5c);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_host_memory_unref(local);

    /* Publishing again updates it (a second registration), same lease. */
    uint64_t rev = entry.revision;
    orb_host_memory *more = NULL;
    assert_int_equal(orb_host_memory_alloc(8192, 0, &more), 0);
    orb_reg_id id;
    assert_int_equal(orb_register_host_memory(src, more, 0, 8192, ORB_PERM_REMOTE_READ, &id), 0);
    assert_int_equal(orb_directory_publish(d, "prefill-0", src), 0);
    assert_int_equal(orb_directory_resolve(peer, "prefill-0", &entry), 0);
    assert_int_equal(entry.nregions, 2);
    assert_true(entry.revision > rev);

    /* Unpublish removes it at once; close withdraws the rest. */
    assert_int_equal(orb_directory_publish(d, "prefill-1", src), 0);
    assert_int_equal(orb_directory_unpublish(d, "prefill-0"), 0);
    assert_int_equal(orb_directory_resolve(peer, "prefill-0", &entry), ORB_ENOENT);
    assert_int_equal(orb_directory_resolve(peer, "prefill-1", &entry), 0);
    orb_directory_close(d);
    assert_int_equal(orb_directory_resolve(peer, "prefill-1", &entry), ORB_ENOENT);
    orb_directory_close(peer);
    orb_engine_free(src);
    orb_host_memory_unref(mem);
    orb_host_memory_unref(more);
}

/* A publisher that dies: its entry goes within the TTL (and not long before). */
static void test_a_dead_publisher_expires(void **state)
{
    (void)state;
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        orb_engine *e = engine_with_region(NULL, 0, NULL);
        struct orb_directory_params p = params(3);
        orb_directory *d = NULL;
        int ok = e != NULL && orb_directory_open(&p, &d) == 0 && orb_directory_publish(d, "doomed", e) == 0;
        char c = ok ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1)
            _exit(2);
        pause();
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    orb_directory *d = dir_open(0);
    /* Alive: kept well past its TTL by the child's refresher. */
    sleep_ms(4500);
    assert_int_equal(orb_directory_resolve(d, "doomed", &entry), 0);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    double gone = wait_for_answer(d, "doomed", ORB_ENOENT, now_ns(), 10, 100, 1);
    print_message("a killed publisher's entry went %.1f s after the kill (TTL 3 s)\n", gone);
    orb_directory_close(d);
    close(ready[0]);
    close(ready[1]);
}

/* A restarted engine (same endpoint, new epoch) replaces its entry; the stale entry is refused
 * by the segment's proof. */
static void test_a_restarted_engine(void **state)
{
    (void)state;
    orb_engine *a = engine_with_region(NULL, 0, NULL);
    char ep[ORB_ENDPOINT_MAX];
    assert_int_equal(orb_engine_endpoint(a, ep, sizeof ep), 0);
    orb_directory *d = dir_open(0);
    assert_int_equal(orb_directory_publish(d, "decode-3", a), 0);
    static struct orb_directory_entry stale;
    assert_int_equal(orb_directory_resolve(d, "decode-3", &stale), 0);
    orb_engine_free(a); /* the process "restarts" on the same endpoint */
    orb_engine *b = NULL;
    for (int tries = 0; b == NULL && tries < 50; tries++) {
        b = engine_with_region(NULL, 0, ep);
        if (b == NULL)
            sleep_ms(100);
    }
    assert_non_null(b);
    orb_directory *d2 = dir_open(0);
    assert_int_equal(orb_directory_publish(d2, "decode-3", b), 0);
    assert_int_equal(orb_directory_resolve(d, "decode-3", &entry), 0);
    struct orb_epoch eb;
    assert_int_equal(orb_engine_source_epoch(b, &eb), 0);
    assert_memory_equal(entry.epoch.bytes, eb.bytes, 16);
    assert_true(memcmp(entry.epoch.bytes, stale.epoch.bytes, 16) != 0);
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.enable_source = 0;
    orb_engine *req = NULL;
    assert_int_equal(orb_engine_create(&cfg, &req), 0);
    orb_segment *seg = NULL;
    assert_int_equal(orb_open_segment(req, stale.endpoint, &stale.epoch, 5 * SEC, &seg), ORB_ESTALE);
    assert_int_equal(orb_open_segment(req, entry.endpoint, &entry.epoch, 5 * SEC, &seg), 0);
    orb_segment_close(seg);
    orb_engine_free(req);
    /* The first directory's close must not withdraw the entry the second one now owns... */
    orb_directory_close(d);
    assert_int_equal(orb_directory_resolve(d2, "decode-3", &entry), 0);
    orb_directory_close(d2);
    orb_engine_free(b);
}

struct watcher {
    orb_directory *d;
    uint64_t after;
    int rc, deleted;
    struct orb_directory_entry out;
};

static void *watch_main(void *arg)
{
    struct watcher *w = arg;
    w->rc = orb_directory_watch(w->d, "watched", w->after, 10 * SEC, &w->out, &w->deleted);
    return NULL;
}

static void test_watch(void **state)
{
    (void)state;
    orb_engine *e = engine_with_region(NULL, 0, NULL);
    orb_directory *d = dir_open(0), *peer = dir_open(0);
    int deleted = -1;
    /* Nothing happens: a timeout, in time. */
    uint64_t t0 = now_ns();
    assert_int_equal(orb_directory_watch(peer, "watched", 0, SEC / 2, &entry, &deleted), ORB_ETIMEDOUT);
    assert_true(now_ns() - t0 < 3 * SEC);
    /* A publication wakes a watcher started before it. */
    static struct watcher w;
    w.d = peer;
    w.after = 0;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, watch_main, &w), 0);
    sleep_ms(300);
    assert_int_equal(orb_directory_publish(d, "watched", e), 0);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, 0);
    assert_int_equal(w.deleted, 0);
    struct orb_epoch ep;
    assert_int_equal(orb_engine_source_epoch(e, &ep), 0);
    assert_memory_equal(w.out.epoch.bytes, ep.bytes, 16);
    /* From 0 with the entry there: it, at once (so "wait for a name" has no gap between a
     * resolve that found nothing and the watch). */
    t0 = now_ns();
    assert_int_equal(orb_directory_watch(peer, "watched", 0, 5 * SEC, &entry, &deleted), 0);
    assert_true(now_ns() - t0 < SEC);
    assert_int_equal(deleted, 0);
    assert_int_equal(entry.revision, w.out.revision);
    assert_memory_equal(entry.epoch.bytes, ep.bytes, 16);
    /* After a revision: what came after it, even if it came before the watch. */
    uint64_t rev = w.out.revision;
    assert_int_equal(orb_directory_unpublish(d, "watched"), 0);
    assert_int_equal(orb_directory_watch(peer, "watched", rev, 5 * SEC, &entry, &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_true(entry.revision > rev);
    orb_directory_close(d);
    orb_directory_close(peer);
    orb_engine_free(e);
}

/* ---- 1000 engines ------------------------------------------------------------------------------- */

#define ENGINES 1000
#define PUBLISHERS 16

struct publisher {
    orb_engine **engines;
    int first, count;
    orb_directory *d;
    int failures;
    char why[256];
};

static void *publish_main(void *arg)
{
    struct publisher *p = arg;
    for (int i = p->first; i < p->first + p->count; i++) {
        char name[32];
        snprintf(name, sizeof name, "engine-%04d", i);
        if (orb_directory_publish(p->d, name, p->engines[i]) != 0) {
            p->failures++;
            snprintf(p->why, sizeof p->why, "%s: %s", name, orb_last_error());
        }
    }
    return NULL;
}

static void test_a_thousand_engines(void **state)
{
    (void)state;
    orb_engine **engines = calloc(ENGINES, sizeof *engines);
    assert_non_null(engines);
    for (int i = 0; i < ENGINES; i++) {
        engines[i] = engine_with_region(NULL, 0, NULL);
        if (engines[i] == NULL)
            fail_msg("engine %d: %s", i, orb_last_error());
    }
    struct publisher pubs[PUBLISHERS];
    pthread_t threads[PUBLISHERS];
    uint64_t t0 = now_ns();
    for (int k = 0; k < PUBLISHERS; k++) {
        int per = ENGINES / PUBLISHERS + (k < ENGINES % PUBLISHERS);
        int first = k * (ENGINES / PUBLISHERS) + (k < ENGINES % PUBLISHERS ? k : ENGINES % PUBLISHERS);
        pubs[k] = (struct publisher){.engines = engines, .first = first, .count = per, .d = dir_open(0)};
        assert_int_equal(pthread_create(&threads[k], NULL, publish_main, &pubs[k]), 0);
    }
    for (int k = 0; k < PUBLISHERS; k++) {
        pthread_join(threads[k], NULL);
        if (pubs[k].failures != 0)
            fail_msg("publisher %d: %d failures (%s)", k, pubs[k].failures, pubs[k].why);
    }
    double secs = (double)(now_ns() - t0) / 1e9;
    print_message("1000 engines published by 16 threads in %.2f s\n", secs);
    /* Every one resolves to its own engine. */
    orb_directory *check = dir_open(0);
    for (int i = 0; i < ENGINES; i++) {
        char name[32];
        snprintf(name, sizeof name, "engine-%04d", i);
        if (orb_directory_resolve(check, name, &entry) != 0)
            fail_msg("%s: %s", name, orb_last_error());
        struct orb_epoch ep;
        assert_int_equal(orb_engine_source_epoch(engines[i], &ep), 0);
        assert_memory_equal(entry.epoch.bytes, ep.bytes, 16);
    }
    for (int k = 0; k < PUBLISHERS; k++)
        orb_directory_close(pubs[k].d);
    assert_int_equal(orb_directory_resolve(check, "engine-0000", &entry), ORB_ENOENT);
    assert_int_equal(orb_directory_resolve(check, "engine-0999", &entry), ORB_ENOENT);
    orb_directory_close(check);
    for (int i = 0; i < ENGINES; i++)
        orb_engine_free(engines[i]);
    free(engines);
}

/* etcd goes away and comes back: calls fail in time, naming why; published entries come back on
 * their own, also when etcd lost its data. */
static void test_etcd_stopped_and_restarted(void **state)
{
    (void)state;
    orb_engine *e = engine_with_region(NULL, 0, NULL);
    orb_directory *d = dir_open(3), *peer = dir_open(0);
    assert_int_equal(orb_directory_publish(d, "survivor", e), 0);
    etcd_stop();
    uint64_t t0 = now_ns();
    int rc = orb_directory_resolve(peer, "survivor", &entry);
    assert_true(rc == ORB_EPEER || rc == ORB_ETIMEDOUT);
    assert_true(now_ns() - t0 < 4 * SEC); /* the 3 s timeout, not a hang */
    assert_non_null(strstr(orb_last_error(), "127.0.0.1"));
    rc = orb_directory_publish(d, "newcomer", e);
    assert_true(rc == ORB_EPEER || rc == ORB_ETIMEDOUT);
    sleep_ms(2500); /* a refresh fails meanwhile */
    etcd_start();   /* with its data */
    print_message("with its data: resolvable %.1f s after etcd came back\n",
                  wait_for_answer(peer, "survivor", 0, now_ns(), 15, 200, 0));
    /* Without its data: the refresher finds its lease gone and publishes again. */
    etcd_stop();
    remove_tree(data_dir);
    etcd_start();
    /* An etcd without data holds only what was published since it started: an entry found at
     * once was published again already (the refresher may beat this call), else it comes with
     * the next refresh, every TTL / 3 = 1 s; nothing but found or not found meanwhile. */
    print_message("without its data: published again %.1f s after etcd came back\n",
                  wait_for_answer(peer, "survivor", 0, now_ns(), 15, 200, 1));
    struct orb_epoch ep;
    assert_int_equal(orb_engine_source_epoch(e, &ep), 0);
    assert_memory_equal(entry.epoch.bytes, ep.bytes, 16);
    orb_directory_close(d);
    orb_directory_close(peer);
    orb_engine_free(e);
}

/* etcd frozen (SIGSTOP: the kernel still accepts connections, nobody answers) while a directory
 * holds many names: every call ends within its timeout (a publish waits for one entry's refresh
 * at most, never for a whole pass), close too, and all is well once etcd thaws. */
static void test_a_frozen_etcd(void **state)
{
    (void)state;
    enum { NAMES = 64 };
    orb_engine *e = engine_with_region(NULL, 0, NULL);
    struct orb_directory_params p = params(3); /* a refresh pass every second */
    p.timeout_ns = SEC;
    orb_directory *d = NULL, *peer = NULL;
    assert_int_equal(orb_directory_open(&p, &d), 0);
    assert_int_equal(orb_directory_open(&p, &peer), 0);
    char name[32];
    for (int i = 0; i < NAMES; i++) {
        snprintf(name, sizeof name, "frozen-%d", i);
        assert_int_equal(orb_directory_publish(d, name, e), 0);
    }
    assert_int_equal(kill(etcd_pid, SIGSTOP), 0);
    sleep_ms(1500); /* the refresher is stuck in a pass over 64 names, one second each */
    for (int round = 0; round < 3; round++) {
        uint64_t t0 = now_ns();
        int rc = orb_directory_publish(d, "frozen-late", e);
        uint64_t took = now_ns() - t0;
        assert_true(rc == ORB_ETIMEDOUT || rc == ORB_EPEER);
        print_message("frozen etcd: publish failed in %.2f s (%s)\n", (double)took / 1e9, orb_last_error());
        assert_true(took < 2 * SEC + SEC / 2);
        t0 = now_ns();
        rc = orb_directory_resolve(peer, "frozen-0", &entry);
        assert_true(rc == ORB_ETIMEDOUT || rc == ORB_EPEER);
        assert_true(now_ns() - t0 < SEC + SEC / 2);
        t0 = now_ns();
        int deleted;
        rc = orb_directory_watch(peer, "frozen-0", 0, SEC / 2, &entry, &deleted);
        assert_true(rc == ORB_ETIMEDOUT || rc == ORB_EPEER);
        assert_true(now_ns() - t0 < SEC + SEC / 2);
    }
    assert_int_equal(kill(etcd_pid, SIGCONT), 0);
    /* Thawed: every name is there again (refreshed, or published again if its lease lapsed). */
    uint64_t t1 = now_ns();
    for (int i = 0; i < NAMES; i++) {
        snprintf(name, sizeof name, "frozen-%d", i);
        (void)wait_for_answer(peer, name, 0, t1, 30, 100, 0);
    }
    assert_int_equal(orb_directory_publish(d, "frozen-late", e), 0);
    /* Close bounded too with etcd frozen again: the entries then expire on their own. */
    assert_int_equal(kill(etcd_pid, SIGSTOP), 0);
    uint64_t t0 = now_ns();
    orb_directory_close(d);
    print_message("frozen etcd: close took %.2f s\n", (double)(now_ns() - t0) / 1e9);
    assert_true(now_ns() - t0 < 2 * SEC + SEC / 2);
    assert_int_equal(kill(etcd_pid, SIGCONT), 0);
    orb_directory_close(peer);
    orb_engine_free(e);
}

/* ---- authentication --------------------------------------------------------------------------- */

/* One call of etcd's gateway that must succeed. */
static void etcd_must(struct orb_etcd *raw, const char *path, json_t *body)
{
    assert_non_null(body);
    json_t *reply = NULL;
    int rc = orb_etcd_call(raw, path, body, now_ns() + 5 * SEC, &reply);
    if (rc != 0)
        fail_msg("%s: %s", path, orb_last_error());
    json_decref(body);
    json_decref(reply);
}

static char *b64(const char *s)
{
    char *out = orb_dir_b64_encode((const uint8_t *)s, strlen(s));
    assert_non_null(out);
    return out;
}

/* etcd with authentication on, and a role that may write under one job's prefix only: a worker
 * of that job publishes and resolves there, is refused elsewhere (naming why), a wrong password
 * is refused at open, and so is a client without credentials. Authentication is turned off
 * again at the end. */
static void test_authentication(void **state)
{
    (void)state;
    struct orb_etcd *raw = NULL;
    struct orb_etcd_params ep = {.endpoints = client_url};
    assert_int_equal(orb_etcd_new(&ep, &raw), 0);
    etcd_must(raw, "/v3/auth/user/add", json_pack("{s:s,s:s}", "name", "root", "password", "root-secret"));
    etcd_must(raw, "/v3/auth/role/add", json_pack("{s:s}", "name", "root"));
    etcd_must(raw, "/v3/auth/user/grant", json_pack("{s:s,s:s}", "user", "root", "role", "root"));
    char *from = b64("/orbite-auth/job-17/"), *to = b64("/orbite-auth/job-170"); /* the prefix's range */
    etcd_must(raw, "/v3/auth/role/add", json_pack("{s:s}", "name", "job-17"));
    etcd_must(raw, "/v3/auth/role/grant",
              json_pack("{s:s,s:{s:s,s:s,s:s}}", "name", "job-17", "perm", "permType", "READWRITE", "key", from,
                        "range_end", to));
    free(from);
    free(to);
    etcd_must(raw, "/v3/auth/user/add", json_pack("{s:s,s:s}", "name", "worker-17", "password", "w17-secret"));
    etcd_must(raw, "/v3/auth/user/grant", json_pack("{s:s,s:s}", "user", "worker-17", "role", "job-17"));
    etcd_must(raw, "/v3/auth/enable", json_object());
    orb_etcd_free(raw);

    orb_engine *e = engine_with_region(NULL, 0, NULL);
    struct orb_directory_params p = params(3);
    p.prefix = "/orbite-auth/job-17/";
    p.username = "worker-17";
    p.password = "w17-secret";
    orb_directory *d = NULL;
    assert_int_equal(orb_directory_open(&p, &d), 0);
    assert_int_equal(orb_directory_publish(d, "prefill-0", e), 0);
    assert_int_equal(orb_directory_resolve(d, "prefill-0", &entry), 0);
    int deleted = 1;
    assert_int_equal(orb_directory_watch(d, "prefill-0", 0, SEC, &entry, &deleted), 0);
    assert_int_equal(deleted, 0);
    sleep_ms(1500); /* the TTL is 3 s: a refresh passes with the token too */
    assert_int_equal(orb_directory_resolve(d, "prefill-0", &entry), 0);

    /* Another job's prefix: refused at open, naming the cause. */
    orb_directory *other = NULL;
    p.prefix = "/orbite-auth/job-18/";
    assert_int_equal(orb_directory_open(&p, &other), ORB_EPEER);
    assert_non_null(strstr(orb_last_error(), "permission denied"));

    /* A wrong password, and no credentials: refused at open. */
    p.prefix = "/orbite-auth/job-17/";
    p.password = "not-the-secret";
    assert_int_equal(orb_directory_open(&p, &other), ORB_EPEER);
    assert_non_null(strstr(orb_last_error(), "worker-17"));
    assert_null(strstr(orb_last_error(), "not-the-secret"));
    p.username = NULL;
    p.password = NULL;
    assert_int_equal(orb_directory_open(&p, &other), ORB_EPEER);

    orb_directory_close(d); /* withdraws, with the token */
    struct orb_etcd_params root = {.endpoints = client_url, .username = "root", .password = "root-secret"};
    assert_int_equal(orb_etcd_new(&root, &raw), 0);
    json_t *reply = NULL;
    char *key = b64("/orbite-auth/job-17/prefill-0");
    json_t *body = json_pack("{s:s}", "key", key);
    free(key);
    assert_int_equal(orb_etcd_call(raw, "/v3/kv/range", body, now_ns() + 5 * SEC, &reply), 0);
    assert_null(json_object_get(reply, "kvs")); /* withdrawn */
    json_decref(body);
    json_decref(reply);
    etcd_must(raw, "/v3/auth/disable", json_object());
    orb_etcd_free(raw);
    orb_engine_free(e);
}

/* Whatever else is stored under the prefix is refused whole, never half-read. */
static void test_malformed_entries(void **state)
{
    (void)state;
    struct orb_etcd *raw = NULL;
    struct orb_etcd_params ep = {.endpoints = client_url};
    assert_int_equal(orb_etcd_new(&ep, &raw), 0);
    orb_directory *d = dir_open(0);
    const char *values[] = {
        "not json",
        "[]",
        "{\"v\":2,\"endpoint\":\"127.0.0.1:1\",\"epoch\":\"00000000000000000000000000000000\",\"host\":\"h\",\"regions\":[]}",
        "{\"v\":1,\"endpoint\":\"127.0.0.1:1\",\"epoch\":\"xyz\",\"host\":\"h\",\"regions\":[]}",
        "{\"v\":1,\"endpoint\":\"\",\"epoch\":\"00000000000000000000000000000000\",\"host\":\"h\",\"regions\":[]}",
        "{\"v\":1,\"endpoint\":\"127.0.0.1:1\",\"epoch\":\"00000000000000000000000000000000\",\"host\":\"h\","
        "\"regions\":[[\"0x1000\",\"0x0\",3,0,0]]}",
        "{\"v\":1,\"endpoint\":\"127.0.0.1:1\",\"epoch\":\"00000000000000000000000000000000\",\"host\":\"h\","
        "\"regions\":[[\"0xffffffffffffffff\",\"0x2\",3,0,0]]}",
        "{\"v\":1,\"endpoint\":\"127.0.0.1:1\",\"epoch\":\"00000000000000000000000000000000\",\"host\":\"h\","
        "\"regions\":[[\"0x1000\",\"0x10\",2,0,0]]}",
        "{\"v\":1,\"v\":1,\"endpoint\":\"127.0.0.1:1\",\"epoch\":\"00000000000000000000000000000000\",\"host\":\"h\","
        "\"regions\":[]}",
    };
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        const char *raw_key = "/orbite-test/bad";
        char *k = orb_dir_b64_encode((const uint8_t *)raw_key, strlen(raw_key));
        char *v = orb_dir_b64_encode((const uint8_t *)values[i], strlen(values[i]));
        json_t *body = json_pack("{s:s,s:s}", "key", k, "value", v), *reply = NULL;
        free(k);
        free(v);
        assert_int_equal(orb_etcd_call(raw, "/v3/kv/put", body, now_ns() + 3 * SEC, &reply), 0);
        json_decref(body);
        json_decref(reply);
        memset(&entry, 0x77, sizeof entry);
        int rc = orb_directory_resolve(d, "bad", &entry);
        if (rc != ORB_EPROTO)
            fail_msg("value %zu resolved with %d: %s", i, rc, values[i]);
        assert_int_equal(entry.nregions, 0x77777777); /* untouched */
    }
    orb_directory_close(d);
    orb_etcd_free(raw);
}

/* In a fresh process (this program again): which library to load is decided once per process,
 * and this one has loaded libcurl already. */
static int without_libcurl(void)
{
    orb_etcd_use_library("libcurl-not-here.so.99");
    struct orb_directory_params p = params(0);
    orb_directory *d = NULL;
    int rc = orb_directory_open(&p, &d);
    if (rc == ORB_EUNAVAILABLE && strstr(orb_last_error(), "libcurl-not-here.so.99") != NULL)
        return 0;
    fprintf(stderr, "without libcurl: %d: %s\n", rc, orb_last_error());
    return 1;
}

static void test_without_libcurl(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "test_directory", "--without-libcurl", client_url, (char *)NULL);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* examples/cluster_directory (its path is the test's argument): two processes that find each
 * other through this etcd. */
static const char *cluster_example;

static void test_the_cluster_example(void **state)
{
    (void)state;
    if (cluster_example == NULL)
        skip();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("ORBITE_ETCD_ENDPOINTS", client_url, 1);
        setenv("ORBITE_ETCD_PREFIX", "/orbite-example/", 1);
        execl(cluster_example, cluster_example, (char *)NULL);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* Prefill withdrew its name when it closed its directory. */
    struct orb_directory_params p = params(0);
    p.prefix = "/orbite-example/";
    orb_directory *d = NULL;
    assert_int_equal(orb_directory_open(&p, &d), 0);
    assert_int_equal(orb_directory_resolve(d, "prefill-0", &entry), ORB_ENOENT);
    orb_directory_close(d);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--without-libcurl") == 0) {
        snprintf(client_url, sizeof client_url, "%s", argv[2]);
        return without_libcurl();
    }
    if (argc == 2)
        cluster_example = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_without_libcurl),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_publish_resolve_and_use),
        cmocka_unit_test(test_watch),
        cmocka_unit_test(test_the_cluster_example),
        cmocka_unit_test(test_a_restarted_engine),
        cmocka_unit_test(test_malformed_entries),
        cmocka_unit_test(test_a_dead_publisher_expires),
        cmocka_unit_test(test_a_thousand_engines),
        cmocka_unit_test(test_etcd_stopped_and_restarted),
        cmocka_unit_test(test_a_frozen_etcd),
        cmocka_unit_test(test_authentication),
    };
    if (access("/usr/bin/etcd", X_OK) != 0 && access("/usr/local/bin/etcd", X_OK) != 0) {
        printf("SKIP: no etcd binary (Debian: etcd-server)\n");
        return 77;
    }
    /* A liborbite built without libcurl's headers, or a host without libcurl.so.4, has no
     * directory: every open says so, and there is nothing else to test. Port 1 refuses. */
    struct orb_directory_params probe = {.endpoints = "http://127.0.0.1:1", .timeout_ns = SEC};
    orb_directory *none = NULL;
    if (orb_directory_open(&probe, &none) == ORB_EUNAVAILABLE) {
        printf("SKIP: no directory in this build or on this host: %s\n", orb_last_error());
        return 77;
    }
    orb_directory_close(none);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
