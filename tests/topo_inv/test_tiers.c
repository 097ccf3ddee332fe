/* Locality tiers per location: GPU-to-NIC by nearest common PCI bridge and NUMA node, CPU-to-NIC
 * by NUMA node and distance, strict NUMA, filters and failed slots. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "topo/matrix.h"
#include "topo/tiers.h"
#include "topo/topo_config.h"
#include "fixture.h"

#define X ORB_TOPO_TIER_NONE

static struct orb_topo_config *new_config(void)
{
    struct orb_topo_config *cfg = malloc(sizeof *cfg);
    assert_non_null(cfg);
    orb_topo_config_defaults(cfg);
    return cfg;
}

static uint64_t eligible_mask(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg)
{
    uint64_t mask = 0;
    int rc = orb_topo_filter(inv, cfg, &mask);
    if (rc != 0)
        fail_msg("filter failed: %s", orb_last_error());
    return mask;
}

/* tier[0..n) equals `expect` and every later entry is ORB_TOPO_TIER_NONE. */
static void assert_tiers(const uint8_t tier[ORB_TOPO_MAX_NICS], const uint8_t *expect, unsigned n)
{
    for (unsigned i = 0; i < ORB_TOPO_MAX_NICS; i++) {
        unsigned want = i < n ? expect[i] : X;
        if (tier[i] != want)
            fail_msg("NIC %u: tier %u, expected %u", i, tier[i], want);
    }
}

static void gpu_tiers(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg, uint32_t gpu,
                      const uint8_t *expect, unsigned n)
{
    uint8_t tier[ORB_TOPO_MAX_NICS];
    int rc = orb_topo_tiers_gpu(inv, cfg, eligible_mask(inv, cfg), gpu, tier);
    if (rc != 0)
        fail_msg("cuda:%u: %s", gpu, orb_last_error());
    assert_tiers(tier, expect, n);
}

static void cpu_tiers(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg, int32_t node,
                      const uint8_t *expect, unsigned n)
{
    uint8_t tier[ORB_TOPO_MAX_NICS];
    int rc = orb_topo_tiers_cpu(inv, cfg, eligible_mask(inv, cfg), node, tier);
    if (rc != 0)
        fail_msg("cpu:%d: %s", node, orb_last_error());
    assert_tiers(tier, expect, n);
}

/* ---------------------------------------------------------------------------------------------
 * Arguments */

static void test_rejects_bad_arguments(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    uint8_t tier[ORB_TOPO_MAX_NICS];
    memset(tier, 0x77, sizeof tier);
    assert_int_equal(orb_topo_tiers_gpu(inv, cfg, 0xff, 8, tier), ORB_ENOENT);
    assert_non_null(strstr(orb_last_error(), "cuda:8"));
    assert_int_equal(orb_topo_tiers_gpu(NULL, cfg, 0xff, 0, tier), ORB_EINVAL);
    assert_int_equal(orb_topo_tiers_gpu(inv, NULL, 0xff, 0, tier), ORB_EINVAL);
    assert_int_equal(orb_topo_tiers_gpu(inv, cfg, 0xff, 0, NULL), ORB_EINVAL);
    assert_int_equal(orb_topo_tiers_cpu(inv, cfg, 0xff, -2, tier), ORB_EINVAL);
    assert_int_equal(orb_topo_tiers_cpu(NULL, cfg, 0xff, 0, tier), ORB_EINVAL);
    assert_int_equal(orb_topo_tiers_cpu(inv, cfg, 0xff, 0, NULL), ORB_EINVAL);
    struct orb_location bad = {7, 0};
    assert_int_equal(orb_topo_tiers_for_location(inv, cfg, 0xff, bad, tier), ORB_EINVAL);
    for (unsigned i = 0; i < ORB_TOPO_MAX_NICS; i++)
        assert_int_equal(tier[i], 0x77);
    free(cfg);
    free(inv);

    /* A host without GPUs has no cuda:0. */
    inv = load_fixture("two-socket");
    cfg = new_config();
    assert_int_equal(orb_topo_tiers_gpu(inv, cfg, 0x3, 0, tier), ORB_ENOENT);
    free(cfg);
    free(inv);
}

