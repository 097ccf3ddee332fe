/* Policy text and decisions: every malformed form denies everything with "file:line: reason";
 * every documented value form; precedence (user over groups over defaults, union of groups,
 * largest budget); group membership by name and id; NIC matching by name, glob, GUID and PCI
 * address against the dgx8 fixture inventory; reasons agreeing with the decided masks. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/policy.h"
#include "core/error.h"
#include "topo/sysfs.h"

#if !defined(FIXTURE_DIR) || !defined(EXAMPLES_DIR)
#error "FIXTURE_DIR must name tests/data/sysfs and EXAMPLES_DIR policy/"
#endif

static struct orb_topo_inventory *dgx8;

static int load_inventory(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/dgx8", FIXTURE_DIR);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    dgx8 = calloc(1, sizeof *dgx8);
    int rc = dgx8 ? orb_topo_load_sysfs(fd, dgx8) : -1;
    close(fd);
    return rc == 0 && dgx8->nnics == 8 && dgx8->ngpus == 8 ? 0 : -1;
}

static int free_inventory(void **state)
{
    (void)state;
    free(dgx8);
    return 0;
}

/* ---- helpers ---------------------------------------------------------------------------- */

static const uint32_t alice_gids[] = {1000, 44, 100};
static const char *const alice_groups[] = {"alice", "video", "users"};

/* alice: uid 1000, groups alice(1000), video(44), users(100). */
static struct orb_policy_subject alice(void)
{
    return (struct orb_policy_subject){
        .uid = 1000, .user = "alice", .ngroups = 3, .gids = alice_gids, .group_names = alice_groups};
}

/* bob: uid 1001, only his own group, no account names at all. */
static const uint32_t bob_gids[] = {1001};
static struct orb_policy_subject bob_unnamed(void)
{
    return (struct orb_policy_subject){.uid = 1001, .user = NULL, .ngroups = 1, .gids = bob_gids,
                                       .group_names = NULL};
}

static struct orb_policy *load_ok(const char *text)
{
    struct orb_policy *p = NULL;
    int rc = orb_policy_load_string(text, "t.ini", &p);
    if (rc != 0)
        fail_msg("unexpected failure %d: %s", rc, p ? orb_policy_error(p) : orb_last_error());
    assert_non_null(p);
    assert_null(orb_policy_error(p));
    return p;
}

struct decision {
    struct orb_hp_policy out;
    struct orb_policy_reason reasons[ORB_POLICY_MAX_REASONS];
    size_t n;
};

static const struct orb_policy_reason *find_reason(const struct decision *d, const char *item)
{
    for (size_t i = 0; i < d->n; i++) {
        if (strcmp(d->reasons[i].item, item) == 0)
            return &d->reasons[i];
    }
    return NULL;
}

static void assert_reason(const struct decision *d, const char *item, const char *verdict, const char *source)
{
    const struct orb_policy_reason *r = find_reason(d, item);
    if (!r)
        fail_msg("no reason for '%s'", item);
    assert_string_equal(r->verdict, verdict);
    if (source)
        assert_string_equal(r->source, source);
}

/* Every item reason agrees with the decided masks and lists. */
static void assert_reasons_match(const struct decision *d, const struct orb_topo_inventory *inv)
{
    static const char *const transports[] = {"tcp", "rdma", "nvlink"};
    static const char *const routes[] = {"dmabuf", "peermem"};
    char item[96];
    for (uint32_t i = 0; i < 3; i++) {
        snprintf(item, sizeof item, "transport %s", transports[i]);
        assert_reason(d, item, (d->out.transports >> i) & 1u ? "allowed" : "denied", NULL);
    }
    for (uint32_t i = 0; i < 2; i++) {
        snprintf(item, sizeof item, "gpudirect %s", routes[i]);
        assert_reason(d, item, (d->out.gpudirect_routes >> i) & 1u ? "allowed" : "denied", NULL);
    }
    for (uint32_t i = 0; i < inv->nnics; i++) {
        snprintf(item, sizeof item, "nic %s", inv->nics[i].name);
        assert_reason(d, item, (d->out.nic_mask >> inv->nics[i].id) & 1u ? "allowed" : "denied", NULL);
    }
    assert_int_equal(d->out.nic_mask >> inv->nnics, 0);
    for (uint32_t i = 0; i < inv->ngpus; i++) {
        snprintf(item, sizeof item, "gpu %u", inv->gpus[i].ordinal);
        assert_reason(d, item, (d->out.gpu_mask >> inv->gpus[i].ordinal) & 1u ? "allowed" : "denied", NULL);
    }
    for (uint32_t i = 0; i < d->out.nslots; i++) {
        snprintf(item, sizeof item, "slot %s", d->out.slots[i]);
        assert_reason(d, item, "allowed", NULL);
    }
    if (d->out.nslots == 0)
        assert_reason(d, "slots", "none", NULL);
}

static void decide_on(const struct orb_policy *p, const struct orb_policy_subject *who,
                      const struct orb_topo_inventory *inv, struct decision *d)
{
    memset(d, 0xa5, sizeof *d);
    assert_int_equal(orb_policy_decide(p, who, inv, &d->out, d->reasons, ORB_POLICY_MAX_REASONS, &d->n), 0);
    assert_true(d->n <= ORB_POLICY_MAX_REASONS);
    for (size_t i = 0; i < d->n; i++) {
        assert_non_null(memchr(d->reasons[i].item, '\0', sizeof d->reasons[i].item));
        assert_non_null(memchr(d->reasons[i].verdict, '\0', sizeof d->reasons[i].verdict));
        assert_non_null(memchr(d->reasons[i].source, '\0', sizeof d->reasons[i].source));
    }
    assert_reasons_match(d, inv);
}

static void decide(const struct orb_policy *p, const struct orb_policy_subject *who, struct decision *d)
{
    decide_on(p, who, dgx8, d);
}

