/* Fuzz target for the same-host transport's messages (lib/samehost/shm_msg.c). The first input
 * byte picks the decoder (modulo their number: every message decoder, the REQUEST and COMPLETION
 * ring entries, which take the next 64 bytes when there are that many, and orb_shm_peek_kind);
 * the rest is its input. Beyond memory safety it checks (abort on failure): the only outcomes are
 * 0 and ORB_EPROTO; a decoded message keeps the promises of shm_msg.h and encodes again to
 * exactly the input bytes (a decoded COMPLETION's cause is printable ASCII already, so the
 * encoder's sanitising leaves it as it was). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

#include "samehost/ring.h"
#include "samehost/shm_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_shm_msg: invariant broken: %s (last error: %s)\n", what, orb_last_error());
        abort();
    }
}

/* Call it after the encoder (not with the call as an argument): it reads the length written. */
static void same_bytes(int rc, const uint8_t *out, size_t out_len, const uint8_t *in, size_t in_len)
{
    check(rc == 0, "re-encode");
    check(out_len == in_len && memcmp(out, in, in_len) == 0, "same bytes");
}

enum pick {
    PICK_INFO,
    PICK_INFO_OK,
    PICK_QUERY,
    PICK_QUERY_OK,
    PICK_SETUP,
    PICK_SETUP_OK,
    PICK_MAP,
    PICK_MAP_OK,
    PICK_UNMAP,
    PICK_REQUEST,
    PICK_COMPLETION,
    PICK_PEEK,
    PICK_COUNT
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    uint8_t out[128];
    size_t len = 0;
    int rc;
    switch ((enum pick)(data[0] % PICK_COUNT)) {
    case PICK_INFO:
        rc = orb_shm_info_decode(in, n);
        check(rc == 0 || rc == ORB_EPROTO, "INFO outcome");
        if (rc == 0) {
            rc = orb_shm_info_encode(out, sizeof out, &len);
            same_bytes(rc, out, len, in, n);
        }
        break;
    case PICK_INFO_OK: {
        struct orb_shm_info m;
        rc = orb_shm_info_ok_decode(in, n, &m);
        check(rc == 0 || rc == ORB_EPROTO, "INFO_OK outcome");
        if (rc == 0) {
            check(strlen(m.boot_id) == ORB_BOOT_ID_LEN && orb_samehost_boot_id_valid(m.boot_id, ORB_BOOT_ID_LEN),
                  "INFO_OK boot id");
            rc = orb_shm_info_ok_encode(&m, out, sizeof out, &len);
            same_bytes(rc, out, len, in, n);
        }
        break;
    }
    case PICK_QUERY: {
        struct orb_shm_query m;
        rc = orb_shm_query_decode(in, n, &m);
        check(rc == 0 || rc == ORB_EPROTO, "QUERY outcome");
        if (rc == 0) {
            check((m.op == ORB_OP_READ || m.op == ORB_OP_WRITE) && m.length > 0 && m.addr + m.length > m.addr,
                  "QUERY promises");
            rc = orb_shm_query_encode(&m, out, sizeof out, &len);
            same_bytes(rc, out, len, in, n);
        }
        break;
    }
    case PICK_QUERY_OK: {
        struct orb_shm_query_ok m;
        rc = orb_shm_query_ok_decode(in, n, &m);
        check(rc == 0 || rc == ORB_EPROTO, "QUERY_OK outcome");
        if (rc == 0) {
            check(m.status <= 0 && m.status >= ORB_EAGAIN, "QUERY_OK status");
            check(m.status == 0 ? m.length > 0 && m.base + m.length > m.base : m.base == 0 && m.length == 0,
                  "QUERY_OK range");
            rc = orb_shm_query_ok_encode(&m, out, sizeof out, &len);
            same_bytes(rc, out, len, in, n);
        }
        break;
    }
    case PICK_SETUP: {
        struct orb_shm_setup m;
        rc = orb_shm_setup_decode(in, n, &m);
        check(rc == 0 || rc == ORB_EPROTO, "SETUP outcome");
        if (rc == 0) {
            check(m.bytes != 0 && m.bytes == orb_shm_setup_bytes(m.request_capacity, m.completion_capacity) &&
                  orb_sh_ring_bytes(m.request_capacity) != 0 && orb_sh_ring_bytes(m.completion_capacity) != 0,
                  "SETUP promises");
            rc = orb_shm_setup_encode(&m, out, sizeof out, &len);
            same_bytes(rc, out, len, in, n);
        }
        break;
    }
    case PICK_SETUP_OK:
    case PICK_MAP_OK: {
        uint8_t kind = data[0] % PICK_COUNT == PICK_SETUP_OK ? ORB_SHM_SETUP_OK : ORB_SHM_MAP_OK;
        struct orb_shm_status m;
        rc = orb_shm_status_decode(kind, in, n, &m);
        check(rc == 0 || rc == ORB_EPROTO, "status outcome");
        if (rc == 0) {
            check(m.status <= 0 && m.status >= ORB_EAGAIN && (kind == ORB_SHM_SETUP_OK) == (m.map_id == 0),
                  "status promises");
            rc = orb_shm_status_encode(kind, &m, out, sizeof out, &len);
            same_bytes(rc, out, len, in, n);
        }
        break;
    }
    case PICK_MAP: {
        struct orb_shm_map m;
        rc = orb_shm_map_decode(in, n, &m);
        check(rc == 0 || rc == ORB_EPROTO, "MAP outcome");
        if (rc == 0) {
            check(m.map_id != 0 && m.map_id <= ORB_SHM_MAPS_MAX && m.writable <= 1 && m.length > 0 &&
                  m.length % 4096 == 0 && m.length <= ORB_SHM_MAP_LEN_MAX && m.file_offset % 4096 == 0 &&
                  m.file_offset + m.length > m.file_offset, "MAP promises");
            rc = orb_shm_map_encode(&m, out, sizeof out, &len);
            same_bytes(rc, out, len, in, n);
        }
        break;
    }
    case PICK_UNMAP: {
        uint32_t id = 0;
        rc = orb_shm_unmap_decode(in, n, &id);
        check(rc == 0 || rc == ORB_EPROTO, "UNMAP outcome");
        if (rc == 0) {
            check(id != 0, "UNMAP map id");
            rc = orb_shm_unmap_encode(id, out, sizeof out, &len);
            same_bytes(rc, out, len, in, n);
        }
        break;
    }
    case PICK_REQUEST: {
        if (n < ORB_SH_RING_ENTRY)
            break;
        struct orb_shm_request m;
        rc = orb_shm_request_decode(in, &m);
        check(rc == 0 || rc == ORB_EPROTO, "REQUEST outcome");
        if (rc == 0) {
            check((m.op == ORB_OP_READ || m.op == ORB_OP_WRITE) && m.map_id != 0 && m.length > 0 &&
                  m.map_offset + m.length > m.map_offset && m.remote_addr >= m.request_addr &&
                  m.remote_addr + m.length > m.remote_addr &&
                  m.remote_addr + m.length <= m.request_addr + m.request_length &&
                  m.request_addr + m.request_length > m.request_addr, "REQUEST promises");
            rc = orb_shm_request_encode(&m, out);
            same_bytes(rc, out, ORB_SH_RING_ENTRY, in, ORB_SH_RING_ENTRY);
        }
        break;
    }
    case PICK_COMPLETION: {
        if (n < ORB_SH_RING_ENTRY)
            break;
        struct orb_shm_completion m;
        rc = orb_shm_completion_decode(in, &m);
        check(rc == 0 || rc == ORB_EPROTO, "COMPLETION outcome");
        if (rc == 0) {
            size_t w = strnlen(m.why, sizeof m.why);
            check(w <= ORB_SHM_WHY_MAX && m.status <= 0 && m.status >= ORB_EAGAIN &&
                  (m.effect == ORB_REMOTE_EFFECT_NONE || m.effect == ORB_REMOTE_EFFECT_UNKNOWN), "COMPLETION promises");
            for (size_t i = 0; i < w; i++)
                check(m.why[i] >= 0x20 && m.why[i] <= 0x7e, "COMPLETION why printable");
            rc = orb_shm_completion_encode(&m, out);
            same_bytes(rc, out, ORB_SH_RING_ENTRY, in, ORB_SH_RING_ENTRY);
        }
        break;
    }
    case PICK_PEEK:
    case PICK_COUNT: {
        uint8_t kind = 0;
        rc = orb_shm_peek_kind(in, n, &kind);
        check(rc == 0 || rc == ORB_EPROTO, "peek outcome");
        if (rc == 0)
            check(n >= 4 && kind == in[0] && in[1] == ORB_SHM_VERSION && in[2] == 0 && in[3] == 0, "peek promises");
        break;
    }
    }
    return 0;
}
