/* CPU lists from sysfs (see cpuset.h). */
#include "topo/cpuset.h"

#include <string.h>

#include "core/ascii.h"
#include "core/error.h"

/* A decimal CPU number at text[*pos], advancing *pos past it. */
static int parse_cpu(const char *text, size_t len, size_t *pos, uint32_t *out)
{
    size_t i = *pos;
    if (i >= len || !orb_ascii_is_digit(text[i]))
        return orb_fail(ORB_ECONFIG, "cpulist: a CPU number expected at byte %zu", i);
    if (text[i] == '0' && i + 1 < len && orb_ascii_is_digit(text[i + 1]))
        return orb_fail(ORB_ECONFIG, "cpulist: a leading zero at byte %zu", i);
    uint32_t v = 0;
    for (; i < len && orb_ascii_is_digit(text[i]); i++) {
        v = v * 10u + (uint32_t)(text[i] - '0');
        if (v >= ORB_CPUSET_MAX)
            return orb_fail(ORB_ECONFIG, "cpulist: CPU numbers stop at %u", ORB_CPUSET_MAX - 1);
    }
    *pos = i;
    *out = v;
    return 0;
}

int orb_cpulist_parse(const char *text, size_t len, struct orb_cpuset *out)
{
    if (text == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "cpulist: NULL argument");
    if (len > ORB_CPULIST_MAX_BYTES)
        return orb_fail(ORB_ECONFIG, "cpulist: longer than %u bytes", ORB_CPULIST_MAX_BYTES);
    if (len > 0 && text[len - 1] == '\n')
        len--;
    struct orb_cpuset s;
    memset(&s, 0, sizeof s);
    size_t pos = 0;
    while (pos < len) {
        uint32_t first, last;
        int rc = parse_cpu(text, len, &pos, &first);
        if (rc != 0)
            return rc;
        last = first;
        if (pos < len && text[pos] == '-') {
            pos++;
            if ((rc = parse_cpu(text, len, &pos, &last)) != 0)
                return rc;
            if (last < first)
                return orb_fail(ORB_ECONFIG, "cpulist: the range %u-%u runs backwards", first, last);
        }
        for (uint32_t c = first; c <= last; c++)
            orb_cpuset_add(&s, c);
        if (pos < len) {
            if (text[pos] != ',' || pos + 1 == len)
                return orb_fail(ORB_ECONFIG, "cpulist: ',' between items expected at byte %zu", pos);
            pos++;
        }
    }
    *out = s;
    return 0;
}

uint32_t orb_cpuset_count(const struct orb_cpuset *s)
{
    uint32_t n = 0;
    for (unsigned w = 0; w < ORB_CPUSET_WORDS; w++)
        n += (uint32_t)__builtin_popcountll(s->bits[w]);
    return n;
}

void orb_cpuset_and(struct orb_cpuset *dst, const struct orb_cpuset *a, const struct orb_cpuset *b)
{
    for (unsigned w = 0; w < ORB_CPUSET_WORDS; w++)
        dst->bits[w] = a->bits[w] & b->bits[w];
}
