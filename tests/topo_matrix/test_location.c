/* Location strings: the strict grammar, canonical formatting and message quoting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/error.h"
#include "topo/location.h"

static void expect_rejected(const char *text, const char *why)
{
    struct orb_location loc = {0xee, 0xee};
    orb_clear_error();
    int rc = orb_location_parse(text, &loc);
    if (rc != ORB_EINVAL)
        fail_msg("\"%s\" gave %d, expected ORB_EINVAL", text, rc);
    assert_int_equal(loc.kind, 0xee); /* out-parameter untouched */
    assert_int_equal(loc.index, 0xee);
    const char *msg = orb_last_error();
    if (!strstr(msg, why))
        fail_msg("\"%s\": message \"%s\" does not say \"%s\"", text, msg, why);
    assert_non_null(strstr(msg, "location"));
}

static void test_parse_null_arguments(void **state)
{
    (void)state;
    struct orb_location loc;
    assert_int_equal(orb_location_parse(NULL, &loc), ORB_EINVAL);
    assert_int_equal(orb_location_parse("cpu:0", NULL), ORB_EINVAL);
}

static void test_parse_rejects_malformed(void **state)
{
    (void)state;
    expect_rejected("", "expected");
    expect_rejected("cpu", "expected");
    expect_rejected("CPU:0", "expected");
    expect_rejected("Cuda:0", "expected");
    expect_rejected("gpu:0", "expected");
    expect_rejected("hip:0", "expected");
    expect_rejected(" cpu:0", "expected");
    expect_rejected("**", "expected");
    expect_rejected("* ", "expected");
    expect_rejected("cpu0", "expected");
    expect_rejected("cpu:", "missing");
    expect_rejected("cuda:", "missing");
    expect_rejected("cpu:01", "leading zero");
    expect_rejected("cpu:00", "leading zero");
    expect_rejected("cuda:007", "leading zero");
    expect_rejected("cpu:-1", "digits only");
    expect_rejected("cpu:+1", "digits only");
    expect_rejected("cpu: 1", "digits only");
    expect_rejected("cpu:1 ", "digits only");
    expect_rejected("cpu:1\n", "digits only");
    expect_rejected("cuda:1x", "digits only");
    expect_rejected("cuda:0x1", "leading zero");
    expect_rejected("cpu:1.0", "digits only");
    expect_rejected("cpu:64", "over the maximum 63");
    expect_rejected("cuda:64", "over the maximum 63");
    expect_rejected("cuda:4294967296", "over the maximum");
    expect_rejected("cpu:99999999999999999999999999999999", "over the maximum");
}

static void test_parse_message_quotes_text_safely(void **state)
{
    (void)state;
    expect_rejected("cpu:\x01\x7f", "cpu:??");
    char long_text[300];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    memcpy(long_text, "cpu:", 4);
    expect_rejected(long_text, "...");
    assert_true(strlen(orb_last_error()) < 200);
}

static void test_parse_accepts_valid(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        uint8_t kind, index;
    } cases[] = {
        {"*", ORB_LOC_ANY, 0},      {"cpu:0", ORB_LOC_CPU, 0},   {"cpu:1", ORB_LOC_CPU, 1},
        {"cpu:63", ORB_LOC_CPU, 63}, {"cuda:0", ORB_LOC_CUDA, 0}, {"cuda:10", ORB_LOC_CUDA, 10},
        {"cuda:63", ORB_LOC_CUDA, 63},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct orb_location loc = {0xee, 0xee};
        assert_int_equal(orb_location_parse(cases[i].text, &loc), 0);
        assert_int_equal(loc.kind, cases[i].kind);
        assert_int_equal(loc.index, cases[i].index);
    }
}

