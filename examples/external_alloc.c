/*
 * external_alloc: registering memory that the application allocated itself.
 *
 * Two ways to hand bytes to OrbiTE, each with a release callback that munmaps them:
 *  - source side: orb_host_memory_wrap() makes a reference-counted owner of an mmap'd buffer;
 *    the registration retains the owner, so the application can drop its own reference at once;
 *  - requester side: orb_register_memory() transfers ownership of a second mmap'd buffer
 *    directly to the engine.
 * The program moves data through both buffers, then checks that each release callback ran
 * exactly once, and only after the buffer was unregistered and the engines were freed.
 */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#endif
#include <orbite/orbite.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BUFFER_LEN (1u << 20)
#define TIMEOUT_NS (10ull * 1000 * 1000 * 1000)

/* What a release callback records. Callbacks may run on an OrbiTE thread, hence the atomics. */
struct mapping {
    void *expected_ptr;
    size_t expected_len;
    atomic_int releases;      /* times the callback ran */
    atomic_int munmap_failed; /* 1 if the callback saw a wrong range or munmap failed */
};

static void release_mapping(void *ptr, size_t len, void *ctx)
{
    struct mapping *m = ctx;
    if (ptr != m->expected_ptr || len != m->expected_len || munmap(ptr, len) != 0)
        atomic_store(&m->munmap_failed, 1);
    atomic_fetch_add(&m->releases, 1);
}

static void check(int status, const char *what)
{
    if (status != ORB_OK) {
        fprintf(stderr, "external_alloc: %s failed: %s (%s)\n", what, orb_strerror(status),
                orb_last_error());
        exit(EXIT_FAILURE);
    }
}

static void expect(int condition, const char *what)
{
    if (!condition) {
        fprintf(stderr, "external_alloc: check failed: %s\n", what);
        exit(EXIT_FAILURE);
    }
}

static void *map_buffer(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("external_alloc: mmap");
        exit(EXIT_FAILURE);
    }
    return p;
}

static void transfer(orb_engine *requester, orb_segment *segment, enum orb_op op, void *local,
                     void *remote, size_t len)
{
    struct orb_request req = {
        .op = op,
        .local_addr = (uint64_t)(uintptr_t)local,
        .remote_addr = (uint64_t)(uintptr_t)remote,
        .length = len,
    };
    struct orb_batch_report report;
    check(orb_submit_and_wait(requester, segment, &req, 1, NULL, TIMEOUT_NS, &report),
          op == ORB_OP_WRITE ? "orb_submit_and_wait (WRITE)" : "orb_submit_and_wait (READ)");
    expect(report.done && report.completed_requests == 1 && report.completed_bytes == len,
           "the report counts the whole request");
}

int main(void)
{
    static struct mapping source_map;
    static struct mapping local_map;
    struct orb_engine_config cfg;
    orb_engine *source = NULL, *requester = NULL;
    orb_host_memory *owner = NULL;
    orb_reg_id source_id, local_id;
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    orb_segment *segment = NULL;
    struct orb_local_region region;

    check(orb_engine_config_init(&cfg), "orb_engine_config_init");
    check(orb_engine_create(&cfg, &source), "orb_engine_create (source)");
    check(orb_engine_config_init(&cfg), "orb_engine_config_init");
    cfg.enable_source = 0;
    check(orb_engine_create(&cfg, &requester), "orb_engine_create (requester)");

    /* Source: wrap an mmap'd buffer in an owner; the registration takes its own reference, so
     * ours can go right away. From here on the engine decides when the bytes are released. */
    uint8_t *source_bytes = map_buffer(BUFFER_LEN);
    source_map.expected_ptr = source_bytes;
    source_map.expected_len = BUFFER_LEN;
    check(orb_host_memory_wrap(source_bytes, BUFFER_LEN, release_mapping, &source_map, &owner),
          "orb_host_memory_wrap");
    expect(orb_host_memory_data(owner) == source_bytes, "the owner points at the mapping");
    expect(orb_host_memory_size(owner) == BUFFER_LEN, "the owner has the mapping's length");
    check(orb_register_host_memory(source, owner, 0, BUFFER_LEN, ORB_PERM_REMOTE_WRITE, &source_id),
          "orb_register_host_memory");
    orb_host_memory_unref(owner);
    owner = NULL;
    expect(atomic_load(&source_map.releases) == 0, "the registration keeps the wrapped mapping alive");

    /* Requester: hand a second mapping straight to the engine. On success the engine owns it. */
    uint8_t *local_bytes = map_buffer(BUFFER_LEN);
    local_map.expected_ptr = local_bytes;
    local_map.expected_len = BUFFER_LEN;
    check(orb_register_memory(requester, local_bytes, BUFFER_LEN, ORB_PERM_LOCAL, release_mapping,
                              &local_map, &local_id),
          "orb_register_memory");

    /* Any address inside a registration resolves to it. */
    check(orb_resolve_local_address(requester, (uint64_t)(uintptr_t)(local_bytes + 100), 4096, &region),
          "orb_resolve_local_address");
    expect(region.id == local_id && region.base == (uint64_t)(uintptr_t)local_bytes &&
               region.length == BUFFER_LEN && region.perm == ORB_PERM_LOCAL,
           "the resolved region is the local registration");

    check(orb_engine_endpoint(source, endpoint, sizeof endpoint), "orb_engine_endpoint");
    check(orb_engine_source_epoch(source, &epoch), "orb_engine_source_epoch");
    check(orb_open_segment(requester, endpoint, &epoch, TIMEOUT_NS, &segment), "orb_open_segment");

    /* WRITE local -> source, then change the source bytes and READ them back. */
    for (size_t i = 0; i < BUFFER_LEN; i++)
        local_bytes[i] = (uint8_t)(i * 7 + 3);
    transfer(requester, segment, ORB_OP_WRITE, local_bytes, source_bytes, BUFFER_LEN);
    expect(memcmp(source_bytes, local_bytes, BUFFER_LEN) == 0, "the source mapping holds the written bytes");

    for (size_t i = 0; i < BUFFER_LEN; i++)
        source_bytes[i] = (uint8_t)~source_bytes[i];
    transfer(requester, segment, ORB_OP_READ, local_bytes, source_bytes, BUFFER_LEN);
    for (size_t i = 0; i < BUFFER_LEN; i++)
        expect(local_bytes[i] == (uint8_t)~(uint8_t)(i * 7 + 3), "READ returned the source bytes");

    expect(atomic_load(&source_map.releases) == 0 && atomic_load(&local_map.releases) == 0,
           "registered bytes are not released while registered");

    /* Teardown. After the last unregister no new request can reach the bytes; the callbacks
     * run once admitted work (none is left here) has drained, at the latest by engine free. */
    orb_segment_close(segment);
    check(orb_unregister_memory(requester, local_id), "orb_unregister_memory (local)");
    check(orb_unregister_memory(source, source_id), "orb_unregister_memory (source)");
    expect(orb_unregister_memory(source, source_id) == ORB_ENOENT, "a retired id is unknown");
    orb_engine_free(requester);
    orb_engine_free(source);

    expect(atomic_load(&local_map.releases) == 1, "the registered mapping was released exactly once");
    expect(atomic_load(&source_map.releases) == 1, "the wrapped mapping was released exactly once");
    expect(atomic_load(&local_map.munmap_failed) == 0, "the registered mapping was unmapped");
    expect(atomic_load(&source_map.munmap_failed) == 0, "the wrapped mapping was unmapped");

    printf("external_alloc: both mappings moved %u bytes and were released once\n", BUFFER_LEN);
    return EXIT_SUCCESS;
}
