/* orbite-bench: small helpers (clock, sizes, quantiles). */
#include "bench.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *bench_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
    int unit = -1;
    uint64_t value = bytes;
    while (unit < 3 && value >= 1024 && value % 1024 == 0) {
        value /= 1024;
        unit++;
    }
    if (unit < 0)
        snprintf(buf, len, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, len, "%" PRIu64 " %s", value, units[unit]);
    return buf;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a;
    uint64_t y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void bench_sort_u64(uint64_t *v, size_t n)
{
    if (n > 1)
        qsort(v, n, sizeof *v, compare_u64);
}

uint64_t bench_quantile(const uint64_t *sorted, size_t n, double q)
{
    if (n == 0)
        return 0;
    if (q <= 0.0)
        return sorted[0];
    if (q >= 1.0)
        return sorted[n - 1];
    /* Nearest rank: the smallest value with at least q * n samples at or below it. */
    double rank = q * (double)n;
    size_t index = (size_t)rank;
    if ((double)index < rank)
        index++;
    if (index == 0)
        index = 1;
    return sorted[index - 1];
}
