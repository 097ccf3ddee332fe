/* Plans: the storage a transport fills when it cuts one request into pieces. */
#include <stdlib.h>

#include "error.h"
#include "transport.h"

int orb_plan_pieces(struct orb_plan *plan, uint32_t count, struct orb_plan_piece **out)
{
    if (plan == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "plan: NULL argument");
    if (count == 0 || count > ORB_PLAN_MAX_PIECES)
        return orb_fail(ORB_EINVAL, "plan: %u pieces outside 1..%u", (unsigned)count,
                        (unsigned)ORB_PLAN_MAX_PIECES);
    if (plan->pieces != NULL)
        return orb_fail(ORB_EINVAL, "plan: pieces were already taken for this request");
    struct orb_plan_piece *pieces = plan->inline_pieces;
    if (count > ORB_PLAN_INLINE) {
        pieces = calloc(count, sizeof *pieces);
        if (pieces == NULL)
            return orb_fail(ORB_ENOMEM, "plan: cannot allocate %u pieces", (unsigned)count);
    }
    plan->pieces = pieces;
    plan->count = count;
    *out = pieces;
    return 0;
}

int orb_plan_even(struct orb_plan *plan, uint64_t length, uint64_t piece_len)
{
    if (length == 0)
        return orb_fail(ORB_EINVAL, "plan: a request of 0 bytes");
    if (piece_len == 0 || piece_len > length)
        piece_len = length;
    uint64_t count = length / piece_len + (length % piece_len != 0);
    if (count > ORB_PLAN_MAX_PIECES)
        return orb_fail(ORB_ERESOURCE, "plan: %llu bytes in pieces of %llu need %llu pieces, "
                        "more than %u", (unsigned long long)length, (unsigned long long)piece_len,
                        (unsigned long long)count, (unsigned)ORB_PLAN_MAX_PIECES);
    struct orb_plan_piece *pieces;
    int rc = orb_plan_pieces(plan, (uint32_t)count, &pieces);
    if (rc != 0)
        return rc;
    uint64_t off = 0;
    for (uint32_t k = 0; k < (uint32_t)count; k++) {
        uint64_t left = length - off;
        pieces[k].offset = off;
        pieces[k].length = left < piece_len ? left : piece_len;
        pieces[k].rail = 0;
        pieces[k].reserved = 0;
        off += pieces[k].length;
    }
    return 0;
}
