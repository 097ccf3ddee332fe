/* orbite-bench: the source side (an engine serving one registered, patterned buffer). */
#include "roles.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pattern.h"

#define SOURCE_CLOSE_TIMEOUT_NS (5ull * 1000000000ull)

struct bench_source {
    orb_engine *engine;
    orb_host_memory *memory; /* our reference; the registration holds another (host memory) */
    orb_cuda_memory *device; /* the same, for device memory (--source-memory cuda) */
    orb_reg_id reg;
    uint64_t size;
};

int bench_engine_config(const struct bench_options *opt, int source, struct orb_engine_config *cfg,
                        char *err, size_t errlen)
{
    int rc = orb_engine_config_init(cfg);
    if (rc != 0) {
        snprintf(err, errlen, "orb_engine_config_init: %s", orb_strerror(rc));
        return -1;
    }
    if (opt->config_json != NULL) {
        rc = orb_engine_config_load_json(cfg, opt->config_json);
        if (rc != 0) {
            snprintf(err, errlen, "--config: %s (%s)", orb_strerror(rc), orb_last_error());
            return -1;
        }
    }
    cfg->enable_source = source;
    if (source && opt->endpoint[0] != '\0')
        snprintf(cfg->endpoint, sizeof cfg->endpoint, "%s", opt->endpoint);
    return 0;
}

int bench_engine_create(const struct bench_options *opt, int source, const struct orb_engine_config *cfg,
                        orb_engine **out, char *err, size_t errlen)
{
    const char *json = source ? opt->rdma_source_json : opt->rdma_requester_json;
    const char *role = source ? "source" : "requester";
    if (json == NULL && (opt->transport == ORB_TRANSPORT_TCP || opt->transport == ORB_TRANSPORT_NVLINK ||
                         opt->transport == ORB_TRANSPORT_SHM)) {
        int rc = orb_engine_create(cfg, out);
        if (rc != 0)
            snprintf(err, errlen, "orb_engine_create (%s): %s (%s)", role, orb_strerror(rc), orb_last_error());
        return rc == 0 ? 0 : -1;
    }
    orb_rdma_config *rdma = NULL;
    int rc = orb_rdma_config_new(&rdma);
    if (rc == 0 && json != NULL)
        rc = orb_rdma_config_load_json(rdma, json);
    if (rc != 0) {
        snprintf(err, errlen, "--rdma (%s): %s (%s)", role, orb_strerror(rc), orb_last_error());
        orb_rdma_config_free(rdma);
        return -1;
    }
    struct orb_engine_params params = {.field_mask = ORB_ENGINE_PARAM_CONFIG | ORB_ENGINE_PARAM_RDMA,
                                       .config = cfg, .rdma = rdma};
    rc = orb_engine_create_params(&params, out);
    orb_rdma_config_free(rdma);
    if (rc != 0) {
        snprintf(err, errlen, "orb_engine_create_params (%s): %s (%s)", role, orb_strerror(rc), orb_last_error());
        return -1;
    }
    return 0;
}

/* The source's buffer in device memory: the pattern copied in, chunk by chunk, before the range
 * is published. */
static int source_device_buffer(const struct bench_options *opt, struct bench_source *src, char *err,
                                size_t errlen)
{
    const size_t chunk = 16u << 20;
    int rc = orb_cuda_memory_alloc(opt->source_device, (size_t)src->size, &src->device);
    if (rc != 0) {
        snprintf(err, errlen, "orb_cuda_memory_alloc(cuda:%d, %llu): %s (%s)", opt->source_device,
                 (unsigned long long)src->size, orb_strerror(rc), orb_last_error());
        return -1;
    }
    uint8_t *staging = malloc(chunk);
    if (staging == NULL) {
        snprintf(err, errlen, "out of memory");
        goto unref_device;
    }
    for (uint64_t off = 0; off < src->size; off += chunk) {
        size_t len = src->size - off < chunk ? (size_t)(src->size - off) : chunk;
        bench_pattern_fill(staging, len, opt->seed, off);
        if ((rc = orb_cuda_memory_copy_in(src->device, (size_t)off, staging, len)) != 0) {
            snprintf(err, errlen, "orb_cuda_memory_copy_in: %s (%s)", orb_strerror(rc), orb_last_error());
            free(staging);
            goto unref_device;
        }
    }
    free(staging);
    rc = orb_register_cuda_memory(src->engine, src->device, 0, (size_t)src->size, ORB_PERM_REMOTE_WRITE, &src->reg);
    if (rc != 0) {
        snprintf(err, errlen, "orb_register_cuda_memory(%llu bytes): %s (%s)", (unsigned long long)src->size,
                 orb_strerror(rc), orb_last_error());
        goto unref_device;
    }
    return 0;

unref_device:
    orb_cuda_memory_unref(src->device);
    src->device = NULL;
    return -1;
}

