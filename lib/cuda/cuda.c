/* libcuda.so.1, loaded at run time (see cuda.h). */
#include "cuda/cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/dynlib.h"
#include "core/error.h"
#include "core/log.h"

/* Every export (required), and the optional groups (each all or none). */
static const struct orb_dl_symbol exports[] = {
#define ORB_CUDA_ENTRY(field, export, params) {#export, offsetof(struct orb_cuda, field), true},
    ORB_CUDA_EXPORTS(ORB_CUDA_ENTRY)
};

static const struct orb_dl_symbol vmm_exports[] = {
    ORB_CUDA_VMM_EXPORTS(ORB_CUDA_ENTRY)
};

static const struct orb_dl_symbol dmabuf_exports[] = {
    ORB_CUDA_DMABUF_EXPORTS(ORB_CUDA_ENTRY)
};

static const struct orb_dl_symbol flush_exports[] = {
    ORB_CUDA_FLUSH_EXPORTS(ORB_CUDA_ENTRY)
#undef ORB_CUDA_ENTRY
};

/* An optional group: every export of it into `table`, or none (false: one is missing). */
static bool resolve_group(void *handle, const char *path, const struct orb_dl_symbol *group, size_t n,
                          const char *without, struct orb_cuda *table)
{
    const char *missing = NULL;
    if (orb_dl_group(handle, group, n, table, &missing))
        return true;
    ORB_LOGI("cuda: %s does not export %s: %s", path, missing, without);
    return false;
}

static void resolve_optional(void *handle, const char *path, struct orb_cuda *table)
{
    _Static_assert(sizeof vmm_exports / sizeof vmm_exports[0] <= 16, "a group fits orb_dl_group");
    table->vmm = resolve_group(handle, path, vmm_exports, sizeof vmm_exports / sizeof vmm_exports[0],
                               "allocations made with cuMemCreate are not shared", table);
    table->dmabuf = resolve_group(handle, path, dmabuf_exports, sizeof dmabuf_exports / sizeof dmabuf_exports[0],
                                  "device memory is not registered with NICs by dma-buf", table);
    table->flush = resolve_group(handle, path, flush_exports, sizeof flush_exports / sizeof flush_exports[0],
                                 "devices that do not order GPUDirect writes take no Direct registration", table);
}

int orb_cuda_status(orb_cu_result rc)
{
    switch (rc) {
    case ORB_CU_SUCCESS:
        return 0;
    case ORB_CU_ERROR_OUT_OF_MEMORY:
        return ORB_ENOMEM;
    case ORB_CU_ERROR_INVALID_VALUE:
    case ORB_CU_ERROR_INVALID_DEVICE:
    case ORB_CU_ERROR_INVALID_CONTEXT:
    case ORB_CU_ERROR_INVALID_HANDLE:
        return ORB_EINVAL;
    case ORB_CU_ERROR_NOT_INITIALIZED:
    case ORB_CU_ERROR_DEINITIALIZED:
    case ORB_CU_ERROR_NO_DEVICE:
    case ORB_CU_ERROR_NOT_SUPPORTED:
        return ORB_EUNAVAILABLE;
    case ORB_CU_ERROR_NOT_READY:
        return ORB_EAGAIN;
    default:
        return ORB_EPEER;
    }
}

const char *orb_cuda_describe(const struct orb_cuda *c, orb_cu_result rc, char *buf, size_t cap)
{
    const char *name = NULL, *text = NULL;
    /* The driver answers for codes it knows; an unknown code leaves both unset. */
    if (c != NULL && (c->get_error_name(rc, &name) != ORB_CU_SUCCESS || name == NULL))
        name = NULL;
    if (c != NULL && (c->get_error_string(rc, &text) != ORB_CU_SUCCESS || text == NULL))
        text = NULL;
    if (name != NULL)
        snprintf(buf, cap, "%s (%s)", name, text != NULL ? text : "no description");
    else
        snprintf(buf, cap, "CUDA error %u", rc);
    return buf;
}

int orb_cuda_load(const char *path, struct orb_cuda *out)
{
    if (path == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL path or table");
    struct orb_cuda table;
    memset(&table, 0, sizeof table);
    void *handle = NULL;
    int status = orb_dl_open("cuda", path, exports, sizeof exports / sizeof exports[0], &table, sizeof table,
                             ": the driver is older than OrbiTE needs", &handle);
    if (status != 0)
        return status;
    resolve_optional(handle, path, &table);
    char why[160];
    orb_cu_result rc = table.init(0);
    if (rc != ORB_CU_SUCCESS) {
        (void)orb_cuda_describe(&table, rc, why, sizeof why);
        (void)dlclose(handle);
        return orb_fail(ORB_EUNAVAILABLE, "cuda: cuInit of %s failed: %s", path, why);
    }
    if ((rc = table.driver_get_version(&table.driver_version)) != ORB_CU_SUCCESS) {
        (void)orb_cuda_describe(&table, rc, why, sizeof why);
        (void)dlclose(handle);
        return orb_fail(ORB_EUNAVAILABLE, "cuda: cuDriverGetVersion of %s failed: %s", path, why);
    }
    /* Kept open for the process's lifetime: contexts and allocations outlive any engine. */
    *out = table;
    return 0;
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static struct orb_cuda g_cuda;
static int g_status = ORB_EUNAVAILABLE;
static char g_detail[256];
static atomic_bool g_attempted;
static pthread_mutex_t g_path_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_path[512] = ORB_CUDA_LIBRARY;

int orb_cuda_use_library(const char *path)
{
    if (path == NULL || strlen(path) >= sizeof g_path)
        return orb_fail(ORB_EINVAL, "cuda: no path, or one too long");
    pthread_mutex_lock(&g_path_lock);
    bool late = atomic_load(&g_attempted);
    if (!late)
        snprintf(g_path, sizeof g_path, "%s", path);
    pthread_mutex_unlock(&g_path_lock);
    return late ? orb_fail(ORB_EBUSY, "cuda: the process's driver table is loaded already") : 0;
}

static void load_once(void)
{
    pthread_mutex_lock(&g_path_lock);
    atomic_store(&g_attempted, true);
    pthread_mutex_unlock(&g_path_lock);
    g_status = orb_cuda_load(g_path, &g_cuda);
    if (g_status != 0) {
        snprintf(g_detail, sizeof g_detail, "%s", orb_last_error());
        ORB_LOGW("%s: CUDA memory is unavailable in this process", g_detail);
    } else {
        ORB_LOGI("cuda: %s loaded, driver API %d.%d", g_path, g_cuda.driver_version / 1000,
                 g_cuda.driver_version % 1000 / 10);
    }
}

int orb_cuda_get(const struct orb_cuda **out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL table");
    (void)pthread_once(&g_once, load_once);
    if (g_status != 0)
        return orb_fail(g_status, "%s", g_detail);
    *out = &g_cuda;
    return 0;
}

bool orb_cuda_attempted(void)
{
    return atomic_load(&g_attempted);
}
