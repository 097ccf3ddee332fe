/* Shared by the helper protocol unit tests and its fuzz target: run every decoder that applies to
 * a message and hold it to the codec's contract. */
#ifndef ORB_TESTS_HP_CHECK_H
#define ORB_TESTS_HP_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <orbite/orbite.h>

#include "common/helper_proto.h"

/* Decode `m` with the decoder(s) of its own type (INVENTORY_REPLY: as each of the three kinds;
 * every reply: also as a bare status). Every result must be 0 or ORB_EPROTO, and a successful
 * decode must re-encode to exactly raw[0..raw_len) (the datagram `m` was parsed from). Aborts,
 * naming the decoder, on any breach. Returns how many decoders accepted the message. */
int hp_check_own_type(const struct orb_hp_msg *m, const uint8_t *raw, size_t raw_len);

/* Decode `body` as the body of every message type (types 0..ORB_HP_TYPE_MAX + 1, unknown ones
 * included), without the re-encoding check: every result must be 0 or ORB_EPROTO. */
void hp_check_every_type(const uint8_t *body, size_t body_len, uint32_t sequence);

#endif
