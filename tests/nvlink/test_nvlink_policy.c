/* The administrator's policy over the NVLink transport, through whole engines of one process on
 * the fakecuda stand-in, with the real helper's test build holding a policy for this uid: a
 * tenant whose `transports` leave out nvlink neither shares its device memory by NVLink (as
 * source, every request refused naming the policy) nor maps a peer's (as requester, refused
 * before anything is asked), and ORB_TRANSPORT_UNSPEC then takes TCP; with nvlink granted the
 * same requests travel by it. The policy is read once per engine, on the transport's first use. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "cuda/cuda.h"
#include "cuda/cuda_memory.h"
#include "helper/helper_client.h"
#include "tests/helper/tenant.h"
#include "util.h"

#ifndef HELPER_TEST_PATH
#error "HELPER_TEST_PATH must name the orbite-helper test build"
#endif

#define MIB (1u << 20)

static char tmpdir[] = "/tmp/orb-nvl-policy-XXXXXX";
static char policy_file[600];

static void write_policy(const char *transports)
{
    FILE *f = fopen(policy_file, "w");
    assert_non_null(f);
    fprintf(f, "[user:#%u]\ntransports = %s\n", (unsigned)getuid(), transports);
    assert_int_equal(fclose(f), 0);
}

static int setup(void **state)
{
    (void)state;
    const struct orb_cuda *cu = NULL;
    if (orb_cuda_use_library(FAKECUDA_FULL) != 0 || orb_cuda_get(&cu) != 0 || mkdtemp(tmpdir) == NULL)
        return -1;
    static char policy_dir[512], shm_dir[512], sysfs[600], owner[32];
    snprintf(policy_dir, sizeof policy_dir, "%s/policy.d", tmpdir);
    snprintf(shm_dir, sizeof shm_dir, "%s/shm", tmpdir);
    snprintf(policy_file, sizeof policy_file, "%s/tenant.ini", policy_dir);
    snprintf(sysfs, sizeof sysfs, "%s/two-socket", FIXTURE_DIR);
    snprintf(owner, sizeof owner, "%u", (unsigned)getuid());
    if (mkdir(policy_dir, 0755) != 0 || mkdir(shm_dir, 01777) != 0 || chmod(shm_dir, 01777) != 0)
        return -1;
    const char *args[] = {"--sysfs-root", sysfs, "--policy-dir", policy_dir, "--shm-dir", shm_dir,
                          "--policy-owner", owner, NULL};
    return orb_helper_test_set_command(HELPER_TEST_PATH, args);
}

static int teardown(void **state)
{
    (void)state;
    orb_helper_test_set_command(NULL, NULL);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static orb_engine *engine_with(enum orb_helper_mode mode, int source)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.helper_mode = mode;
    cfg.enable_source = source;
    return eu_engine(&cfg);
}

/* A device allocation of 1 MiB holding seed's pattern, registered whole. */
static orb_cuda_memory *device_bytes(orb_engine *e, uint8_t seed, enum orb_perm perm, orb_reg_id *id)
{
    orb_cuda_memory *m = NULL;
    assert_int_equal(orb_cuda_memory_alloc(0, MIB, &m), 0);
    uint8_t *p = malloc(MIB);
    assert_non_null(p);
    eu_fill(p, MIB, seed);
    assert_int_equal(orb_cuda_memory_from_host(m, 0, p, MIB), 0);
    free(p);
    assert_int_equal(orb_register_cuda_memory(e, m, 0, MIB, perm, id), 0);
    return m;
}

/* READ the source's MiB into the requester's by `t`: its status; on success the bytes are checked. */
static int read_by(orb_engine *req, orb_segment *seg, orb_cuda_memory *local, orb_cuda_memory *remote,
                   enum orb_transport t)
{
    struct orb_request r = eu_req_at(ORB_OP_READ, orb_cuda_memory_ptr(local), orb_cuda_memory_ptr(remote), MIB);
    r.transport = t;
    struct orb_batch_report rep;
    int rc = orb_submit_and_wait(req, seg, &r, 1, NULL, 30 * EU_SEC, &rep);
    if (rc != 0)
        return rc;
    uint8_t *p = malloc(MIB);
    assert_non_null(p);
    assert_int_equal(orb_cuda_memory_to_host(local, 0, p, MIB), 0);
    assert_int_equal(eu_first_mismatch(p, MIB, 5), SIZE_MAX);
    free(p);
    assert_int_equal(orb_cuda_memory_from_host(local, 0, (uint8_t[1]){0}, 1), 0); /* the next READ must land */
    return 0;
}

/* Requester and source engines with the given helper modes; a READ by NVLink gives `want`
 * (its message naming `why` when it fails), and one by UNSPEC succeeds either way. */
static void run_case(enum orb_helper_mode req_mode, enum orb_helper_mode src_mode, int want, const char *why)
{
    orb_engine *src = engine_with(src_mode, 1), *req = engine_with(req_mode, 0);
    orb_reg_id sid = 0, lid = 0;
    orb_cuda_memory *remote = device_bytes(src, 5, ORB_PERM_REMOTE_WRITE, &sid);
    orb_cuda_memory *local = device_bytes(req, 1, ORB_PERM_LOCAL, &lid);
    orb_segment *seg = eu_open(req, src);
    int rc = read_by(req, seg, local, remote, ORB_TRANSPORT_NVLINK);
    if (rc != want)
        fail_msg("a READ by NVLink gave %s, not %s: %s", orb_strerror(rc), orb_strerror(want), orb_last_error());
    if (why != NULL && strstr(orb_last_error(), why) == NULL)
        fail_msg("the refusal does not say why: %s", orb_last_error());
    if ((rc = read_by(req, seg, local, remote, ORB_TRANSPORT_UNSPEC)) != 0)
        fail_msg("a READ by UNSPEC: %s", orb_last_error());
    orb_segment_close(seg);
    assert_int_equal(orb_unregister_memory(req, lid), 0);
    assert_int_equal(orb_unregister_memory(src, sid), 0);
    orb_cuda_memory_unref(local);
    orb_cuda_memory_unref(remote);
    assert_int_equal(orb_engine_close(req, 5 * EU_SEC), 0);
    assert_int_equal(orb_engine_close(src, 5 * EU_SEC), 0);
    orb_engine_free(req);
    orb_engine_free(src);
}

static void test_a_source_the_policy_denies_shares_nothing(void **state)
{
    (void)state;
    write_policy("tcp, rdma");
    run_case(ORB_HELPER_OFF, ORB_HELPER_AUTO, ORB_EUNAVAILABLE, "policy does not give this tenant NVLink");
}

static void test_a_requester_the_policy_denies_maps_nothing(void **state)
{
    (void)state;
    write_policy("tcp");
    run_case(ORB_HELPER_REQUIRED, ORB_HELPER_OFF, ORB_EUNAVAILABLE, "policy does not give this tenant NVLink");
}

static void test_a_policy_that_grants_nvlink_lets_it_run(void **state)
{
    (void)state;
    write_policy("tcp, nvlink");
    run_case(ORB_HELPER_REQUIRED, ORB_HELPER_REQUIRED, 0, NULL);
}

int main(void)
{
    /* The helper's test build runs only without capabilities: root runs this as a tenant. */
    if (hp_become_tenant() != 0) {
        fprintf(stderr, "cannot run as an ordinary user\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_source_the_policy_denies_shares_nothing),
        cmocka_unit_test(test_a_requester_the_policy_denies_maps_nothing),
        cmocka_unit_test(test_a_policy_that_grants_nvlink_lets_it_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
