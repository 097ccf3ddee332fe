/* The NVLink transport in an engine that never uses CUDA: it starts, host requests by
 * ORB_TRANSPORT_UNSPEC go on as before (over TCP), a peer's NVLink questions about host memory are
 * refused, and nothing of it loads libcuda.so.1. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <orbite/orbite.h>

#include "core/engine.h"
#include "cuda/cuda.h"
#include "nvlink/nvlink_msg.h"
#include "util.h"

static void test_a_cpu_only_engine_never_loads_cuda(void **state)
{
    (void)state;
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(1, 0);
    struct eu_region remote, local;
    eu_region_new(src, 1 << 20, ORB_PERM_REMOTE_WRITE, 1, &remote);
    eu_region_new(req, 1 << 20, ORB_PERM_LOCAL, 2, &local);
    orb_segment *seg = eu_open(req, src);

    struct orb_request r[2] = {eu_req(ORB_OP_READ, local.base, remote.base, 65536),
                               eu_req(ORB_OP_WRITE, local.base + 65536, remote.base + 65536, 65536)};
    struct orb_batch_report rep;
    assert_int_equal(orb_submit_and_wait(req, seg, r, 2, NULL, 10 * EU_SEC, &rep), 0);
    assert_memory_equal(local.base, remote.base, 65536);
    /* Naming NVLink with host memory is refused before anything moves. */
    r[0].transport = ORB_TRANSPORT_NVLINK;
    assert_int_equal(orb_submit_and_wait(req, seg, r, 1, NULL, 10 * EU_SEC, &rep), ORB_EINVAL);
    assert_int_equal(rep.submitted_requests, 0);

    /* A peer asking to share host memory by IPC is refused, with and without a hold. */
    struct orb_epoch sender = {{0}};
    sender.bytes[0] = 0x42;
    struct orb_nvl_begin b = {.group = 1, .count = 1,
                              .ranges = {{.op = ORB_OP_READ, .addr = (uint64_t)(uintptr_t)remote.base, .length = 64}}};
    uint8_t msg[4096], resp[4096];
    size_t len = 0, resp_len = 0;
    const uint8_t kinds[2] = {ORB_NVL_QUERY, ORB_NVL_BEGIN}, answers[2] = {ORB_NVL_QUERY_OK, ORB_NVL_BEGIN_OK};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(orb_nvl_begin_encode(kinds[k], &b, msg, sizeof msg, &len), 0);
        assert_int_equal(orb_engine_control(src, ORB_TRANSPORT_NVLINK, &sender, msg, len, resp, sizeof resp,
                                            &resp_len), 0);
        struct orb_nvl_begin_ok a;
        assert_int_equal(orb_nvl_begin_ok_decode(answers[k], resp, resp_len, &a), 0);
        assert_int_equal(a.grants[0].status, ORB_EUNAVAILABLE);
        assert_non_null(strstr(a.grants[0].why, "host memory"));
        assert_int_equal(a.nallocs, 0);
    }

    orb_segment_close(seg);
    eu_region_free(req, &local);
    eu_region_free(src, &remote);
    assert_int_equal(orb_engine_close(req, 5 * EU_SEC), 0);
    assert_int_equal(orb_engine_close(src, 5 * EU_SEC), 0);
    orb_engine_free(req);
    orb_engine_free(src);
    assert_false(orb_cuda_attempted());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_cpu_only_engine_never_loads_cuda),
    };
    return cmocka_run_group_tests_name("nvlink_cpu_only", tests, NULL, NULL);
}
