/* orbite-bench: command line parsing. */
#include "bench.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE_LIMIT (1ull << 40)

static const char usage_text[] =
    "Usage: orbite-bench [OPTION]...\n"
    "Measure OrbiTE READ and WRITE throughput and latency between a source and a requester.\n"
    "By default both run on this host: a source process is forked and the transfers use\n"
    "loopback TCP.\n"
    "\n"
    "Workload:\n"
    "  --op read|write|both     operations to measure (default both; READ cells run first)\n"
    "  -b, --block-size LIST    comma list of request sizes, K/M/G suffixes (default 4K,64K,1M)\n"
    "  --batch N                requests per batch (default 16)\n"
    "  --depth N                batches in flight per thread (default 2; 1 = synchronous\n"
    "                           orb_submit_and_wait)\n"
    "  --threads N              requester threads sharing one engine and segment (default 1)\n"
    "  -d, --duration SECONDS   measured time per (op, block size) cell (default 3); each\n"
    "                           thread measures at least one batch\n"
    "  --warmup SECONDS         unmeasured time before each cell (default 0.5)\n"
    "  --timeout SECONDS        bound of every single wait (default 10)\n"
    "  --transport tcp|rdma|nvlink|shm|unspec\n"
    "                           transport of the requests (default tcp); rdma and unspec give\n"
    "                           both engines RDMA settings; nvlink (CUDA IPC) needs --memory cuda;\n"
    "                           shm (same host, one copy by the source) needs host memory on\n"
    "                           both sides; with shm and unspec the requester's buffers come\n"
    "                           from orb_host_memory_alloc_shared, so unspec picks shm on one host\n"
    "  --rdma JSON              RDMA settings of both engines, e.g. '{\"rdma_whitelist\":[\"mlx5_0\"]}'\n"
    "  --rdma-source JSON, --rdma-requester JSON\n"
    "                           the same for one engine (both on one host: different NICs)\n"
    "  --memory host|cuda[:N]   where both sides' buffers live (default host; cuda means\n"
    "                           device memory of CUDA device N, 0 by default)\n"
    "  --source-memory KIND, --requester-memory KIND\n"
    "                           the same for one side\n"
    "  --buffer-size SIZE       source buffer (default 256M, grown to threads*depth*batch blocks)\n"
    "  --seed N                 seed of the source's byte pattern (default 0xb17e5eed;\n"
    "                           source and requester must agree)\n"
    "  --config JSON            engine configuration overrides for both engines, e.g.\n"
    "                           '{\"tcp_stripes\":4,\"busy_poll_us\":100}'\n"
    "  --verify / --no-verify   check every cell byte for byte (default on)\n"
    "\n"
    "Roles:\n"
    "  --mode both|source|requester\n"
    "                           both (default): fork a local source and measure against it;\n"
    "                           source: serve a registered buffer, print its endpoint and epoch,\n"
    "                           run until SIGINT/SIGTERM or end of standard input;\n"
    "                           requester: measure against --endpoint/--epoch\n"
    "  --endpoint HOST:PORT     source: address to bind (default 127.0.0.1:0);\n"
    "                           requester: the source to connect to\n"
    "  --epoch HEX              requester: the source's epoch as printed by --mode source\n"
    "\n"
    "Output:\n"
    "  --json                   print the results as one JSON object on stdout\n"
    "  -q, --quiet              no progress or information lines\n"
    "  --progress / --no-progress\n"
    "                           live progress line on stderr (default: when stderr is a tty)\n"
    "  -h, --help               this text\n"
    "  -V, --version            the library version this tool was built against\n"
    "\n"
    "Latency is the completion time of one batch (submission to completion of its last\n"
    "request); with --batch 1 it is the latency of one request. Throughput counts the\n"
    "batches submitted during the measured time over the time until the last of them\n"
    "completed. Exit status: 0 when every cell ran and verified, 1 on a transfer, verification\n"
    "or process failure, 2 on a usage error.\n";

