/* Engine configuration: defaults, JSON keys, types and ranges, endpoints, validation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"

/* helper_mode, hello_timeout_ms, max_unauthenticated and enable_shm replaced the first two of
 * eight reserved u64 words, tcp_local_stripes and reserved32 the third: same size, and the
 * remaining reserved words where they were (ABI of 0.1.0). */
_Static_assert(sizeof(struct orb_engine_config) == 248, "the configuration keeps its size");
_Static_assert(offsetof(struct orb_engine_config, helper_mode) + 24 ==
                   offsetof(struct orb_engine_config, reserved),
               "the six 32-bit fields fill exactly three former reserved words");
_Static_assert(offsetof(struct orb_engine_config, reserved) + 5 * sizeof(uint64_t) ==
                   sizeof(struct orb_engine_config),
               "reserved[] ends the structure");

#define RESERVED_WORDS (sizeof ((struct orb_engine_config *)0)->reserved / sizeof(uint64_t))

/* Integer keys with their accepted ranges (UINT64_MAX: no upper bound). */
struct int_key {
    const char *name;
    uint64_t min;
    uint64_t max;
};

static const struct int_key int_keys[] = {
    { "tcp_stripes", 1, 16 },
    { "tcp_workers", 1, 16 },
    { "tcp_stripe_threshold", 4096, UINT64_MAX },
    { "tcp_socket_buffer", 0, 1u << 30 },
    { "busy_poll_us", 0, 10000 },
    { "io_timeout_s", 1, 86400 },
    { "max_batches", 1, 1u << 20 },
    { "max_batch_requests", 1, 1u << 24 },
    { "max_registrations", 1, 1u << 24 },
    { "max_connections", 1, 65536 },
    { "max_notifications", 1, 1u << 20 },
    { "hello_timeout_ms", 1, 3600000 },
    { "max_unauthenticated", 1, 65536 },
    { "tcp_local_stripes", 0, 16 },
};

#define INT_KEY_COUNT (sizeof int_keys / sizeof int_keys[0])

static uint64_t get_int(const struct orb_engine_config *cfg, const char *name)
{
    if (strcmp(name, "tcp_stripes") == 0) return cfg->tcp_stripes;
    if (strcmp(name, "tcp_workers") == 0) return cfg->tcp_workers;
    if (strcmp(name, "tcp_stripe_threshold") == 0) return cfg->tcp_stripe_threshold;
    if (strcmp(name, "tcp_socket_buffer") == 0) return cfg->tcp_socket_buffer;
    if (strcmp(name, "busy_poll_us") == 0) return cfg->busy_poll_us;
    if (strcmp(name, "io_timeout_s") == 0) return cfg->io_timeout_s;
    if (strcmp(name, "max_batches") == 0) return cfg->max_batches;
    if (strcmp(name, "max_batch_requests") == 0) return cfg->max_batch_requests;
    if (strcmp(name, "max_registrations") == 0) return cfg->max_registrations;
    if (strcmp(name, "max_connections") == 0) return cfg->max_connections;
    if (strcmp(name, "max_notifications") == 0) return cfg->max_notifications;
    if (strcmp(name, "hello_timeout_ms") == 0) return cfg->hello_timeout_ms;
    if (strcmp(name, "max_unauthenticated") == 0) return cfg->max_unauthenticated;
    if (strcmp(name, "tcp_local_stripes") == 0) return cfg->tcp_local_stripes;
    fail_msg("unknown key %s", name);
    return 0;
}

