/* RDMA settings: the public orb_rdma_config handle, its key table, text and JSON input. */
#include "rdma_config.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "error.h"

enum key_type {
    KEY_BOOL,      /* true | false */
    KEY_U32,       /* decimal, in [min, max] */
    KEY_U64,       /* decimal, in [min, max] */
    KEY_I32,       /* decimal, -1 or in [min, max] */
    KEY_MASK,      /* decimal or 0x-hex, non-zero */
    KEY_NAME,      /* one device name, or "" */
    KEY_NAMES,     /* device names separated by commas */
    KEY_TEXT,      /* any text up to max bytes; "" clears it */
    KEY_SHM_NAME,  /* "/name": one leading slash, no other */
    KEY_DURATION,  /* <digits><ns|us|ms|s>, in [min, max] nanoseconds */
    KEY_CHOICE     /* one of choices[] */
};

struct key_row {
    const char *name;
    enum key_type type;
    size_t offset;
    uint64_t min;
    uint64_t max;
    const char *const *choices; /* KEY_CHOICE: indexed by value, NULL-terminated */
};

static const char *const host_memory_choices[] = {"direct", "staged", NULL};
static const char *const progress_choices[] = {"polling", "event_driven", NULL};
static const char *const cuda_memory_choices[] = {"staged", "direct", NULL};
static const char *const gdr_choices[] = {"auto", "dmabuf", "peermem", NULL};

