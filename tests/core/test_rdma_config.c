/* RDMA settings through the public API: defaults, every key's text round trip, rejected values
 * (the handle unchanged), JSON (an engine document or the RDMA object), cross-key checks, and an
 * engine taking its own copy through struct orb_engine_params. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <orbite/orbite.h>

static orb_rdma_config *fresh(void)
{
    orb_rdma_config *c = NULL;
    assert_int_equal(orb_rdma_config_new(&c), 0);
    assert_non_null(c);
    return c;
}

static void expect_key(const orb_rdma_config *c, const char *key, const char *want)
{
    char buf[256];
    assert_int_equal(orb_rdma_config_get(c, key, buf, sizeof buf), 0);
    assert_string_equal(buf, want);
}

/* The specification's defaults. */
static void test_defaults(void **state)
{
    (void)state;
    orb_rdma_config *c = fresh();
    static const char *const defaults[][2] = {
        {"device", ""}, {"port", "0"}, {"gid_index", "-1"}, {"rdma_whitelist", ""},
        {"rdma_blacklist", ""}, {"device_mask", "0xffffffffffffffff"},
        {"preferred_numa_node", "-1"}, {"strict_local_numa", "false"}, {"priority_matrix", ""},
        {"custom_json_path", ""}, {"smart_selection", "true"},
        {"deadline_bw_arbitration", "false"}, {"log_slice_affinity", "false"},
        {"priority_promotion_timeout", "10ms"}, {"priority_promotion_per_entry", "false"},
        {"shared_quota_shm_path", ""}, {"slot_rotation_interval", "2ms"},
        {"host_memory", "direct"}, {"progress_mode", "polling"}, {"num_lanes", "2"},
        {"signal_interval", "1"}, {"max_rd_atomic", "16"}, {"max_dest_rd_atomic", "16"},
        {"ack_timeout", "18"}, {"retry_count", "7"}, {"read_replays", "1"}, {"max_endpoints", "64"}, {"max_grants", "64"}, {"max_send_wr", "16"},
        {"max_cqes", "1024"}, {"max_direct_bytes", "67108864"},
        {"max_staging_bytes", "67108864"}, {"max_cached_mrs", "64"},
        {"max_cached_mr_bytes", "67108864"}, {"max_window_key_indices", "65536"},
        {"rail_error_threshold", "3"}, {"rail_error_window", "10s"}, {"rail_cooldown", "30s"},
        {"rail_probe_interval", "1s"}, {"max_rail_pairs", "4096"},
    };
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        expect_key(c, defaults[i][0], defaults[i][1]);
    orb_rdma_config_free(c);
    orb_rdma_config_free(NULL);
}