static void set_int(struct orb_engine_config *cfg, const char *name, uint64_t v)
{
    if (strcmp(name, "tcp_stripes") == 0) cfg->tcp_stripes = (uint32_t)v;
    else if (strcmp(name, "tcp_workers") == 0) cfg->tcp_workers = (uint32_t)v;
    else if (strcmp(name, "tcp_stripe_threshold") == 0) cfg->tcp_stripe_threshold = v;
    else if (strcmp(name, "tcp_socket_buffer") == 0) cfg->tcp_socket_buffer = (uint32_t)v;
    else if (strcmp(name, "busy_poll_us") == 0) cfg->busy_poll_us = (uint32_t)v;
    else if (strcmp(name, "io_timeout_s") == 0) cfg->io_timeout_s = (uint32_t)v;
    else if (strcmp(name, "max_batches") == 0) cfg->max_batches = (uint32_t)v;
    else if (strcmp(name, "max_batch_requests") == 0) cfg->max_batch_requests = (uint32_t)v;
    else if (strcmp(name, "max_registrations") == 0) cfg->max_registrations = (uint32_t)v;
    else if (strcmp(name, "max_connections") == 0) cfg->max_connections = (uint32_t)v;
    else if (strcmp(name, "max_notifications") == 0) cfg->max_notifications = (uint32_t)v;
    else if (strcmp(name, "hello_timeout_ms") == 0) cfg->hello_timeout_ms = (uint32_t)v;
    else if (strcmp(name, "max_unauthenticated") == 0) cfg->max_unauthenticated = (uint32_t)v;
    else if (strcmp(name, "tcp_local_stripes") == 0) cfg->tcp_local_stripes = (uint32_t)v;
    else fail_msg("unknown key %s", name);
}

static struct orb_engine_config defaults(void)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    return cfg;
}

/* Load `json` and expect ORB_ECONFIG with `needle` in the message and `cfg` untouched. */
static void expect_rejected(const char *json, const char *needle)
{
    struct orb_engine_config cfg = defaults();
    cfg.tcp_stripes = 7; /* not the default: "unchanged" must mean unchanged, not reset */
    struct orb_engine_config before = cfg;
    int rc = orb_engine_config_load_json(&cfg, json);
    if (rc != ORB_ECONFIG)
        fail_msg("'%s' gave %d, expected ORB_ECONFIG", json, rc);
    if (needle != NULL && strstr(orb_last_error(), needle) == NULL)
        fail_msg("'%s': message '%s' does not name '%s'", json, orb_last_error(), needle);
    assert_memory_equal(&cfg, &before, sizeof cfg);
}

static void expect_loaded(struct orb_engine_config *cfg, const char *json)
{
    int rc = orb_engine_config_load_json(cfg, json);
    if (rc != 0)
        fail_msg("'%s' gave %d: %s", json, rc, orb_last_error());
}

/* ------------------------------------------------------------------------ */

static void test_null_arguments(void **state)
{
    (void)state;
    struct orb_engine_config cfg = defaults();
    assert_int_equal(orb_engine_config_init(NULL), ORB_EINVAL);
    assert_int_equal(orb_engine_config_load_json(NULL, "{}"), ORB_EINVAL);
    assert_int_equal(orb_engine_config_load_json(&cfg, NULL), ORB_EINVAL);
    assert_int_equal(orb_engine_config_validate(NULL), ORB_EINVAL);
    assert_int_equal(orb_endpoint_split(NULL, NULL, 0, NULL), ORB_EINVAL);
}

static void test_defaults(void **state)
{
    (void)state;
    struct orb_engine_config cfg;
    memset(&cfg, 0xff, sizeof cfg);
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    assert_string_equal(cfg.endpoint, "127.0.0.1:0");
    assert_int_equal(cfg.enable_source, 1);
    assert_int_equal(cfg.tcp_stripes, 2);
    assert_int_equal(cfg.tcp_workers, 2);
    assert_int_equal(cfg.tcp_stripe_threshold, 1u << 20);
    assert_int_equal(cfg.tcp_socket_buffer, 0);
    assert_int_equal(cfg.busy_poll_us, 200);
    assert_int_equal(cfg.io_timeout_s, 30);
    assert_int_equal(cfg.max_batches, 1024);
    assert_int_equal(cfg.max_batch_requests, 65536);
    assert_int_equal(cfg.max_registrations, 65536);
    assert_int_equal(cfg.max_connections, 256);
    assert_int_equal(cfg.max_notifications, 1024);
    assert_int_equal(cfg.helper_mode, ORB_HELPER_AUTO);
    assert_int_equal(cfg.hello_timeout_ms, 5000);
    assert_int_equal(cfg.max_unauthenticated, 32);
    assert_int_equal(cfg.enable_shm, 1);
    assert_int_equal(cfg.tcp_local_stripes, 0);
    assert_int_equal(cfg.reserved32, 0);
    assert_int_equal(RESERVED_WORDS, 5);
    for (size_t i = 0; i < RESERVED_WORDS; i++)
        assert_int_equal(cfg.reserved[i], 0);
    assert_int_equal(orb_engine_config_validate(&cfg), 0);
}

