/* What GPUDirect registration would find on this host, for hardware/gpu-check.sh: whether the
 * device exports dma-buf, an export of a small and of a large allocation checked against the
 * geometry OrbiTE registers (the host pages holding the whole allocation, a descriptor that is a
 * file), and the peer-memory module probe of the real /sys.
 *   gdr_probe [DEVICE [LIBCUDA]]   prints: dmabuf=yes|no exports=N peermem=0xBITS route=...
 * LIBCUDA (tests only): a stand-in library to load instead of libcuda.so.1. Exits 77 without a
 * driver or device, 1 when a device that says it supports dma-buf fails an export or its
 * geometry, 0 otherwise. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "cuda/cuda.h"
#include "cuda/cuda_memory.h"
#include "rdma/gdr.h"

/* Export one allocation of `len` bytes and check what came back. */
static int check_export(int device, size_t len)
{
    orb_cuda_memory *m = NULL;
    if (orb_cuda_memory_alloc(device, len, &m) != 0) {
        fprintf(stderr, "gdr_probe: allocating %zu bytes: %s\n", len, orb_last_error());
        return 1;
    }
    int fd = -1, rc = 0;
    uint64_t base = 0, size = 0, page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t first = orb_cuda_memory_ptr(m), end = first + orb_cuda_memory_size(m);
    struct stat st;
    if (orb_cuda_memory_dmabuf(m, &fd, &base, &size) != 0) {
        fprintf(stderr, "gdr_probe: exporting %zu bytes: %s\n", len, orb_last_error());
        rc = 1;
    } else if (base % page != 0 || size % page != 0 || base > first || base + size < end || first - base >= page ||
               base + size - end >= page || fstat(fd, &st) != 0) {
        fprintf(stderr, "gdr_probe: the export of [0x%llx, 0x%llx) came as [0x%llx, +%llu), descriptor %d\n",
                (unsigned long long)first, (unsigned long long)end, (unsigned long long)base,
                (unsigned long long)size, fd);
        rc = 1;
    }
    if (fd >= 0)
        (void)close(fd);
    orb_cuda_memory_unref(m);
    return rc;
}

int main(int argc, char **argv)
{
    int device = argc > 1 ? atoi(argv[1]) : 0;
    if (argc > 2 && orb_cuda_use_library(argv[2]) != 0) {
        fprintf(stderr, "gdr_probe: %s\n", orb_last_error());
        return 1;
    }
    const struct orb_cuda *cu = NULL;
    if (orb_cuda_get(&cu) != 0) {
        printf("gdr_probe: skipped: %s\n", orb_last_error());
        return 77;
    }
    bool dmabuf = false;
    if (orb_cuda_device_dmabuf(device, &dmabuf) != 0) {
        printf("gdr_probe: skipped: %s\n", orb_last_error());
        return 77;
    }
    int failed = 0, exports = 0;
    if (dmabuf) {
        static const size_t sizes[] = {10000, 64u << 20};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            failed |= check_export(device, sizes[i]);
            exports += !failed;
        }
    }
    uint32_t peermem = 0;
    int sys = open("/sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sys >= 0) {
        peermem = orb_gdr_probe_peermem(sys);
        (void)close(sys);
    }
    /* What auto would take if libibverbs has ibv_reg_dmabuf_mr (Debian 12's has). */
    struct orb_gdr_facts f = {.cuda_dmabuf = dmabuf, .verbs_dmabuf = true, .peermem = peermem != 0};
    enum orb_gdr_route route = 0;
    const char *auto_route = orb_gdr_choose(ORB_RDMA_GDR_AUTO, &f, &route) == 0 ? orb_gdr_route_name(route) : "none";
    printf("dmabuf=%s exports=%d peermem=0x%x route=%s\n", dmabuf ? "yes" : "no", exports, peermem, auto_route);
    return failed;
}
