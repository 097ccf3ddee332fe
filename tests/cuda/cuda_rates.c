/* The driver's own copy rates, for hardware/gpu-check.sh to print beside OrbiTE's: cuMemcpyDtoH
 * into and cuMemcpyHtoD from pinned host memory, and cuMemcpyDtoD, each of SIZE bytes (64 MiB by
 * default) repeated for about a second, through the same libcuda.so.1 OrbiTE loads.
 *   cuda_rates [DEVICE [SIZE_MIB]]   prints: d2h_gbps=X h2d_gbps=Y d2d_gbps=Z
 * Exits 77 without a driver or device. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <orbite/orbite.h>

#include "cuda/cuda.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const struct orb_cuda *cu;
static orb_cu_deviceptr dev_a, dev_b;
static void *host;
static size_t len;

static orb_cu_result copy(int kind)
{
    switch (kind) {
    case 0: return cu->memcpy_dtoh(host, dev_a, len);
    case 1: return cu->memcpy_htod(dev_a, host, len);
    default: return cu->memcpy_dtod(dev_b, dev_a, len);
    }
}

/* GB/s (10^9 bytes per second) of `kind`, or -1 on a driver failure. */
static double rate(int kind)
{
    if (copy(kind) != ORB_CU_SUCCESS) /* warm-up */
        return -1;
    unsigned n = 0;
    double start = now_s(), t = start;
    while (t - start < 1.0) {
        if (copy(kind) != ORB_CU_SUCCESS)
            return -1;
        n++;
        t = now_s();
    }
    return (double)len * n / (t - start) / 1e9;
}

int main(int argc, char **argv)
{
    int device = argc > 1 ? atoi(argv[1]) : 0;
    len = (size_t)(argc > 2 ? atoi(argv[2]) : 64) << 20;
    if (orb_cuda_get(&cu) != 0) {
        printf("cuda_rates: skipped: %s\n", orb_last_error());
        return 77;
    }
    orb_cu_device d = 0;
    orb_cu_context ctx = NULL;
    if (cu->device_get(&d, device) != ORB_CU_SUCCESS || cu->primary_ctx_retain(&ctx, d) != ORB_CU_SUCCESS ||
        cu->ctx_set_current(ctx) != ORB_CU_SUCCESS || cu->mem_alloc(&dev_a, len) != ORB_CU_SUCCESS ||
        cu->mem_alloc(&dev_b, len) != ORB_CU_SUCCESS || cu->mem_host_alloc(&host, len, 0) != ORB_CU_SUCCESS) {
        fprintf(stderr, "cuda_rates: cannot set up %zu-byte buffers on device %d\n", len, device);
        return 1;
    }
    double d2h = rate(0), h2d = rate(1), d2d = rate(2);
    (void)cu->mem_free(dev_a);
    (void)cu->mem_free(dev_b);
    (void)cu->mem_free_host(host);
    if (d2h < 0 || h2d < 0 || d2d < 0) {
        fprintf(stderr, "cuda_rates: a copy failed\n");
        return 1;
    }
    printf("d2h_gbps=%.2f h2d_gbps=%.2f d2d_gbps=%.2f\n", d2h, h2d, d2d);
    return 0;
}