/* Decide `text` for alice on dgx8. */
static void decide_text(const char *text, struct decision *d)
{
    struct orb_policy *p = load_ok(text);
    struct orb_policy_subject who = alice();
    decide(p, &who, d);
    orb_policy_free(p);
}

/* Everything denied, every reason pointing at `where` ("t.ini:3"). */
static void assert_denies_all(const struct orb_policy *p, const char *where)
{
    struct orb_policy_subject who = alice();
    struct decision d;
    decide(p, &who, &d);
    assert_int_equal(d.out.transports, 0);
    assert_int_equal(d.out.gpudirect_routes, 0);
    assert_int_equal(d.out.nic_mask, 0);
    assert_int_equal(d.out.gpu_mask, 0);
    assert_int_equal(d.out.nslots, 0);
    assert_int_equal(d.out.max_registered_bytes, 0);
    assert_int_equal(d.out.max_endpoints, 0);
    assert_int_equal(d.out.max_grants, 0);
    char want[160];
    snprintf(want, sizeof want, "policy error at %s", where);
    for (size_t i = 0; i < d.n; i++)
        assert_string_equal(d.reasons[i].source, want);
}

/* `text` must be refused with a message starting "t.ini:<line>: " and containing `why`. */
static void assert_bad(const char *text, unsigned line, const char *why)
{
    struct orb_policy *p = NULL;
    int rc = orb_policy_load_string(text, "t.ini", &p);
    if (rc != ORB_ECONFIG)
        fail_msg("accepted (rc %d): %s", rc, text);
    assert_non_null(p);
    const char *err = orb_policy_error(p);
    assert_non_null(err);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "t.ini:%u: ", line);
    if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, why))
        fail_msg("for %s\nexpected %s...%s\ngot      %s", text, prefix, why, err);
    assert_string_equal(orb_last_error(), err);
    snprintf(prefix, sizeof prefix, "t.ini:%u", line);
    assert_denies_all(p, prefix);
    orb_policy_free(p);
}

/* ---- arguments -------------------------------------------------------------------------- */

static void test_null_arguments(void **state)
{
    (void)state;
    struct orb_policy *p = NULL;
    assert_int_equal(orb_policy_load_string(NULL, "t", &p), ORB_EINVAL);
    assert_int_equal(orb_policy_load_string("", "t", NULL), ORB_EINVAL);
    assert_int_equal(orb_policy_load_dir(-1, "d", 0, &p), ORB_EINVAL);
    assert_null(p);
    assert_string_equal(orb_policy_error(NULL), "no policy");
    orb_policy_free(NULL);

    p = load_ok("");
    struct orb_policy_subject who = alice();
    struct orb_hp_policy out;
    memset(&out, 0x5a, sizeof out);
    struct orb_hp_policy untouched = out;
    assert_int_equal(orb_policy_decide(NULL, &who, dgx8, &out, NULL, 0, NULL), ORB_EINVAL);
    assert_int_equal(orb_policy_decide(p, NULL, dgx8, &out, NULL, 0, NULL), ORB_EINVAL);
    assert_int_equal(orb_policy_decide(p, &who, NULL, &out, NULL, 0, NULL), ORB_EINVAL);
    assert_int_equal(orb_policy_decide(p, &who, dgx8, NULL, NULL, 0, NULL), ORB_EINVAL);
    struct orb_policy_reason r[2];
    assert_int_equal(orb_policy_decide(p, &who, dgx8, &out, r, 2, NULL), ORB_EINVAL);
    who.gids = NULL;
    assert_int_equal(orb_policy_decide(p, &who, dgx8, &out, NULL, 0, NULL), ORB_EINVAL);
    assert_memory_equal(&out, &untouched, sizeof out);
    orb_policy_free(p);
}

/* ---- malformed text: deny all, naming file and line ------------------------------------- */

static void test_structure_errors(void **state)
{
    (void)state;
    assert_bad("nics = mlx5_0\n", 1, "'nics' outside any section");
    assert_bad("; c\n[bogus]\n", 2, "unknown section [bogus]");
    assert_bad("[Defaults]\n", 1, "unknown section [Defaults]");
    assert_bad("[defaults\n", 1, "section header without ']'");
    assert_bad("[defaults] nics = x\n", 1, "text after the section header");
    assert_bad("[defaults]\njust words\n", 2, "syntax error: expected '[section]' or 'key = value'");
    assert_bad("[defaults]\nfoo = 1\n", 2, "unknown key 'foo' in [defaults]");
    assert_bad("[defaults]\nNICS = x\n", 2, "unknown key 'NICS'");
    assert_bad("[group:gpu]\ngpus = 1\n\n; c\ngpus = 2\n", 5,
               "duplicate key 'gpus' in [group:gpu] (first set at t.ini:2)");
    /* The same section twice is one section: still a duplicate. */
    assert_bad("[user:#7]\nmax_grants = 1\n[defaults]\n[user:#7]\nmax_grants = 2\n", 5, "duplicate key");
    assert_bad("[defaults]\nnics = a\x01\n", 2, "control character 0x01");
    assert_bad("[defaults]\nnics = a\x7f\n", 2, "control character 0x7f");
    /* A line inih would split in two is refused, not half-read. */
    char long_line[400];
    snprintf(long_line, sizeof long_line, "[defaults]\n; fine\nslots = %0300d\n", 0);
    assert_bad(long_line, 3, "line longer than");
    /* The line count survives a byte order mark and CRLF line ends. */
    assert_bad("\xEF\xBB\xBF[defaults]\r\n\r\nbad = 1\r\n", 3, "unknown key 'bad'");
    /* Messages never carry raw control bytes or unbounded text. */
    struct orb_policy *p = NULL;
    assert_int_equal(orb_policy_load_string("[defaults]\nnics = \xff\xfe\n", "t.ini", &p), ORB_ECONFIG);
    assert_non_null(strstr(orb_policy_error(p), "'?" "?'"));
    orb_policy_free(p);
}

