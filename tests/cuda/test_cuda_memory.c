/* CUDA memory owners (lib/cuda/cuda_memory.c) through the public calls, on the fakecuda stand-in
 * as the process's driver (or the machine's own driver: see setup): allocation and its primary
 * context, adoption and its checks, one owner per allocation, pinned host memory as host memory,
 * and what failed cleanup keeps. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "cuda/cuda.h"
#include "cuda/cuda_memory.h"
#include "fakecuda.h"
#include "fakecuda_vmm.h"

static const struct orb_cuda *cu;

static struct fakecuda_controls fake;

/* With ORBITE_CUDA_DRIVER=real (hardware/gpu-check.sh) the cells run on the machine's own
 * libcuda.so.1: those that need the stand-in's fault injection are skipped there, the others
 * leave out only their checks of its counts and switches, and what the stand-in's two devices
 * give (a second device, no such device) comes from the devices the driver sees. */
static int real_driver;
static const char *driver;  /* the process's driver library, for the exports its table lacks */
static int devices;         /* how many devices the driver sees */
static int second_device;   /* 1 where there are two devices, else 0 */

static int setup(void **state)
{
    (void)state;
    const char *env = getenv("ORBITE_CUDA_DRIVER");
    real_driver = env != NULL && strcmp(env, "real") == 0;
    driver = real_driver ? ORB_CUDA_LIBRARY : FAKECUDA_FULL;
    if ((!real_driver && orb_cuda_use_library(FAKECUDA_FULL) != 0) || orb_cuda_get(&cu) != 0)
        return -1;
    if (cu->device_get_count(&devices) != ORB_CU_SUCCESS || devices < 1)
        return -1;
    second_device = devices > 1 ? 1 : 0;
    return real_driver ? 0 : fakecuda_controls_load(FAKECUDA_FULL, &fake);
}

/* What is alive in the stand-in; on the real driver zeros, which its equalities pass without
 * checking anything (the checks that would not are left out there). */
static struct fakecuda_counts counts(void)
{
    struct fakecuda_counts c;
    memset(&c, 0, sizeof c);
    return real_driver ? c : fake.counts();
}

static void test_the_driver_is_chosen_once(void **state)
{
    (void)state;
    assert_int_equal(orb_cuda_use_library(FAKECUDA_FULL), ORB_EBUSY);
    assert_int_equal(orb_cuda_use_library(NULL), ORB_EINVAL);
}

static void test_allocation_holds_its_primary_context(void **state)
{
    (void)state;
    orb_cuda_memory *m = (orb_cuda_memory *)1;
    assert_int_equal(orb_cuda_memory_alloc(0, 0, &m), ORB_EINVAL);
    assert_int_equal(orb_cuda_memory_alloc(0, 64, NULL), ORB_EINVAL);
    if (!real_driver)
        assert_int_equal(devices, 2);
    char none[64];
    snprintf(none, sizeof none, "no device %d (this process sees %d)", devices, devices);
    assert_int_equal(orb_cuda_memory_alloc(devices, 64, &m), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), none));
    assert_int_equal(orb_cuda_memory_alloc(-1, 64, &m), ORB_EINVAL);
    assert_ptr_equal(m, (orb_cuda_memory *)1); /* untouched on failure */

    struct fakecuda_counts c0 = counts();
    assert_int_equal(orb_cuda_memory_alloc(second_device, 1u << 20, &m), 0);
    if (!real_driver) /* the stand-in's device memory is not the CPU's; the driver's shares its addresses */
        assert_true(orb_cuda_memory_ptr(m) > 0x00007fffffffffffull);
    unsigned int type = 0;
    assert_int_equal(cu->pointer_get_attribute(&type, ORB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, orb_cuda_memory_ptr(m)),
                     ORB_CU_SUCCESS);
    assert_int_equal(type, ORB_CU_MEMORYTYPE_DEVICE);
    assert_int_equal(orb_cuda_memory_size(m), 1u << 20);
    assert_int_equal(orb_cuda_memory_device(m), second_device);
    struct fakecuda_counts c1 = counts();
    if (!real_driver) {
        assert_int_equal(c1.device_allocations, c0.device_allocations + 1);
        assert_int_equal(c1.primary_refs, c0.primary_refs + 1);
    }
    /* The caller's own context is left as it was (none). */
    orb_cu_context current = (orb_cu_context)1;
    assert_int_equal(cu->ctx_get_current(&current), ORB_CU_SUCCESS);
    assert_null(current);
    assert_ptr_equal(orb_cuda_memory_ref(m), m);
    orb_cuda_memory_unref(m);
    assert_int_equal(counts().device_allocations, c1.device_allocations);
    orb_cuda_memory_unref(m);
    struct fakecuda_counts c2 = counts();
    assert_int_equal(c2.device_allocations, c0.device_allocations);
    assert_int_equal(c2.primary_refs, c0.primary_refs);
    orb_cuda_memory_unref(NULL);
    assert_int_equal(orb_cuda_memory_ptr(NULL), 0);
    assert_int_equal(orb_cuda_memory_size(NULL), 0);
    assert_int_equal(orb_cuda_memory_device(NULL), -1);
    assert_null(orb_cuda_memory_ref(NULL));
}

