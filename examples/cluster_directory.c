/*
 * cluster_directory: a prefill worker and a decode worker that find each other through the
 * endpoint directory on etcd (docs/cluster.md).
 *
 * Two processes:
 *  - prefill registers a buffer of "KV cache" blocks, publishes itself as "prefill-0" and waits
 *    until decode says it is done;
 *  - decode waits for the name "prefill-0" to appear (orb_directory_watch from revision 0 returns
 *    the entry at once or its first publication), opens a segment from the entry (proving the
 *    epoch), reads every block and checks it.
 *
 * etcd's client URLs come from ORBITE_ETCD_ENDPOINTS ("http://127.0.0.1:2379"); without it the
 * program exits 77 (nothing to talk to). An optional ORBITE_ETCD_PREFIX keeps several runs apart.
 */
#include <orbite/orbite.h>

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK_LEN (64u << 10)
#define BLOCKS 32u
#define TIMEOUT_NS (10ull * 1000 * 1000 * 1000)

static const char *role = "cluster_directory";

static void check(int status, const char *what)
{
    if (status != ORB_OK) {
        fprintf(stderr, "%s: %s failed: %s (%s)\n", role, what, orb_strerror(status), orb_last_error());
        exit(EXIT_FAILURE);
    }
}

static void expect(int condition, const char *what)
{
    if (!condition) {
        fprintf(stderr, "%s: check failed: %s\n", role, what);
        exit(EXIT_FAILURE);
    }
}

static uint8_t block_byte(size_t block, size_t offset)
{
    return (uint8_t)(block * 37 + offset * 13 + (offset >> 9));
}

static orb_directory *open_directory(const char *endpoints, const char *prefix)
{
    struct orb_directory_params params;
    memset(&params, 0, sizeof params);
    params.endpoints = endpoints;
    params.prefix = prefix;     /* NULL: "/orbite/" */
    params.lease_ttl_s = 10;    /* a dead worker's entry goes after 10 s */
    params.timeout_ns = 5ull * 1000 * 1000 * 1000;
    orb_directory *dir = NULL;
    check(orb_directory_open(&params, &dir), "orb_directory_open");
    return dir;
}

/* Publish, then wait for one byte on `done` (decode finished) before withdrawing. */
static int run_prefill(const char *endpoints, const char *prefix, int done)
{
    role = "prefill";
    struct orb_engine_config cfg;
    orb_engine *engine = NULL;
    orb_host_memory *kv = NULL;
    orb_reg_id kv_id;
    check(orb_engine_config_init(&cfg), "orb_engine_config_init");
    check(orb_engine_create(&cfg, &engine), "orb_engine_create");
    check(orb_host_memory_alloc((size_t)BLOCKS * BLOCK_LEN, 0, &kv), "orb_host_memory_alloc");
    uint8_t *bytes = orb_host_memory_data(kv);
    for (size_t b = 0; b < BLOCKS; b++)
        for (size_t i = 0; i < BLOCK_LEN; i++)
            bytes[b * BLOCK_LEN + i] = block_byte(b, i);
    check(orb_register_host_memory(engine, kv, 0, (size_t)BLOCKS * BLOCK_LEN, ORB_PERM_REMOTE_READ, &kv_id),
          "orb_register_host_memory");

    /* Publish after registering: the entry carries the regions as they are now. */
    orb_directory *dir = open_directory(endpoints, prefix);
    check(orb_directory_publish(dir, "prefill-0", engine), "orb_directory_publish");

    char byte;
    ssize_t n = read(done, &byte, 1);
    expect(n == 1, "decode reported its end");

    orb_directory_close(dir); /* withdraws "prefill-0" */
    check(orb_unregister_memory(engine, kv_id), "orb_unregister_memory");
    check(orb_engine_close(engine, TIMEOUT_NS), "orb_engine_close");
    orb_engine_free(engine);
    orb_host_memory_unref(kv);
    return EXIT_SUCCESS;
}

