/* The library's side against the real helper (its test build, which takes fixture directories):
 * the two-socket sysfs fixture, a policy granting this uid one of its two NICs and one slot name,
 * and a scratch /dev/shm. Checks that every call completes with a well-formed answer and that
 * the policy shows through: the denied NIC is neither listed nor opened. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>

#include "common.h"
#include "helper/helper_client.h"
#include "topo/sysfs.h"
#include "../helper/tenant.h"

#ifndef HELPER_TEST_PATH
#error "HELPER_TEST_PATH must name the orbite-helper test build"
#endif
#ifndef FIXTURE_DIR
#error "FIXTURE_DIR must name tests/data/sysfs"
#endif

#define TIMEOUT (10ull * 1000000000ull)
#define GRANTED_NIC "mlx5_0"
#define DENIED_NIC "mlx5_1"
#define GRANTED_SLOT "e2e_slot"

static char tmpdir[] = "/tmp/orb-helper-e2e-XXXXXX";
static char policy_dir[512], shm_dir[512];

static int setup_group(void **state)
{
    (void)state;
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    snprintf(policy_dir, sizeof policy_dir, "%s/policy.d", tmpdir);
    snprintf(shm_dir, sizeof shm_dir, "%s/shm", tmpdir);
    if (mkdir(policy_dir, 0755) != 0 || mkdir(shm_dir, 01777) != 0 || chmod(shm_dir, 01777) != 0)
        return -1;
    char path[600], text[512];
    snprintf(path, sizeof path, "%s/tenant.ini", policy_dir);
    snprintf(text, sizeof text,
             "# this test's own uid gets one NIC, TCP and RDMA, and one slot name\n"
             "[user:#%u]\n"
             "nics = " GRANTED_NIC "\n"
             "transports = tcp, rdma\n"
             "slots = " GRANTED_SLOT "\n",
             (unsigned)getuid());
    if (write_file(path, text, 0644) != 0)
        return -1;
    char sysfs[600];
    snprintf(sysfs, sizeof sysfs, "%s/two-socket", FIXTURE_DIR);
    /* The policy files (and new slot objects) belong to whoever runs the test. */
    static char owner[32];
    snprintf(owner, sizeof owner, "%u", (unsigned)getuid());
    const char *args[] = { "--sysfs-root", sysfs,    "--policy-dir",   policy_dir, "--shm-dir",
                           shm_dir,        "--policy-owner", owner,     NULL };
    return orb_helper_test_set_command(HELPER_TEST_PATH, args);
}

static int teardown_group(void **state)
{
    (void)state;
    orb_helper_test_set_command(NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A refusal is fine; a broken session is not. */
static void expect_answer(int rc, const char *what)
{
    if (rc == ORB_EPROTO || rc == ORB_EPEER || rc == ORB_ETIMEDOUT)
        fail_msg("%s broke the session: %d (%s)", what, rc, orb_last_error());
}

static void test_session_against_the_real_helper(void **state)
{
    (void)state;
    int fds_before = count_open_fds();
    struct orb_helper *h = NULL;
    int rc = orb_helper_open(ORB_HELPER_REQUIRED, TIMEOUT, &h);
    if (rc != 0)
        fail_msg("open gave %d: %s", rc, orb_last_error());

    struct orb_helper_info info;
    assert_int_equal(orb_helper_info(h, &info), 0);
    assert_int_equal(info.version, ORB_HP_VERSION);
    assert_int_equal(info.uid, getuid());

    /* The inventory is the fixture's, filtered by the policy. */
    struct orb_topo_inventory *inv = malloc(sizeof *inv), *fixture = malloc(sizeof *fixture);
    assert_non_null(inv);
    assert_non_null(fixture);
    char sysfs[600];
    snprintf(sysfs, sizeof sysfs, "%s/two-socket", FIXTURE_DIR);
    int dirfd = open(sysfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(dirfd >= 0);
    assert_int_equal(orb_topo_load_sysfs(dirfd, fixture), 0);
    close(dirfd);
    rc = orb_helper_inventory(h, inv);
    if (rc != 0)
        fail_msg("inventory gave %d: %s", rc, orb_last_error());
    int granted = -1;
    for (uint32_t i = 0; i < inv->nnics; i++) {
        assert_string_not_equal(inv->nics[i].name, DENIED_NIC);
        if (strcmp(inv->nics[i].name, GRANTED_NIC) == 0)
            granted = (int)i;
    }
    assert_true(granted >= 0);
    for (uint32_t i = 0; i < fixture->nnics; i++)
        if (strcmp(fixture->nics[i].name, GRANTED_NIC) == 0) {
            assert_string_equal(inv->nics[granted].pci, fixture->nics[i].pci);
            assert_int_equal(inv->nics[granted].numa_node, fixture->nics[i].numa_node);
            assert_true(inv->nics[granted].node_guid == fixture->nics[i].node_guid);
        }
    assert_int_equal(inv->nnuma, fixture->nnuma);

    struct orb_hp_policy policy;
    rc = orb_helper_policy(h, &policy);
    if (rc != 0)
        fail_msg("policy gave %d: %s", rc, orb_last_error());
    assert_true((policy.nic_mask >> inv->nics[granted].id) & 1u);
    assert_int_equal(policy.transports, ORB_HP_T_TCP | ORB_HP_T_RDMA);
    assert_int_equal(policy.nslots, 1);
    assert_string_equal(policy.slots[0], GRANTED_SLOT);

    /* The denied NIC is refused; the granted one may lack a device node in the fixture. */
    int fd = -7;
    assert_int_equal(orb_helper_open_device(h, DENIED_NIC, &fd), ORB_EPERM);
    assert_int_equal(fd, -7);
    rc = orb_helper_open_device(h, GRANTED_NIC, &fd);
    expect_answer(rc, "OPEN_DEVICE " GRANTED_NIC);
    if (rc == 0)
        close(fd);

    uint32_t found = 0xdead;
    assert_int_equal(orb_helper_peermem_probe(h, &found), 0);
    assert_int_equal(found, 0); /* the fixture has no peer-memory module */

    fd = -7;
    rc = orb_helper_slot_attach(h, "not_granted", 1000000, &fd);
    assert_true(rc != 0);
    expect_answer(rc, "SLOT_ATTACH not_granted");
    rc = orb_helper_slot_attach(h, GRANTED_SLOT, 1000000, &fd);
    expect_answer(rc, "SLOT_ATTACH " GRANTED_SLOT);
    if (rc == 0) {
        assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
        close(fd);
    }

    struct orb_hp_devx_verify v = { .nic = GRANTED_NIC, .obj_handle = 1, .key = 0x100, .qpn = 7,
                                     .addr = 4096, .length = 4096, .access = 1 };
    rc = orb_helper_devx_verify(h, &v);
    assert_true(rc != 0); /* no device: never a pass */
    expect_answer(rc, "DEVX_VERIFY");

    /* Still in sync. */
    assert_int_equal(orb_helper_peermem_probe(h, &found), 0);
    free(inv);
    free(fixture);
    orb_helper_close(h);
    errno = 0;
    assert_int_equal(waitpid(info.pid, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
    assert_int_equal(count_open_fds(), fds_before);
}

int main(void)
{
    if (hp_become_tenant() != 0) {
        fprintf(stderr, "cannot run as an ordinary user\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_session_against_the_real_helper),
    };
    return cmocka_run_group_tests(tests, setup_group, teardown_group);
}