static void test_a_failed_allocation_keeps_nothing(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* fault injection is the stand-in's */
    struct fakecuda_counts c0 = fake.counts();
    fake.fail_nth("cuMemAlloc_v2", 1, ORB_CU_ERROR_OUT_OF_MEMORY);
    orb_cuda_memory *m = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 4096, &m), ORB_ENOMEM);
    assert_non_null(strstr(orb_last_error(), "CUDA_ERROR_OUT_OF_MEMORY"));
    assert_null(m);
    struct fakecuda_counts c1 = fake.counts();
    assert_int_equal(c1.primary_refs, c0.primary_refs);
    assert_int_equal(c1.device_allocations, c0.device_allocations);
}

static int released;
static uint64_t released_ptr;
static size_t released_len;

static void on_release(void *ptr, size_t len, void *ctx)
{
    released++;
    released_ptr = (uint64_t)(uintptr_t)ptr;
    released_len = len;
    assert_ptr_equal(ctx, &released);
}

/* An application's own allocation on `device` (its primary context, as the runtime makes). */
static orb_cu_deviceptr app_alloc(int device, size_t len)
{
    orb_cu_context ctx = NULL;
    orb_cu_deviceptr p = 0;
    assert_int_equal(cu->primary_ctx_retain(&ctx, device), ORB_CU_SUCCESS);
    assert_int_equal(cu->ctx_set_current(ctx), ORB_CU_SUCCESS);
    assert_int_equal(cu->mem_alloc(&p, len), ORB_CU_SUCCESS);
    return p;
}

static void app_free(int device, orb_cu_deviceptr p)
{
    assert_int_equal(cu->mem_free(p), ORB_CU_SUCCESS);
    assert_int_equal(cu->ctx_set_current(NULL), ORB_CU_SUCCESS);
    assert_int_equal(cu->primary_ctx_release(device), ORB_CU_SUCCESS);
}

