/* The same-host proof (lib/samehost/proof.c): boot ids from a fixture procfs and the real one,
 * the HELLO codec's refusals before its round trip, kernel credentials over real Unix sockets,
 * and the check's verdicts. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "samehost/proof.h"

#define GOOD_ID "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"

/* A fixture procfs in a temporary directory whose boot_id holds `content` (len bytes); `as_link`
 * makes boot_id a symlink to a file with that content instead. Returns its fd. */
static int fixture(char dir[64], const char *content, size_t len, int as_link)
{
    snprintf(dir, 64, "/tmp/orbite-samehost-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char path[160];
    snprintf(path, sizeof path, "%s/sys", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/sys/kernel", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/sys/kernel/random", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/sys/kernel/random/%s", dir, as_link ? "real" : "boot_id");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, content, len), (ssize_t)len);
    close(fd);
    if (as_link) {
        char link[160];
        snprintf(link, sizeof link, "%s/sys/kernel/random/boot_id", dir);
        assert_int_equal(symlink("real", link), 0);
    }
    int d = open(dir, O_RDONLY | O_DIRECTORY);
    assert_true(d >= 0);
    return d;
}

static void remove_fixture(const char *dir, int d)
{
    close(d);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_boot_ids_that_are_not_refused(void **state)
{
    (void)state;
    static const struct {
        const char *content;
        int link;
        int status;
    } cases[] = {
        {GOOD_ID, 0, ORB_EPROTO},                              /* no newline */
        {GOOD_ID "\n\n", 0, ORB_EPROTO},                       /* more than one line */
        {"0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0\n", 0, ORB_EPROTO}, /* upper case */
        {"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f\n", 0, ORB_EPROTO},  /* short */
        {"0f1e2d3c04b5a-6978-8796-a5b4c3d2e1f0\n", 0, ORB_EPROTO}, /* a dash missing */
        {"", 0, ORB_EPROTO},
        {GOOD_ID "\n", 1, ORB_EINVAL},                         /* a symlink: not followed */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[64];
        int d = fixture(dir, cases[i].content, strlen(cases[i].content), cases[i].link);
        char out[ORB_BOOT_ID_LEN + 1] = "untouched";
        assert_int_equal(orb_samehost_boot_id_at(d, out), cases[i].status);
        assert_string_equal(out, "untouched");
        remove_fixture(dir, d);
    }
    /* No such file: not a Linux procfs. */
    int d = open("/tmp", O_RDONLY | O_DIRECTORY);
    char out[ORB_BOOT_ID_LEN + 1];
    assert_int_equal(orb_samehost_boot_id_at(d, out), ORB_EUNAVAILABLE);
    close(d);
    assert_int_equal(orb_samehost_boot_id_at(-1, NULL), ORB_EINVAL);
}

static void test_boot_id_of_fixture_and_host(void **state)
{
    (void)state;
    char dir[64];
    int d = fixture(dir, GOOD_ID "\n", strlen(GOOD_ID) + 1, 0);
    char out[ORB_BOOT_ID_LEN + 1];
    assert_int_equal(orb_samehost_boot_id_at(d, out), 0);
    assert_string_equal(out, GOOD_ID);
    remove_fixture(dir, d);
    /* This host's, twice the same. */
    char a[ORB_BOOT_ID_LEN + 1], b[ORB_BOOT_ID_LEN + 1];
    assert_int_equal(orb_samehost_boot_id(a), 0);
    assert_int_equal(orb_samehost_boot_id(b), 0);
    assert_true(orb_samehost_boot_id_valid(a, strlen(a)));
    assert_string_equal(a, b);
}

static struct orb_samehost_hello sample(void)
{
    struct orb_samehost_hello h;
    memset(&h, 0, sizeof h);
    memcpy(h.boot_id, GOOD_ID, sizeof GOOD_ID);
    for (int i = 0; i < 16; i++)
        h.epoch.bytes[i] = (uint8_t)(0xA0 + i);
    h.pid = 0x01020304;
    return h;
}

static void test_hello_refusals(void **state)
{
    (void)state;
    struct orb_samehost_hello h = sample(), out;
    uint8_t buf[ORB_SAMEHOST_HELLO_LEN + 1];
    assert_int_equal(orb_samehost_hello_encode(&h, buf), 0);
    memset(&out, 0x5A, sizeof out);
    struct orb_samehost_hello before = out;
    assert_int_equal(orb_samehost_hello_decode(buf, ORB_SAMEHOST_HELLO_LEN - 1, &out), ORB_EPROTO);
    assert_int_equal(orb_samehost_hello_decode(buf, ORB_SAMEHOST_HELLO_LEN + 1, &out), ORB_EPROTO);
    assert_int_equal(orb_samehost_hello_decode(buf, 0, &out), ORB_EPROTO);
    /* Every byte of the magic, version, flags and reserved words, and the pid made 0. */
    static const size_t bad_at[] = {0, 5, 7, 8, 9, 10, 11, 12, 15, 52, 55, 76, 79};
    for (size_t i = 0; i < sizeof bad_at / sizeof bad_at[0]; i++) {
        uint8_t b[ORB_SAMEHOST_HELLO_LEN];
        memcpy(b, buf, sizeof b);
        b[bad_at[i]] ^= 0x40;
        assert_int_equal(orb_samehost_hello_decode(b, sizeof b, &out), ORB_EPROTO);
    }
    uint8_t b[ORB_SAMEHOST_HELLO_LEN];
    memcpy(b, buf, sizeof b);
    b[16] = 'G'; /* not hex */
    assert_int_equal(orb_samehost_hello_decode(b, sizeof b, &out), ORB_EPROTO);
    memcpy(b, buf, sizeof b);
    b[16 + 8] = 'a'; /* a dash replaced */
    assert_int_equal(orb_samehost_hello_decode(b, sizeof b, &out), ORB_EPROTO);
    memcpy(b, buf, sizeof b);
    memset(b + 72, 0, 4);
    assert_int_equal(orb_samehost_hello_decode(b, sizeof b, &out), ORB_EPROTO);
    assert_memory_equal(&out, &before, sizeof out); /* never written on failure */
    /* The encoder refuses what the decoder would. */
    struct orb_samehost_hello bad = h;
    bad.pid = 0;
    assert_int_equal(orb_samehost_hello_encode(&bad, buf), ORB_EINVAL);
    bad = h;
    bad.boot_id[3] = 'X';
    assert_int_equal(orb_samehost_hello_encode(&bad, buf), ORB_EINVAL);
    assert_int_equal(orb_samehost_hello_decode(NULL, 80, &out), ORB_EINVAL);
}

static void test_hello_round_trip(void **state)
{
    (void)state;
    struct orb_samehost_hello h = sample(), out;
    uint8_t buf[ORB_SAMEHOST_HELLO_LEN];
    assert_int_equal(orb_samehost_hello_encode(&h, buf), 0);
    /* The layout, byte by byte where it is fixed. */
    assert_memory_equal(buf, ((uint8_t[]){'O', 'R', 'B', 'S', 'H', 'M', 0, 1, 1, 0}), 10);
    assert_memory_equal(buf + 16, GOOD_ID, 36);
    assert_int_equal(buf[56], 0xA0);
    assert_memory_equal(buf + 72, ((uint8_t[]){4, 3, 2, 1}), 4);
    assert_int_equal(orb_samehost_hello_decode(buf, sizeof buf, &out), 0);
    assert_string_equal(out.boot_id, GOOD_ID);
    assert_memory_equal(out.epoch.bytes, h.epoch.bytes, 16);
    assert_int_equal(out.pid, h.pid);
}

static void test_kernel_credentials(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    uint32_t pid = 0, uid = 0;
    assert_int_equal(orb_samehost_peer_cred(sv[0], &pid, &uid), 0);
    assert_int_equal(pid, (uint32_t)getpid());
    assert_int_equal(uid, (uint32_t)getuid());
    close(sv[0]);
    close(sv[1]);
    /* Not a socket, not a connected one, no descriptor. */
    int fd = open("/dev/null", O_RDONLY);
    assert_int_equal(orb_samehost_peer_cred(fd, &pid, &uid), ORB_EINVAL);
    close(fd);
    int lone = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(orb_samehost_peer_cred(lone, &pid, &uid), ORB_EINVAL);
    close(lone);
    assert_int_equal(orb_samehost_peer_cred(-1, &pid, &uid), ORB_EINVAL);
    assert_int_equal(orb_samehost_peer_cred(0, NULL, &uid), ORB_EINVAL);
}

static void test_check_verdicts(void **state)
{
    (void)state;
    struct orb_samehost_hello h = sample();
    struct orb_epoch expected = h.epoch;
    assert_int_equal(orb_samehost_check(&h, GOOD_ID, h.pid, &expected), 0);
    assert_int_equal(orb_samehost_check(&h, "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f1", h.pid, &expected),
                     ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "not this host"));
    assert_int_equal(orb_samehost_check(&h, GOOD_ID, h.pid + 1, &expected), ORB_EPERM);
    expected.bytes[15] ^= 1;
    assert_int_equal(orb_samehost_check(&h, GOOD_ID, h.pid, &expected), ORB_ESTALE);
    assert_int_equal(orb_samehost_check(NULL, GOOD_ID, h.pid, &expected), ORB_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boot_ids_that_are_not_refused),
        cmocka_unit_test(test_boot_id_of_fixture_and_host),
        cmocka_unit_test(test_hello_refusals),
        cmocka_unit_test(test_hello_round_trip),
        cmocka_unit_test(test_kernel_credentials),
        cmocka_unit_test(test_check_verdicts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
