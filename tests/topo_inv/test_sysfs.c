/* Inventory discovery from sysfs trees: the committed host fixtures exactly, damaged trees that
 * must fail closed per device without renumbering the others, strict parsers, limits. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "topo/sysfs.h"
#include "fixture.h"

/* ---------------------------------------------------------------------------------------------
 * Scratch trees built on disk */

struct tree {
    char root[256];
    int fd;
};

static void tree_init(struct tree *t)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(t->root, sizeof t->root, "%s/orb-topo-XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    assert_non_null(mkdtemp(t->root));
    t->fd = open(t->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(t->fd >= 0);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static void tree_free(struct tree *t)
{
    close(t->fd);
    assert_int_equal(nftw(t->root, remove_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
}

/* mkdir -p of every directory above `path` (relative to the tree). */
static void make_parents(struct tree *t, const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = strchr(buf, '/'); p != NULL; p = strchr(p + 1, '/')) {
        *p = '\0';
        if (mkdirat(t->fd, buf, 0755) != 0)
            assert_int_equal(errno, EEXIST);
        *p = '/';
    }
}

static void put_bytes(struct tree *t, const char *path, const void *data, size_t len)
{
    make_parents(t, path);
    int fd = openat(t->fd, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
}

static void put(struct tree *t, const char *path, const char *text)
{
    put_bytes(t, path, text, strlen(text));
}

static void put_link(struct tree *t, const char *path, const char *target)
{
    make_parents(t, path);
    (void)unlinkat(t->fd, path, 0);
    assert_int_equal(symlinkat(target, t->fd, path), 0);
}

static void remove_file(struct tree *t, const char *path)
{
    assert_int_equal(unlinkat(t->fd, path, 0), 0);
}

/* Paths of the test NIC at PCI function 0000:<bus>:00.0 below root port 0000:00:01.0. */
static void fn_dir(char *buf, size_t cap, unsigned bus)
{
    snprintf(buf, cap, "devices/pci0000:00/0000:00:01.0/0000:%02x:00.0", bus);
}

static void nic_dir(char *buf, size_t cap, unsigned bus, const char *name)
{
    char fn[128];
    fn_dir(fn, sizeof fn, bus);
    snprintf(buf, cap, "%.100s/infiniband/%.80s", fn, name);
}

/* Write `text` to <nic dir>/<rel>. */
static void put_nic(struct tree *t, unsigned bus, const char *name, const char *rel, const char *text)
{
    char dir[256], path[512];
    nic_dir(dir, sizeof dir, bus, name);
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    put(t, path, text);
}

/* A healthy one-port RoCE NIC: node GUID 0:0:0:<bus>, GID 0 = fe80::<bus> (RoCE v2). */
static void add_nic(struct tree *t, const char *name, unsigned bus, int numa)
{
    char fn[128], dir[256], path[512], text[320];
    fn_dir(fn, sizeof fn, bus);
    nic_dir(dir, sizeof dir, bus, name);
    snprintf(path, sizeof path, "class/infiniband/%s", name);
    snprintf(text, sizeof text, "../../%s", dir);
    put_link(t, path, text);
    snprintf(path, sizeof path, "%s/device", dir);
    snprintf(text, sizeof text, "../../../0000:%02x:00.0", bus);
    put_link(t, path, text);
    snprintf(path, sizeof path, "%s/numa_node", fn);
    snprintf(text, sizeof text, "%d\n", numa);
    put(t, path, text);
    snprintf(text, sizeof text, "0000:0000:0000:%04x\n", bus);
    put_nic(t, bus, name, "node_guid", text);
    put_nic(t, bus, name, "ports/1/state", "4: ACTIVE\n");
    put_nic(t, bus, name, "ports/1/link_layer", "Ethernet\n");
    put_nic(t, bus, name, "ports/1/rate", "100 Gb/sec (4X EDR)\n");
    snprintf(text, sizeof text, "fe80:0000:0000:0000:0000:0000:0000:%04x\n", bus);
    put_nic(t, bus, name, "ports/1/gids/0", text);
    put_nic(t, bus, name, "ports/1/gid_attrs/types/0", "RoCE v2\n");
}

static struct orb_topo_inventory *load_tree(struct tree *t)
{
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    assert_non_null(inv);
    assert_int_equal(orb_topo_load_sysfs(t->fd, inv), 0);
    return inv;
}

/* The NIC made by add_nic(name, bus, numa), intact. */
static void assert_healthy_nic(const struct orb_topo_nic *nic, unsigned id, const char *name, unsigned bus, int numa)
{
    char pci[16];
    snprintf(pci, sizeof pci, "0000:%02x:00.0", bus);
    assert_int_equal(nic->id, id);
    assert_int_equal(nic->usable, 1);
    assert_string_equal(nic->name, name);
    assert_int_equal(nic->node_guid, bus);
    assert_string_equal(nic->pci, pci);
    assert_int_equal(nic->numa_node, numa);
    assert_int_equal(nic->path.depth, 3);
    assert_string_equal(nic->path.hops[0], "pci0000:00");
    assert_string_equal(nic->path.hops[1], "0000:00:01.0");
    assert_string_equal(nic->path.hops[2], pci);
    assert_int_equal(nic->nports, 1);
    assert_int_equal(nic->ports[0].num, 1);
    assert_int_equal(nic->ports[0].state, ORB_PORT_ACTIVE);
    assert_int_equal(nic->ports[0].link_layer, ORB_LINK_ETHERNET);
    assert_int_equal(nic->ports[0].rate_mbps, 100000);
    assert_int_equal(nic->ports[0].ngids, 1);
    assert_int_equal(nic->ports[0].gids[0].index, 0);
    assert_int_equal(nic->ports[0].gids[0].type, ORB_GID_ROCE_V2);
    assert_int_equal(nic->ports[0].gids[0].raw[0], 0xfe);
    assert_int_equal(nic->ports[0].gids[0].raw[15], bus);
}

/* A slot that failed discovery: id and (valid) name kept, nothing else. */
static void assert_failed_slot(const struct orb_topo_nic *nic, unsigned id, const char *name)
{
    struct orb_topo_nic expected;
    memset(&expected, 0, sizeof expected);
    expected.id = (uint8_t)id;
    expected.numa_node = ORB_TOPO_NUMA_UNKNOWN;
    snprintf(expected.name, sizeof expected.name, "%s", name);
    assert_int_equal(nic->id, id);
    assert_int_equal(nic->usable, 0);
    assert_string_equal(nic->name, name);
    assert_memory_equal(nic, &expected, sizeof expected);
}

/* ---------------------------------------------------------------------------------------------
 * Arguments */

static void test_rejects_bad_arguments(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    assert_non_null(inv);
    memset(inv, 0xab, sizeof *inv);
    assert_int_equal(orb_topo_load_sysfs(-1, inv), ORB_EINVAL);
    int file_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(file_fd >= 0);
    assert_int_equal(orb_topo_load_sysfs(file_fd, inv), ORB_EINVAL);
    close(file_fd);
    /* Written only on success. */
    for (size_t i = 0; i < sizeof *inv; i++)
        assert_int_equal(((const unsigned char *)inv)[i], 0xab);
    struct tree t;
    tree_init(&t);
    assert_int_equal(orb_topo_load_sysfs(t.fd, NULL), ORB_EINVAL);
    tree_free(&t);
    free(inv);
}

static void test_empty_tree_is_an_empty_inventory(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    memset(inv, 0xab, sizeof *inv);
    assert_int_equal(orb_topo_load_sysfs(t.fd, inv), 0);
    assert_int_equal(inv->nnics, 0);
    assert_int_equal(inv->ngpus, 0);
    assert_int_equal(inv->nnuma, 0);
    free(inv);
    tree_free(&t);
}

static void test_unlistable_nic_directory_fails(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    put(&t, "class/infiniband", "not a directory\n");
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    assert_int_equal(orb_topo_load_sysfs(t.fd, inv), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "class/infiniband"));
    free(inv);
    tree_free(&t);
}

/* ---------------------------------------------------------------------------------------------
 * Damaged trees: one damaged NIC between two healthy ones */

typedef void (*damage_fn)(struct tree *t);

static void damage_oversized_guid(struct tree *t)
{
    char big[300];
    memset(big, 'a', sizeof big);
    memcpy(big, "0000:0000:0000:0002", 19);
    char dir[256], path[512];
    nic_dir(dir, sizeof dir, 2, "mlx5_1");
    snprintf(path, sizeof path, "%s/node_guid", dir);
    put_bytes(t, path, big, sizeof big);
}

static void damage_oversized_gid(struct tree *t)
{
    char big[129];
    memset(big, '0', sizeof big);
    char dir[256], path[512];
    nic_dir(dir, sizeof dir, 2, "mlx5_1");
    snprintf(path, sizeof path, "%s/ports/1/gids/0", dir);
    put_bytes(t, path, big, sizeof big);
}

static void damage_guid_bad_hex(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "node_guid", "000g:0000:0000:0002\n");
}

static void damage_guid_short(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "node_guid", "0000:0000:0002\n");
}

static void damage_guid_nul(struct tree *t)
{
    char dir[256], path[512];
    nic_dir(dir, sizeof dir, 2, "mlx5_1");
    snprintf(path, sizeof path, "%s/node_guid", dir);
    put_bytes(t, path, "0000:0000:0000:0002\0\n", 21);
}

static void damage_guid_missing(struct tree *t)
{
    char dir[256], path[512];
    nic_dir(dir, sizeof dir, 2, "mlx5_1");
    snprintf(path, sizeof path, "%s/node_guid", dir);
    remove_file(t, path);
}

static void put_numa(struct tree *t, const char *text)
{
    char fn[128], path[256];
    fn_dir(fn, sizeof fn, 2);
    snprintf(path, sizeof path, "%s/numa_node", fn);
    put(t, path, text);
}

static void damage_numa_leading_zero(struct tree *t)
{
    put_numa(t, "01\n");
}

static void damage_numa_trailing_garbage(struct tree *t)
{
    put_numa(t, "1a\n");
}

static void damage_numa_negative(struct tree *t)
{
    put_numa(t, "-2\n");
}

static void damage_numa_space(struct tree *t)
{
    put_numa(t, " 1\n");
}

static void damage_numa_two_newlines(struct tree *t)
{
    put_numa(t, "1\n\n");
}

static void damage_rate_unit(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "ports/1/rate", "100 Gb/s\n");
}

