/* The libcuda.so.1 loader (lib/cuda/cuda.c) on the fakecuda stand-ins: every export or none,
 * cuInit's failure named, the driver's errors mapped and described, and the resolved table
 * driving the stand-in's devices, memory, streams and events (whose rules the CUDA code of the
 * library relies on). The cells that hold for any driver also run on the machine's own: see
 * setup. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "core/error.h"
#include "cuda/cuda.h"
#include "fakecuda.h"

static struct orb_cuda cu;

/* The stand-in's test controls, from the library the loader loaded. */
static struct fakecuda_controls fake;

/* With ORBITE_CUDA_DRIVER=real (hardware/gpu-check.sh) the table is the machine's own
 * libcuda.so.1: what loading does with it (the whole table, the virtual memory management group,
 * bad arguments) and its statuses and descriptions are checked; the cells of the broken stand-ins,
 * and of the stand-in's own devices, rules and controls, are skipped. */
static int real_driver;
static const char *driver; /* the library the table is loaded from */

static int setup(void **state)
{
    (void)state;
    const char *env = getenv("ORBITE_CUDA_DRIVER");
    real_driver = env != NULL && strcmp(env, "real") == 0;
    driver = real_driver ? ORB_CUDA_LIBRARY : FAKECUDA_FULL;
    if (orb_cuda_load(driver, &cu) != 0) {
        fprintf(stderr, "loading %s: %s\n", driver, orb_last_error());
        return -1;
    }
    return real_driver ? 0 : fakecuda_controls_load(FAKECUDA_FULL, &fake);
}

static void test_a_missing_export_fails_the_whole_load(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* a stand-in built without an export */
    struct orb_cuda t;
    memset(&t, 0x5a, sizeof t);
    struct orb_cuda before = t;
    assert_int_equal(orb_cuda_load(FAKECUDA_OMIT_DTOD, &t), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "does not export cuMemcpyDtoD_v2"));
    assert_non_null(strstr(orb_last_error(), FAKECUDA_OMIT_DTOD));
    assert_memory_equal(&t, &before, sizeof t); /* nothing written on failure */
}

/* The virtual memory management group is resolved whole or not at all, apart from the rest: a
 * driver that lacks one of it still loads, without it (a stand-in's: the real driver has it all). */
static void test_the_vmm_group_is_all_or_nothing(void **state)
{
    (void)state;
    struct orb_cuda t;
    assert_int_equal(orb_cuda_load(driver, &t), 0);
    assert_true(t.vmm);
    assert_true(t.mem_map != NULL && t.mem_export_to_shareable_handle != NULL && t.mem_set_access != NULL);
    if (real_driver)
        return;
    memset(&t, 0x5a, sizeof t);
    assert_int_equal(orb_cuda_load(FAKECUDA_NO_VMM, &t), 0);
    assert_false(t.vmm);
    assert_null(t.mem_map);
    assert_null(t.mem_retain_allocation_handle); /* resolved, but not kept without the rest */
    assert_null(t.mem_set_access);
    assert_non_null(t.memcpy_dtod);
}

static void test_a_failed_cuinit_is_named(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* a stand-in whose cuInit finds no device */
    struct orb_cuda t;
    assert_int_equal(orb_cuda_load(FAKECUDA_NO_DEVICE, &t), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "cuInit"));
    assert_non_null(strstr(orb_last_error(), "CUDA_ERROR_NO_DEVICE"));
}

static void test_no_library_and_bad_arguments(void **state)
{
    (void)state;
    struct orb_cuda t;
    assert_int_equal(orb_cuda_load("/nonexistent/libcuda.so.1", &t), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "cannot load /nonexistent/libcuda.so.1"));
    assert_int_equal(orb_cuda_load(NULL, &t), ORB_EINVAL);
    assert_int_equal(orb_cuda_load(driver, NULL), ORB_EINVAL);
    assert_int_equal(orb_cuda_get(NULL), ORB_EINVAL);
}

