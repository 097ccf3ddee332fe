/* Fuzz target for the matrix compiler. Each input is compiled against a fixed small inventory
 * (tests/topo_matrix/fixture.h) twice: accepting both forms, and accepting only the classic
 * form. Beyond memory safety it checks (abort on failure):
 *  - the only outcomes are success, ORB_ECONFIG with a message naming the input, or ORB_ENOMEM;
 *  - the two parses agree (a classic document compiles the same both ways; a native one is
 *    refused by the classic-only parse);
 *  - every row keeps its invariants: ranks and lists agree, only eligible NICs, own rows only
 *    for discovered locations, a classic matrix always has "*";
 *  - the matrix written back out in the native form (each NIC at its effective rank) compiles
 *    to the same ranks for every location. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "fixture.h"
#include "topo/location.h"
#include "topo/matrix.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ORIGIN "fuzz"

static struct orb_topo_inventory inventory;
static int inventory_ready;

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_matrix: invariant broken: %s (last error: %s)\n", what,
                orb_last_error());
        abort();
    }
}

/* Locations the fixture discovers: cpu:0, cpu:1, cuda:0, cuda:1. */
static int discovered(struct orb_location loc)
{
    return loc.kind != ORB_LOC_ANY && loc.index <= 1;
}

static void check_row(const struct orb_topo_rank_row *row)
{
    uint64_t from_lists = 0;
    for (unsigned r = 0; r < ORB_TOPO_RANKS; r++) {
        check(row->count[r] <= ORB_TOPO_MAX_NICS, "rank count in range");
        for (unsigned i = 0; i < row->count[r]; i++) {
            uint8_t id = row->nics[r][i];
            check(id < ORB_TOPO_MAX_NICS, "NIC id in range");
            check(row->rank[id] <= r, "effective rank is the lowest listing");
            from_lists |= UINT64_C(1) << id;
        }
    }
    check(row->listed == from_lists, "listed mask matches the lists");
    check((row->listed & ~FIXTURE_ELIGIBLE) == 0, "only eligible NICs");
    check((row->listed & (UINT64_C(1) << 3)) == 0, "never a NIC that failed discovery");
    for (unsigned id = 0; id < ORB_TOPO_MAX_NICS; id++)
        check(((row->listed >> id) & 1) == (row->rank[id] != ORB_TOPO_RANK_NONE),
              "rank set exactly for listed NICs");
}

static void check_matrix(const struct orb_topo_ranks *ranks)
{
    int form = orb_topo_ranks_form(ranks);
    check(form == ORB_MATRIX_CLASSIC || form == ORB_MATRIX_NATIVE, "known form");
    struct orb_location any = {ORB_LOC_ANY, 0};
    const struct orb_topo_rank_row *wildcard = orb_topo_ranks_row(ranks, any);
    if (form == ORB_MATRIX_CLASSIC)
        check(wildcard != NULL, "a classic matrix always has \"*\"");
    if (wildcard) {
        check(wildcard->origin == ORB_ROW_WILDCARD || wildcard->origin == ORB_ROW_SYNTHESIZED,
              "\"*\" origin");
        check(wildcard->origin != ORB_ROW_SYNTHESIZED || form == ORB_MATRIX_CLASSIC,
              "only the classic form synthesises");
        check_row(wildcard);
    }
    for (unsigned kind = ORB_LOC_CPU; kind <= ORB_LOC_CUDA; kind++) {
        for (unsigned i = 0; i <= 63; i++) {
            struct orb_location loc = {(uint8_t)kind, (uint8_t)i};
            const struct orb_topo_rank_row *row = orb_topo_ranks_row(ranks, loc);
            uint8_t rank[ORB_TOPO_MAX_NICS];
            int rc = orb_topo_ranks_lookup(ranks, loc, rank);
            if (!row) {
                check(wildcard == NULL && rc == ORB_ENOENT, "no row only without \"*\"");
                continue;
            }
            check(rc == 0 && memcmp(rank, row->rank, sizeof rank) == 0, "lookup copies rank[]");
            if (row->origin == ORB_ROW_LISTED)
                check(discovered(loc), "own rows only for discovered locations");
            else
                check(row == wildcard, "other locations use \"*\"");
            check_row(row);
        }
    }
}

/* Append to a fixed buffer; overflow is a harness bug (the rendering is small). */
static void put(char *buf, size_t cap, size_t *len, const char *s)
{
    size_t n = strlen(s);
    check(*len + n < cap, "rendering fits");
    memcpy(buf + *len, s, n + 1);
    *len += n;
}

/* Write `row` as a native mems entry, each NIC once at its effective rank. The file's NIC order
 * is mlx5_2, mlx5_1, mlx5_0, so index = 2 - id. */