static void test_common_bridge_depth(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    const struct orb_topo_gpu *g = inv->gpus;
    const struct orb_topo_nic *n = inv->nics;
    assert_int_equal(orb_topo_common_bridge_depth(&g[0].path, &n[0].path), 5); /* same leaf switch */
    assert_int_equal(orb_topo_common_bridge_depth(&g[0].path, &n[2].path), 3); /* shared top switch */
    assert_int_equal(orb_topo_common_bridge_depth(&g[4].path, &n[4].path), 3);
    assert_int_equal(orb_topo_common_bridge_depth(&g[4].path, &n[6].path), 0); /* root complex only */
    assert_int_equal(orb_topo_common_bridge_depth(&g[0].path, &n[4].path), 0); /* other socket */
    struct orb_pci_path unknown;
    memset(&unknown, 0, sizeof unknown);
    assert_int_equal(orb_topo_common_bridge_depth(&unknown, &n[0].path), 0);
    assert_int_equal(orb_topo_common_bridge_depth(&g[0].path, &unknown), 0);
    /* A path is never its own bridge: the device hop itself is not shared. */
    assert_int_equal(orb_topo_common_bridge_depth(&n[0].path, &n[0].path), n[0].path.depth - 1);
    free(inv);
}

/* ---------------------------------------------------------------------------------------------
 * GPU tiers on the 8-GPU host */

static void test_dgx8_gpu_tier0_is_its_switch(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    static const uint8_t expect[4][8] = {
        {0, 0, 1, 1, 2, 2, 2, 2},
        {1, 1, 0, 0, 2, 2, 2, 2},
        {2, 2, 2, 2, 0, 0, 1, 1},
        {2, 2, 2, 2, 1, 1, 0, 0},
    };
    for (uint32_t gpu = 0; gpu < 8; gpu++)
        gpu_tiers(inv, cfg, gpu, expect[gpu / 2], 8);
    free(cfg);
    free(inv);
}

static void test_dgx8_strict_numa_rejects_other_socket(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    cfg->strict_local_numa = true;
    static const uint8_t gpu0[8] = {0, 0, 1, 1, X, X, X, X};
    static const uint8_t gpu7[8] = {X, X, X, X, 1, 1, 0, 0};
    gpu_tiers(inv, cfg, 0, gpu0, 8);
    gpu_tiers(inv, cfg, 7, gpu7, 8);
    free(cfg);
    free(inv);
}

static void test_filtered_neighbours_do_not_promote_others(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_0"), 0);
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_1"), 0);
    static const uint8_t gpu0[8] = {X, X, 1, 1, 2, 2, 2, 2};
    gpu_tiers(inv, cfg, 0, gpu0, 8);
    orb_topo_config_defaults(cfg);
    cfg->device_mask = 0x0f;
    static const uint8_t gpu4[8] = {2, 2, 2, 2, X, X, X, X};
    gpu_tiers(inv, cfg, 4, gpu4, 8);
    free(cfg);
    free(inv);
}

static void test_unknown_paths_are_never_nearest(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    memset(&inv->nics[0].path, 0, sizeof inv->nics[0].path);
    static const uint8_t with_nic0_unknown[8] = {1, 0, 1, 1, 2, 2, 2, 2};
    gpu_tiers(inv, cfg, 0, with_nic0_unknown, 8);
    memset(&inv->gpus[0].path, 0, sizeof inv->gpus[0].path);
    static const uint8_t with_gpu0_unknown[8] = {1, 1, 1, 1, 2, 2, 2, 2};
    gpu_tiers(inv, cfg, 0, with_gpu0_unknown, 8);
    /* GPU 1 shares its switch with mlx5_1 only now. */
    static const uint8_t gpu1[8] = {1, 0, 1, 1, 2, 2, 2, 2};
    gpu_tiers(inv, cfg, 1, gpu1, 8);
    free(cfg);
    free(inv);
}