static void test_statuses_and_descriptions(void **state)
{
    (void)state;
    assert_int_equal(orb_cuda_status(ORB_CU_SUCCESS), 0);
    assert_int_equal(orb_cuda_status(ORB_CU_ERROR_OUT_OF_MEMORY), ORB_ENOMEM);
    assert_int_equal(orb_cuda_status(ORB_CU_ERROR_INVALID_VALUE), ORB_EINVAL);
    assert_int_equal(orb_cuda_status(ORB_CU_ERROR_INVALID_CONTEXT), ORB_EINVAL);
    assert_int_equal(orb_cuda_status(ORB_CU_ERROR_INVALID_HANDLE), ORB_EINVAL);
    assert_int_equal(orb_cuda_status(ORB_CU_ERROR_NO_DEVICE), ORB_EUNAVAILABLE);
    assert_int_equal(orb_cuda_status(ORB_CU_ERROR_NOT_INITIALIZED), ORB_EUNAVAILABLE);
    assert_int_equal(orb_cuda_status(ORB_CU_ERROR_NOT_READY), ORB_EAGAIN);
    assert_int_equal(orb_cuda_status(719u), ORB_EPEER); /* CUDA_ERROR_LAUNCH_FAILED: the device's */
    char buf[128];
    assert_string_equal(orb_cuda_describe(&cu, ORB_CU_ERROR_OUT_OF_MEMORY, buf, sizeof buf),
                        "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
    assert_string_equal(orb_cuda_describe(&cu, 12345u, buf, sizeof buf), "CUDA error 12345");
    assert_string_equal(orb_cuda_describe(NULL, 2u, buf, sizeof buf), "CUDA error 2");
}

static void test_the_table_reaches_the_driver(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* the stand-in's version, devices and bus ids, its counts and controls */
    assert_int_equal(cu.driver_version, 12080);
    int n = 0;
    assert_int_equal(cu.device_get_count(&n), ORB_CU_SUCCESS);
    assert_int_equal(n, 2);
    orb_cu_device dev = -1;
    assert_int_equal(cu.device_get(&dev, 1), ORB_CU_SUCCESS);
    assert_int_equal(cu.device_get(&dev, 2), ORB_CU_ERROR_INVALID_DEVICE);
    char bus[32];
    assert_int_equal(cu.device_get_pci_bus_id(bus, sizeof bus, 1), ORB_CU_SUCCESS);
    assert_string_equal(bus, "0000:42:00.0");
    struct fakecuda_counts c0 = fake.counts();
    orb_cu_context ctx = NULL;
    assert_int_equal(cu.primary_ctx_retain(&ctx, 1), ORB_CU_SUCCESS);
    assert_int_equal(cu.ctx_set_current(ctx), ORB_CU_SUCCESS);
    assert_int_equal(cu.ctx_get_device(&dev), ORB_CU_SUCCESS);
    assert_int_equal(dev, 1);

    /* Device memory: at addresses the CPU cannot reach, with the driver's attributes. */
    orb_cu_deviceptr d = 0;
    assert_int_equal(cu.mem_alloc(&d, 100000), ORB_CU_SUCCESS);
    assert_true(d > 0x00007fffffffffffull);
    unsigned int type = 0;
    int ordinal = -1;
    orb_cu_deviceptr start = 0;
    size_t size = 0;
    assert_int_equal(cu.pointer_get_attribute(&type, ORB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 77), ORB_CU_SUCCESS);
    assert_int_equal(type, ORB_CU_MEMORYTYPE_DEVICE);
    assert_int_equal(cu.pointer_get_attribute(&ordinal, ORB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d), ORB_CU_SUCCESS);
    assert_int_equal(ordinal, 1);
    assert_int_equal(cu.mem_get_address_range(&start, &size, d + 99999), ORB_CU_SUCCESS);
    assert_true(start == d && size == 100000);
    assert_int_equal(cu.mem_get_address_range(&start, &size, d + 100000), ORB_CU_ERROR_INVALID_VALUE);
    uint8_t local = 0;
    assert_int_equal(cu.pointer_get_attribute(&type, ORB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                              (orb_cu_deviceptr)(uintptr_t)&local),
                     ORB_CU_ERROR_INVALID_VALUE); /* memory the driver does not know */

    /* Copies: synchronous, then on a stream that runs them later, ordered with an event. */
    uint8_t out[3000], back[3000];
    for (size_t i = 0; i < sizeof out; i++)
        out[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(cu.memcpy_htod(d + 1, out, sizeof out), ORB_CU_SUCCESS);
    assert_int_equal(cu.memcpy_htod(d + 99000, out, sizeof out), ORB_CU_ERROR_INVALID_VALUE); /* past the end */
    orb_cu_stream s = NULL;
    orb_cu_event e = NULL;
    assert_int_equal(cu.stream_create(&s, ORB_CU_STREAM_NON_BLOCKING), ORB_CU_SUCCESS);
    assert_int_equal(cu.event_create(&e, ORB_CU_EVENT_DISABLE_TIMING), ORB_CU_SUCCESS);
    fake.hold_streams(1);
    memset(back, 0, sizeof back);
    assert_int_equal(cu.memcpy_dtoh_async(back, d + 1, sizeof back, s), ORB_CU_SUCCESS);
    assert_int_equal(cu.event_record(e, s), ORB_CU_SUCCESS);
    assert_int_equal(cu.event_query(e), ORB_CU_ERROR_NOT_READY); /* the stream has not got there */
    assert_int_equal(cu.stream_query(s), ORB_CU_ERROR_NOT_READY);
    assert_int_equal(back[0], 0);
    fake.slow_streams(20000);
    fake.hold_streams(0);
    assert_int_equal(cu.event_synchronize(e), ORB_CU_SUCCESS);
    assert_memory_equal(back, out, sizeof out);
    assert_int_equal(cu.event_query(e), ORB_CU_SUCCESS);
    assert_int_equal(cu.stream_synchronize(s), ORB_CU_SUCCESS);
    fake.slow_streams(0);
    orb_cu_context sctx = NULL;
    assert_int_equal(cu.stream_get_ctx(s, &sctx), ORB_CU_SUCCESS);
    assert_ptr_equal(sctx, ctx);
    unsigned int capture = 9;
    assert_int_equal(cu.stream_is_capturing(s, &capture), ORB_CU_SUCCESS);
    assert_int_equal(capture, ORB_CU_STREAM_CAPTURE_STATUS_NONE);
    fake.set_capturing(s, ORB_CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(cu.stream_is_capturing(s, &capture), ORB_CU_SUCCESS);
    assert_int_equal(capture, ORB_CU_STREAM_CAPTURE_STATUS_ACTIVE);

    /* An injected failure comes back from the named export once. */
    fake.fail_nth("cuMemAlloc_v2", 1, ORB_CU_ERROR_OUT_OF_MEMORY);
    orb_cu_deviceptr d2 = 0;
    assert_int_equal(cu.mem_alloc(&d2, 64), ORB_CU_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cu.mem_alloc(&d2, 64), ORB_CU_SUCCESS);
    assert_int_equal(cu.mem_free(d2), ORB_CU_SUCCESS);

    struct fakecuda_counts c1 = fake.counts();
    assert_int_equal(c1.device_allocations, c0.device_allocations + 1);
    assert_int_equal(c1.streams, c0.streams + 1);
    assert_int_equal(c1.events, c0.events + 1);
    assert_int_equal(c1.primary_refs, c0.primary_refs + 1);
    assert_int_equal(cu.event_destroy(e), ORB_CU_SUCCESS);
    assert_int_equal(cu.stream_destroy(s), ORB_CU_SUCCESS);
    assert_int_equal(cu.mem_free(d), ORB_CU_SUCCESS);
    assert_int_equal(cu.mem_free(d), ORB_CU_ERROR_INVALID_VALUE); /* freed already */
    assert_int_equal(cu.ctx_set_current(NULL), ORB_CU_SUCCESS);
    assert_int_equal(cu.primary_ctx_release(1), ORB_CU_SUCCESS);
    assert_int_equal(cu.primary_ctx_release(1), ORB_CU_ERROR_INVALID_CONTEXT); /* not retained */
    struct fakecuda_counts c2 = fake.counts();
    assert_int_equal(c2.device_allocations, c0.device_allocations);
    assert_int_equal(c2.events, c0.events);
    assert_int_equal(c2.primary_refs, c0.primary_refs);
}

/* The other process of the IPC cell: opens the handle (hex on the command line), checks that it
 * maps the exporter's bytes (0x5a), writes 0xc3 into the first half, closes, and exits 0; any
 * other status names the step that failed. */
static int ipc_child(const char *hex)
{
    orb_cu_ipc_mem_handle h;
    for (size_t i = 0; i < sizeof h.reserved; i++) {
        unsigned v = 0;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return 10;
        h.reserved[i] = (char)v;
    }
    struct orb_cuda c;
    orb_cu_device d = 0;
    orb_cu_context ctx = NULL;
    orb_cu_deviceptr p = 0, again = 0;
    if (orb_cuda_load(FAKECUDA_FULL, &c) != 0 || c.device_get(&d, 0) != ORB_CU_SUCCESS ||
        c.primary_ctx_retain(&ctx, d) != ORB_CU_SUCCESS || c.ctx_set_current(ctx) != ORB_CU_SUCCESS)
        return 11;
    if (c.ipc_open_mem_handle(&p, h, ORB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != ORB_CU_SUCCESS)
        return 12;
    if (c.ipc_open_mem_handle(&again, h, 0) != ORB_CU_SUCCESS || again != p) /* one mapping, counted */
        return 13;
    uint8_t buf[8192];
    if (c.memcpy_dtoh(buf, p, sizeof buf) != ORB_CU_SUCCESS)
        return 14;
    for (size_t i = 0; i < sizeof buf; i++)
        if (buf[i] != 0x5a)
            return 15;
    int capable = 1;
    if (c.pointer_get_attribute(&capable, ORB_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) != ORB_CU_SUCCESS ||
        capable != 0) /* an import is not exported again */
        return 16;
    memset(buf, 0xc3, 4096);
    if (c.memcpy_htod(p, buf, 4096) != ORB_CU_SUCCESS || c.mem_free(p) == ORB_CU_SUCCESS)
        return 17;
    if (c.ipc_close_mem_handle(p) != ORB_CU_SUCCESS || c.ipc_close_mem_handle(p) != ORB_CU_SUCCESS ||
        c.ipc_close_mem_handle(p) == ORB_CU_SUCCESS) /* two opens, two closes, then unknown */
        return 18;
    return 0;
}

/* IPC handles of the stand-in reach another process's mapping of the same bytes, as the driver's
 * do; a process cannot open its own. */
static void test_ipc_handles_cross_processes(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* the stand-in's handles; the driver's cross processes in test_nvlink */
    orb_cu_device d = 0;
    orb_cu_context ctx = NULL;
    assert_int_equal(cu.device_get(&d, 0), ORB_CU_SUCCESS);
    assert_int_equal(cu.primary_ctx_retain(&ctx, d), ORB_CU_SUCCESS);
    assert_int_equal(cu.ctx_set_current(ctx), ORB_CU_SUCCESS);
    orb_cu_deviceptr p = 0, mine = 0;
    assert_int_equal(cu.mem_alloc(&p, 8192), ORB_CU_SUCCESS);
    uint8_t buf[8192];
    memset(buf, 0x5a, sizeof buf);
    assert_int_equal(cu.memcpy_htod(p, buf, sizeof buf), ORB_CU_SUCCESS);
    int capable = 0;
    assert_int_equal(cu.pointer_get_attribute(&capable, ORB_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p),
                     ORB_CU_SUCCESS);
    assert_int_equal(capable, 1);
    orb_cu_ipc_mem_handle h;
    assert_int_equal(cu.ipc_get_mem_handle(NULL, p), ORB_CU_ERROR_INVALID_VALUE);
    assert_int_equal(cu.ipc_get_mem_handle(&h, p + 100), ORB_CU_SUCCESS); /* any byte names its allocation */
    assert_int_equal(cu.ipc_open_mem_handle(&mine, h, 0), ORB_CU_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.ipc_close_mem_handle(p), ORB_CU_ERROR_INVALID_VALUE); /* not an import */

    char hex[2 * ORB_CU_IPC_HANDLE_SIZE + 1];
    for (size_t i = 0; i < sizeof h.reserved; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned)(uint8_t)h.reserved[i]);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "test_cuda_loader", "--ipc-child", hex, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fail_msg("the importing process failed at step %d", WEXITSTATUS(status));
    /* What it wrote is in this process's allocation. */
    assert_int_equal(cu.memcpy_dtoh(buf, p, sizeof buf), ORB_CU_SUCCESS);
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], i < 4096 ? 0xc3 : 0x5a);
    assert_int_equal(cu.mem_free(p), ORB_CU_SUCCESS);
    assert_int_equal(cu.ctx_set_current(NULL), ORB_CU_SUCCESS);
    assert_int_equal(cu.primary_ctx_release(d), ORB_CU_SUCCESS);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--ipc-child") == 0)
        return ipc_child(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_missing_export_fails_the_whole_load),
        cmocka_unit_test(test_the_vmm_group_is_all_or_nothing),
        cmocka_unit_test(test_a_failed_cuinit_is_named),
        cmocka_unit_test(test_no_library_and_bad_arguments),
        cmocka_unit_test(test_statuses_and_descriptions),
        cmocka_unit_test(test_the_table_reaches_the_driver),
        cmocka_unit_test(test_ipc_handles_cross_processes),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