enum long_only {
    OPT_OP = 256,
    OPT_BATCH,
    OPT_DEPTH,
    OPT_THREADS,
    OPT_WARMUP,
    OPT_TIMEOUT,
    OPT_TRANSPORT,
    OPT_MODE,
    OPT_ENDPOINT,
    OPT_EPOCH,
    OPT_BUFFER,
    OPT_SEED,
    OPT_CONFIG,
    OPT_RDMA,
    OPT_RDMA_SOURCE,
    OPT_RDMA_REQUESTER,
    OPT_VERIFY,
    OPT_NO_VERIFY,
    OPT_JSON,
    OPT_PROGRESS,
    OPT_NO_PROGRESS,
    OPT_MEMORY,
    OPT_SOURCE_MEMORY,
    OPT_REQUESTER_MEMORY
};

static const struct option long_options[] = {
    {"op", required_argument, NULL, OPT_OP},
    {"block-size", required_argument, NULL, 'b'},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"depth", required_argument, NULL, OPT_DEPTH},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"duration", required_argument, NULL, 'd'},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"transport", required_argument, NULL, OPT_TRANSPORT},
    {"mode", required_argument, NULL, OPT_MODE},
    {"endpoint", required_argument, NULL, OPT_ENDPOINT},
    {"epoch", required_argument, NULL, OPT_EPOCH},
    {"buffer-size", required_argument, NULL, OPT_BUFFER},
    {"seed", required_argument, NULL, OPT_SEED},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"rdma", required_argument, NULL, OPT_RDMA},
    {"rdma-source", required_argument, NULL, OPT_RDMA_SOURCE},
    {"rdma-requester", required_argument, NULL, OPT_RDMA_REQUESTER},
    {"memory", required_argument, NULL, OPT_MEMORY},
    {"source-memory", required_argument, NULL, OPT_SOURCE_MEMORY},
    {"requester-memory", required_argument, NULL, OPT_REQUESTER_MEMORY},
    {"verify", no_argument, NULL, OPT_VERIFY},
    {"no-verify", no_argument, NULL, OPT_NO_VERIFY},
    {"json", no_argument, NULL, OPT_JSON},
    {"quiet", no_argument, NULL, 'q'},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

void bench_options_defaults(struct bench_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->mode = BENCH_MODE_BOTH;
    opt->ops = BENCH_OP_READ | BENCH_OP_WRITE;
    opt->block_sizes[0] = 4096;
    opt->block_sizes[1] = 64 * 1024;
    opt->block_sizes[2] = 1024 * 1024;
    opt->n_block_sizes = 3;
    opt->batch = 16;
    opt->depth = 2;
    opt->threads = 1;
    opt->duration_s = 3.0;
    opt->warmup_s = 0.5;
    opt->timeout_s = 10.0;
    opt->transport = ORB_TRANSPORT_TCP;
    opt->seed = BENCH_DEFAULT_SEED;
    opt->verify = 1;
    opt->progress = -1;
    opt->source_device = -1;
    opt->requester_device = -1;
}

/* "host" (-1) or "cuda" / "cuda:N" (device N, 0 by default). Returns 0 or -1. */
static int parse_memory(const char *text, int *device)
{
    if (strcmp(text, "host") == 0) {
        *device = -1;
        return 0;
    }
    if (strncmp(text, "cuda", 4) != 0)
        return -1;
    if (text[4] == '\0') {
        *device = 0;
        return 0;
    }
    if (text[4] != ':' || text[5] < '0' || text[5] > '9')
        return -1;
    char *end = NULL;
    long v = strtol(text + 5, &end, 10);
    if (*end != '\0' || v < 0 || v > 1023)
        return -1;
    *device = (int)v;
    return 0;
}

const char *bench_memory_name(int device, char *buf, size_t len)
{
    if (device < 0)
        snprintf(buf, len, "host");
    else
        snprintf(buf, len, "cuda:%d", device);
    return buf;
}

int bench_parse_size(const char *text, uint64_t *out)
{
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text)
        return -1;
    uint64_t unit = 1;
    switch (*end) {
    case 'k': case 'K': unit = 1ull << 10; end++; break;
    case 'm': case 'M': unit = 1ull << 20; end++; break;
    case 'g': case 'G': unit = 1ull << 30; end++; break;
    default: break;
    }
    /* Accept "KiB" and "KB" as spellings of the same binary unit, and a bare "B". */
    if (unit != 1 && end[0] == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end != '\0' || value == 0 || value > SIZE_LIMIT / unit)
        return -1;
    *out = (uint64_t)value * unit;
    return 0;
}

