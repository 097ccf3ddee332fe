/* Producer readiness (orb_cuda_memory_record_producer, orb_cuda_host_record_producer) on the
 * fakecuda stand-in: which streams are accepted, that a request's submission, a peer's request at
 * the source and the final free wait for the producer's work (its bytes, not older ones, are what
 * moves), that `done` runs once after that, and that an unproven record, wait or context restore
 * fences the memory for good. The machine's own driver instead of the stand-in: see setup. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "cuda/cuda.h"
#include "cuda/cuda_api.h"
#include "cuda/cuda_memory.h"
#include "fakecuda.h"
#include "util.h"

#define LEN (256u << 10)

static const struct orb_cuda *cu;
static orb_cu_context ctx0, ctx1;

static struct fakecuda_controls fake;

/* With ORBITE_CUDA_DRIVER=real (hardware/gpu-check.sh) the cells run on the machine's own
 * libcuda.so.1: a producer's stream is held back by a host function of its own (hold()), the other
 * context is one made on device 0 (one device is enough), and the checks and cells that need the
 * stand-in's capture status or fault injection are skipped. */
static int real_driver;
static orb_cu_result (*launch_host_func)(orb_cu_stream stream, void (*fn)(void *), void *arg);
static atomic_int gate_open;

static int setup(void **state)
{
    (void)state;
    const char *env = getenv("ORBITE_CUDA_DRIVER");
    real_driver = env != NULL && strcmp(env, "real") == 0;
    if ((!real_driver && orb_cuda_use_library(FAKECUDA_FULL) != 0) || orb_cuda_get(&cu) != 0)
        return -1;
    orb_cu_device d0 = 0, d1 = 0;
    if (!real_driver) {
        if (fakecuda_controls_load(FAKECUDA_FULL, &fake) != 0)
            return -1;
        if (cu->device_get(&d0, 0) != ORB_CU_SUCCESS || cu->device_get(&d1, 1) != ORB_CU_SUCCESS ||
            cu->primary_ctx_retain(&ctx0, d0) != ORB_CU_SUCCESS || cu->primary_ctx_retain(&ctx1, d1) != ORB_CU_SUCCESS)
            return -1;
        return 0;
    }
    void *lib = dlopen(ORB_CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL); /* the one the table came from */
    orb_cu_result (*ctx_create)(orb_cu_context *, unsigned int, orb_cu_device) = NULL;
    if (lib == NULL)
        return -1;
    *(void **)&ctx_create = dlsym(lib, "cuCtxCreate_v2");
    *(void **)&launch_host_func = dlsym(lib, "cuLaunchHostFunc");
    if (ctx_create == NULL || launch_host_func == NULL || cu->device_get(&d0, 0) != ORB_CU_SUCCESS ||
        cu->primary_ctx_retain(&ctx0, d0) != ORB_CU_SUCCESS || ctx_create(&ctx1, 0, d0) != ORB_CU_SUCCESS ||
        cu->ctx_set_current(NULL) != ORB_CU_SUCCESS)
        return -1;
    return 0;
}

/* The real driver's hold: runs on the stream, in the driver's thread, until release() (or half a
 * minute, so that a cell that failed before its release leaves no stream held for good). */
static void gate_main(void *arg)
{
    (void)arg;
    for (int i = 0; i < 30000 && !atomic_load(&gate_open); i++)
        usleep(1000);
}

/* The work queued on `s` from now on (the stand-in: on every stream) waits until release(). */
static void hold(orb_cu_stream s)
{
    if (!real_driver) {
        fake.hold_streams(1);
        return;
    }
    atomic_store(&gate_open, 0);
    assert_int_equal(launch_host_func(s, gate_main, NULL), ORB_CU_SUCCESS);
}

static void release(void)
{
    if (real_driver)
        atomic_store(&gate_open, 1);
    else
        fake.hold_streams(0);
}

/* The application's own calls on its stream: on the real driver with the producer's context
 * current, as an application has it; on the stand-in with none, so that nothing the library does
 * leans on the caller's context. */
