/* TENT priority matrices: TENT's own vectors, every validation rule of both JSON forms, file
 * handling, the configuration precedence, form equivalence, a property test over random
 * matrices and concurrent lookups on a frozen matrix. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/error.h"
#include "fixture.h"
#include "topo/location.h"
#include "topo/matrix.h"

static struct orb_topo_inventory inv;

/* ---- helpers ---------------------------------------------------------------------------------- */

static struct orb_location loc_of(const char *text)
{
    struct orb_location loc;
    if (orb_location_parse(text, &loc) != 0)
        fail_msg("bad test location %s", text);
    return loc;
}

static struct orb_topo_ranks *compile_with(const char *json, unsigned accept,
                                           const struct orb_topo_inventory *with, uint64_t eligible)
{
    struct orb_topo_ranks *ranks = NULL;
    int rc = orb_topo_ranks_parse(json, strlen(json), accept, "priority_matrix", with, eligible,
                                  &ranks);
    if (rc != 0)
        fail_msg("compile failed (%d): %s\n  input: %.300s", rc, orb_last_error(), json);
    assert_non_null(ranks);
    return ranks;
}

static struct orb_topo_ranks *compile_ok(const char *json)
{
    return compile_with(json, ORB_MATRIX_ACCEPT_ANY, &inv, FIXTURE_ELIGIBLE);
}

/* The input must fail with ORB_ECONFIG, leave the out-parameter alone, and say every needle. */
static void expect_bad_with(const char *json, size_t len, unsigned accept, const char *needle1,
                            const char *needle2)
{
    struct orb_topo_ranks *sentinel = (struct orb_topo_ranks *)&inv;
    struct orb_topo_ranks *ranks = sentinel;
    orb_clear_error();
    int rc = orb_topo_ranks_parse(json, len, accept, "priority_matrix", &inv, FIXTURE_ELIGIBLE,
                                  &ranks);
    if (rc != ORB_ECONFIG)
        fail_msg("expected ORB_ECONFIG, got %d for: %.300s", rc, json);
    assert_ptr_equal(ranks, sentinel);
    const char *msg = orb_last_error();
    if (strncmp(msg, "priority_matrix: ", 17) != 0)
        fail_msg("message does not name the input: %s", msg);
    if (needle1 && !strstr(msg, needle1))
        fail_msg("message \"%s\" lacks \"%s\"", msg, needle1);
    if (needle2 && !strstr(msg, needle2))
        fail_msg("message \"%s\" lacks \"%s\"", msg, needle2);
}

static void expect_bad(const char *json, const char *needle1, const char *needle2)
{
    expect_bad_with(json, strlen(json), ORB_MATRIX_ACCEPT_ANY, needle1, needle2);
}

static const struct orb_topo_rank_row *row_of(const struct orb_topo_ranks *ranks, const char *loc)
{
    return orb_topo_ranks_row(ranks, loc_of(loc));
}

/* Rank list `rank` of `row` must be exactly ids[0..n). */
static void assert_rank_list(const struct orb_topo_rank_row *row, unsigned rank,
                             const uint8_t *ids, unsigned n)
{
    assert_non_null(row);
    if (row->count[rank] != n)
        fail_msg("rank %u has %u entries, expected %u", rank, row->count[rank], n);
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(row->nics[rank][i], ids[i]);
}

/* The invariants every compiled row keeps, whatever the input. */
static void assert_row_consistent(const struct orb_topo_rank_row *row, uint64_t eligible)
{
    uint64_t from_lists = 0;
    for (unsigned r = 0; r < ORB_TOPO_RANKS; r++) {
        assert_true(row->count[r] <= ORB_TOPO_MAX_NICS);
        for (unsigned i = 0; i < row->count[r]; i++) {
            uint8_t id = row->nics[r][i];
            assert_true(id < ORB_TOPO_MAX_NICS);
            assert_true(row->rank[id] <= r); /* the effective rank is the lowest listing */
            from_lists |= UINT64_C(1) << id;
        }
    }
    assert_true(row->listed == from_lists);
    assert_true((row->listed & ~eligible) == 0);
    for (unsigned id = 0; id < ORB_TOPO_MAX_NICS; id++) {
        int listed = (row->listed >> id) & 1;
        assert_int_equal(listed, row->rank[id] != ORB_TOPO_RANK_NONE);
        if (listed) {
            /* rank[id] is a rank in whose list id appears */
            unsigned r = row->rank[id];
            int found = 0;
            for (unsigned i = 0; i < row->count[r]; i++)
                found |= row->nics[r][i] == id;
            assert_true(found);
        }
    }
}

/* Two compiled matrices give every location the same rank[] and listed set. */
static void assert_same_ranks(const struct orb_topo_ranks *a, const struct orb_topo_ranks *b)
{
    for (unsigned kind = ORB_LOC_ANY; kind <= ORB_LOC_CUDA; kind++) {
        unsigned last = kind == ORB_LOC_ANY ? 0 : 63;
        for (unsigned i = 0; i <= last; i++) {
            struct orb_location loc = {(uint8_t)kind, (uint8_t)i};
            const struct orb_topo_rank_row *ra = orb_topo_ranks_row(a, loc);
            const struct orb_topo_rank_row *rb = orb_topo_ranks_row(b, loc);
            if (!ra || !rb) {
                assert_ptr_equal(ra, rb);
                continue;
            }
            assert_memory_equal(ra->rank, rb->rank, ORB_TOPO_MAX_NICS);
            assert_true(ra->listed == rb->listed);
        }
    }
}

/* A growable text buffer for generated documents. */
struct text {
    char *buf;
    size_t len, cap;
};

__attribute__((format(printf, 2, 3))) static void text_add(struct text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        assert_true(n >= 0);
        if (t->buf && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->len + (size_t)n + 1)
            cap *= 2;
        t->buf = realloc(t->buf, cap);
        assert_non_null(t->buf);
        t->cap = cap;
    }
}

static const char *tmp_base(void)
{
    const char *dir = getenv("TMPDIR");
    return dir && dir[0] ? dir : "/tmp";
}

/* A scratch directory per test that needs files; removed with its files by remove_tree. */
static void make_scratch(char *dir, size_t len)
{
    snprintf(dir, len, "%s/orb-matrix-XXXXXX", tmp_base());
    assert_non_null(mkdtemp(dir));
}