static void render_row(char *buf, size_t cap, size_t *len, const char *loc,
                       const struct orb_topo_rank_row *row)
{
    char piece[64];
    snprintf(piece, sizeof piece, "{\"name\":\"%s\",\"device_list\":{", loc);
    put(buf, cap, len, piece);
    for (unsigned r = 0; r < ORB_TOPO_RANKS; r++) {
        snprintf(piece, sizeof piece, "%s\"rank%u\":[", r ? "," : "", r);
        put(buf, cap, len, piece);
        int first = 1;
        for (unsigned i = 0; i < row->count[r]; i++) {
            uint8_t id = row->nics[r][i];
            if (row->rank[id] != r)
                continue; /* listed again at a worse rank in a synthesised row */
            check(id <= 2, "rendered NIC is one of the eligible three");
            snprintf(piece, sizeof piece, "%s%u", first ? "" : ",", 2u - id);
            put(buf, cap, len, piece);
            first = 0;
        }
        put(buf, cap, len, "]");
    }
    put(buf, cap, len, "}}");
}

static void check_native_rendering(const struct orb_topo_ranks *ranks)
{
    char text[8192];
    size_t len = 0;
    text[0] = '\0';
    put(text, sizeof text, &len,
        "{\"nics\":[{\"name\":\"mlx5_2\"},{\"name\":\"mlx5_1\"},{\"name\":\"mlx5_0\"}],\"mems\":[");
    int rows = 0;
    for (unsigned kind = ORB_LOC_ANY; kind <= ORB_LOC_CUDA; kind++) {
        for (unsigned i = 0; i <= (kind == ORB_LOC_ANY ? 0u : 1u); i++) {
            struct orb_location loc = {(uint8_t)kind, (uint8_t)i};
            const struct orb_topo_rank_row *row = orb_topo_ranks_row(ranks, loc);
            if (!row || (kind != ORB_LOC_ANY && row->origin != ORB_ROW_LISTED))
                continue;
            char name[ORB_LOCATION_STR_MAX];
            check(orb_location_format(loc, name, sizeof name) == 0, "format location");
            if (rows++)
                put(text, sizeof text, &len, ",");
            render_row(text, sizeof text, &len, name, row);
        }
    }
    put(text, sizeof text, &len, "]}");
    check(rows > 0, "a compiled matrix has a row");
    struct orb_topo_ranks *again = NULL;
    int rc = orb_topo_ranks_parse(text, len, ORB_MATRIX_ACCEPT_ANY, ORIGIN, &inventory,
                                  FIXTURE_ELIGIBLE, &again);
    if (rc == ORB_ENOMEM)
        return;
    check(rc == 0, "the native rendering compiles");
    for (unsigned kind = ORB_LOC_ANY; kind <= ORB_LOC_CUDA; kind++) {
        for (unsigned i = 0; i <= (kind == ORB_LOC_ANY ? 0u : 63u); i++) {
            struct orb_location loc = {(uint8_t)kind, (uint8_t)i};
            const struct orb_topo_rank_row *a = orb_topo_ranks_row(ranks, loc);
            const struct orb_topo_rank_row *b = orb_topo_ranks_row(again, loc);
            check((a == NULL) == (b == NULL), "same rows in the native rendering");
            if (a) {
                check(memcmp(a->rank, b->rank, sizeof a->rank) == 0, "same ranks in native");
                check(a->listed == b->listed, "same listed set in native");
            }
        }
    }
    orb_topo_ranks_free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!inventory_ready) {
        fixture_inventory(&inventory);
        inventory_ready = 1;
    }
    const char *json = (const char *)data;
    struct orb_topo_ranks *any = NULL;
    int rc_any = orb_topo_ranks_parse(json, size, ORB_MATRIX_ACCEPT_ANY, ORIGIN, &inventory,
                                      FIXTURE_ELIGIBLE, &any);
    if (rc_any == ORB_ENOMEM)
        return 0;
    if (rc_any != 0) {
        check(rc_any == ORB_ECONFIG, "failures are ORB_ECONFIG");
        check(any == NULL, "no output on failure");
        check(strncmp(orb_last_error(), ORIGIN ": ", sizeof ORIGIN + 1) == 0,
              "the message names the input");
    }
    struct orb_topo_ranks *classic = NULL;
    int rc_classic = orb_topo_ranks_parse(json, size, ORB_MATRIX_ACCEPT_CLASSIC, ORIGIN,
                                          &inventory, FIXTURE_ELIGIBLE, &classic);
    if (rc_classic == ORB_ENOMEM) {
        orb_topo_ranks_free(any);
        return 0;
    }
    if (rc_any != 0) {
        check(rc_classic == ORB_ECONFIG, "classic-only fails where both forms fail");
        return 0;
    }
    check_matrix(any);
    if (orb_topo_ranks_form(any) == ORB_MATRIX_CLASSIC) {
        check(rc_classic == 0, "a classic document compiles with the classic form only");
        for (unsigned kind = ORB_LOC_ANY; kind <= ORB_LOC_CUDA; kind++)
            for (unsigned i = 0; i <= (kind == ORB_LOC_ANY ? 0u : 63u); i++) {
                struct orb_location loc = {(uint8_t)kind, (uint8_t)i};
                const struct orb_topo_rank_row *a = orb_topo_ranks_row(any, loc);
                const struct orb_topo_rank_row *b = orb_topo_ranks_row(classic, loc);
                check(a && b && memcmp(a, b, sizeof *a) == 0, "both parses agree");
            }
    } else {
        check(rc_classic == ORB_ECONFIG, "the native form is refused when only classic is");
    }
    check_native_rendering(any);
    orb_topo_ranks_free(any);
    orb_topo_ranks_free(classic);
    return 0;
}