static void app_context(orb_cu_context ctx)
{
    if (real_driver)
        assert_int_equal(cu->ctx_set_current(ctx), ORB_CU_SUCCESS);
}

/* A stream of `ctx`, made with that context current; the thread's context is left as none. */
static orb_cu_stream stream_of(orb_cu_context ctx)
{
    orb_cu_stream s = NULL;
    assert_int_equal(cu->ctx_set_current(ctx), ORB_CU_SUCCESS);
    assert_int_equal(cu->stream_create(&s, ORB_CU_STREAM_NON_BLOCKING), ORB_CU_SUCCESS);
    assert_int_equal(cu->ctx_set_current(NULL), ORB_CU_SUCCESS);
    return s;
}

static void count_done(void *ctx)
{
    atomic_fetch_add((atomic_int *)ctx, 1);
}

static void test_which_streams_are_accepted(void **state)
{
    (void)state;
    orb_cuda_memory *m = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, LEN, &m), 0);
    orb_cu_stream mine = stream_of(ctx0), other = stream_of(ctx1);
    atomic_int done = 0;

    assert_int_equal(orb_cuda_memory_record_producer(NULL, mine, NULL, NULL), ORB_EINVAL);
    assert_int_equal(orb_cuda_memory_record_producer(m, other, count_done, &done), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "another context"));
    /* A default stream names the calling thread's context: none is current here. */
    assert_int_equal(orb_cuda_memory_record_producer(m, NULL, count_done, &done), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "no context"));
    if (!real_driver) { /* a capture without a graph to capture is the stand-in's */
        fake.set_capturing(mine, ORB_CU_STREAM_CAPTURE_STATUS_ACTIVE);
        assert_int_equal(orb_cuda_memory_record_producer(m, mine, count_done, &done), ORB_EINVAL);
        assert_non_null(strstr(orb_last_error(), "capturing a graph"));
        fake.set_capturing(mine, ORB_CU_STREAM_CAPTURE_STATUS_NONE);
    }
    assert_int_equal(atomic_load(&done), 0);

    /* Accepted: the allocation's own context's stream, and its default stream when current. */
    assert_int_equal(orb_cuda_memory_record_producer(m, mine, count_done, &done), 0);
    assert_int_equal(cu->ctx_set_current(ctx0), ORB_CU_SUCCESS);
    /* Recording again waits for the pending generation first: its done runs now. Both default
     * handles of the current context are accepted: CU_STREAM_LEGACY and CU_STREAM_PER_THREAD. */
    assert_int_equal(orb_cuda_memory_record_producer(m, (orb_cu_stream)(uintptr_t)1, count_done, &done), 0);
    assert_int_equal(atomic_load(&done), 1);
    assert_int_equal(orb_cuda_memory_record_producer(m, (orb_cu_stream)(uintptr_t)2, count_done, &done), 0);
    assert_int_equal(atomic_load(&done), 2);
    assert_int_equal(cu->ctx_set_current(NULL), ORB_CU_SUCCESS);
    /* A copy consumes the last one, once. */
    uint8_t buf[16];
    assert_int_equal(orb_cuda_memory_to_host(m, 0, buf, sizeof buf), 0);
    assert_int_equal(atomic_load(&done), 3);
    assert_int_equal(orb_cuda_memory_to_host(m, 0, buf, sizeof buf), 0);
    assert_int_equal(atomic_load(&done), 3);

    /* Host memory: only pinned memory from orb_cuda_host_alloc. */
    orb_host_memory *plain = NULL, *pinned = NULL;
    assert_int_equal(orb_host_memory_alloc(LEN, 0, &plain), 0);
    assert_int_equal(orb_cuda_host_record_producer(plain, mine, NULL, NULL), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "orb_cuda_host_alloc"));
    assert_int_equal(orb_cuda_host_record_producer(NULL, mine, NULL, NULL), ORB_EINVAL);
    assert_int_equal(orb_cuda_host_alloc(0, LEN, &pinned), 0);
    assert_int_equal(orb_cuda_host_record_producer(pinned, other, NULL, NULL), ORB_EINVAL);
    assert_int_equal(orb_cuda_host_record_producer(pinned, mine, count_done, &done), 0);
    orb_host_memory_unref(pinned); /* the final free waits for it */
    assert_int_equal(atomic_load(&done), 4);
    orb_host_memory_unref(plain);
    orb_cuda_memory_unref(m);
    assert_int_equal(cu->stream_destroy(mine), ORB_CU_SUCCESS);
    assert_int_equal(cu->stream_destroy(other), ORB_CU_SUCCESS);
}