#define MS 1000000ull
#define SEC 1000000000ull
#define ROW(member, type, lo, hi) \
    { #member, type, offsetof(struct orb_rdma_config, member), (lo), (hi), NULL }
#define DURATION(key, member, lo, hi) \
    { key, KEY_DURATION, offsetof(struct orb_rdma_config, member), (lo), (hi), NULL }

/* Ranges beyond those the specification gives are sanity caps: a typo must not size a queue or
 * a budget in the billions. */
static const struct key_row rows[] = {
    ROW(device, KEY_NAME, 0, 0),
    ROW(port, KEY_U32, 0, 255),
    ROW(gid_index, KEY_I32, 0, 65535),
    { "rdma_whitelist", KEY_NAMES, offsetof(struct orb_rdma_config, whitelist), 0, 0, NULL },
    { "rdma_blacklist", KEY_NAMES, offsetof(struct orb_rdma_config, blacklist), 0, 0, NULL },
    ROW(device_mask, KEY_MASK, 1, UINT64_MAX),
    ROW(preferred_numa_node, KEY_I32, 0, 1023),
    ROW(strict_local_numa, KEY_BOOL, 0, 1),
    ROW(priority_matrix, KEY_TEXT, 0, ORB_RDMA_MATRIX_MAX),
    ROW(custom_json_path, KEY_TEXT, 0, ORB_RDMA_PATH_MAX - 1),
    ROW(smart_selection, KEY_BOOL, 0, 1),
    ROW(deadline_bw_arbitration, KEY_BOOL, 0, 1),
    ROW(log_slice_affinity, KEY_BOOL, 0, 1),
    DURATION("priority_promotion_timeout", priority_promotion_timeout_ns, 1000, 3600 * SEC),
    ROW(priority_promotion_per_entry, KEY_BOOL, 0, 1),
    ROW(shared_quota_shm_path, KEY_SHM_NAME, 0, 255),
    DURATION("slot_rotation_interval", slot_rotation_interval_ns, 1 * MS, 1 * SEC), /* the slot format's range */
    { "host_memory", KEY_CHOICE, offsetof(struct orb_rdma_config, host_memory), 0, 0,
      host_memory_choices },
    { "progress_mode", KEY_CHOICE, offsetof(struct orb_rdma_config, progress_mode), 0, 0,
      progress_choices },
    { "cuda_memory", KEY_CHOICE, offsetof(struct orb_rdma_config, cuda_memory), 0, 0, cuda_memory_choices },
    ROW(disable_gpu_direct_rdma, KEY_BOOL, 0, 1),
    ROW(gpu_source_reuse, KEY_BOOL, 0, 1),
    { "gpu_direct_registration", KEY_CHOICE, offsetof(struct orb_rdma_config, gpu_direct_registration), 0, 0,
      gdr_choices },
    ROW(num_lanes, KEY_U32, 1, 64),
    ROW(signal_interval, KEY_U32, 1, 65536),
    ROW(max_rd_atomic, KEY_U32, 0, 255),
    ROW(max_dest_rd_atomic, KEY_U32, 0, 255),
    ROW(ack_timeout, KEY_U32, 0, 31),
    ROW(retry_count, KEY_U32, 0, 7),
    ROW(read_replays, KEY_U32, 0, 8),
    ROW(max_endpoints, KEY_U32, 1, 1u << 20),
    ROW(max_grants, KEY_U32, 1, 1u << 20),
    ROW(max_send_wr, KEY_U32, 1, 1u << 16),
    ROW(max_cqes, KEY_U32, 16, 1u << 22),
    ROW(max_direct_bytes, KEY_U64, 4096, 1ull << 50),
    ROW(max_staging_bytes, KEY_U64, 4096, 1ull << 50),
    ROW(max_cached_mrs, KEY_U32, 1, 1u << 20),
    ROW(max_cached_mr_bytes, KEY_U64, 4096, 1ull << 50),
    ROW(max_window_key_indices, KEY_U32, 16, 1u << 24),
    ROW(rail_error_threshold, KEY_U32, 1, 8), /* the rail table keeps that many failure times */
    ROW(max_rail_pairs, KEY_U32, 1, 1u << 20),
    DURATION("rail_error_window", rail_error_window_ns, 1 * MS, 86400 * SEC),
    DURATION("rail_cooldown", rail_cooldown_ns, 1 * MS, 86400 * SEC),
    DURATION("rail_probe_interval", rail_probe_interval_ns, 0, 86400 * SEC),
};
#define ROW_COUNT (sizeof rows / sizeof rows[0])

static void set_defaults(struct orb_rdma_config *c)
{
    memset(c, 0, sizeof *c);
    c->gid_index = -1;
    c->device_mask = UINT64_MAX;
    c->preferred_numa_node = -1;
    c->smart_selection = true;
    c->priority_promotion_timeout_ns = 10 * MS;
    c->slot_rotation_interval_ns = 2 * MS;
    c->host_memory = ORB_RDMA_HOST_DIRECT;
    c->cuda_memory = ORB_RDMA_CUDA_STAGED;
    c->gpu_direct_registration = ORB_RDMA_GDR_AUTO;
    c->progress_mode = ORB_RDMA_PROGRESS_POLLING;
    c->num_lanes = 2;
    c->signal_interval = 1;
    c->max_rd_atomic = 16;
    c->max_dest_rd_atomic = 16;
    c->ack_timeout = 18; /* about 1.07 s */
    c->retry_count = 7;
    c->read_replays = 1;
    c->max_endpoints = 64;
    c->max_grants = 64;
    c->max_send_wr = 16;
    c->max_cqes = 1024;
    c->max_direct_bytes = 64ull << 20;
    c->max_staging_bytes = 64ull << 20;
    c->max_cached_mrs = 64;
    c->max_cached_mr_bytes = 64ull << 20;
    c->max_window_key_indices = 65536;
    c->rail_error_threshold = 3;
    c->rail_error_window_ns = 10 * SEC;
    c->rail_cooldown_ns = 30 * SEC;
    c->rail_probe_interval_ns = 1 * SEC;
    c->max_rail_pairs = 4096;
}

static const struct key_row *find_row(const char *key)
{
    for (size_t i = 0; i < ROW_COUNT; i++)
        if (strcmp(rows[i].name, key) == 0)
            return &rows[i];
    return NULL;
}

static void *field(struct orb_rdma_config *c, const struct key_row *r)
{
    return (char *)c + r->offset;
}

static const void *cfield(const struct orb_rdma_config *c, const struct key_row *r)
{
    return (const char *)c + r->offset;
}

/* ---- text parsing ------------------------------------------------------------------------ */

static int valid_name(const char *s, size_t len)
{
    if (len == 0 || len >= ORB_RDMA_NAME_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '-'))
            return 0;
    }
    return 1;
}