static void test_parse_errors_and_top_level(void **state)
{
    (void)state;
    expect_rejected("", "JSON");
    expect_rejected("{", "JSON");
    expect_rejected("{\"tcp_stripes\": 4,}", "JSON");
    expect_rejected("{\"tcp_stripes\": 4} trailing", "JSON");
    expect_rejected("{\"tcp_stripes\": 4, \"tcp_stripes\": 5}", "JSON"); /* duplicate key */
    expect_rejected("{\"tcp_stripe_threshold\": 99999999999999999999}", "JSON");
    expect_rejected("[]", "object");
    expect_rejected("[{\"tcp_stripes\": 4}]", "object");
    expect_rejected("3", NULL);
    expect_rejected("\"text\"", NULL);
    expect_rejected("null", NULL);

    /* Oversized input is refused before parsing. */
    size_t big = (1u << 20) + 3;
    char *huge = malloc(big + 1);
    assert_non_null(huge);
    memset(huge, ' ', big);
    memcpy(huge + big - 2, "{}", 3);
    expect_rejected(huge, "JSON");
    free(huge);

    struct orb_engine_config cfg = defaults(), before = cfg;
    expect_loaded(&cfg, "{}");
    expect_loaded(&cfg, "  { }  \n");
    assert_memory_equal(&cfg, &before, sizeof cfg);
}

static void test_unknown_keys(void **state)
{
    (void)state;
    expect_rejected("{\"reserved\": [0]}", "'reserved'");
    expect_rejected("{\"reserved\": 0}", "unknown");
    expect_rejected("{\"reserved32\": 0}", "unknown");
    expect_rejected("{\"tcp_stripe\": 2}", "'tcp_stripe'");
    expect_rejected("{\"TCP_STRIPES\": 2}", "'TCP_STRIPES'");
    expect_rejected("{\"\": 2}", "unknown");
    expect_rejected("{\"tcp_stripes\": 4, \"bogus\": 1}", "'bogus'");
}

static void test_every_key_applies(void **state)
{
    (void)state;
    struct orb_engine_config cfg = defaults();
    expect_loaded(&cfg, "{\"endpoint\": \"[::1]:7000\", \"enable_source\": false,"
                        " \"tcp_stripes\": 16, \"tcp_workers\": 3,"
                        " \"tcp_stripe_threshold\": 9223372036854775807,"
                        " \"tcp_socket_buffer\": 262144, \"busy_poll_us\": 0, \"io_timeout_s\": 5,"
                        " \"max_batches\": 7, \"max_batch_requests\": 8, \"max_registrations\": 9,"
                        " \"max_connections\": 10, \"max_notifications\": 11,"
                        " \"helper\": \"required\"}");
    assert_string_equal(cfg.endpoint, "[::1]:7000");
    assert_int_equal(cfg.enable_source, 0);
    assert_int_equal(cfg.tcp_stripes, 16);
    assert_int_equal(cfg.tcp_workers, 3);
    assert_true(cfg.tcp_stripe_threshold == (uint64_t)INT64_MAX);
    assert_int_equal(cfg.tcp_socket_buffer, 262144);
    assert_int_equal(cfg.busy_poll_us, 0);
    assert_int_equal(cfg.io_timeout_s, 5);
    assert_int_equal(cfg.max_batches, 7);
    assert_int_equal(cfg.max_batch_requests, 8);
    assert_int_equal(cfg.max_registrations, 9);
    assert_int_equal(cfg.max_connections, 10);
    assert_int_equal(cfg.max_notifications, 11);
    assert_int_equal(cfg.helper_mode, ORB_HELPER_REQUIRED);
    assert_int_equal(orb_engine_config_validate(&cfg), 0);

    /* Keys not mentioned keep their values; true switches back on. */
    expect_loaded(&cfg, "{\"enable_source\": true}");
    assert_int_equal(cfg.enable_source, 1);
    expect_loaded(&cfg, "{\"enable_shm\": false}");
    assert_int_equal(cfg.enable_shm, 0);
    assert_int_equal(cfg.enable_source, 1);
    expect_loaded(&cfg, "{\"enable_shm\": true}");
    assert_int_equal(cfg.enable_shm, 1);
    assert_int_equal(cfg.tcp_stripes, 16);
    assert_string_equal(cfg.endpoint, "[::1]:7000");

    /* A shorter endpoint leaves no tail of the longer one behind. */
    expect_loaded(&cfg, "{\"endpoint\": \"h:1\"}");
    assert_string_equal(cfg.endpoint, "h:1");
    for (size_t i = 3; i < ORB_ENDPOINT_MAX; i++)
        assert_int_equal(cfg.endpoint[i], 0);
}

