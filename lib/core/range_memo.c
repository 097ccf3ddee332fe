/* A transport's memory of a peer's answers about remote ranges. */
#include "range_memo.h"

#include "clock.h"

int orb_range_memo_lookup(const struct orb_range_memo *m, uint64_t addr, uint64_t length, uint64_t now)
{
    for (uint32_t i = 0; i < m->count; i++) {
        const struct orb_range_memo_entry *k = &m->entries[i];
        if (k->expires <= now)
            continue;
        if (k->ok && addr >= k->addr && length <= k->length && addr - k->addr <= k->length - length)
            return 1;
        if (!k->ok && k->addr == addr && k->length == length)
            return 0;
    }
    return -1;
}

void orb_range_memo_remember(struct orb_range_memo *m, uint64_t addr, uint64_t length, bool ok,
                             uint64_t refusal_expires)
{
    uint32_t i = m->count < ORB_RANGE_MEMO_MAX ? m->count++ : m->next++ % ORB_RANGE_MEMO_MAX;
    m->entries[i] = (struct orb_range_memo_entry){.addr = addr, .length = length, .ok = ok,
                                                  .expires = ok ? ORB_DEADLINE_NONE : refusal_expires};
}

void orb_range_memo_forget(struct orb_range_memo *m, uint64_t addr, uint64_t length)
{
    for (uint32_t i = 0; i < m->count; i++) {
        struct orb_range_memo_entry *k = &m->entries[i];
        if (k->addr < addr + length && addr < k->addr + k->length)
            k->expires = 0;
    }
}