static void test_oversize_text(void **state)
{
    (void)state;
    size_t n = 64 * 1024 + 1;
    char *text = malloc(n + 1);
    assert_non_null(text);
    memset(text, '\n', n);
    text[n] = '\0';
    struct orb_policy *p = NULL;
    assert_int_equal(orb_policy_load_string(text, "big.ini", &p), ORB_ECONFIG);
    assert_string_equal(orb_policy_error(p), "big.ini: larger than 65536 bytes");
    assert_denies_all(p, "big.ini");
    orb_policy_free(p);
    text[n - 1] = '\0'; /* exactly the limit is fine */
    p = load_ok(text);
    orb_policy_free(p);
    free(text);
}

static void test_section_names(void **state)
{
    (void)state;
    assert_bad("[user:]\n", 1, "unknown section");
    assert_bad("[group:]\n", 1, "unknown section");
    assert_bad("[user:-rf]\n", 1, "not a valid user name");
    assert_bad("[group:a b]\n", 1, "not a valid group name");
    assert_bad("[user:a/b]\n", 1, "not a valid user name");
    assert_bad("[user:$]\n", 1, "not a valid user name");
    assert_bad("[user:#]\n", 1, "not a numeric user id");
    assert_bad("[user:#abc]\n", 1, "not a numeric user id");
    assert_bad("[user:#01]\n", 1, "not a numeric user id");
    assert_bad("[group:#-1]\n", 1, "not a numeric group id");
    assert_bad("[user:#4294967295]\n", 1, "not a numeric user id");
    assert_bad("[user:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]\n", 1, "not a valid user name");
    /* A section with no keys is still checked (inih alone would never report it). */
    assert_bad("[defaults]\nnics = *\n[usr:alice]\n", 3, "unknown section");

    struct orb_policy *p = load_ok("[user:#0]\n[user:#4294967294]\n[group:#0]\n[user:svc$]\n[user:a.b-c_d@example.org]\n"
                                   "[group:domain-users]\n[user:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]\n");
    orb_policy_free(p);
}

static void test_list_errors(void **state)
{
    (void)state;
    assert_bad("[defaults]\nnics =\n", 2, "bad value for 'nics': empty value (write 'none' to deny)");
    assert_bad("[defaults]\nmax_grants =\n", 2, "empty value (write '0' to deny)");
    assert_bad("[defaults]\nnics = *, mlx5_0\n", 2, "'*' must be the only item");
    assert_bad("[defaults]\ngpus = 1, *\n", 2, "'*' must be the only item");
    assert_bad("[defaults]\nnics = none, mlx5_0\n", 2, "'none' must be the only item");
    assert_bad("[defaults]\nnics = a,,b\n", 2, "empty item");
    assert_bad("[defaults]\nnics = a,\n", 2, "empty item");
    assert_bad("[defaults]\nnics = , a\n", 2, "empty item");
    assert_bad("[defaults]\nnics = mlx5_0 # rail 0\n", 2, "is not a device name");
    char many[300] = "[defaults]\ngpus = ";
    for (int i = 0; i < 65; i++)
        strcat(many, i ? ",1" : "1");
    assert_bad(many, 2, "more than 64 items");
}

static void test_nic_value_errors(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "guid:", "guid:0x", "guid:0x0", "guid:0x12345678901234567", "guid:0xg", "guid:0c42:a103:0065:0a1",
        "guid:0c42:a103:0065:0a1z", "guid:0c42-a103-0065-0a10", "guid:0000:0000:0000:0000", "pci:",
        "pci:0000:31:00", "pci:0000:31:20.0", "pci:0000:31:00.8", "pci:000:31:00.0", "pci:0000-31-00.0",
        "pci:0000:31:00.0x", "mlx5/0", "..", ".", "a b", "a!b", "mlx5_0:1", "nic\"0",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", /* 64: one past a name */
        "mlx5_*/x", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa*",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "[defaults]\nnics = mlx5_0, %s\n", bad[i]);
        assert_bad(text, 2, "bad value for 'nics'");
    }
}

static void test_other_value_errors(void **state)
{
    (void)state;
    static const struct {
        const char *line;
        const char *why;
    } bad[] = {
        {"gpus = 64", "not a GPU ordinal"},
        {"gpus = -1", "not a GPU ordinal"},
        {"gpus = 1-", "not a GPU ordinal"},
        {"gpus = 3-1", "not a GPU ordinal"},
        {"gpus = 0-64", "not a GPU ordinal"},
        {"gpus = 01", "not a GPU ordinal"},
        {"gpus = x", "not a GPU ordinal"},
        {"gpus = mlx5_0", "not a GPU ordinal"},
        {"transports = *", "'*' is not allowed here"},
        {"transports = udp", "'udp' is not a transport (tcp, rdma, nvlink or none)"},
        {"transports = TCP", "not a transport"},
        {"gpudirect = nvlink", "not a GPUDirect route (dmabuf, peermem or none)"},
        {"gpudirect = *", "'*' is not allowed here"},
        {"slots = a/b", "not a slot name"},
        {"slots = ..", "not a slot name"},
        {"slots = *", "'*' is not allowed here"},
        {"slots = s0,s1,s2,s3,s4,s5,s6,s7,s8,s9,s10,s11,s12,s13,s14,s15,s16", "more than 16 slot names"},
        {"max_registered_bytes = 1X", "not a byte count"},
        {"max_registered_bytes = -1", "not a byte count"},
        {"max_registered_bytes = 1.5G", "not a byte count"},
        {"max_registered_bytes = 1 G", "not a byte count"},
        {"max_registered_bytes = G", "not a byte count"},
        {"max_registered_bytes = 0x10", "not a byte count"},
        {"max_registered_bytes = 18446744073709551615", "out of range (write 'unlimited'"},
        {"max_registered_bytes = 18446744073709551616", "not a byte count"},
        {"max_registered_bytes = 16777216T", "out of range"},
        {"max_registered_bytes = none", "not a byte count"},
        {"max_endpoints = 4294967295", "out of range"},
        {"max_endpoints = 1K", "not a count"},
        {"max_grants = Unlimited", "not a count"},
        {"max_grants = +1", "not a count"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "[defaults]\n%s\n", bad[i].line);
        assert_bad(text, 2, bad[i].why);
    }
}