static void write_file(const char *path, const char *content, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(content, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void remove_tree(const char *dir, const char *const *names)
{
    char path[4096];
    for (size_t i = 0; names[i]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
        rmdir(path);
    }
    assert_int_equal(rmdir(dir), 0);
}

static int setup(void **state)
{
    (void)state;
    fixture_inventory(&inv);
    return 0;
}

/* ---- TENT's vectors --------------------------------------------------------------------------- */

#define TENT_MATRIX                                                                                \
    "{\"cpu:0\":[[\"mlx5_0\"],[\"mlx5_1\"]],\"cpu:1\":[[\"mlx5_1\"],[\"mlx5_0\"]],"                 \
    "\"cuda:0\":[[\"mlx5_0\"],[\"mlx5_1\"]]}"

static void test_tent_rejected_inputs(void **state)
{
    (void)state;
    expect_bad("", "(document)", "empty");
    expect_bad("{\"cpu:0\":[[\"mlx5_0\"]]}", "key \"cpu:0\"", "[[preferred NIC names]");
    expect_bad("{\"cpu:0\":\"mlx5_0\"}", "key \"cpu:0\"", "not a string");
    expect_bad("{\"cpu:0\":[[1],[\"mlx5_1\"]]}", "key \"cpu:0\" rank 0 entry 0",
               "must be a string, not an integer");
}

static void test_tent_accepted_matrix(void **state)
{
    (void)state;
    struct orb_topo_ranks *ranks = compile_ok(TENT_MATRIX);
    assert_int_equal(orb_topo_ranks_form(ranks), ORB_MATRIX_CLASSIC);

    const struct orb_topo_rank_row *cpu0 = row_of(ranks, "cpu:0");
    assert_int_equal(cpu0->origin, ORB_ROW_LISTED);
    assert_rank_list(cpu0, 0, (const uint8_t[]){0}, 1);
    assert_rank_list(cpu0, 1, (const uint8_t[]){1}, 1);
    assert_rank_list(cpu0, 2, NULL, 0);
    assert_int_equal(cpu0->rank[0], 0);
    assert_int_equal(cpu0->rank[1], 1);
    assert_int_equal(cpu0->rank[2], ORB_TOPO_RANK_NONE);

    const struct orb_topo_rank_row *cpu1 = row_of(ranks, "cpu:1");
    assert_rank_list(cpu1, 0, (const uint8_t[]){1}, 1);
    assert_rank_list(cpu1, 1, (const uint8_t[]){0}, 1);

    const struct orb_topo_rank_row *cuda0 = row_of(ranks, "cuda:0");
    assert_int_equal(cuda0->origin, ORB_ROW_LISTED);
    assert_rank_list(cuda0, 0, (const uint8_t[]){0}, 1);
    assert_rank_list(cuda0, 1, (const uint8_t[]){1}, 1);

    /* TENT: "*" rank0 [0, 1], rank1 [1, 0]. */
    const struct orb_topo_rank_row *any = row_of(ranks, "*");
    assert_int_equal(any->origin, ORB_ROW_SYNTHESIZED);
    assert_rank_list(any, 0, (const uint8_t[]){0, 1}, 2);
    assert_rank_list(any, 1, (const uint8_t[]){1, 0}, 2);
    assert_int_equal(any->rank[0], 0);
    assert_int_equal(any->rank[1], 0);
    assert_int_equal(any->rank[2], ORB_TOPO_RANK_NONE);
    assert_row_consistent(any, FIXTURE_ELIGIBLE);

    /* Unlisted locations are governed by "*". */
    assert_ptr_equal(row_of(ranks, "cuda:1"), any);
    assert_ptr_equal(row_of(ranks, "cpu:9"), any);

    uint8_t rank[ORB_TOPO_MAX_NICS];
    assert_int_equal(orb_topo_ranks_lookup(ranks, loc_of("cpu:1"), rank), 0);
    assert_int_equal(rank[0], 1);
    assert_int_equal(rank[1], 0);
    for (unsigned i = 2; i < ORB_TOPO_MAX_NICS; i++)
        assert_int_equal(rank[i], ORB_TOPO_RANK_NONE);
    orb_topo_ranks_free(ranks);
}

/* ---- classic-form rules ----------------------------------------------------------------------- */

static void test_null_and_bad_arguments(void **state)
{
    (void)state;
    struct orb_topo_ranks *ranks = NULL;
    const char *m = TENT_MATRIX;
    assert_int_equal(orb_topo_ranks_parse(NULL, 1, ORB_MATRIX_ACCEPT_ANY, "x", &inv, 1, &ranks),
                     ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_parse(m, strlen(m), ORB_MATRIX_ACCEPT_ANY, NULL, &inv, 1,
                                          &ranks),
                     ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_parse(m, strlen(m), ORB_MATRIX_ACCEPT_ANY, "x", NULL, 1,
                                          &ranks),
                     ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_parse(m, strlen(m), ORB_MATRIX_ACCEPT_ANY, "x", &inv, 1, NULL),
                     ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_parse(m, strlen(m), 0, "x", &inv, 1, &ranks), ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_parse(m, strlen(m), 1u << 5, "x", &inv, 1, &ranks),
                     ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_read_file(NULL, &inv, 1, &ranks), ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_read_file("x", NULL, 1, &ranks), ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_read_file("x", &inv, 1, NULL), ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_load(NULL, NULL, NULL, 1, &ranks), ORB_EINVAL);
    assert_int_equal(orb_topo_ranks_load(NULL, NULL, &inv, 1, NULL), ORB_EINVAL);
    assert_null(ranks);
    uint8_t rank[ORB_TOPO_MAX_NICS];
    assert_int_equal(orb_topo_ranks_lookup(NULL, loc_of("*"), rank), ORB_EINVAL);
    assert_null(orb_topo_ranks_row(NULL, loc_of("*")));
    assert_int_equal(orb_topo_ranks_form(NULL), ORB_EINVAL);
    orb_topo_ranks_free(NULL);
}

static void test_wrong_json_types(void **state)
{
    (void)state;
    expect_bad("[]", "(document)", "must be a JSON object, not an array");
    expect_bad("\"cpu:0\"", "(document)", "not a string");
    expect_bad("42", "(document)", "not an integer");
    expect_bad("null", "(document)", "not null");
    expect_bad("{\"cpu:0\":{}}", "key \"cpu:0\"", "not an object");
    expect_bad("{\"cpu:0\":null}", "key \"cpu:0\"", "not null");
    expect_bad("{\"cpu:0\":[]}", "key \"cpu:0\"", "0 element(s)");
    expect_bad("{\"cpu:0\":[[],[],[]]}", "key \"cpu:0\"", "3 element(s)");
    expect_bad("{\"cpu:0\":[[],\"mlx5_0\"]}", "key \"cpu:0\"", "not two lists");
    expect_bad("{\"cpu:0\":[[\"mlx5_0\"],[null]]}", "key \"cpu:0\" rank 1 entry 0", "not null");
    expect_bad("{\"cpu:0\":[[[\"mlx5_0\"]],[]]}", "rank 0 entry 0", "not an array");
    expect_bad("{\"cpu:0\":[[true],[]]}", "rank 0 entry 0", "not a boolean");
    expect_bad("{\"cpu:0\":[[1.5],[]]}", "rank 0 entry 0", "not a real number");
}

static void test_invalid_json_syntax(void **state)
{
    (void)state;
    expect_bad("{\"cpu:0\": [[\"mlx5_0\"], [\"mlx5_1\"]]", "(document)", "invalid JSON at line 1");
    expect_bad("{\n\"cpu:0\": [[\"mlx5_0\"],, []]}", "(document)", "line 2");
    expect_bad("   ", "(document)", "invalid JSON");
    expect_bad("{} {}", "(document)", "invalid JSON");
    expect_bad("{\"cpu:0\": [[\"mlx5_\\u0000\"], []]}", "(document)", "invalid JSON");
    /* A NUL byte inside the buffer is not the end of the document. */
    static const char with_nul[] = "{\"cpu:0\":[[\"mlx5_0\"],[]]}\0garbage";
    expect_bad_with(with_nul, sizeof with_nul - 1, ORB_MATRIX_ACCEPT_ANY, "invalid JSON", NULL);
    /* Invalid UTF-8. */
    expect_bad("{\"cpu:0\":[[\"mlx5\xff\"],[]]}", "(document)", "invalid JSON");
}

static void test_duplicate_json_keys(void **state)
{
    (void)state;
    expect_bad("{\"cpu:0\":[[\"mlx5_0\"],[]],\"cpu:0\":[[\"mlx5_1\"],[]]}", "(document)",
               "duplicate");
}

static void test_empty_matrix_refused(void **state)
{
    (void)state;
    expect_bad("{}", "(document)", "lists no location");
    expect_bad(" { } ", "(document)", "lists no location");
}

static void test_names_must_be_usable_and_eligible(void **state)
{
    (void)state;
    expect_bad("{\"cpu:0\":[[\"mlx5_9\"],[]]}", "key \"cpu:0\" rank 0 entry 0",
               "\"mlx5_9\" is not in the discovered inventory");
    expect_bad("{\"cpu:0\":[[\"mlx5_0\"],[\"mlx5_3\"]]}", "key \"cpu:0\" rank 1 entry 0",
               "\"mlx5_3\" failed discovery");
    expect_bad("{\"cpu:0\":[[\"mlx5_0\",\"mlx5_4\"],[]]}", "key \"cpu:0\" rank 0 entry 1",
               "\"mlx5_4\" is excluded by the NIC filters");
    expect_bad("{\"cpu:0\":[[\"MLX5_0\"],[]]}", NULL, "not in the discovered inventory");
    expect_bad("{\"cpu:0\":[[\"\"],[]]}", NULL, "not in the discovered inventory");
    expect_bad("{\"cpu:0\":[[\"mlx5_0 \"],[]]}", NULL, "not in the discovered inventory");
    /* A name as long as the inventory field cannot match a truncated inventory name. */
    char json[512];
    char longname[ORB_TOPO_NAME_MAX + 40];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    snprintf(json, sizeof json, "{\"cpu:0\":[[\"%s\"],[]]}", longname);
    expect_bad(json, "not in the discovered inventory", "...");
    /* A control character in a name is shown, not printed raw. */
    expect_bad("{\"cpu:0\":[[\"mlx\\n5\"],[]]}", "\"mlx?5\"", NULL);

    /* The same matrix is accepted once mlx5_4 is eligible. */
    struct orb_topo_ranks *ranks = compile_with("{\"cpu:0\":[[\"mlx5_0\",\"mlx5_4\"],[]]}",
                                                ORB_MATRIX_ACCEPT_ANY, &inv, UINT64_C(0x1f));
    assert_int_equal(row_of(ranks, "cpu:0")->rank[4], 0);
    orb_topo_ranks_free(ranks);
}

static void test_duplicate_names_in_one_row(void **state)
{
    (void)state;
    expect_bad("{\"cpu:0\":[[\"mlx5_0\",\"mlx5_0\"],[]]}", "key \"cpu:0\" rank 0 entry 1",
               "\"mlx5_0\" is listed twice for this location (already rank 0)");
    expect_bad("{\"cpu:0\":[[\"mlx5_0\"],[\"mlx5_1\",\"mlx5_0\"]]}", "key \"cpu:0\" rank 1 entry 1",
               "listed twice");
    /* The same NIC in different rows is fine. */
    struct orb_topo_ranks *ranks =
        compile_ok("{\"cpu:0\":[[\"mlx5_0\"],[]],\"cpu:1\":[[\"mlx5_0\"],[]]}");
    orb_topo_ranks_free(ranks);
}

static void test_location_keys(void **state)
{
    (void)state;
    expect_bad("{\"gpu:0\":[[\"mlx5_0\"],[]]}", "key \"gpu:0\"", "expected \"cpu:N\"");
    expect_bad("{\"cpu:01\":[[\"mlx5_0\"],[]]}", "key \"cpu:01\"", "leading zero");
    expect_bad("{\"cpu: 0\":[[\"mlx5_0\"],[]]}", "key \"cpu: 0\"", "digits only");
    expect_bad("{\"cuda:2\":[[\"mlx5_0\"],[]]}", "key \"cuda:2\"",
               "cuda:2 is not a discovered GPU (2 discovered)");
    expect_bad("{\"cuda:64\":[[\"mlx5_0\"],[]]}", "key \"cuda:64\"", "over the maximum");
    expect_bad("{\"cpu:2\":[[\"mlx5_0\"],[]]}", "key \"cpu:2\"", "not a discovered NUMA node");
    expect_bad("{\"\":[[\"mlx5_0\"],[]]}", "key \"\"", "expected");

    /* Without NUMA data the host has one implicit node, 0; without GPUs no cuda:N exists. */
    struct orb_topo_inventory flat = inv;
    flat.nnuma = 0;
    flat.ngpus = 0;
    struct orb_topo_ranks *ranks = compile_with("{\"cpu:0\":[[\"mlx5_0\"],[]]}",
                                                ORB_MATRIX_ACCEPT_ANY, &flat, FIXTURE_ELIGIBLE);
    orb_topo_ranks_free(ranks);
    struct orb_topo_ranks *out = NULL;
    const char *cpu1 = "{\"cpu:1\":[[\"mlx5_0\"],[]]}";
    assert_int_equal(orb_topo_ranks_parse(cpu1, strlen(cpu1), ORB_MATRIX_ACCEPT_ANY, "m", &flat,
                                          FIXTURE_ELIGIBLE, &out),
                     ORB_ECONFIG);
    const char *cuda0 = "{\"cuda:0\":[[\"mlx5_0\"],[]]}";
    assert_int_equal(orb_topo_ranks_parse(cuda0, strlen(cuda0), ORB_MATRIX_ACCEPT_ANY, "m", &flat,
                                          FIXTURE_ELIGIBLE, &out),
                     ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "(0 discovered)"));
    assert_null(out);

    /* NUMA ids and CUDA ordinals are matched by value, not by position. */
    struct orb_topo_inventory sparse = inv;
    sparse.numa[1].id = 3;
    sparse.gpus[1].ordinal = 5;
    ranks = compile_with("{\"cpu:3\":[[\"mlx5_0\"],[]],\"cuda:5\":[[\"mlx5_1\"],[]]}",
                         ORB_MATRIX_ACCEPT_ANY, &sparse, FIXTURE_ELIGIBLE);
    assert_int_equal(row_of(ranks, "cpu:3")->origin, ORB_ROW_LISTED);
    assert_int_equal(row_of(ranks, "cuda:5")->origin, ORB_ROW_LISTED);
    orb_topo_ranks_free(ranks);
}

static void test_empty_row_disables_location(void **state)
{
    (void)state;
    struct orb_topo_ranks *ranks =
        compile_ok("{\"cpu:0\":[[],[]],\"cuda:0\":[[],[\"mlx5_2\"]],\"cpu:1\":[[\"mlx5_1\"],[]]}");
    const struct orb_topo_rank_row *cpu0 = row_of(ranks, "cpu:0");
    assert_int_equal(cpu0->origin, ORB_ROW_LISTED);
    assert_true(cpu0->listed == 0);
    for (unsigned i = 0; i < ORB_TOPO_MAX_NICS; i++)
        assert_int_equal(cpu0->rank[i], ORB_TOPO_RANK_NONE);
    /* An empty rank 0 alone does not disable: rank 1 serves. */
    const struct orb_topo_rank_row *cuda0 = row_of(ranks, "cuda:0");
    assert_int_equal(cuda0->rank[2], 1);
    assert_true(cuda0->listed == UINT64_C(1) << 2);
    /* The disabled row contributes nothing to "*". */
    const struct orb_topo_rank_row *any = row_of(ranks, "cuda:1");
    assert_int_equal(any->origin, ORB_ROW_SYNTHESIZED);
    assert_rank_list(any, 0, (const uint8_t[]){1}, 1);
    assert_rank_list(any, 1, (const uint8_t[]){2}, 1);
    orb_topo_ranks_free(ranks);

    /* Every row disabled: "*" is synthesised empty, so every location is disabled. */
    ranks = compile_ok("{\"cpu:0\":[[],[]]}");
    assert_true(row_of(ranks, "*")->listed == 0);
    assert_true(row_of(ranks, "cuda:1")->listed == 0);
    orb_topo_ranks_free(ranks);
}

static void test_explicit_wildcard_row(void **state)
{
    (void)state;
    struct orb_topo_ranks *ranks =
        compile_ok("{\"*\":[[\"mlx5_2\"],[\"mlx5_0\"]],\"cpu:0\":[[\"mlx5_1\"],[]]}");
    const struct orb_topo_rank_row *any = row_of(ranks, "*");
    assert_int_equal(any->origin, ORB_ROW_WILDCARD);
    assert_rank_list(any, 0, (const uint8_t[]){2}, 1);
    assert_rank_list(any, 1, (const uint8_t[]){0}, 1);
    assert_true(any->listed == ((UINT64_C(1) << 2) | 1u)); /* mlx5_1 of cpu:0 is not added */
    assert_ptr_equal(row_of(ranks, "cpu:1"), any);
    assert_ptr_equal(row_of(ranks, "cuda:0"), any);
    assert_int_equal(row_of(ranks, "cpu:0")->origin, ORB_ROW_LISTED);
    orb_topo_ranks_free(ranks);

    /* An explicit empty "*" disables every unlisted location. */
    ranks = compile_ok("{\"*\":[[],[]],\"cpu:0\":[[\"mlx5_1\"],[]]}");
    assert_true(row_of(ranks, "cuda:0")->listed == 0);
    assert_int_equal(row_of(ranks, "cuda:0")->origin, ORB_ROW_WILDCARD);
    orb_topo_ranks_free(ranks);

    /* A duplicate NIC inside "*" is refused like any row. */
    expect_bad("{\"*\":[[\"mlx5_0\"],[\"mlx5_0\"]]}", "key \"*\" rank 1 entry 0", "listed twice");
}

/* Synthesis walks rows in document order and lists left to right, first appearance wins. */
static void test_wildcard_synthesis_order(void **state)
{
    (void)state;
    struct orb_topo_ranks *ranks = compile_ok(
        "{\"cuda:1\":[[\"mlx5_2\",\"mlx5_0\"],[\"mlx5_1\"]],"
        "\"cpu:0\":[[\"mlx5_1\"],[\"mlx5_2\"]],"
        "\"cpu:1\":[[\"mlx5_1\"],[\"mlx5_0\",\"mlx5_2\"]]}");
    const struct orb_topo_rank_row *any = row_of(ranks, "*");
    assert_int_equal(any->origin, ORB_ROW_SYNTHESIZED);
    assert_rank_list(any, 0, (const uint8_t[]){2, 0, 1}, 3);
    assert_rank_list(any, 1, (const uint8_t[]){1, 2, 0}, 3);
    assert_int_equal(any->rank[0], 0);
    assert_int_equal(any->rank[1], 0);
    assert_int_equal(any->rank[2], 0);
    assert_row_consistent(any, FIXTURE_ELIGIBLE);
    orb_topo_ranks_free(ranks);

    /* A NIC only ever in rank 1 keeps rank 1 in "*". */
    ranks = compile_ok("{\"cpu:0\":[[\"mlx5_0\"],[\"mlx5_2\"]]}");
    any = row_of(ranks, "*");
    assert_int_equal(any->rank[0], 0);
    assert_int_equal(any->rank[2], 1);
    assert_int_equal(any->rank[1], ORB_TOPO_RANK_NONE);
    orb_topo_ranks_free(ranks);
}

static void test_size_limit(void **state)
{
    (void)state;
    /* Exactly 1 MiB (a valid matrix padded with whitespace) is accepted; one byte more is not. */
    const char *core = "{\"cpu:0\":[[\"mlx5_0\"],[]]}";
    size_t max = ORB_TOPO_MATRIX_MAX_BYTES;
    char *big = malloc(max + 2);
    assert_non_null(big);
    memset(big, ' ', max + 1);
    memcpy(big, core, strlen(core));
    big[max + 1] = '\0';
    struct orb_topo_ranks *ranks = NULL;
    assert_int_equal(orb_topo_ranks_parse(big, max, ORB_MATRIX_ACCEPT_ANY, "priority_matrix", &inv,
                                          FIXTURE_ELIGIBLE, &ranks),
                     0);
    orb_topo_ranks_free(ranks);
    expect_bad_with(big, max + 1, ORB_MATRIX_ACCEPT_ANY, "1048577 bytes", "1048576-byte limit");

    /* The inline string through the configuration entry point: same bound, no full walk. */
    ranks = NULL;
    big[max] = '\0';
    assert_int_equal(orb_topo_ranks_load(big, NULL, &inv, FIXTURE_ELIGIBLE, &ranks), 0);
    orb_topo_ranks_free(ranks);
    big[max] = ' ';
    ranks = NULL;
    assert_int_equal(orb_topo_ranks_load(big, NULL, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_null(ranks);
    assert_non_null(strstr(orb_last_error(), "over the 1048576-byte limit"));
    free(big);
}

static void test_deep_nesting_refused(void **state)
{
    (void)state;
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 1);
    assert_non_null(deep);
    memset(deep, '[', depth);
    memset(deep + depth, ']', depth);
    deep[2 * depth] = '\0';
    expect_bad(deep, "(document)", "invalid JSON");
    free(deep);
}

/* ---- native form ------------------------------------------------------------------------------ */

#define NATIVE_SPEC                                                                                \
    "{\"nics\":[{\"name\":\"mlx5_1\",\"type\":0},{\"name\":\"mlx5_0\",\"type\":0}],"               \
    "\"mems\":[{\"name\":\"cuda:0\",\"type\":1,"                                                   \
    "\"device_list\":{\"rank0\":[0],\"rank1\":[1],\"rank2\":[]}}]}"

static void test_native_spec_example(void **state)
{
    (void)state;
    struct orb_topo_ranks *ranks = compile_ok(NATIVE_SPEC);
    assert_int_equal(orb_topo_ranks_form(ranks), ORB_MATRIX_NATIVE);
    const struct orb_topo_rank_row *cuda0 = row_of(ranks, "cuda:0");
    assert_int_equal(cuda0->origin, ORB_ROW_LISTED);
    /* Indices refer to the file's order: 0 is mlx5_1 (id 1), 1 is mlx5_0 (id 0). */
    assert_rank_list(cuda0, 0, (const uint8_t[]){1}, 1);
    assert_rank_list(cuda0, 1, (const uint8_t[]){0}, 1);
    assert_rank_list(cuda0, 2, NULL, 0);
    /* The native form never synthesises "*": other locations have no row. */
    assert_null(row_of(ranks, "cuda:1"));
    assert_null(row_of(ranks, "*"));
    uint8_t rank[ORB_TOPO_MAX_NICS];
    memset(rank, 7, sizeof rank);
    assert_int_equal(orb_topo_ranks_lookup(ranks, loc_of("cpu:0"), rank), ORB_ENOENT);
    assert_non_null(strstr(orb_last_error(), "no row for cpu:0"));
    assert_int_equal(rank[0], 7);
    orb_topo_ranks_free(ranks);
}

static void test_native_three_ranks_and_wildcard(void **state)
{
    (void)state;
    struct orb_topo_ranks *ranks = compile_ok(
        "{\"mems\":[{\"name\":\"*\",\"type\":4,\"device_list\":{\"rank2\":[2],\"rank0\":[0]}},"
        "{\"name\":\"cpu:1\",\"device_list\":{\"rank0\":[1,0],\"rank2\":[2]}},"
        "{\"name\":\"cpu:0\",\"device_list\":{}}],"
        "\"nics\":[{\"name\":\"mlx5_2\"},{\"name\":\"mlx5_1\",\"pci_bus_id\":\"0000:3b:00.0\","
        "\"numa_node\":-1,\"device_attrs\":{\"k\":\"v\"}},{\"name\":\"mlx5_0\",\"numa_node\":7}]}");
    const struct orb_topo_rank_row *any = row_of(ranks, "*");
    assert_int_equal(any->origin, ORB_ROW_WILDCARD);
    assert_int_equal(any->rank[2], 0);
    assert_int_equal(any->rank[0], 2);
    assert_ptr_equal(row_of(ranks, "cuda:0"), any);
    const struct orb_topo_rank_row *cpu1 = row_of(ranks, "cpu:1");
    assert_rank_list(cpu1, 0, (const uint8_t[]){1, 2}, 2);
    assert_rank_list(cpu1, 2, (const uint8_t[]){0}, 1);
    assert_int_equal(cpu1->rank[1], 0);
    assert_int_equal(cpu1->rank[0], 2);
    /* No rank at all: disabled, and "*" does not step in. */
    assert_true(row_of(ranks, "cpu:0")->listed == 0);
    assert_int_equal(row_of(ranks, "cpu:0")->origin, ORB_ROW_LISTED);
    orb_topo_ranks_free(ranks);
}

static void test_native_rejections(void **state)
{
    (void)state;
#define NICS2 "\"nics\":[{\"name\":\"mlx5_0\"},{\"name\":\"mlx5_1\"}]"
#define MEM(body) "{" NICS2 ",\"mems\":[" body "]}"
    /* top level */
    expect_bad("{\"nics\":[]}", "(document)", "needs \"mems\"");
    expect_bad("{\"mems\":[]}", "(document)", "needs \"nics\"");
    expect_bad("{" NICS2 ",\"mems\":[],\"extra\":1}", "(document)", "unknown key \"extra\"");
    expect_bad("{" NICS2 ",\"mems\":[],\"cpu:0\":[[],[]]}", "(document)", "unknown key \"cpu:0\"");
    expect_bad("{\"nics\":{},\"mems\":[]}", "nics", "must be an array, not an object");
    expect_bad("{" NICS2 ",\"mems\":{}}", "mems", "must be an array, not an object");
    expect_bad("{" NICS2 ",\"mems\":[]}", "mems", "lists no location");
    /* nics entries */
    expect_bad("{\"nics\":[1],\"mems\":[]}", "nics[0]", "must be an object, not an integer");
    expect_bad("{\"nics\":[{}],\"mems\":[]}", "nics[0]", "\"name\" is missing");
    expect_bad("{\"nics\":[{\"name\":5}],\"mems\":[]}", "nics[0].name", "must be a string");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"speed\":1}],\"mems\":[]}", "nics[0]",
               "unknown key \"speed\"");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_9\"}],\"mems\":[]}", "nics[0].name",
               "not in the discovered inventory");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_4\"}],\"mems\":[]}", "nics[0].name", "excluded");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\"},{\"name\":\"mlx5_0\"}],\"mems\":[]}",
               "nics[1].name", "listed twice in \"nics\"");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"type\":1}],\"mems\":[]}", "nics[0]",
               "\"type\" is 1: only 0 (an RDMA NIC)");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"type\":\"0\"}],\"mems\":[]}", "nics[0]",
               "\"type\" must be an integer, not a string");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"type\":0.0}],\"mems\":[]}", "nics[0]",
               "not a real number");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"type\":4294967296}],\"mems\":[]}", "nics[0]",
               "outside");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"numa_node\":-2}],\"mems\":[]}", "nics[0]",
               "\"numa_node\" is -2, outside [-1, 2147483647]");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"numa_node\":2147483648}],\"mems\":[]}",
               "nics[0]", "outside");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"pci_bus_id\":1}],\"mems\":[]}", "nics[0]",
               "\"pci_bus_id\" must be a string");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"device_attrs\":[]}],\"mems\":[]}", "nics[0]",
               "\"device_attrs\" must be an object");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\",\"device_attrs\":{\"a\":1}}],\"mems\":[]}",
               "nics[0]", "value \"a\" must be a string");
    expect_bad("{\"nics\":[{\"name\":\"mlx5_0\"}],\"mems\":[{\"name\":\"cpu:0\","
               "\"device_list\":{\"rank0\":[0]},\"device_attrs\":{}}]}",
               "mems[0] (\"cpu:0\")", "unknown key \"device_attrs\"");
    /* mems entries */
    expect_bad(MEM("[]"), "mems[0]", "must be an object, not an array");
    expect_bad(MEM("{\"device_list\":{}}"), "mems[0]", "\"name\" is missing");
    expect_bad(MEM("{\"name\":0,\"device_list\":{}}"), "mems[0]", "must be a location string");
    expect_bad(MEM("{\"name\":\"gpu:0\",\"device_list\":{}}"), "mems[0] (\"gpu:0\")",
               "expected \"cpu:N\"");
    expect_bad(MEM("{\"name\":\"cuda:7\",\"device_list\":{}}"), "mems[0] (\"cuda:7\")",
               "not a discovered GPU");
    expect_bad(MEM("{\"name\":\"cpu:0\"}"), "mems[0] (\"cpu:0\")", "\"device_list\" is missing");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"device_list\":[]}"), "mems[0] (\"cpu:0\")",
               "\"device_list\" must be an object");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"device_list\":{\"rank3\":[0]}}"),
               "mems[0] (\"cpu:0\").device_list", "unknown key \"rank3\"");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"numa\":0,\"device_list\":{}}"), "mems[0] (\"cpu:0\")",
               "unknown key \"numa\"");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"device_list\":{\"rank0\":0}}"),
               "mems[0] (\"cpu:0\").device_list.rank0", "must be an array of NIC indices");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"device_list\":{\"rank0\":[2]}}"),
               "mems[0] (\"cpu:0\").device_list.rank0[0]",
               "NIC index 2 is outside \"nics\" (2 entries)");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"device_list\":{\"rank1\":[1,-1]}}"),
               "device_list.rank1[1]", "NIC index -1 is outside");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"device_list\":{\"rank0\":[\"mlx5_0\"]}}"),
               "device_list.rank0[0]", "must be an integer, not a string");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"device_list\":{\"rank0\":[0.0]}}"),
               "device_list.rank0[0]", "not a real number");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"device_list\":{\"rank0\":[0],\"rank2\":[0]}}"),
               "device_list.rank2[0]", "\"mlx5_0\" is listed twice for this location");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"device_list\":{}},{\"name\":\"cpu:0\",\"device_list\":{}}"),
               "mems[1] (\"cpu:0\")", "location cpu:0 is listed twice");
    expect_bad(MEM("{\"name\":\"*\",\"device_list\":{}},{\"name\":\"*\",\"device_list\":{}}"),
               "mems[1] (\"*\")", "location \"*\" is listed twice");
    /* memory types */
    expect_bad(MEM("{\"name\":\"cuda:0\",\"type\":0,\"device_list\":{}}"), "mems[0] (\"cuda:0\")",
               "\"type\" is 0 but cuda:0 memory is type 1");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"type\":1,\"device_list\":{}}"), NULL,
               "\"type\" is 1 but cpu:0 memory is type 0");
    expect_bad(MEM("{\"name\":\"*\",\"type\":0,\"device_list\":{}}"), NULL,
               "\"type\" is 0 but * memory is type 4");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"type\":2,\"device_list\":{}}"), NULL, "type 0");
    expect_bad(MEM("{\"name\":\"cpu:0\",\"type\":null,\"device_list\":{}}"), NULL,
               "\"type\" must be an integer, not null");
    /* more NICs than any inventory holds */
    struct text t = {0};
    text_add(&t, "{\"nics\":[");
    for (int i = 0; i <= ORB_TOPO_MAX_NICS; i++)
        text_add(&t, "%s{\"name\":\"mlx5_0\"}", i ? "," : "");
    text_add(&t, "],\"mems\":[]}");
    expect_bad(t.buf, "nics", "lists 65 NICs, more than the 64");
    free(t.buf);
