/* Internal: random bytes from the kernel (getrandom), for epochs, nonces and identifiers. */
#ifndef ORB_CORE_RANDOM_H
#define ORB_CORE_RANDOM_H

#include <stddef.h>
#include <stdint.h>

/* Fill `buf` with `n` random bytes. Up to 32 bytes come from a per-thread pool the kernel
 * refills (no byte handed out twice, nor in a fork child); more come from the kernel directly.
 * Errors: ORB_EUNAVAILABLE (getrandom failed: errno named). */
int orb_random_bytes(void *buf, size_t n);

/* 64 random bits for identifiers that must differ, not be secret (PSNs, incarnations): from
 * orb_random_bytes(), or, if that fails, from the clock and an address. */
uint64_t orb_random_u64(void);

#endif