static void damage_state_name(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "ports/1/state", "4: ACTIVATED\n");
}

static void damage_state_mismatch(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "ports/1/state", "4: DOWN\n");
}

static void damage_link_layer(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "ports/1/link_layer", "ethernet\n");
}

static void damage_gid_groups(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "ports/1/gids/0", "fe80:0000:0000:0000:0000:0000:0002\n");
}

static void damage_gid_type(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "ports/1/gid_attrs/types/0", "RoCE v3\n");
}

static void damage_gid_index_name(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "ports/1/gids/x", "fe80:0000:0000:0000:0000:0000:0000:0002\n");
}

static void damage_port_name(struct tree *t)
{
    put_nic(t, 2, "mlx5_1", "ports/one/state", "4: ACTIVE\n");
}

static void damage_no_ports(struct tree *t)
{
    char dir[256], from[512], to[512];
    nic_dir(dir, sizeof dir, 2, "mlx5_1");
    snprintf(from, sizeof from, "%s/ports", dir);
    snprintf(to, sizeof to, "%s/ports.gone", dir);
    assert_int_equal(renameat(t->fd, from, t->fd, to), 0);
}

static void damage_class_link_loop(struct tree *t)
{
    put_link(t, "class/infiniband/mlx5_1", "mlx5_1");
}

static void damage_device_link_loop(struct tree *t)
{
    char dir[256], path[512];
    nic_dir(dir, sizeof dir, 2, "mlx5_1");
    snprintf(path, sizeof path, "%s/device", dir);
    put_link(t, path, "device");
}

static void damage_numa_link_loop(struct tree *t)
{
    char fn[128], path[256];
    fn_dir(fn, sizeof fn, 2);
    snprintf(path, sizeof path, "%s/numa_node", fn);
    put_link(t, path, "numa_node");
}

static void damage_numa_fifo(struct tree *t)
{
    char fn[128], path[256];
    fn_dir(fn, sizeof fn, 2);
    snprintf(path, sizeof path, "%s/numa_node", fn);
    remove_file(t, path);
    assert_int_equal(mkfifoat(t->fd, path, 0644), 0);
}

static void damage_rate_directory(struct tree *t)
{
    char dir[256], path[512];
    nic_dir(dir, sizeof dir, 2, "mlx5_1");
    snprintf(path, sizeof path, "%s/ports/1/rate", dir);
    remove_file(t, path);
    assert_int_equal(mkdirat(t->fd, path, 0755), 0);
}

static void damage_device_not_pci(struct tree *t)
{
    char dir[256], path[512];
    nic_dir(dir, sizeof dir, 2, "mlx5_1");
    snprintf(path, sizeof path, "%s/device", dir);
    put_link(t, path, "../../../virtio0");
}

static void damage_path_inconsistent(struct tree *t)
{
    /* The device link names another function than the one the class link lives under. */
    char dir[256], path[512];
    nic_dir(dir, sizeof dir, 2, "mlx5_1");
    snprintf(path, sizeof path, "%s/device", dir);
    put_link(t, path, "../../../0000:09:00.0");
}

struct damage_case {
    const char *what;
    damage_fn damage;
    const char *reason; /* what the warning for the failed slot must say */
};

