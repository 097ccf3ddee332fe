/* orbite-bench internals: size parsing, options, the verification pattern, quantiles. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "pattern.h"

#define EPOCH_HEX "00112233445566778899aabbccddeeff"

/* ---- sizes ---- */

static void test_parse_size_rejects_malformed(void **state)
{
    (void)state;
    static const char *const bad[] = {"", "0", "0K", "K", "-4K", " 4K", "4K ", "4x", "4KK",
                                      "4Ki", "4iB", "1.5M", "0x10", "99999999999999999999",
                                      "1048577M", "1025G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t out = 77;
        assert_int_equal(bench_parse_size(bad[i], &out), -1);
        assert_int_equal(out, 77); /* untouched on failure */
    }
    uint64_t out = 0;
    assert_int_equal(bench_parse_size(NULL, &out), -1);
}

static void test_parse_size_units(void **state)
{
    (void)state;
    static const struct { const char *text; uint64_t value; } good[] = {
        {"1", 1},           {"1025", 1025},        {"4K", 4096},         {"4k", 4096},
        {"64KiB", 65536},   {"64KB", 65536},       {"1M", 1u << 20},     {"3MiB", 3u << 20},
        {"2G", 2ull << 30}, {"1024G", 1ull << 40}, {"100B", 100},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t out = 0;
        assert_int_equal(bench_parse_size(good[i].text, &out), 0);
        assert_int_equal(out, good[i].value);
    }
}