static void test_every_wrong_type(void **state)
{
    (void)state;
    static const char *not_integers[] = { "1.5", "2.0", "1e3", "\"3\"", "true", "false", "null",
                                          "[]", "[1]", "{}" };
    char json[256];
    for (size_t k = 0; k < INT_KEY_COUNT; k++) {
        char needle[64];
        snprintf(needle, sizeof needle, "'%s'", int_keys[k].name);
        for (size_t v = 0; v < sizeof not_integers / sizeof not_integers[0]; v++) {
            snprintf(json, sizeof json, "{\"%s\": %s}", int_keys[k].name, not_integers[v]);
            expect_rejected(json, needle);
            expect_rejected(json, "integer");
        }
    }
    static const char *not_booleans[] = { "0", "1", "\"true\"", "null", "[]", "{}", "1.0" };
    for (size_t v = 0; v < sizeof not_booleans / sizeof not_booleans[0]; v++) {
        snprintf(json, sizeof json, "{\"enable_source\": %s}", not_booleans[v]);
        expect_rejected(json, "'enable_source'");
    }
    static const char *not_strings[] = { "0", "true", "null", "[\"127.0.0.1:0\"]", "{}" };
    for (size_t v = 0; v < sizeof not_strings / sizeof not_strings[0]; v++) {
        snprintf(json, sizeof json, "{\"endpoint\": %s}", not_strings[v]);
        expect_rejected(json, "'endpoint'");
        expect_rejected(json, "string");
    }
}

static void test_ranges(void **state)
{
    (void)state;
    char json[256];
    for (size_t k = 0; k < INT_KEY_COUNT; k++) {
        const struct int_key *key = &int_keys[k];
        char needle[64];
        snprintf(needle, sizeof needle, "'%s'", key->name);
        struct orb_engine_config cfg = defaults();

        /* Both ends of the range are accepted. */
        snprintf(json, sizeof json, "{\"%s\": %llu}", key->name, (unsigned long long)key->min);
        expect_loaded(&cfg, json);
        assert_true(get_int(&cfg, key->name) == key->min);
        uint64_t top = key->max == UINT64_MAX ? (uint64_t)INT64_MAX : key->max;
        snprintf(json, sizeof json, "{\"%s\": %llu}", key->name, (unsigned long long)top);
        expect_loaded(&cfg, json);
        assert_true(get_int(&cfg, key->name) == top);
        if (key->max == UINT64_MAX) { /* beyond the JSON reader: refused, saying why */
            snprintf(json, sizeof json, "{\"%s\": 9223372036854775808}", key->name);
            expect_rejected(json, "stop at 9223372036854775807");
        }

        /* One step outside each end, and negatives. */
        if (key->min > 0) {
            snprintf(json, sizeof json, "{\"%s\": %llu}", key->name, (unsigned long long)key->min - 1);
            expect_rejected(json, needle);
        }
        if (key->max != UINT64_MAX) {
            snprintf(json, sizeof json, "{\"%s\": %llu}", key->name, (unsigned long long)key->max + 1);
            expect_rejected(json, needle);
            expect_rejected(json, "range");
            /* Above what the field can hold at all: must not be truncated into range. */
            snprintf(json, sizeof json, "{\"%s\": %llu}", key->name, 4294967296ull + key->min);
            expect_rejected(json, needle);
        }
        snprintf(json, sizeof json, "{\"%s\": -1}", key->name);
        expect_rejected(json, needle);
        snprintf(json, sizeof json, "{\"%s\": -9223372036854775808}", key->name);
        expect_rejected(json, needle);
    }
}