static const struct damage_case damage_cases[] = {
    {"oversized node_guid", damage_oversized_guid, "node_guid: unreadable or oversized"},
    {"oversized GID", damage_oversized_gid, "gids/0: unreadable or oversized"},
    {"node_guid with a non-hex digit", damage_guid_bad_hex, "node_guid: malformed"},
    {"short node_guid", damage_guid_short, "node_guid: malformed"},
    {"node_guid with a NUL byte", damage_guid_nul, "node_guid: unreadable or oversized"},
    {"missing node_guid", damage_guid_missing, "node_guid: missing"},
    {"numa_node with a leading zero", damage_numa_leading_zero, "numa_node: malformed"},
    {"numa_node with trailing garbage", damage_numa_trailing_garbage, "numa_node: malformed"},
    {"numa_node below -1", damage_numa_negative, "numa_node: malformed"},
    {"numa_node with a leading space", damage_numa_space, "numa_node: malformed"},
    {"numa_node with two newlines", damage_numa_two_newlines, "numa_node: malformed"},
    {"rate with a wrong unit", damage_rate_unit, "rate: malformed"},
    {"unknown port state", damage_state_name, "state: malformed"},
    {"port state number and name disagree", damage_state_mismatch, "state: malformed"},
    {"unknown link layer", damage_link_layer, "link_layer: malformed"},
    {"GID with seven groups", damage_gid_groups, "gids/0: malformed"},
    {"unknown GID type", damage_gid_type, "types/0: malformed"},
    {"GID entry with a non-numeric name", damage_gid_index_name, "bad GID table"},
    {"port directory with a non-numeric name", damage_port_name, "bad port directory"},
    {"no ports directory", damage_no_ports, "no ports"},
    {"class symlink loop", damage_class_link_loop, "cannot open"},
    {"device symlink loop", damage_device_link_loop, "device: target is not a PCI function"},
    {"numa_node symlink loop", damage_numa_link_loop, "numa_node: unreadable or oversized"},
    {"numa_node is a FIFO", damage_numa_fifo, "numa_node: unreadable or oversized"},
    {"rate is a directory", damage_rate_directory, "rate: unreadable or oversized"},
    {"device link to a non-PCI device", damage_device_not_pci, "device: target is not a PCI function"},
    {"device link and PCI path disagree", damage_path_inconsistent, "does not end at the device link's function"},
};

/* The last warning logged, so that each damage is seen failing for its own reason. */
static char last_warning[1024];

static void capture_log(enum orb_log_level level, const char *message, void *ctx)
{
    (void)ctx;
    if (level <= ORB_LOG_WARN)
        snprintf(last_warning, sizeof last_warning, "%s", message);
}

static void test_damaged_nic_keeps_slot(void **state)
{
    (void)state;
    orb_log_set_handler(capture_log, NULL);
    for (size_t c = 0; c < sizeof damage_cases / sizeof damage_cases[0]; c++) {
        print_message("damage: %s\n", damage_cases[c].what);
        struct tree t;
        tree_init(&t);
        add_nic(&t, "mlx5_0", 1, 0);
        add_nic(&t, "mlx5_1", 2, 1);
        add_nic(&t, "mlx5_2", 3, 1);
        damage_cases[c].damage(&t);
        last_warning[0] = '\0';
        struct orb_topo_inventory *inv = load_tree(&t);
        if (strstr(last_warning, "slot 1 (mlx5_1)") == NULL || strstr(last_warning, damage_cases[c].reason) == NULL)
            fail_msg("warning \"%s\" does not give the reason \"%s\"", last_warning, damage_cases[c].reason);
        assert_int_equal(inv->nnics, 3);
        assert_healthy_nic(&inv->nics[0], 0, "mlx5_0", 1, 0);
        assert_failed_slot(&inv->nics[1], 1, "mlx5_1");
        assert_healthy_nic(&inv->nics[2], 2, "mlx5_2", 3, 1);
        free(inv);
        tree_free(&t);
    }
    orb_log_set_handler(NULL, NULL);
}

static void test_undamaged_tree_is_healthy(void **state)
{
    /* The control for the damage cases: the same tree without damage. */
    (void)state;
    struct tree t;
    tree_init(&t);
    add_nic(&t, "mlx5_0", 1, 0);
    add_nic(&t, "mlx5_1", 2, 1);
    add_nic(&t, "mlx5_2", 3, 1);
    struct orb_topo_inventory *inv = load_tree(&t);
    assert_int_equal(inv->nnics, 3);
    assert_healthy_nic(&inv->nics[0], 0, "mlx5_0", 1, 0);
    assert_healthy_nic(&inv->nics[1], 1, "mlx5_1", 2, 1);
    assert_healthy_nic(&inv->nics[2], 2, "mlx5_2", 3, 1);
    free(inv);
    tree_free(&t);
}

static void test_bad_names_keep_their_slots(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    char long_name[80];
    memset(long_name, 'x', sizeof long_name);
    memcpy(long_name, "mlx5_1", 6);
    long_name[64] = '\0'; /* 64 characters: one too many */
    add_nic(&t, "mlx5_0", 1, 0);
    add_nic(&t, long_name, 2, 0);
    add_nic(&t, "mlx5_2", 3, 0);
    add_nic(&t, "mlx5_3", 4, 0);
    add_nic(&t, "mlx5 4", 5, 0); /* a space: sorts before '_' */
    struct orb_topo_inventory *inv = load_tree(&t);
    assert_int_equal(inv->nnics, 5);
    assert_failed_slot(&inv->nics[0], 0, "");
    assert_healthy_nic(&inv->nics[1], 1, "mlx5_0", 1, 0);
    assert_failed_slot(&inv->nics[2], 2, "");
    assert_healthy_nic(&inv->nics[3], 3, "mlx5_2", 3, 0);
    assert_healthy_nic(&inv->nics[4], 4, "mlx5_3", 4, 0);
    free(inv);
    tree_free(&t);
}

static void test_ids_follow_natural_name_order(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    add_nic(&t, "mlx5_10", 1, 0);
    add_nic(&t, "mlx5_2", 2, 0);
    add_nic(&t, "bnxt_re0", 3, 0);
    add_nic(&t, "mlx5_1", 4, 0);
    struct orb_topo_inventory *inv = load_tree(&t);
    assert_int_equal(inv->nnics, 4);
    assert_healthy_nic(&inv->nics[0], 0, "bnxt_re0", 3, 0);
    assert_healthy_nic(&inv->nics[1], 1, "mlx5_1", 4, 0);
    assert_healthy_nic(&inv->nics[2], 2, "mlx5_2", 2, 0);
    assert_healthy_nic(&inv->nics[3], 3, "mlx5_10", 1, 0);
    free(inv);
    tree_free(&t);
}

