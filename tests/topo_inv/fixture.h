/* Loading the committed sysfs fixture trees (tests/data/sysfs/<name>) into an inventory. */
#ifndef ORB_TEST_TOPO_FIXTURE_H
#define ORB_TEST_TOPO_FIXTURE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "topo/sysfs.h"

#ifndef FIXTURE_DIR
#error "FIXTURE_DIR must name tests/data/sysfs"
#endif

/* A heap inventory loaded from fixture `name`; fails the test on any error. Free with free(). */
static inline struct orb_topo_inventory *load_fixture(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", FIXTURE_DIR, name);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(fd >= 0);
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    assert_non_null(inv);
    assert_int_equal(orb_topo_load_sysfs(fd, inv), 0);
    close(fd);
    return inv;
}

#endif