/* ---- value forms ------------------------------------------------------------------------ */

static void test_builtin_defaults(void **state)
{
    (void)state;
    struct decision d;
    /* No text, comments only, or sections without keys: the built-in defaults. */
    static const char *const texts[] = {"", "; nothing\n# here\n\n", "[defaults]\n[user:alice]\n"};
    for (size_t t = 0; t < 3; t++) {
        decide_text(texts[t], &d);
        assert_int_equal(d.out.transports, ORB_HP_T_TCP);
        assert_int_equal(d.out.gpudirect_routes, 0);
        assert_int_equal(d.out.nic_mask, 0);
        assert_int_equal(d.out.gpu_mask, 0);
        assert_int_equal(d.out.nslots, 0);
        assert_int_equal(d.out.max_registered_bytes, 0);
        assert_int_equal(d.out.max_endpoints, 0);
        assert_int_equal(d.out.max_grants, 0);
        /* 3 transports + 2 routes + 8 NICs + 8 GPUs + "slots" + 3 budgets */
        assert_int_equal(d.n, 25);
        for (size_t i = 0; i < d.n; i++)
            assert_string_equal(d.reasons[i].source, "built-in default");
        assert_reason(&d, "transport tcp", "allowed", "built-in default");
        assert_reason(&d, "transport rdma", "denied", "built-in default");
        assert_reason(&d, "max_grants", "0", "built-in default");
    }
}

static void test_nic_forms(void **state)
{
    (void)state;
    struct decision d;
    decide_text("[defaults]\nnics = mlx5_3\n", &d);
    assert_int_equal(d.out.nic_mask, 1u << 3);
    assert_reason(&d, "nic mlx5_3", "allowed", "t.ini:2 [defaults] matches mlx5_3");
    assert_reason(&d, "nic mlx5_0", "denied", "t.ini:2 [defaults]: not listed");

    decide_text("[defaults]\nnics = mlx5_[0-2], mlx5_?7\n", &d);
    assert_int_equal(d.out.nic_mask, 0x07);
    decide_text("[defaults]\nnics = mlx5_[!0-5]\n", &d);
    assert_int_equal(d.out.nic_mask, 0xc0);
    decide_text("[defaults]\nnics = *\n", &d);
    assert_int_equal(d.out.nic_mask, 0xff);
    assert_reason(&d, "nic mlx5_7", "allowed", "t.ini:2 [defaults] matches *");
    decide_text("[defaults]\nnics = mlx*\n", &d);
    assert_int_equal(d.out.nic_mask, 0xff);
    decide_text("[defaults]\nnics = none\n", &d);
    assert_int_equal(d.out.nic_mask, 0);
    assert_reason(&d, "nic mlx5_0", "denied", "t.ini:2 [defaults]: none");

    /* GUIDs: 0x form (any case, leading zeros optional) and the sysfs colon form. */
    decide_text("[defaults]\nnics = guid:0xB83FD20300A45E11, guid:b83f:d203:00a4:5e16\n", &d);
    assert_int_equal(d.out.nic_mask, (1u << 1) | (1u << 6));
    assert_reason(&d, "nic mlx5_1", "allowed", "t.ini:2 [defaults] matches guid:0xB83FD20300A45E11");
    /* PCI addresses: case-insensitive, shown in lower case. */
    decide_text("[defaults]\nnics = pci:0000:0D:00.0, pci:0000:8c:00.0\n", &d);
    assert_int_equal(d.out.nic_mask, (1u << 2) | (1u << 7));
    assert_reason(&d, "nic mlx5_2", "allowed", "t.ini:2 [defaults] matches pci:0000:0d:00.0");
    /* Names that are absent from the inventory are fine (a policy may cover many hosts). */
    decide_text("[defaults]\nnics = ib0, pci:0000:ff:1f.7, guid:0x1\n", &d);
    assert_int_equal(d.out.nic_mask, 0);
}

/* Patterns against NICs whose identity is partly unknown. */
static void test_nic_unknown_identity(void **state)
{
    (void)state;
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    assert_non_null(inv);
    inv->nnics = 3;
    inv->nics[0] = (struct orb_topo_nic){.id = 0, .name = "mlx5_0"}; /* no GUID, no PCI */
    inv->nics[1] = (struct orb_topo_nic){.id = 1, .name = ""};       /* failed discovery */
    inv->nics[2] = (struct orb_topo_nic){.id = 2, .name = "mlx5_2", .node_guid = 5, .pci = "0000:01:00.0"};
    struct orb_policy *p = load_ok("[defaults]\nnics = guid:0x5, pci:0000:01:00.0, *_0x\n");
    struct orb_policy_subject who = alice();
    struct orb_hp_policy out;
    struct orb_policy_reason r[ORB_POLICY_MAX_REASONS];
    size_t n = 0;
    assert_int_equal(orb_policy_decide(p, &who, inv, &out, r, ORB_POLICY_MAX_REASONS, &n), 0);
    assert_int_equal(out.nic_mask, 1u << 2);
    assert_string_equal(r[5 + 1].item, "nic #1");
    orb_policy_free(p);
    /* "*" covers even the NIC without a usable name. */
    p = load_ok("[defaults]\nnics = *\n");
    assert_int_equal(orb_policy_decide(p, &who, inv, &out, NULL, 0, NULL), 0);
    assert_int_equal(out.nic_mask, 0x7);
    orb_policy_free(p);
    free(inv);
}