static void test_adoption_checks_the_memory(void **state)
{
    (void)state;
    orb_cu_deviceptr p = app_alloc(0, 10000);
    orb_cuda_memory *m = NULL;
    /* Not device memory the driver knows, of this device, in range. */
    uint8_t stack[16];
    assert_int_equal(orb_cuda_memory_adopt(0, (uint64_t)(uintptr_t)stack, sizeof stack, NULL, NULL, &m), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "is not memory the CUDA driver knows"));
    void *pinned = NULL;
    assert_int_equal(cu->mem_host_alloc(&pinned, 4096, ORB_CU_MEMHOSTALLOC_PORTABLE), ORB_CU_SUCCESS);
    assert_int_equal(orb_cuda_memory_adopt(0, (uint64_t)(uintptr_t)pinned, 4096, NULL, NULL, &m), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "is host memory, not device memory"));
    assert_int_equal(cu->mem_free_host(pinned), ORB_CU_SUCCESS);
    /* Managed (unified) memory: device memory to the driver, yet refused (the library's table
     * has no cuMemAllocManaged: the driver library's own export makes it). */
    void *managed_lib = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
    orb_cu_result (*alloc_managed)(orb_cu_deviceptr *, size_t, unsigned int) = NULL;
    if (managed_lib != NULL)
        *(void **)&alloc_managed = dlsym(managed_lib, "cuMemAllocManaged");
    if (alloc_managed != NULL) {
        orb_cu_deviceptr um = 0;
        assert_int_equal(alloc_managed(&um, 8192, 1 /* CU_MEM_ATTACH_GLOBAL */), ORB_CU_SUCCESS);
        assert_int_equal(orb_cuda_memory_adopt(0, um, 4096, NULL, NULL, &m), ORB_EINVAL);
        assert_non_null(strstr(orb_last_error(), "is managed memory"));
        assert_int_equal(cu->mem_free(um), ORB_CU_SUCCESS);
    }
    if (managed_lib != NULL)
        dlclose(managed_lib);
    assert_int_equal(orb_cuda_memory_adopt(1, p, 100, NULL, NULL, &m), ORB_EINVAL);
    if (devices > 1) /* with one, device 1 is no device */
        assert_non_null(strstr(orb_last_error(), "is memory of device 0, not 1"));
    assert_int_equal(orb_cuda_memory_adopt(0, p + 9000, 1001, NULL, NULL, &m), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "runs past its allocation"));
    assert_int_equal(orb_cuda_memory_adopt(0, p, 0, NULL, NULL, &m), ORB_EINVAL);
    assert_int_equal(orb_cuda_memory_adopt(0, UINT64_MAX - 10, 100, NULL, NULL, &m), ORB_EINVAL);
    assert_null(m);

    /* A range of it: the owner is the whole allocation; a second adoption is the same owner. */
    released = 0;
    assert_int_equal(orb_cuda_memory_adopt(0, p + 100, 200, on_release, &released, &m), 0);
    assert_int_equal(orb_cuda_memory_ptr(m), p);
    assert_int_equal(orb_cuda_memory_size(m), 10000);
    orb_cuda_memory *alias = NULL;
    assert_int_equal(orb_cuda_memory_adopt(0, p + 5000, 10, NULL, NULL, &alias), 0);
    assert_ptr_equal(alias, m);
    orb_cuda_memory *other = NULL;
    assert_int_equal(orb_cuda_memory_adopt(0, p, 1, on_release, &released, &other), ORB_EEXIST);
    assert_null(other);
    orb_cuda_memory_unref(alias);
    assert_int_equal(released, 0);
    orb_cuda_memory_unref(m);
    assert_int_equal(released, 1);
    assert_int_equal(released_ptr, p);
    assert_int_equal(released_len, 10000);
    /* The owner is gone: adopting again makes a new one. */
    assert_int_equal(orb_cuda_memory_adopt(0, p, 10000, NULL, NULL, &m), 0);
    orb_cuda_memory_unref(m);
    assert_int_equal(released, 1);
    /* An allocation made here has an owner too. */
    orb_cuda_memory *mine = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 512, &mine), 0);
    assert_int_equal(orb_cuda_memory_adopt(0, orb_cuda_memory_ptr(mine) + 8, 8, NULL, NULL, &alias), 0);
    assert_ptr_equal(alias, mine);
    orb_cuda_memory_unref(alias);
    orb_cuda_memory_unref(mine);
    app_free(0, p);

    /* Memory of a context the application made itself (not the device's primary one) is refused:
     * the engine's copies run in the primary context. */
    void *lib = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(lib);
    orb_cu_result (*ctx_create)(orb_cu_context *, unsigned int, orb_cu_device) = NULL;
    orb_cu_result (*ctx_destroy)(orb_cu_context) = NULL;
    *(void **)&ctx_create = dlsym(lib, "cuCtxCreate_v2");
    *(void **)&ctx_destroy = dlsym(lib, "cuCtxDestroy_v2");
    assert_true(ctx_create != NULL && ctx_destroy != NULL);
    orb_cu_device dev = 0;
    orb_cu_context own = NULL, before = NULL;
    assert_int_equal(cu->device_get(&dev, 0), ORB_CU_SUCCESS);
    assert_int_equal(cu->ctx_get_current(&before), ORB_CU_SUCCESS);
    assert_int_equal(ctx_create(&own, 0, dev), ORB_CU_SUCCESS);
    orb_cu_deviceptr q = 0;
    assert_int_equal(cu->mem_alloc(&q, 4096), ORB_CU_SUCCESS);
    m = NULL;
    assert_int_equal(orb_cuda_memory_adopt(0, q, 4096, NULL, NULL, &m), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "context other than device 0's primary one"));
    assert_null(m);
    assert_int_equal(cu->ctx_set_current(own), ORB_CU_SUCCESS);
    assert_int_equal(cu->mem_free(q), ORB_CU_SUCCESS);
    assert_int_equal(ctx_destroy(own), ORB_CU_SUCCESS);
    assert_int_equal(cu->ctx_set_current(before), ORB_CU_SUCCESS);
    dlclose(lib);
}

static void test_pinned_host_memory_is_host_memory(void **state)
{
    (void)state;
    struct fakecuda_counts c0 = counts();
    orb_host_memory *h = NULL;
    assert_int_equal(orb_cuda_host_alloc(0, 0, &h), ORB_EINVAL);
    assert_int_equal(orb_cuda_host_alloc(devices + 1, 4096, &h), ORB_EINVAL);
    assert_int_equal(orb_cuda_host_alloc(second_device, 65536, &h), 0);
    assert_int_equal(orb_host_memory_size(h), 65536);
    uint8_t *bytes = orb_host_memory_data(h);
    memset(bytes, 0x5a, 65536);
    unsigned int type = 0;
    assert_int_equal(cu->pointer_get_attribute(&type, ORB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                               (orb_cu_deviceptr)(uintptr_t)(bytes + 100)),
                     ORB_CU_SUCCESS);
    assert_int_equal(type, ORB_CU_MEMORYTYPE_HOST);
    struct fakecuda_counts c1 = counts();
    if (!real_driver) {
        assert_int_equal(c1.host_allocations, c0.host_allocations + 1);
        assert_int_equal(c1.primary_refs, c0.primary_refs + 1);
    }
    orb_host_memory_unref(h);
    struct fakecuda_counts c2 = counts();
    assert_int_equal(c2.host_allocations, c0.host_allocations);
    assert_int_equal(c2.primary_refs, c0.primary_refs);
}

