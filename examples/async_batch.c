/*
 * async_batch: an asynchronous batch of several request groups, finished by a notification.
 *
 * The source publishes two ranges registered in one all-or-nothing call: an inbox peers may
 * WRITE, and an outbox they may only READ. The requester opens a batch, submits three groups
 * (two WRITE groups into the inbox at different priorities, one READ group from the outbox),
 * seals it with a notification, polls it once without blocking, then waits for it. The source
 * picks the notification up with orb_engine_poll_notifications(): once it is there, every byte
 * of the batch is in place.
 */
#include <orbite/orbite.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_LEN (256u << 10)
#define CHUNKS 8u
#define AREA_LEN (CHUNKS * CHUNK_LEN) /* inbox, outbox and each half of the local buffer */
#define TIMEOUT_NS (10ull * 1000 * 1000 * 1000)

static const char NOTE[] = "kv-block-42 ready";

static void check(int status, const char *what)
{
    if (status != ORB_OK) {
        fprintf(stderr, "async_batch: %s failed: %s (%s)\n", what, orb_strerror(status), orb_last_error());
        exit(EXIT_FAILURE);
    }
}

static void expect(int condition, const char *what)
{
    if (!condition) {
        fprintf(stderr, "async_batch: check failed: %s\n", what);
        exit(EXIT_FAILURE);
    }
}

static uint64_t addr_of(const uint8_t *p)
{
    return (uint64_t)(uintptr_t)p;
}

/* One request per chunk: chunk i of `local` <-> chunk i of `remote`. */
static void make_group(struct orb_request *reqs, size_t first, size_t count, enum orb_op op,
                       enum orb_priority priority, const uint8_t *local, const uint8_t *remote)
{
    for (size_t i = 0; i < count; i++) {
        size_t chunk = first + i;
        reqs[i] = (struct orb_request){
            .op = op,
            .priority = priority,
            .local_addr = addr_of(local + chunk * CHUNK_LEN),
            .remote_addr = addr_of(remote + chunk * CHUNK_LEN),
            .length = CHUNK_LEN,
        };
    }
}