static void test_parse_size_list(void **state)
{
    (void)state;
    uint64_t sizes[BENCH_MAX_SIZES];
    size_t n = 99;
    static const char *const bad[] = {"", ",", "4K,", ",4K", "4K,,1M", "2G", "4K;1M"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(bench_parse_size_list(bad[i], sizes, BENCH_MAX_SIZES, &n), -1);
    assert_int_equal(n, 99);
    /* One more entry than the capacity. */
    assert_int_equal(bench_parse_size_list("1,2,3", sizes, 2, &n), -1);

    assert_int_equal(bench_parse_size_list("4K,64K,1M", sizes, BENCH_MAX_SIZES, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(sizes[0], 4096);
    assert_int_equal(sizes[1], 65536);
    assert_int_equal(sizes[2], 1u << 20);
    assert_int_equal(bench_parse_size_list("1G", sizes, BENCH_MAX_SIZES, &n), 0);
    assert_int_equal(sizes[0], BENCH_MAX_BLOCK);
}

/* ---- options ---- */

static int parse(struct bench_options *opt, int argc, const char **argv)
{
    return bench_parse_options(argc, (char **)argv, opt);
}

static void test_options_reject_bad_values(void **state)
{
    (void)state;
    static const char *const bad[][3] = {
        {"--op", "copy", NULL},          {"--batch", "0", NULL},
        {"--batch", "65537", NULL},      {"--depth", "65", NULL},
        {"--threads", "0", NULL},        {"--duration", "0", NULL},
        {"--duration", "nan", NULL},     {"--duration", "3s", NULL},
        {"--transport", "ipc", NULL},    {"--mode", "server", NULL},
        {"--block-size", "4K,0", NULL},  {"--buffer-size", "lots", NULL},
        {"--seed", "-1", NULL},          {"--unknown", NULL, NULL},
        {"stray", NULL, NULL},           {"--batch", NULL, NULL},
        {"--epoch", EPOCH_HEX, NULL},    /* only for --mode requester */
        {"--mode", "requester", NULL},   /* needs --endpoint and --epoch */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[4] = {"orbite-bench", bad[i][0], bad[i][1], NULL};
        int argc = bad[i][1] ? 3 : 2;
        struct bench_options opt;
        assert_int_equal(parse(&opt, argc, argv), -1);
    }
    const char *no_epoch[] = {"orbite-bench", "--mode", "requester", "--endpoint", "h:1", NULL};
    struct bench_options opt;
    assert_int_equal(parse(&opt, 5, no_epoch), -1);
    const char *bad_epoch[] = {"orbite-bench", "--mode", "requester", "--endpoint", "h:1",
                               "--epoch", "00112233", NULL};
    assert_int_equal(parse(&opt, 7, bad_epoch), -1);
    /* The same-host transport moves host memory only. */
    const char *shm_cuda[] = {"orbite-bench", "--transport", "shm", "--memory", "cuda", NULL};
    assert_int_equal(parse(&opt, 5, shm_cuda), -1);
    const char *shm_cuda_requester[] = {"orbite-bench", "--requester-memory", "cuda:1", "--transport",
                                        "shm", NULL};
    assert_int_equal(parse(&opt, 5, shm_cuda_requester), -1);
}

static void test_options_transports(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        enum orb_transport transport;
    } cases[] = {
        {"tcp", ORB_TRANSPORT_TCP},       {"rdma", ORB_TRANSPORT_RDMA}, {"nvlink", ORB_TRANSPORT_NVLINK},
        {"shm", ORB_TRANSPORT_SHM},       {"unspec", ORB_TRANSPORT_UNSPEC},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool device = cases[i].transport == ORB_TRANSPORT_NVLINK; /* it moves device memory only */
        const char *argv[] = {"orbite-bench", "--transport", cases[i].name, "--memory", "cuda", NULL};
        struct bench_options opt;
        assert_int_equal(parse(&opt, device ? 5 : 3, argv), 0);
        assert_int_equal(opt.transport, cases[i].transport);
    }
    /* NVLink without device memory on a side this process runs is a usage error. */
    const char *nvlink_host[] = {"orbite-bench", "--transport", "nvlink", NULL};
    struct bench_options opt;
    assert_int_equal(parse(&opt, 3, nvlink_host), -1);
    const char *nvlink_one[] = {"orbite-bench", "--transport", "nvlink", "--source-memory", "cuda", NULL};
    assert_int_equal(parse(&opt, 5, nvlink_one), -1);
}

/* The library's verdict on the settings comes before any engine starts: a refused one is a
 * usage error, and --config cannot move what the tool sets. */
static void test_options_settings(void **state)
{
    (void)state;
    struct bench_options opt;
    const char *unknown[] = {"orbite-bench", "--config", "{\"tcp_strips\": 1}", NULL};
    assert_int_equal(parse(&opt, 3, unknown), -1);
    const char *not_json[] = {"orbite-bench", "--config", "notjson", NULL};
    assert_int_equal(parse(&opt, 3, not_json), -1);
    const char *endpoint[] = {"orbite-bench", "--config", "{\"endpoint\": \"127.0.0.1:1\"}", NULL};
    assert_int_equal(parse(&opt, 3, endpoint), -1);
    const char *role[] = {"orbite-bench", "--config", "{\"enable_source\": false}", NULL};
    assert_int_equal(parse(&opt, 3, role), -1);
    const char *fine[] = {"orbite-bench", "--config", "{\"tcp_stripes\": 2}", NULL};
    assert_int_equal(parse(&opt, 3, fine), 0);
    const char *rdma_bad[] = {"orbite-bench", "--rdma-requester", "{\"bad_key\": 1}", NULL};
    assert_int_equal(parse(&opt, 3, rdma_bad), -1);
    const char *rdma_fine[] = {"orbite-bench", "--rdma", "{\"num_lanes\": 1}", NULL};
    assert_int_equal(parse(&opt, 3, rdma_fine), 0);
}

static void test_options_defaults(void **state)
{
    (void)state;
    const char *argv[] = {"orbite-bench", NULL};
    struct bench_options opt;
    assert_int_equal(parse(&opt, 1, argv), 0);
    assert_int_equal(opt.mode, BENCH_MODE_BOTH);
    assert_int_equal(opt.ops, BENCH_OP_READ | BENCH_OP_WRITE);
    assert_int_equal(opt.n_block_sizes, 3);
    assert_int_equal(opt.block_sizes[0], 4096);
    assert_int_equal(opt.block_sizes[2], 1u << 20);
    assert_int_equal(opt.batch, 16);
    assert_int_equal(opt.threads, 1);
    assert_true(opt.duration_s == 3.0);
    assert_int_equal(opt.transport, ORB_TRANSPORT_TCP);
    assert_int_equal(opt.verify, 1);
    assert_int_equal(opt.progress, -1);
    assert_int_equal(bench_source_buffer_size(&opt), BENCH_DEFAULT_BUFFER);
}

static void test_options_requester(void **state)
{
    (void)state;
    const char *argv[] = {"orbite-bench", "--mode", "requester", "--endpoint", "10.0.0.2:7000",
                          "--epoch", EPOCH_HEX, "--op", "write", "-b", "8K", "--batch", "1",
                          "--no-verify", "--json", "-q", "--transport", "unspec", "--seed", "0x10",
                          NULL};
    struct bench_options opt;
    assert_int_equal(parse(&opt, 20, argv), 0);
    assert_int_equal(opt.mode, BENCH_MODE_REQUESTER);
    assert_string_equal(opt.endpoint, "10.0.0.2:7000");
    assert_int_equal(opt.have_epoch, 1);
    assert_int_equal(opt.epoch.bytes[0], 0x00);
    assert_int_equal(opt.epoch.bytes[15], 0xff);
    assert_int_equal(opt.ops, BENCH_OP_WRITE);
    assert_int_equal(opt.n_block_sizes, 1);
    assert_int_equal(opt.block_sizes[0], 8192);
    assert_int_equal(opt.batch, 1);
    assert_int_equal(opt.verify, 0);
    assert_int_equal(opt.json, 1);
    assert_int_equal(opt.quiet, 1);
    assert_int_equal(opt.progress, 0); /* quiet turns the automatic progress line off */
    assert_int_equal(opt.transport, ORB_TRANSPORT_UNSPEC);
    assert_int_equal(opt.seed, 16);
}

static void test_buffer_grows_for_blocks_in_flight(void **state)
{
    (void)state;
    const char *argv[] = {"orbite-bench", "-b", "4K,16M", "--threads", "2", "--depth", "4",
                          "--batch", "8", "--buffer-size", "1M", NULL};
    struct bench_options opt;
    assert_int_equal(parse(&opt, 11, argv), 0);
    /* 2 threads * 4 batches * 8 requests of the largest block (16 MiB). */
    assert_int_equal(bench_source_buffer_size(&opt), 64ull * (16u << 20));
    opt.block_sizes[1] = 4096;
    assert_int_equal(bench_source_buffer_size(&opt), 1u << 20);
}

/* ---- pattern ---- */

static void test_pattern_offsets_agree(void **state)
{
    (void)state;
    uint8_t whole[512];
    uint8_t part[512];
    bench_pattern_fill(whole, sizeof whole, 42, 0);
    /* Any sub-range, aligned or not, reproduces the same bytes from its offset alone. */
    for (size_t off = 0; off < 24; off++) {
        for (size_t len = 0; len < 40; len++) {
            memset(part, 0, sizeof part);
            bench_pattern_fill(part, len, 42, off);
            assert_memory_equal(part, whole + off, len);
            assert_int_equal(bench_pattern_check(whole + off, len, 42, off), len);
            if (len > 0)
                assert_int_equal(bench_pattern_byte(42, off + len - 1), whole[off + len - 1]);
        }
    }
}

static void test_pattern_check_finds_first_difference(void **state)
{
    (void)state;
    static uint8_t buf[3 * 4096 + 5];
    bench_pattern_fill(buf, sizeof buf, 7, 3);
    assert_int_equal(bench_pattern_check(buf, sizeof buf, 7, 3), sizeof buf);
    /* The wrong seed or the wrong offset does not match. */
    assert_int_not_equal(bench_pattern_check(buf, sizeof buf, 8, 3), sizeof buf);
    assert_int_not_equal(bench_pattern_check(buf, sizeof buf, 7, 4), sizeof buf);
    buf[5000] ^= 1;
    buf[9000] ^= 1;
    assert_int_equal(bench_pattern_check(buf, sizeof buf, 7, 3), 5000);
    buf[5000] ^= 1;
    assert_int_equal(bench_pattern_check(buf, sizeof buf, 7, 3), 9000);
}

static void test_pattern_is_not_constant(void **state)
{
    (void)state;
    uint8_t a[4096];
    uint8_t b[4096];
    bench_pattern_fill(a, sizeof a, 1, 0);
    bench_pattern_fill(b, sizeof b, 2, 0);
    assert_memory_not_equal(a, b, sizeof a);
    /* A poisoned buffer (all one byte value) never passes. */
    memset(b, 0xa5, sizeof b);
    assert_true(bench_pattern_check(b, sizeof b, 1, 0) < 16);
}

/* ---- quantiles and formatting ---- */

static void test_quantile(void **state)
{
    (void)state;
    assert_int_equal(bench_quantile(NULL, 0, 0.5), 0);
    uint64_t one[] = {9};
    assert_int_equal(bench_quantile(one, 1, 0.5), 9);
    assert_int_equal(bench_quantile(one, 1, 0.99), 9);
    uint64_t v[100];
    for (size_t i = 0; i < 100; i++)
        v[i] = 100 - i;
    bench_sort_u64(v, 100);
    assert_int_equal(v[0], 1);
    assert_int_equal(bench_quantile(v, 100, 0.50), 50);
    assert_int_equal(bench_quantile(v, 100, 0.99), 99);
    assert_int_equal(bench_quantile(v, 100, 1.0), 100);
    assert_int_equal(bench_quantile(v, 100, 0.001), 1);
}

static void test_format_size(void **state)
{
    (void)state;
    char buf[32];
    assert_string_equal(bench_format_size(0, buf, sizeof buf), "0 B");
    assert_string_equal(bench_format_size(1536, buf, sizeof buf), "1536 B");
    assert_string_equal(bench_format_size(4096, buf, sizeof buf), "4 KiB");
    assert_string_equal(bench_format_size(1536ull << 10, buf, sizeof buf), "1536 KiB");
    assert_string_equal(bench_format_size(1u << 20, buf, sizeof buf), "1 MiB");
    assert_string_equal(bench_format_size(256u << 20, buf, sizeof buf), "256 MiB");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size_rejects_malformed),
        cmocka_unit_test(test_parse_size_units),
        cmocka_unit_test(test_parse_size_list),
        cmocka_unit_test(test_options_reject_bad_values),
        cmocka_unit_test(test_options_defaults),
        cmocka_unit_test(test_options_transports),
        cmocka_unit_test(test_options_settings),
        cmocka_unit_test(test_options_requester),
        cmocka_unit_test(test_buffer_grows_for_blocks_in_flight),
        cmocka_unit_test(test_pattern_offsets_agree),
        cmocka_unit_test(test_pattern_check_finds_first_difference),
        cmocka_unit_test(test_pattern_is_not_constant),
        cmocka_unit_test(test_quantile),
        cmocka_unit_test(test_format_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