static void test_failed_frees_are_kept_and_reported(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* fault injection is the stand-in's */
    struct orb_cuda_retained r0, r1;
    assert_int_equal(orb_cuda_retained_resources(NULL), ORB_EINVAL);
    assert_int_equal(orb_cuda_retained_resources(&r0), 0);
    struct fakecuda_counts c0 = fake.counts();
    orb_cuda_memory *m = NULL;
    orb_host_memory *h = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 3000, &m), 0);
    assert_int_equal(orb_cuda_host_alloc(0, 5000, &h), 0);
    fake.fail_nth("cuMemFree_v2", 1, 999u);
    orb_cuda_memory_unref(m);
    fake.fail_nth("cuMemFreeHost", 1, 999u);
    orb_host_memory_unref(h);
    assert_int_equal(orb_cuda_retained_resources(&r1), 0);
    assert_int_equal(r1.device_allocations, r0.device_allocations + 1);
    assert_int_equal(r1.device_bytes, r0.device_bytes + 3000);
    assert_int_equal(r1.host_allocations, r0.host_allocations + 1);
    assert_int_equal(r1.host_bytes, r0.host_bytes + 5000);
    assert_int_equal(r1.contexts, r0.contexts + 2);
    /* Kept for real: the stand-in still holds both, and both context references. */
    struct fakecuda_counts c1 = fake.counts();
    assert_int_equal(c1.device_allocations, c0.device_allocations + 1);
    assert_int_equal(c1.host_allocations, c0.host_allocations + 1);
    assert_int_equal(c1.primary_refs, c0.primary_refs + 2);
}

static void test_copies_wait_for_their_event(void **state)
{
    (void)state;
    struct fakecuda_counts c0 = counts();
    orb_cuda_memory *m = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 1u << 20, &m), 0);
    assert_int_equal(counts().streams, c0.streams); /* made on the first copy */
    static uint8_t out[5000], back[5000];
    for (size_t i = 0; i < sizeof out; i++)
        out[i] = (uint8_t)(i * 13 + 1);
    assert_int_equal(orb_cuda_memory_from_host(m, 100, out, sizeof out), 0);
    assert_int_equal(orb_cuda_memory_to_host(m, 100, back, sizeof back), 0);
    assert_memory_equal(back, out, sizeof out);
    struct fakecuda_counts c1 = counts();
    if (!real_driver) {
        assert_int_equal(c1.streams, c0.streams + 1);
        /* The owner's stream never waits on the legacy one. */
        assert_int_equal(c1.blocking_streams, c0.blocking_streams);
        assert_int_equal(c1.events, c0.events + 1);
    }
    /* Outside the allocation, empty, no host bytes. */
    assert_int_equal(orb_cuda_memory_to_host(m, (1u << 20) - 10, back, 11), ORB_EINVAL);
    assert_int_equal(orb_cuda_memory_to_host(m, 0, back, 0), ORB_EINVAL);
    assert_int_equal(orb_cuda_memory_from_host(m, 0, NULL, 10), ORB_EINVAL);
    assert_int_equal(orb_cuda_memory_to_host(NULL, 0, back, 10), ORB_EINVAL);
    /* A failed submit, record or wait (the stand-in's): reported after the stream drained; the
     * next copy works. */
    static const char *const failing[] = {"cuMemcpyDtoHAsync_v2", "cuEventRecord", "cuEventSynchronize"};
    for (size_t i = 0; !real_driver && i < sizeof failing / sizeof failing[0]; i++) {
        fake.fail_nth(failing[i], 1, 999u);
        assert_int_equal(orb_cuda_memory_to_host(m, 100, back, sizeof back), ORB_EPEER);
        assert_non_null(strstr(orb_last_error(), "the copy stream drained"));
        memset(back, 0, sizeof back);
        assert_int_equal(orb_cuda_memory_to_host(m, 100, back, sizeof back), 0);
        assert_memory_equal(back, out, sizeof out);
    }
    orb_cuda_memory_unref(m);
    struct fakecuda_counts c2 = counts();
    assert_int_equal(c2.streams, c0.streams);
    assert_int_equal(c2.events, c0.events);
    assert_int_equal(c2.device_allocations, c0.device_allocations);
    assert_int_equal(c2.primary_refs, c0.primary_refs);
}

