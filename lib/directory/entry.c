/* The directory's stored value: a small JSON object, written here and checked field by field
 * when read back.
 *
 *   {"v": 1, "endpoint": "10.0.0.5:40123", "epoch": "<32 hex>", "host": "gpu-node-7",
 *    "regions": [["0x7f0000000000", "0x100000", 3, 0, 0], ...]}
 *
 * Addresses and lengths are hex strings (they span all 64 bits; JSON numbers do not). A region is
 * [address, length, permission (1 READ or 3 WRITE), memory kind, GPU direct routes]. */
#include "directory/entry.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define ENTRY_VERSION 1

int orb_dir_check_name(const char *name)
{
    if (name == NULL)
        return orb_fail(ORB_EINVAL, "directory: no name");
    size_t n = strnlen(name, ORB_DIRECTORY_NAME_MAX);
    if (n == 0 || n >= ORB_DIRECTORY_NAME_MAX)
        return orb_fail(ORB_EINVAL, "directory: a name is 1..%d bytes", ORB_DIRECTORY_NAME_MAX - 1);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == ':' || c == '-'))
            return orb_fail(ORB_EINVAL, "directory: name byte %zu (0x%02x) is not one of [A-Za-z0-9._:-]", i,
                            (unsigned char)c);
    }
    return 0;
}

int orb_dir_check_prefix(const char *prefix)
{
    if (prefix == NULL)
        return orb_fail(ORB_EINVAL, "directory: no prefix");
    size_t n = strnlen(prefix, ORB_DIR_PREFIX_MAX + 1);
    if (n < 1 || n > ORB_DIR_PREFIX_MAX || prefix[0] != '/' || prefix[n - 1] != '/')
        return orb_fail(ORB_EINVAL, "directory: prefix \"%.40s\" must start and end with '/' and be at most %u bytes",
                        prefix, ORB_DIR_PREFIX_MAX);
    for (size_t i = 0; i < n; i++) {
        char c = prefix[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == ':' || c == '-' || c == '/'))
            return orb_fail(ORB_EINVAL, "directory: prefix byte %zu (0x%02x) is not one of [A-Za-z0-9._:/-]", i,
                            (unsigned char)c);
    }
    /* Components between slashes: none empty, none "." or "..". */
    for (size_t i = 1; i < n;) {
        size_t j = i;
        while (prefix[j] != '/')
            j++;
        size_t len = j - i;
        if (n > 1 && (len == 0 || (len == 1 && prefix[i] == '.') || (len == 2 && prefix[i] == '.' && prefix[i + 1] == '.')))
            return orb_fail(ORB_EINVAL, "directory: prefix \"%s\" has an empty, \".\" or \"..\" component", prefix);
        i = j + 1;
    }
    return 0;
}

static json_t *hex(uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "0x%llx", (unsigned long long)v);
    return json_string(buf);
}

char *orb_dir_entry_encode(const struct orb_directory_entry *e)
{
    if (e == NULL || e->nregions > ORB_DIRECTORY_REGIONS_MAX) {
        orb_fail(ORB_EINVAL, "directory: no entry, or too many regions");
        return NULL;
    }
    char epoch[ORB_EPOCH_HEX_LEN + 1];
    if (orb_epoch_format(&e->epoch, epoch, sizeof epoch) != 0)
        return NULL;
    json_t *regions = json_array();
    for (uint32_t i = 0; regions != NULL && i < e->nregions; i++) {
        const struct orb_region_desc *r = &e->regions[i];
        json_t *row = json_pack("[o,o,i,i,i]", hex(r->addr), hex(r->length), (int)r->perm, (int)r->memory_kind,
                                (int)r->gpu_direct_routes);
        if (row == NULL || json_array_append_new(regions, row) != 0) {
            json_decref(regions);
            regions = NULL;
        }
    }
    json_t *doc = regions == NULL ? NULL
                                  : json_pack("{s:i,s:s,s:s,s:s,s:o}", "v", ENTRY_VERSION, "endpoint", e->endpoint,
                                              "epoch", epoch, "host", e->host, "regions", regions);
    char *text = doc != NULL ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (text == NULL)
        orb_fail(ORB_ENOMEM, "directory: no memory for an entry");
    return text;
}

/* A string field of at most `cap - 1` bytes, copied NUL-terminated. */
static int get_text(json_t *doc, const char *key, char *out, size_t cap)
{
    json_t *v = json_object_get(doc, key);
    if (!json_is_string(v))
        return orb_fail(ORB_EPROTO, "directory: the entry's \"%s\" is missing or not a string", key);
    size_t n = json_string_length(v);
    if (n == 0 || n >= cap || memchr(json_string_value(v), '\0', n) != NULL)
        return orb_fail(ORB_EPROTO, "directory: the entry's \"%s\" is empty, longer than %zu bytes or holds a NUL",
                        key, cap - 1);
    memcpy(out, json_string_value(v), n + 1);
    return 0;
}

/* "0x" and 1..16 hex digits. */
static int get_hex(json_t *v, uint64_t *out)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    size_t n = s != NULL ? json_string_length(v) : 0;
    if (n < 3 || n > 18 || s[0] != '0' || s[1] != 'x')
        return -1;
    uint64_t x = 0;
    for (size_t i = 2; i < n; i++) {
        char c = s[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) : 16;
        if (d == 16)
            return -1;
        x = x << 4 | d;
    }
    *out = x;
    return 0;
}

static int get_small(json_t *v, int lo, int hi, int *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return -1;
    *out = (int)json_integer_value(v);
    return 0;
}