#undef MEM
#undef NICS2
}

static void test_native_valid_types_accepted(void **state)
{
    (void)state;
    struct orb_topo_ranks *ranks = compile_ok(
        "{\"nics\":[{\"name\":\"mlx5_0\",\"type\":0}],\"mems\":["
        "{\"name\":\"cpu:0\",\"type\":0,\"numa_node\":0,\"pci_bus_id\":\"\",\"device_list\":"
        "{\"rank0\":[0]}},"
        "{\"name\":\"cuda:1\",\"type\":1,\"device_list\":{\"rank1\":[0]}},"
        "{\"name\":\"*\",\"type\":4,\"device_list\":{\"rank2\":[0]}}]}");
    assert_int_equal(row_of(ranks, "cpu:0")->rank[0], 0);
    assert_int_equal(row_of(ranks, "cuda:1")->rank[0], 1);
    assert_int_equal(row_of(ranks, "cuda:0")->rank[0], 2);
    orb_topo_ranks_free(ranks);
}

static void test_native_form_not_accepted_inline(void **state)
{
    (void)state;
    expect_bad_with(NATIVE_SPEC, strlen(NATIVE_SPEC), ORB_MATRIX_ACCEPT_CLASSIC, "(document)",
                    "accepted only from custom_json_path");
    struct orb_topo_ranks *ranks = NULL;
    assert_int_equal(orb_topo_ranks_load(NATIVE_SPEC, NULL, &inv, FIXTURE_ELIGIBLE, &ranks),
                     ORB_ECONFIG);
    assert_null(ranks);
    /* A classic document may still be parsed with only the classic form accepted. */
    ranks = compile_with(TENT_MATRIX, ORB_MATRIX_ACCEPT_CLASSIC, &inv, FIXTURE_ELIGIBLE);
    orb_topo_ranks_free(ranks);
}