static void test_endpoint_split_accepts(void **state)
{
    (void)state;
    static const struct {
        const char *endpoint;
        const char *host;
        uint16_t port;
    } good[] = {
        { "127.0.0.1:0", "127.0.0.1", 0 },
        { "0.0.0.0:65535", "0.0.0.0", 65535 },
        { "localhost:8080", "localhost", 8080 },
        { "node-1.example.com:1", "node-1.example.com", 1 },
        { "a:00080", "a", 80 },
        { "[::1]:7000", "::1", 7000 },
        { "[::]:0", "::", 0 },
        { "[2001:db8::10]:443", "2001:db8::10", 443 },
        { "[fe80::1%eth0]:9", "fe80::1%eth0", 9 },
        { "[::ffff:10.0.0.1]:5", "::ffff:10.0.0.1", 5 },
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char host[ORB_ENDPOINT_MAX];
        uint16_t port = 1234;
        int rc = orb_endpoint_split(good[i].endpoint, host, sizeof host, &port);
        if (rc != 0)
            fail_msg("'%s' gave %d: %s", good[i].endpoint, rc, orb_last_error());
        assert_string_equal(host, good[i].host);
        assert_int_equal(port, good[i].port);
        /* Host and port outputs are optional. */
        assert_int_equal(orb_endpoint_split(good[i].endpoint, NULL, 0, NULL), 0);

        struct orb_engine_config cfg = defaults();
        char json[256];
        snprintf(json, sizeof json, "{\"endpoint\": \"%s\"}", good[i].endpoint);
        expect_loaded(&cfg, json);
        assert_string_equal(cfg.endpoint, good[i].endpoint);
    }

    /* The host buffer must fit the host and its NUL; outputs stay untouched otherwise. */
    char small[9] = "xxxxxxxx";
    uint16_t port = 1234;
    assert_int_equal(orb_endpoint_split("localhost:1", small, sizeof small, &port), ORB_EINVAL);
    assert_string_equal(small, "xxxxxxxx");
    assert_int_equal(port, 1234);
    char exact[10];
    assert_int_equal(orb_endpoint_split("localhost:1", exact, sizeof exact, &port), 0);
    assert_string_equal(exact, "localhost");
}

