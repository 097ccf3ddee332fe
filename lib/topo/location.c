/* Location strings: strict parse, canonical format. */
#include "topo/location.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"

/* Room for a quoted location in a message: longer texts are cut with "...". */
#define LOCATION_QUOTE_MAX 40

void orb_topo_quote_text(const char *text, char *buf, size_t len)
{
    if (len == 0)
        return;
    if (!text) {
        snprintf(buf, len, "(null)");
        return;
    }
    size_t out = 0;
    size_t i = 0;
    for (; text[i] != '\0' && out + 1 < len; i++) {
        unsigned char c = (unsigned char)text[i];
        buf[out++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    buf[out] = '\0';
    if (text[i] != '\0' && len >= 4) {
        /* Cut: overwrite the tail with "..." so that the reader knows. */
        memcpy(buf + (out >= 3 ? out - 3 : 0), "...", 4);
    }
}

/* Parse the decimal index that starts at `digits` (the rest of the string). `max` bounds it. */
static int parse_index(const char *text, const char *digits, unsigned max, uint8_t *index_out)
{
    char shown[LOCATION_QUOTE_MAX];
    orb_topo_quote_text(text, shown, sizeof shown);
    if (digits[0] == '\0')
        return orb_fail(ORB_EINVAL, "location \"%s\": the index is missing", shown);
    if (digits[0] == '0' && digits[1] != '\0')
        return orb_fail(ORB_EINVAL, "location \"%s\": the index has a leading zero", shown);
    unsigned value = 0;
    for (const char *p = digits; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            return orb_fail(ORB_EINVAL,
                            "location \"%s\": the index must be decimal digits only (no sign or "
                            "space)",
                            shown);
        /* Stop accumulating past the bound: the value is rejected anyway, and cannot wrap. */
        if (value <= max)
            value = value * 10u + (unsigned)(*p - '0');
    }
    if (value > max)
        return orb_fail(ORB_EINVAL, "location \"%s\": the index is over the maximum %u", shown,
                        max);
    *index_out = (uint8_t)value;
    return 0;
}

int orb_location_parse(const char *text, struct orb_location *out)
{
    if (!text || !out)
        return orb_fail(ORB_EINVAL, "location parse: NULL argument");
    struct orb_location loc = {0, 0};
    int rc;
    if (strcmp(text, "*") == 0) {
        loc.kind = ORB_LOC_ANY;
    } else if (strncmp(text, "cpu:", 4) == 0) {
        loc.kind = ORB_LOC_CPU;
        rc = parse_index(text, text + 4, ORB_LOCATION_CPU_MAX, &loc.index);
        if (rc != 0)
            return rc;
    } else if (strncmp(text, "cuda:", 5) == 0) {
        loc.kind = ORB_LOC_CUDA;
        rc = parse_index(text, text + 5, ORB_LOCATION_CUDA_MAX, &loc.index);
        if (rc != 0)
            return rc;
    } else {
        char shown[LOCATION_QUOTE_MAX];
        orb_topo_quote_text(text, shown, sizeof shown);
        return orb_fail(ORB_EINVAL, "location \"%s\": expected \"cpu:N\", \"cuda:N\" or \"*\"",
                        shown);
    }
    *out = loc;
    return 0;
}

int orb_location_format(struct orb_location loc, char *buf, size_t len)
{
    if (!buf)
        return orb_fail(ORB_EINVAL, "location format: NULL buffer");
    int n;
    switch (loc.kind) {
    case ORB_LOC_ANY:
        if (loc.index != 0)
            return orb_fail(ORB_EINVAL, "location format: \"*\" has no index (got %u)", loc.index);
        n = snprintf(buf, len, "*");
        break;
    case ORB_LOC_CPU:
        if (loc.index > ORB_LOCATION_CPU_MAX)
            return orb_fail(ORB_EINVAL, "location format: cpu index %u is over %u", loc.index,
                            ORB_LOCATION_CPU_MAX);
        n = snprintf(buf, len, "cpu:%u", loc.index);
        break;
    case ORB_LOC_CUDA:
        if (loc.index > ORB_LOCATION_CUDA_MAX)
            return orb_fail(ORB_EINVAL, "location format: cuda index %u is over %u", loc.index,
                            ORB_LOCATION_CUDA_MAX);
        n = snprintf(buf, len, "cuda:%u", loc.index);
        break;
    default:
        return orb_fail(ORB_EINVAL, "location format: unknown kind %u", loc.kind);
    }
    if (n < 0 || (size_t)n >= len)
        return orb_fail(ORB_EINVAL, "location format: buffer of %zu bytes is too small", len);
    return 0;
}

int orb_location_mem_type(struct orb_location loc)
{
    switch (loc.kind) {
    case ORB_LOC_ANY: return ORB_MEM_TYPE_ANY;
    case ORB_LOC_CPU: return ORB_MEM_TYPE_HOST;
    case ORB_LOC_CUDA: return ORB_MEM_TYPE_CUDA;
    default: return orb_fail(ORB_EINVAL, "location: unknown kind %u", loc.kind);
    }
}
