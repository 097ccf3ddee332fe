/* The public header is self-contained: it is the first and only include of this file, and every
 * type it declares is usable without anything else. */
#include <orbite/orbite.h>

_Static_assert(sizeof(struct orb_epoch) == 16, "an epoch is 128 bits");
_Static_assert(ORB_EPOCH_HEX_LEN == 2 * sizeof(struct orb_epoch), "hex form is two digits a byte");
_Static_assert(ORB_TIMEOUT_INFINITE == UINT64_MAX, "infinite timeout is the largest value");
_Static_assert(ORB_PERM_REMOTE_WRITE & ORB_PERM_REMOTE_READ, "remote WRITE includes READ");
_Static_assert(ORB_OK == 0 && ORB_EAGAIN < 0, "statuses are zero or negative");

/* Every callback type and handle can be named and stored with only this header. */
static void sink(enum orb_log_level level, const char *message, void *ctx)
{
    (void)level;
    (void)message;
    (void)ctx;
}

static void release(void *ptr, size_t len, void *ctx)
{
    (void)ptr;
    (void)len;
    (void)ctx;
}

int main(void)
{
    orb_log_fn log_fn = sink;
    orb_release_fn release_fn = release;
    orb_engine *engine = NULL;
    orb_segment *segment = NULL;
    orb_batch *batch = NULL;
    orb_host_memory *mem = NULL;
    struct orb_request req = {0};
    struct orb_batch_report report = {0};
    struct orb_notification_msg msg = {0};
    struct orb_engine_config cfg;

    if (orb_engine_config_init(&cfg) != 0)
        return 1;
    if (orb_strerror(ORB_EINVAL) == NULL || orb_last_error() == NULL)
        return 2;
    if (req.op != ORB_OP_READ || req.priority != ORB_PRIORITY_HIGH ||
        req.transport != ORB_TRANSPORT_UNSPEC)
        return 3; /* a zero request is a HIGH-priority READ on the best transport */
    /* The NULL-accepting release calls. */
    orb_engine_free(engine);
    orb_segment_close(segment);
    if (orb_batch_free(batch) != 0)
        return 4;
    orb_host_memory_unref(mem);
    orb_region_descs_free(NULL);
    (void)log_fn;
    (void)release_fn;
    (void)report;
    (void)msg;
    return 0;
}