static void test_endpoint_split_rejects(void **state)
{
    (void)state;
    char json[512];
    char long_name[ORB_ENDPOINT_MAX + 8];
    memset(long_name, 'a', sizeof long_name);
    memcpy(long_name + ORB_ENDPOINT_MAX - 3, ":80", 4); /* exactly ORB_ENDPOINT_MAX characters */

    const char *bad[] = {
        "", "127.0.0.1", "127.0.0.1:", ":80", "host:port", "host:65536", "host:123456",
        "host:-1", "host:+80", "host: 80", "host:80 ", " host:80", "host:8o", "::1:80", "[::1]",
        "[::1]80", "[::1", "::1]:80", "[]:80", "[zz::1]:80", "[1.2.3.4]:80", "[fe80::1%]:80",
        "[fe80::1%eth 0]:80", "[::1]:80x", "a[::1]:80", "256.1.1.1:80", "1.2.3:80", "1.2.3.4.5:80",
        "-host:80", "host-:80", "ho st:80", "a..b:80", ".a:80", "a.:80", "host_name:80", "h\t:80",
        long_name,
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char host[ORB_ENDPOINT_MAX] = "untouched";
        uint16_t port = 1234;
        int rc = orb_endpoint_split(bad[i], host, sizeof host, &port);
        if (rc != ORB_ECONFIG)
            fail_msg("'%s' gave %d, expected ORB_ECONFIG", bad[i], rc);
        assert_string_not_equal(orb_last_error(), "");
        assert_string_equal(host, "untouched");
        assert_int_equal(port, 1234);

        if (strlen(bad[i]) < 200 && strchr(bad[i], '\t') == NULL) {
            snprintf(json, sizeof json, "{\"endpoint\": \"%s\"}", bad[i]);
            expect_rejected(json, "'endpoint'");
        }
    }

    /* The longest endpoint that fits: ORB_ENDPOINT_MAX - 1 characters. */
    char longest[ORB_ENDPOINT_MAX];
    memset(longest, 'a', sizeof longest);
    for (size_t i = 31; i < ORB_ENDPOINT_MAX - 4; i += 32)
        longest[i] = '.';
    memcpy(longest + ORB_ENDPOINT_MAX - 4, ":80", 4);
    assert_int_equal(strlen(longest), ORB_ENDPOINT_MAX - 1);
    assert_int_equal(orb_endpoint_split(longest, NULL, 0, NULL), 0);
    struct orb_engine_config cfg = defaults();
    snprintf(json, sizeof json, "{\"endpoint\": \"%s\"}", longest);
    expect_loaded(&cfg, json);
    assert_string_equal(cfg.endpoint, longest);

    /* A 63-character label is the longest allowed. */
    char label[80];
    memset(label, 'b', 63);
    memcpy(label + 63, ":1", 3);
    assert_int_equal(orb_endpoint_split(label, NULL, 0, NULL), 0);
    memset(label, 'b', 64);
    memcpy(label + 64, ":1", 3);
    assert_int_equal(orb_endpoint_split(label, NULL, 0, NULL), ORB_ECONFIG);

    /* An endpoint string of ORB_ENDPOINT_MAX characters or with a NUL inside is refused by JSON. */
    snprintf(json, sizeof json, "{\"endpoint\": \"%s\"}", long_name);
    expect_rejected(json, "'endpoint'");
    expect_rejected("{\"endpoint\": \"a:1\\u0000b\"}", NULL);
}

static void test_validate_names_the_field(void **state)
{
    (void)state;
    char needle[64];
    for (size_t k = 0; k < INT_KEY_COUNT; k++) {
        const struct int_key *key = &int_keys[k];
        snprintf(needle, sizeof needle, "'%s'", key->name);
        struct orb_engine_config cfg = defaults();
        set_int(&cfg, key->name, key->min);
        assert_int_equal(orb_engine_config_validate(&cfg), 0);
        if (key->max != UINT64_MAX) {
            set_int(&cfg, key->name, key->max);
            assert_int_equal(orb_engine_config_validate(&cfg), 0);
            set_int(&cfg, key->name, key->max + 1);
            assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
            assert_non_null(strstr(orb_last_error(), needle));
        }
        if (key->min > 0) {
            set_int(&cfg, key->name, key->min - 1);
            assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
            assert_non_null(strstr(orb_last_error(), needle));
        }
    }

    struct orb_engine_config cfg = defaults();
    cfg.enable_source = 2;
    assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "'enable_source'"));
    cfg.enable_source = -1;
    assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
    cfg.enable_source = 0;
    assert_int_equal(orb_engine_config_validate(&cfg), 0);

    cfg = defaults();
    cfg.enable_shm = 2;
    assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "'enable_shm'"));
    cfg.enable_shm = 0;
    assert_int_equal(orb_engine_config_validate(&cfg), 0);
    cfg = defaults();
    cfg.reserved32 = 1;
    assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "'reserved32'"));
    for (size_t i = 0; i < RESERVED_WORDS; i++) {
        cfg = defaults();
        cfg.reserved[i] = 1;
        assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
        snprintf(needle, sizeof needle, "reserved[%zu]", i);
        assert_non_null(strstr(orb_last_error(), needle));
    }

    cfg = defaults();
    snprintf(cfg.endpoint, sizeof cfg.endpoint, "%s", "no-port");
    assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "'endpoint'"));
    assert_non_null(strstr(orb_last_error(), "port"));
    memset(cfg.endpoint, 'a', sizeof cfg.endpoint); /* no NUL at all */
    assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "'endpoint'"));
}

