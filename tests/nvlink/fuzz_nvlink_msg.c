/* Fuzz target for the NVLink transport's control messages (lib/nvlink/nvlink_msg.c). The input
 * is decoded as every kind of message; beyond memory safety it checks (abort on failure):
 *  - the only outcomes are 0 and ORB_EPROTO;
 *  - a decoded message keeps the decoder's promises (counts, ranges, allocation indexes,
 *    printable NUL-terminated causes);
 *  - it encodes again: to exactly the input bytes for HELLO, BEGIN and END, and for BEGIN_OK to
 *    bytes that decode to the same message. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

#include "nvlink/nvlink_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_nvlink_msg: invariant broken: %s (last error: %s)\n", what, orb_last_error());
        abort();
    }
}

static void check_rc(int rc, const char *what)
{
    check(rc == 0 || rc == ORB_EPROTO, what);
}

static void same(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, const char *what)
{
    check(alen == blen && memcmp(a, b, alen) == 0, what);
}

static void begin_ok_promises(const struct orb_nvl_begin_ok *m)
{
    check(m->group != 0 && m->count >= 1 && m->count <= ORB_NVL_GROUP_MAX && m->nallocs <= m->count, "counts");
    for (uint32_t i = 0; i < m->nallocs; i++)
        check(m->allocs[i].size > 0 && m->allocs[i].base + m->allocs[i].size > m->allocs[i].base, "allocation");
    for (uint32_t i = 0; i < m->count; i++) {
        const struct orb_nvl_grant *g = &m->grants[i];
        check(g->status <= 0 && g->status >= ORB_EAGAIN, "grant status");
        check(g->status != 0 || g->alloc < m->nallocs, "grant allocation");
        size_t n = strnlen(g->why, sizeof g->why);
        check(n <= ORB_NVL_WHY_MAX, "cause length");
        for (size_t k = 0; k < n; k++)
            check(g->why[k] >= 0x20 && g->why[k] < 0x7f, "cause printable");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t out[8192];
    size_t len = 0;
    uint8_t kind;
    check_rc(orb_nvl_kind_of(data, size, &kind), "kind");

    for (uint8_t k = ORB_NVL_HELLO; k <= ORB_NVL_HELLO_OK; k++) {
        struct orb_nvl_hello m;
        int rc = orb_nvl_hello_decode(k, data, size, &m);
        check_rc(rc, "hello decode");
        if (rc == 0) {
            check(orb_nvl_hello_encode(k, &m, out, sizeof out, &len) == 0, "hello re-encode");
            same(out, len, data, size, "hello bytes");
        }
    }
    const uint8_t begins[2] = {ORB_NVL_BEGIN, ORB_NVL_QUERY};
    const uint8_t answers[2] = {ORB_NVL_BEGIN_OK, ORB_NVL_QUERY_OK};
    for (int j = 0; j < 2; j++) {
        struct orb_nvl_begin b;
        int rc = orb_nvl_begin_decode(begins[j], data, size, &b);
        check_rc(rc, "begin decode");
        if (rc == 0) {
            check(b.group != 0 && b.count >= 1 && b.count <= ORB_NVL_GROUP_MAX, "begin counts");
            for (uint32_t i = 0; i < b.count; i++)
                check((b.ranges[i].op == ORB_OP_READ || b.ranges[i].op == ORB_OP_WRITE) && b.ranges[i].length > 0 &&
                      b.ranges[i].addr + b.ranges[i].length >= b.ranges[i].addr, "begin range");
            check(orb_nvl_begin_encode(begins[j], &b, out, sizeof out, &len) == 0, "begin re-encode");
            same(out, len, data, size, "begin bytes");
        }
        struct orb_nvl_begin_ok *a = malloc(sizeof *a), *again = malloc(sizeof *again);
        check(a != NULL && again != NULL, "memory");
        rc = orb_nvl_begin_ok_decode(answers[j], data, size, a);
        check_rc(rc, "begin_ok decode");
        if (rc == 0) {
            begin_ok_promises(a);
            check(orb_nvl_begin_ok_encode(answers[j], a, out, sizeof out, &len) == 0, "begin_ok re-encode");
            check(len == size, "begin_ok length");
            check(orb_nvl_begin_ok_decode(answers[j], out, len, again) == 0, "begin_ok decodes again");
            for (uint32_t i = 0; i < a->nallocs; i++) {
                check(again->allocs[i].base == a->allocs[i].base && again->allocs[i].size == a->allocs[i].size &&
                      again->allocs[i].share == a->allocs[i].share &&
                      memcmp(again->allocs[i].handle, a->allocs[i].handle, ORB_NVL_HANDLE_LEN) == 0,
                      "allocations again");
                struct orb_nvl_fd_handle h;
                if (a->allocs[i].share == ORB_NVL_SHARE_FD && orb_nvl_fd_handle_unpack(a->allocs[i].handle, &h) == 0) {
                    uint8_t packed[ORB_NVL_HANDLE_LEN];
                    orb_nvl_fd_handle_pack(&h, packed);
                    check(memcmp(packed, a->allocs[i].handle, ORB_NVL_HANDLE_LEN) == 0, "descriptor handle bytes");
                }
            }
            for (uint32_t i = 0; i < a->count; i++)
                check(again->grants[i].status == a->grants[i].status && again->grants[i].alloc == a->grants[i].alloc &&
                      strcmp(again->grants[i].why, a->grants[i].why) == 0, "grants again");
        }
        free(a);
        free(again);
    }
    struct orb_nvl_fetch f;
    int frc = orb_nvl_fetch_decode(data, size, &f);
    check_rc(frc, "fetch decode");
    if (frc == 0) {
        check(f.alloc < ORB_NVL_GROUP_MAX, "fetch allocation");
        check(orb_nvl_fetch_encode(&f, out, sizeof out, &len) == 0, "fetch re-encode");
        same(out, len, data, size, "fetch bytes");
    }
    struct orb_nvl_fetch_ok fo;
    frc = orb_nvl_fetch_ok_decode(data, size, &fo);
    check_rc(frc, "fetch_ok decode");
    if (frc == 0) {
        check(fo.status <= 0 && (fo.status == 0) == (fo.size != 0), "fetch_ok status and size");
        check(orb_nvl_fetch_ok_encode(&fo, out, sizeof out, &len) == 0, "fetch_ok re-encode");
        same(out, len, data, size, "fetch_ok bytes");
    }
    for (uint8_t k = ORB_NVL_END; k <= ORB_NVL_END_OK; k++) {
        uint64_t group = 0;
        int rc = orb_nvl_end_decode(k, data, size, &group);
        check_rc(rc, "end decode");
        if (rc == 0) {
            check(group != 0, "end group");
            check(orb_nvl_end_encode(k, group, out, sizeof out, &len) == 0, "end re-encode");
            same(out, len, data, size, "end bytes");
        }
    }
    return 0;
}
