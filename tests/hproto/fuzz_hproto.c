/* Fuzz target for the helper protocol codec. The input is a datagram: it is parsed, and when the
 * header is accepted the message goes through every decoder of its type, each success having to
 * re-encode to the very same bytes. Independently of the header, the bytes after it are decoded
 * as the body of every message type (unknown ones too). Any decoder result other than 0 or
 * ORB_EPROTO aborts. Built with -fsanitize=fuzzer under clang and replayed over the committed
 * corpus by fuzz_hproto_replay in every build. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <orbite/orbite.h>

#include "common/helper_proto.h"
#include "hp_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct orb_hp_msg m;
    int rc = orb_hp_parse(data, size, &m);
    if (rc != 0 && rc != ORB_EPROTO) {
        fprintf(stderr, "fuzz_hproto: parse returned %d\n", rc);
        abort();
    }
    if (rc == 0) {
        if (m.body != data + ORB_HP_HEADER_LEN || m.body_len != size - ORB_HP_HEADER_LEN ||
            m.hdr.length != size) {
            fprintf(stderr, "fuzz_hproto: parse split the datagram wrongly\n");
            abort();
        }
        (void)hp_check_own_type(&m, data, size);
    }
    const uint8_t *body = size > ORB_HP_HEADER_LEN ? data + ORB_HP_HEADER_LEN : data;
    size_t body_len = size > ORB_HP_HEADER_LEN ? size - ORB_HP_HEADER_LEN : size;
    hp_check_every_type(body, body_len, 1);
    /* The name rule on raw bytes, up to one past its maximum. */
    (void)orb_hp_name_valid((const char *)data, size < ORB_HP_NAME_MAX + 1 ? size : ORB_HP_NAME_MAX + 1);
    return 0;
}