int orb_dir_entry_decode(const uint8_t *value, size_t len, struct orb_directory_entry *out)
{
    if (value == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "directory: NULL argument");
    if (len > ORB_DIR_VALUE_MAX)
        return orb_fail(ORB_EPROTO, "directory: the entry is %zu bytes, more than %u", len, ORB_DIR_VALUE_MAX);
    json_error_t err;
    json_t *doc = json_loadb((const char *)value, len, JSON_REJECT_DUPLICATES, &err);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return orb_fail(ORB_EPROTO, "directory: the entry is not a JSON object (%s)", doc == NULL ? err.text : "");
    }
    struct orb_directory_entry e;
    memset(&e, 0, sizeof e);
    int v = 0, rc = 0;
    char epoch[ORB_EPOCH_HEX_LEN + 2];
    if (get_small(json_object_get(doc, "v"), ENTRY_VERSION, ENTRY_VERSION, &v) != 0)
        rc = orb_fail(ORB_EPROTO, "directory: the entry's version is not %d", ENTRY_VERSION);
    if (rc == 0)
        rc = get_text(doc, "endpoint", e.endpoint, sizeof e.endpoint);
    if (rc == 0)
        rc = get_text(doc, "host", e.host, sizeof e.host);
    if (rc == 0)
        rc = get_text(doc, "epoch", epoch, sizeof epoch);
    if (rc == 0 && (strlen(epoch) != ORB_EPOCH_HEX_LEN || orb_epoch_parse(epoch, &e.epoch) != 0))
        rc = orb_fail(ORB_EPROTO, "directory: the entry's epoch is not 32 hex digits");
    json_t *regions = json_object_get(doc, "regions");
    if (rc == 0 && (!json_is_array(regions) || json_array_size(regions) > ORB_DIRECTORY_REGIONS_MAX))
        rc = orb_fail(ORB_EPROTO, "directory: the entry's regions are not an array of at most %d",
                      ORB_DIRECTORY_REGIONS_MAX);
    for (size_t i = 0; rc == 0 && i < json_array_size(regions); i++) {
        json_t *row = json_array_get(regions, i);
        struct orb_region_desc *r = &e.regions[i];
        int perm = 0, kind = 0, routes = 0;
        if (!json_is_array(row) || json_array_size(row) != 5 || get_hex(json_array_get(row, 0), &r->addr) != 0 ||
            get_hex(json_array_get(row, 1), &r->length) != 0 ||
            get_small(json_array_get(row, 2), 1, 3, &perm) != 0 || perm == 2 ||
            get_small(json_array_get(row, 3), 0, 255, &kind) != 0 ||
            get_small(json_array_get(row, 4), 0, 255, &routes) != 0 || r->length == 0 ||
            r->addr > UINT64_MAX - r->length)
            rc = orb_fail(ORB_EPROTO, "directory: the entry's region %zu is not [address, length, permission 1 or 3, "
                          "kind, routes] with a non-empty range", i);
        r->perm = (enum orb_perm)perm;
        r->memory_kind = (uint32_t)kind;
        r->gpu_direct_routes = (uint32_t)routes;
    }
    if (rc == 0)
        e.nregions = (uint32_t)json_array_size(regions); /* `regions` is doc's: read before it goes */
    json_decref(doc);
    if (rc != 0)
        return rc;
    memcpy(e.name, out->name, sizeof e.name);
    e.revision = out->revision;
    *out = e;
    return 0;
}

/* ---- base64 ------------------------------------------------------------------------------------ */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *orb_dir_b64_encode(const uint8_t *in, size_t len)
{
    size_t n = (len + 2) / 3 * 4;
    char *out = malloc(n + 1);
    if (out == NULL)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < len ? in[i + 2] : 0);
        out[o++] = b64[v >> 18 & 63];
        out[o++] = b64[v >> 12 & 63];
        out[o++] = i + 1 < len ? b64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? b64[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

static int b64_value(char c)
{
    const char *p = c != '\0' ? strchr(b64, c) : NULL;
    return p != NULL ? (int)(p - b64) : -1;
}

int orb_dir_b64_decode(const char *in, size_t len, uint8_t **out, size_t *out_len)
{
    if (len % 4 != 0)
        return orb_fail(ORB_EPROTO, "directory: base64 of %zu characters (not a multiple of 4)", len);
    uint8_t *buf = malloc(len / 4 * 3 + 1);
    if (buf == NULL)
        return orb_fail(ORB_ENOMEM, "directory: no memory to decode a value");
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int a = b64_value(in[i]), b = b64_value(in[i + 1]);
        bool last = i + 4 == len;
        int c = last && in[i + 2] == '=' ? -2 : b64_value(in[i + 2]);
        int d = last && in[i + 3] == '=' ? -2 : b64_value(in[i + 3]);
        if (a < 0 || b < 0 || c == -1 || d == -1 || (c == -2 && d != -2) || (c == -2 && (b & 15) != 0) ||
            (c >= 0 && d == -2 && (c & 3) != 0)) {
            free(buf);
            return orb_fail(ORB_EPROTO, "directory: not canonical base64 at character %zu", i);
        }
        buf[o++] = (uint8_t)(a << 2 | b >> 4);
        if (c >= 0)
            buf[o++] = (uint8_t)((b & 15) << 4 | c >> 2);
        if (d >= 0)
            buf[o++] = (uint8_t)((c & 3) << 6 | d);
    }
    *out = buf;
    *out_len = o;
    return 0;
}