/* Digits only, no sign, no blanks, no overflow. */
static int parse_u64(const char *s, int base, uint64_t *out)
{
    if (*s == '\0')
        return -1;
    for (const char *p = s; *p; p++) {
        int hex = (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F');
        if (!(*p >= '0' && *p <= '9') && !(base == 16 && hex))
            return -1;
    }
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, base);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int parse_duration(const char *s, uint64_t *out_ns)
{
    size_t digits = strspn(s, "0123456789");
    if (digits == 0 || digits > 20)
        return -1;
    char num[21];
    memcpy(num, s, digits);
    num[digits] = '\0';
    uint64_t v;
    if (parse_u64(num, 10, &v) != 0)
        return -1;
    const char *unit = s + digits;
    uint64_t scale;
    if (strcmp(unit, "ns") == 0)
        scale = 1;
    else if (strcmp(unit, "us") == 0)
        scale = 1000;
    else if (strcmp(unit, "ms") == 0)
        scale = MS;
    else if (strcmp(unit, "s") == 0)
        scale = SEC;
    else
        return -1;
    if (v > UINT64_MAX / scale)
        return -1;
    *out_ns = v * scale;
    return 0;
}

static int range_fail(const struct key_row *r, const char *value)
{
    if (r->type == KEY_DURATION)
        return orb_fail(ORB_ECONFIG, "rdma key '%s': '%s' is not a duration from %lluns to %llus "
                        "(write it as digits and a unit: ns, us, ms or s)", r->name, value,
                        (unsigned long long)r->min, (unsigned long long)(r->max / SEC));
    if (r->type == KEY_I32)
        return orb_fail(ORB_ECONFIG, "rdma key '%s': '%s' is not -1 or an integer in %llu..%llu",
                        r->name, value, (unsigned long long)r->min, (unsigned long long)r->max);
    return orb_fail(ORB_ECONFIG, "rdma key '%s': '%s' is not an integer in %llu..%llu", r->name,
                    value, (unsigned long long)r->min, (unsigned long long)r->max);
}

static int parse_names(const struct key_row *r, const char *value, struct orb_rdma_names *out)
{
    struct orb_rdma_names names;
    names.count = 0;
    const char *p = value;
    while (*p != '\0') {
        size_t len = strcspn(p, ",");
        if (!valid_name(p, len))
            return orb_fail(ORB_ECONFIG, "rdma key '%s': '%.*s' is not a device name "
                            "([A-Za-z0-9_.-], 1..%d characters)", r->name, (int)(len < 80 ? len : 80),
                            p, ORB_RDMA_NAME_MAX - 1);
        if (names.count >= ORB_RDMA_NAMES_MAX)
            return orb_fail(ORB_ECONFIG, "rdma key '%s': more than %d names", r->name,
                            ORB_RDMA_NAMES_MAX);
        memset(names.name[names.count], 0, ORB_RDMA_NAME_MAX);
        memcpy(names.name[names.count], p, len);
        names.count++;
        p += len;
        if (*p == ',') {
            p++;
            if (*p == '\0')
                return orb_fail(ORB_ECONFIG, "rdma key '%s': a trailing comma", r->name);
        }
    }
    *out = names;
    return 0;
}

/* Apply `value` to `c` for row `r`; `c` is a scratch copy, so a failure may leave it half done
 * only in the field being set, which the caller discards. */
static int apply_text(struct orb_rdma_config *c, const struct key_row *r, const char *value)
{
    void *f = field(c, r);
    uint64_t v;
    switch (r->type) {
    case KEY_BOOL:
        if (strcmp(value, "true") == 0)
            *(bool *)f = true;
        else if (strcmp(value, "false") == 0)
            *(bool *)f = false;
        else
            return orb_fail(ORB_ECONFIG, "rdma key '%s': '%s' is not true or false", r->name, value);
        return 0;
    case KEY_U32:
    case KEY_U64:
        if (parse_u64(value, 10, &v) != 0 || v < r->min || v > r->max)
            return range_fail(r, value);
        if (r->type == KEY_U32)
            *(uint32_t *)f = (uint32_t)v;
        else
            *(uint64_t *)f = v;
        return 0;
    case KEY_I32:
        if (strcmp(value, "-1") == 0) {
            *(int32_t *)f = -1;
            return 0;
        }
        if (parse_u64(value, 10, &v) != 0 || v < r->min || v > r->max)
            return range_fail(r, value);
        *(int32_t *)f = (int32_t)v;
        return 0;
    case KEY_MASK: {
        int hex = value[0] == '0' && (value[1] == 'x' || value[1] == 'X');
        if (parse_u64(hex ? value + 2 : value, hex ? 16 : 10, &v) != 0 || v == 0)
            return orb_fail(ORB_ECONFIG, "rdma key '%s': '%s' is not a non-zero mask (decimal or "
                            "0x-hex; bit i keeps NIC id i)", r->name, value);
        *(uint64_t *)f = v;
        return 0;
    }
    case KEY_NAME: {
        size_t len = strlen(value);
        if (len != 0 && !valid_name(value, len))
            return orb_fail(ORB_ECONFIG, "rdma key '%s': '%s' is not a device name "
                            "([A-Za-z0-9_.-], 1..%d characters)", r->name, value,
                            ORB_RDMA_NAME_MAX - 1);
        memset(f, 0, ORB_RDMA_NAME_MAX);
        memcpy(f, value, len);
        return 0;
    }
    case KEY_NAMES:
        return parse_names(r, value, f);
    case KEY_SHM_NAME:
    case KEY_TEXT: {
        size_t len = strlen(value);
        if (len > r->max)
            return orb_fail(ORB_ECONFIG, "rdma key '%s': longer than %llu bytes", r->name,
                            (unsigned long long)r->max);
        if (r->type == KEY_SHM_NAME && len > 0 &&
            (value[0] != '/' || len < 2 || strchr(value + 1, '/') != NULL ||
             strcmp(value, "/.") == 0 || strcmp(value, "/..") == 0))
            return orb_fail(ORB_ECONFIG, "rdma key '%s': '%s' is not a shared-memory name (one "
                            "leading '/', no other)", r->name, value);
        char *copy = NULL;
        if (len > 0) {
            copy = strdup(value);
            if (copy == NULL)
                return orb_fail(ORB_ENOMEM, "rdma key '%s': no memory for %zu bytes", r->name, len);
        }
        free(*(char **)f);
        *(char **)f = copy;
        return 0;
    }
    case KEY_DURATION:
        if (parse_duration(value, &v) != 0 || v < r->min || v > r->max)
            return range_fail(r, value);
        *(uint64_t *)f = v;
        return 0;
    case KEY_CHOICE:
        for (uint32_t k = 0; r->choices[k] != NULL; k++) {
            if (strcmp(value, r->choices[k]) == 0) {
                *(uint32_t *)f = k;
                return 0;
            }
        }
        return orb_fail(ORB_ECONFIG, "rdma key '%s': '%s' is not one of %s%s%s", r->name, value,
                        r->choices[0], r->choices[1] ? ", " : "", r->choices[1] ? r->choices[1] : "");
    }
    return orb_fail(ORB_ECONFIG, "rdma key '%s': unsupported type", r->name);
}

/* ---- the handle -------------------------------------------------------------------------- */

static void free_strings(struct orb_rdma_config *c)
{
    free(c->priority_matrix);
    free(c->custom_json_path);
    free(c->shared_quota_shm_path);
    c->priority_matrix = c->custom_json_path = c->shared_quota_shm_path = NULL;
}

ORB_EXPORT int orb_rdma_config_new(orb_rdma_config **out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "orb_rdma_config_new: out is NULL");
    struct orb_rdma_config *c = malloc(sizeof *c);
    if (c == NULL)
        return orb_fail(ORB_ENOMEM, "cannot allocate an RDMA configuration");
    set_defaults(c);
    *out = c;
    return 0;
}