static void test_more_than_64_nics_keeps_the_first_64(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    /* Created in reverse so that directory order does not match name order. */
    for (int i = ORB_TOPO_MAX_NICS + 1; i >= 0; i--) {
        char name[16];
        snprintf(name, sizeof name, "mlx5_%d", i);
        add_nic(&t, name, (unsigned)i + 1, 0);
    }
    struct orb_topo_inventory *inv = load_tree(&t);
    assert_int_equal(inv->nnics, ORB_TOPO_MAX_NICS);
    for (unsigned i = 0; i < ORB_TOPO_MAX_NICS; i++) {
        char name[16];
        snprintf(name, sizeof name, "mlx5_%u", i);
        assert_healthy_nic(&inv->nics[i], i, name, i + 1, 0);
    }
    free(inv);
    tree_free(&t);
}

/* ---------------------------------------------------------------------------------------------
 * Optional attributes and parsers */

static void test_missing_optional_attributes_are_unknown(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    add_nic(&t, "mlx5_0", 1, 0);
    char fn[128], dir[256], path[512];
    fn_dir(fn, sizeof fn, 1);
    nic_dir(dir, sizeof dir, 1, "mlx5_0");
    snprintf(path, sizeof path, "%s/numa_node", fn);
    remove_file(&t, path);
    snprintf(path, sizeof path, "%s/ports/1/link_layer", dir);
    remove_file(&t, path);
    snprintf(path, sizeof path, "%s/ports/1/rate", dir);
    remove_file(&t, path);
    /* A zero entry (skipped even though a type is shown for it) and a valid entry whose type
     * is gone. */
    put_nic(&t, 1, "mlx5_0", "ports/1/gids/1", "0000:0000:0000:0000:0000:0000:0000:0000\n");
    put_nic(&t, 1, "mlx5_0", "ports/1/gid_attrs/types/1", "RoCE v2\n");
    put_nic(&t, 1, "mlx5_0", "ports/1/gids/2", "fe80:0000:0000:0000:0000:0000:0000:0099\n");
    put_nic(&t, 1, "mlx5_0", "ports/1/gids/3", "0000:0000:0000:0000:0000:ffff:0a00:0001\n");
    put_nic(&t, 1, "mlx5_0", "ports/1/gid_attrs/types/3", "IB/RoCE v1\n");
    struct orb_topo_inventory *inv = load_tree(&t);
    assert_int_equal(inv->nnics, 1);
    const struct orb_topo_nic *nic = &inv->nics[0];
    assert_int_equal(nic->usable, 1);
    assert_int_equal(nic->numa_node, ORB_TOPO_NUMA_UNKNOWN);
    assert_string_equal(nic->pci, "0000:01:00.0");
    assert_int_equal(nic->ports[0].link_layer, ORB_LINK_UNKNOWN);
    assert_int_equal(nic->ports[0].rate_mbps, 0);
    assert_int_equal(nic->ports[0].ngids, 2);
    assert_int_equal(nic->ports[0].gids[0].index, 0);
    assert_int_equal(nic->ports[0].gids[0].is_ipv4, 0);
    assert_int_equal(nic->ports[0].gids[1].index, 3);
    /* "IB/RoCE v1" on a port whose link layer is unknown: IB. */
    assert_int_equal(nic->ports[0].gids[1].type, ORB_GID_IB);
    assert_int_equal(nic->ports[0].gids[1].is_ipv4, 1);
    free(inv);
    tree_free(&t);
}

static void test_virtual_device_has_unknown_locality(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    /* A software RDMA device: a real directory under devices/virtual, no device link. */
    put_link(&t, "class/infiniband/rxe0", "../../devices/virtual/infiniband/rxe0");
    put(&t, "devices/virtual/infiniband/rxe0/node_guid", "5054:00ff:fe12:3456\n");
    put(&t, "devices/virtual/infiniband/rxe0/ports/1/state", "4: ACTIVE\n");
    put(&t, "devices/virtual/infiniband/rxe0/ports/1/link_layer", "Ethernet\n");
    put(&t, "devices/virtual/infiniband/rxe0/ports/1/rate", "2.5 Gb/sec (1X SDR)\n");
    struct orb_topo_inventory *inv = load_tree(&t);
    assert_int_equal(inv->nnics, 1);
    const struct orb_topo_nic *nic = &inv->nics[0];
    assert_int_equal(nic->usable, 1);
    assert_string_equal(nic->name, "rxe0");
    assert_int_equal(nic->node_guid, 0x505400fffe123456ull);
    assert_string_equal(nic->pci, "");
    assert_int_equal(nic->path.depth, 0);
    assert_int_equal(nic->numa_node, ORB_TOPO_NUMA_UNKNOWN);
    assert_int_equal(nic->ports[0].rate_mbps, 2500);
    assert_int_equal(nic->ports[0].ngids, 0);
    free(inv);
    tree_free(&t);
}

/* The provider named in messages: the kernel driver of the parent device, rxe's `parent`
 * attribute for a soft-RoCE device, else none; nothing outside the NIC's directory is read. */
static void test_nic_provider_names_the_driver(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    char dir[256], path[512], buf[96];
    nic_dir(dir, sizeof dir, 3, "mlx5_0");
    snprintf(path, sizeof path, "../../%s", dir);
    put_link(&t, "class/infiniband/mlx5_0", path);
    put(&t, "bus/pci/drivers/mlx5_core/bind", "");
    fn_dir(dir, sizeof dir, 3);
    snprintf(path, sizeof path, "%s/driver", dir);
    put_link(&t, path, "../../../../bus/pci/drivers/mlx5_core");
    nic_dir(dir, sizeof dir, 3, "mlx5_0");
    snprintf(path, sizeof path, "%s/device", dir);
    put_link(&t, path, "../../../0000:03:00.0");
    assert_int_equal(orb_topo_nic_provider(t.fd, "mlx5_0", buf, sizeof buf), 0);
    assert_string_equal(buf, "kernel driver mlx5_core");
    /* Too small a buffer is an error, not a truncated name. */
    assert_int_equal(orb_topo_nic_provider(t.fd, "mlx5_0", buf, 10), ORB_ENOENT);

    put_link(&t, "class/infiniband/rxe0", "../../devices/virtual/infiniband/rxe0");
    put(&t, "devices/virtual/infiniband/rxe0/parent", "eth7\n");
    assert_int_equal(orb_topo_nic_provider(t.fd, "rxe0", buf, sizeof buf), 0);
    assert_string_equal(buf, "rxe (soft-RoCE over eth7)");
    assert_true(orb_topo_nic_is_rxe(t.fd, "rxe0"));
    assert_false(orb_topo_nic_is_rxe(t.fd, "mlx5_0"));

    /* A software device without rxe's attribute, an odd parent name, a missing NIC. */
    put_link(&t, "class/infiniband/siw0", "../../devices/virtual/infiniband/siw0");
    put(&t, "devices/virtual/infiniband/siw0/node_guid", "0000:0000:0000:0001\n");
    assert_int_equal(orb_topo_nic_provider(t.fd, "siw0", buf, sizeof buf), ORB_ENOENT);
    put_link(&t, "class/infiniband/rxe1", "../../devices/virtual/infiniband/rxe1");
    put(&t, "devices/virtual/infiniband/rxe1/parent", "../etc\n");
    assert_int_equal(orb_topo_nic_provider(t.fd, "rxe1", buf, sizeof buf), ORB_ENOENT);
    assert_false(orb_topo_nic_is_rxe(t.fd, "siw0"));
    assert_false(orb_topo_nic_is_rxe(t.fd, "rxe1"));
    assert_false(orb_topo_nic_is_rxe(t.fd, "nope0"));
    assert_false(orb_topo_nic_is_rxe(t.fd, "../x"));
    assert_false(orb_topo_nic_is_rxe(t.fd, NULL));
    assert_int_equal(orb_topo_nic_provider(t.fd, "nope0", buf, sizeof buf), ORB_ENOENT);
    assert_int_equal(orb_topo_nic_provider(t.fd, "../x", buf, sizeof buf), ORB_EINVAL);
    assert_int_equal(orb_topo_nic_provider(t.fd, NULL, buf, sizeof buf), ORB_EINVAL);
    assert_int_equal(orb_topo_nic_provider(t.fd, "rxe0", buf, 0), ORB_EINVAL);
    tree_free(&t);
}