struct submitter {
    orb_engine *req;
    orb_segment *seg;
    struct orb_request r;
    atomic_int finished;
    int rc;
};

static void *submit_main(void *arg)
{
    struct submitter *s = arg;
    struct orb_batch_report rep;
    s->rc = orb_submit_and_wait(s->req, s->seg, &s->r, 1, NULL, 30 * EU_SEC, &rep);
    if (s->rc == 0 && rep.has_failure)
        s->rc = rep.failure.status;
    atomic_store(&s->finished, 1);
    return NULL;
}

/* A WRITE from pinned host memory whose producer (a device-to-host copy, held back) has not run:
 * the submission waits for it, and the producer's bytes are what the peer gets; the same for a
 * WRITE from device memory whose producer (a host-to-device copy) is held back. */
static void test_a_request_waits_for_its_producer(void **state)
{
    (void)state;
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(1, 0);
    orb_segment *seg = eu_open(req, src);
    struct eu_region remote;
    eu_region_new(src, LEN, ORB_PERM_REMOTE_WRITE, 1, &remote);
    orb_host_memory *pinned = NULL;
    orb_cuda_memory *dev = NULL;
    assert_int_equal(orb_cuda_host_alloc(0, LEN, &pinned), 0);
    assert_int_equal(orb_cuda_memory_alloc(0, LEN, &dev), 0);
    uint8_t *want = malloc(LEN);
    assert_non_null(want);
    eu_fill(want, LEN, 9);
    assert_int_equal(orb_cuda_memory_from_host(dev, 0, want, LEN), 0);
    memset(orb_host_memory_data(pinned), 0xee, LEN); /* what a send that did not wait would send */
    orb_reg_id id;
    assert_int_equal(orb_register_host_memory(req, pinned, 0, LEN, ORB_PERM_LOCAL, &id), 0);

    orb_cu_stream producer = stream_of(ctx0);
    atomic_int done = 0;
    app_context(ctx0);
    hold(producer);
    assert_int_equal(cu->memcpy_dtoh_async(orb_host_memory_data(pinned), orb_cuda_memory_ptr(dev), LEN, producer),
                     ORB_CU_SUCCESS);
    assert_int_equal(orb_cuda_host_record_producer(pinned, producer, count_done, &done), 0);
    struct submitter s = {.req = req, .seg = seg};
    s.r = eu_req(ORB_OP_WRITE, orb_host_memory_data(pinned), remote.base, LEN);
    atomic_init(&s.finished, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, submit_main, &s), 0);
    usleep(200 * 1000);
    assert_int_equal(atomic_load(&s.finished), 0); /* nothing else holds a host WRITE back */
    assert_int_equal(atomic_load(&done), 0);
    release();
    pthread_join(t, NULL);
    assert_int_equal(s.rc, 0);
    assert_int_equal(atomic_load(&done), 1);
    assert_memory_equal(remote.base, want, LEN);

    orb_cuda_memory *ldev = NULL;
    orb_reg_id lid;
    assert_int_equal(orb_cuda_memory_alloc(0, LEN, &ldev), 0);
    uint8_t *stale = malloc(LEN);
    assert_non_null(stale);
    memset(stale, 0xdd, LEN); /* what a WRITE that did not wait would send */
    assert_int_equal(orb_cuda_memory_from_host(ldev, 0, stale, LEN), 0);
    assert_int_equal(orb_register_cuda_memory(req, ldev, 0, LEN, ORB_PERM_LOCAL, &lid), 0);
    eu_fill(want, LEN, 10);
    atomic_int ldone = 0;
    hold(producer);
    assert_int_equal(cu->memcpy_htod_async(orb_cuda_memory_ptr(ldev), want, LEN, producer), ORB_CU_SUCCESS);
    assert_int_equal(orb_cuda_memory_record_producer(ldev, producer, count_done, &ldone), 0);
    struct submitter sd = {.req = req, .seg = seg};
    sd.r = eu_req_at(ORB_OP_WRITE, orb_cuda_memory_ptr(ldev), (uint64_t)(uintptr_t)remote.base, LEN);
    atomic_init(&sd.finished, 0);
    assert_int_equal(pthread_create(&t, NULL, submit_main, &sd), 0);
    usleep(200 * 1000);
    assert_int_equal(atomic_load(&sd.finished), 0);
    assert_int_equal(atomic_load(&ldone), 0);
    release();
    pthread_join(t, NULL);
    assert_int_equal(sd.rc, 0);
    assert_int_equal(atomic_load(&ldone), 1);
    assert_memory_equal(remote.base, want, LEN);
    assert_int_equal(orb_unregister_memory(req, lid), 0);
    orb_cuda_memory_unref(ldev);
    free(stale);

    free(want);
    assert_int_equal(cu->stream_destroy(producer), ORB_CU_SUCCESS);
    app_context(NULL);
    assert_int_equal(orb_unregister_memory(req, id), 0);
    orb_host_memory_unref(pinned);
    orb_cuda_memory_unref(dev);
    eu_region_free(src, &remote);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* The source's device memory with a producer recorded: a peer's READ gets the producer's bytes,
 * over TCP into host memory, or by CUDA IPC into device memory (the source waits before it
 * answers the group). */