int bench_parse_size_list(const char *text, uint64_t *sizes, size_t cap, size_t *count)
{
    if (text == NULL || sizes == NULL || count == NULL)
        return -1;
    size_t n = 0;
    const char *p = text;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        uint64_t value;
        if (len == 0 || len >= sizeof item || n == cap)
            return -1;
        memcpy(item, p, len);
        item[len] = '\0';
        if (bench_parse_size(item, &value) != 0 || value > BENCH_MAX_BLOCK)
            return -1;
        sizes[n++] = value;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    *count = n;
    return 0;
}

/* Parse an unsigned decimal in [min, max]. */
static int parse_u32(const char *text, uint32_t min, uint32_t max, uint32_t *out)
{
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* Parse seconds as a finite decimal in [min, max]. */
static int parse_seconds(const char *text, double min, double max, double *out)
{
    if (text == NULL || text[0] == '\0')
        return -1;
    errno = 0;
    char *end = NULL;
    double v = strtod(text, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v) || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static int usage_error(const char *prog, const char *what, const char *value)
{
    if (value != NULL)
        fprintf(stderr, "%s: invalid %s: '%s'\n", prog, what, value);
    else
        fprintf(stderr, "%s: %s\n", prog, what);
    fprintf(stderr, "Try '%s --help' for more information.\n", prog);
    return -1;
}

/* `arg` (as given) and what is wrong with it. */
static int usage_error_about(const char *prog, const char *what, const char *arg)
{
    fprintf(stderr, "%s: '%s' %s\n", prog, arg, what);
    fprintf(stderr, "Try '%s --help' for more information.\n", prog);
    return -1;
}

/* The library's verdict on --config and the RDMA settings, before any engine starts: a setting
 * it refuses is a usage error. --config cannot move what the tool sets itself. */
static int check_settings(const char *prog, const struct bench_options *opt)
{
    if (opt->config_json != NULL) {
        struct orb_engine_config def, cfg;
        if (orb_engine_config_init(&def) != 0 || orb_engine_config_init(&cfg) != 0)
            return usage_error(prog, "orb_engine_config_init failed", NULL);
        if (orb_engine_config_load_json(&cfg, opt->config_json) != 0)
            return usage_error(prog, "--config", orb_last_error());
        if (strcmp(cfg.endpoint, def.endpoint) != 0 || cfg.enable_source != def.enable_source)
            return usage_error(prog, "--config cannot set endpoint or enable_source: the tool sets them (--endpoint, "
                                     "--mode)", NULL);
    }
    const char *jsons[2] = {opt->rdma_source_json, opt->rdma_requester_json};
    for (int i = 0; i < 2; i++) {
        if (jsons[i] == NULL || (i == 1 && jsons[1] == jsons[0]))
            continue;
        orb_rdma_config *rdma = NULL;
        int rc = orb_rdma_config_new(&rdma);
        if (rc == 0)
            rc = orb_rdma_config_load_json(rdma, jsons[i]);
        orb_rdma_config_free(rdma);
        if (rc != 0)
            return usage_error(prog, i == 0 ? "RDMA settings of the source" : "RDMA settings of the requester",
                               orb_last_error());
    }
    return 0;
}

uint64_t bench_source_buffer_size(const struct bench_options *opt)
{
    uint64_t largest = 0;
    for (size_t i = 0; i < opt->n_block_sizes; i++) {
        if (opt->block_sizes[i] > largest)
            largest = opt->block_sizes[i];
    }
    uint64_t size = opt->buffer_size != 0 ? opt->buffer_size : BENCH_DEFAULT_BUFFER;
    /* Every request in flight needs its own block, so that verification can tell which
     * request put which bytes where. Bounded factors: no overflow below 2^63. */
    uint64_t slots = (uint64_t)opt->threads * opt->depth * opt->batch;
    if (largest != 0 && slots > UINT64_MAX / largest)
        return 0;
    if (slots * largest > size)
        size = slots * largest;
    return size;
}

int bench_parse_options(int argc, char **argv, struct bench_options *opt)
{
    const char *prog = argc > 0 && argv[0] != NULL ? argv[0] : "orbite-bench";
    const char *endpoint = NULL;
    const char *epoch = NULL;
    bench_options_defaults(opt);
    optind = 0; /* glibc: 0 also resets getopt's internal state, so parsing can repeat */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":b:d:qhV", long_options, NULL)) != -1) {
        switch (c) {
        case OPT_OP:
            if (strcmp(optarg, "read") == 0)
                opt->ops = BENCH_OP_READ;
            else if (strcmp(optarg, "write") == 0)
                opt->ops = BENCH_OP_WRITE;
            else if (strcmp(optarg, "both") == 0)
                opt->ops = BENCH_OP_READ | BENCH_OP_WRITE;
            else
                return usage_error(prog, "--op (read, write or both)", optarg);
            break;
        case 'b':
            if (bench_parse_size_list(optarg, opt->block_sizes, BENCH_MAX_SIZES,
                                      &opt->n_block_sizes) != 0)
                return usage_error(prog, "--block-size (comma list of 1..1G, at most 16)", optarg);
            break;
        case OPT_BATCH:
            if (parse_u32(optarg, 1, BENCH_MAX_BATCH, &opt->batch) != 0)
                return usage_error(prog, "--batch (1..65536)", optarg);
            break;
        case OPT_DEPTH:
            if (parse_u32(optarg, 1, BENCH_MAX_DEPTH, &opt->depth) != 0)
                return usage_error(prog, "--depth (1..64)", optarg);
            break;
        case OPT_THREADS:
            if (parse_u32(optarg, 1, BENCH_MAX_THREADS, &opt->threads) != 0)
                return usage_error(prog, "--threads (1..64)", optarg);
            break;
        case 'd':
            if (parse_seconds(optarg, 0.01, 86400.0, &opt->duration_s) != 0)
                return usage_error(prog, "--duration (0.01..86400 seconds)", optarg);
            break;
        case OPT_WARMUP:
            if (parse_seconds(optarg, 0.0, 3600.0, &opt->warmup_s) != 0)
                return usage_error(prog, "--warmup (0..3600 seconds)", optarg);
            break;
        case OPT_TIMEOUT:
            if (parse_seconds(optarg, 0.1, 3600.0, &opt->timeout_s) != 0)
                return usage_error(prog, "--timeout (0.1..3600 seconds)", optarg);
            break;
        case OPT_TRANSPORT:
            if (strcmp(optarg, "tcp") == 0)
                opt->transport = ORB_TRANSPORT_TCP;
            else if (strcmp(optarg, "rdma") == 0)
                opt->transport = ORB_TRANSPORT_RDMA;
            else if (strcmp(optarg, "nvlink") == 0)
                opt->transport = ORB_TRANSPORT_NVLINK;
            else if (strcmp(optarg, "shm") == 0)
                opt->transport = ORB_TRANSPORT_SHM;
            else if (strcmp(optarg, "unspec") == 0)
                opt->transport = ORB_TRANSPORT_UNSPEC;
            else
                return usage_error(prog, "--transport (tcp, rdma, nvlink, shm or unspec)", optarg);
            break;
        case OPT_MODE:
            if (strcmp(optarg, "both") == 0)
                opt->mode = BENCH_MODE_BOTH;
            else if (strcmp(optarg, "source") == 0)
                opt->mode = BENCH_MODE_SOURCE;
            else if (strcmp(optarg, "requester") == 0)
                opt->mode = BENCH_MODE_REQUESTER;
            else
                return usage_error(prog, "--mode (both, source or requester)", optarg);
            break;
        case OPT_ENDPOINT:
            if (optarg[0] == '\0' || strlen(optarg) >= sizeof opt->endpoint)
                return usage_error(prog, "--endpoint (HOST:PORT)", optarg);
            endpoint = optarg;
            break;
        case OPT_EPOCH:
            epoch = optarg;
            break;
        case OPT_BUFFER:
            if (bench_parse_size(optarg, &opt->buffer_size) != 0)
                return usage_error(prog, "--buffer-size", optarg);
            break;
        case OPT_SEED: {
            errno = 0;
            char *end = NULL;
            unsigned long long v = strtoull(optarg, &end, 0);
            if (errno != 0 || end == optarg || *end != '\0' || optarg[0] == '-')
                return usage_error(prog, "--seed", optarg);
            opt->seed = v;
            break;
        }
        case OPT_RDMA:
            opt->rdma_source_json = opt->rdma_requester_json = optarg;
            break;
        case OPT_RDMA_SOURCE:
            opt->rdma_source_json = optarg;
            break;
        case OPT_RDMA_REQUESTER:
            opt->rdma_requester_json = optarg;
            break;
        case OPT_MEMORY:
            if (parse_memory(optarg, &opt->source_device) != 0)
                return usage_error(prog, "--memory (host, cuda or cuda:N)", optarg);
            opt->requester_device = opt->source_device;
            break;
        case OPT_SOURCE_MEMORY:
            if (parse_memory(optarg, &opt->source_device) != 0)
                return usage_error(prog, "--source-memory (host, cuda or cuda:N)", optarg);
            break;
        case OPT_REQUESTER_MEMORY:
            if (parse_memory(optarg, &opt->requester_device) != 0)
                return usage_error(prog, "--requester-memory (host, cuda or cuda:N)", optarg);
            break;
        case OPT_CONFIG:
            opt->config_json = optarg;
            break;
        case OPT_VERIFY: opt->verify = 1; break;
        case OPT_NO_VERIFY: opt->verify = 0; break;
        case OPT_JSON: opt->json = 1; break;
        case 'q': opt->quiet = 1; break;
        case OPT_PROGRESS: opt->progress = 1; break;
        case OPT_NO_PROGRESS: opt->progress = 0; break;
        case 'h':
            fputs(usage_text, stdout);
            return 1;
        case 'V':
            printf("orbite-bench %d.%d.%d\n", ORB_VERSION_MAJOR, ORB_VERSION_MINOR,
                   ORB_VERSION_PATCH);
            return 1;
        case ':':
            return usage_error_about(prog, "is missing its value", argv[optind - 1]);
        default:
            return usage_error_about(prog, "is not an option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error_about(prog, "is an unexpected argument", argv[optind]);
    if (check_settings(prog, opt) != 0)
        return -1;

    if (endpoint != NULL)
        snprintf(opt->endpoint, sizeof opt->endpoint, "%s", endpoint);
    if (epoch != NULL) {
        if (orb_epoch_parse(epoch, &opt->epoch) != 0)
            return usage_error(prog, "--epoch (32 hex digits)", epoch);
        opt->have_epoch = 1;
    }
    if (opt->mode == BENCH_MODE_REQUESTER && (endpoint == NULL || epoch == NULL))
        return usage_error(prog, "--mode requester needs --endpoint and --epoch", NULL);
    if (opt->mode != BENCH_MODE_REQUESTER && epoch != NULL)
        return usage_error(prog, "--epoch is only meaningful with --mode requester", NULL);
    /* The same-host transport moves host memory only: the requester's buffer must be shareable
     * host memory, and the source copies from or into its host registration. */
    if (opt->transport == ORB_TRANSPORT_SHM && (opt->source_device >= 0 || opt->requester_device >= 0))
        return usage_error(prog, "--transport shm needs host memory on both sides", NULL);
    /* NVLink moves device memory to device memory: every side this process runs must have it. */
    if (opt->transport == ORB_TRANSPORT_NVLINK && ((opt->mode != BENCH_MODE_REQUESTER && opt->source_device < 0) ||
                                                   (opt->mode != BENCH_MODE_SOURCE && opt->requester_device < 0)))
        return usage_error(prog, "--transport nvlink needs device memory (--memory cuda)", NULL);
    if (opt->mode == BENCH_MODE_BOTH && bench_source_buffer_size(opt) == 0)
        return usage_error(prog, "threads * depth * batch * block size is too large", NULL);
    if (opt->quiet && opt->progress == -1)
        opt->progress = 0;
    return 0;
}
