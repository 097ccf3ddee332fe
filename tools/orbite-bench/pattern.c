/* orbite-bench: deterministic byte pattern (see pattern.h). */
#include "pattern.h"

#include <string.h>

#define PATTERN_GOLDEN 0x9e3779b97f4a7c15ull
#define PATTERN_CHUNK 4096

uint64_t bench_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t pattern_word(uint64_t seed, uint64_t word_index)
{
    return bench_mix64(seed + word_index * PATTERN_GOLDEN);
}

uint8_t bench_pattern_byte(uint64_t seed, uint64_t offset)
{
    return (uint8_t)(pattern_word(seed, offset / 8) >> ((offset % 8) * 8));
}

/* Store a word least significant byte first, whatever the host byte order. */
static void store_le64(uint8_t *p, uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &v, sizeof v);
#else
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
#endif
}

void bench_pattern_fill(void *buf, size_t len, uint64_t seed, uint64_t offset)
{
    uint8_t *p = buf;
    /* Leading bytes up to a word boundary of the pattern. */
    while (len > 0 && offset % 8 != 0) {
        *p++ = bench_pattern_byte(seed, offset++);
        len--;
    }
    uint64_t word = offset / 8;
    while (len >= 8) {
        store_le64(p, pattern_word(seed, word++));
        p += 8;
        len -= 8;
    }
    offset = word * 8;
    while (len > 0) {
        *p++ = bench_pattern_byte(seed, offset++);
        len--;
    }
}

size_t bench_pattern_check(const void *buf, size_t len, uint64_t seed, uint64_t offset)
{
    const uint8_t *p = buf;
    uint8_t expect[PATTERN_CHUNK];
    size_t done = 0;
    while (done < len) {
        size_t n = len - done < PATTERN_CHUNK ? len - done : PATTERN_CHUNK;
        bench_pattern_fill(expect, n, seed, offset + done);
        if (memcmp(p + done, expect, n) != 0) {
            for (size_t i = 0; i < n; i++) {
                if (p[done + i] != expect[i])
                    return done + i;
            }
        }
        done += n;
    }
    return len;
}
