/* Shared priority slots for the RDMA transport (shared_quota_shm_path): the helper creates the
 * slot object and publishes it; this engine maps it read-only, validates it (lib/topo/slots.h)
 * and gates its payload posts by it. Completions, receives, binds and ACKs are never gated. */
#include "rdma/rdma_data.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "helper/helper_client.h"
#include "rdma/rdma_transport.h"

int rdma_slots_attach(struct orb_rdma_tp *tp)
{
    const char *path = tp->cfg->shared_quota_shm_path;
    if (path == NULL || path[0] == '\0')
        return 0; /* local scheduling */
    if (tp->disc.helper == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: shared_quota_shm_path %s needs orbite-helper, which creates and "
                        "publishes the slot object (the engine runs without it)", path);
    uint64_t interval = tp->cfg->slot_rotation_interval_ns;
    int fd = -1;
    int rc = orb_helper_slot_attach(tp->disc.helper, path + 1, interval, &fd);
    if (rc != 0)
        return orb_fail_wrap(rc, "rdma: the shared slot object %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < ORB_SLOTS_HEADER_SIZE) {
        (void)close(fd);
        return orb_fail(ORB_EPROTO, "rdma: the shared slot object %s is shorter than its header", path);
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    (void)close(fd);
    if (map == MAP_FAILED)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: cannot map the shared slot object %s: %s", path, strerror(err));
    struct orb_clock_domain mine;
    rc = orb_clock_domain_current(&mine);
    if (rc == 0)
        rc = orb_slots_reader_open(map, len, &mine, interval, 0, &tp->slots);
    if (rc != 0) {
        (void)munmap(map, len);
        return orb_fail_wrap(rc, "rdma: the shared slot object %s", path);
    }
    tp->slots_map = map;
    tp->slots_len = len;
    ORB_LOGI("rdma: payload posts follow the shared priority slots of %s (%llu us each)", path,
             (unsigned long long)(interval / 1000u));
    return 0;
}

void rdma_slots_detach(struct orb_rdma_tp *tp)
{
    if (tp->slots_map != NULL)
        (void)munmap(tp->slots_map, tp->slots_len);
    tp->slots_map = NULL;
}

bool rdma_slots_allow(struct orb_rdma_tp *tp, unsigned priority, uint64_t now_ns, uint64_t *retry_ns)
{
    if (tp->slots_map == NULL || orb_slots_can_send(&tp->slots, priority, now_ns))
        return true;
    /* The next interval may admit it (or its promotion). */
    uint64_t interval = tp->slots.interval_ns;
    *retry_ns = (now_ns / interval + 1) * interval;
    atomic_fetch_add(&tp->slot_deferrals, 1);
    return false;
}
