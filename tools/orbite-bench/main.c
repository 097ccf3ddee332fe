/* orbite-bench: measure OrbiTE READ/WRITE throughput and latency (public API only).
 *
 * Default mode forks a source process and measures against it over loopback TCP; --mode source
 * and --mode requester run the two sides on two hosts. See --help. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "roles.h"

#define NS_PER_S 1000000000ull
#define SOURCE_READY_TIMEOUT_NS (60ull * NS_PER_S)
#define SOURCE_EXIT_TIMEOUT_NS (15ull * NS_PER_S)
#define SOURCE_KILL_TIMEOUT_NS (5ull * NS_PER_S)
#define INFO_LINE_MAX 512

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    /* No SA_RESTART: blocking calls return EINTR and the loops look at the flag. */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The forked source process                                                 */
/* ------------------------------------------------------------------------ */

struct child {
    pid_t pid;
    int control_fd; /* write end; closing it asks the source to stop */
    int reaped;
    int status;     /* wait status once reaped */
    int killed;     /* we had to SIGKILL it */
};

/* Non-blocking: 1 once the child has exited (and was reaped). */
static int child_exited(struct child *c)
{
    if (c->reaped)
        return 1;
    int status;
    pid_t got = waitpid(c->pid, &status, WNOHANG);
    if (got == c->pid) {
        c->reaped = 1;
        c->status = status;
    }
    return c->reaped;
}

static const char *child_describe(const struct child *c, char *buf, size_t len)
{
    if (!c->reaped)
        snprintf(buf, len, "still running");
    else if (c->killed)
        snprintf(buf, len, "did not stop in time and was killed");
    else if (WIFEXITED(c->status))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(c->status));
    else if (WIFSIGNALED(c->status))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(c->status),
                 strsignal(WTERMSIG(c->status)));
    else
        snprintf(buf, len, "ended with wait status %d", c->status);
    return buf;
}

static int child_clean(const struct child *c)
{
    return c->reaped && !c->killed && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
}

/* Wait until `deadline` for the child to exit; 1 when it did. */
static int child_wait_until(struct child *c, uint64_t deadline)
{
    while (!child_exited(c)) {
        if (bench_now_ns() >= deadline)
            return 0;
        sleep_ms(10);
    }
    return 1;
}

/* Ask the source to stop (end of its control pipe), then kill it if it does not. */
static void child_finish(struct child *c)
{
    if (c->control_fd >= 0) {
        close(c->control_fd);
        c->control_fd = -1;
    }
    if (child_wait_until(c, bench_now_ns() + SOURCE_EXIT_TIMEOUT_NS))
        return;
    kill(c->pid, SIGKILL);
    if (child_wait_until(c, bench_now_ns() + SOURCE_KILL_TIMEOUT_NS))
        c->killed = 1;
}