static void test_gpu_transport_route_forms(void **state)
{
    (void)state;
    struct decision d;
    decide_text("[defaults]\ngpus = 0, 2-3, 7, 40-63\n", &d);
    assert_int_equal(d.out.gpu_mask, 0x8d); /* only GPUs the inventory has */
    decide_text("[defaults]\ngpus = *\n", &d);
    assert_int_equal(d.out.gpu_mask, 0xff);
    decide_text("[defaults]\ngpus = none\ntransports = none\ngpudirect = none\n", &d);
    assert_int_equal(d.out.gpu_mask, 0);
    assert_int_equal(d.out.transports, 0);
    assert_reason(&d, "transport tcp", "denied", "t.ini:3 [defaults]: none");
    decide_text("[defaults]\ntransports = rdma, nvlink, tcp\ngpudirect = peermem, dmabuf\n", &d);
    assert_int_equal(d.out.transports, ORB_HP_T_TCP | ORB_HP_T_RDMA | ORB_HP_T_NVLINK);
    assert_int_equal(d.out.gpudirect_routes, ORB_HP_R_DMABUF | ORB_HP_R_PEERMEM);
    decide_text("[defaults]\ntransports = rdma\ngpudirect = dmabuf\n", &d);
    assert_int_equal(d.out.transports, ORB_HP_T_RDMA); /* tcp too is the administrator's to grant */
    assert_int_equal(d.out.gpudirect_routes, ORB_HP_R_DMABUF);
    assert_reason(&d, "transport tcp", "denied", "t.ini:2 [defaults]: not listed");
    assert_reason(&d, "gpudirect dmabuf", "allowed", "t.ini:3 [defaults]");
}

static void test_slot_and_budget_forms(void **state)
{
    (void)state;
    struct decision d;
    decide_text("[defaults]\nslots = prio, a.b-c_D, prio\n", &d);
    assert_int_equal(d.out.nslots, 2);
    assert_string_equal(d.out.slots[0], "prio");
    assert_string_equal(d.out.slots[1], "a.b-c_D");
    assert_reason(&d, "slot prio", "allowed", "t.ini:2 [defaults]");

    char sixty_four[128];
    snprintf(sixty_four, sizeof sixty_four, "[defaults]\nslots = %064d\n", 7);
    decide_text(sixty_four, &d);
    assert_int_equal(d.out.nslots, 1);
    assert_int_equal(strlen(d.out.slots[0]), 64);

    static const struct {
        const char *text;
        uint64_t bytes;
        const char *verdict;
    } bytes[] = {
        {"0", 0, "0"},
        {"123", 123, "123"},
        {"4K", 4096, "4096 (4K)"},
        {"2m", 2u << 20, "2097152 (2M)"},
        {"64G", 64ull << 30, "68719476736 (64G)"},
        {"1t", 1ull << 40, "1099511627776 (1T)"},
        {"1536M", 1536ull << 20, "1610612736 (1536M)"},
        {"16777215T", 16777215ull << 40, "18446742974197923840 (16777215T)"},
        {"18446744073709551614", UINT64_MAX - 1, "18446744073709551614"},
        {"unlimited", UINT64_MAX, "unlimited"},
    };
    for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "[defaults]\nmax_registered_bytes = %s\n", bytes[i].text);
        decide_text(text, &d);
        assert_int_equal(d.out.max_registered_bytes, bytes[i].bytes);
        assert_reason(&d, "max_registered_bytes", bytes[i].verdict, "t.ini:2 [defaults]");
    }
    decide_text("[defaults]\nmax_endpoints = 4294967294\nmax_grants = unlimited\n", &d);
    assert_int_equal(d.out.max_endpoints, UINT32_MAX - 1);
    assert_int_equal(d.out.max_grants, UINT32_MAX);
    assert_reason(&d, "max_grants", "unlimited", "t.ini:3 [defaults]");
    decide_text("[defaults]\nmax_endpoints = 0\nmax_grants = 12\n", &d);
    assert_int_equal(d.out.max_endpoints, 0);
    assert_int_equal(d.out.max_grants, 12);
}

/* Layout freedom: indentation, blanks, tabs, inline ';' comments, ':' separators, CRLF. */
static void test_text_layout(void **state)
{
    (void)state;
    struct decision d;
    decide_text("; site policy\n"
                "# another comment\n"
                "   [defaults]   ; the fallback\r\n"
                "\tnics\t=\tmlx5_0 ,\tmlx5_1   ; rails 0 and 1\n"
                "    gpus: 1\n"
                "transports=tcp,rdma\n"
                "   ;   indented comment with = and [brackets\n"
                "max_grants = 3\n",
                &d);
    assert_int_equal(d.out.nic_mask, 0x3);
    assert_int_equal(d.out.gpu_mask, 0x2);
    assert_int_equal(d.out.transports, ORB_HP_T_TCP | ORB_HP_T_RDMA);
    assert_int_equal(d.out.max_grants, 3);
    assert_reason(&d, "max_grants", "3", "t.ini:8 [defaults]");
    assert_reason(&d, "gpu 1", "allowed", "t.ini:5 [defaults]");
    /* A very long comment line is fine: comments never reach the tokenizer. */
    char text[1200];
    snprintf(text, sizeof text, ";%01000d\n[defaults]\nmax_grants = 4\n", 0);
    decide_text(text, &d);
    assert_int_equal(d.out.max_grants, 4);
    assert_reason(&d, "max_grants", "4", "t.ini:3 [defaults]");
    /* No final newline. */
    decide_text("[defaults]\nmax_grants = 5", &d);
    assert_int_equal(d.out.max_grants, 5);
}