ORB_EXPORT void orb_rdma_config_free(orb_rdma_config *cfg)
{
    if (cfg == NULL)
        return;
    free_strings(cfg);
    free(cfg);
}

int orb_rdma_config_dup(const struct orb_rdma_config *src, struct orb_rdma_config **out)
{
    if (src == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "RDMA configuration copy: NULL argument");
    struct orb_rdma_config *c = malloc(sizeof *c);
    if (c == NULL)
        return orb_fail(ORB_ENOMEM, "cannot copy an RDMA configuration");
    *c = *src;
    c->priority_matrix = c->custom_json_path = c->shared_quota_shm_path = NULL;
    const char *const from[3] = {src->priority_matrix, src->custom_json_path,
                                 src->shared_quota_shm_path};
    char **to[3] = {&c->priority_matrix, &c->custom_json_path, &c->shared_quota_shm_path};
    for (int i = 0; i < 3; i++) {
        if (from[i] != NULL && (*to[i] = strdup(from[i])) == NULL) {
            orb_rdma_config_free(c);
            return orb_fail(ORB_ENOMEM, "cannot copy an RDMA configuration");
        }
    }
    *out = c;
    return 0;
}

static int unknown_key(const char *key)
{
    return orb_fail(ORB_ECONFIG, "rdma key '%s': unknown key", key);
}