static void source_waits_for_its_producer(int ipc)
{
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(1, 0);
    orb_segment *seg = eu_open(req, src);
    orb_cuda_memory *dev = NULL, *input = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, LEN, &dev), 0);
    assert_int_equal(orb_cuda_memory_alloc(0, LEN, &input), 0);
    uint8_t *want = malloc(LEN), *old = malloc(LEN);
    assert_non_null(want);
    assert_non_null(old);
    eu_fill(want, LEN, 5);
    memset(old, 0x5a, LEN);
    assert_int_equal(orb_cuda_memory_from_host(input, 0, want, LEN), 0);
    assert_int_equal(orb_cuda_memory_from_host(dev, 0, old, LEN), 0);
    orb_reg_id id;
    assert_int_equal(orb_register_cuda_memory(src, dev, 0, LEN, ipc ? ORB_PERM_REMOTE_WRITE : ORB_PERM_REMOTE_READ,
                                              &id), 0);
    struct eu_region local;
    orb_cuda_memory *local_dev = NULL;
    orb_reg_id local_id = 0;
    if (ipc) {
        assert_int_equal(orb_cuda_memory_alloc(0, LEN, &local_dev), 0);
        assert_int_equal(orb_register_cuda_memory(req, local_dev, 0, LEN, ORB_PERM_LOCAL, &local_id), 0);
    } else
        eu_region_new(req, LEN, ORB_PERM_LOCAL, 2, &local);

    orb_cu_stream producer = stream_of(ctx0);
    atomic_int done = 0;
    app_context(ctx0);
    hold(producer);
    assert_int_equal(cu->memcpy_dtod_async(orb_cuda_memory_ptr(dev), orb_cuda_memory_ptr(input), LEN, producer),
                     ORB_CU_SUCCESS);
    assert_int_equal(orb_cuda_memory_record_producer(dev, producer, count_done, &done), 0);
    struct submitter s = {.req = req, .seg = seg};
    if (ipc) {
        s.r = eu_req_at(ORB_OP_READ, orb_cuda_memory_ptr(local_dev), orb_cuda_memory_ptr(dev), LEN);
        s.r.transport = ORB_TRANSPORT_NVLINK;
    } else
        s.r = eu_req(ORB_OP_READ, local.base, (const void *)(uintptr_t)orb_cuda_memory_ptr(dev), LEN);
    atomic_init(&s.finished, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, submit_main, &s), 0);
    usleep(100 * 1000);
    release();
    pthread_join(t, NULL);
    assert_int_equal(s.rc, 0);
    assert_int_equal(atomic_load(&done), 1);
    if (ipc) {
        uint8_t *got = malloc(LEN);
        assert_non_null(got);
        assert_int_equal(orb_cuda_memory_to_host(local_dev, 0, got, LEN), 0);
        assert_memory_equal(got, want, LEN);
        free(got);
    } else
        assert_memory_equal(local.base, want, LEN);

    free(want);
    free(old);
    assert_int_equal(cu->stream_destroy(producer), ORB_CU_SUCCESS);
    app_context(NULL);
    if (ipc) {
        assert_int_equal(orb_unregister_memory(req, local_id), 0);
        orb_cuda_memory_unref(local_dev);
    } else
        eu_region_free(req, &local);
    assert_int_equal(orb_unregister_memory(src, id), 0);
    orb_cuda_memory_unref(dev);
    orb_cuda_memory_unref(input);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(src);
}

