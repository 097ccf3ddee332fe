/* The text form of source epochs: 32 lowercase hex digits. */
#include <string.h>

#include "core/ascii.h"
#include "error.h"

ORB_EXPORT int orb_epoch_format(const struct orb_epoch *epoch, char *buf, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    if (epoch == NULL || buf == NULL || len < ORB_EPOCH_HEX_LEN + 1)
        return orb_fail(ORB_EINVAL, "orb_epoch_format: NULL argument or buffer shorter than %d bytes",
                        ORB_EPOCH_HEX_LEN + 1);
    for (size_t i = 0; i < sizeof epoch->bytes; i++) {
        buf[2 * i] = digits[epoch->bytes[i] >> 4];
        buf[2 * i + 1] = digits[epoch->bytes[i] & 0xf];
    }
    buf[ORB_EPOCH_HEX_LEN] = '\0';
    return 0;
}

ORB_EXPORT int orb_epoch_parse(const char *text, struct orb_epoch *out)
{
    if (text == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_epoch_parse: NULL argument");
    size_t n = strnlen(text, ORB_EPOCH_HEX_LEN + 1);
    if (n != ORB_EPOCH_HEX_LEN)
        return orb_fail(ORB_EINVAL, "an epoch is exactly %d hex digits (got %s%zu)", ORB_EPOCH_HEX_LEN,
                        n > ORB_EPOCH_HEX_LEN ? "more than " : "", n > ORB_EPOCH_HEX_LEN ? n - 1 : n);
    struct orb_epoch e;
    for (size_t i = 0; i < sizeof e.bytes; i++) {
        int hi = orb_ascii_hex_value(text[2 * i]), lo = orb_ascii_hex_value(text[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return orb_fail(ORB_EINVAL, "epoch text has a non-hex character at offset %zu",
                            hi < 0 ? 2 * i : 2 * i + 1);
        e.bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    *out = e;
    return 0;
}
