/* lib/core/dynlib: loading a native library, every required symbol or none, on the C library
 * itself (always there) and a path that is not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/dynlib.h"
#include "core/error.h"

struct calls {
    size_t (*strlen_fn)(const char *);
    void *(*memset_fn)(void *, int, size_t);
    void (*absent_fn)(void);
};

static const struct orb_dl_symbol present[] = {
    {"strlen", offsetof(struct calls, strlen_fn), true},
    {"memset", offsetof(struct calls, memset_fn), true},
};

static void test_every_required_symbol(void **state)
{
    (void)state;
    struct calls c;
    memset(&c, 0, sizeof c);
    void *handle = NULL;
    assert_int_equal(orb_dl_open("test", "libc.so.6", present, 2, &c, sizeof c, NULL, &handle), 0);
    assert_non_null(handle);
    assert_non_null(c.strlen_fn);
    assert_int_equal(c.strlen_fn("orbite"), 6);
    assert_null(c.absent_fn);

    /* An optional symbol the library lacks stays NULL; the load still succeeds. */
    const struct orb_dl_symbol with_optional[] = {
        {"strlen", offsetof(struct calls, strlen_fn), true},
        {"orb_no_such_export", offsetof(struct calls, absent_fn), false},
    };
    memset(&c, 0x5a, sizeof c);
    assert_int_equal(orb_dl_open("test", "libc.so.6", with_optional, 2, &c, sizeof c, NULL, &handle), 0);
    assert_non_null(c.strlen_fn);
    assert_null(c.absent_fn);
}

static void test_one_missing_is_none(void **state)
{
    (void)state;
    const struct orb_dl_symbol wanted[] = {
        {"strlen", offsetof(struct calls, strlen_fn), true},
        {"orb_no_such_export", offsetof(struct calls, absent_fn), true},
        {"memset", offsetof(struct calls, memset_fn), true},
    };
    struct calls c;
    memset(&c, 0x5a, sizeof c);
    void *handle = (void *)&c; /* must stay as it is */
    assert_int_equal(orb_dl_open("test", "libc.so.6", wanted, 3, &c, sizeof c, " (too old?)", &handle),
                     ORB_EUNAVAILABLE);
    assert_ptr_equal(handle, &c);
    assert_string_equal(orb_last_error(), "test: libc.so.6 does not export orb_no_such_export (too old?)");
    /* Nothing of a failed load is usable: the table is zeroed, the found symbol included. */
    assert_null(c.strlen_fn);
    assert_null(c.memset_fn);
    assert_null(c.absent_fn);
}

static void test_a_library_that_is_not_there(void **state)
{
    (void)state;
    struct calls c;
    memset(&c, 0, sizeof c);
    void *handle = NULL;
    assert_int_equal(orb_dl_open("test", "/nonexistent/liborb-none.so.1", present, 2, &c, sizeof c, NULL, &handle),
                     ORB_EUNAVAILABLE);
    assert_null(handle);
    assert_non_null(strstr(orb_last_error(), "test: cannot load /nonexistent/liborb-none.so.1: "));
}

static void test_arguments(void **state)
{
    (void)state;
    struct calls c;
    void *handle = NULL;
    assert_int_equal(orb_dl_open(NULL, "libc.so.6", present, 2, &c, sizeof c, NULL, &handle), ORB_EINVAL);
    assert_int_equal(orb_dl_open("test", NULL, present, 2, &c, sizeof c, NULL, &handle), ORB_EINVAL);
    assert_int_equal(orb_dl_open("test", "libc.so.6", NULL, 2, &c, sizeof c, NULL, &handle), ORB_EINVAL);
    assert_int_equal(orb_dl_open("test", "libc.so.6", present, 2, NULL, sizeof c, NULL, &handle), ORB_EINVAL);
    assert_int_equal(orb_dl_open("test", "libc.so.6", present, 2, &c, sizeof c, NULL, NULL), ORB_EINVAL);
    /* A slot that does not fit the table is refused before anything is loaded or written. */
    const struct orb_dl_symbol outside[] = {{"strlen", sizeof c - sizeof(void *) + 1, true}};
    assert_int_equal(orb_dl_open("test", "libc.so.6", outside, 1, &c, sizeof c, NULL, &handle), ORB_EINVAL);
    const struct orb_dl_symbol far[] = {{"strlen", SIZE_MAX - 2, true}};
    assert_int_equal(orb_dl_open("test", "libc.so.6", far, 1, &c, sizeof c, NULL, &handle), ORB_EINVAL);
    assert_null(handle);
}

static void test_groups(void **state)
{
    (void)state;
    struct calls c;
    memset(&c, 0, sizeof c);
    void *handle = NULL;
    assert_int_equal(orb_dl_open("test", "libc.so.6", present, 1, &c, sizeof c, NULL, &handle), 0);

    const struct orb_dl_symbol group[] = {
        {"memset", offsetof(struct calls, memset_fn), true},
        {"orb_no_such_export", offsetof(struct calls, absent_fn), true},
    };
    const char *missing = NULL;
    assert_false(orb_dl_group(handle, group, 2, &c, &missing));
    assert_string_equal(missing, "orb_no_such_export");
    assert_null(c.memset_fn); /* none of a group that is not whole */
    assert_true(orb_dl_group(handle, group, 1, &c, &missing));
    assert_non_null(c.memset_fn);

    struct orb_dl_symbol too_many[17];
    for (size_t i = 0; i < 17; i++)
        too_many[i] = (struct orb_dl_symbol){"strlen", offsetof(struct calls, strlen_fn), true};
    assert_false(orb_dl_group(handle, too_many, 17, &c, NULL));
    assert_false(orb_dl_group(NULL, group, 1, &c, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_a_library_that_is_not_there),
        cmocka_unit_test(test_one_missing_is_none),
        cmocka_unit_test(test_every_required_symbol),
        cmocka_unit_test(test_groups),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