/* ---- precedence ------------------------------------------------------------------------- */

static const char precedence_text[] =
    "[defaults]\n"                       /* 1 */
    "nics = mlx5_0\n"                    /* 2 */
    "gpus = 0\n"                         /* 3 */
    "transports = tcp\n"                 /* 4 */
    "max_registered_bytes = 1G\n"        /* 5 */
    "max_endpoints = 4\n"                /* 6 */
    "[group:video]\n"                    /* 7 */
    "nics = mlx5_1, mlx5_2\n"            /* 8 */
    "transports = rdma\n"                /* 9 */
    "max_registered_bytes = 8G\n"        /* 10 */
    "slots = a, b\n"                     /* 11 */
    "[group:#100]\n"                     /* 12 */
    "nics = mlx5_2, mlx5_3\n"            /* 13 */
    "transports = tcp\n"                 /* 14 */
    "max_registered_bytes = 16G\n"       /* 15 */
    "slots = b, c\n"                     /* 16 */
    "[group:wheel]\n"                    /* 17: alice is not in it */
    "nics = *\n"                         /* 18 */
    "max_registered_bytes = unlimited\n" /* 19 */
    "[user:alice]\n"                     /* 20 */
    "gpus = 5-6\n"                       /* 21 */
    "max_endpoints = 64\n";              /* 22 */

static void test_user_over_groups_over_defaults(void **state)
{
    (void)state;
    struct decision d;
    decide_text(precedence_text, &d);
    /* nics: union of video and #100, not defaults, not wheel. */
    assert_int_equal(d.out.nic_mask, 0x0e);
    assert_reason(&d, "nic mlx5_1", "allowed", "t.ini:8 [group:video] matches mlx5_1");
    assert_reason(&d, "nic mlx5_2", "allowed", "t.ini:8 [group:video] matches mlx5_2");
    assert_reason(&d, "nic mlx5_3", "allowed", "t.ini:13 [group:#100] matches mlx5_3");
    assert_reason(&d, "nic mlx5_0", "denied", "not listed by t.ini:8 [group:video], t.ini:13 [group:#100]");
    /* transports: union of the groups. */
    assert_int_equal(d.out.transports, ORB_HP_T_TCP | ORB_HP_T_RDMA);
    assert_reason(&d, "transport tcp", "allowed", "t.ini:14 [group:#100]");
    /* gpus: the user section wins. */
    assert_int_equal(d.out.gpu_mask, 0x60);
    assert_reason(&d, "gpu 5", "allowed", "t.ini:21 [user:alice]");
    assert_reason(&d, "gpu 0", "denied", "t.ini:21 [user:alice]: not listed");
    /* budgets: the largest of the groups; the user's own when set. */
    assert_int_equal(d.out.max_registered_bytes, 16ull << 30);
    assert_reason(&d, "max_registered_bytes", "17179869184 (16G)", "t.ini:15 [group:#100] (largest of the groups)");
    assert_int_equal(d.out.max_endpoints, 64);
    assert_reason(&d, "max_endpoints", "64", "t.ini:22 [user:alice]");
    /* slots: union without repeats, in file order. */
    assert_int_equal(d.out.nslots, 3);
    assert_string_equal(d.out.slots[0], "a");
    assert_string_equal(d.out.slots[1], "b");
    assert_string_equal(d.out.slots[2], "c");
    assert_reason(&d, "slot c", "allowed", "t.ini:16 [group:#100]");
    /* Keys nobody matching sets: built-in. */
    assert_int_equal(d.out.gpudirect_routes, 0);
    assert_int_equal(d.out.max_grants, 0);
    assert_reason(&d, "max_grants", "0", "built-in default");
}

static void test_defaults_for_non_members(void **state)
{
    (void)state;
    struct orb_policy *p = load_ok(precedence_text);
    struct orb_policy_subject who = bob_unnamed();
    struct decision d;
    decide(p, &who, &d);
    assert_int_equal(d.out.nic_mask, 0x01);
    assert_int_equal(d.out.gpu_mask, 0x01);
    assert_int_equal(d.out.transports, ORB_HP_T_TCP);
    assert_int_equal(d.out.max_registered_bytes, 1ull << 30);
    assert_int_equal(d.out.max_endpoints, 4);
    assert_int_equal(d.out.nslots, 0);
    assert_reason(&d, "nic mlx5_0", "allowed", "t.ini:2 [defaults] matches mlx5_0");
    assert_reason(&d, "slots", "none", "built-in default");

    /* wheel by gid (no names known): unlimited beats every number. */
    uint32_t gids[] = {1001, 10};
    const char *names[] = {NULL, "wheel"};
    who.ngroups = 2;
    who.gids = gids;
    who.group_names = names;
    decide(p, &who, &d);
    assert_int_equal(d.out.nic_mask, 0xff);
    assert_int_equal(d.out.max_registered_bytes, UINT64_MAX);
    assert_reason(&d, "max_registered_bytes", "unlimited", "t.ini:19 [group:wheel] (largest of the groups)");
    /* Keys wheel does not set fall through to defaults. */
    assert_int_equal(d.out.max_endpoints, 4);
    orb_policy_free(p);
}

static void test_user_by_uid_and_name(void **state)
{
    (void)state;
    struct orb_policy *p = load_ok("[user:#1001]\nmax_grants = 7\n[user:alice]\nmax_grants = 9\n"
                                   "[user:#1000]\nmax_endpoints = 2\n[group:#1001]\nmax_endpoints = 3\n");
    struct decision d;
    /* bob has no account name: only the numeric form can match him. */
    struct orb_policy_subject who = bob_unnamed();
    decide(p, &who, &d);
    assert_int_equal(d.out.max_grants, 7);
    assert_int_equal(d.out.max_endpoints, 3);
    assert_reason(&d, "max_endpoints", "3", "t.ini:8 [group:#1001] (largest of the groups)");
    /* alice by name for one key and by uid for the other. */
    who = alice();
    decide(p, &who, &d);
    assert_int_equal(d.out.max_grants, 9);
    assert_int_equal(d.out.max_endpoints, 2);
    assert_reason(&d, "max_endpoints", "2", "t.ini:6 [user:#1000]");
    /* A name section does not match a uid that has another name. */
    who.user = "mallory";
    decide(p, &who, &d);
    assert_int_equal(d.out.max_grants, 0);
    orb_policy_free(p);
}

