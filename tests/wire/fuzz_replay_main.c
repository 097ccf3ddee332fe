/* Runs LLVMFuzzerTestOneInput on every regular file of the directories named on the command line,
 * so that a fuzz corpus is a regression test in builds without libFuzzer. Fails (exit 1) when a
 * directory cannot be read, holds no file, or a file cannot be read; a crashing input aborts. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REPLAY_MAX_INPUT (16u << 20) /* larger files are a corpus mistake, not an input */

/* Read all of `path` into a new buffer (caller frees). Returns 0 or -1 with a message printed. */
static int read_input(const char *path, uint8_t **data_out, size_t *size_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz replay: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = -1;
    uint8_t *data = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size > REPLAY_MAX_INPUT) {
        fprintf(stderr, "fuzz replay: %s: cannot size it or larger than %u bytes\n", path,
                REPLAY_MAX_INPUT);
        goto close_file;
    }
    size_t size = (size_t)st.st_size;
    /* An exact-size heap copy, so that an over-read is caught by a sanitizer build. */
    data = malloc(size ? size : 1);
    if (!data) {
        fprintf(stderr, "fuzz replay: out of memory for %s\n", path);
        goto close_file;
    }
    if (size && fread(data, 1, size, f) != size) {
        fprintf(stderr, "fuzz replay: short read of %s\n", path);
        free(data);
        goto close_file;
    }
    *data_out = data;
    *size_out = size;
    rc = 0;
close_file:
    fclose(f);
    return rc;
}

static int replay_dir(const char *dir_path)
{
    DIR *dir = opendir(dir_path);
    if (!dir) {
        fprintf(stderr, "fuzz replay: cannot open directory %s: %s\n", dir_path, strerror(errno));
        return -1;
    }
    int rc = 0;
    size_t inputs = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name) >= sizeof path) {
            fprintf(stderr, "fuzz replay: path too long in %s\n", dir_path);
            rc = -1;
            break;
        }
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        uint8_t *data = NULL;
        size_t size = 0;
        if (read_input(path, &data, &size) != 0) {
            rc = -1;
            break;
        }
        LLVMFuzzerTestOneInput(data, size);
        free(data);
        inputs++;
    }
    closedir(dir);
    if (rc == 0 && inputs == 0) {
        fprintf(stderr, "fuzz replay: %s holds no input file\n", dir_path);
        rc = -1;
    }
    if (rc == 0)
        printf("fuzz replay: %zu inputs from %s\n", inputs, dir_path);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR...\n", argv[0]);
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (replay_dir(argv[i]) != 0)
            return 1;
    }
    return 0;
}
