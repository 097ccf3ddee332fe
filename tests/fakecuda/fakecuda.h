/* The test controls of the fakecuda stand-in (fakecuda.c): tests dlopen the same library the
 * loader loaded and call these through dlsym. */
#ifndef ORB_TESTS_FAKECUDA_H
#define ORB_TESTS_FAKECUDA_H

#include <stdio.h>

#include "cuda/cuda_api.h"

/* What is alive in the stand-in. */
struct fakecuda_counts {
    long device_allocations, host_allocations;
    long primary_refs;                 /* retains of every device's primary context */
    long streams, events;
};

/* The Nth call (from 1) of `export` (its exported name) fails with `rc`, once; nth 0 disarms.
 * Up to 8 exports may be armed at once. */
void fakecuda_fail(const char *export, unsigned long long nth, unsigned int rc);
/* How many devices cuInit finds (0..8; only before it). */
void fakecuda_set_devices(int n);
/* Every stream operation waits this long before it runs. */
void fakecuda_slow_streams(unsigned microseconds);
/* While `hold` is non-zero, no stream runs its next operation (what it runs finishes). */
void fakecuda_hold_streams(int hold);
/* cuStreamIsCapturing answers `status` for `stream` from now on. */
void fakecuda_set_capturing(orb_cu_stream stream, unsigned int status);
struct fakecuda_counts fakecuda_counts(void);

#endif