struct rate_case {
    const char *text;
    int64_t mbps; /* -1: must fail closed */
};

static void test_rate_parsing(void **state)
{
    (void)state;
    static const struct rate_case cases[] = {
        {"100 Gb/sec (4X EDR)", 100000},  {"2.5 Gb/sec (1X SDR)", 2500},
        {"10 Gb/sec (4X)", 10000},        {"56 Gb/sec (4X FDR)", 56000},
        {"40 Gb/sec (4X FDR10)", 40000},  {"2400 Gb/sec (12X XDR)", 2400000},
        {"25 Gb/sec", 25000},             {"0.125 Gb/sec", 125},
        {"", -1},                         {"100", -1},
        {"2.5Gb/sec (1X SDR)", -1},       {"-1 Gb/sec", -1},
        {"100 Gb/sec (4X EDR", -1},       {"100 Gb/sec (4x EDR)", -1},
        {"100 Gb/sec (4X edr)", -1},      {"1.2345 Gb/sec", -1},
        {"0100 Gb/sec", -1},              {"100. Gb/sec", -1},
        {"100 Gb/sec (X EDR)", -1},       {"100 Gb/sec (4X EDR) ", -1},
        {"100 Gb/sec (4X )", -1},         {"9999999 Gb/sec", -1},
        {"100 Gb/sec ", -1},              {"100 Gb/sec (4X EDR)x", -1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        print_message("rate: \"%s\"\n", cases[c].text);
        struct tree t;
        tree_init(&t);
        add_nic(&t, "mlx5_0", 1, 0);
        char text[64];
        snprintf(text, sizeof text, "%s\n", cases[c].text);
        put_nic(&t, 1, "mlx5_0", "ports/1/rate", text);
        struct orb_topo_inventory *inv = load_tree(&t);
        if (cases[c].mbps < 0) {
            assert_failed_slot(&inv->nics[0], 0, "mlx5_0");
        } else {
            assert_int_equal(inv->nics[0].usable, 1);
            assert_int_equal(inv->nics[0].ports[0].rate_mbps, cases[c].mbps);
        }
        free(inv);
        tree_free(&t);
    }
}

static void test_port_states_and_limits(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    add_nic(&t, "mlx5_0", 1, 0);
    /* Ports 1..6: only the lowest four are kept; port 2 is in ACTIVE_DEFER. */
    static const char *const states[] = {"4: ACTIVE", "5: ACTIVE_DEFER", "1: DOWN", "2: INIT", "3: ARMED", "0: NOP"};
    for (unsigned p = 2; p <= 6; p++) {
        char rel[64], text[32];
        snprintf(rel, sizeof rel, "ports/%u/state", p);
        snprintf(text, sizeof text, "%s\n", states[p - 1]);
        put_nic(&t, 1, "mlx5_0", rel, text);
    }
    struct orb_topo_inventory *inv = load_tree(&t);
    const struct orb_topo_nic *nic = &inv->nics[0];
    assert_int_equal(nic->usable, 1);
    assert_int_equal(nic->nports, ORB_TOPO_MAX_PORTS);
    static const uint8_t expect_state[] = {ORB_PORT_ACTIVE, ORB_PORT_ACTIVE_DEFER, ORB_PORT_DOWN, ORB_PORT_INIT};
    for (unsigned p = 0; p < ORB_TOPO_MAX_PORTS; p++) {
        assert_int_equal(nic->ports[p].num, p + 1);
        assert_int_equal(nic->ports[p].state, expect_state[p]);
    }
    free(inv);
    tree_free(&t);
}

static void test_gid_table_keeps_lowest_valid_entries(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    add_nic(&t, "mlx5_0", 1, 0);
    /* Indexes 0..39: even ones valid (RoCE v2), odd ones unset. 20 valid: 16 kept, 0..30. */
    for (unsigned k = 0; k < 40; k++) {
        char rel[64], text[64];
        snprintf(rel, sizeof rel, "ports/1/gids/%u", k);
        if (k % 2 == 0) {
            snprintf(text, sizeof text, "fe80:0000:0000:0000:0000:0000:0000:%04x\n", k + 1);
            put_nic(&t, 1, "mlx5_0", rel, text);
            snprintf(rel, sizeof rel, "ports/1/gid_attrs/types/%u", k);
            put_nic(&t, 1, "mlx5_0", rel, k % 4 == 0 ? "RoCE v2\n" : "IB/RoCE v1\n");
        } else {
            put_nic(&t, 1, "mlx5_0", rel, "0000:0000:0000:0000:0000:0000:0000:0000\n");
        }
    }
    struct orb_topo_inventory *inv = load_tree(&t);
    const struct orb_topo_port *port = &inv->nics[0].ports[0];
    assert_int_equal(inv->nics[0].usable, 1);
    assert_int_equal(port->ngids, ORB_TOPO_MAX_GIDS);
    for (unsigned g = 0; g < ORB_TOPO_MAX_GIDS; g++) {
        assert_int_equal(port->gids[g].index, 2 * g);
        assert_int_equal(port->gids[g].raw[15], 2 * g + 1);
        assert_int_equal(port->gids[g].type, (2 * g) % 4 == 0 ? ORB_GID_ROCE_V2 : ORB_GID_ROCE_V1);
    }
    free(inv);
    tree_free(&t);
}

/* ---------------------------------------------------------------------------------------------
 * GPUs and NUMA nodes in scratch trees */

static void add_pci(struct tree *t, const char *chain, const char *vendor, const char *class_code, const char *numa)
{
    char path[512], target[512];
    const char *bdf = strrchr(chain, '/') + 1;
    snprintf(path, sizeof path, "devices/%s/vendor", chain);
    put(t, path, vendor);
    snprintf(path, sizeof path, "devices/%s/class", chain);
    put(t, path, class_code);
    if (numa != NULL) {
        snprintf(path, sizeof path, "devices/%s/numa_node", chain);
        put(t, path, numa);
    }
    snprintf(path, sizeof path, "bus/pci/devices/%s", bdf);
    snprintf(target, sizeof target, "../../../devices/%s", chain);
    put_link(t, path, target);
}

static void test_gpus_in_bus_order_and_identity_failure(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    add_pci(&t, "pci0000:80/0000:80:01.0/0000:81:00.0", "0x10de\n", "0x030200\n", "1\n");
    add_pci(&t, "pci0000:00/0000:00:01.0/0000:02:00.0", "0x10de\n", "0x030000\n", "0\n"); /* VGA class */
    add_pci(&t, "pci0000:00/0000:00:02.0/0000:1a:00.0", "0x10de\n", "0x030200\n", "bogus\n");
    add_pci(&t, "pci0000:00/0000:00:03.0/0000:03:00.0", "0x10de\n", "0x040300\n", "0\n"); /* audio */
    add_pci(&t, "pci0000:00/0000:00:04.0/0000:04:00.0", "0x1002\n", "0x030000\n", "0\n"); /* not NVIDIA */
    add_pci(&t, "pci0001:00/0001:00:00.0", "0x10de\n", "0x030200\n", NULL); /* integrated, domain 1 */
    struct orb_topo_inventory *inv = load_tree(&t);
    assert_int_equal(inv->ngpus, 4);
    static const char *const expect_pci[] = {"0000:02:00.0", "0000:1a:00.0", "0000:81:00.0", "0001:00:00.0"};
    static const int expect_numa[] = {0, ORB_TOPO_NUMA_UNKNOWN, 1, ORB_TOPO_NUMA_UNKNOWN};
    static const unsigned expect_depth[] = {3, 3, 3, 2};
    for (unsigned g = 0; g < 4; g++) {
        assert_int_equal(inv->gpus[g].ordinal, g);
        assert_string_equal(inv->gpus[g].pci, expect_pci[g]);
        assert_int_equal(inv->gpus[g].numa_node, expect_numa[g]);
        assert_int_equal(inv->gpus[g].path.depth, expect_depth[g]);
        assert_string_equal(inv->gpus[g].path.hops[expect_depth[g] - 1], expect_pci[g]);
    }
    free(inv);

    /* One device whose vendor cannot be read: no GPU list rather than wrong ordinals. */
    add_pci(&t, "pci0000:00/0000:00:05.0/0000:05:00.0", "0x10de0\n", "0x030200\n", "0\n");
    inv = load_tree(&t);
    assert_int_equal(inv->ngpus, 0);
    free(inv);
    add_pci(&t, "pci0000:00/0000:00:05.0/0000:05:00.0", "0x10de\n", "0x0302\n", "0\n");
    inv = load_tree(&t);
    assert_int_equal(inv->ngpus, 0);
    free(inv);
    add_pci(&t, "pci0000:00/0000:00:05.0/0000:05:00.0", "0x10de\n", "0x030200\n", "0\n");
    inv = load_tree(&t);
    assert_int_equal(inv->ngpus, 5);
    free(inv);
    put_link(&t, "bus/pci/devices/0000:06:00.0", "0000:06:00.0"); /* a loop: vendor unreadable */
    inv = load_tree(&t);
    assert_int_equal(inv->ngpus, 0);
    free(inv);
    tree_free(&t);
}

static void test_numa_nodes_and_distances(void **state)
{
    (void)state;
    struct tree t;
    tree_init(&t);
    /* Sparse ids: rows are in node order (0, 2, 3), as the kernel prints them. */
    put(&t, "devices/system/node/node0/distance", "10 21 31\n");
    put(&t, "devices/system/node/node2/distance", "21 10 21\n");
    put(&t, "devices/system/node/node3/distance", "31 21 10\n");
    put(&t, "devices/system/node/online", "0,2-3\n");
    put(&t, "devices/system/node/possible", "0-3\n");
    struct orb_topo_inventory *inv = load_tree(&t);
    assert_int_equal(inv->nnuma, 3);
    static const int32_t ids[] = {0, 2, 3};
    static const uint8_t rows[3][3] = {{10, 21, 31}, {21, 10, 21}, {31, 21, 10}};
    for (unsigned i = 0; i < 3; i++) {
        assert_int_equal(inv->numa[i].id, ids[i]);
        assert_int_equal(inv->numa[i].ndistances, 3);
        assert_memory_equal(inv->numa[i].distance, rows[i], 3);
    }
    free(inv);

    /* Damaged rows are unknown; the nodes stay. */
    put(&t, "devices/system/node/node0/distance", "10 21\n");        /* too short */
    put(&t, "devices/system/node/node2/distance", "21 10 2a1\n");    /* not a number */
    remove_file(&t, "devices/system/node/node3/distance");           /* missing */
    inv = load_tree(&t);
    assert_int_equal(inv->nnuma, 3);
    for (unsigned i = 0; i < 3; i++) {
        assert_int_equal(inv->numa[i].id, ids[i]);
        assert_int_equal(inv->numa[i].ndistances, 0);
    }
    free(inv);
    put(&t, "devices/system/node/node0/distance", "10 256 31\n");   /* out of range */
    put(&t, "devices/system/node/node2/distance", "21  10 21\n");   /* double space */
    put(&t, "devices/system/node/node3/distance", "31 21 10 \n");   /* trailing space */
    inv = load_tree(&t);
    for (unsigned i = 0; i < 3; i++)
        assert_int_equal(inv->numa[i].ndistances, 0);
    free(inv);
    tree_free(&t);

    /* More nodes than the inventory holds: the lowest ids are kept, but rows no longer map onto
     * the kept nodes, so every distance is unknown. */
    tree_init(&t);
    char row[1024] = "";
    for (unsigned j = 0; j <= ORB_TOPO_MAX_NUMA; j++)
        strcat(row, j == 0 ? "10" : " 20");
    strcat(row, "\n");
    for (unsigned i = 0; i <= ORB_TOPO_MAX_NUMA; i++) {
        char path[128];
        snprintf(path, sizeof path, "devices/system/node/node%u/distance", ORB_TOPO_MAX_NUMA - i);
        put(&t, path, row);
    }
    inv = load_tree(&t);
    assert_int_equal(inv->nnuma, ORB_TOPO_MAX_NUMA);
    for (unsigned i = 0; i < ORB_TOPO_MAX_NUMA; i++) {
        assert_int_equal(inv->numa[i].id, i);
        assert_int_equal(inv->numa[i].ndistances, 0);
    }
    free(inv);
    tree_free(&t);
}

/* ---------------------------------------------------------------------------------------------
 * The committed host fixtures, exactly */

static void assert_path(const struct orb_pci_path *path, const char *const *hops, unsigned depth)
{
    assert_int_equal(path->depth, depth);
    for (unsigned i = 0; i < depth; i++)
        assert_string_equal(path->hops[i], hops[i]);
    for (unsigned i = depth; i < ORB_TOPO_PCI_DEPTH; i++)
        assert_string_equal(path->hops[i], "");
}

static void gid_bytes(uint8_t raw[16], const char *text)
{
    unsigned w[8];
    assert_int_equal(sscanf(text, "%x:%x:%x:%x:%x:%x:%x:%x", &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6],
                            &w[7]),
                     8);
    for (unsigned i = 0; i < 8; i++) {
        raw[2 * i] = (uint8_t)(w[i] >> 8);
        raw[2 * i + 1] = (uint8_t)w[i];
    }
}