static int run_decode(const char *endpoints, const char *prefix)
{
    role = "decode";
    orb_directory *dir = open_directory(endpoints, prefix);

    /* Wait for the name: the entry now if prefill already published, else its publication. */
    static struct orb_directory_entry entry; /* large (regions): not on the stack */
    int deleted = 1;
    check(orb_directory_watch(dir, "prefill-0", 0, 4 * TIMEOUT_NS, &entry, &deleted), "orb_directory_watch");
    expect(deleted == 0, "the entry is there");
    expect(entry.nregions == 1, "prefill published one region");
    expect(entry.regions[0].length == (uint64_t)BLOCKS * BLOCK_LEN, "the region holds every block");

    struct orb_engine_config cfg;
    orb_engine *engine = NULL;
    orb_host_memory *local = NULL;
    orb_reg_id local_id;
    orb_segment *segment = NULL;
    check(orb_engine_config_init(&cfg), "orb_engine_config_init");
    cfg.enable_source = 0;
    check(orb_engine_create(&cfg, &engine), "orb_engine_create");
    check(orb_host_memory_alloc((size_t)BLOCKS * BLOCK_LEN, 0, &local), "orb_host_memory_alloc");
    check(orb_register_host_memory(engine, local, 0, (size_t)BLOCKS * BLOCK_LEN, ORB_PERM_LOCAL, &local_id),
          "orb_register_host_memory");

    /* The entry is a hint; the segment proves prefill's epoch (a stale entry: ORB_ESTALE). */
    check(orb_open_segment(engine, entry.endpoint, &entry.epoch, TIMEOUT_NS, &segment), "orb_open_segment");

    uint8_t *bytes = orb_host_memory_data(local);
    struct orb_request reqs[BLOCKS];
    for (size_t b = 0; b < BLOCKS; b++)
        reqs[b] = (struct orb_request){
            .op = ORB_OP_READ,
            .local_addr = (uint64_t)(uintptr_t)(bytes + b * BLOCK_LEN),
            .remote_addr = entry.regions[0].addr + b * BLOCK_LEN,
            .length = BLOCK_LEN,
        };
    struct orb_batch_report report;
    check(orb_submit_and_wait(engine, segment, reqs, BLOCKS, NULL, TIMEOUT_NS, &report), "orb_submit_and_wait");
    expect(report.status == ORB_OK && report.completed_bytes == (uint64_t)BLOCKS * BLOCK_LEN, "every block came");
    for (size_t b = 0; b < BLOCKS; b++)
        for (size_t i = 0; i < BLOCK_LEN; i++)
            expect(bytes[b * BLOCK_LEN + i] == block_byte(b, i), "block contents");

    orb_segment_close(segment);
    check(orb_unregister_memory(engine, local_id), "orb_unregister_memory");
    check(orb_engine_close(engine, TIMEOUT_NS), "orb_engine_close");
    orb_engine_free(engine);
    orb_host_memory_unref(local);
    orb_directory_close(dir);
    printf("decode: read %u blocks of %u bytes from %s (host %s)\n", BLOCKS, BLOCK_LEN, entry.endpoint, entry.host);
    return EXIT_SUCCESS;
}

int main(void)
{
    const char *endpoints = getenv("ORBITE_ETCD_ENDPOINTS");
    const char *prefix = getenv("ORBITE_ETCD_PREFIX");
    if (endpoints == NULL || endpoints[0] == '\0') {
        fprintf(stderr, "cluster_directory: set ORBITE_ETCD_ENDPOINTS to an etcd's client URLs\n");
        return 77;
    }
    int done[2];
    if (pipe(done) != 0) {
        perror("pipe");
        return EXIT_FAILURE;
    }
    /* Decode starts first here, on purpose: it waits for the name to appear. */
    pid_t prefill = fork();
    if (prefill < 0) {
        perror("fork");
        return EXIT_FAILURE;
    }
    if (prefill == 0) {
        close(done[1]);
        usleep(200 * 1000);
        _exit(run_prefill(endpoints, prefix, done[0]));
    }
    close(done[0]);
    int rc = run_decode(endpoints, prefix);
    if (write(done[1], "x", 1) != 1)
        rc = EXIT_FAILURE;
    close(done[1]);
    int status = 0;
    if (waitpid(prefill, &status, 0) != prefill || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "cluster_directory: prefill failed (status %d)\n", status);
        rc = EXIT_FAILURE;
    }
    return rc;
}
