#include "rdma/turns.h"

uint32_t orb_turn_skip(uint32_t from, uint32_t total, uint32_t room)
{
    return total > room ? from % total : 0;
}

uint32_t orb_turn_next(uint32_t from, uint32_t taken, uint32_t total)
{
    /* A list that shrank below the position just wraps (skip takes it modulo the total). */
    return taken >= total ? 0 : from + taken;
}