int main(void)
{
    static struct orb_notification_msg received[4];
    struct orb_engine_config cfg;
    orb_engine *source = NULL, *requester = NULL;
    orb_host_memory *remote_mem = NULL, *local_mem = NULL;
    orb_reg_id remote_ids[2], local_id;
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch source_epoch, requester_epoch;
    orb_segment *segment = NULL;
    orb_batch *batch = NULL;
    struct orb_batch_report report;
    struct orb_request group[CHUNKS];
    size_t count = 0;

    /* Source: one allocation, published as an inbox (READ/WRITE) and an outbox (READ only). */
    check(orb_engine_config_init(&cfg), "orb_engine_config_init");
    check(orb_engine_create(&cfg, &source), "orb_engine_create (source)");
    check(orb_host_memory_alloc(2 * AREA_LEN, 0, &remote_mem), "orb_host_memory_alloc (source)");
    uint8_t *inbox = orb_host_memory_data(remote_mem);
    uint8_t *outbox = inbox + AREA_LEN;
    for (size_t i = 0; i < AREA_LEN; i++)
        outbox[i] = (uint8_t)(i * 13 + 5);
    const struct orb_host_range ranges[2] = {
        {.owner = remote_mem, .offset = 0, .length = AREA_LEN, .perm = ORB_PERM_REMOTE_WRITE},
        {.owner = remote_mem, .offset = AREA_LEN, .length = AREA_LEN, .perm = ORB_PERM_REMOTE_READ},
    };
    check(orb_register_host_memory_batch(source, ranges, 2, remote_ids), "orb_register_host_memory_batch");
    check(orb_engine_endpoint(source, endpoint, sizeof endpoint), "orb_engine_endpoint");
    check(orb_engine_source_epoch(source, &source_epoch), "orb_engine_source_epoch (source)");

    /* Requester: local buffer, first half sent to the inbox, second half filled from the outbox. */
    check(orb_engine_config_init(&cfg), "orb_engine_config_init");
    cfg.enable_source = 0;
    check(orb_engine_create(&cfg, &requester), "orb_engine_create (requester)");
    check(orb_engine_source_epoch(requester, &requester_epoch), "orb_engine_source_epoch (requester)");
    check(orb_host_memory_alloc(2 * AREA_LEN, 0, &local_mem), "orb_host_memory_alloc (local)");
    check(orb_register_host_memory(requester, local_mem, 0, 2 * AREA_LEN, ORB_PERM_LOCAL, &local_id),
          "orb_register_host_memory (local)");
    uint8_t *to_send = orb_host_memory_data(local_mem);
    uint8_t *to_receive = to_send + AREA_LEN;
    for (size_t i = 0; i < AREA_LEN; i++)
        to_send[i] = (uint8_t)(i * 3 + 1);

    check(orb_open_segment(requester, endpoint, &source_epoch, TIMEOUT_NS, &segment), "orb_open_segment");
    check(orb_batch_open(requester, segment, &batch), "orb_batch_open");

    /* A group whose local range is not registered is refused as a whole; nothing of it runs. */
    static uint8_t unregistered[CHUNK_LEN];
    struct orb_request bad = {.op = ORB_OP_WRITE, .local_addr = addr_of(unregistered),
                              .remote_addr = addr_of(inbox), .length = CHUNK_LEN};
    expect(orb_batch_submit(batch, &bad, 1) == ORB_ENOENT, "an unregistered local range is refused");

    /* Three groups; each starts as soon as it is submitted. */
    make_group(group, 0, CHUNKS / 2, ORB_OP_WRITE, ORB_PRIORITY_HIGH, to_send, inbox);
    check(orb_batch_submit(batch, group, CHUNKS / 2), "orb_batch_submit (WRITE, high)");
    make_group(group, CHUNKS / 2, CHUNKS / 2, ORB_OP_WRITE, ORB_PRIORITY_LOW, to_send, inbox);
    check(orb_batch_submit(batch, group, CHUNKS / 2), "orb_batch_submit (WRITE, low)");
    make_group(group, 0, CHUNKS, ORB_OP_READ, ORB_PRIORITY_MEDIUM, to_receive, outbox);
    check(orb_batch_submit(batch, group, CHUNKS), "orb_batch_submit (READ, medium)");

    /* Seal: no more groups; the notification goes out once every request has completed. */
    const struct orb_notification note = {.data = NOTE, .length = sizeof NOTE};
    check(orb_batch_seal(batch, &note), "orb_batch_seal");
    expect(orb_batch_submit(batch, group, 1) == ORB_EBUSY, "a sealed batch takes no more groups");

    /* A non-blocking look: still running (ORB_EAGAIN) or already finished (0). */
    int status = orb_batch_poll(batch, &report);
    expect(status == ORB_EAGAIN || status == ORB_OK, "poll reports running or success");
    expect(report.submitted_requests == 2 * CHUNKS, "poll counts every submitted request");
    printf("async_batch: poll: %s, %zu of %zu requests done\n",
           status == ORB_EAGAIN ? "running" : "finished", report.completed_requests,
           report.submitted_requests);

    check(orb_batch_wait(batch, TIMEOUT_NS, &report), "orb_batch_wait");
    expect(report.done == 1 && report.status == ORB_OK && !report.has_failure, "the batch succeeded");
    expect(report.completed_requests == 2 * CHUNKS, "every request completed");
    expect(report.completed_bytes == 2ull * AREA_LEN, "every byte was moved");
    expect(report.notification == ORB_NOTIFY_DELIVERED && report.notification_status == ORB_OK,
           "the notification was delivered");
    expect(report.local_drained == 1, "local memory is no longer in use");
    expect(orb_batch_poll(batch, &report) == ORB_OK, "poll after the end returns the final status");
    check(orb_batch_free(batch), "orb_batch_free");

    expect(memcmp(inbox, to_send, AREA_LEN) == 0, "the inbox holds the written chunks");
    expect(memcmp(to_receive, outbox, AREA_LEN) == 0, "the READ chunks arrived");

    /* The source side: a delivered notification is already queued. */
    check(orb_engine_poll_notifications(source, received, 4, &count), "orb_engine_poll_notifications");
    expect(count == 1, "exactly one notification is queued");
    expect(received[0].length == sizeof NOTE && memcmp(received[0].data, NOTE, sizeof NOTE) == 0,
           "the notification carries the sealed payload");
    expect(memcmp(&received[0].sender, &requester_epoch, sizeof requester_epoch) == 0,
           "the notification names the requester's epoch");
    check(orb_engine_poll_notifications(source, received, 4, &count), "orb_engine_poll_notifications");
    expect(count == 0, "a notification is taken only once");
    printf("async_batch: source received \"%s\"\n", (const char *)received[0].data);

    orb_segment_close(segment);
    check(orb_unregister_memory(requester, local_id), "orb_unregister_memory (local)");
    check(orb_unregister_memory(source, remote_ids[0]), "orb_unregister_memory (inbox)");
    check(orb_unregister_memory(source, remote_ids[1]), "orb_unregister_memory (outbox)");
    orb_engine_free(requester);
    orb_engine_free(source);
    orb_host_memory_unref(local_mem);
    orb_host_memory_unref(remote_mem);
    return EXIT_SUCCESS;
}