static void test_format_rejects_invalid(void **state)
{
    (void)state;
    char buf[ORB_LOCATION_STR_MAX];
    struct orb_location cuda63 = {ORB_LOC_CUDA, 63};
    assert_int_equal(orb_location_format(cuda63, NULL, 8), ORB_EINVAL);
    assert_int_equal(orb_location_format(cuda63, buf, 7), ORB_EINVAL); /* "cuda:63" needs 8 */
    assert_int_equal(orb_location_format(cuda63, buf, 0), ORB_EINVAL);
    struct orb_location bad_kind = {3, 0};
    assert_int_equal(orb_location_format(bad_kind, buf, sizeof buf), ORB_EINVAL);
    struct orb_location any_with_index = {ORB_LOC_ANY, 1};
    assert_int_equal(orb_location_format(any_with_index, buf, sizeof buf), ORB_EINVAL);
    struct orb_location cpu64 = {ORB_LOC_CPU, 64};
    assert_int_equal(orb_location_format(cpu64, buf, sizeof buf), ORB_EINVAL);
    struct orb_location cuda64 = {ORB_LOC_CUDA, 64};
    assert_int_equal(orb_location_format(cuda64, buf, sizeof buf), ORB_EINVAL);
}

/* Every valid location formats to a string that parses back to it, and that string is the
 * only spelling (parse then format is the identity on canonical text). */
static void test_format_round_trips_every_location(void **state)
{
    (void)state;
    char buf[ORB_LOCATION_STR_MAX];
    struct orb_location any = {ORB_LOC_ANY, 0};
    assert_int_equal(orb_location_format(any, buf, sizeof buf), 0);
    assert_string_equal(buf, "*");
    for (unsigned kind = ORB_LOC_CPU; kind <= ORB_LOC_CUDA; kind++) {
        for (unsigned i = 0; i <= 63; i++) {
            struct orb_location loc = {(uint8_t)kind, (uint8_t)i};
            assert_int_equal(orb_location_format(loc, buf, sizeof buf), 0);
            char expect[16];
            snprintf(expect, sizeof expect, "%s:%u", kind == ORB_LOC_CPU ? "cpu" : "cuda", i);
            assert_string_equal(buf, expect);
            struct orb_location back;
            assert_int_equal(orb_location_parse(buf, &back), 0);
            assert_int_equal(back.kind, kind);
            assert_int_equal(back.index, i);
        }
    }
}

static void test_mem_type(void **state)
{
    (void)state;
    struct orb_location any = {ORB_LOC_ANY, 0}, cpu = {ORB_LOC_CPU, 1}, cuda = {ORB_LOC_CUDA, 2};
    struct orb_location bad = {7, 0};
    assert_int_equal(orb_location_mem_type(bad), ORB_EINVAL);
    assert_int_equal(orb_location_mem_type(any), 4);
    assert_int_equal(orb_location_mem_type(cpu), 0);
    assert_int_equal(orb_location_mem_type(cuda), 1);
}

static void test_quote_text(void **state)
{
    (void)state;
    char buf[8];
    memset(buf, 'z', sizeof buf);
    orb_topo_quote_text("abc", buf, 0); /* writes nothing */
    assert_int_equal(buf[0], 'z');
    orb_topo_quote_text("abc", buf, 1);
    assert_string_equal(buf, "");
    orb_topo_quote_text(NULL, buf, sizeof buf);
    assert_string_equal(buf, "(null)");
    orb_topo_quote_text("a\tb\xff", buf, sizeof buf);
    assert_string_equal(buf, "a?b?");
    orb_topo_quote_text("1234567", buf, sizeof buf); /* fits exactly */
    assert_string_equal(buf, "1234567");
    orb_topo_quote_text("12345678", buf, sizeof buf); /* one too many: cut and marked */
    assert_string_equal(buf, "1234...");
    orb_topo_quote_text("12345678", buf, 3); /* too small for the marker: plain cut */
    assert_string_equal(buf, "12");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_null_arguments),
        cmocka_unit_test(test_parse_rejects_malformed),
        cmocka_unit_test(test_parse_message_quotes_text_safely),
        cmocka_unit_test(test_parse_accepts_valid),
        cmocka_unit_test(test_format_rejects_invalid),
        cmocka_unit_test(test_format_round_trips_every_location),
        cmocka_unit_test(test_mem_type),
        cmocka_unit_test(test_quote_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