/* Each accepted text comes back as the canonical text; each refused one leaves the value. */
static void test_text_round_trip_and_refusals(void **state)
{
    (void)state;
    orb_rdma_config *c = fresh();
    static const char *const good[][3] = { /* key, input, read back */
        {"device", "rxe_a0", "rxe_a0"}, {"device", "", ""}, {"port", "1", "1"},
        {"gid_index", "3", "3"}, {"gid_index", "-1", "-1"},
        {"rdma_whitelist", "mlx5_0,mlx5_1", "mlx5_0,mlx5_1"}, {"rdma_whitelist", "", ""},
        {"device_mask", "0x3", "0x3"}, {"device_mask", "12", "0xc"},
        {"preferred_numa_node", "1", "1"}, {"strict_local_numa", "true", "true"},
        {"priority_promotion_timeout", "1500us", "1500us"},
        {"priority_promotion_timeout", "2000us", "2ms"}, {"rail_cooldown", "120s", "120s"},
        {"rail_probe_interval", "0s", "0ns"}, {"slot_rotation_interval", "5ms", "5ms"},
        {"slot_rotation_interval", "1s", "1s"},
        {"host_memory", "staged", "staged"}, {"progress_mode", "event_driven", "event_driven"},
        {"cuda_memory", "direct", "direct"}, {"cuda_memory", "staged", "staged"},
        {"gpu_direct_registration", "dmabuf", "dmabuf"}, {"gpu_direct_registration", "peermem", "peermem"},
        {"gpu_direct_registration", "auto", "auto"},
        {"disable_gpu_direct_rdma", "true", "true"}, {"disable_gpu_direct_rdma", "false", "false"},
        {"gpu_source_reuse", "true", "true"}, {"gpu_source_reuse", "false", "false"},
        {"num_lanes", "8", "8"}, {"max_rd_atomic", "0", "0"}, {"ack_timeout", "0", "0"},
        {"ack_timeout", "31", "31"}, {"retry_count", "0", "0"}, {"read_replays", "0", "0"}, {"read_replays", "8", "8"},
        {"max_direct_bytes", "1073741824", "1073741824"},
        {"shared_quota_shm_path", "/orbite-rdma-slots", "/orbite-rdma-slots"},
        {"priority_matrix", "{\"cpu:0\": [[\"mlx5_0\"], []]}", "{\"cpu:0\": [[\"mlx5_0\"], []]}"},
        {"priority_matrix", "", ""},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(orb_rdma_config_set(c, good[i][0], good[i][1]), 0);
        expect_key(c, good[i][0], good[i][2]);
    }
    static const char *const bad[][2] = {
        {"port", "256"}, {"port", "-1"}, {"port", " 1"}, {"port", "1x"}, {"port", ""},
        {"gid_index", "-2"}, {"gid_index", "65536"}, {"device", "mlx5 0"},
        {"device", "a/b"}, {"rdma_whitelist", "a,,b"}, {"rdma_whitelist", "a,"},
        {"device_mask", "0"}, {"device_mask", "0x"}, {"device_mask", "0xg1"},
        {"strict_local_numa", "1"}, {"strict_local_numa", "TRUE"},
        {"priority_promotion_timeout", "10"}, {"priority_promotion_timeout", "10 ms"},
        {"priority_promotion_timeout", "999ns"}, {"rail_cooldown", "99999999999999999999s"},
        {"host_memory", "Direct"}, {"progress_mode", "busy"}, {"num_lanes", "0"},
        {"cuda_memory", "gpudirect"}, {"gpu_direct_registration", "nvidia_peermem"},
        {"disable_gpu_direct_rdma", "1"}, {"disable_gpu_direct_rdma", "yes"}, {"gpu_source_reuse", "on"},
        {"num_lanes", "65"}, {"signal_interval", "0"}, {"max_cqes", "15"},
        {"ack_timeout", "32"}, {"retry_count", "8"}, {"read_replays", "9"}, {"rail_error_threshold", "9"},
        {"rail_error_threshold", "0"}, {"max_rail_pairs", "0"}, {"max_rail_pairs", "1048577"},
        {"shared_quota_shm_path", "no-slash"}, {"shared_quota_shm_path", "/a/b"},
        {"shared_quota_shm_path", "/"}, {"shared_quota_shm_path", "/.."},
        {"slot_rotation_interval", "1001ms"}, {"slot_rotation_interval", "999us"},
        {"max_window_key_indices", "18446744073709551616"}, {"no_such_key", "1"},
    };
    char before[256], after[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int known = orb_rdma_config_get(c, bad[i][0], before, sizeof before) == 0;
        assert_int_equal(orb_rdma_config_set(c, bad[i][0], bad[i][1]), ORB_ECONFIG);
        assert_non_null(strstr(orb_last_error(), bad[i][0]));
        if (known) {
            assert_int_equal(orb_rdma_config_get(c, bad[i][0], after, sizeof after), 0);
            assert_string_equal(before, after);
        }
    }
    /* 64 names fit, 65 do not. */
    char list[65 * 8];
    size_t w = 0;
    for (int i = 0; i < 65; i++)
        w += (size_t)snprintf(list + w, sizeof list - w, "%snic%d", i ? "," : "", i);
    assert_int_equal(orb_rdma_config_set(c, "rdma_blacklist", list), ORB_ECONFIG);
    *strrchr(list, ',') = '\0';
    assert_int_equal(orb_rdma_config_set(c, "rdma_blacklist", list), 0);
    /* A buffer too small for the value names the size it needs. */
    char tiny[4];
    assert_int_equal(orb_rdma_config_get(c, "rdma_blacklist", tiny, sizeof tiny), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "needs"));
    assert_int_equal(orb_rdma_config_set(NULL, "port", "1"), ORB_EINVAL);
    assert_int_equal(orb_rdma_config_set(c, NULL, "1"), ORB_EINVAL);
    assert_int_equal(orb_rdma_config_set(c, "port", NULL), ORB_EINVAL);
    orb_rdma_config_free(c);
}

