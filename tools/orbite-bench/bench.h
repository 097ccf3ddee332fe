/* orbite-bench: shared definitions of the benchmark tool (public API only). */
#ifndef ORBITE_BENCH_H
#define ORBITE_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <orbite/orbite.h>

#define BENCH_MAX_SIZES 16
#define BENCH_MAX_THREADS 64
#define BENCH_MAX_DEPTH 64
#define BENCH_MAX_BATCH 65536
#define BENCH_MAX_BLOCK (1ull << 30)
#define BENCH_DEFAULT_BUFFER (256ull << 20)
#define BENCH_DEFAULT_SEED 0x0b17e5eedull
#define BENCH_ERROR_MAX 512

enum bench_mode { BENCH_MODE_BOTH = 0, BENCH_MODE_SOURCE = 1, BENCH_MODE_REQUESTER = 2 };

/* Bit set of the operations to run. */
enum { BENCH_OP_READ = 1, BENCH_OP_WRITE = 2 };

struct bench_options {
    enum bench_mode mode;
    unsigned ops;                         /* BENCH_OP_* bits, never 0 */
    uint64_t block_sizes[BENCH_MAX_SIZES];
    size_t n_block_sizes;
    uint32_t batch;                       /* requests per batch */
    uint32_t depth;                       /* batches in flight per thread */
    uint32_t threads;                     /* requester threads */
    double duration_s;                    /* measured time per cell */
    double warmup_s;                      /* unmeasured time before each cell */
    double timeout_s;                     /* bound of every single wait */
    enum orb_transport transport;
    char endpoint[ORB_ENDPOINT_MAX];      /* source bind address or peer address; "" = default */
    int have_epoch;
    struct orb_epoch epoch;               /* the peer's epoch (requester mode) */
    uint64_t buffer_size;                 /* 0 = default */
    uint64_t seed;                        /* seed of the source's byte pattern */
    int verify;
    int json;
    int quiet;
    int progress;                         /* -1 auto (stderr is a tty), 0 off, 1 on */
    const char *config_json;              /* engine configuration overrides; borrowed from argv */
    /* RDMA settings (JSON objects, borrowed from argv) of the source and requester engines; an
     * engine gets RDMA settings when its JSON is given or the transport is rdma/unspec. */
    const char *rdma_source_json, *rdma_requester_json;
    /* Where each side's buffer lives: -1 host memory, N device memory of CUDA device N. */
    int source_device, requester_device;
};

/* "host" or "cuda:N" for a side's device (-1: host), into buf. */
const char *bench_memory_name(int device, char *buf, size_t len);

/* Parse a byte count: decimal digits with an optional K, M or G suffix (binary multiples,
 * "KiB"/"KB" spellings accepted). Returns 0, or -1 for empty, malformed, zero or > 2^40 values. */
int bench_parse_size(const char *text, uint64_t *out);

/* Parse a comma list of sizes into `sizes` (at most `cap`), each in 1..BENCH_MAX_BLOCK.
 * Returns 0, or -1 (malformed entry, empty list or too many entries). */
int bench_parse_size_list(const char *text, uint64_t *sizes, size_t cap, size_t *count);

/* Fill `opt` from the command line. Returns 0 to run, 1 when help or version was printed
 * (exit 0), -1 on a usage error (already reported on stderr, exit 2). */
int bench_parse_options(int argc, char **argv, struct bench_options *opt);

/* Defaults of every option. */
void bench_options_defaults(struct bench_options *opt);

/* Buffer the source registers when this tool starts it: the requested size, or the default,
 * grown to hold threads * depth * batch blocks of the largest block size. 0 if that overflows. */
uint64_t bench_source_buffer_size(const struct bench_options *opt);

/* "4 KiB", "1 MiB", "1536 B": exact binary units when the value divides, bytes otherwise. */
const char *bench_format_size(uint64_t bytes, char *buf, size_t len);

/* Monotonic clock in nanoseconds. */
uint64_t bench_now_ns(void);

/* Sort `v` ascending. */
void bench_sort_u64(uint64_t *v, size_t n);

/* Nearest-rank quantile q (0 < q <= 1) of an ascending array; 0 when n is 0. */
uint64_t bench_quantile(const uint64_t *sorted, size_t n, double q);

#endif
