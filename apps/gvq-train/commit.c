/*
 * commit.c -- gvq-train's commits on disk (commit.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "commit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#define FNV_INIT 0xcbf29ce484222325ull

uint64_t commit_model_sig(size_t nparams, int nsizes, const size_t *sizes) {
    uint64_t n = nparams, h = fnv(FNV_INIT, &n, sizeof n);
    for (int i = 0; i < nsizes; i++) {
        uint64_t s = sizes[i];
        h = fnv(h, &s, sizeof s);
    }
    return h;
}

static int write_all(int fd, const void *p, size_t n, uint64_t *h) {
    *h = fnv(*h, p, n);
    for (const char *b = p; n > 0;) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w == 0) errno = EIO; /* nothing written and no error said: not a stale errno */
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* DIR/NAME from the parts in order and an FNV-1a 64 of them, via NAME.tmp, fsync and rename */
static int write_file(const char *dir, const char *name, const void *const *part,
                      const size_t *bytes, int nparts, char *err, size_t cap) {
    char path[4096], tmp[4200];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
        snprintf(err, cap, "%s: the path is too long", dir);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, cap, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    uint64_t sum = FNV_INIT;
    int bad = 0;
    for (int i = 0; i < nparts && !bad; i++)
        bad = write_all(fd, part[i], bytes[i], &sum) != 0;
    uint64_t ignored = 0, final = sum;
    bad = bad || write_all(fd, &final, sizeof final, &ignored) != 0 || fsync(fd) != 0;
    int e = errno;
    if (close(fd) != 0 && !bad) bad = 1, e = errno;
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, cap, "%s: %s", bad ? tmp : path, strerror(bad ? e : errno));
        unlink(tmp);
        return -1;
    }
    /* the rename itself lasts a crash only once the directory's entry is on disk */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL)) { /* EINVAL: no directory sync there */
        snprintf(err, cap, "%s: %s (syncing the directory)", dir, strerror(errno));
        if (dfd >= 0) close(dfd);
        return -1;
    }
    close(dfd);
    return 0;
}

int commit_write(const char *dir, const commit_hdr_t *h, const float *params, const float *velocity,
                 char *err, size_t cap) {
    const size_t n = sizeof(float) * (size_t)h->nparams;
    const void *part[3] = {h, params, velocity};
    const size_t bytes[3] = {sizeof *h, n, n};
    return write_file(dir, COMMIT_FILE, part, bytes, 3, err, cap);
}

int commit_agg_write(const char *dir, const commit_agg_hdr_t *h, const void *state, char *err,
                     size_t cap) {
    char name[64];
    snprintf(name, sizeof name, "%s.%d", COMMIT_AGG_FILE, (int)h->rank);
    const void *part[2] = {h, state};
    const size_t bytes[2] = {sizeof *h, (size_t)h->bytes};
    return write_file(dir, name, part, bytes, 2, err, cap);
}

static int read_all(FILE *f, void *p, size_t n, uint64_t *h) {
    if (fread(p, 1, n, f) != n) return -1;
    *h = fnv(*h, p, n);
    return 0;
}

#define CUT_SHORT "shorter than its header says (cut off?)"

/* The FNV-1a 64 after the payload (sum: of every byte before it), and nothing past it: 0, or -1
 * with the cause in err. */
static int check_sum(FILE *f, uint64_t sum, const char *path, char *err, size_t cap) {
    uint64_t stored = 0;
    if (fread(&stored, sizeof stored, 1, f) != 1) {
        snprintf(err, cap, "%s: %s", path, CUT_SHORT);
        return -1;
    }
    if (stored != sum || fgetc(f) != EOF) {
        snprintf(err, cap, "%s: %s", path,
                 stored != sum ? "checksum mismatch: the file is corrupted"
                               : "longer than its header says");
        return -1;
    }
    return 0;
}

/* DIR/NAME opened to read (its path in path[4096]), or NULL with the cause in err */
static FILE *open_in(const char *dir, const char *name, char *path, char *err, size_t cap) {
    if (snprintf(path, 4096, "%s/%s", dir, name) >= 4096) {
        snprintf(err, cap, "%s: the path is too long", dir);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) snprintf(err, cap, "%s: %s", path, strerror(errno));
    return f;
}

