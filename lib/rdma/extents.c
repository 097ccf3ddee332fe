/* First-fit extents of one fixed range (see extents.h). */
#include "rdma/extents.h"

#include <string.h>

#include "core/error.h"

static uint64_t round_up(const struct orb_rdma_extents *e, uint64_t len)
{
    return (len + e->granule - 1) & ~(e->granule - 1);
}

int orb_rdma_extents_init(struct orb_rdma_extents *e, uint64_t size, uint64_t granule)
{
    if (e == NULL || granule == 0 || (granule & (granule - 1)) != 0 || size == 0 || size % granule != 0)
        return orb_fail(ORB_EINVAL, "staging: %llu bytes cannot be cut in units of %llu", (unsigned long long)size,
                        (unsigned long long)granule);
    memset(e, 0, sizeof *e);
    e->size = size;
    e->granule = granule;
    e->nfree = 1;
    e->free[0] = (struct orb_rdma_extent){.off = 0, .len = size};
    return 0;
}

int orb_rdma_extents_take(struct orb_rdma_extents *e, uint64_t len, uint64_t *off_out)
{
    if (len == 0)
        return orb_fail(ORB_EINVAL, "staging: an extent of 0 bytes");
    if (len > e->size)
        return orb_fail(ORB_ERESOURCE, "staging: %llu bytes are more than the %llu of max_staging_bytes",
                        (unsigned long long)len, (unsigned long long)e->size);
    len = round_up(e, len);
    if (e->ntaken == ORB_RDMA_EXTENTS_MAX)
        return orb_fail(ORB_EAGAIN, "staging: %u extents are in use", ORB_RDMA_EXTENTS_MAX);
    for (uint32_t i = 0; i < e->nfree; i++) {
        struct orb_rdma_extent *f = &e->free[i];
        if (f->len < len)
            continue;
        *off_out = f->off;
        f->off += len;
        f->len -= len;
        if (f->len == 0) {
            memmove(f, f + 1, (e->nfree - i - 1) * sizeof *f);
            e->nfree--;
        }
        e->ntaken++;
        e->in_use += len;
        return 0;
    }
    return orb_fail(ORB_EAGAIN, "staging: no %llu free bytes in one piece (%llu of %llu in use)",
                    (unsigned long long)len, (unsigned long long)e->in_use, (unsigned long long)e->size);
}

void orb_rdma_extents_put(struct orb_rdma_extents *e, uint64_t off, uint64_t len)
{
    len = round_up(e, len);
    uint32_t i = 0;
    while (i < e->nfree && e->free[i].off < off)
        i++;
    int with_prev = i > 0 && e->free[i - 1].off + e->free[i - 1].len == off;
    int with_next = i < e->nfree && off + len == e->free[i].off;
    if (with_prev && with_next) {
        e->free[i - 1].len += len + e->free[i].len;
        memmove(&e->free[i], &e->free[i + 1], (e->nfree - i - 1) * sizeof e->free[0]);
        e->nfree--;
    } else if (with_prev) {
        e->free[i - 1].len += len;
    } else if (with_next) {
        e->free[i].off = off;
        e->free[i].len += len;
    } else {
        /* At most ntaken + 1 free extents exist, and ntaken <= ORB_RDMA_EXTENTS_MAX: it fits. */
        memmove(&e->free[i + 1], &e->free[i], (e->nfree - i) * sizeof e->free[0]);
        e->free[i] = (struct orb_rdma_extent){.off = off, .len = len};
        e->nfree++;
    }
    e->ntaken--;
    e->in_use -= len;
}