/* Apply row `r` to a scratch copy of `cfg` and keep it only on success. */
static int set_one(orb_rdma_config *cfg, const struct key_row *r, const char *value)
{
    struct orb_rdma_config next = *cfg;
    /* The scratch copy shares cfg's strings until the row replaces its own. */
    char *old = (r->type == KEY_TEXT || r->type == KEY_SHM_NAME) ? *(char **)field(cfg, r) : NULL;
    if (old != NULL)
        *(char **)field(&next, r) = NULL;
    int rc = apply_text(&next, r, value);
    if (rc != 0)
        return rc;
    free(old);
    *cfg = next;
    return 0;
}

ORB_EXPORT int orb_rdma_config_set(orb_rdma_config *cfg, const char *key, const char *value)
{
    if (cfg == NULL || key == NULL || value == NULL)
        return orb_fail(ORB_EINVAL, "orb_rdma_config_set: NULL argument");
    const struct key_row *r = find_row(key);
    return r != NULL ? set_one(cfg, r, value) : unknown_key(key);
}

static int put(char *buf, size_t len, const char *key, const char *text)
{
    size_t need = strlen(text) + 1;
    if (need > len)
        return orb_fail(ORB_EINVAL, "orb_rdma_config_get: '%s' needs %zu bytes, the buffer has %zu",
                        key, need, len);
    memcpy(buf, text, need);
    return 0;
}

static void format_duration(uint64_t ns, char *out, size_t len)
{
    if (ns != 0 && ns % SEC == 0)
        snprintf(out, len, "%llus", (unsigned long long)(ns / SEC));
    else if (ns != 0 && ns % MS == 0)
        snprintf(out, len, "%llums", (unsigned long long)(ns / MS));
    else if (ns != 0 && ns % 1000 == 0)
        snprintf(out, len, "%lluus", (unsigned long long)(ns / 1000));
    else
        snprintf(out, len, "%lluns", (unsigned long long)ns);
}

