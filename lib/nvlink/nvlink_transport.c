/* The NVLink (CUDA IPC) transport's operation table, start and stop. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "nvlink/nvlink_internal.h"

static pthread_once_t g_self_once = PTHREAD_ONCE_INIT;
static struct orb_nvl_hello g_self;
static int g_self_rc;

/* The kernel's boot id, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as 16 bytes. */
static int read_boot_id(uint8_t out[ORB_NVL_ID_LEN])
{
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char text[64];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n < 32)
        return -1;
    text[n] = '\0';
    size_t k = 0;
    for (ssize_t i = 0; i < n && k < 2 * ORB_NVL_ID_LEN; i++) {
        char c = text[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0)
            continue;
        out[k / 2] = (uint8_t)(k % 2 == 0 ? v << 4 : out[k / 2] | v);
        k++;
    }
    return k == 2 * ORB_NVL_ID_LEN ? 0 : -1;
}

static void self_init(void)
{
    if (read_boot_id(g_self.boot) != 0) {
        g_self_rc = orb_fail(ORB_EUNAVAILABLE, "nvlink: /proc/sys/kernel/random/boot_id cannot be read: this "
                             "host cannot be told from another");
        return;
    }
    struct stat st;
    if (stat("/proc/self/ns/ipc", &st) != 0) {
        g_self_rc = orb_fail(ORB_EUNAVAILABLE, "nvlink: /proc/self/ns/ipc cannot be read");
        return;
    }
    g_self.ipc_namespace = ((uint64_t)st.st_dev << 32) ^ (uint64_t)st.st_ino;
}

int nvl_self_hello(struct orb_nvl_hello *out)
{
    pthread_once(&g_self_once, self_init);
    if (g_self_rc != 0)
        return orb_fail(g_self_rc, "nvlink: this process's identity is unknown");
    *out = g_self;
    return 0;
}

static pthread_mutex_t g_tps_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nvl_tp *g_tps;

bool nvl_source_in_this_process(const struct orb_epoch *epoch, const char *endpoint)
{
    bool found = false;
    pthread_mutex_lock(&g_tps_lock);
    for (const struct nvl_tp *t = g_tps; t != NULL && !found; t = t->next_in_process)
        found = t->endpoint[0] != '\0' && strcmp(t->endpoint, endpoint) == 0 &&
                memcmp(t->epoch.bytes, epoch->bytes, sizeof epoch->bytes) == 0;
    pthread_mutex_unlock(&g_tps_lock);
    return found;
}

void nvl_wait_locked(struct nvl_tp *tp, uint64_t deadline)
{
    if (deadline == ORB_DEADLINE_NONE)
        pthread_cond_wait(&tp->changed, &tp->lock);
    else {
        struct timespec ts = orb_deadline_timespec(deadline);
        pthread_cond_timedwait(&tp->changed, &tp->lock, &ts);
    }
}

static void tp_free(struct nvl_tp *tp)
{
    pthread_mutex_destroy(&tp->policy_lock);
    pthread_mutex_destroy(&tp->lock);
    pthread_cond_destroy(&tp->changed);
    free(tp);
}

static int nvl_start(orb_engine *engine, void **tp_out)
{
    struct nvl_tp *tp = calloc(1, sizeof *tp);
    if (tp == NULL)
        return orb_fail(ORB_ENOMEM, "nvlink: out of memory for the transport");
    tp->engine = engine;
    uint32_t io_s = orb_engine_cfg(engine)->io_timeout_s;
    tp->lease_ns = (uint64_t)(io_s > 0 ? io_s : 30) * 1000000000ull;
    atomic_init(&tp->stopping, false);
    atomic_init(&tp->inflight, 0);
    atomic_init(&tp->chan_quit, false);
    tp->chan_fd = -1;
    pthread_mutex_init(&tp->lock, NULL);
    pthread_mutex_init(&tp->policy_lock, NULL);
    if (orb_cond_init_monotonic(&tp->changed) != 0) {
        pthread_mutex_destroy(&tp->policy_lock);
        pthread_mutex_destroy(&tp->lock);
        free(tp);
        return orb_fail(ORB_ENOMEM, "nvlink: cannot make the transport's condition variable");
    }
    int rc = nvl_self_hello(&tp->self);
    if (rc != 0) {
        tp_free(tp);
        return ORB_TP_NOT_HERE;
    }
    if ((rc = nvl_source_start(tp)) != 0) {
        tp_free(tp);
        return rc;
    }
    /* The TCP transport started first: its endpoint is bound already. */
    tp->epoch = *orb_engine_epoch(engine);
    if (orb_engine_cfg(engine)->enable_source && orb_engine_endpoint(engine, tp->endpoint, sizeof tp->endpoint) != 0)
        tp->endpoint[0] = '\0';
    pthread_mutex_lock(&g_tps_lock);
    tp->next_in_process = g_tps;
    g_tps = tp;
    pthread_mutex_unlock(&g_tps_lock);
    *tp_out = tp;
    return 0;
}

static void nvl_close_source(void *tp)
{
    (void)tp; /* the engine's source flag fences control messages (orb_engine_control) */
}

static int nvl_stop(void *tp_, uint64_t deadline)
{
    struct nvl_tp *tp = tp_;
    /* Groups held here end when their requesters' copies do, or with their leases. */
    int rc = nvl_source_stop(tp, deadline);
    int rq = nvl_requester_stop(tp, deadline);
    return rc != 0 ? rc : rq;
}

static void nvl_destroy(void *tp_)
{
    struct nvl_tp *tp = tp_;
    pthread_mutex_lock(&g_tps_lock);
    for (struct nvl_tp **pp = &g_tps; *pp != NULL; pp = &(*pp)->next_in_process)
        if (*pp == tp) {
            *pp = tp->next_in_process;
            break;
        }
    pthread_mutex_unlock(&g_tps_lock);
    nvl_requester_free(tp);
    nvl_fdchan_close(tp); /* before the groups go: it reads them */
    nvl_source_free(tp);
    tp_free(tp);
}

static uint64_t nvl_inflight(void *tp_)
{
    struct nvl_tp *tp = tp_;
    return atomic_load(&tp->inflight) + nvl_source_groups(tp);
}

const struct orb_transport_ops orb_nvlink_transport = {
    .id = ORB_TRANSPORT_NVLINK,
    .name = "nvlink",
    .request_private_size = 0,
    .stages_through_cpu = 0,
    .start = nvl_start,
    .endpoint = NULL,
    .close_source = nvl_close_source,
    .stop = nvl_stop,
    .destroy = nvl_destroy,
    .inflight = nvl_inflight,
    .peer_open = nvl_peer_open,
    .peer_plan = nvl_peer_plan,
    .peer_submit = nvl_peer_submit,
    .peer_release = nvl_peer_release,
    .peer_accepts = nvl_peer_accepts,
    .control = nvl_source_control,
};
