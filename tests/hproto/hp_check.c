/* Every decoder against one message: results limited to 0 and ORB_EPROTO, acceptance only of the
 * decoder's own type, and (when the raw datagram is given) re-encoding to the same bytes. */
#include "hp_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *decoder, const char *what, int rc)
{
    fprintf(stderr, "hp_check: %s: %s (rc %d)\n", decoder, what, rc);
    abort();
}

/* Check one decoder result; returns 1 when it accepted the message. */
static int judge(const char *decoder, int rc, int own_type)
{
    if (rc != 0 && rc != ORB_EPROTO)
        fail(decoder, "returned neither 0 nor ORB_EPROTO", rc);
    if (rc == 0 && !own_type)
        fail(decoder, "accepted a message of another type", rc);
    return rc == 0;
}

/* out_len is read through a pointer: the encoder call that sets it is another argument of the same
 * call, and argument evaluation order is unspecified. */
static void same_bytes(const char *decoder, int enc_rc, const uint8_t *out, const size_t *out_len,
                       const uint8_t *raw, size_t raw_len)
{
    if (enc_rc != 0)
        fail(decoder, "decoded values do not re-encode", enc_rc);
    if (*out_len != raw_len || memcmp(out, raw, raw_len) != 0)
        fail(decoder, "re-encoding differs from the datagram", 0);
}

