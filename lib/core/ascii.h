/* Character classes of the strict text parsers (policy, sysfs, epochs, slot names, config):
 * ASCII only, whatever the locale, unlike <ctype.h>. */
#ifndef ORB_CORE_ASCII_H
#define ORB_CORE_ASCII_H

#include <stdbool.h>

static inline bool orb_ascii_is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The value of a hexadecimal digit (either case), or -1. */
static inline int orb_ascii_hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