static void test_failed_slot_never_renumbers(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    /* As discovery leaves a failed slot: id and name only. */
    struct orb_topo_nic failed;
    memset(&failed, 0, sizeof failed);
    failed.id = 1;
    failed.numa_node = ORB_TOPO_NUMA_UNKNOWN;
    strcpy(failed.name, "mlx5_1");
    inv->nics[1] = failed;
    static const uint8_t gpu0[8] = {0, X, 1, 1, 2, 2, 2, 2};
    gpu_tiers(inv, cfg, 0, gpu0, 8);
    static const uint8_t gpu6[8] = {2, X, 2, 2, 1, 1, 0, 0};
    gpu_tiers(inv, cfg, 6, gpu6, 8);
    static const uint8_t cpu1[8] = {1, X, 1, 1, 0, 0, 0, 0};
    cpu_tiers(inv, cfg, 1, cpu1, 8);
    /* Eligibility passed in by a caller that forgot the failed slot still excludes it. */
    uint8_t tier[ORB_TOPO_MAX_NICS];
    assert_int_equal(orb_topo_tiers_gpu(inv, cfg, 0xff, 0, tier), 0);
    assert_tiers(tier, gpu0, 8);
    free(cfg);
    free(inv);
}

/* ---------------------------------------------------------------------------------------------
 * CPU tiers */