/* The same content in both forms compiles to the same ranks, row lists included. */
static void test_forms_equivalent(void **state)
{
    (void)state;
    struct orb_topo_ranks *classic = compile_ok(
        "{\"cpu:0\":[[\"mlx5_0\",\"mlx5_2\"],[\"mlx5_1\"]],"
        "\"cuda:1\":[[],[\"mlx5_1\",\"mlx5_0\"]],"
        "\"cpu:1\":[[],[]],"
        "\"*\":[[\"mlx5_1\"],[\"mlx5_2\"]]}");
    struct orb_topo_ranks *native = compile_ok(
        "{\"nics\":[{\"name\":\"mlx5_2\"},{\"name\":\"mlx5_0\"},{\"name\":\"mlx5_1\"}],"
        "\"mems\":[{\"name\":\"cpu:0\",\"type\":0,\"device_list\":{\"rank0\":[1,0],\"rank1\":[2]}},"
        "{\"name\":\"cuda:1\",\"type\":1,\"device_list\":{\"rank0\":[],\"rank1\":[2,1]}},"
        "{\"name\":\"cpu:1\",\"device_list\":{\"rank0\":[],\"rank1\":[],\"rank2\":[]}},"
        "{\"name\":\"*\",\"type\":4,\"device_list\":{\"rank0\":[2],\"rank1\":[0]}}]}");
    assert_same_ranks(classic, native);
    const char *locs[] = {"cpu:0", "cuda:1", "cpu:1", "*"};
    for (size_t i = 0; i < 4; i++) {
        const struct orb_topo_rank_row *a = row_of(classic, locs[i]);
        const struct orb_topo_rank_row *b = row_of(native, locs[i]);
        assert_memory_equal(a, b, sizeof *a);
    }
    orb_topo_ranks_free(classic);
    orb_topo_ranks_free(native);

    /* TENT's matrix against the native file spelling out its synthesised "*" (with each NIC at
     * its effective rank, since a native row lists a NIC once). */
    classic = compile_ok(TENT_MATRIX);
    native = compile_ok(
        "{\"nics\":[{\"name\":\"mlx5_0\"},{\"name\":\"mlx5_1\"}],\"mems\":["
        "{\"name\":\"cpu:0\",\"device_list\":{\"rank0\":[0],\"rank1\":[1]}},"
        "{\"name\":\"cpu:1\",\"device_list\":{\"rank0\":[1],\"rank1\":[0]}},"
        "{\"name\":\"cuda:0\",\"device_list\":{\"rank0\":[0],\"rank1\":[1]}},"
        "{\"name\":\"*\",\"device_list\":{\"rank0\":[0,1]}}]}");
    assert_same_ranks(classic, native);
    orb_topo_ranks_free(classic);
    orb_topo_ranks_free(native);
}

