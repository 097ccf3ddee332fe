/* orbite-bench: the deterministic byte pattern that transfers are verified against.
 *
 * Byte `o` of the pattern with seed `s` is byte (o % 8) (least significant first) of
 * mix64(s + (o / 8) * golden), so any range can be produced or checked from its offset alone,
 * by either process, without transferring a reference copy. */
#ifndef ORBITE_BENCH_PATTERN_H
#define ORBITE_BENCH_PATTERN_H

#include <stddef.h>
#include <stdint.h>

/* A bijective 64-bit mixer (splitmix64 finaliser). */
uint64_t bench_mix64(uint64_t x);

/* Write pattern bytes [offset, offset + len) of `seed` into `buf`. */
void bench_pattern_fill(void *buf, size_t len, uint64_t seed, uint64_t offset);

/* Compare `buf` with pattern bytes [offset, offset + len) of `seed`. Returns `len` when they
 * match, else the index of the first differing byte. */
size_t bench_pattern_check(const void *buf, size_t len, uint64_t seed, uint64_t offset);

/* Pattern byte at `offset`. */
uint8_t bench_pattern_byte(uint64_t seed, uint64_t offset);

#endif