struct expect_gid {
    uint16_t index;
    uint8_t type;
    uint8_t is_ipv4;
    const char *text;
};

static void assert_port(const struct orb_topo_port *port, uint8_t num, uint8_t state_, uint8_t link,
                        uint32_t rate, const struct expect_gid *gids, unsigned ngids)
{
    assert_int_equal(port->num, num);
    assert_int_equal(port->state, state_);
    assert_int_equal(port->link_layer, link);
    assert_int_equal(port->rate_mbps, rate);
    assert_int_equal(port->ngids, ngids);
    for (unsigned g = 0; g < ngids; g++) {
        uint8_t raw[16];
        gid_bytes(raw, gids[g].text);
        assert_int_equal(port->gids[g].index, gids[g].index);
        assert_int_equal(port->gids[g].type, gids[g].type);
        assert_int_equal(port->gids[g].is_ipv4, gids[g].is_ipv4);
        assert_memory_equal(port->gids[g].raw, raw, 16);
    }
    static const struct orb_topo_gid zero_gid;
    for (unsigned g = ngids; g < ORB_TOPO_MAX_GIDS; g++)
        assert_memory_equal(&port->gids[g], &zero_gid, sizeof zero_gid);
}

static void assert_numa_pair(const struct orb_topo_inventory *inv, uint8_t near, uint8_t far)
{
    assert_int_equal(inv->nnuma, 2);
    assert_int_equal(inv->numa[0].id, 0);
    assert_int_equal(inv->numa[1].id, 1);
    assert_int_equal(inv->numa[0].ndistances, 2);
    assert_int_equal(inv->numa[1].ndistances, 2);
    assert_int_equal(inv->numa[0].distance[0], near);
    assert_int_equal(inv->numa[0].distance[1], far);
    assert_int_equal(inv->numa[1].distance[0], far);
    assert_int_equal(inv->numa[1].distance[1], near);
}