ORB_EXPORT int orb_rdma_config_get(const orb_rdma_config *cfg, const char *key, char *buf,
                                   size_t len)
{
    if (cfg == NULL || key == NULL || buf == NULL)
        return orb_fail(ORB_EINVAL, "orb_rdma_config_get: NULL argument");
    const struct key_row *r = find_row(key);
    if (r == NULL)
        return unknown_key(key);
    const void *f = cfield(cfg, r);
    char small[64];
    switch (r->type) {
    case KEY_BOOL: return put(buf, len, key, *(const bool *)f ? "true" : "false");
    case KEY_U32: snprintf(small, sizeof small, "%u", *(const uint32_t *)f); break;
    case KEY_U64: snprintf(small, sizeof small, "%llu", (unsigned long long)*(const uint64_t *)f); break;
    case KEY_I32: snprintf(small, sizeof small, "%d", *(const int32_t *)f); break;
    case KEY_MASK: snprintf(small, sizeof small, "0x%llx", (unsigned long long)*(const uint64_t *)f); break;
    case KEY_NAME: return put(buf, len, key, (const char *)f);
    case KEY_TEXT:
    case KEY_SHM_NAME: {
        const char *s = *(char *const *)f;
        return put(buf, len, key, s != NULL ? s : "");
    }
    case KEY_DURATION: format_duration(*(const uint64_t *)f, small, sizeof small); break;
    case KEY_CHOICE: return put(buf, len, key, r->choices[*(const uint32_t *)f]);
    case KEY_NAMES: {
        const struct orb_rdma_names *n = f;
        size_t need = 1;
        for (uint32_t k = 0; k < n->count; k++)
            need += strlen(n->name[k]) + (k > 0);
        if (need > len)
            return orb_fail(ORB_EINVAL, "orb_rdma_config_get: '%s' needs %zu bytes, the buffer "
                            "has %zu", key, need, len);
        size_t w = 0;
        for (uint32_t k = 0; k < n->count; k++) {
            if (k > 0)
                buf[w++] = ',';
            size_t l = strlen(n->name[k]);
            memcpy(buf + w, n->name[k], l);
            w += l;
        }
        buf[w] = '\0';
        return 0;
    }
    }
    return put(buf, len, key, small);
}

/* ---- JSON ------------------------------------------------------------------------------- */

/* The JSON kind each type takes: booleans for switches, integers for numbers (a mask may also
 * be a "0x..." string), strings for names, text, durations and choices, an array of strings
 * for name lists, null to clear text. */
static int json_to_text(const struct key_row *r, json_t *v, char **out)
{
    char num[32];
    const char *text = NULL;
    switch (r->type) {
    case KEY_BOOL:
        if (!json_is_boolean(v))
            return orb_fail(ORB_ECONFIG, "rdma key '%s': must be true or false", r->name);
        text = json_is_true(v) ? "true" : "false";
        break;
    case KEY_U32:
    case KEY_U64:
    case KEY_I32:
    case KEY_MASK:
        if (json_is_integer(v)) {
            json_int_t i = json_integer_value(v);
            snprintf(num, sizeof num, "%lld", (long long)i);
            text = num;
        } else if (r->type == KEY_MASK && json_is_string(v)) {
            text = json_string_value(v);
        } else {
            return orb_fail(ORB_ECONFIG, "rdma key '%s': must be an integer", r->name);
        }
        break;
    case KEY_TEXT:
    case KEY_SHM_NAME:
        if (json_is_null(v)) {
            text = "";
            break;
        }
        /* fall through */
    case KEY_NAME:
    case KEY_DURATION:
    case KEY_CHOICE:
        if (!json_is_string(v))
            return orb_fail(ORB_ECONFIG, "rdma key '%s': must be a string", r->name);
        text = json_string_value(v);
        if (strlen(text) != json_string_length(v))
            return orb_fail(ORB_ECONFIG, "rdma key '%s': contains a NUL character", r->name);
        break;
    case KEY_NAMES: {
        if (!json_is_array(v))
            return orb_fail(ORB_ECONFIG, "rdma key '%s': must be an array of device names", r->name);
        size_t n = json_array_size(v);
        if (n > ORB_RDMA_NAMES_MAX)
            return orb_fail(ORB_ECONFIG, "rdma key '%s': more than %d names", r->name,
                            ORB_RDMA_NAMES_MAX);
        char *joined = calloc(1, n * ORB_RDMA_NAME_MAX + 1);
        if (joined == NULL)
            return orb_fail(ORB_ENOMEM, "rdma key '%s': no memory", r->name);
        size_t w = 0;
        for (size_t k = 0; k < n; k++) {
            json_t *e = json_array_get(v, k);
            const char *s = json_is_string(e) ? json_string_value(e) : NULL;
            size_t l = s != NULL ? json_string_length(e) : 0;
            /* Checked here so that a comma inside a name cannot split it into two. */
            if (s == NULL || strlen(s) != l || !valid_name(s, l)) {
                free(joined);
                return orb_fail(ORB_ECONFIG, "rdma key '%s': entry %zu is not a device name "
                                "([A-Za-z0-9_.-], 1..%d characters)", r->name, k,
                                ORB_RDMA_NAME_MAX - 1);
            }
            if (k > 0)
                joined[w++] = ',';
            memcpy(joined + w, s, l);
            w += l;
        }
        *out = joined;
        return 0;
    }
    }
    *out = strdup(text);
    if (*out == NULL)
        return orb_fail(ORB_ENOMEM, "rdma key '%s': no memory", r->name);
    return 0;
}