int commit_read(const char *dir, commit_hdr_t *h, float *params, float *velocity, size_t nparams,
                uint64_t want_sig, uint64_t want_seed, char *err, size_t cap) {
    char path[4096];
    FILE *f = open_in(dir, COMMIT_FILE, path, err, cap);
    if (f == NULL) return -1;
    uint64_t sum = FNV_INIT;
    int rc = -1;
    if (read_all(f, h, sizeof *h, &sum) != 0 || memcmp(h->magic, COMMIT_MAGIC, 8) != 0) {
        snprintf(err, cap, "%s: not a gvq-train commit (no %s header)", path, COMMIT_MAGIC);
    } else if (h->version != 1 || h->header_bytes != sizeof *h) {
        snprintf(err, cap,
                 "%s: commit version %u with a %u-byte header; this gvq-train reads "
                 "version 1 (%zu bytes)",
                 path, h->version, h->header_bytes, sizeof *h);
    } else if (h->nparams != nparams || h->model_sig != want_sig) {
        snprintf(err, cap,
                 "%s: made by another model (%llu parameters, layout %016llx; this run's: "
                 "%zu, %016llx)",
                 path, (unsigned long long)h->nparams, (unsigned long long)h->model_sig, nparams,
                 (unsigned long long)want_sig);
    } else if (h->seed != want_seed) {
        snprintf(err, cap,
                 "%s: made with --seed %llu, this run's is %llu (the epochs' orders "
                 "follow from it)",
                 path, (unsigned long long)h->seed, (unsigned long long)want_seed);
    } else if (h->step < 0 || h->epoch < 0 || h->pos < 0 || h->nranks < 1 || h->iters < 1 ||
               h->step > h->iters) {
        snprintf(err, cap, "%s: the header's step %lld, epoch %lld or place %lld is out of range",
                 path, (long long)h->step, (long long)h->epoch, (long long)h->pos);
    } else if (read_all(f, params, sizeof(float) * nparams, &sum) != 0 ||
               read_all(f, velocity, sizeof(float) * nparams, &sum) != 0) {
        snprintf(err, cap, "%s: %s", path, CUT_SHORT);
    } else {
        rc = check_sum(f, sum, path, err, cap);
    }
    fclose(f);
    return rc;
}

int commit_agg_read(const char *dir, int rank, int64_t want_step, uint64_t want_sig,
                    uint64_t want_seed, commit_agg_hdr_t *h, void **state, char *err, size_t cap) {
    char path[4096], name[64];
    *state = NULL;
    snprintf(name, sizeof name, "%s.%d", COMMIT_AGG_FILE, rank);
    FILE *f = open_in(dir, name, path, err, cap);
    if (f == NULL) return -1;
    uint64_t sum = FNV_INIT;
    void *buf = NULL;
    int rc = -1;
    if (read_all(f, h, sizeof *h, &sum) != 0 || memcmp(h->magic, COMMIT_AGG_MAGIC, 8) != 0) {
        snprintf(err, cap, "%s: not a gvq-train compressor state (no %s header)", path,
                 COMMIT_AGG_MAGIC);
    } else if (h->version != 1 || h->header_bytes != sizeof *h) {
        snprintf(err, cap, "%s: version %u with a %u-byte header; this gvq-train reads version 1",
                 path, h->version, h->header_bytes);
    } else if (h->model_sig != want_sig || h->seed != want_seed || h->rank != rank) {
        snprintf(err, cap, "%s: made by %s", path,
                 h->model_sig != want_sig ? "another model"
                 : h->seed != want_seed   ? "a run of another --seed"
                                          : "another rank");
    } else if (h->step != want_step) {
        snprintf(err, cap, "%s: of step %lld, the commit's is %lld (written before a crash?)", path,
                 (long long)h->step, (long long)want_step);
    } else if (h->bytes == 0 || h->bytes > ((uint64_t)1 << 40) ||
               (buf = malloc((size_t)h->bytes)) == NULL) {
        snprintf(err, cap, "%s: a state of %llu bytes cannot be read", path,
                 (unsigned long long)h->bytes);
    } else if (read_all(f, buf, (size_t)h->bytes, &sum) != 0) {
        snprintf(err, cap, "%s: %s", path, CUT_SHORT);
    } else {
        rc = check_sum(f, sum, path, err, cap);
    }
    fclose(f);
    if (rc != 0)
        free(buf);
    else
        *state = buf;
    return rc;
}
