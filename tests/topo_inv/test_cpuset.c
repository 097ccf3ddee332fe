/* CPU lists as sysfs prints them, a node's CPUs from a sysfs tree, and the plan that deals the
 * RDMA lanes to the NICs' NUMA nodes and their CPUs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "topo/cpuset.h"
#include "topo/inventory.h"
#include "topo/lane_cpus.h"
#include "topo/sysfs.h"

static struct orb_cpuset parse_ok(const char *text)
{
    struct orb_cpuset s;
    memset(&s, 0xa5, sizeof s);
    if (orb_cpulist_parse(text, strlen(text), &s) != 0)
        fail_msg("\"%s\": %s", text, orb_last_error());
    return s;
}

static void test_cpulist_accepts_the_kernel_forms(void **state)
{
    (void)state;
    struct orb_cpuset s = parse_ok("0-3,8,10-11\n");
    assert_int_equal(orb_cpuset_count(&s), 7);
    for (uint32_t c = 0; c < 16; c++)
        assert_int_equal(orb_cpuset_has(&s, c), c <= 3 || c == 8 || c == 10 || c == 11);
    s = parse_ok("");
    assert_int_equal(orb_cpuset_count(&s), 0); /* a node without CPUs */
    s = parse_ok("\n");
    assert_int_equal(orb_cpuset_count(&s), 0);
    s = parse_ok("1023");
    assert_int_equal(orb_cpuset_count(&s), 1);
    assert_true(orb_cpuset_has(&s, 1023));
    s = parse_ok("0-1023");
    assert_int_equal(orb_cpuset_count(&s), 1024);
    s = parse_ok("5-5,0");
    assert_int_equal(orb_cpuset_count(&s), 2);
    /* Not NUL-terminated: only `len` bytes count. */
    struct orb_cpuset t;
    assert_int_equal(orb_cpulist_parse("2-3,9", 3, &t), 0);
    assert_int_equal(orb_cpuset_count(&t), 2);
}

static void test_cpulist_refuses_everything_else(void **state)
{
    (void)state;
    static const char *const bad[] = {
        ",", "1,", ",1", "1,,2", "1-", "-1", "3-1", "1 - 2", " 1", "1 ", "01", "1-02", "1024", "0-1024",
        "99999999999", "a", "1\n\n", "1\t", "+1", "1-2-3", "1;2",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct orb_cpuset s;
        memset(&s, 0x5a, sizeof s);
        struct orb_cpuset before = s;
        if (orb_cpulist_parse(bad[i], strlen(bad[i]), &s) != ORB_ECONFIG)
            fail_msg("\"%s\" was accepted", bad[i]);
        assert_non_null(strstr(orb_last_error(), "cpulist"));
        assert_memory_equal(&s, &before, sizeof s); /* untouched */
    }
    char *big = malloc(ORB_CPULIST_MAX_BYTES + 2);
    assert_non_null(big);
    memset(big, '1', ORB_CPULIST_MAX_BYTES + 1);
    struct orb_cpuset s;
    assert_int_equal(orb_cpulist_parse(big, ORB_CPULIST_MAX_BYTES + 1, &s), ORB_ECONFIG);
    free(big);
    assert_int_equal(orb_cpulist_parse(NULL, 0, &s), ORB_EINVAL);
    assert_int_equal(orb_cpulist_parse("1", 1, NULL), ORB_EINVAL);
}

static void test_node_cpus_from_a_tree(void **state)
{
    (void)state;
    char root[] = "/tmp/orb-cpus-XXXXXX";
    assert_non_null(mkdtemp(root));
    char path[256];
    snprintf(path, sizeof path, "%s/devices", root);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/devices/system", root);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/devices/system/node", root);
    assert_int_equal(mkdir(path, 0755), 0);
    static const char *const lists[] = {"0-3\n", "4-7,12\n", "x\n"};
    for (int n = 0; n < 3; n++) {
        snprintf(path, sizeof path, "%s/devices/system/node/node%d", root, n);
        assert_int_equal(mkdir(path, 0755), 0);
        snprintf(path, sizeof path, "%s/devices/system/node/node%d/cpulist", root, n);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(lists[n], f);
        fclose(f);
    }
    int fd = open(root, O_RDONLY | O_DIRECTORY);
    assert_true(fd >= 0);
    struct orb_cpuset s;
    assert_int_equal(orb_topo_node_cpus(fd, 1, &s), 0);
    assert_int_equal(orb_cpuset_count(&s), 5);
    assert_true(orb_cpuset_has(&s, 12));
    assert_int_equal(orb_topo_node_cpus(fd, 2, &s), ORB_ECONFIG);
    assert_int_equal(orb_topo_node_cpus(fd, 3, &s), ORB_ENOENT);
    assert_int_equal(orb_topo_node_cpus(fd, -1, &s), ORB_EINVAL);
    close(fd);
    for (int n = 0; n < 3; n++) {
        snprintf(path, sizeof path, "%s/devices/system/node/node%d/cpulist", root, n);
        unlink(path);
        snprintf(path, sizeof path, "%s/devices/system/node/node%d", root, n);
        rmdir(path);
    }
    snprintf(path, sizeof path, "%s/devices/system/node", root);
    rmdir(path);
    snprintf(path, sizeof path, "%s/devices/system", root);
    rmdir(path);
    snprintf(path, sizeof path, "%s/devices", root);
    rmdir(path);
    rmdir(root);
}

