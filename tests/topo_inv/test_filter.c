/* NIC eligibility configuration: validation, whitelist/blacklist, device_mask and pins. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "topo/topo_config.h"
#include "fixture.h"

#define MASK_SENTINEL 0x5a5a5a5a5a5a5a5aull

static struct orb_topo_config *new_config(void)
{
    struct orb_topo_config *cfg = malloc(sizeof *cfg);
    assert_non_null(cfg);
    memset(cfg, 0xcd, sizeof *cfg);
    orb_topo_config_defaults(cfg);
    return cfg;
}

/* The filter fails with ORB_ECONFIG, leaves the mask alone and names `needle` in the message. */
static void assert_filter_fails(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg,
                                const char *needle)
{
    uint64_t mask = MASK_SENTINEL;
    assert_int_equal(orb_topo_filter(inv, cfg, &mask), ORB_ECONFIG);
    assert_int_equal(mask, MASK_SENTINEL);
    if (strstr(orb_last_error(), needle) == NULL)
        fail_msg("message \"%s\" does not name \"%s\"", orb_last_error(), needle);
}

static uint64_t filter_ok(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg)
{
    uint64_t mask = MASK_SENTINEL;
    int rc = orb_topo_filter(inv, cfg, &mask);
    if (rc != 0)
        fail_msg("filter failed: %s", orb_last_error());
    return mask;
}

/* ---------------------------------------------------------------------------------------------
 * Configuration alone */

static void test_defaults(void **state)
{
    (void)state;
    struct orb_topo_config *cfg = new_config();
    assert_int_equal(cfg->nwhitelist, 0);
    assert_int_equal(cfg->nblacklist, 0);
    assert_string_equal(cfg->pin.device, "");
    assert_int_equal(cfg->pin.port, 0);
    assert_int_equal(cfg->pin.gid_index, ORB_TOPO_PIN_NONE);
    assert_int_equal(cfg->device_mask, UINT64_MAX);
    assert_int_equal(cfg->preferred_numa_node, ORB_TOPO_NUMA_UNKNOWN);
    assert_false(cfg->strict_local_numa);
    assert_int_equal(orb_topo_config_validate(cfg), 0);
    orb_topo_config_defaults(NULL); /* tolerated */
    free(cfg);
}

static void test_validation_rejects_bad_fields(void **state)
{
    (void)state;
    assert_int_equal(orb_topo_config_validate(NULL), ORB_EINVAL);
    struct orb_topo_config *cfg = new_config();

    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5 0"), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "rdma_whitelist"));
    assert_int_equal(orb_topo_config_blacklist_add(cfg, ""), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "rdma_blacklist"));
    assert_int_equal(orb_topo_config_whitelist_add(cfg, ".."), ORB_ECONFIG);
    char long_name[65];
    memset(long_name, 'a', 64);
    long_name[64] = '\0';
    assert_int_equal(orb_topo_config_blacklist_add(cfg, long_name), ORB_ECONFIG);
    long_name[63] = '\0';
    assert_int_equal(orb_topo_config_blacklist_add(cfg, long_name), 0);
    assert_int_equal(orb_topo_config_whitelist_add(NULL, "mlx5_0"), ORB_EINVAL);
    assert_int_equal(orb_topo_config_whitelist_add(cfg, NULL), ORB_EINVAL);
    assert_int_equal(cfg->nwhitelist, 0);
    assert_int_equal(cfg->nblacklist, 1);

    /* Bounded lists. */
    orb_topo_config_defaults(cfg);
    for (unsigned i = 0; i < ORB_TOPO_FILTER_NAMES_MAX; i++)
        assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_0"), 0);
    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_0"), ORB_ECONFIG);
    assert_int_equal(cfg->nwhitelist, ORB_TOPO_FILTER_NAMES_MAX);
    assert_int_equal(orb_topo_config_validate(cfg), 0);
    cfg->nwhitelist = ORB_TOPO_FILTER_NAMES_MAX + 1;
    assert_int_equal(orb_topo_config_validate(cfg), ORB_ECONFIG);

    /* Fields written directly are validated too. */
    orb_topo_config_defaults(cfg);
    cfg->nblacklist = 1;
    memset(cfg->blacklist[0], 'x', ORB_TOPO_NAME_MAX); /* unterminated */
    assert_int_equal(orb_topo_config_validate(cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "rdma_blacklist"));

    orb_topo_config_defaults(cfg);
    memset(cfg->pin.device, 'x', ORB_TOPO_NAME_MAX);
    assert_int_equal(orb_topo_config_validate(cfg), ORB_ECONFIG);
    strcpy(cfg->pin.device, "mlx5/0");
    assert_int_equal(orb_topo_config_validate(cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "device"));

    orb_topo_config_defaults(cfg);
    cfg->pin.gid_index = -2;
    assert_int_equal(orb_topo_config_validate(cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "gid_index"));
    cfg->pin.gid_index = ORB_TOPO_GID_INDEX_MAX + 1;
    assert_int_equal(orb_topo_config_validate(cfg), ORB_ECONFIG);
    cfg->pin.gid_index = ORB_TOPO_GID_INDEX_MAX;
    assert_int_equal(orb_topo_config_validate(cfg), 0);

    orb_topo_config_defaults(cfg);
    cfg->device_mask = 0;
    assert_int_equal(orb_topo_config_validate(cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "device_mask"));

    orb_topo_config_defaults(cfg);
    cfg->preferred_numa_node = -2;
    assert_int_equal(orb_topo_config_validate(cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "preferred_numa_node"));
    free(cfg);
}

