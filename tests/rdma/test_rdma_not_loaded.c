/* An engine that never uses an RDMA transport never loads libibverbs (nor libcuda): engines are
 * created, host memory is registered and moved both ways over TCP (chosen explicitly and by
 * ORB_TRANSPORT_UNSPEC), and the process's mappings are read afterwards. Public API only. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <orbite/orbite.h>

#include "../engine/util.h"

/* Whether /proc/self/maps names a file whose name contains `needle`. */
static bool mapped(const char *needle)
{
    FILE *f = fopen("/proc/self/maps", "re");
    assert_non_null(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f) != NULL)
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static void test_tcp_engines_never_load_native_libraries(void **state)
{
    (void)state;
    assert_false(mapped("libibverbs"));
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(2, 0);
    orb_segment *seg = eu_open(req, src);
    struct eu_region remote, local;
    eu_region_new(src, 1u << 20, ORB_PERM_REMOTE_WRITE, 1, &remote);
    eu_region_new(req, 1u << 20, ORB_PERM_LOCAL, 2, &local);
    struct orb_request reqs[2] = {
        eu_req(ORB_OP_READ, local.base, remote.base, 1u << 20),
        eu_req(ORB_OP_WRITE, local.base, remote.base, 4096),
    };
    reqs[0].transport = ORB_TRANSPORT_UNSPEC;
    reqs[1].transport = ORB_TRANSPORT_TCP;
    struct orb_batch_report report;
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(orb_submit_and_wait(req, seg, &reqs[i], 1, NULL, 10 * EU_SEC, &report), 0);
    /* The READ brought the source's bytes; the WRITE sent the first 4 KiB of them back. */
    assert_memory_equal(local.base, remote.base, 1u << 20);
    orb_segment_close(seg);
    eu_region_free(req, &local);
    eu_region_free(src, &remote);
    orb_engine_free(req);
    orb_engine_free(src);
    assert_false(mapped("libibverbs"));
    assert_false(mapped("libcuda"));
    assert_false(mapped("libmlx5"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_engines_never_load_native_libraries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