static void test_an_unproven_copy_fences_and_keeps(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* fault injection is the stand-in's */
    struct orb_cuda_retained r0, r1;
    assert_int_equal(orb_cuda_retained_resources(&r0), 0);
    struct fakecuda_counts c0 = fake.counts();
    orb_cuda_memory *m = NULL;
    static uint8_t bytes[64]; /* the unproven copy may still read it: kept, as a caller must */
    assert_int_equal(orb_cuda_memory_alloc(1, 4096, &m), 0);
    fake.fail_nth("cuEventSynchronize", 1, 999u);
    fake.fail_nth("cuStreamSynchronize", 1, 999u);
    assert_int_equal(orb_cuda_memory_from_host(m, 0, bytes, sizeof bytes), ORB_EUNQUIESCED);
    assert_non_null(strstr(orb_last_error(), "is fenced and kept"));
    assert_int_equal(orb_cuda_memory_to_host(m, 0, bytes, sizeof bytes), ORB_EUNQUIESCED);
    assert_non_null(strstr(orb_last_error(), "is fenced"));
    orb_cuda_memory_unref(m);
    assert_int_equal(orb_cuda_retained_resources(&r1), 0);
    assert_int_equal(r1.device_allocations, r0.device_allocations + 1);
    assert_int_equal(r1.device_bytes, r0.device_bytes + 4096);
    assert_int_equal(r1.contexts, r0.contexts + 1);
    /* Kept for real: the allocation, its stream and event, its context reference. */
    struct fakecuda_counts c1 = fake.counts();
    assert_int_equal(c1.device_allocations, c0.device_allocations + 1);
    assert_int_equal(c1.streams, c0.streams + 1);
    assert_int_equal(c1.events, c0.events + 1);
    assert_int_equal(c1.primary_refs, c0.primary_refs + 1);
}

/* Eight callers copying their own unaligned pieces of one allocation at once, four rounds. */
struct copier {
    orb_cuda_memory *m;
    uint32_t index;
    int failures;
};

static void *copier_main(void *arg)
{
    struct copier *c = arg;
    static const size_t sizes[3] = {1, 4093, 65537};
    uint8_t *out = malloc(65537), *back = malloc(65537);
    for (uint32_t round = 0; round < 4 && out != NULL && back != NULL; round++)
        for (size_t k = 0; k < 3; k++) {
            size_t len = sizes[k], offset = (size_t)c->index * 70001 + 3 * k + 1;
            for (size_t i = 0; i < len; i++)
                out[i] = (uint8_t)(i + c->index * 31 + round * 7 + k);
            memset(back, 0, len);
            if (orb_cuda_memory_from_host(c->m, offset, out, len) != 0 ||
                orb_cuda_memory_to_host(c->m, offset, back, len) != 0 || memcmp(out, back, len) != 0)
                c->failures++;
        }
    free(out);
    free(back);
    return NULL;
}

/* Device-to-device copies of a group: queued together and waited for once; a refused submit
 * fails its copy only, a failed wait every queued one. */