int bench_source_start(const struct bench_options *opt, uint64_t size, struct bench_source **out,
                       char *err, size_t errlen)
{
    struct orb_engine_config cfg;
    if (bench_engine_config(opt, 1, &cfg, err, errlen) != 0)
        return -1;
    if (size == 0 || size > SIZE_MAX) {
        snprintf(err, errlen, "source buffer size %llu is not usable", (unsigned long long)size);
        return -1;
    }
    struct bench_source *src = calloc(1, sizeof *src);
    if (src == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    src->size = size;
    int rc;
    if (bench_engine_create(opt, 1, &cfg, &src->engine, err, errlen) != 0)
        goto fail_free_struct;
    if (opt->source_device >= 0) {
        if (source_device_buffer(opt, src, err, errlen) != 0)
            goto fail_free_engine;
        *out = src;
        return 0;
    }
    rc = orb_host_memory_alloc((size_t)size, 0, &src->memory);
    if (rc != 0) {
        snprintf(err, errlen, "orb_host_memory_alloc(%llu): %s (%s)", (unsigned long long)size,
                 orb_strerror(rc), orb_last_error());
        goto fail_free_engine;
    }
    /* The pattern goes in before the range is published, so no peer sees partial contents. */
    bench_pattern_fill(orb_host_memory_data(src->memory), (size_t)size, opt->seed, 0);
    rc = orb_register_host_memory(src->engine, src->memory, 0, (size_t)size, ORB_PERM_REMOTE_WRITE,
                                  &src->reg);
    if (rc != 0) {
        snprintf(err, errlen, "orb_register_host_memory(%llu bytes): %s (%s)",
                 (unsigned long long)size, orb_strerror(rc), orb_last_error());
        goto fail_unref_memory;
    }
    *out = src;
    return 0;

fail_unref_memory:
    orb_host_memory_unref(src->memory);
fail_free_engine:
    orb_engine_free(src->engine);
fail_free_struct:
    free(src);
    return -1;
}

int bench_source_identity(const struct bench_source *src, char *endpoint, size_t endpoint_len,
                          char *epoch_hex, size_t epoch_len, char *err, size_t errlen)
{
    struct orb_epoch epoch;
    int rc = orb_engine_endpoint(src->engine, endpoint, endpoint_len);
    if (rc == 0)
        rc = orb_engine_source_epoch(src->engine, &epoch);
    if (rc == 0)
        rc = orb_epoch_format(&epoch, epoch_hex, epoch_len);
    if (rc != 0) {
        snprintf(err, errlen, "source identity: %s (%s)", orb_strerror(rc), orb_last_error());
        return -1;
    }
    return 0;
}

void bench_source_serve(int control_fd, const volatile sig_atomic_t *stop)
{
    char sink[256];
    while (!*stop) {
        struct pollfd pfd = {.fd = control_fd, .events = POLLIN};
        int n = poll(&pfd, 1, 200);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        if (n == 0)
            continue;
        if (pfd.revents & (POLLERR | POLLNVAL))
            return;
        /* Input is ignored; end of file (or POLLHUP with nothing left) ends the service. */
        ssize_t got = read(control_fd, sink, sizeof sink);
        if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN))
            return;
    }
}

int bench_source_stop(struct bench_source *src, char *err, size_t errlen)
{
    if (src == NULL)
        return 0;
    int result = 0;
    int rc = orb_engine_close(src->engine, SOURCE_CLOSE_TIMEOUT_NS);
    if (rc != 0) {
        snprintf(err, errlen, "orb_engine_close (source): %s (%s)", orb_strerror(rc),
                 orb_last_error());
        result = -1;
    }
    orb_engine_free(src->engine);
    orb_host_memory_unref(src->memory);
    orb_cuda_memory_unref(src->device);
    free(src);
    return result;
}