/* ---- files and configuration precedence ------------------------------------------------------ */

static void test_file_errors(void **state)
{
    (void)state;
    char dir[256];
    make_scratch(dir, sizeof dir);
    char path[512];
    struct orb_topo_ranks *ranks = NULL;

    /* missing */
    snprintf(path, sizeof path, "%s/missing.json", dir);
    assert_int_equal(orb_topo_ranks_read_file(path, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "custom_json_path \""));
    assert_non_null(strstr(orb_last_error(), "missing.json\": cannot open: No such file"));

    /* a directory */
    assert_int_equal(orb_topo_ranks_read_file(dir, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "is a directory, not a regular file"));

    /* a FIFO: refused without waiting for a writer */
    snprintf(path, sizeof path, "%s/fifo", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(orb_topo_ranks_read_file(path, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "is a FIFO"));

    /* empty */
    snprintf(path, sizeof path, "%s/empty.json", dir);
    write_file(path, "", 0);
    assert_int_equal(orb_topo_ranks_read_file(path, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "empty.json\": the file is empty"));

    /* oversize: 1 MiB + 1 */
    size_t max = ORB_TOPO_MATRIX_MAX_BYTES;
    char *big = malloc(max + 1);
    assert_non_null(big);
    memset(big, ' ', max + 1);
    const char *core = "{\"cpu:0\":[[\"mlx5_0\"],[]]}";
    memcpy(big, core, strlen(core));
    snprintf(path, sizeof path, "%s/big.json", dir);
    write_file(path, big, max + 1);
    assert_int_equal(orb_topo_ranks_read_file(path, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "the file is 1048577 bytes, over the 1048576-byte"));
    /* exactly 1 MiB is fine */
    write_file(path, big, max);
    assert_int_equal(orb_topo_ranks_read_file(path, &inv, FIXTURE_ELIGIBLE, &ranks), 0);
    orb_topo_ranks_free(ranks);
    ranks = NULL;
    free(big);

    /* invalid content: the message names the file, the key and the reason */
    snprintf(path, sizeof path, "%s/bad.json", dir);
    const char *bad_content = "{\"cpu:0\":[[\"mlx5_0\"],[\"mlx5_7\"]]}";
    write_file(path, bad_content, strlen(bad_content));
    assert_int_equal(orb_topo_ranks_read_file(path, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    char expect[1024];
    snprintf(expect, sizeof expect,
             "custom_json_path \"%s\": key \"cpu:0\" rank 1 entry 0: NIC \"mlx5_7\" is not in "
             "the discovered inventory",
             path);
    assert_string_equal(orb_last_error(), expect);

    /* symbolic links are followed: to a valid file it works; to a directory, or dangling, not */
    snprintf(path, sizeof path, "%s/good.json", dir);
    write_file(path, TENT_MATRIX, strlen(TENT_MATRIX));
    char link[512];
    snprintf(link, sizeof link, "%s/link.json", dir);
    assert_int_equal(symlink(path, link), 0);
    assert_int_equal(orb_topo_ranks_read_file(link, &inv, FIXTURE_ELIGIBLE, &ranks), 0);
    assert_int_equal(row_of(ranks, "cpu:1")->rank[1], 0);
    orb_topo_ranks_free(ranks);
    ranks = NULL;
    snprintf(link, sizeof link, "%s/dirlink", dir);
    assert_int_equal(symlink(dir, link), 0);
    assert_int_equal(orb_topo_ranks_read_file(link, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "is a directory"));
    snprintf(link, sizeof link, "%s/dangling", dir);
    assert_int_equal(symlink("does-not-exist", link), 0);
    assert_int_equal(orb_topo_ranks_read_file(link, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "cannot open"));

    /* the native form is accepted from a file */
    snprintf(path, sizeof path, "%s/native.json", dir);
    write_file(path, NATIVE_SPEC, strlen(NATIVE_SPEC));
    assert_int_equal(orb_topo_ranks_read_file(path, &inv, FIXTURE_ELIGIBLE, &ranks), 0);
    assert_int_equal(orb_topo_ranks_form(ranks), ORB_MATRIX_NATIVE);
    orb_topo_ranks_free(ranks);
    ranks = NULL;

    /* an empty path is a configured, invalid path */
    assert_int_equal(orb_topo_ranks_read_file("", &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "custom_json_path: the path is empty"));
    assert_null(ranks);

    static const char *const names[] = {"fifo", "empty.json", "big.json", "bad.json", "good.json",
                                        "link.json", "dirlink", "dangling", "native.json", NULL};
    remove_tree(dir, names);
}

static void test_file_message_keeps_end_of_long_path(void **state)
{
    (void)state;
    char path[1024];
    int n = snprintf(path, sizeof path, "%s", "/nonexistent");
    for (int i = 0; i < 30; i++)
        n += snprintf(path + n, sizeof path - (size_t)n, "/directory%02d", i);
    snprintf(path + n, sizeof path - (size_t)n, "/the-matrix.json");
    struct orb_topo_ranks *ranks = NULL;
    assert_int_equal(orb_topo_ranks_read_file(path, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    const char *msg = orb_last_error();
    assert_non_null(strstr(msg, "custom_json_path \"..."));
    assert_non_null(strstr(msg, "/the-matrix.json\": cannot open"));
}

static void test_load_precedence(void **state)
{
    (void)state;
    char dir[256];
    make_scratch(dir, sizeof dir);
    char good[512];
    snprintf(good, sizeof good, "%s/good.json", dir);
    const char *file_matrix = "{\"cpu:0\":[[\"mlx5_2\"],[]]}";
    write_file(good, file_matrix, strlen(file_matrix));
    struct orb_topo_ranks *ranks = (struct orb_topo_ranks *)&inv;

    /* nothing configured: success, no matrix */
    assert_int_equal(orb_topo_ranks_load(NULL, NULL, &inv, FIXTURE_ELIGIBLE, &ranks), 0);
    assert_null(ranks);

    /* path only */
    assert_int_equal(orb_topo_ranks_load(NULL, good, &inv, FIXTURE_ELIGIBLE, &ranks), 0);
    assert_int_equal(row_of(ranks, "cpu:0")->rank[2], 0);
    orb_topo_ranks_free(ranks);

    /* inline wins; the path is not even read (a missing file is no error) */
    ranks = NULL;
    assert_int_equal(orb_topo_ranks_load("{\"cpu:0\":[[\"mlx5_1\"],[]]}", "/nonexistent/x.json",
                                         &inv, FIXTURE_ELIGIBLE, &ranks),
                     0);
    assert_int_equal(row_of(ranks, "cpu:0")->rank[1], 0);
    assert_int_equal(row_of(ranks, "cpu:0")->rank[2], ORB_TOPO_RANK_NONE);
    orb_topo_ranks_free(ranks);

    /* an invalid inline matrix fails even with a valid file configured: no fallback */
    ranks = NULL;
    assert_int_equal(orb_topo_ranks_load("{\"cpu:0\":[[\"nope\"],[]]}", good, &inv,
                                         FIXTURE_ELIGIBLE, &ranks),
                     ORB_ECONFIG);
    assert_null(ranks);
    assert_non_null(strstr(orb_last_error(), "priority_matrix: key \"cpu:0\" rank 0 entry 0"));

    /* an empty inline string is configured and invalid (TENT's "" vector) */
    assert_int_equal(orb_topo_ranks_load("", good, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "priority_matrix: (document): the input is empty"));

    /* an invalid file fails: no fallback to discovery */
    assert_int_equal(orb_topo_ranks_load(NULL, dir, &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_null(ranks);
    assert_int_equal(orb_topo_ranks_load(NULL, "", &inv, FIXTURE_ELIGIBLE, &ranks), ORB_ECONFIG);
    assert_null(ranks);

    static const char *const names[] = {"good.json", NULL};
    remove_tree(dir, names);
}

/* ---- property tests ---------------------------------------------------------------------------- */

static uint64_t rng_state;

static uint32_t rnd(uint32_t bound)
{
    /* xorshift64*: deterministic across runs and platforms */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * UINT64_C(2685821657736338717)) >> 32) % bound;
}

static void shuffle(uint8_t *a, unsigned n)
{
    for (unsigned i = n; i > 1; i--) {
        unsigned j = rnd(i);
        uint8_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

struct model_row {
    struct orb_location loc;
    uint8_t count[2];
    uint8_t nics[2][ORB_TOPO_MAX_NICS];
};

/* Random inventories and classic matrices; each written in both forms. Checks: both compile;
 * listed rows equal the model exactly; "*" follows the synthesis rule or the explicit row; the
 * native rendering gives the same ranks everywhere; every row keeps its invariants. */
static void test_property_random_matrices(void **state)
{
    (void)state;
    rng_state = UINT64_C(0x9e3779b97f4a7c15);
    for (int iter = 0; iter < 400; iter++) {
        struct orb_topo_inventory rinv;
        memset(&rinv, 0, sizeof rinv);
        unsigned nnics = 1 + rnd(20);
        uint8_t ids[ORB_TOPO_MAX_NICS];
        for (unsigned i = 0; i < ORB_TOPO_MAX_NICS; i++)
            ids[i] = (uint8_t)i;
        shuffle(ids, ORB_TOPO_MAX_NICS); /* stable ids unrelated to slot order */
        for (unsigned i = 0; i < nnics; i++) {
            char name[32];
            snprintf(name, sizeof name, "nic_%u", ids[i]);
            fixture_add_nic(&rinv, name, ids[i]);
        }
        unsigned ngpus = rnd(5), nnuma = rnd(4);
        for (unsigned i = 0; i < ngpus; i++)
            fixture_add_gpu(&rinv, i);
        for (unsigned i = 0; i < nnuma; i++)
            fixture_add_numa(&rinv, (int32_t)i);
        uint64_t eligible = 0;
        uint8_t usable_ids[ORB_TOPO_MAX_NICS];
        unsigned nusable = 0;
        for (unsigned i = 0; i < nnics; i++) {
            if (rnd(5) == 0)
                continue; /* filtered out */
            eligible |= UINT64_C(1) << ids[i];
            usable_ids[nusable++] = ids[i];
        }

        /* Candidate locations: discovered ones and "*". */
        struct orb_location cands[1 + 4 + 4];
        unsigned ncands = 0;
        for (unsigned i = 0; i < (nnuma ? nnuma : 1); i++)
            cands[ncands++] = (struct orb_location){ORB_LOC_CPU, (uint8_t)i};
        for (unsigned i = 0; i < ngpus; i++)
            cands[ncands++] = (struct orb_location){ORB_LOC_CUDA, (uint8_t)i};
        if (rnd(3) == 0)
            cands[ncands++] = (struct orb_location){ORB_LOC_ANY, 0};
        struct model_row rows[16];
        unsigned nrows = 0;
        int explicit_any = -1;
        for (unsigned i = 0; i < ncands; i++) {
            if (rnd(3) == 0 && !(i == ncands - 1 && nrows == 0))
                continue;
            struct model_row *m = &rows[nrows];
            memset(m, 0, sizeof *m);
            m->loc = cands[i];
            uint8_t order[ORB_TOPO_MAX_NICS];
            memcpy(order, usable_ids, nusable);
            shuffle(order, nusable);
            for (unsigned k = 0; k < nusable; k++) {
                unsigned pick = rnd(3); /* 0: rank0, 1: rank1, 2: not listed */
                if (pick < 2)
                    m->nics[pick][m->count[pick]++] = order[k];
            }
            if (m->loc.kind == ORB_LOC_ANY)
                explicit_any = (int)nrows;
            nrows++;
        }
        /* Rows in random document order. */
        for (unsigned i = nrows; i > 1; i--) {
            unsigned j = rnd(i);
            struct model_row t = rows[i - 1];
            rows[i - 1] = rows[j];
            rows[j] = t;
            if (explicit_any == (int)(i - 1))
                explicit_any = (int)j;
            else if (explicit_any == (int)j)
                explicit_any = (int)(i - 1);
        }

        /* Classic text. */
        struct text classic = {0};
        text_add(&classic, "{");
        for (unsigned i = 0; i < nrows; i++) {
            char loc[ORB_LOCATION_STR_MAX];
            assert_int_equal(orb_location_format(rows[i].loc, loc, sizeof loc), 0);
            text_add(&classic, "%s\"%s\": [", i ? ", " : "", loc);
            for (unsigned r = 0; r < 2; r++) {
                text_add(&classic, "%s[", r ? ", " : "");
                for (unsigned k = 0; k < rows[i].count[r]; k++)
                    text_add(&classic, "%s\"nic_%u\"", k ? "," : "", rows[i].nics[r][k]);
                text_add(&classic, "]");
            }
            text_add(&classic, "]");
        }
        text_add(&classic, "}");

        /* Native text: the file's NIC order is a fresh permutation of the usable NICs. */
        uint8_t file_order[ORB_TOPO_MAX_NICS];
        memcpy(file_order, usable_ids, nusable);
        shuffle(file_order, nusable);
        uint8_t index_of[ORB_TOPO_MAX_NICS];
        struct text native = {0};
        text_add(&native, "{\"nics\": [");
        for (unsigned i = 0; i < nusable; i++) {
            index_of[file_order[i]] = (uint8_t)i;
            text_add(&native, "%s{\"name\": \"nic_%u\", \"type\": 0}", i ? ", " : "",
                     file_order[i]);
        }
        text_add(&native, "], \"mems\": [");
        for (unsigned i = 0; i < nrows; i++) {
            char loc[ORB_LOCATION_STR_MAX];
            assert_int_equal(orb_location_format(rows[i].loc, loc, sizeof loc), 0);
            text_add(&native, "%s{\"name\": \"%s\", \"type\": %d, \"device_list\": {", i ? ", " : "",
                     loc, orb_location_mem_type(rows[i].loc));
            for (unsigned r = 0; r < 2; r++) {
                text_add(&native, "%s\"rank%u\": [", r ? ", " : "", r);
                for (unsigned k = 0; k < rows[i].count[r]; k++)
                    text_add(&native, "%s%u", k ? "," : "", index_of[rows[i].nics[r][k]]);
                text_add(&native, "]");
            }
            text_add(&native, "}}");
        }
        text_add(&native, "]}");

        struct orb_topo_ranks *c = compile_with(classic.buf, ORB_MATRIX_ACCEPT_ANY, &rinv, eligible);
        struct orb_topo_ranks *n = compile_with(native.buf, ORB_MATRIX_ACCEPT_ANY, &rinv, eligible);

        /* Listed rows: exactly the model, in both forms. */
        for (unsigned i = 0; i < nrows; i++) {
            const struct orb_topo_rank_row *rc = orb_topo_ranks_row(c, rows[i].loc);
            const struct orb_topo_rank_row *rn = orb_topo_ranks_row(n, rows[i].loc);
            assert_non_null(rc);
            assert_non_null(rn);
            assert_memory_equal(rc, rn, sizeof *rc);
            assert_int_equal(rc->origin,
                             rows[i].loc.kind == ORB_LOC_ANY ? ORB_ROW_WILDCARD : ORB_ROW_LISTED);
            for (unsigned r = 0; r < 2; r++)
                assert_rank_list(rc, r, rows[i].nics[r], rows[i].count[r]);
            assert_int_equal(rc->count[2], 0);
            assert_row_consistent(rc, eligible);
        }

        /* "*": explicit, or synthesised by first appearance in document order. */
        const struct orb_topo_rank_row *any = orb_topo_ranks_row(c, (struct orb_location){0, 0});
        assert_non_null(any);
        assert_row_consistent(any, eligible);
        if (explicit_any < 0) {
            assert_int_equal(any->origin, ORB_ROW_SYNTHESIZED);
            for (unsigned r = 0; r < 2; r++) {
                uint8_t expect[ORB_TOPO_MAX_NICS];
                unsigned count = 0;
                uint64_t seen = 0;
                for (unsigned i = 0; i < nrows; i++)
                    for (unsigned k = 0; k < rows[i].count[r]; k++) {
                        uint8_t id = rows[i].nics[r][k];
                        if (!(seen & (UINT64_C(1) << id))) {
                            seen |= UINT64_C(1) << id;
                            expect[count++] = id;
                        }
                    }
                assert_rank_list(any, r, expect, count);
            }
            assert_null(orb_topo_ranks_row(n, (struct orb_location){0, 0}));
        } else {
            assert_int_equal(any->origin, ORB_ROW_WILDCARD);
            assert_same_ranks(c, n);
        }

        /* Unlisted locations (discovered or not) resolve to "*" in the classic form. */
        for (unsigned idx = 0; idx <= 63; idx++) {
            struct orb_location l = {ORB_LOC_CUDA, (uint8_t)idx};
            const struct orb_topo_rank_row *row = orb_topo_ranks_row(c, l);
            int listed = 0;
            for (unsigned i = 0; i < nrows; i++)
                listed |= rows[i].loc.kind == ORB_LOC_CUDA && rows[i].loc.index == idx;
            if (!listed)
                assert_ptr_equal(row, any);
        }
        orb_topo_ranks_free(c);
        orb_topo_ranks_free(n);
        free(classic.buf);
        free(native.buf);
    }
}

/* Random byte damage to valid documents: never a crash; either a consistent matrix or
 * ORB_ECONFIG with a message that names the input. */
static void test_property_damaged_documents(void **state)
{
    (void)state;
    rng_state = UINT64_C(0x123456789abcdef);
    static const char *const seeds[] = {TENT_MATRIX, NATIVE_SPEC,
                                        "{\"*\":[[\"mlx5_2\"],[\"mlx5_0\"]],\"cpu:0\":[[],[]]}"};
    static const char alphabet[] = "{}[],:\"0123 *cpu:cuda:mlx5_nicsmemsrank\\";
    for (int iter = 0; iter < 3000; iter++) {
        const char *seed = seeds[iter % 3];
        size_t len = strlen(seed);
        char buf[512];
        memcpy(buf, seed, len);
        unsigned edits = 1 + rnd(4);
        for (unsigned e = 0; e < edits; e++) {
            size_t at = rnd((uint32_t)len);
            switch (rnd(3)) {
            case 0: buf[at] = alphabet[rnd(sizeof alphabet - 1)]; break;
            case 1: /* delete */
                memmove(buf + at, buf + at + 1, len - at - 1);
                len--;
                break;
            default: /* insert */
                if (len + 1 < sizeof buf) {
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = alphabet[rnd(sizeof alphabet - 1)];
                    len++;
                }
            }
            if (len == 0)
                break;
        }
        struct orb_topo_ranks *ranks = NULL;
        int rc = orb_topo_ranks_parse(buf, len, ORB_MATRIX_ACCEPT_ANY, "priority_matrix", &inv,
                                      FIXTURE_ELIGIBLE, &ranks);
        if (rc == 0) {
            for (unsigned kind = ORB_LOC_ANY; kind <= ORB_LOC_CUDA; kind++)
                for (unsigned i = 0; i <= (kind == ORB_LOC_ANY ? 0u : 63u); i++) {
                    const struct orb_topo_rank_row *row =
                        orb_topo_ranks_row(ranks, (struct orb_location){(uint8_t)kind, (uint8_t)i});
                    if (row)
                        assert_row_consistent(row, FIXTURE_ELIGIBLE);
                }
            orb_topo_ranks_free(ranks);
        } else {
            assert_int_equal(rc, ORB_ECONFIG);
            assert_null(ranks);
            assert_int_equal(strncmp(orb_last_error(), "priority_matrix: ", 17), 0);
        }
    }
}

/* ---- frozen matrix, concurrent readers ------------------------------------------------------- */

struct reader_arg {
    const struct orb_topo_ranks *ranks;
    int mismatches;
};

static void *reader(void *p)
{
    struct reader_arg *a = p;
    for (int i = 0; i < 20000; i++) {
        uint8_t rank[ORB_TOPO_MAX_NICS];
        struct orb_location loc = {(uint8_t)(i % 3), (uint8_t)(i % 3 == 0 ? 0 : i % 2)};
        if (orb_topo_ranks_lookup(a->ranks, loc, rank) != 0)
            a->mismatches++;
        else if (loc.kind == ORB_LOC_CPU && loc.index == 1 && (rank[1] != 0 || rank[0] != 1))
            a->mismatches++;
    }
    return NULL;
}

static void test_concurrent_lookups(void **state)
{
    (void)state;
    struct orb_topo_ranks *ranks = compile_ok(TENT_MATRIX);
    struct reader_arg args[2] = {{ranks, 0}, {ranks, 0}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, reader, &args[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    assert_int_equal(args[0].mismatches, 0);
    assert_int_equal(args[1].mismatches, 0);
    orb_topo_ranks_free(ranks);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_and_bad_arguments),
        cmocka_unit_test(test_tent_rejected_inputs),
        cmocka_unit_test(test_wrong_json_types),
        cmocka_unit_test(test_invalid_json_syntax),
        cmocka_unit_test(test_duplicate_json_keys),
        cmocka_unit_test(test_empty_matrix_refused),
        cmocka_unit_test(test_names_must_be_usable_and_eligible),
        cmocka_unit_test(test_duplicate_names_in_one_row),
        cmocka_unit_test(test_location_keys),
        cmocka_unit_test(test_size_limit),
        cmocka_unit_test(test_deep_nesting_refused),
        cmocka_unit_test(test_native_rejections),
        cmocka_unit_test(test_native_form_not_accepted_inline),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_file_message_keeps_end_of_long_path),
        cmocka_unit_test(test_load_precedence),
        cmocka_unit_test(test_tent_accepted_matrix),
        cmocka_unit_test(test_empty_row_disables_location),
        cmocka_unit_test(test_explicit_wildcard_row),
        cmocka_unit_test(test_wildcard_synthesis_order),
        cmocka_unit_test(test_native_spec_example),
        cmocka_unit_test(test_native_three_ranks_and_wildcard),
        cmocka_unit_test(test_native_valid_types_accepted),
        cmocka_unit_test(test_forms_equivalent),
        cmocka_unit_test(test_property_random_matrices),
        cmocka_unit_test(test_property_damaged_documents),
        cmocka_unit_test(test_concurrent_lookups),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