static void test_device_copies_queue_together(void **state)
{
    (void)state;
    orb_cuda_memory *a = NULL, *b = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 65536, &a), 0);
    assert_int_equal(orb_cuda_memory_alloc(0, 65536, &b), 0);
    uint8_t pat[65536], got[65536];
    for (size_t i = 0; i < sizeof pat; i++)
        pat[i] = (uint8_t)(i * 7 + 1);
    assert_int_equal(orb_cuda_memory_from_host(a, 0, pat, sizeof pat), 0);
    assert_int_equal(orb_cuda_memory_from_host(b, 0, pat + 100, sizeof pat - 100), 0);
    uint64_t pb = orb_cuda_memory_ptr(b);

    struct orb_cuda_dtod ops[3] = {
        {.offset = 0, .peer = pb + 1000, .len = 3000, .to_peer = 1},      /* a[0..3000) -> b[1000..) */
        {.offset = 10000, .peer = pb + 20000, .len = 5, .to_peer = 0},    /* b[20000..+5) -> a[10000..) */
        {.offset = 30000, .peer = pb + 40000, .len = 20000, .to_peer = 1},
    };
    assert_int_equal(orb_cuda_memory_dtod_many(a, ops, 0), ORB_EINVAL);
    ops[1].len = 65536; /* outside a: nothing is queued */
    assert_int_equal(orb_cuda_memory_dtod_many(a, ops, 3), ORB_EINVAL);
    assert_int_equal(ops[0].status, ORB_EINVAL);
    ops[1].len = 5;
    assert_int_equal(orb_cuda_memory_dtod_many(a, ops, 3), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ops[i].status, 0);
    assert_int_equal(orb_cuda_memory_to_host(b, 0, got, sizeof got), 0);
    assert_memory_equal(got + 1000, pat, 3000);
    assert_memory_equal(got + 40000, pat + 30000, 20000);
    assert_memory_equal(got + 4000, pat + 100 + 4000, 1000); /* untouched between them */
    assert_int_equal(orb_cuda_memory_to_host(a, 10000, got, 5), 0);
    assert_memory_equal(got, pat + 100 + 20000, 5);

    if (!real_driver) { /* the failures are the stand-in's */
        /* The second submit is refused: the others still run. */
        fake.fail_nth("cuMemcpyDtoDAsync_v2", 2, ORB_CU_ERROR_INVALID_VALUE);
        assert_int_equal(orb_cuda_memory_dtod_many(a, ops, 3), ORB_EINVAL);
        assert_true(ops[0].status == 0 && ops[1].status == ORB_EINVAL && ops[2].status == 0);
        /* The wait fails: every queued copy fails, after the stream drained. */
        fake.fail_nth("cuEventSynchronize", 1, 999u);
        assert_int_not_equal(orb_cuda_memory_dtod_many(a, ops, 3), 0);
        for (int i = 0; i < 3; i++)
            assert_int_not_equal(ops[i].status, 0);
        assert_non_null(strstr(orb_last_error(), "drained"));
        assert_int_equal(orb_cuda_memory_dtod_many(a, ops, 3), 0); /* not fenced: the drain proved it idle */
    }
    orb_cuda_memory_unref(a);
    orb_cuda_memory_unref(b);
}

static void test_concurrent_copies(void **state)
{
    (void)state;
    orb_cuda_memory *m = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 8 * 70001 + 16, &m), 0);
    struct copier c[8];
    pthread_t th[8];
    for (uint32_t i = 0; i < 8; i++) {
        c[i] = (struct copier){.m = m, .index = i};
        assert_int_equal(pthread_create(&th[i], NULL, copier_main, &c[i]), 0);
    }
    for (uint32_t i = 0; i < 8; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(c[i].failures, 0);
    }
    orb_cuda_memory_unref(m);
}

/* The public copies are the staging copies: bounds checked, bytes in place on return. */
static void test_public_copies(void **state)
{
    (void)state;
    orb_cuda_memory *m = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 8192, &m), 0);
    uint8_t in[5000], out[5000];
    for (size_t i = 0; i < sizeof in; i++)
        in[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(orb_cuda_memory_copy_in(m, 3000, in, sizeof in), 0);
    memset(out, 0, sizeof out);
    assert_int_equal(orb_cuda_memory_copy_out(m, 3000, out, sizeof out), 0);
    assert_memory_equal(out, in, sizeof in);
    assert_int_equal(orb_cuda_memory_copy_out(m, 3193, out, sizeof out), ORB_EINVAL); /* one past the end */
    assert_int_equal(orb_cuda_memory_copy_in(m, 0, in, 0), ORB_EINVAL);
    assert_int_equal(orb_cuda_memory_copy_in(m, 0, NULL, 1), ORB_EINVAL);
    assert_int_equal(orb_cuda_memory_copy_out(NULL, 0, out, 1), ORB_EINVAL);
    assert_int_equal(orb_cuda_memory_copy_out(m, SIZE_MAX, out, 2), ORB_EINVAL);
    orb_cuda_memory_unref(m);
}

/* Virtual memory management allocations have no legacy IPC handle: one made with a POSIX file
 * descriptor handle type is shared by a descriptor, which maps it elsewhere (here for the other
 * device of this process) with its bytes; one made without is refused, saying why; imports and
 * failed imports leave nothing behind. */
