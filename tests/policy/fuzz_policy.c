/* Fuzz target for the policy parser and decisions. The input is a policy text (cut at its first
 * NUL byte); it is loaded with orb_policy_load_string and decided for three subjects on a small
 * fixed inventory. Aborts on: a status other than 0 or ORB_ECONFIG; an error message that does
 * not start with the origin or carries control bytes; a denying policy that grants anything; a
 * decision that differs between two runs or with and without reasons; a grant outside the
 * inventory; an unterminated reason or slot name; an invalid slot name. Built with
 * -fsanitize=fuzzer under clang and replayed over tests/policy/corpus by fuzz_policy_replay. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/policy.h"
#include "core/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_policy: %s\n", what);
        abort();
    }
}

static struct orb_topo_inventory inventory;

/* Four NICs (one with an unknown identity), four GPUs. */
static void build_inventory(void)
{
    static const char *const names[] = {"mlx5_0", "mlx5_1", "ib0", ""};
    static const char *const pcis[] = {"0000:31:00.0", "0000:b1:00.0", "", "0000:ca:00.1"};
    static const uint64_t guids[] = {0x0c42a10300650a10ull, 0x0c42a10300650b20ull, 0, 0x1ull};
    inventory.nnics = 4;
    for (uint8_t i = 0; i < 4; i++) {
        struct orb_topo_nic *nic = &inventory.nics[i];
        nic->id = i;
        nic->usable = names[i][0] != '\0';
        snprintf(nic->name, sizeof nic->name, "%s", names[i]);
        snprintf(nic->pci, sizeof nic->pci, "%s", pcis[i]);
        nic->node_guid = guids[i];
    }
    inventory.ngpus = 4;
    for (uint32_t g = 0; g < 4; g++)
        inventory.gpus[g].ordinal = g == 3 ? 7 : g; /* a gap in the ordinals */
}

static int slot_name_ok(const char *s)
{
    size_t n = strnlen(s, ORB_HP_NAME_MAX + 1);
    if (n == 0 || n > ORB_HP_NAME_MAX || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return 0;
    return strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") == n;
}

static void check_text(const char *s, size_t cap, const char *what)
{
    check(memchr(s, '\0', cap) != NULL, what);
    for (const char *c = s; *c; c++)
        check((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f, what);
}

static void decide_checked(const struct orb_policy *p, const struct orb_policy_subject *who)
{
    static struct orb_policy_reason reasons[ORB_POLICY_MAX_REASONS];
    static struct orb_policy_reason again[ORB_POLICY_MAX_REASONS];
    struct orb_hp_policy out, out2, out3;
    memset(&out, 0, sizeof out);
    memset(&out2, 0, sizeof out2);
    memset(&out3, 0, sizeof out3);
    size_t n = 0, n2 = 0;
    check(orb_policy_decide(p, who, &inventory, &out, reasons, ORB_POLICY_MAX_REASONS, &n) == 0, "decide failed");
    check(orb_policy_decide(p, who, &inventory, &out2, again, ORB_POLICY_MAX_REASONS, &n2) == 0, "decide failed");
    check(orb_policy_decide(p, who, &inventory, &out3, NULL, 0, NULL) == 0, "decide without reasons failed");
    check(memcmp(&out, &out2, sizeof out) == 0 && memcmp(&out, &out3, sizeof out) == 0, "decision not repeatable");
    check(n == n2 && memcmp(reasons, again, n * sizeof reasons[0]) == 0, "reasons not repeatable");
    check(n >= 3 + 2 + inventory.nnics + inventory.ngpus + 1 + 3 && n <= ORB_POLICY_MAX_REASONS, "reason count");
    for (size_t i = 0; i < n; i++) {
        check_text(reasons[i].item, sizeof reasons[i].item, "reason item");
        check_text(reasons[i].verdict, sizeof reasons[i].verdict, "reason verdict");
        check_text(reasons[i].source, sizeof reasons[i].source, "reason source");
    }
    check((out.nic_mask & ~0xfull) == 0, "NIC outside the inventory");
    check((out.gpu_mask & ~0x87ull) == 0, "GPU outside the inventory");
    check((out.transports & ~7u) == 0 && (out.gpudirect_routes & ~3u) == 0, "unknown bits");
    check(out.nslots <= ORB_HP_MAX_SLOTS, "too many slots");
    for (uint32_t i = 0; i < out.nslots; i++) {
        check(slot_name_ok(out.slots[i]), "bad slot name");
        for (uint32_t j = 0; j < i; j++)
            check(strcmp(out.slots[i], out.slots[j]) != 0, "repeated slot name");
    }
    if (orb_policy_error(p)) {
        check(out.nic_mask == 0 && out.gpu_mask == 0 && out.transports == 0 && out.gpudirect_routes == 0 &&
                  out.nslots == 0 && out.max_registered_bytes == 0 && out.max_endpoints == 0 &&
                  out.max_grants == 0,
              "a denying policy granted something");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (inventory.nnics == 0)
        build_inventory();
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    struct orb_policy *p = NULL;
    int rc = orb_policy_load_string(text, "fuzz.ini", &p);
    check(rc == 0 || rc == ORB_ECONFIG, "unexpected load status");
    check(p != NULL, "no policy returned");
    const char *err = orb_policy_error(p);
    check((rc == 0) == (err == NULL), "status and error disagree");
    if (err) {
        check(strncmp(err, "fuzz.ini", 8) == 0, "error does not name the origin");
        check_text(err, strlen(err) + 1, "error text");
    }

    static const uint32_t gids[] = {1000, 44, 100, 0};
    static const char *const group_names[] = {"alice", "video", "users", NULL};
    const struct orb_policy_subject subjects[] = {
        {.uid = 1000, .user = "alice", .ngroups = 4, .gids = gids, .group_names = group_names},
        {.uid = 0, .user = NULL, .ngroups = 1, .gids = &gids[3], .group_names = NULL},
        {.uid = 4294967294u, .user = "nobody", .ngroups = 0, .gids = NULL, .group_names = NULL},
    };
    for (size_t i = 0; i < sizeof subjects / sizeof subjects[0]; i++)
        decide_checked(p, &subjects[i]);
    orb_policy_free(p);
    free(text);
    return 0;
}