static void test_helper_mode_rejects(void **state)
{
    (void)state;
    static const char *bad[] = {
        "0", "1", "2", "true", "false", "null", "[]", "{}", "[\"auto\"]",       /* not strings */
        "\"\"", "\"AUTO\"", "\"Auto\"", "\"on\"", "\"none\"", "\"require\"",  /* not a mode */
        "\" auto\"", "\"auto \"", "\"offf\"", "\"of\"",
    };
    char json[128];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(json, sizeof json, "{\"helper\": %s}", bad[i]);
        expect_rejected(json, "'helper'");
        expect_rejected(json, "\"required\"");
    }
    /* An embedded NUL is refused (by the JSON parser already). */
    expect_rejected("{\"helper\": \"auto\\u0000\"}", NULL);
    expect_rejected("{\"helper\": \"off\\u0000x\"}", NULL);
    /* The field's own name is not the JSON key. */
    expect_rejected("{\"helper_mode\": \"off\"}", "'helper_mode'");
    expect_rejected("{\"helper_mode\": 2}", "unknown");

    /* Validation: values outside the enum name the field. */
    struct orb_engine_config cfg = defaults();
    static const uint32_t out_of_enum[] = { 3, 4, 255, UINT32_MAX };
    for (size_t i = 0; i < sizeof out_of_enum / sizeof out_of_enum[0]; i++) {
        cfg.helper_mode = out_of_enum[i];
        assert_int_equal(orb_engine_config_validate(&cfg), ORB_ECONFIG);
        assert_non_null(strstr(orb_last_error(), "'helper_mode'"));
    }
}

static void test_helper_mode_accepts(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        uint32_t mode;
    } good[] = {
        { "{\"helper\": \"off\"}", ORB_HELPER_OFF },
        { "{\"helper\": \"required\"}", ORB_HELPER_REQUIRED },
        { "{\"helper\": \"auto\"}", ORB_HELPER_AUTO },
        { "{\"helper\": \"o\\u0066f\"}", ORB_HELPER_OFF }, /* a JSON escape is the same text */
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        struct orb_engine_config cfg = defaults();
        cfg.helper_mode = good[i].mode == ORB_HELPER_AUTO ? ORB_HELPER_OFF : ORB_HELPER_AUTO;
        struct orb_engine_config expected = cfg;
        expected.helper_mode = good[i].mode;
        expect_loaded(&cfg, good[i].json);
        /* Only helper_mode changed. */
        assert_memory_equal(&cfg, &expected, sizeof cfg);
        assert_int_equal(orb_engine_config_validate(&cfg), 0);
    }

    /* Every enum value validates; a key given twice is a JSON error, not "last one wins". */
    struct orb_engine_config cfg = defaults();
    for (uint32_t m = ORB_HELPER_AUTO; m <= ORB_HELPER_OFF; m++) {
        cfg.helper_mode = m;
        assert_int_equal(orb_engine_config_validate(&cfg), 0);
    }
    expect_rejected("{\"helper\": \"off\", \"helper\": \"auto\"}", "JSON"); /* duplicate */

    /* A failure after the helper key leaves it unchanged too. */
    expect_rejected("{\"helper\": \"off\", \"tcp_stripes\": 0}", "'tcp_stripes'");
}

static void test_unchanged_after_late_failure(void **state)
{
    (void)state;
    /* Valid keys before the bad one must not leak into cfg. */
    expect_rejected("{\"tcp_stripes\": 4, \"endpoint\": \"[::1]:1\", \"enable_source\": false,"
                    " \"tcp_workers\": 99}", "'tcp_workers'");
    expect_rejected("{\"endpoint\": \"10.0.0.1:5\", \"max_batches\": 1.0}", "'max_batches'");
    expect_rejected("{\"tcp_stripes\": 4, \"x\": 1}", "'x'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_parse_errors_and_top_level),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_every_wrong_type),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_endpoint_split_rejects),
        cmocka_unit_test(test_validate_names_the_field),
        cmocka_unit_test(test_unchanged_after_late_failure),
        cmocka_unit_test(test_helper_mode_rejects),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_every_key_applies),
        cmocka_unit_test(test_endpoint_split_accepts),
        cmocka_unit_test(test_helper_mode_accepts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
