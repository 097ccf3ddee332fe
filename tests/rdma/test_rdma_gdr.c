/* GPUDirect registration routes (lib/rdma/gdr.h): every combination of what the host offers
 * against every setting, and the peer-memory probe on a scratch sysfs tree (a module directory
 * without its version file, or a link in its place, is no evidence). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "rdma/gdr.h"

static void test_every_setting_against_every_host(void **state)
{
    (void)state;
    for (uint32_t bits = 0; bits < 8; bits++) {
        struct orb_gdr_facts f = {.cuda_dmabuf = bits & 1, .verbs_dmabuf = (bits >> 1) & 1, .peermem = (bits >> 2) & 1};
        bool dmabuf = f.cuda_dmabuf && f.verbs_dmabuf;
        enum orb_gdr_route r = 0;
        /* auto: dma-buf first, peermem next, else unavailable naming both. */
        int rc = orb_gdr_choose(ORB_RDMA_GDR_AUTO, &f, &r);
        if (dmabuf)
            assert_true(rc == 0 && r == ORB_GDR_ROUTE_DMABUF);
        else if (f.peermem)
            assert_true(rc == 0 && r == ORB_GDR_ROUTE_PEERMEM);
        else {
            assert_int_equal(rc, ORB_EUNAVAILABLE);
            assert_non_null(strstr(orb_last_error(), "dma-buf:"));
            assert_non_null(strstr(orb_last_error(), "peermem:"));
        }
        /* An explicit route: that one or unavailable, never the other. */
        r = 0;
        rc = orb_gdr_choose(ORB_RDMA_GDR_DMABUF, &f, &r);
        if (dmabuf)
            assert_true(rc == 0 && r == ORB_GDR_ROUTE_DMABUF);
        else {
            assert_int_equal(rc, ORB_EUNAVAILABLE);
            assert_int_equal(r, 0);
            assert_non_null(strstr(orb_last_error(), f.cuda_dmabuf ? "ibv_reg_dmabuf_mr" : "exports no dma-buf"));
        }
        rc = orb_gdr_choose(ORB_RDMA_GDR_PEERMEM, &f, &r);
        if (f.peermem)
            assert_true(rc == 0 && r == ORB_GDR_ROUTE_PEERMEM);
        else {
            assert_int_equal(rc, ORB_EUNAVAILABLE);
            assert_non_null(strstr(orb_last_error(), "peer-memory module"));
        }
    }
    struct orb_gdr_facts all = {true, true, true};
    enum orb_gdr_route r;
    assert_int_equal(orb_gdr_choose(7, &all, &r), ORB_EINVAL);
    assert_int_equal(orb_gdr_choose(ORB_RDMA_GDR_AUTO, NULL, &r), ORB_EINVAL);
    assert_string_equal(orb_gdr_route_name(ORB_GDR_ROUTE_DMABUF), "dma-buf");
    assert_string_equal(orb_gdr_route_name(ORB_GDR_ROUTE_PEERMEM), "peermem");
}

static void make(const char *root, const char *rel, bool file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    if (file) {
        int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0444);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "1.0\n", 4), 4);
        close(fd);
    } else
        assert_int_equal(mkdir(path, 0755), 0);
}

static void test_the_peermem_probe(void **state)
{
    (void)state;
    char root[] = "/tmp/orb-gdr-XXXXXX";
    assert_non_null(mkdtemp(root));
    int dir = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(dir >= 0);
    assert_int_equal(orb_gdr_probe_peermem(dir), 0);
    /* The module's directory alone says nothing. */
    make(root, "module", false);
    make(root, "module/nvidia_peermem", false);
    assert_int_equal(orb_gdr_probe_peermem(dir), 0);
    /* A link where the version file should be is not the module's word either. */
    char target[600], link[600];
    snprintf(target, sizeof target, "%s/elsewhere", root);
    make(root, "elsewhere", true);
    snprintf(link, sizeof link, "%s/module/nvidia_peermem/version", root);
    assert_int_equal(symlink(target, link), 0);
    assert_int_equal(orb_gdr_probe_peermem(dir), 0);
    assert_int_equal(unlink(link), 0);
    make(root, "module/nvidia_peermem/version", true);
    assert_int_equal(orb_gdr_probe_peermem(dir), 4u);
    make(root, "kernel", false);
    make(root, "kernel/mm", false);
    make(root, "kernel/mm/memory_peers", false);
    make(root, "kernel/mm/memory_peers/nv_mem", false);
    make(root, "kernel/mm/memory_peers/nv_mem/version", true);
    assert_int_equal(orb_gdr_probe_peermem(dir), 5u);
    close(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_setting_against_every_host),
        cmocka_unit_test(test_the_peermem_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