/* The body of the forked source process; returns its exit status. */
static int source_child_main(const struct bench_options *opt, uint64_t size, pid_t parent,
                             int info_fd, int control_fd)
{
    char err[BENCH_ERROR_MAX];
    char line[INFO_LINE_MAX];
    char endpoint[ORB_ENDPOINT_MAX];
    char epoch[ORB_EPOCH_HEX_LEN + 1];
    struct bench_source *src = NULL;

    /* Never outlive the measuring process. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        return 1;
    if (bench_source_start(opt, size, &src, err, sizeof err) != 0 ||
        bench_source_identity(src, endpoint, sizeof endpoint, epoch, sizeof epoch, err,
                              sizeof err) != 0) {
        snprintf(line, sizeof line, "ERR %.480s\n", err);
        (void)write_all(info_fd, line, strlen(line));
        bench_source_stop(src, err, sizeof err);
        return 1;
    }
    snprintf(line, sizeof line, "OK %s %s\n", endpoint, epoch);
    if (write_all(info_fd, line, strlen(line)) != 0) {
        bench_source_stop(src, err, sizeof err);
        return 1;
    }
    close(info_fd);
    bench_source_serve(control_fd, &stop_requested);
    if (bench_source_stop(src, err, sizeof err) != 0) {
        fprintf(stderr, "orbite-bench: source: %s\n", err);
        return 1;
    }
    return 0;
}

/* Read the child's one-line report, bounded by a deadline and by the child's life. */
static int read_source_line(struct child *c, int fd, char *line, size_t len, char *err,
                            size_t errlen)
{
    size_t used = 0;
    uint64_t deadline = bench_now_ns() + SOURCE_READY_TIMEOUT_NS;
    while (used + 1 < len) {
        if (stop_requested) {
            snprintf(err, errlen, "interrupted while the source was starting");
            return -1;
        }
        if (bench_now_ns() >= deadline) {
            snprintf(err, errlen, "the source process did not report ready within %llu s",
                     (unsigned long long)(SOURCE_READY_TIMEOUT_NS / NS_PER_S));
            return -1;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int n = poll(&pfd, 1, 100);
        if (n < 0 && errno != EINTR) {
            snprintf(err, errlen, "poll: %s", strerror(errno));
            return -1;
        }
        if (n <= 0)
            continue;
        ssize_t got = read(fd, line + used, len - 1 - used);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            snprintf(err, errlen, "reading from the source process: %s", strerror(errno));
            return -1;
        }
        if (got == 0) {
            char how[128];
            child_wait_until(c, bench_now_ns() + NS_PER_S);
            snprintf(err, errlen, "the source process ended before reporting ready (%s)",
                     child_describe(c, how, sizeof how));
            return -1;
        }
        used += (size_t)got;
        line[used] = '\0';
        char *nl = strchr(line, '\n');
        if (nl != NULL) {
            *nl = '\0';
            return 0;
        }
    }
    snprintf(err, errlen, "the source process sent an overlong line");
    return -1;
}

/* Fork the source, learn its endpoint and epoch. Returns 0 or -1 with `err`. */
static int spawn_source(const struct bench_options *opt, uint64_t size, struct child *c,
                        char *endpoint, size_t endpoint_len, struct orb_epoch *epoch, char *err,
                        size_t errlen)
{
    int info[2];
    int control[2];
    if (pipe(info) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        return -1;
    }
    if (pipe(control) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        close(info[0]);
        close(info[1]);
        return -1;
    }
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        close(info[0]);
        close(info[1]);
        close(control[0]);
        close(control[1]);
        return -1;
    }
    if (pid == 0) {
        close(info[0]);
        close(control[1]);
        _exit(source_child_main(opt, size, parent, info[1], control[0]));
    }
    close(info[1]);
    close(control[0]);
    *c = (struct child){.pid = pid, .control_fd = control[1]};

    char line[INFO_LINE_MAX];
    int rc = read_source_line(c, info[0], line, sizeof line, err, errlen);
    close(info[0]);
    if (rc != 0)
        return -1;
    if (strncmp(line, "ERR ", 4) == 0) {
        snprintf(err, errlen, "source: %.480s", line + 4);
        return -1;
    }
    char ep[INFO_LINE_MAX];
    char hex[INFO_LINE_MAX];
    if (sscanf(line, "OK %511s %511s", ep, hex) != 2 || strlen(ep) >= endpoint_len ||
        orb_epoch_parse(hex, epoch) != 0) {
        snprintf(err, errlen, "unexpected report from the source process: '%.200s'", line);
        return -1;
    }
    snprintf(endpoint, endpoint_len, "%s", ep);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Progress                                                                  */
/* ------------------------------------------------------------------------ */

struct tick_ctx {
    struct child *child; /* NULL in requester mode */
    int show;
    int drawn;
    unsigned cell_index;
    uint64_t last_ns;
    uint64_t last_bytes;
    uint64_t last_requests;
};

static const char *op_label(enum orb_op op)
{
    return op == ORB_OP_READ ? "READ" : "WRITE";
}

static int on_tick(const struct bench_progress *p, void *arg)
{
    struct tick_ctx *ctx = arg;
    if (stop_requested)
        return 1;
    if (ctx->child != NULL && child_exited(ctx->child))
        return 1;
    if (!ctx->show)
        return 0;
    uint64_t now = bench_now_ns();
    if (ctx->cell_index != p->cell_index || ctx->last_ns == 0) {
        ctx->cell_index = p->cell_index;
        ctx->last_ns = now;
        ctx->last_bytes = p->bytes;
        ctx->last_requests = p->requests;
        return 0;
    }
    double dt = (double)(now - ctx->last_ns) / 1e9;
    if (dt <= 0)
        return 0;
    double gbps = (double)(p->bytes - ctx->last_bytes) / dt / 1e9;
    double rps = (double)(p->requests - ctx->last_requests) / dt;
    ctx->last_ns = now;
    ctx->last_bytes = p->bytes;
    ctx->last_requests = p->requests;
    char block[32];
    fprintf(stderr, "\r\033[K%-5s %8s  %s %5.1f/%.1f s  %8.3f GB/s  %11.0f req/s", op_label(p->op),
            bench_format_size(p->block_size, block, sizeof block),
            p->warming ? "warm-up " : "measure ", p->elapsed_s, p->total_s, gbps, rps);
    fflush(stderr);
    ctx->drawn = 1;
    return 0;
}

static void clear_progress(struct tick_ctx *ctx)
{
    if (ctx->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        ctx->drawn = 0;
    }
    ctx->last_ns = 0;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */
/* ------------------------------------------------------------------------ */

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

struct run_summary {
    const struct bench_options *opt;
    const char *endpoint;
    uint64_t buffer;
    struct bench_cell cells[2 * BENCH_MAX_SIZES];
    size_t n_cells;
    size_t planned_cells;
    char errors[4][BENCH_ERROR_MAX]; /* failures outside any cell */
    size_t n_errors;
    int ok;
};

static void add_error(struct run_summary *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_error(struct run_summary *s, const char *fmt, ...)
{
    s->ok = 0;
    if (s->n_errors == sizeof s->errors / sizeof s->errors[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->errors[s->n_errors++], BENCH_ERROR_MAX, fmt, ap);
    va_end(ap);
}

/* The transport the requests name (with unspec, not the one the library then picks). */
static const char *transport_name(enum orb_transport t)
{
    switch (t) {
    case ORB_TRANSPORT_TCP: return "tcp";
    case ORB_TRANSPORT_RDMA: return "rdma";
    case ORB_TRANSPORT_NVLINK: return "nvlink";
    case ORB_TRANSPORT_SHM: return "shm";
    default: return "unspec";
    }
}

static const char *mode_name(enum bench_mode m)
{
    return m == BENCH_MODE_BOTH ? "both" : m == BENCH_MODE_SOURCE ? "source" : "requester";
}

static void print_json(const struct run_summary *s)
{
    const struct bench_options *o = s->opt;
    FILE *f = stdout;
    fprintf(f, "{\"tool\":\"orbite-bench\",\"version\":\"%d.%d.%d\",\"mode\":\"%s\",",
            ORB_VERSION_MAJOR, ORB_VERSION_MINOR, ORB_VERSION_PATCH, mode_name(o->mode));
    fprintf(f, "\"transport\":\"%s\",\"endpoint\":", transport_name(o->transport));
    json_string(f, s->endpoint ? s->endpoint : "");
    fprintf(f, ",\"batch\":%u,\"depth\":%u,\"threads\":%u,\"duration_s\":%.3f,\"warmup_s\":%.3f,",
            o->batch, o->depth, o->threads, o->duration_s, o->warmup_s);
    fprintf(f, "\"buffer_bytes\":%" PRIu64 ",\"verify\":%s,\"latency_scope\":\"%s\",", s->buffer,
            o->verify ? "true" : "false", o->batch == 1 ? "request" : "batch");
    char sm[16], rm[16];
    fprintf(f, "\"source_memory\":\"%s\",\"requester_memory\":\"%s\",",
            bench_memory_name(o->source_device, sm, sizeof sm), bench_memory_name(o->requester_device, rm, sizeof rm));
    fputs("\"results\":[", f);
    for (size_t i = 0; i < s->n_cells; i++) {
        const struct bench_cell *c = &s->cells[i];
        fprintf(f, "%s{\"op\":\"%s\",\"block_size\":%" PRIu64 ",\"ran\":%s,\"verified\":%s,",
                i ? "," : "", c->op == ORB_OP_READ ? "read" : "write", c->block_size,
                c->ran ? "true" : "false",
                c->verified == 1 ? "true" : c->verified == 0 ? "null" : "false");
        fprintf(f, "\"seconds\":%.6f,\"bytes\":%" PRIu64 ",\"requests\":%" PRIu64
                   ",\"batches\":%" PRIu64 ",",
                c->seconds, c->bytes, c->requests, c->batches);
        fprintf(f, "\"gbps\":%.6f,\"requests_per_s\":%.1f,\"latency_min_us\":%.3f,"
                   "\"latency_p50_us\":%.3f,\"latency_p99_us\":%.3f,\"latency_max_us\":%.3f,",
                c->gbps, c->requests_per_s, c->lat_min_us, c->lat_p50_us, c->lat_p99_us,
                c->lat_max_us);
        fprintf(f, "\"cpu_requester_s\":%.3f,", c->cpu_requester_s);
        if (c->cpu_source_s < 0)
            fputs("\"cpu_source_s\":null,\"cpu_s_per_gb\":null,", f);
        else
            fprintf(f, "\"cpu_source_s\":%.3f,\"cpu_s_per_gb\":%.4f,", c->cpu_source_s,
                    c->cpu_s_per_gb);
        fputs("\"error\":", f);
        if (c->error[0])
            json_string(f, c->error);
        else
            fputs("null", f);
        fputc('}', f);
    }
    fputs("],\"errors\":[", f);
    for (size_t i = 0; i < s->n_errors; i++) {
        if (i)
            fputc(',', f);
        json_string(f, s->errors[i]);
    }
    fprintf(f, "],\"ok\":%s}\n", s->ok ? "true" : "false");
    fflush(f);
}

static void print_table(const struct run_summary *s)
{
    const struct bench_options *o = s->opt;
    char buf[32];
    char sm[16], rm[16];
    printf("orbite-bench %d.%d.%d: %s, batch %u, depth %u, %u thread%s, %.2f s per cell, buffer %s, "
           "verify %s, memory %s -> %s\n",
           ORB_VERSION_MAJOR, ORB_VERSION_MINOR, ORB_VERSION_PATCH, transport_name(o->transport),
           o->batch, o->depth, o->threads, o->threads == 1 ? "" : "s", o->duration_s,
           bench_format_size(s->buffer, buf, sizeof buf), o->verify ? "on" : "off",
           bench_memory_name(o->source_device, sm, sizeof sm), bench_memory_name(o->requester_device, rm, sizeof rm));
    printf("%-6s %9s %10s %13s %11s %11s  %s\n", "op", "block", "GB/s", "requests/s",
           o->batch == 1 ? "req p50 us" : "batch p50us", o->batch == 1 ? "req p99 us" : "batch p99us",
           "verified");
    for (size_t i = 0; i < s->n_cells; i++) {
        const struct bench_cell *c = &s->cells[i];
        bench_format_size(c->block_size, buf, sizeof buf);
        if (!c->ran) {
            printf("%-6s %9s %10s %13s %11s %11s  %s\n", op_label(c->op), buf, "-", "-", "-", "-",
                   "FAILED");
            continue;
        }
        printf("%-6s %9s %10.3f %13.0f %11.1f %11.1f  %s\n", op_label(c->op), buf, c->gbps,
               c->requests_per_s, c->lat_p50_us, c->lat_p99_us,
               c->verified == 1 ? "yes" : c->verified == 0 ? "off" : "MISMATCH");
    }
    if (o->batch == 1)
        printf("latency: per request (batch of 1), submission to completion\n");
    else
        printf("latency: per batch of %u requests, submission to completion of the last one\n",
               o->batch);
    for (size_t i = 0; i < s->n_cells; i++) {
        const struct bench_cell *c = &s->cells[i];
        if (c->error[0])
            printf("%s %s: %s\n", op_label(c->op), bench_format_size(c->block_size, buf, sizeof buf),
                   c->error);
    }
    for (size_t i = 0; i < s->n_errors; i++)
        printf("error: %s\n", s->errors[i]);
    if (s->n_cells < s->planned_cells)
        printf("error: %zu of %zu cells did not run\n", s->planned_cells - s->n_cells,
               s->planned_cells);
    fflush(stdout);
}

static void print_results(const struct run_summary *s)
{
    if (s->opt->json)
        print_json(s);
    else
        print_table(s);
}

/* ------------------------------------------------------------------------ */
/* Modes                                                                     */
/* ------------------------------------------------------------------------ */

static int run_source_mode(const struct bench_options *opt)
{
    char err[BENCH_ERROR_MAX];
    char endpoint[ORB_ENDPOINT_MAX];
    char epoch[ORB_EPOCH_HEX_LEN + 1];
    char buf[32];
    struct bench_source *src = NULL;
    uint64_t size = bench_source_buffer_size(opt);
    if (bench_source_start(opt, size, &src, err, sizeof err) != 0 ||
        bench_source_identity(src, endpoint, sizeof endpoint, epoch, sizeof epoch, err,
                              sizeof err) != 0) {
        fprintf(stderr, "orbite-bench: %s\n", err);
        bench_source_stop(src, err, sizeof err);
        return 1;
    }
    if (opt->json) {
        printf("{\"endpoint\":");
        json_string(stdout, endpoint);
        printf(",\"epoch\":\"%s\",\"buffer_bytes\":%" PRIu64 ",\"seed\":%" PRIu64 "}\n", epoch, size,
               opt->seed);
    } else {
        printf("endpoint %s\nepoch %s\nbuffer %" PRIu64 "\n", endpoint, epoch, size);
    }
    fflush(stdout);
    if (!opt->quiet)
        fprintf(stderr,
                "orbite-bench: serving %s at %s until SIGINT, SIGTERM or end of input; run\n"
                "  orbite-bench --mode requester --endpoint %s --epoch %s\n"
                "(with this host's address if it listens on a wildcard address)\n",
                bench_format_size(size, buf, sizeof buf), endpoint, endpoint, epoch);
    bench_source_serve(STDIN_FILENO, &stop_requested);
    if (bench_source_stop(src, err, sizeof err) != 0) {
        fprintf(stderr, "orbite-bench: %s\n", err);
        return 1;
    }
    return 0;
}

/* Run every planned cell against an open requester. Returns 0, or -1 when the threads of a
 * cell could not be stopped and the process must exit without cleanup. */
static int run_cells(struct bench_requester *req, struct run_summary *s, struct tick_ctx *tick)
{
    const struct bench_options *opt = s->opt;
    static const enum orb_op order[2] = {ORB_OP_READ, ORB_OP_WRITE};
    unsigned index = 0;
    for (size_t b = 0; b < opt->n_block_sizes; b++) {
        for (int k = 0; k < 2; k++) {
            if (!(opt->ops & (k == 0 ? BENCH_OP_READ : BENCH_OP_WRITE)))
                continue;
            if (stop_requested || (tick->child != NULL && child_exited(tick->child)))
                return 0;
            struct bench_cell *cell = &s->cells[s->n_cells];
            enum bench_cell_status st = bench_requester_run_cell(
                req, order[k], opt->block_sizes[b], index++, on_tick, tick, cell);
            clear_progress(tick);
            s->n_cells++;
            if (st != BENCH_CELL_OK)
                s->ok = 0;
            if (!opt->quiet) {
                char buf[32];
                bench_format_size(cell->block_size, buf, sizeof buf);
                if (cell->ran)
                    fprintf(stderr, "%-5s %8s  %8.3f GB/s  %11.0f req/s  p50 %.1f us  p99 %.1f us%s\n",
                            op_label(cell->op), buf, cell->gbps, cell->requests_per_s,
                            cell->lat_p50_us, cell->lat_p99_us,
                            cell->verified == 1 ? "  verified" : cell->verified < 0 ? "  MISMATCH" : "");
                if (cell->error[0])
                    fprintf(stderr, "%-5s %8s  %s\n", op_label(cell->op), buf, cell->error);
            }
            if (st == BENCH_CELL_FATAL)
                return -1;
        }
    }
    return 0;
}

static size_t planned_cells(const struct bench_options *opt)
{
    size_t per_size = ((opt->ops & BENCH_OP_READ) ? 1 : 0) + ((opt->ops & BENCH_OP_WRITE) ? 1 : 0);
    return per_size * opt->n_block_sizes;
}

static int run_measurement(const struct bench_options *opt)
{
    char err[BENCH_ERROR_MAX];
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    struct child child = {.pid = -1, .control_fd = -1};
    struct child *source = NULL;
    struct bench_requester *req = NULL;
    struct run_summary *s = calloc(1, sizeof *s);
    if (s == NULL) {
        fprintf(stderr, "orbite-bench: out of memory\n");
        return 1;
    }
    s->opt = opt;
    s->ok = 1;
    s->planned_cells = planned_cells(opt);
    s->endpoint = endpoint;
    endpoint[0] = '\0';

    if (opt->mode == BENCH_MODE_BOTH) {
        uint64_t size = bench_source_buffer_size(opt);
        if (spawn_source(opt, size, &child, endpoint, sizeof endpoint, &epoch, err, sizeof err) != 0) {
            add_error(s, "%s", err);
            if (child.pid > 0) {
                source = &child;
                child_finish(source);
            }
            goto report;
        }
        source = &child;
    } else {
        snprintf(endpoint, sizeof endpoint, "%s", opt->endpoint);
        epoch = opt->epoch;
    }

    if (bench_requester_open(opt, endpoint, &epoch, &req, err, sizeof err) != 0) {
        add_error(s, "%s", err);
        goto stop_source;
    }
    s->buffer = bench_requester_buffer(req);
    if (source != NULL)
        bench_requester_set_source_pid(req, source->pid);
    if (!opt->quiet) {
        char hex[ORB_EPOCH_HEX_LEN + 1];
        char buf[32];
        orb_epoch_format(&epoch, hex, sizeof hex);
        fprintf(stderr, "orbite-bench: source %s (epoch %s), buffer %s, %s, batch %u, depth %u, "
                        "%u thread%s, %.2f s per cell\n",
                endpoint, hex, bench_format_size(s->buffer, buf, sizeof buf),
                transport_name(opt->transport), opt->batch, opt->depth, opt->threads,
                opt->threads == 1 ? "" : "s", opt->duration_s);
    }

    if (!bench_requester_source_matches(req) && !opt->quiet)
        fprintf(stderr, "orbite-bench: warning: the source's buffer does not hold the pattern of "
                        "seed %#llx; its contents are not restored after WRITE cells\n",
                (unsigned long long)opt->seed);

    struct tick_ctx tick = {
        .child = source,
        .show = opt->progress == 1 || (opt->progress == -1 && isatty(STDERR_FILENO)),
    };
    if (run_cells(req, s, &tick) != 0) {
        /* Worker threads are stuck inside the library: report and leave without cleanup. */
        add_error(s, "requester threads did not stop; exiting without cleanup");
        if (source != NULL) {
            kill(source->pid, SIGKILL);
            child_wait_until(source, bench_now_ns() + SOURCE_KILL_TIMEOUT_NS);
        }
        print_results(s);
        fflush(NULL);
        _exit(1);
    }
    if (stop_requested)
        add_error(s, "interrupted by a signal");
    if (bench_requester_close(req, err, sizeof err) != 0)
        add_error(s, "%s", err);

stop_source:
    if (source != NULL) {
        char how[128];
        int died_early = child_exited(source);
        child_finish(source);
        if (died_early || !child_clean(source))
            add_error(s, "source process %s%s", child_describe(source, how, sizeof how),
                      died_early ? " during the run" : "");
    }
report:
    if (s->n_cells < s->planned_cells)
        s->ok = 0;
    for (size_t i = 0; i < s->n_cells; i++) {
        if (!s->cells[i].ran || (opt->verify && s->cells[i].verified != 1))
            s->ok = 0;
    }
    if (!opt->json && s->n_cells == 0 && s->n_errors > 0) {
        for (size_t i = 0; i < s->n_errors; i++)
            fprintf(stderr, "orbite-bench: %s\n", s->errors[i]);
    } else {
        print_results(s);
    }
    int ok = s->ok;
    free(s);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct bench_options opt;
    int rc = bench_parse_options(argc, argv, &opt);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    install_signals();
    if (opt.mode == BENCH_MODE_SOURCE)
        return run_source_mode(&opt);
    return run_measurement(&opt);
}
