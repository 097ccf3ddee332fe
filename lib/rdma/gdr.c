/* GPUDirect registration routes (gdr.h). */
#include "rdma/gdr.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "core/error.h"

static const char *const peermem_files[] = {
    "kernel/mm/memory_peers/nv_mem/version",
    "kernel/mm/memory_peers/nv_mem_nc/version",
    "module/nvidia_peermem/version",
};

uint32_t orb_gdr_probe_peermem(int sys_dirfd)
{
    uint32_t found = 0;
    for (uint32_t i = 0; i < sizeof peermem_files / sizeof peermem_files[0]; i++) {
        /* Opened, then looked at: a file there is the module's word, a link or anything else is not. */
        int fd = openat(sys_dirfd, peermem_files[i], O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0)
            continue;
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
            found |= 1u << i;
        (void)close(fd);
    }
    return found;
}

const char *orb_gdr_route_name(enum orb_gdr_route route)
{
    return route == ORB_GDR_ROUTE_DMABUF ? "dma-buf" : route == ORB_GDR_ROUTE_PEERMEM ? "peermem" : "none";
}

/* What dma-buf lacks, or NULL. */
static const char *dmabuf_missing(const struct orb_gdr_facts *f)
{
    if (!f->cuda_dmabuf)
        return "the device or driver exports no dma-buf";
    if (!f->verbs_dmabuf)
        return "libibverbs lacks ibv_reg_dmabuf_mr";
    return NULL;
}

int orb_gdr_choose(uint32_t wanted, const struct orb_gdr_facts *f, enum orb_gdr_route *out)
{
    if (f == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "gdr: NULL facts or output");
    const char *no_dmabuf = dmabuf_missing(f);
    const char *no_peermem = f->peermem ? NULL : "no peer-memory module loaded";
    switch (wanted) {
    case ORB_RDMA_GDR_DMABUF:
        if (no_dmabuf != NULL)
            return orb_fail(ORB_EUNAVAILABLE, "rdma: gpu_direct_registration dmabuf: %s", no_dmabuf);
        *out = ORB_GDR_ROUTE_DMABUF;
        return 0;
    case ORB_RDMA_GDR_PEERMEM:
        if (no_peermem != NULL)
            return orb_fail(ORB_EUNAVAILABLE, "rdma: gpu_direct_registration peermem: %s", no_peermem);
        *out = ORB_GDR_ROUTE_PEERMEM;
        return 0;
    case ORB_RDMA_GDR_AUTO:
        if (no_dmabuf == NULL)
            *out = ORB_GDR_ROUTE_DMABUF;
        else if (no_peermem == NULL)
            *out = ORB_GDR_ROUTE_PEERMEM;
        else
            return orb_fail(ORB_EUNAVAILABLE, "rdma: no GPUDirect registration route: dma-buf: %s; peermem: %s",
                            no_dmabuf, no_peermem);
        return 0;
    default:
        return orb_fail(ORB_EINVAL, "gdr: %u is not a gpu_direct_registration", wanted);
    }
}