/* Nodes 0 and 1 with CPUs 0-3 and 4-7; node 2 has none; node 3 cannot be read. */
static int fake_node_cpus(void *ctx, int32_t node, struct orb_cpuset *out)
{
    int *calls = ctx;
    (*calls)++;
    memset(out, 0, sizeof *out);
    if (node == 3)
        return ORB_ENOENT;
    for (uint32_t c = 0; node < 2 && c < 4; c++)
        orb_cpuset_add(out, (uint32_t)node * 4 + c);
    return 0;
}

static void test_lanes_follow_the_nics_nodes(void **state)
{
    (void)state;
    struct orb_cpuset all;
    memset(&all, 0, sizeof all);
    for (uint32_t c = 0; c < 8; c++)
        orb_cpuset_add(&all, c);
    struct orb_lane_cpus out[4];
    int calls = 0;

    /* Rails on nodes 1, 1, 0: lanes go 1, 0, 1, 0 (first appearance order). */
    static const int32_t rails[] = {1, 1, 0};
    assert_int_equal(orb_lane_cpus_plan(rails, 3, 4, fake_node_cpus, &calls, &all, out), 0);
    static const int32_t want[] = {1, 0, 1, 0};
    for (int l = 0; l < 4; l++) {
        assert_int_equal(out[l].node, want[l]);
        assert_int_equal(orb_cpuset_count(&out[l].cpus), 4);
        assert_true(orb_cpuset_has(&out[l].cpus, (uint32_t)want[l] * 4));
    }

    /* The process may use CPUs 0-1 and 6 only: each lane gets its node's share of them. */
    struct orb_cpuset some;
    memset(&some, 0, sizeof some);
    orb_cpuset_add(&some, 0);
    orb_cpuset_add(&some, 1);
    orb_cpuset_add(&some, 6);
    assert_int_equal(orb_lane_cpus_plan(rails, 3, 2, fake_node_cpus, &calls, &some, out), 0);
    assert_int_equal(out[0].node, 1);
    assert_int_equal(orb_cpuset_count(&out[0].cpus), 1);
    assert_true(orb_cpuset_has(&out[0].cpus, 6));
    assert_int_equal(out[1].node, 0);
    assert_int_equal(orb_cpuset_count(&out[1].cpus), 2);

    /* None of node 1's CPUs allowed: that lane stays unbound; so do lanes of a node without
     * CPUs or whose CPUs cannot be read. */
    memset(&some, 0, sizeof some);
    orb_cpuset_add(&some, 0);
    assert_int_equal(orb_lane_cpus_plan(rails, 3, 2, fake_node_cpus, &calls, &some, out), 0);
    assert_int_equal(out[0].node, ORB_TOPO_NUMA_UNKNOWN);
    assert_int_equal(orb_cpuset_count(&out[0].cpus), 0);
    assert_int_equal(out[1].node, 0);
    static const int32_t odd[] = {2, 3};
    assert_int_equal(orb_lane_cpus_plan(odd, 2, 2, fake_node_cpus, &calls, &all, out), 0);
    assert_int_equal(out[0].node, ORB_TOPO_NUMA_UNKNOWN);
    assert_int_equal(out[1].node, ORB_TOPO_NUMA_UNKNOWN);

    /* No rail's node known (soft-RoCE): nothing is bound and no node is asked about. */
    static const int32_t unknown[] = {ORB_TOPO_NUMA_UNKNOWN, ORB_TOPO_NUMA_UNKNOWN};
    calls = 0;
    assert_int_equal(orb_lane_cpus_plan(unknown, 2, 3, fake_node_cpus, &calls, &all, out), 0);
    assert_int_equal(calls, 0);
    for (int l = 0; l < 3; l++)
        assert_int_equal(out[l].node, ORB_TOPO_NUMA_UNKNOWN);
    assert_int_equal(orb_lane_cpus_plan(rails, 3, 0, fake_node_cpus, &calls, &all, out), ORB_EINVAL);
    assert_int_equal(orb_lane_cpus_plan(NULL, 1, 1, fake_node_cpus, &calls, &all, out), ORB_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpulist_accepts_the_kernel_forms),
        cmocka_unit_test(test_cpulist_refuses_everything_else),
        cmocka_unit_test(test_node_cpus_from_a_tree),
        cmocka_unit_test(test_lanes_follow_the_nics_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