static void test_vmm_allocations_share_by_descriptor(void **state)
{
    (void)state;
    const size_t size = FAKECUDA_VMM_GRANULARITY; /* current GPUs' granularity too */
    struct fakecuda_counts c0 = counts();
    assert_true(cu->vmm);
    orb_cu_context ctx = NULL;
    assert_int_equal(cu->primary_ctx_retain(&ctx, 0), ORB_CU_SUCCESS);
    assert_int_equal(cu->ctx_set_current(ctx), ORB_CU_SUCCESS);
    struct fakecuda_vmm v;
    assert_int_equal(fakecuda_vmm_make(cu, driver, 0, size, ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &v), 0);
    static uint8_t pattern[2u << 20], back[2u << 20];
    for (size_t i = 0; i < size; i++)
        pattern[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(cu->memcpy_htod(v.va, pattern, size), ORB_CU_SUCCESS);

    /* A mapping belongs to no context: adoption takes it for the device's primary one. */
    orb_cuda_memory *m = NULL;
    assert_int_equal(orb_cuda_memory_adopt(0, v.va, size, NULL, NULL, &m), 0);
    enum orb_cuda_share kind = 0;
    assert_int_equal(orb_cuda_memory_share_kind(m, &kind), 0);
    assert_int_equal(kind, ORB_CUDA_SHARE_FD);
    uint8_t handle[ORB_CU_IPC_HANDLE_SIZE];
    assert_int_equal(orb_cuda_memory_ipc_handle(m, handle), ORB_EUNAVAILABLE);
    int fd = -1;
    assert_int_equal(orb_cuda_memory_export_fd(m, &fd), 0);
    assert_true(fd >= 0);

    uint64_t there = 0;
    assert_int_equal(orb_cuda_vmm_import(second_device, fd, size, &there), 0);
    assert_int_equal(close(fd), 0); /* the import does not need the descriptor any more */
    assert_true(there != 0 && there != v.va);
    memset(back, 0, size);
    assert_int_equal(cu->memcpy_dtoh(back, there, size), ORB_CU_SUCCESS);
    assert_memory_equal(back, pattern, size);
    /* Written through the import, read at the allocation's own address. */
    assert_int_equal(cu->memcpy_htod(there + 100, "vmm", 3), ORB_CU_SUCCESS);
    assert_int_equal(cu->memcpy_dtoh(back, v.va + 100, 3), ORB_CU_SUCCESS);
    assert_memory_equal(back, "vmm", 3);
    assert_int_equal(orb_cuda_vmm_unimport(second_device, there, size), 0);
    struct fakecuda_counts c1 = counts();
    if (!real_driver) {
        assert_int_equal(c1.vmm_allocations, c0.vmm_allocations + 1); /* the application's own, still mapped */
        assert_int_equal(c1.reservations, c0.reservations + 1);
    }

    /* What the driver does not take maps nothing and reserves nothing. */
    int p[2];
    assert_int_equal(pipe(p), 0);
    int rc = orb_cuda_vmm_import(second_device, p[0], size, &there);
    if (real_driver) /* which error the driver gives for a descriptor of no allocation is its own */
        assert_int_not_equal(rc, 0);
    else
        assert_int_equal(rc, ORB_EINVAL);
    assert_int_equal(orb_cuda_vmm_import(second_device, -1, size, &there), ORB_EINVAL);
    close(p[0]);
    close(p[1]);
    assert_int_equal(orb_cuda_memory_export_fd(m, &fd), 0);
    assert_int_equal(orb_cuda_vmm_import(second_device, fd, 2 * size, &there), ORB_EINVAL); /* beyond the allocation */
    assert_int_equal(orb_cuda_vmm_import(real_driver ? devices : 7, fd, size, &there), ORB_EINVAL); /* no such device */
    close(fd);
    c1 = counts();
    if (!real_driver) {
        assert_int_equal(c1.vmm_allocations, c0.vmm_allocations + 1);
        assert_int_equal(c1.reservations, c0.reservations + 1);
        assert_int_equal(c1.primary_refs, c0.primary_refs + 2); /* this test's retain and the owner's */
    }
    orb_cuda_memory_unref(m);
    assert_int_equal(fakecuda_vmm_free(cu, &v), 0);

    /* Made without a shareable handle type: no way to share it, and the message says so. */
    assert_int_equal(fakecuda_vmm_make(cu, driver, 0, size, 0, &v), 0);
    assert_int_equal(orb_cuda_memory_adopt(0, v.va, size, NULL, NULL, &m), 0);
    assert_int_equal(orb_cuda_memory_share_kind(m, &kind), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "no POSIX file descriptor handle type"));
    assert_int_equal(orb_cuda_memory_export_fd(m, &fd), ORB_EUNAVAILABLE);
    orb_cuda_memory_unref(m);
    assert_int_equal(fakecuda_vmm_free(cu, &v), 0);

    /* An ordinary allocation keeps its legacy handle. */
    assert_int_equal(orb_cuda_memory_alloc(0, 4096, &m), 0);
    assert_int_equal(orb_cuda_memory_share_kind(m, &kind), 0);
    assert_int_equal(kind, ORB_CUDA_SHARE_LEGACY);
    assert_int_equal(orb_cuda_memory_export_fd(m, &fd), ORB_EUNAVAILABLE);
    orb_cuda_memory_unref(m);
    assert_int_equal(cu->primary_ctx_release(0), ORB_CU_SUCCESS);
    struct fakecuda_counts c2 = counts();
    assert_int_equal(c2.vmm_allocations, c0.vmm_allocations);
    assert_int_equal(c2.reservations, c0.reservations);
    assert_int_equal(c2.primary_refs, c0.primary_refs);
    assert_int_equal(c2.device_allocations, c0.device_allocations);
}

