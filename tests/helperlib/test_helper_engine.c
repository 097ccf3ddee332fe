/* A CPU/TCP-only engine never starts orbite-helper, whatever its helper mode: the helper
 * command is pointed at a script that leaves a marker file, engines are created and used in
 * every mode, and no marker (and no child process) may appear. The same script started
 * directly does leave the marker, so the check can fail. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <orbite/orbite.h>

#include "common.h"
#include "helper/helper_client.h"

static char tmpdir[] = "/tmp/orb-helper-engine-XXXXXX";
static char script[512], marker[512];

static int setup_group(void **state)
{
    (void)state;
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    snprintf(script, sizeof script, "%s/helper.sh", tmpdir);
    snprintf(marker, sizeof marker, "%s/spawned", tmpdir);
    if (write_marker_script(script, marker) != 0)
        return -1;
    return orb_helper_test_set_command(script, NULL);
}

static int teardown_group(void **state)
{
    (void)state;
    orb_helper_test_set_command(NULL, NULL);
    unlink(marker);
    unlink(script);
    return rmdir(tmpdir);
}

static void exercise_engine(const struct orb_engine_config *cfg)
{
    orb_engine *engine = NULL;
    int rc = orb_engine_create(cfg, &engine);
    if (rc != 0)
        fail_msg("orb_engine_create gave %d: %s", rc, orb_last_error());
    char endpoint[ORB_ENDPOINT_MAX];
    assert_int_equal(orb_engine_endpoint(engine, endpoint, sizeof endpoint),
                     cfg->enable_source ? 0 : ORB_EUNAVAILABLE);
    orb_host_memory *mem = NULL;
    assert_int_equal(orb_host_memory_alloc(1 << 16, 0, &mem), 0);
    orb_reg_id id = 0;
    assert_int_equal(orb_register_host_memory(engine, mem, 0, 1 << 16, ORB_PERM_REMOTE_READ, &id),
                     0);
    assert_int_equal(orb_unregister_memory(engine, id), 0);
    orb_host_memory_unref(mem);
    assert_int_equal(orb_engine_close(engine, 5ull * 1000000000ull), 0);
    orb_engine_free(engine);
}

static void test_tcp_engine_never_spawns_the_helper(void **state)
{
    (void)state;
    static const char *const json[] = { "{\"helper\": \"auto\"}", "{\"helper\": \"required\"}",
                                        "{\"helper\": \"off\"}", "{}" };
    for (size_t i = 0; i < sizeof json / sizeof json[0]; i++) {
        struct orb_engine_config cfg;
        assert_int_equal(orb_engine_config_init(&cfg), 0);
        assert_int_equal(orb_engine_config_load_json(&cfg, json[i]), 0);
        exercise_engine(&cfg);
        cfg.enable_source = 0;
        exercise_engine(&cfg);
        if (file_exists(marker))
            fail_msg("%s: the engine started the helper", json[i]);
        assert_true(no_children_left());
    }
}

static void test_the_marker_works(void **state)
{
    (void)state;
    /* The control: opening a session does run the command (which then hangs up). */
    struct orb_helper *h = NULL;
    assert_false(file_exists(marker));
    assert_int_equal(orb_helper_open(ORB_HELPER_REQUIRED, 5ull * 1000000000ull, &h), ORB_EPEER);
    assert_true(file_exists(marker));
    assert_true(no_children_left());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_engine_never_spawns_the_helper),
        cmocka_unit_test(test_the_marker_works),
    };
    return cmocka_run_group_tests(tests, setup_group, teardown_group);
}