static void test_filter_rejects_null(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("two-socket");
    struct orb_topo_config *cfg = new_config();
    uint64_t mask = MASK_SENTINEL;
    assert_int_equal(orb_topo_filter(NULL, cfg, &mask), ORB_EINVAL);
    assert_int_equal(orb_topo_filter(inv, NULL, &mask), ORB_EINVAL);
    assert_int_equal(orb_topo_filter(inv, cfg, NULL), ORB_EINVAL);
    assert_int_equal(mask, MASK_SENTINEL);
    cfg->device_mask = 0; /* static validation runs inside the filter too */
    assert_filter_fails(inv, cfg, "device_mask");
    free(cfg);
    free(inv);
}

/* ---------------------------------------------------------------------------------------------
 * Lists and mask on the 8-NIC host */

static void test_default_admits_every_usable_nic(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    /* mlx5_5's port is DOWN: still eligible (port state is health, not eligibility). */
    assert_int_equal(filter_ok(inv, cfg), 0xff);
    inv->nics[3].usable = 0; /* a slot that failed discovery */
    assert_int_equal(filter_ok(inv, cfg), 0xf7);
    free(cfg);
    free(inv);
}

static void test_whitelist_wins_over_blacklist(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_0"), 0);
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_6"), 0);
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_99"), 0); /* absent: ignored */
    assert_int_equal(filter_ok(inv, cfg), 0xbe);
    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_6"), 0);
    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_3"), 0);
    assert_int_equal(filter_ok(inv, cfg), 0x48); /* the blacklist no longer applies */
    free(cfg);
    free(inv);
}

static void test_whitelist_names_must_exist(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_1"), 0);
    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_8"), 0);
    assert_filter_fails(inv, cfg, "mlx5_8");
    assert_non_null(strstr(orb_last_error(), "rdma_whitelist"));
    free(cfg);
    free(inv);
}

static void test_whitelisted_failed_slot_is_excluded(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    inv->nics[2].usable = 0;
    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_2"), 0);
    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_4"), 0);
    assert_int_equal(filter_ok(inv, cfg), 0x10);
    free(cfg);
    free(inv);
}

static void test_device_mask(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    cfg->device_mask = 0xf0;
    assert_int_equal(filter_ok(inv, cfg), 0xf0);
    cfg->device_mask = 0xff00000000000003ull; /* bits beyond the inventory are ignored */
    assert_int_equal(filter_ok(inv, cfg), 0x03);
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_0"), 0);
    assert_int_equal(filter_ok(inv, cfg), 0x02);
    cfg->device_mask = 0xff00000000000000ull; /* only ids that do not exist */
    assert_filter_fails(inv, cfg, "no usable NIC");
    free(cfg);
    free(inv);
}

static void test_filters_that_leave_nothing_fail(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("two-socket");
    struct orb_topo_config *cfg = new_config();
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_0"), 0);
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_1"), 0);
    assert_filter_fails(inv, cfg, "no usable NIC");
    orb_topo_config_defaults(cfg);
    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_0"), 0);
    cfg->device_mask = 0x2;
    assert_filter_fails(inv, cfg, "no usable NIC");
    free(cfg);

    /* Defaults on a host without usable NICs: nothing eligible, not an error. */
    cfg = new_config();
    inv->nics[0].usable = 0;
    inv->nics[1].usable = 0;
    assert_int_equal(filter_ok(inv, cfg), 0);
    inv->nnics = 0;
    assert_int_equal(filter_ok(inv, cfg), 0);
    free(cfg);
    free(inv);
}

/* ---------------------------------------------------------------------------------------------
 * Pins */

static void test_device_pin(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();
    strcpy(cfg->pin.device, "mlx5_2");
    assert_int_equal(filter_ok(inv, cfg), 0x04);
    cfg->pin.port = 1;
    cfg->pin.gid_index = 0;
    assert_int_equal(filter_ok(inv, cfg), 0x04);
    /* A pinned NIC whose port is DOWN stays pinned: no fallback to a healthy one. */
    strcpy(cfg->pin.device, "mlx5_5");
    assert_int_equal(filter_ok(inv, cfg), 0x20);
    free(cfg);
    free(inv);
}