/* Run every decoder on `m`. With raw != NULL, each success is re-encoded and compared. */
static int decode_all(const struct orb_hp_msg *m, const uint8_t *raw, size_t raw_len)
{
    static uint8_t out[ORB_HP_MAX_MSG];
    size_t out_len = 0;
    const uint16_t type = m->hdr.type;
    const uint32_t seq = m->hdr.sequence;
    int accepted = 0;

    {
        uint32_t version;
        if (judge("hello", orb_hp_decode_hello(m, &version), type == ORB_HP_HELLO)) {
            accepted++;
            if (version != ORB_HP_VERSION)
                fail("hello", "accepted another version", 0);
            if (raw)
                same_bytes("hello", orb_hp_encode_hello(seq, out, &out_len), out, &out_len, raw, raw_len);
        }
    }
    {
        int32_t st;
        uint32_t version, uid, gid, caps;
        if (judge("hello_reply", orb_hp_decode_hello_reply(m, &st, &version, &uid, &gid, &caps),
                  type == ORB_HP_HELLO_REPLY)) {
            accepted++;
            if (st == 0 && version != ORB_HP_VERSION)
                fail("hello_reply", "accepted another version", 0);
            if (raw)
                same_bytes("hello_reply", orb_hp_encode_hello_reply(seq, st, uid, gid, caps, out, &out_len),
                           out, &out_len, raw, raw_len);
        }
    }
    {
        uint8_t kind;
        uint32_t index;
        if (judge("inventory", orb_hp_decode_inventory(m, &kind, &index), type == ORB_HP_INVENTORY)) {
            accepted++;
            if (raw)
                same_bytes("inventory", orb_hp_encode_inventory(seq, kind, index, out, &out_len), out,
                           &out_len, raw, raw_len);
        }
    }
    for (uint8_t kind = ORB_HP_INV_NIC; kind <= ORB_HP_INV_NUMA; kind++) {
        static struct orb_topo_nic nic;
        static struct orb_topo_gpu gpu;
        static struct orb_topo_numa numa;
        int32_t st;
        uint32_t total;
        if (judge("inventory_reply", orb_hp_decode_inventory_reply(m, kind, &st, &total, &nic, &gpu, &numa),
                  type == ORB_HP_INVENTORY_REPLY)) {
            accepted++;
            if (raw)
                same_bytes("inventory_reply",
                           orb_hp_encode_inventory_reply(seq, st, total, kind, &nic, &gpu, &numa, out,
                                                         &out_len),
                           out, &out_len, raw, raw_len);
        }
    }
    if (judge("empty", orb_hp_decode_empty(m), type == ORB_HP_POLICY || type == ORB_HP_PEERMEM_PROBE)) {
        accepted++;
        if (raw)
            same_bytes("empty", orb_hp_encode_empty(type, seq, out, &out_len), out, &out_len, raw, raw_len);
    }
    {
        static struct orb_hp_policy p;
        int32_t st;
        if (judge("policy_reply", orb_hp_decode_policy_reply(m, &st, &p), type == ORB_HP_POLICY_REPLY)) {
            accepted++;
            if (raw)
                same_bytes("policy_reply", orb_hp_encode_policy_reply(seq, st, &p, out, &out_len), out,
                           &out_len, raw, raw_len);
        }
    }
    {
        char nic[ORB_HP_NAME_MAX + 1];
        if (judge("open_device", orb_hp_decode_open_device(m, nic), type == ORB_HP_OPEN_DEVICE)) {
            accepted++;
            if (!orb_hp_name_valid(nic, strlen(nic)))
                fail("open_device", "accepted an invalid name", 0);
            if (raw)
                same_bytes("open_device", orb_hp_encode_open_device(seq, nic, out, &out_len), out,
                           &out_len, raw, raw_len);
        }
    }
    {
        int32_t st;
        uint32_t nfds;
        if (judge("fd_reply", orb_hp_decode_fd_reply(m, &st, &nfds),
                  type == ORB_HP_OPEN_DEVICE_REPLY || type == ORB_HP_SLOT_REPLY)) {
            accepted++;
            if (nfds > ORB_HP_MAX_FDS || (st == 0) != (nfds != 0))
                fail("fd_reply", "descriptor count inconsistent with status", 0);
            if (raw)
                same_bytes("fd_reply", orb_hp_encode_fd_reply(type, seq, st, nfds, out, &out_len), out,
                           &out_len, raw, raw_len);
        }
    }
    {
        int32_t st;
        uint32_t found;
        if (judge("peermem_reply", orb_hp_decode_peermem_reply(m, &st, &found),
                  type == ORB_HP_PEERMEM_REPLY)) {
            accepted++;
            if (raw)
                same_bytes("peermem_reply", orb_hp_encode_peermem_reply(seq, st, found, out, &out_len), out,
                           &out_len, raw, raw_len);
        }
    }
    {
        char slot[ORB_HP_NAME_MAX + 1];
        uint64_t interval;
        if (judge("slot_attach", orb_hp_decode_slot_attach(m, slot, &interval), type == ORB_HP_SLOT_ATTACH)) {
            accepted++;
            if (!orb_hp_name_valid(slot, strlen(slot)))
                fail("slot_attach", "accepted an invalid name", 0);
            if (raw)
                same_bytes("slot_attach", orb_hp_encode_slot_attach(seq, slot, interval, out, &out_len), out,
                           &out_len, raw, raw_len);
        }
    }
    {
        struct orb_hp_devx_verify v;
        if (judge("devx_verify", orb_hp_decode_devx_verify(m, &v), type == ORB_HP_DEVX_VERIFY)) {
            accepted++;
            if (raw)
                same_bytes("devx_verify", orb_hp_encode_devx_verify(seq, &v, out, &out_len), out,
                           &out_len, raw, raw_len);
        }
    }
    {
        int32_t st;
        int reply = type >= ORB_HP_HELLO_REPLY && type <= ORB_HP_TYPE_MAX && type % 2 == 1;
        if (judge("status", orb_hp_decode_status(m, &st), reply)) {
            accepted++;
            if (st == 0 && type != ORB_HP_DEVX_REPLY)
                fail("status", "bare success accepted for a reply with a body", 0);
            if (raw)
                same_bytes("status", orb_hp_encode_status(type, seq, st, out, &out_len), out, &out_len, raw,
                           raw_len);
        }
    }
    return accepted;
}

int hp_check_own_type(const struct orb_hp_msg *m, const uint8_t *raw, size_t raw_len)
{
    return decode_all(m, raw, raw_len);
}

void hp_check_every_type(const uint8_t *body, size_t body_len, uint32_t sequence)
{
    for (uint16_t type = 0; type <= ORB_HP_TYPE_MAX + 1; type++) {
        struct orb_hp_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = type;
        m.hdr.length = (uint32_t)(ORB_HP_HEADER_LEN + body_len);
        m.hdr.sequence = sequence;
        m.body = body;
        m.body_len = body_len;
        (void)decode_all(&m, NULL, 0);
    }
}
