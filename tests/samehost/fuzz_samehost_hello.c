/* Fuzz target for the same-host HELLO (lib/samehost/proof.c). Beyond memory safety it checks
 * (abort on failure): the only outcomes are 0 and ORB_EPROTO; a decoded HELLO has a valid boot id
 * and a pid, and encodes again to exactly the input bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

#include "samehost/proof.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_samehost_hello: invariant broken: %s (last error: %s)\n", what, orb_last_error());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct orb_samehost_hello h;
    int rc = orb_samehost_hello_decode(data, size, &h);
    check(rc == 0 || rc == ORB_EPROTO, "outcome");
    if (rc == 0) {
        check(orb_samehost_boot_id_valid(h.boot_id, strlen(h.boot_id)) && h.pid != 0, "promises");
        uint8_t out[ORB_SAMEHOST_HELLO_LEN];
        check(orb_samehost_hello_encode(&h, out) == 0, "re-encode");
        check(size == sizeof out && memcmp(out, data, size) == 0, "same bytes");
    }
    return 0;
}