static void test_the_source_waits_for_its_producer(void **state)
{
    (void)state;
    source_waits_for_its_producer(0);
}

static void test_an_ipc_access_waits_for_the_producer(void **state)
{
    (void)state;
    source_waits_for_its_producer(1);
}

/* Pinned host memory at a source, filled by a GPU producer whose copy is still queued: a peer's
 * READ of it waits for the recorded work and gets the produced bytes, not the old ones. */
static void test_a_source_waits_for_its_pinned_producer(void **state)
{
    (void)state;
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(1, 0);
    orb_segment *seg = eu_open(req, src);
    orb_cuda_memory *input = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, LEN, &input), 0);
    uint8_t *want = malloc(LEN);
    assert_non_null(want);
    eu_fill(want, LEN, 9);
    assert_int_equal(orb_cuda_memory_from_host(input, 0, want, LEN), 0);
    orb_host_memory *pinned = NULL;
    assert_int_equal(orb_cuda_host_alloc(0, LEN, &pinned), 0);
    memset(orb_host_memory_data(pinned), 0x5a, LEN);
    orb_reg_id id;
    assert_int_equal(orb_register_host_memory(src, pinned, 0, LEN, ORB_PERM_REMOTE_READ, &id), 0);
    struct eu_region local;
    eu_region_new(req, LEN, ORB_PERM_LOCAL, 2, &local);

    orb_cu_stream producer = stream_of(ctx0);
    atomic_int done = 0;
    app_context(ctx0);
    hold(producer);
    assert_int_equal(cu->memcpy_dtoh_async(orb_host_memory_data(pinned), orb_cuda_memory_ptr(input), LEN, producer),
                     ORB_CU_SUCCESS);
    assert_int_equal(orb_cuda_host_record_producer(pinned, producer, count_done, &done), 0);
    struct submitter s = {.req = req, .seg = seg,
                          .r = eu_req(ORB_OP_READ, local.base, orb_host_memory_data(pinned), LEN)};
    atomic_init(&s.finished, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, submit_main, &s), 0);
    usleep(100 * 1000);
    assert_int_equal(atomic_load(&s.finished), 0); /* held by the producer's queued copy */
    release();
    pthread_join(t, NULL);
    assert_int_equal(s.rc, 0);
    assert_int_equal(atomic_load(&done), 1);
    assert_memory_equal(local.base, want, LEN);

    assert_int_equal(cu->stream_destroy(producer), ORB_CU_SUCCESS);
    app_context(NULL);
    orb_segment_close(seg);
    eu_region_free(req, &local);
    assert_int_equal(orb_unregister_memory(src, id), 0);
    orb_host_memory_unref(pinned);
    orb_cuda_memory_unref(input);
    free(want);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* An unproven wait, record or context restore fences the memory: every later access fails, done
 * never runs, and the allocation is kept. */
