/* Internal: looking at a list in turns. A lane or scan that snapshots a locked list into room
 * for at most `room` entries (to work on them without the list's lock) must not look at the
 * same head of the list every time: entries past the room would never be looked at. A pass
 * skips orb_turn_skip() entries from the head, takes up to `room` of the rest, and keeps
 * orb_turn_next() for the next pass; while the list stays as it is, every entry is taken within
 * ceil(total / room) + 1 passes. A list that fits is taken whole, from its head, every time.
 *
 * Pure arithmetic on the caller's position (which the caller's lock guards). */
#ifndef ORB_RDMA_TURNS_H
#define ORB_RDMA_TURNS_H

#include <stdint.h>

/* Entries to skip from the head of a list of `total` before taking, for a pass whose position
 * is `from` and whose room is `room`: 0 when the list fits (total <= room). */
uint32_t orb_turn_skip(uint32_t from, uint32_t total, uint32_t room);

/* The position after a pass that took `taken` of `total` entries: 0 once a pass took them all
 * (the next starts at the head), otherwise past what this one took. */
uint32_t orb_turn_next(uint32_t from, uint32_t taken, uint32_t total);

#endif