static void test_fixture_two_socket(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("two-socket");
    assert_int_equal(inv->nnics, 2);

    const struct orb_topo_nic *n0 = &inv->nics[0];
    assert_int_equal(n0->id, 0);
    assert_int_equal(n0->usable, 1);
    assert_string_equal(n0->name, "mlx5_0");
    assert_int_equal(n0->node_guid, 0x0c42a10300650a10ull);
    assert_string_equal(n0->pci, "0000:31:00.0");
    assert_int_equal(n0->numa_node, 0);
    static const char *const p0[] = {"pci0000:30", "0000:30:02.0", "0000:31:00.0"};
    assert_path(&n0->path, p0, 3);
    assert_int_equal(n0->nports, 1);
    static const struct expect_gid g0[] = {
        {0, ORB_GID_ROCE_V1, 0, "fe80:0000:0000:0000:0e42:a1ff:fe65:0a10"},
        {1, ORB_GID_ROCE_V2, 0, "fe80:0000:0000:0000:0e42:a1ff:fe65:0a10"},
        {2, ORB_GID_ROCE_V1, 1, "0000:0000:0000:0000:0000:ffff:c0a8:0a0b"},
        {3, ORB_GID_ROCE_V2, 1, "0000:0000:0000:0000:0000:ffff:c0a8:0a0b"},
    };
    assert_port(&n0->ports[0], 1, ORB_PORT_ACTIVE, ORB_LINK_ETHERNET, 100000, g0, 4);

    const struct orb_topo_nic *n1 = &inv->nics[1];
    assert_int_equal(n1->id, 1);
    assert_int_equal(n1->usable, 1);
    assert_string_equal(n1->name, "mlx5_1");
    assert_int_equal(n1->node_guid, 0x0c42a10300650b20ull);
    assert_string_equal(n1->pci, "0000:b1:00.0");
    assert_int_equal(n1->numa_node, 1);
    static const char *const p1[] = {"pci0000:b0", "0000:b0:02.0", "0000:b1:00.0"};
    assert_path(&n1->path, p1, 3);
    assert_int_equal(n1->nports, 1);
    static const struct expect_gid g1[] = {
        {0, ORB_GID_ROCE_V1, 0, "fe80:0000:0000:0000:0e42:a1ff:fe65:0b20"},
        {1, ORB_GID_ROCE_V2, 0, "fe80:0000:0000:0000:0e42:a1ff:fe65:0b20"},
        {2, ORB_GID_ROCE_V1, 1, "0000:0000:0000:0000:0000:ffff:c0a8:140b"},
        {3, ORB_GID_ROCE_V2, 1, "0000:0000:0000:0000:0000:ffff:c0a8:140b"},
    };
    assert_port(&n1->ports[0], 1, ORB_PORT_ACTIVE, ORB_LINK_ETHERNET, 25000, g1, 4);

    /* The BMC's VGA adapter (Matrox) is not a GPU; the Intel NIC is not an RDMA device. */
    assert_int_equal(inv->ngpus, 0);
    assert_numa_pair(inv, 10, 20);
    free(inv);
}

