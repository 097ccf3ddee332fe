/* The libibverbs loader: every required export or none, optional exports when present, one
 * table per process, and clear errors naming the library and the missing export. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <string.h>

#include <orbite/orbite.h>

#include "core/error.h"
#include "rdma/verbs.h"

/* Every required field of the table, for "all set" checks. */
static bool all_required_set(const struct orb_verbs *v)
{
    return v->get_device_list && v->free_device_list && v->get_device_name && v->get_device_guid &&
           v->open_device && v->close_device && v->query_device && v->query_port_compat && v->query_gid &&
           v->alloc_pd && v->dealloc_pd && v->reg_mr_iova2 && v->dereg_mr && v->create_comp_channel &&
           v->destroy_comp_channel && v->create_cq && v->destroy_cq && v->get_cq_event && v->ack_cq_events &&
           v->create_qp && v->modify_qp && v->query_qp && v->destroy_qp && v->get_async_event &&
           v->ack_async_event && v->wc_status_str;
}

static void test_bad_arguments(void **state)
{
    (void)state;
    struct orb_verbs v;
    assert_int_equal(orb_verbs_load(NULL, &v), ORB_EINVAL);
    assert_int_equal(orb_verbs_load(FAKE_VERBS_FULL, NULL), ORB_EINVAL);
    assert_int_equal(orb_verbs_get(NULL), ORB_EINVAL);
    struct ibv_port_attr attr;
    assert_int_equal(orb_verbs_query_port(NULL, NULL, 1, &attr), EINVAL);
}

static void test_absent_library_names_itself(void **state)
{
    (void)state;
    struct orb_verbs v;
    memset(&v, 0x5a, sizeof v);
    struct orb_verbs before = v;
    assert_int_equal(orb_verbs_load("/nonexistent/libibverbs.so.1", &v), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "/nonexistent/libibverbs.so.1"));
    assert_memory_equal(&v, &before, sizeof v); /* written only on success */
}

static void test_missing_required_export_refuses_the_whole_library(void **state)
{
    (void)state;
    struct orb_verbs v;
    memset(&v, 0x5a, sizeof v);
    struct orb_verbs before = v;
    assert_int_equal(orb_verbs_load(FAKE_VERBS_MISSING, &v), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "ibv_reg_mr_iova2"));
    assert_non_null(strstr(orb_last_error(), FAKE_VERBS_MISSING));
    assert_memory_equal(&v, &before, sizeof v);
}

static void test_required_only_library_loads_without_optional_exports(void **state)
{
    (void)state;
    struct orb_verbs v;
    assert_int_equal(orb_verbs_load(FAKE_VERBS_FULL, &v), 0);
    assert_true(all_required_set(&v));
    assert_null(v.import_device);
    assert_null(v.reg_dmabuf_mr);
    assert_null(v.query_gid_ex);
    /* The addresses are the library's own exports. */
    void *h = dlopen(FAKE_VERBS_FULL, RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    void *want = dlsym(h, "ibv_create_qp");
    void *got = NULL;
    memcpy(&got, &v.create_qp, sizeof got);
    assert_ptr_equal(got, want);
    dlclose(h);
}

static void test_optional_exports_are_resolved_when_present(void **state)
{
    (void)state;
    struct orb_verbs v;
    assert_int_equal(orb_verbs_load(FAKE_VERBS_OPTIONAL, &v), 0);
    assert_true(all_required_set(&v));
    assert_non_null(v.import_device);
    assert_non_null(v.reg_dmabuf_mr);
    assert_non_null(v.query_gid_ex);
}

/* The process's table: the real libibverbs.so.1 where rdma-core is installed, loaded once. */
static void test_process_table_is_loaded_once(void **state)
{
    (void)state;
    assert_false(orb_verbs_attempted());
    const struct orb_verbs *a = NULL, *b = NULL;
    int rc = orb_verbs_get(&a);
    assert_true(orb_verbs_attempted());
    void *probe = dlopen(ORB_VERBS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (probe == NULL) {
        /* No rdma-core here: the failure names the library, and stays the same. */
        assert_int_equal(rc, ORB_EUNAVAILABLE);
        assert_non_null(strstr(orb_last_error(), ORB_VERBS_LIBRARY));
        assert_int_equal(orb_verbs_get(&b), ORB_EUNAVAILABLE);
        assert_null(b);
        return;
    }
    dlclose(probe);
    assert_int_equal(rc, 0);
    assert_non_null(a);
    assert_true(all_required_set(a));
    assert_int_equal(orb_verbs_get(&b), 0);
    assert_ptr_equal(a, b);
    /* The optional exports are there exactly when this rdma-core has them. */
    void *h = dlopen(ORB_VERBS_LIBRARY, RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    assert_true((dlsym(h, "ibv_import_device") != NULL) == (a->import_device != NULL));
    assert_true((dlsym(h, "ibv_reg_dmabuf_mr") != NULL) == (a->reg_dmabuf_mr != NULL));
    assert_true((dlsym(h, "_ibv_query_gid_ex") != NULL) == (a->query_gid_ex != NULL));
    dlclose(h);
    /* The providers answer through the table: no device is required, a list (maybe empty) is. */
    int n = -1;
    struct ibv_device **list = a->get_device_list(&n);
    if (list != NULL) {
        assert_true(n >= 0);
        for (int i = 0; i < n; i++)
            assert_non_null(a->get_device_name(list[i]));
        a->free_device_list(list);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_absent_library_names_itself),
        cmocka_unit_test(test_missing_required_export_refuses_the_whole_library),
        cmocka_unit_test(test_required_only_library_loads_without_optional_exports),
        cmocka_unit_test(test_optional_exports_are_resolved_when_present),
        cmocka_unit_test(test_process_table_is_loaded_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
