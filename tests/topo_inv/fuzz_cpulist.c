/* Fuzz target for the sysfs cpulist parser. Beyond memory safety it checks (abort on failure):
 *  - the only outcomes are success or ORB_ECONFIG with a message, and a refusal leaves the output
 *    untouched;
 *  - an accepted list printed back in the kernel's form ("a-b" runs, commas) parses to the same
 *    set. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "topo/cpuset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_cpulist: invariant broken: %s (last error: %s)\n", what, orb_last_error());
        abort();
    }
}

/* The kernel's spelling of `s` into buf; its length. */
static size_t print_list(const struct orb_cpuset *s, char *buf, size_t cap)
{
    size_t used = 0;
    for (uint32_t c = 0; c < ORB_CPUSET_MAX; c++) {
        if (!orb_cpuset_has(s, c))
            continue;
        uint32_t end = c;
        while (end + 1 < ORB_CPUSET_MAX && orb_cpuset_has(s, end + 1))
            end++;
        int n = end > c ? snprintf(buf + used, cap - used, "%s%u-%u", used ? "," : "", c, end)
                        : snprintf(buf + used, cap - used, "%s%u", used ? "," : "", c);
        check(n > 0 && (size_t)n < cap - used, "printed list fits");
        used += (size_t)n;
        c = end;
    }
    return used;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct orb_cpuset s, before;
    memset(&s, 0x3c, sizeof s);
    before = s;
    int rc = orb_cpulist_parse((const char *)data, size, &s);
    if (rc != 0) {
        check(rc == ORB_ECONFIG, "refusal is ORB_ECONFIG");
        check(orb_last_error()[0] != '\0', "refusal has a message");
        check(memcmp(&s, &before, sizeof s) == 0, "refusal leaves the output alone");
        return 0;
    }
    static char buf[16384];
    size_t len = print_list(&s, buf, sizeof buf);
    struct orb_cpuset again;
    check(orb_cpulist_parse(buf, len, &again) == 0, "printed list parses");
    check(memcmp(&s, &again, sizeof s) == 0, "printed list is the same set");
    return 0;
}