static void test_fixture_dgx8(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("dgx8");
    /* Leaf switch s holds GPUs 2s, 2s+1 and NICs mlx5_2s, mlx5_2s+1. */
    static const char *const leaf[4][5] = {
        {"pci0000:00", "0000:00:01.1", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"},
        {"pci0000:00", "0000:00:01.1", "0000:01:00.0", "0000:02:01.0", "0000:09:00.0"},
        {"pci0000:80", "0000:80:01.1", "0000:81:00.0", NULL, NULL},
        {"pci0000:80", "0000:80:03.1", "0000:87:00.0", NULL, NULL},
    };
    static const unsigned leaf_depth[4] = {5, 5, 3, 3};
    static const unsigned down_bus[4] = {0x04, 0x0a, 0x82, 0x88};
    static const unsigned end_bus[4][4] = {
        {0x05, 0x06, 0x07, 0x08}, {0x0b, 0x0c, 0x0d, 0x0e}, {0x83, 0x84, 0x85, 0x86}, {0x89, 0x8a, 0x8b, 0x8c}};

    assert_int_equal(inv->nnics, 8);
    assert_int_equal(inv->ngpus, 8); /* NVSwitches and the ASPEED VGA are not GPUs */
    for (unsigned s = 0; s < 4; s++) {
        for (unsigned slot = 0; slot < 4; slot++) {
            const char *hops[ORB_TOPO_PCI_DEPTH];
            char down[16], fn[16];
            unsigned depth = leaf_depth[s];
            for (unsigned h = 0; h < depth; h++)
                hops[h] = leaf[s][h];
            snprintf(down, sizeof down, "0000:%02x:%02x.0", down_bus[s], slot);
            snprintf(fn, sizeof fn, "0000:%02x:00.0", end_bus[s][slot]);
            hops[depth++] = down;
            hops[depth++] = fn;
            int numa = s < 2 ? 0 : 1;
            if (slot < 2) {
                const struct orb_topo_gpu *gpu = &inv->gpus[2 * s + slot];
                assert_int_equal(gpu->ordinal, 2 * s + slot);
                assert_string_equal(gpu->pci, fn);
                assert_int_equal(gpu->numa_node, numa);
                assert_path(&gpu->path, hops, depth);
                continue;
            }
            unsigned id = 2 * s + slot - 2;
            const struct orb_topo_nic *nic = &inv->nics[id];
            char name[16], gid[48];
            snprintf(name, sizeof name, "mlx5_%u", id);
            uint64_t guid = 0xb83fd20300a45e10ull + id;
            snprintf(gid, sizeof gid, "fe80:0000:0000:0000:b83f:d203:00a4:%04x", (unsigned)(guid & 0xffff));
            assert_int_equal(nic->id, id);
            assert_int_equal(nic->usable, 1);
            assert_string_equal(nic->name, name);
            assert_int_equal(nic->node_guid, guid);
            assert_string_equal(nic->pci, fn);
            assert_int_equal(nic->numa_node, numa);
            assert_path(&nic->path, hops, depth);
            assert_int_equal(nic->nports, 1);
            const struct expect_gid g[] = {{0, ORB_GID_IB, 0, gid}};
            if (id == 5)
                assert_port(&nic->ports[0], 1, ORB_PORT_DOWN, ORB_LINK_INFINIBAND, 10000, g, 1);
            else
                assert_port(&nic->ports[0], 1, ORB_PORT_ACTIVE, ORB_LINK_INFINIBAND, 200000, g, 1);
        }
    }
    assert_numa_pair(inv, 10, 32);
    free(inv);
}

static void test_fixture_no_numa(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = load_fixture("no-numa");
    assert_int_equal(inv->nnics, 1);
    const struct orb_topo_nic *nic = &inv->nics[0];
    assert_int_equal(nic->id, 0);
    assert_int_equal(nic->usable, 1);
    assert_string_equal(nic->name, "mlx5_0");
    assert_int_equal(nic->node_guid, 0x0c42a10300770c30ull);
    assert_string_equal(nic->pci, "0000:01:00.0");
    assert_int_equal(nic->numa_node, ORB_TOPO_NUMA_UNKNOWN);
    static const char *const np[] = {"pci0000:00", "0000:00:02.0", "0000:01:00.0"};
    assert_path(&nic->path, np, 3);
    static const struct expect_gid g[] = {
        {0, ORB_GID_ROCE_V1, 0, "fe80:0000:0000:0000:0e42:a1ff:fe77:0c30"},
        {1, ORB_GID_ROCE_V2, 0, "fe80:0000:0000:0000:0e42:a1ff:fe77:0c30"},
        {2, ORB_GID_ROCE_V1, 1, "0000:0000:0000:0000:0000:ffff:0a00:0005"},
        {3, ORB_GID_ROCE_V2, 1, "0000:0000:0000:0000:0000:ffff:0a00:0005"},
    };
    assert_port(&nic->ports[0], 1, ORB_PORT_ACTIVE, ORB_LINK_ETHERNET, 25000, g, 4);

    assert_int_equal(inv->ngpus, 1);
    assert_int_equal(inv->gpus[0].ordinal, 0);
    assert_string_equal(inv->gpus[0].pci, "0000:02:00.0");
    assert_int_equal(inv->gpus[0].numa_node, ORB_TOPO_NUMA_UNKNOWN);
    static const char *const gp[] = {"pci0000:00", "0000:00:02.1", "0000:02:00.0"};
    assert_path(&inv->gpus[0].path, gp, 3);
    assert_int_equal(inv->nnuma, 0);
    free(inv);
}

/* ---------------------------------------------------------------------------------------------
 * Concurrency: discovery has no shared state */

struct load_job {
    int fd;
    struct orb_topo_inventory *inv;
    int rc;
};

static void *load_thread(void *arg)
{
    struct load_job *job = arg;
    for (int i = 0; i < 5 && job->rc == 0; i++)
        job->rc = orb_topo_load_sysfs(job->fd, job->inv);
    return NULL;
}

static void test_concurrent_loads_agree(void **state)
{
    (void)state;
    struct orb_topo_inventory *reference = load_fixture("dgx8");
    char path[1024];
    snprintf(path, sizeof path, "%s/dgx8", FIXTURE_DIR);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(fd >= 0);
    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    struct load_job jobs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i].fd = fd;
        jobs[i].inv = calloc(1, sizeof *jobs[i].inv);
        jobs[i].rc = 0;
        assert_int_equal(pthread_create(&threads[i], NULL, load_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        assert_int_equal(jobs[i].rc, 0);
        assert_memory_equal(jobs[i].inv, reference, sizeof *reference);
        free(jobs[i].inv);
    }
    close(fd);
    free(reference);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rejects_bad_arguments),
        cmocka_unit_test(test_empty_tree_is_an_empty_inventory),
        cmocka_unit_test(test_unlistable_nic_directory_fails),
        cmocka_unit_test(test_damaged_nic_keeps_slot),
        cmocka_unit_test(test_undamaged_tree_is_healthy),
        cmocka_unit_test(test_bad_names_keep_their_slots),
        cmocka_unit_test(test_ids_follow_natural_name_order),
        cmocka_unit_test(test_more_than_64_nics_keeps_the_first_64),
        cmocka_unit_test(test_missing_optional_attributes_are_unknown),
        cmocka_unit_test(test_virtual_device_has_unknown_locality),
        cmocka_unit_test(test_nic_provider_names_the_driver),
        cmocka_unit_test(test_rate_parsing),
        cmocka_unit_test(test_port_states_and_limits),
        cmocka_unit_test(test_gid_table_keeps_lowest_valid_entries),
        cmocka_unit_test(test_gpus_in_bus_order_and_identity_failure),
        cmocka_unit_test(test_numa_nodes_and_distances),
        cmocka_unit_test(test_fixture_two_socket),
        cmocka_unit_test(test_fixture_dgx8),
        cmocka_unit_test(test_fixture_no_numa),
        cmocka_unit_test(test_concurrent_loads_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