/* dma-buf export for GPUDirect: the host pages holding the whole allocation, whatever range is
 * registered; a device that does not support it says so, and so does the export. On the real
 * driver the device's own answers are taken as they are, and what they allow is checked. */
static void test_dmabuf_exports_the_whole_allocation(void **state)
{
    (void)state;
    bool ok = false;
    assert_int_equal(orb_cuda_device_dmabuf(0, &ok), 0);
    if (!real_driver)
        assert_true(ok);
    assert_int_equal(orb_cuda_device_dmabuf(real_driver ? devices : 9, &ok), ORB_EINVAL);
    orb_cuda_memory *m = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, 10000, &m), 0);
    int fd = -1;
    uint64_t base = 0, size = 0;
    if (ok) {
        long exports = counts().dmabuf_exports;
        assert_int_equal(orb_cuda_memory_dmabuf(m, &fd, &base, &size), 0);
        uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
        assert_true(fd >= 0);
        assert_true(base % page == 0 && base <= orb_cuda_memory_ptr(m));
        assert_true(size % page == 0 && base + size >= orb_cuda_memory_ptr(m) + 10000 &&
                    base + size - (orb_cuda_memory_ptr(m) + 10000) < page);
        if (!real_driver)
            assert_int_equal(fake.counts().dmabuf_exports, exports + 1);
        assert_int_equal(close(fd), 0);
    }
    if (!real_driver) { /* switching dma-buf off is the stand-in's */
        fake.set_dmabuf(0);
        assert_int_equal(orb_cuda_device_dmabuf(0, &ok), 0);
        assert_false(ok);
        fd = -7;
        assert_int_equal(orb_cuda_memory_dmabuf(m, &fd, &base, &size), ORB_EUNAVAILABLE);
        assert_int_equal(fd, -7);
        fake.set_dmabuf(1);
    }
    assert_int_equal(orb_cuda_memory_dmabuf(NULL, &fd, &base, &size), ORB_EINVAL);
    /* What a NIC touching the bytes directly needs: synchronous operations that synchronize. */
    unsigned int sync = 7;
    assert_int_equal(cu->pointer_get_attribute(&sync, ORB_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, orb_cuda_memory_ptr(m)),
                     ORB_CU_SUCCESS);
    if (!real_driver) /* off until asked for on the stand-in; the driver's default is its own */
        assert_int_equal(sync, 0);
    assert_int_equal(orb_cuda_memory_sync_memops(m), 0);
    assert_int_equal(cu->pointer_get_attribute(&sync, ORB_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, orb_cuda_memory_ptr(m)),
                     ORB_CU_SUCCESS);
    assert_int_equal(sync, 1);
    assert_int_equal(orb_cuda_memory_sync_memops(NULL), ORB_EINVAL);
    /* Write ordering: the owner's by default; a device without it is flushable here. The real
     * device's answers are its own: a flush works where it says it can. */
    bool ordered = false, flushable = false;
    assert_int_equal(orb_cuda_device_gdr_writes(0, &ordered, &flushable), 0);
    if (!real_driver) {
        assert_true(ordered && flushable);
        fake.set_rdma_ordering(0);
        assert_int_equal(orb_cuda_device_gdr_writes(0, &ordered, &flushable), 0);
        assert_false(ordered);
        fake.set_rdma_ordering(100);
    }
    long flushes = counts().rdma_flushes;
    if (!real_driver || flushable)
        assert_int_equal(orb_cuda_memory_gdr_flush(m), 0);
    if (!real_driver)
        assert_int_equal(fake.counts().rdma_flushes, flushes + 1);
    assert_int_equal(orb_cuda_device_gdr_writes(real_driver ? devices : 9, &ordered, &flushable), ORB_EINVAL);
    orb_cuda_memory_unref(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_driver_is_chosen_once),
        cmocka_unit_test(test_allocation_holds_its_primary_context),
        cmocka_unit_test(test_a_failed_allocation_keeps_nothing),
        cmocka_unit_test(test_adoption_checks_the_memory),
        cmocka_unit_test(test_pinned_host_memory_is_host_memory),
        cmocka_unit_test(test_failed_frees_are_kept_and_reported),
        cmocka_unit_test(test_copies_wait_for_their_event),
        cmocka_unit_test(test_device_copies_queue_together),
        cmocka_unit_test(test_an_unproven_copy_fences_and_keeps),
        cmocka_unit_test(test_concurrent_copies),
        cmocka_unit_test(test_public_copies),
        cmocka_unit_test(test_vmm_allocations_share_by_descriptor),
        cmocka_unit_test(test_dmabuf_exports_the_whole_allocation),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
