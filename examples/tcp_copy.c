/*
 * tcp_copy: the smallest complete OrbiTE program.
 *
 * One process plays both roles over loopback TCP:
 *  - a source engine publishes a 4 MiB buffer that peers may READ and WRITE;
 *  - a requester engine (no listener of its own) opens a segment to it, proving the source's
 *    identity with its epoch, WRITEs a pattern into the source buffer and READs it back.
 * Every step is checked; the program exits non-zero with OrbiTE's message on any failure.
 */
#include <orbite/orbite.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUFFER_LEN (4u << 20)
#define TIMEOUT_NS (10ull * 1000 * 1000 * 1000)

/* Exit with the call's status and the thread's detail message when `status` is a failure. */
static void check(int status, const char *what)
{
    if (status != ORB_OK) {
        fprintf(stderr, "tcp_copy: %s failed: %s (%s)\n", what, orb_strerror(status), orb_last_error());
        exit(EXIT_FAILURE);
    }
}

static void expect(int condition, const char *what)
{
    if (!condition) {
        fprintf(stderr, "tcp_copy: check failed: %s\n", what);
        exit(EXIT_FAILURE);
    }
}

static void fill_pattern(uint8_t *buf, size_t len, uint8_t seed)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(seed + i * 31 + (i >> 12));
}

static void expect_report(const struct orb_batch_report *report, size_t requests, uint64_t bytes)
{
    expect(report->done == 1, "report is done");
    expect(report->status == ORB_OK && !report->has_failure, "report has no failure");
    expect(report->submitted_requests == requests, "every request was submitted");
    expect(report->completed_requests == requests, "every request completed");
    expect(report->completed_bytes == bytes, "every byte was moved");
    expect(report->notification == ORB_NOTIFY_NONE, "no notification was asked for");
    expect(report->local_drained == 1, "local memory is no longer in use");
}

int main(void)
{
    struct orb_engine_config cfg;
    orb_engine *source = NULL, *requester = NULL;
    orb_host_memory *source_mem = NULL, *local_mem = NULL;
    orb_reg_id source_id, local_id;
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch, wrong_epoch;
    orb_segment *segment = NULL, *stale = NULL;
    struct orb_region_desc *regions = NULL;
    size_t region_count = 0;
    struct orb_batch_report report;

    /* Source: the default configuration listens on 127.0.0.1 with a kernel-chosen port. */
    check(orb_engine_config_init(&cfg), "orb_engine_config_init");
    check(orb_engine_create(&cfg, &source), "orb_engine_create (source)");
    check(orb_host_memory_alloc(BUFFER_LEN, 0, &source_mem), "orb_host_memory_alloc (source)");
    check(orb_register_host_memory(source, source_mem, 0, BUFFER_LEN, ORB_PERM_REMOTE_WRITE, &source_id),
          "orb_register_host_memory (source)");
    uint8_t *source_bytes = orb_host_memory_data(source_mem);

    /* What the requester must learn from the source's owner: where it listens and which
     * engine lifetime it is. */
    check(orb_engine_endpoint(source, endpoint, sizeof endpoint), "orb_engine_endpoint");
    check(orb_engine_source_epoch(source, &epoch), "orb_engine_source_epoch");

    /* Requester: no listener. Its local buffer holds the data to WRITE (first half) and
     * receives the READ (second half). */
    check(orb_engine_config_init(&cfg), "orb_engine_config_init");
    cfg.enable_source = 0;
    check(orb_engine_create(&cfg, &requester), "orb_engine_create (requester)");
    check(orb_host_memory_alloc(2 * (size_t)BUFFER_LEN, 0, &local_mem), "orb_host_memory_alloc (local)");
    check(orb_register_host_memory(requester, local_mem, 0, 2 * (size_t)BUFFER_LEN, ORB_PERM_LOCAL,
                                   &local_id),
          "orb_register_host_memory (local)");
    uint8_t *local_bytes = orb_host_memory_data(local_mem);

    /* An epoch the source does not run is refused: an endpoint alone grants no authority. */
    wrong_epoch = epoch;
    wrong_epoch.bytes[0] ^= 0x80;
    int status = orb_open_segment(requester, endpoint, &wrong_epoch, TIMEOUT_NS, &stale);
    expect(status == ORB_ESTALE, "a wrong epoch is refused with ORB_ESTALE");
    expect(stale == NULL, "no segment is returned for a wrong epoch");

    check(orb_open_segment(requester, endpoint, &epoch, TIMEOUT_NS, &segment), "orb_open_segment");

    /* The source publishes exactly the one remotely accessible region. */
    check(orb_segment_describe(segment, TIMEOUT_NS, &regions, &region_count), "orb_segment_describe");
    expect(region_count == 1, "the source publishes one region");
    expect(regions[0].addr == (uint64_t)(uintptr_t)source_bytes, "region address");
    expect(regions[0].length == BUFFER_LEN, "region length");
    expect(regions[0].perm == ORB_PERM_REMOTE_WRITE, "region permission");
    orb_region_descs_free(regions);

    /* WRITE: local first half -> source buffer. */
    fill_pattern(local_bytes, BUFFER_LEN, 7);
    struct orb_request write_req = {
        .transport = ORB_TRANSPORT_TCP,
        .op = ORB_OP_WRITE,
        .local_addr = (uint64_t)(uintptr_t)local_bytes,
        .remote_addr = (uint64_t)(uintptr_t)source_bytes,
        .length = BUFFER_LEN,
    };
    check(orb_submit_and_wait(requester, segment, &write_req, 1, NULL, TIMEOUT_NS, &report),
          "orb_submit_and_wait (WRITE)");
    expect_report(&report, 1, BUFFER_LEN);
    expect(memcmp(source_bytes, local_bytes, BUFFER_LEN) == 0, "source holds the written bytes");

    /* READ: source buffer -> local second half, in two requests of half the length each. */
    memset(local_bytes + BUFFER_LEN, 0, BUFFER_LEN);
    struct orb_request read_reqs[2];
    for (size_t i = 0; i < 2; i++) {
        read_reqs[i] = (struct orb_request){
            .op = ORB_OP_READ,
            .local_addr = (uint64_t)(uintptr_t)(local_bytes + BUFFER_LEN + i * (BUFFER_LEN / 2)),
            .remote_addr = (uint64_t)(uintptr_t)(source_bytes + i * (BUFFER_LEN / 2)),
            .length = BUFFER_LEN / 2,
        };
    }
    check(orb_submit_and_wait(requester, segment, read_reqs, 2, NULL, TIMEOUT_NS, &report),
          "orb_submit_and_wait (READ)");
    expect_report(&report, 2, BUFFER_LEN);
    expect(memcmp(local_bytes + BUFFER_LEN, local_bytes, BUFFER_LEN) == 0, "READ returned the written bytes");

    /* Teardown: handles first, then registrations, then engines. The owners' memory is released
     * when the last reference (ours or a registration's) goes. */
    orb_segment_close(segment);
    check(orb_unregister_memory(requester, local_id), "orb_unregister_memory (local)");
    check(orb_unregister_memory(source, source_id), "orb_unregister_memory (source)");
    check(orb_engine_close(requester, TIMEOUT_NS), "orb_engine_close (requester)");
    check(orb_engine_close(source, TIMEOUT_NS), "orb_engine_close (source)");
    orb_engine_free(requester);
    orb_engine_free(source);
    orb_host_memory_unref(local_mem);
    orb_host_memory_unref(source_mem);

    printf("tcp_copy: wrote and read back %u bytes over %s\n", BUFFER_LEN, endpoint);
    return EXIT_SUCCESS;
}