/* The largest JSON text accepted: a priority matrix of up to 1 MiB plus the other keys. */
#define RDMA_JSON_MAX (ORB_RDMA_MATRIX_MAX + 65536u)

ORB_EXPORT int orb_rdma_config_load_json(orb_rdma_config *cfg, const char *json)
{
    if (cfg == NULL || json == NULL)
        return orb_fail(ORB_EINVAL, "orb_rdma_config_load_json: NULL argument");
    json_t *root;
    int rc = orb_json_load_object(json, RDMA_JSON_MAX, "rdma JSON", &root);
    if (rc != 0)
        return rc;
    struct orb_rdma_config *next = NULL;
    /* An engine document ({"tcp_stripes": 2, "rdma": {...}}) or the RDMA object itself. */
    json_t *obj = json_object_get(root, "rdma");
    if (obj != NULL && !json_is_object(obj)) {
        rc = orb_fail(ORB_ECONFIG, "rdma JSON: \"rdma\" must be an object");
        goto free_root;
    }
    if (obj == NULL)
        obj = root;
    /* A copy, so that a failure leaves `cfg` untouched. */
    rc = orb_rdma_config_dup(cfg, &next);
    if (rc != 0)
        goto free_root;
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value) {
        char *text = NULL;
        const struct key_row *r = find_row(key);
        if (r == NULL) {
            rc = unknown_key(key);
            goto free_next;
        }
        rc = json_to_text(r, value, &text);
        if (rc == 0)
            rc = set_one(next, r, text);
        free(text);
        if (rc != 0)
            goto free_next;
    }
    rc = orb_rdma_config_check(next);
    if (rc != 0)
        goto free_next;
    free_strings(cfg);
    *cfg = *next;
    free(next); /* its strings now belong to cfg */
    next = NULL;

free_next:
    orb_rdma_config_free(next);
free_root:
    json_decref(root);
    return rc;
}

static int names_contain(const struct orb_rdma_names *n, const char *name)
{
    for (uint32_t k = 0; k < n->count; k++)
        if (strcmp(n->name[k], name) == 0)
            return 1;
    return 0;
}

int orb_rdma_config_check(const struct orb_rdma_config *c)
{
    if (c == NULL)
        return orb_fail(ORB_EINVAL, "RDMA configuration is NULL");
    /* A pinned device that the filters remove could never be used: say so now. */
    if (c->device[0] != '\0') {
        if (c->whitelist.count > 0 && !names_contain(&c->whitelist, c->device))
            return orb_fail(ORB_ECONFIG, "rdma keys 'device' and 'rdma_whitelist': the pinned "
                            "device %s is not in the whitelist", c->device);
        if (c->whitelist.count == 0 && names_contain(&c->blacklist, c->device))
            return orb_fail(ORB_ECONFIG, "rdma keys 'device' and 'rdma_blacklist': the pinned "
                            "device %s is blacklisted", c->device);
    }
    if (c->priority_matrix != NULL && c->custom_json_path != NULL)
        return orb_fail(ORB_ECONFIG, "rdma keys 'priority_matrix' and 'custom_json_path': give "
                        "one topology, not both");
    return 0;
}