static void test_an_unproven_wait_or_record_fences(void **state)
{
    (void)state;
    if (real_driver)
        skip(); /* fault injection is the stand-in's */
    struct orb_cuda_retained before, after;
    assert_int_equal(orb_cuda_retained_resources(&before), 0);
    orb_cu_stream producer = stream_of(ctx0);
    /* A failed wait or record; then a context that cannot be made current again after the wait,
     * or after the record (the second cuCtxSetCurrent of each: the first enters the owner's),
     * which fences the same way: the driver's state on that thread is unknown, so nothing proves
     * the producer's work. */
    static const struct {
        const char *export;
        unsigned long long nth;
        unsigned int rc;
        bool in_record; /* the failure hits the record itself, not the wait before a copy */
        const char *why;
    } cases[] = {
        {"cuEventSynchronize", 1, 999, false, "waiting"},
        {"cuEventRecord", 1, 999, true, "recording"},
        {"cuCtxSetCurrent", 2, 201 /* CUDA_ERROR_INVALID_CONTEXT */, false, "made current again"},
        {"cuCtxSetCurrent", 2, 201, true, "made current again"},
    };
    const size_t ncases = sizeof cases / sizeof cases[0];
    for (size_t k = 0; k < ncases; k++) {
        orb_cuda_memory *m = NULL;
        assert_int_equal(orb_cuda_memory_alloc(0, LEN, &m), 0);
        atomic_int done = 0;
        uint8_t buf[64];
        if (!cases[k].in_record) {
            assert_int_equal(orb_cuda_memory_record_producer(m, producer, count_done, &done), 0);
            fake.fail_nth(cases[k].export, cases[k].nth, cases[k].rc);
            assert_int_equal(orb_cuda_memory_to_host(m, 0, buf, sizeof buf), ORB_EUNQUIESCED);
        } else {
            fake.fail_nth(cases[k].export, cases[k].nth, cases[k].rc);
            assert_int_equal(orb_cuda_memory_record_producer(m, producer, count_done, &done), ORB_EUNQUIESCED);
        }
        fake.fail_nth(cases[k].export, 0, 0);
        assert_non_null(strstr(orb_last_error(), "fenced"));
        assert_non_null(strstr(orb_last_error(), cases[k].why));
        /* For good: every later access, recording included, fails at once. */
        assert_int_equal(orb_cuda_memory_to_host(m, 0, buf, sizeof buf), ORB_EUNQUIESCED);
        assert_int_equal(orb_cuda_memory_record_producer(m, producer, count_done, &done), ORB_EUNQUIESCED);
        assert_int_equal(atomic_load(&done), 0); /* its inputs stay with their owner */
        orb_cuda_memory_unref(m);
    }
    assert_int_equal(orb_cuda_retained_resources(&after), 0);
    assert_int_equal(after.device_allocations, before.device_allocations + ncases);
    assert_int_equal(after.device_bytes, before.device_bytes + ncases * LEN);

    /* Pinned host memory the same: a producer's work whose wait fails at the final free keeps
     * the bytes, their context too, and done never runs. */
    orb_host_memory *pinned = NULL;
    assert_int_equal(orb_cuda_host_alloc(0, LEN, &pinned), 0);
    long live = fake.counts().host_allocations;
    atomic_int done = 0;
    assert_int_equal(orb_cuda_host_record_producer(pinned, producer, count_done, &done), 0);
    fake.fail_nth("cuEventSynchronize", 1, 999);
    orb_host_memory_unref(pinned); /* the final free waits for the producer: unproven */
    fake.fail_nth("cuEventSynchronize", 0, 0);
    assert_int_equal(atomic_load(&done), 0);
    assert_int_equal(fake.counts().host_allocations, live); /* not freed */
    assert_int_equal(orb_cuda_retained_resources(&after), 0);
    assert_int_equal(after.host_allocations, before.host_allocations + 1);
    assert_int_equal(after.host_bytes, before.host_bytes + LEN);
    assert_int_equal(cu->stream_destroy(producer), ORB_CU_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_which_streams_are_accepted),
        cmocka_unit_test(test_a_request_waits_for_its_producer),
        cmocka_unit_test(test_the_source_waits_for_its_producer),
        cmocka_unit_test(test_an_ipc_access_waits_for_the_producer),
        cmocka_unit_test(test_a_source_waits_for_its_pinned_producer),
        cmocka_unit_test(test_an_unproven_wait_or_record_fences),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