static void test_device_pin_never_falls_back(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    struct orb_topo_config *cfg = new_config();

    strcpy(cfg->pin.device, "mlx5_9");
    assert_filter_fails(inv, cfg, "mlx5_9");
    assert_non_null(strstr(orb_last_error(), "not present"));

    strcpy(cfg->pin.device, "mlx5_2");
    assert_int_equal(orb_topo_config_blacklist_add(cfg, "mlx5_2"), 0);
    assert_filter_fails(inv, cfg, "mlx5_2");
    assert_non_null(strstr(orb_last_error(), "excluded"));

    orb_topo_config_defaults(cfg);
    strcpy(cfg->pin.device, "mlx5_2");
    assert_int_equal(orb_topo_config_whitelist_add(cfg, "mlx5_3"), 0);
    assert_filter_fails(inv, cfg, "mlx5_2");

    orb_topo_config_defaults(cfg);
    strcpy(cfg->pin.device, "mlx5_2");
    cfg->device_mask = ~0x04ull;
    assert_filter_fails(inv, cfg, "mlx5_2");

    orb_topo_config_defaults(cfg);
    strcpy(cfg->pin.device, "mlx5_2");
    cfg->pin.port = 2;
    assert_filter_fails(inv, cfg, "mlx5_2");
    assert_non_null(strstr(orb_last_error(), "port 2"));

    cfg->pin.port = 1;
    cfg->pin.gid_index = 1; /* IB ports of this host hold only GID 0 */
    assert_filter_fails(inv, cfg, "mlx5_2");
    assert_non_null(strstr(orb_last_error(), "gid_index"));
    cfg->pin.port = 0;
    assert_filter_fails(inv, cfg, "mlx5_2");

    orb_topo_config_defaults(cfg);
    strcpy(cfg->pin.device, "mlx5_2");
    inv->nics[2].usable = 0;
    assert_filter_fails(inv, cfg, "mlx5_2");
    assert_non_null(strstr(orb_last_error(), "failed discovery"));
    free(cfg);
    free(inv);
}

static void test_port_and_gid_pins_without_device(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("two-socket");
    struct orb_topo_config *cfg = new_config();
    cfg->pin.port = 1;
    assert_int_equal(filter_ok(inv, cfg), 0x3);
    cfg->pin.gid_index = 3; /* the RoCE v2 IPv4 entry on both NICs */
    assert_int_equal(filter_ok(inv, cfg), 0x3);
    /* Only mlx5_1 keeps GID 3: mlx5_0 drops out. */
    inv->nics[0].ports[0].ngids = 3;
    assert_int_equal(filter_ok(inv, cfg), 0x2);
    cfg->pin.port = 0;
    assert_int_equal(filter_ok(inv, cfg), 0x2);
    cfg->pin.gid_index = 7; /* unset on both */
    assert_filter_fails(inv, cfg, "gid_index");
    cfg->pin.gid_index = ORB_TOPO_PIN_NONE;
    cfg->pin.port = 2;
    assert_filter_fails(inv, cfg, "port");
    cfg->pin.gid_index = 0;
    assert_filter_fails(inv, cfg, "port 2");
    free(cfg);
    free(inv);
}

static void test_preferred_numa_node_must_exist(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("two-socket");
    struct orb_topo_config *cfg = new_config();
    cfg->preferred_numa_node = 1;
    assert_int_equal(filter_ok(inv, cfg), 0x3);
    cfg->preferred_numa_node = 2;
    assert_filter_fails(inv, cfg, "preferred_numa_node");
    free(inv);

    /* A host without NUMA data cannot check the hint: it is accepted. */
    inv = load_fixture("no-numa");
    assert_int_equal(filter_ok(inv, cfg), 0x1);
    free(cfg);
    free(inv);
}

static void test_find_nic(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    assert_int_equal(orb_topo_find_nic(inv, "mlx5_0"), 0);
    assert_int_equal(orb_topo_find_nic(inv, "mlx5_7"), 7);
    assert_int_equal(orb_topo_find_nic(inv, "mlx5_8"), -1);
    assert_int_equal(orb_topo_find_nic(inv, "mlx5_"), -1);
    assert_int_equal(orb_topo_find_nic(inv, ""), -1);
    assert_int_equal(orb_topo_find_nic(inv, NULL), -1);
    assert_int_equal(orb_topo_find_nic(NULL, "mlx5_0"), -1);
    /* A failed slot with no valid name is never found by an empty name. */
    memset(inv->nics[1].name, 0, sizeof inv->nics[1].name);
    assert_int_equal(orb_topo_find_nic(inv, ""), -1);
    free(inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_validation_rejects_bad_fields),
        cmocka_unit_test(test_filter_rejects_null),
        cmocka_unit_test(test_default_admits_every_usable_nic),
        cmocka_unit_test(test_whitelist_wins_over_blacklist),
        cmocka_unit_test(test_whitelist_names_must_exist),
        cmocka_unit_test(test_whitelisted_failed_slot_is_excluded),
        cmocka_unit_test(test_device_mask),
        cmocka_unit_test(test_filters_that_leave_nothing_fail),
        cmocka_unit_test(test_device_pin),
        cmocka_unit_test(test_device_pin_never_falls_back),
        cmocka_unit_test(test_port_and_gid_pins_without_device),
        cmocka_unit_test(test_preferred_numa_node_must_exist),
        cmocka_unit_test(test_find_nic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