static void test_user_sections_in_conflict(void **state)
{
    (void)state;
    struct decision d;
    decide_text("[defaults]\nnics = *\nmax_grants = 5\n"
                "[user:alice]\nnics = mlx5_0\nmax_grants = 3\n"
                "[user:#1000]\nnics = mlx5_1\n",
                &d);
    /* Both name alice: the key they both set is denied, the other is decided normally. */
    assert_int_equal(d.out.nic_mask, 0);
    assert_reason(&d, "nic mlx5_0", "denied", "conflict: t.ini:5 [user:alice] and t.ini:8 [user:#1000] both set it");
    assert_int_equal(d.out.max_grants, 3);
}

static void test_user_none_overrides_groups(void **state)
{
    (void)state;
    struct decision d;
    decide_text("[group:video]\ntransports = tcp, rdma\nnics = *\n[user:alice]\ntransports = none\nnics = none\n", &d);
    assert_int_equal(d.out.transports, 0);
    assert_int_equal(d.out.nic_mask, 0);
    assert_reason(&d, "transport rdma", "denied", "t.ini:5 [user:alice]: none");
    /* A group's "none" takes part in the union as the empty list. */
    decide_text("[defaults]\nnics = *\n[group:video]\nnics = none\n[group:users]\nnics = mlx5_4\n", &d);
    assert_int_equal(d.out.nic_mask, 0x10);
    decide_text("[defaults]\nnics = *\n[group:video]\nnics = none\n", &d);
    assert_int_equal(d.out.nic_mask, 0);
    assert_reason(&d, "nic mlx5_4", "denied", "not listed by t.ini:4 [group:video]");
}

static void test_slot_union_limit(void **state)
{
    (void)state;
    struct decision d;
    decide_text("[group:video]\nslots = s0,s1,s2,s3,s4,s5,s6,s7,s8,s9\n"
                "[group:users]\nslots = s5,s10,s11,s12,s13,s14,s15,s16,s17\n",
                &d);
    assert_int_equal(d.out.nslots, ORB_HP_MAX_SLOTS);
    assert_string_equal(d.out.slots[15], "s15");
    assert_reason(&d, "slots", "2 dropped", "more than 16 names; first dropped at t.ini:4 [group:users]");
    decide_text("[group:video]\nslots = none\n[group:users]\nslots = none\n", &d);
    assert_int_equal(d.out.nslots, 0);
    assert_reason(&d, "slots", "none", "none in t.ini:2 [group:video], t.ini:4 [group:users]");
}

