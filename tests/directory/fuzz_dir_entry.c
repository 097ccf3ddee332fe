/* Fuzz target for what the endpoint directory reads back from etcd (lib/directory/entry.c): the
 * first input byte picks the stored-value decoder or the base64 decoder, the rest is the input.
 * Beyond memory safety it checks (abort on failure): the outcomes are 0 and ORB_EPROTO only; a
 * decoded entry keeps its promises (NUL-terminated endpoint and host, at most the regions
 * allowed, each a non-empty range with a peer permission) and, encoded again, decodes to the same
 * entry; decoded base64 encodes back to the same text. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

#include "directory/entry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_dir_entry: invariant broken: %s (last error: %s)\n", what, orb_last_error());
        abort();
    }
}

static struct orb_directory_entry a, b;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    if (data[0] % 2 == 0) {
        memset(&a, 0, sizeof a);
        int rc = orb_dir_entry_decode(in, n, &a);
        check(rc == 0 || rc == ORB_EPROTO, "decode returns 0 or ORB_EPROTO");
        if (rc != 0)
            return 0;
        check(memchr(a.endpoint, '\0', sizeof a.endpoint) != NULL, "endpoint terminated");
        check(memchr(a.host, '\0', sizeof a.host) != NULL, "host terminated");
        check(a.nregions <= ORB_DIRECTORY_REGIONS_MAX, "regions bounded");
        for (uint32_t i = 0; i < a.nregions; i++) {
            check(a.regions[i].length > 0, "non-empty region");
            check(a.regions[i].addr <= UINT64_MAX - a.regions[i].length, "region within 64 bits");
            check(a.regions[i].perm == ORB_PERM_REMOTE_READ || a.regions[i].perm == ORB_PERM_REMOTE_WRITE,
                  "peer permission");
        }
        char *text = orb_dir_entry_encode(&a);
        check(text != NULL, "a decoded entry encodes");
        memset(&b, 0, sizeof b);
        check(orb_dir_entry_decode((const uint8_t *)text, strlen(text), &b) == 0, "its encoding decodes");
        check(memcmp(&a, &b, sizeof a) == 0, "to the same entry");
        free(text);
    } else {
        uint8_t *out = NULL;
        size_t len = 0;
        int rc = orb_dir_b64_decode((const char *)in, n, &out, &len);
        check(rc == 0 || rc == ORB_EPROTO, "base64 decode returns 0 or ORB_EPROTO");
        if (rc != 0)
            return 0;
        char *again = orb_dir_b64_encode(out, len);
        check(again != NULL && strlen(again) == n && memcmp(again, in, n) == 0, "canonical base64 round trip");
        free(again);
        free(out);
    }
    return 0;
}