static void test_dgx8_cpu_tiers(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    static const uint8_t cpu0[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    static const uint8_t cpu1[8] = {1, 1, 1, 1, 0, 0, 0, 0};
    static const uint8_t any[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    cpu_tiers(inv, cfg, 0, cpu0, 8);
    cpu_tiers(inv, cfg, 1, cpu1, 8);
    cpu_tiers(inv, cfg, ORB_TOPO_NUMA_UNKNOWN, any, 8);

    cfg->strict_local_numa = true;
    static const uint8_t cpu0_strict[8] = {0, 0, 0, 0, X, X, X, X};
    cpu_tiers(inv, cfg, 0, cpu0_strict, 8);
    cpu_tiers(inv, cfg, ORB_TOPO_NUMA_UNKNOWN, any, 8); /* unknown location: nothing rejected */

    /* preferred_numa_node overrides the owner's node, for "*" as for cpu:N. */
    cfg->strict_local_numa = false;
    cfg->preferred_numa_node = 1;
    cpu_tiers(inv, cfg, ORB_TOPO_NUMA_UNKNOWN, cpu1, 8);
    cpu_tiers(inv, cfg, 0, cpu1, 8);
    /* ... but not for GPU memory, which has a physical location. */
    static const uint8_t gpu0[8] = {0, 0, 1, 1, 2, 2, 2, 2};
    gpu_tiers(inv, cfg, 0, gpu0, 8);
    free(cfg);
    free(inv);
}

/* Four nodes in two pairs (distance 12 within a pair, 32 across), one NIC per node. */
static struct orb_topo_inventory *four_node_host(void)
{
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    assert_non_null(inv);
    static const uint8_t rows[4][4] = {{10, 12, 32, 32}, {12, 10, 32, 32}, {32, 32, 10, 12}, {32, 32, 12, 10}};
    inv->nnuma = 4;
    inv->nnics = 4;
    for (unsigned i = 0; i < 4; i++) {
        inv->numa[i].id = (int32_t)i;
        inv->numa[i].ndistances = 4;
        memcpy(inv->numa[i].distance, rows[i], 4);
        struct orb_topo_nic *nic = &inv->nics[i];
        nic->id = (uint8_t)i;
        nic->usable = 1;
        nic->nports = 1;
        nic->ports[0].num = 1;
        nic->numa_node = (int32_t)i;
        snprintf(nic->name, sizeof nic->name, "mlx5_%u", i);
    }
    return inv;
}

static void test_cpu_tiers_follow_distance(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = four_node_host();
    struct orb_topo_config *cfg = new_config();
    static const uint8_t cpu0[4] = {0, 1, 2, 2};
    static const uint8_t cpu2[4] = {2, 2, 0, 1};
    cpu_tiers(inv, cfg, 0, cpu0, 4);
    cpu_tiers(inv, cfg, 2, cpu2, 4);

    /* The nearest remote node among the eligible NICs becomes tier 1. */
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_1"), 0);
    static const uint8_t cpu0_far_only[4] = {0, X, 1, 1};
    cpu_tiers(inv, cfg, 0, cpu0_far_only, 4);
    orb_topo_config_defaults(cfg);

    /* A NIC whose node is unknown sits in tier 1, above known-far NICs. */
    inv->nics[3].numa_node = ORB_TOPO_NUMA_UNKNOWN;
    static const uint8_t cpu0_unknown[4] = {0, 1, 2, 1};
    cpu_tiers(inv, cfg, 0, cpu0_unknown, 4);
    cfg->strict_local_numa = true;
    static const uint8_t cpu0_unknown_strict[4] = {0, X, X, 1};
    cpu_tiers(inv, cfg, 0, cpu0_unknown_strict, 4);
    cfg->strict_local_numa = false;
    inv->nics[3].numa_node = 3;

    /* Without a distance row, every remote NIC is tier 1. */
    inv->numa[0].ndistances = 0;
    static const uint8_t cpu0_no_row[4] = {0, 1, 1, 1};
    cpu_tiers(inv, cfg, 0, cpu0_no_row, 4);
    cpu_tiers(inv, cfg, 2, cpu2, 4);
    free(cfg);
    free(inv);
}

static void test_two_socket_cpu_tiers(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("two-socket");
    struct orb_topo_config *cfg = new_config();
    static const uint8_t cpu0[2] = {0, 1};
    static const uint8_t cpu1[2] = {1, 0};
    cpu_tiers(inv, cfg, 0, cpu0, 2);
    cpu_tiers(inv, cfg, 1, cpu1, 2);
    cfg->strict_local_numa = true;
    static const uint8_t cpu1_strict[2] = {X, 0};
    cpu_tiers(inv, cfg, 1, cpu1_strict, 2);
    free(cfg);
    free(inv);
}

/* ---------------------------------------------------------------------------------------------
 * A host without NUMA data */

static void test_no_numa_host_stays_eligible_under_strict(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("no-numa");
    struct orb_topo_config *cfg = new_config();
    static const uint8_t unknown_nic[1] = {1};
    static const uint8_t any[1] = {0};
    static const uint8_t gpu[1] = {2}; /* different root ports, no NUMA data */
    for (int strict = 0; strict <= 1; strict++) {
        cfg->strict_local_numa = strict != 0;
        cpu_tiers(inv, cfg, 0, unknown_nic, 1);
        cpu_tiers(inv, cfg, ORB_TOPO_NUMA_UNKNOWN, any, 1);
        gpu_tiers(inv, cfg, 0, gpu, 1);
    }
    /* Known NIC, unknown GPU node: strict still keeps it. */
    inv->nics[0].numa_node = 0;
    gpu_tiers(inv, cfg, 0, gpu, 1);
    free(cfg);
    free(inv);
}

static void test_location_dispatch(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    uint8_t direct[ORB_TOPO_MAX_NICS], via[ORB_TOPO_MAX_NICS];
    struct orb_location loc;

    assert_int_equal(orb_location_parse("cuda:5", &loc), 0);
    assert_int_equal(orb_topo_tiers_gpu(inv, cfg, 0xff, 5, direct), 0);
    assert_int_equal(orb_topo_tiers_for_location(inv, cfg, 0xff, loc, via), 0);
    assert_memory_equal(direct, via, sizeof direct);

    assert_int_equal(orb_location_parse("cpu:1", &loc), 0);
    assert_int_equal(orb_topo_tiers_cpu(inv, cfg, 0xff, 1, direct), 0);
    assert_int_equal(orb_topo_tiers_for_location(inv, cfg, 0xff, loc, via), 0);
    assert_memory_equal(direct, via, sizeof direct);

    assert_int_equal(orb_location_parse("*", &loc), 0);
    assert_int_equal(orb_topo_tiers_cpu(inv, cfg, 0xff, ORB_TOPO_NUMA_UNKNOWN, direct), 0);
    assert_int_equal(orb_topo_tiers_for_location(inv, cfg, 0xff, loc, via), 0);
    assert_memory_equal(direct, via, sizeof direct);
    free(cfg);
    free(inv);
}

/* A matrix row replaces the discovered tiers of its location (rank r is tier r, unlisted NICs
 * excluded); locations without a row keep discovery's tiers (native form) or take the "*" row;
 * a disabled row excludes every NIC; filtered and strict-NUMA exclusions survive any row. */
static void test_matrix_rows_replace_tiers(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    uint8_t tier[ORB_TOPO_MAX_NICS];
    struct orb_location cpu0, cpu1, any;
    assert_int_equal(orb_location_parse("cpu:0", &cpu0), 0);
    assert_int_equal(orb_location_parse("cpu:1", &cpu1), 0);
    assert_int_equal(orb_location_parse("*", &any), 0);

    /* No matrix: discovery alone. */
    static const uint8_t disc0[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    assert_int_equal(orb_topo_tiers_ranked(inv, cfg, 0xff, NULL, cpu0, tier), 0);
    assert_tiers(tier, disc0, 8);

    /* Classic: cpu:0 prefers mlx5_5, then mlx5_0; cpu:1 is disabled; "*" is synthesised. */
    static const char classic[] = "{\"cpu:0\": [[\"mlx5_5\"], [\"mlx5_0\"]], \"cpu:1\": [[], []]}";
    struct orb_topo_ranks *ranks = NULL;
    assert_int_equal(orb_topo_ranks_parse(classic, strlen(classic), ORB_MATRIX_ACCEPT_ANY, "priority_matrix", inv,
                                          0xff, &ranks), 0);
    static const uint8_t row0[8] = {1, X, X, X, X, 0, X, X};
    assert_int_equal(orb_topo_tiers_ranked(inv, cfg, 0xff, ranks, cpu0, tier), 0);
    assert_tiers(tier, row0, 8);
    static const uint8_t none[8] = {X, X, X, X, X, X, X, X};
    assert_int_equal(orb_topo_tiers_ranked(inv, cfg, 0xff, ranks, cpu1, tier), 0);
    assert_tiers(tier, none, 8);
    assert_int_equal(orb_topo_tiers_ranked(inv, cfg, 0xff, ranks, any, tier), 0);
    assert_tiers(tier, row0, 8); /* "*" from the rows that list NICs */
    /* Strict NUMA rejects mlx5_5 (socket 1) for cpu:0 whatever the row says; a filtered NIC
     * (mlx5_0 outside the mask) stays out too. */
    cfg->strict_local_numa = true;
    static const uint8_t strict0[8] = {1, X, X, X, X, X, X, X};
    assert_int_equal(orb_topo_tiers_ranked(inv, cfg, 0xff, ranks, cpu0, tier), 0);
    assert_tiers(tier, strict0, 8);
    cfg->strict_local_numa = false;
    static const uint8_t masked0[8] = {X, X, X, X, X, 0, X, X};
    assert_int_equal(orb_topo_tiers_ranked(inv, cfg, 0xfe, ranks, cpu0, tier), 0);
    assert_tiers(tier, masked0, 8);
    orb_topo_ranks_free(ranks);

    /* Native: rank2 is tier 2; a location without a row keeps discovery's tiers. */
    static const char native[] = "{\"nics\": [{\"name\": \"mlx5_7\"}, {\"name\": \"mlx5_1\"}, {\"name\": "
                                 "\"mlx5_2\"}], \"mems\": [{\"name\": \"cpu:1\", \"device_list\": {\"rank0\": [1], "
                                 "\"rank1\": [0], \"rank2\": [2]}}]}";
    assert_int_equal(orb_topo_ranks_parse(native, strlen(native), ORB_MATRIX_ACCEPT_ANY, "custom_json_path", inv,
                                          0xff, &ranks), 0);
    static const uint8_t row1[8] = {X, 0, 2, X, X, X, X, 1};
    assert_int_equal(orb_topo_tiers_ranked(inv, cfg, 0xff, ranks, cpu1, tier), 0);
    assert_tiers(tier, row1, 8);
    assert_int_equal(orb_topo_tiers_ranked(inv, cfg, 0xff, ranks, cpu0, tier), 0);
    assert_tiers(tier, disc0, 8);
    orb_topo_ranks_free(ranks);
    free(cfg);
    free(inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rejects_bad_arguments),
        cmocka_unit_test(test_matrix_rows_replace_tiers),
        cmocka_unit_test(test_common_bridge_depth),
        cmocka_unit_test(test_dgx8_gpu_tier0_is_its_switch),
        cmocka_unit_test(test_dgx8_strict_numa_rejects_other_socket),
        cmocka_unit_test(test_filtered_neighbours_do_not_promote_others),
        cmocka_unit_test(test_unknown_paths_are_never_nearest),
        cmocka_unit_test(test_failed_slot_never_renumbers),
        cmocka_unit_test(test_dgx8_cpu_tiers),
        cmocka_unit_test(test_cpu_tiers_follow_distance),
        cmocka_unit_test(test_two_socket_cpu_tiers),
        cmocka_unit_test(test_no_numa_host_stays_eligible_under_strict),
        cmocka_unit_test(test_location_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
