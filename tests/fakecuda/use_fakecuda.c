/* Linked into test builds of programs that use only the public API (examples, tools), with the
 * static library: before main, the process's CUDA driver becomes the full stand-in, through the
 * library's internal test hook (which the installed library's users cannot reach). */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda.h"

__attribute__((constructor)) static void use_fakecuda(void)
{
    if (orb_cuda_use_library(FAKECUDA_FULL) != 0) {
        fprintf(stderr, "use_fakecuda: cannot choose %s\n", FAKECUDA_FULL);
        abort();
    }
}