static void test_json(void **state)
{
    (void)state;
    orb_rdma_config *c = fresh();
    /* An engine document: the "rdma" member is read, the engine keys are left to the engine. */
    const char *doc =
        "{\"tcp_stripes\": 4, \"rdma\": {\"device\": \"rxe_a0\", \"port\": 1, \"gid_index\": 1,"
        " \"rdma_whitelist\": [\"rxe_a0\", \"rxe_b0\"], \"device_mask\": \"0x5\","
        " \"strict_local_numa\": true, \"num_lanes\": 4, \"host_memory\": \"staged\","
        " \"rail_cooldown\": \"45s\", \"priority_matrix\": \"{}\"}}";
    assert_int_equal(orb_rdma_config_load_json(c, doc), 0);
    expect_key(c, "device", "rxe_a0");
    expect_key(c, "port", "1");
    expect_key(c, "rdma_whitelist", "rxe_a0,rxe_b0");
    expect_key(c, "device_mask", "0x5");
    expect_key(c, "strict_local_numa", "true");
    expect_key(c, "num_lanes", "4");
    expect_key(c, "host_memory", "staged");
    expect_key(c, "rail_cooldown", "45s");
    expect_key(c, "priority_matrix", "{}");
    /* The same document suits the engine loader, which skips "rdma". */
    struct orb_engine_config ec;
    orb_engine_config_init(&ec);
    assert_int_equal(orb_engine_config_load_json(&ec, doc), 0);
    assert_int_equal(ec.tcp_stripes, 4);
    assert_int_equal(orb_engine_config_load_json(&ec, "{\"rdma\": 3}"), ORB_ECONFIG);
    /* The RDMA object alone; null clears text. */
    assert_int_equal(orb_rdma_config_load_json(c, "{\"priority_matrix\": null, \"port\": 2}"), 0);
    expect_key(c, "priority_matrix", "");
    expect_key(c, "port", "2");
    /* Wrong JSON kinds, unknown keys and failed checks change nothing, not even earlier keys of
     * the same document. */
    static const char *const bad[] = {
        "{\"port\": \"1\"}", "{\"strict_local_numa\": 1}", "{\"rdma_whitelist\": \"a\"}",
        "{\"rdma_whitelist\": [\"a,b\"]}", "{\"rdma_whitelist\": [1]}", "{\"rail_cooldown\": 30}",
        "{\"num_lanes\": 4.5}", "{\"port\": 1, \"port\": 2}", "{\"port\": 3, \"bogus\": 1}",
        "{\"port\": 3, \"device\": \"mlx5_9\"}", /* pinned, not in the whitelist */
        "{\"custom_json_path\": \"/etc/t.json\", \"priority_matrix\": \"{}\"}",
        "{\"rdma\": []}", "[]", "{", "{\"device\": \"a\\u0000b\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(orb_rdma_config_load_json(c, bad[i]), ORB_ECONFIG);
        expect_key(c, "port", "2");
        expect_key(c, "device", "rxe_a0");
        expect_key(c, "custom_json_path", "");
    }
    /* Blacklisting the pinned device is refused too (with an empty whitelist). */
    assert_int_equal(orb_rdma_config_load_json(c, "{\"rdma_whitelist\": [], \"rdma_blacklist\":"
                                                  " [\"rxe_a0\"]}"), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "blacklisted"));
    orb_rdma_config_free(c);
}

/* An engine takes a copy: the caller's handle can change or go; unknown param bits refuse. */
static void test_engine_params(void **state)
{
    (void)state;
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.enable_source = 0;
    orb_rdma_config *c = fresh();
    assert_int_equal(orb_rdma_config_set(c, "num_lanes", "3"), 0);
    struct orb_engine_params p = {.field_mask = ORB_ENGINE_PARAM_CONFIG | ORB_ENGINE_PARAM_RDMA,
                                  .config = &cfg, .rdma = c};
    orb_engine *e = NULL;
    assert_int_equal(orb_engine_create_params(&p, &e), 0);
    orb_rdma_config_free(c);
    orb_engine_free(e);

    p.field_mask = 1ull << 40;
    e = NULL;
    assert_int_equal(orb_engine_create_params(&p, &e), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "0x10000000000"));
    assert_null(e);
    /* Nothing set: the defaults, no RDMA. */
    p.field_mask = 0;
    assert_int_equal(orb_engine_create_params(&p, &e), 0);
    orb_engine_free(e);
    assert_int_equal(orb_engine_create_params(NULL, &e), ORB_EINVAL);
    /* An invalid engine configuration is still refused. */
    cfg.tcp_stripes = 0;
    p.field_mask = ORB_ENGINE_PARAM_CONFIG;
    assert_int_equal(orb_engine_create_params(&p, &e), ORB_ECONFIG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_text_round_trip_and_refusals),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_engine_params),
    };
    return cmocka_run_group_tests_name("rdma_config", tests, NULL, NULL);
}
