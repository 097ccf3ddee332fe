/* Engine configuration: defaults, range checks, JSON loading and endpoint parsing. */
#include "config.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <limits.h>
#include <net/if.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/ascii.h"
#include "error.h"

/* A JSON configuration is a handful of keys; anything this large is not one. */
#define CONFIG_JSON_MAX (1u << 20)

enum field_type { FIELD_ENDPOINT, FIELD_SWITCH, FIELD_U32, FIELD_U64, FIELD_HELPER_MODE };

/* One configurable field: its JSON key, where it lives and its inclusive range. */
struct config_field {
    const char *name;
    enum field_type type;
    size_t offset;
    uint64_t min;
    uint64_t max;
};

#define FIELD(member, kind, lo, hi) \
    { #member, kind, offsetof(struct orb_engine_config, member), (lo), (hi) }

/* The ranges beyond those documented on struct orb_engine_config are sanity caps: they keep a
 * typo from sizing a table or a socket buffer in the billions. */
static const struct config_field config_fields[] = {
    FIELD(endpoint, FIELD_ENDPOINT, 0, 0),
    FIELD(enable_source, FIELD_SWITCH, 0, 1),
    FIELD(enable_shm, FIELD_SWITCH, 0, 1),
    FIELD(tcp_stripes, FIELD_U32, 1, 16),
    FIELD(tcp_workers, FIELD_U32, 1, 16),
    FIELD(tcp_stripe_threshold, FIELD_U64, 4096, UINT64_MAX),
    FIELD(tcp_socket_buffer, FIELD_U32, 0, 1u << 30),
    FIELD(busy_poll_us, FIELD_U32, 0, 10000),
    FIELD(io_timeout_s, FIELD_U32, 1, 86400),
    FIELD(max_batches, FIELD_U32, 1, 1u << 20),
    FIELD(max_batch_requests, FIELD_U32, 1, 1u << 24),
    FIELD(max_registrations, FIELD_U32, 1, 1u << 24),
    FIELD(max_connections, FIELD_U32, 1, 65536),
    FIELD(max_notifications, FIELD_U32, 1, 1u << 20),
    FIELD(hello_timeout_ms, FIELD_U32, 1, 3600000),
    FIELD(max_unauthenticated, FIELD_U32, 1, 65536),
    FIELD(tcp_local_stripes, FIELD_U32, 0, 16),
    /* The one key that differs from its field's name: JSON says "helper": "auto". */
    { "helper", FIELD_HELPER_MODE, offsetof(struct orb_engine_config, helper_mode), 0, 0 },
};

/* The JSON spellings of enum orb_helper_mode, indexed by value. */
static const char *const helper_mode_names[] = {
    [ORB_HELPER_AUTO] = "auto",
    [ORB_HELPER_REQUIRED] = "required",
    [ORB_HELPER_OFF] = "off",
};

#define HELPER_MODE_COUNT (sizeof helper_mode_names / sizeof helper_mode_names[0])

#define CONFIG_FIELD_COUNT (sizeof config_fields / sizeof config_fields[0])

static uint64_t field_get(const struct orb_engine_config *cfg, const struct config_field *f)
{
    const char *p = (const char *)cfg + f->offset;
    switch (f->type) {
    case FIELD_SWITCH: {
        int v;
        memcpy(&v, p, sizeof v);
        return (uint64_t)(int64_t)v;
    }
    case FIELD_U32: {
        uint32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case FIELD_U64: {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    default: return 0;
    }
}

static void field_set(struct orb_engine_config *cfg, const struct config_field *f, uint64_t value)
{
    char *p = (char *)cfg + f->offset;
    switch (f->type) {
    case FIELD_SWITCH: {
        int v = value != 0;
        memcpy(p, &v, sizeof v);
        break;
    }
    case FIELD_U32: {
        uint32_t v = (uint32_t)value;
        memcpy(p, &v, sizeof v);
        break;
    }
    case FIELD_U64: memcpy(p, &value, sizeof value); break;
    default: break;
    }
}

ORB_EXPORT int orb_engine_config_init(struct orb_engine_config *cfg)
{
    if (cfg == NULL)
        return orb_fail(ORB_EINVAL, "config init: cfg is NULL");
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->endpoint, sizeof cfg->endpoint, "%s", "127.0.0.1:0");
    cfg->enable_source = 1;
    cfg->enable_shm = 1;
    cfg->tcp_stripes = 2;
    cfg->tcp_workers = 2;
    cfg->tcp_stripe_threshold = 1u << 20;
    cfg->tcp_socket_buffer = 0;
    cfg->busy_poll_us = 200;
    cfg->io_timeout_s = 30;
    cfg->max_batches = 1024;
    cfg->max_batch_requests = 65536;
    cfg->max_registrations = 65536;
    cfg->max_connections = 256;
    cfg->max_notifications = 1024;
    cfg->helper_mode = ORB_HELPER_AUTO;
    cfg->hello_timeout_ms = 5000;
    cfg->max_unauthenticated = 32;
    cfg->tcp_local_stripes = 0; /* automatic */
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Endpoints                                                                 */
/* ------------------------------------------------------------------------ */

static int is_alnum(char c)
{
    return orb_ascii_is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* A DNS name: dot-separated labels of letters, digits and inner hyphens. */
static int valid_hostname(const char *s, size_t len)
{
    if (len == 0 || len > 253)
        return 0;
    size_t label = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '.') {
            if (label == 0 || s[i - 1] == '-')
                return 0;
            label = 0;
            continue;
        }
        if (!is_alnum(c) && c != '-')
            return 0;
        if (c == '-' && label == 0)
            return 0;
        if (++label > 63)
            return 0;
    }
    return label > 0 && s[len - 1] != '-';
}

/* Check the host part (brackets already removed when `bracketed`). */
static int check_host(const char *host, size_t len, int bracketed, const char *endpoint)
{
    char buf[ORB_ENDPOINT_MAX];
    if (len == 0)
        return orb_fail(ORB_ECONFIG, "endpoint '%s': empty host", endpoint);
    memcpy(buf, host, len); /* len < ORB_ENDPOINT_MAX: the endpoint was length-checked */
    buf[len] = '\0';

    if (bracketed) {
        /* An IPv6 literal, optionally with a zone ("fe80::1%eth0"). */
        char *zone = strchr(buf, '%');
        if (zone != NULL) {
            *zone++ = '\0';
            size_t zlen = strlen(zone);
            if (zlen == 0 || zlen >= IF_NAMESIZE)
                return orb_fail(ORB_ECONFIG, "endpoint '%s': bad IPv6 zone", endpoint);
            for (size_t i = 0; i < zlen; i++)
                if (!is_alnum(zone[i]) && zone[i] != '.' && zone[i] != '_' && zone[i] != '-')
                    return orb_fail(ORB_ECONFIG, "endpoint '%s': bad IPv6 zone", endpoint);
        }
        struct in6_addr a6;
        if (inet_pton(AF_INET6, buf, &a6) != 1)
            return orb_fail(ORB_ECONFIG, "endpoint '%s': '%s' is not an IPv6 address", endpoint, buf);
        return 0;
    }

    int numeric = 1;
    for (size_t i = 0; i < len; i++)
        if (!orb_ascii_is_digit(buf[i]) && buf[i] != '.')
            numeric = 0;
    if (numeric) {
        struct in_addr a4;
        if (inet_pton(AF_INET, buf, &a4) != 1)
            return orb_fail(ORB_ECONFIG, "endpoint '%s': '%s' is not an IPv4 address", endpoint, buf);
        return 0;
    }
    if (!valid_hostname(buf, len))
        return orb_fail(ORB_ECONFIG, "endpoint '%s': '%s' is not a valid host name", endpoint, buf);
    return 0;
}

int orb_endpoint_split(const char *endpoint, char *host, size_t host_cap, uint16_t *port)
{
    if (endpoint == NULL)
        return orb_fail(ORB_EINVAL, "endpoint is NULL");
    size_t len = strnlen(endpoint, ORB_ENDPOINT_MAX);
    if (len >= ORB_ENDPOINT_MAX)
        return orb_fail(ORB_ECONFIG, "endpoint is longer than %d characters", ORB_ENDPOINT_MAX - 1);
    if (len == 0)
        return orb_fail(ORB_ECONFIG, "endpoint is empty");

    const char *host_start, *host_end, *colon;
    int bracketed = endpoint[0] == '[';
    if (bracketed) {
        host_start = endpoint + 1;
        host_end = strchr(host_start, ']');
        if (host_end == NULL)
            return orb_fail(ORB_ECONFIG, "endpoint '%s': missing ']'", endpoint);
        colon = host_end + 1;
        if (*colon != ':')
            return orb_fail(ORB_ECONFIG, "endpoint '%s': expected ':port' after ']'", endpoint);
    } else {
        host_start = endpoint;
        colon = strrchr(endpoint, ':');
        if (colon == NULL)
            return orb_fail(ORB_ECONFIG, "endpoint '%s': missing ':port'", endpoint);
        host_end = colon;
        if (memchr(host_start, ':', (size_t)(host_end - host_start)) != NULL)
            return orb_fail(ORB_ECONFIG, "endpoint '%s': an IPv6 host must be in brackets", endpoint);
        if (memchr(host_start, '[', (size_t)(host_end - host_start)) != NULL ||
            memchr(host_start, ']', (size_t)(host_end - host_start)) != NULL)
            return orb_fail(ORB_ECONFIG, "endpoint '%s': misplaced bracket", endpoint);
    }

    const char *port_text = colon + 1;
    size_t port_len = strlen(port_text);
    if (port_len == 0 || port_len > 5)
        return orb_fail(ORB_ECONFIG, "endpoint '%s': port must be 1 to 5 digits", endpoint);
    uint32_t port_value = 0;
    for (size_t i = 0; i < port_len; i++) {
        if (!orb_ascii_is_digit(port_text[i]))
            return orb_fail(ORB_ECONFIG, "endpoint '%s': port is not a decimal number", endpoint);
        port_value = port_value * 10 + (uint32_t)(port_text[i] - '0');
    }
    if (port_value > 65535)
        return orb_fail(ORB_ECONFIG, "endpoint '%s': port %u is above 65535", endpoint, port_value);

    size_t host_len = (size_t)(host_end - host_start);
    int rc = check_host(host_start, host_len, bracketed, endpoint);
    if (rc != 0)
        return rc;

    if (host != NULL) {
        if (host_len >= host_cap)
            return orb_fail(ORB_EINVAL, "endpoint '%s': host does not fit in %zu bytes", endpoint,
                            host_cap);
        memcpy(host, host_start, host_len);
        host[host_len] = '\0';
    }
    if (port != NULL)
        *port = (uint16_t)port_value;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

static int check_endpoint_field(const char *endpoint, const char *source)
{
    int rc = orb_endpoint_split(endpoint, NULL, 0, NULL);
    if (rc != 0)
        return orb_fail_wrap(ORB_ECONFIG, "config %s 'endpoint'", source);
    return 0;
}

static int check_range(const struct config_field *f, uint64_t value, const char *source)
{
    if (value >= f->min && value <= f->max)
        return 0;
    if (f->max == UINT64_MAX)
        return orb_fail(ORB_ECONFIG, "config %s '%s': %llu is below the minimum %llu", source,
                        f->name, (unsigned long long)value, (unsigned long long)f->min);
    return orb_fail(ORB_ECONFIG, "config %s '%s': %llu is out of range %llu..%llu", source, f->name,
                    (unsigned long long)value, (unsigned long long)f->min,
                    (unsigned long long)f->max);
}

int orb_engine_config_validate(const struct orb_engine_config *cfg)
{
    if (cfg == NULL)
        return orb_fail(ORB_EINVAL, "config: cfg is NULL");
    for (size_t i = 0; i < CONFIG_FIELD_COUNT; i++) {
        const struct config_field *f = &config_fields[i];
        int rc;
        if (f->type == FIELD_ENDPOINT) {
            if (memchr(cfg->endpoint, '\0', sizeof cfg->endpoint) == NULL)
                return orb_fail(ORB_ECONFIG, "config field 'endpoint': not NUL-terminated");
            rc = check_endpoint_field(cfg->endpoint, "field");
        } else if (f->type == FIELD_SWITCH) {
            int64_t v = (int64_t)field_get(cfg, f);
            if (v != 0 && v != 1)
                return orb_fail(ORB_ECONFIG, "config field '%s': %lld is not 0 or 1", f->name, (long long)v);
            rc = 0;
        } else if (f->type == FIELD_HELPER_MODE) {
            if (cfg->helper_mode >= HELPER_MODE_COUNT)
                return orb_fail(ORB_ECONFIG,
                                "config field 'helper_mode': %u is not an orb_helper_mode "
                                "(0 auto, 1 required, 2 off)", (unsigned)cfg->helper_mode);
            rc = 0;
        } else {
            rc = check_range(f, field_get(cfg, f), "field");
        }
        if (rc != 0)
            return rc;
    }
    if (cfg->reserved32 != 0)
        return orb_fail(ORB_ECONFIG, "config field 'reserved32': must be zero");
    for (size_t i = 0; i < sizeof cfg->reserved / sizeof cfg->reserved[0]; i++)
        if (cfg->reserved[i] != 0)
            return orb_fail(ORB_ECONFIG, "config field 'reserved[%zu]': must be zero", i);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* JSON                                                                      */
/* ------------------------------------------------------------------------ */

static const struct config_field *find_field(const char *name)
{
    for (size_t i = 0; i < CONFIG_FIELD_COUNT; i++)
        if (strcmp(config_fields[i].name, name) == 0)
            return &config_fields[i];
    return NULL;
}

static int apply_key(struct orb_engine_config *cfg, const char *key, json_t *value)
{
    /* The RDMA transport's keys live in their own object, read by orb_rdma_config_load_json()
     * from the same document. */
    if (strcmp(key, "rdma") == 0) {
        if (!json_is_object(value))
            return orb_fail(ORB_ECONFIG, "config key 'rdma': must be an object of RDMA keys");
        return 0;
    }
    const struct config_field *f = find_field(key);
    if (f == NULL)
        return orb_fail(ORB_ECONFIG, "config key '%s': unknown key", key);

    switch (f->type) {
    case FIELD_ENDPOINT: {
        if (!json_is_string(value))
            return orb_fail(ORB_ECONFIG, "config key '%s': must be a string", key);
        size_t len = json_string_length(value);
        if (len >= ORB_ENDPOINT_MAX)
            return orb_fail(ORB_ECONFIG, "config key '%s': longer than %d characters", key,
                            ORB_ENDPOINT_MAX - 1);
        const char *text = json_string_value(value);
        if (strlen(text) != len)
            return orb_fail(ORB_ECONFIG, "config key '%s': contains a NUL character", key);
        int rc = check_endpoint_field(text, "key");
        if (rc != 0)
            return rc;
        memset(cfg->endpoint, 0, sizeof cfg->endpoint);
        memcpy(cfg->endpoint, text, len);
        return 0;
    }
    case FIELD_HELPER_MODE: {
        const char *text = json_is_string(value) ? json_string_value(value) : NULL;
        for (size_t m = 0; text != NULL && m < HELPER_MODE_COUNT; m++) {
            /* strcmp stops at an embedded NUL, so the length must match too. */
            if (json_string_length(value) == strlen(helper_mode_names[m]) &&
                strcmp(text, helper_mode_names[m]) == 0) {
                cfg->helper_mode = (uint32_t)m;
                return 0;
            }
        }
        return orb_fail(ORB_ECONFIG, "config key '%s': must be \"auto\", \"required\" or \"off\"",
                        key);
    }
    case FIELD_SWITCH:
        if (!json_is_boolean(value))
            return orb_fail(ORB_ECONFIG, "config key '%s': must be true or false", key);
        field_set(cfg, f, json_is_true(value) ? 1 : 0);
        return 0;
    case FIELD_U32:
    case FIELD_U64: {
        if (!json_is_integer(value))
            return orb_fail(ORB_ECONFIG, "config key '%s': must be an integer", key);
        json_int_t v = json_integer_value(value);
        if (v < 0)
            return orb_fail(ORB_ECONFIG, "config key '%s': %lld is negative", key, (long long)v);
        int rc = check_range(f, (uint64_t)v, "key");
        if (rc != 0)
            return rc;
        field_set(cfg, f, (uint64_t)v);
        return 0;
    }
    }
    return orb_fail(ORB_ECONFIG, "config key '%s': unsupported field type", key);
}

int orb_json_load_object(const char *json, size_t max, const char *what, json_t **out)
{
    size_t len = strnlen(json, max + 1);
    if (len > max)
        return orb_fail(ORB_ECONFIG, "%s: larger than %zu bytes", what, max);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return orb_fail(ORB_ECONFIG, "%s: %s (line %d, column %d)%s", what, jerr.text, jerr.line, jerr.column,
                        strstr(jerr.text, "too big integer") != NULL
                            ? ": JSON integers stop at 9223372036854775807 here (a mask may be a \"0x...\" "
                              "string; an engine setting beyond it, set in the struct)"
                            : "");
    if (!json_is_object(root)) {
        json_decref(root);
        return orb_fail(ORB_ECONFIG, "%s: the top level must be an object", what);
    }
    *out = root;
    return 0;
}

ORB_EXPORT int orb_engine_config_load_json(struct orb_engine_config *cfg, const char *json)
{
    if (cfg == NULL || json == NULL)
        return orb_fail(ORB_EINVAL, "config load: NULL argument");
    json_t *root;
    int rc = orb_json_load_object(json, CONFIG_JSON_MAX, "config JSON", &root);
    if (rc != 0)
        return rc;

    /* Work on a copy so that a failure leaves `cfg` untouched. */
    struct orb_engine_config next = *cfg;
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        rc = apply_key(&next, key, value);
        if (rc != 0)
            goto free_root;
    }
    *cfg = next;

free_root:
    json_decref(root);
    return rc;
}
