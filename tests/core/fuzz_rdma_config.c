/* Fuzz target for the RDMA settings parser. Each input is a JSON document given to
 * orb_rdma_config_load_json(). Beyond memory safety it checks (abort on failure):
 *  - the only outcomes are success, ORB_ECONFIG with a message, or ORB_ENOMEM;
 *  - a refused document leaves every key as it was;
 *  - an accepted one reads back, key by key, as text that orb_rdma_config_set() accepts and
 *    that reads back unchanged (text and JSON agree on every value). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const keys[] = {
    "device", "port", "gid_index", "rdma_whitelist", "rdma_blacklist", "device_mask",
    "preferred_numa_node", "strict_local_numa", "priority_matrix", "custom_json_path",
    "smart_selection", "deadline_bw_arbitration", "log_slice_affinity",
    "priority_promotion_timeout", "priority_promotion_per_entry", "shared_quota_shm_path",
    "slot_rotation_interval", "host_memory", "cuda_memory", "gpu_direct_registration", "progress_mode", "num_lanes", "signal_interval",
    "max_rd_atomic", "max_dest_rd_atomic", "ack_timeout", "retry_count", "max_endpoints", "max_grants", "max_send_wr",
    "max_cqes", "max_direct_bytes", "max_staging_bytes", "max_cached_mrs",
    "max_cached_mr_bytes", "max_window_key_indices", "rail_error_threshold",
    "rail_error_window", "rail_cooldown", "rail_probe_interval", "max_rail_pairs",
};
#define NKEYS (sizeof keys / sizeof keys[0])
#define VALUE_MAX ((1u << 20) + 1)

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_rdma_config: invariant broken: %s (last error: %s)\n", what,
                orb_last_error());
        abort();
    }
}

/* Every key's text, concatenated with separators, into a new string. */
static char *snapshot(const orb_rdma_config *c, char *value)
{
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    check(out != NULL, "snapshot allocation");
    for (size_t k = 0; k < NKEYS; k++) {
        check(orb_rdma_config_get(c, keys[k], value, VALUE_MAX) == 0, "every key reads");
        size_t l = strlen(value);
        while (len + l + 2 > cap) {
            cap *= 2;
            out = realloc(out, cap);
            check(out != NULL, "snapshot allocation");
        }
        memcpy(out + len, value, l);
        len += l;
        out[len++] = '\n';
    }
    out[len] = '\0';
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size + 1);
    char *value = malloc(VALUE_MAX);
    check(json != NULL && value != NULL, "input allocation");
    memcpy(json, data, size);
    json[size] = '\0';
    orb_rdma_config *c = NULL;
    check(orb_rdma_config_new(&c) == 0, "a new configuration");
    char *before = snapshot(c, value);
    int rc = orb_rdma_config_load_json(c, json);
    check(rc == 0 || rc == ORB_ECONFIG || rc == ORB_ENOMEM, "outcome");
    char *after = snapshot(c, value);
    if (rc != 0) {
        check(orb_last_error()[0] != '\0', "a refusal names its cause");
        check(strcmp(before, after) == 0, "a refused document changes nothing");
    } else {
        orb_rdma_config *copy = NULL;
        check(orb_rdma_config_new(&copy) == 0, "a second configuration");
        for (size_t k = 0; k < NKEYS; k++) {
            check(orb_rdma_config_get(c, keys[k], value, VALUE_MAX) == 0, "read back");
            check(orb_rdma_config_set(copy, keys[k], value) == 0, "text form accepted");
        }
        char *again = snapshot(copy, value);
        check(strcmp(after, again) == 0, "text and JSON agree");
        free(again);
        orb_rdma_config_free(copy);
    }
    free(before);
    free(after);
    orb_rdma_config_free(c);
    free(value);
    free(json);
    return 0;
}