static void test_reason_capacity(void **state)
{
    (void)state;
    struct orb_policy *p = load_ok("[defaults]\nnics = *\n");
    struct orb_policy_subject who = alice();
    struct orb_hp_policy full, capped;
    struct orb_policy_reason r[4];
    memset(r, 0, sizeof r);
    size_t n = 99;
    assert_int_equal(orb_policy_decide(p, &who, dgx8, &full, NULL, 0, NULL), 0);
    assert_int_equal(orb_policy_decide(p, &who, dgx8, &capped, r, 3, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(r[0].item, "transport tcp");
    assert_string_equal(r[2].item, "transport nvlink");
    assert_string_equal(r[3].item, ""); /* nothing past the capacity */
    assert_memory_equal(&full, &capped, sizeof full);
    n = 99;
    assert_int_equal(orb_policy_decide(p, &who, dgx8, &capped, r, 0, &n), 0);
    assert_int_equal(n, 0);
    orb_policy_free(p);
}

/* A decision is a pure function of policy, subject and inventory. */
static void test_decisions_repeat(void **state)
{
    (void)state;
    struct orb_policy *p = load_ok(precedence_text);
    struct orb_policy_subject who = alice();
    struct decision a, b;
    decide(p, &who, &a);
    decide(p, &who, &b);
    assert_memory_equal(&a.out, &b.out, sizeof a.out);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.reasons, b.reasons, a.n * sizeof a.reasons[0]);
    orb_policy_free(p);
}

/* Loading and deciding are safe from several threads at once: a loaded policy is read-only. */
struct worker {
    const struct orb_policy *shared;
    const struct decision *reference;
    int mismatches;
};

static void *decide_worker(void *arg)
{
    struct worker *w = arg;
    struct orb_policy_subject who = alice();
    struct decision *d = malloc(sizeof *d);
    if (!d) {
        w->mismatches = -1;
        return NULL;
    }
    for (int i = 0; i < 50; i++) {
        struct orb_policy *own = NULL;
        if (orb_policy_load_string(precedence_text, "t.ini", &own) != 0)
            w->mismatches++;
        const struct orb_policy *p = (i % 2) ? w->shared : own;
        if (orb_policy_decide(p, &who, dgx8, &d->out, d->reasons, ORB_POLICY_MAX_REASONS, &d->n) != 0 ||
            memcmp(&d->out, &w->reference->out, sizeof d->out) != 0 || d->n != w->reference->n ||
            memcmp(d->reasons, w->reference->reasons, d->n * sizeof d->reasons[0]) != 0)
            w->mismatches++;
        orb_policy_free(own);
    }
    free(d);
    return NULL;
}

static void test_concurrent_decisions(void **state)
{
    (void)state;
    struct orb_policy *p = load_ok(precedence_text);
    struct orb_policy_subject who = alice();
    struct decision *reference = malloc(sizeof *reference);
    assert_non_null(reference);
    decide(p, &who, reference);
    pthread_t threads[4];
    struct worker workers[4];
    for (int i = 0; i < 4; i++) {
        workers[i] = (struct worker){.shared = p, .reference = reference};
        assert_int_equal(pthread_create(&threads[i], NULL, decide_worker, &workers[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        assert_int_equal(workers[i].mismatches, 0);
    }
    free(reference);
    orb_policy_free(p);
}

/* ---- the example policies -------------------------------------------------------------- */

static struct orb_policy *load_example(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", EXAMPLES_DIR, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[64 * 1024 + 1];
    size_t n = fread(text, 1, sizeof text - 1, f);
    assert_true(n > 0 && n < sizeof text - 1);
    text[n] = '\0';
    fclose(f);
    struct orb_policy *p = NULL;
    if (orb_policy_load_string(text, name, &p) != 0)
        fail_msg("%s: %s", name, orb_policy_error(p));
    return p;
}

static void test_example_two_tenants_split_rails(void **state)
{
    (void)state;
    struct orb_policy *p = load_example("two-tenants-split-rails.ini");
    const uint32_t gid_a = 2001, gid_b = 2002;
    const char *name_a = "tenant-a", *name_b = "tenant-b";
    struct orb_policy_subject a = {.uid = 3001, .user = "svc-a", .ngroups = 1, .gids = &gid_a, .group_names = &name_a};
    struct orb_policy_subject b = {.uid = 3002, .user = "svc-b", .ngroups = 1, .gids = &gid_b, .group_names = &name_b};
    struct orb_policy_subject batch = b;
    batch.user = "tenant-b-batch";
    struct orb_policy_subject other = bob_unnamed();
    struct decision d;
    decide(p, &a, &d);
    assert_int_equal(d.out.nic_mask, 0x0f); /* by name */
    assert_int_equal(d.out.gpu_mask, 0x0f);
    assert_int_equal(d.out.transports, ORB_HP_T_TCP | ORB_HP_T_RDMA | ORB_HP_T_NVLINK);
    assert_int_equal(d.out.gpudirect_routes, ORB_HP_R_DMABUF);
    assert_int_equal(d.out.nslots, 1);
    assert_string_equal(d.out.slots[0], "tenant-a");
    decide(p, &b, &d);
    assert_int_equal(d.out.nic_mask, 0xf0); /* by PCI address */
    assert_int_equal(d.out.gpu_mask, 0xf0);
    assert_int_equal(d.out.max_registered_bytes, 512ull << 30);
    decide(p, &batch, &d);
    assert_int_equal(d.out.nic_mask, 0xf0);
    assert_int_equal(d.out.max_registered_bytes, 32ull << 30);
    decide(p, &other, &d);
    assert_int_equal(d.out.nic_mask, 0);
    assert_int_equal(d.out.gpu_mask, 0);
    assert_int_equal(d.out.transports, ORB_HP_T_TCP);
    orb_policy_free(p);
}

static void test_example_single_tenant_and_gpudirect_off(void **state)
{
    (void)state;
    struct orb_policy *p = load_example("single-tenant.ini");
    struct orb_policy_subject svc = {.uid = 990, .user = "inference", .ngroups = 0};
    struct orb_policy_subject other = bob_unnamed();
    struct decision d;
    decide(p, &svc, &d);
    assert_int_equal(d.out.nic_mask, 0xff);
    assert_int_equal(d.out.gpu_mask, 0xff);
    assert_int_equal(d.out.gpudirect_routes, ORB_HP_R_DMABUF);
    assert_int_equal(d.out.max_registered_bytes, 1ull << 40);
    decide(p, &other, &d);
    assert_int_equal(d.out.nic_mask, 0);
    assert_int_equal(d.out.transports, ORB_HP_T_TCP);
    assert_int_equal(d.out.max_grants, 0);
    orb_policy_free(p);

    p = load_example("gpudirect-off.ini");
    decide(p, &other, &d);
    assert_int_equal(d.out.nic_mask, 0xff);
    assert_int_equal(d.out.transports, ORB_HP_T_TCP | ORB_HP_T_RDMA | ORB_HP_T_NVLINK);
    assert_int_equal(d.out.gpudirect_routes, 0);
    assert_reason(&d, "gpudirect dmabuf", "denied", "gpudirect-off.ini:11 [defaults]: none");
    orb_policy_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_structure_errors),
        cmocka_unit_test(test_oversize_text),
        cmocka_unit_test(test_section_names),
        cmocka_unit_test(test_list_errors),
        cmocka_unit_test(test_nic_value_errors),
        cmocka_unit_test(test_other_value_errors),
        cmocka_unit_test(test_builtin_defaults),
        cmocka_unit_test(test_nic_forms),
        cmocka_unit_test(test_nic_unknown_identity),
        cmocka_unit_test(test_gpu_transport_route_forms),
        cmocka_unit_test(test_slot_and_budget_forms),
        cmocka_unit_test(test_text_layout),
        cmocka_unit_test(test_user_over_groups_over_defaults),
        cmocka_unit_test(test_defaults_for_non_members),
        cmocka_unit_test(test_user_by_uid_and_name),
        cmocka_unit_test(test_user_sections_in_conflict),
        cmocka_unit_test(test_user_none_overrides_groups),
        cmocka_unit_test(test_slot_union_limit),
        cmocka_unit_test(test_reason_capacity),
        cmocka_unit_test(test_decisions_repeat),
        cmocka_unit_test(test_concurrent_decisions),
        cmocka_unit_test(test_example_two_tenants_split_rails),
        cmocka_unit_test(test_example_single_tenant_and_gpudirect_off),
    };
    return cmocka_run_group_tests(tests, load_inventory, free_inventory);
}
