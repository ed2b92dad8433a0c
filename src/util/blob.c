/*
 * blob.c -- what every saveable handle shares (gvq_util.h): the check of a versioned config
 * struct's header, the checksum that seals a saved state, and a saved state written to or read
 * from a file through the handle's own save/load calls.
 *
 *   | header ... | checksum (8 bytes at `at`) | ... header | payload ...                   |
 *                  = CRC-32C of every byte of the state, these 8 read as zero
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_util.h"

gvqResult_t gvq_config_header_check(const char *fn, const char *what, size_t size, unsigned magic,
                                    unsigned version, unsigned want_magic, size_t min_size,
                                    size_t max_size, const char *initializer) {
    if (magic != want_magic) {
        GVQ_WARN("%s: %s->magic is 0x%x, not 0x%x (initialize it with %s)", fn, what, magic,
                 want_magic, initializer);
        return gvqInvalidArgument;
    }
    if (size < min_size || size > max_size || version > GVQ_VERSION) {
        GVQ_WARN("%s: %s->size %zu / version %u do not match this library (size %zu..%zu, "
                 "version <= %d; initialize it with %s)",
                 fn, what, size, version, min_size, max_size, GVQ_VERSION, initializer);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

gvqResult_t gvq_config_layouts(const char *fn, const char *what, const void *in, void *out,
                               size_t fields, size_t align, size_t full, unsigned want_magic,
                               const char *initializer) {
    struct {
        size_t size;
        unsigned magic, version;
    } head;
    memcpy(&head, in, sizeof head);
    const size_t old = (fields + align - 1) / align * align; /* its size, padding in */
    GVQCHECK(gvq_config_header_check(fn, what, head.size, head.magic, head.version, want_magic, old,
                                     full, initializer));
    if (head.size != old && head.size != full) {
        GVQ_WARN("%s: %s->size %zu is neither this library's (%zu) nor the older layout's (%zu); "
                 "initialize it with %s",
                 fn, what, head.size, full, old, initializer);
        return gvqInvalidArgument;
    }
    memcpy(out, in, head.size == old ? fields : full);
    memcpy(out, &full, sizeof full); /* the size field comes first */
    return gvqSuccess;
}

/* The CRC-32C of buf with the 8 bytes at `at` read as zero (at + 8 <= size). */
static uint64_t blob_checksum(const void *buf, size_t size, size_t at) {
    static const unsigned char zero[8];
    const unsigned char *p = buf;
    uint32_t crc = gvq_crc32c(0, p, at);
    crc = gvq_crc32c(crc, zero, sizeof zero);
    return gvq_crc32c(crc, p + at + 8, size - at - 8);
}

void gvq_blob_seal(void *buf, size_t size, size_t at) {
    uint64_t sum = blob_checksum(buf, size, at);
    memcpy((char *)buf + at, &sum, sizeof sum);
}

gvqResult_t gvq_blob_verify(const char *fn, const void *buf, size_t size, size_t at) {
    if (size < at || size - at < 8) {
        GVQ_WARN("%s: %zu bytes is too short to hold the saved state's checksum", fn, size);
        return gvqInvalidArgument;
    }
    uint64_t stored, want = blob_checksum(buf, size, at);
    memcpy(&stored, (const char *)buf + at, sizeof stored);
    if (stored != want) {
        GVQ_WARN("%s: checksum mismatch (stored 0x%llx, computed 0x%llx over %zu bytes): the "
                 "saved state is corrupted",
                 fn, (unsigned long long)stored, (unsigned long long)want, size);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

gvqResult_t gvq_blob_save_file(const char *fn, const char *path, gvq_save_fn_t save, void *obj) {
    if (path == NULL) {
        GVQ_WARN("%s: path is NULL", fn);
        return gvqInvalidArgument;
    }
    size_t n = 0;
    GVQCHECK(save(obj, NULL, &n));
    void *buf = malloc(n);
    if (buf == NULL) {
        GVQ_WARN("%s: cannot allocate %zu bytes for the saved state", fn, n);
        return gvqSystemError;
    }
    gvqResult_t res = save(obj, buf, &n);
    FILE *f = res == gvqSuccess ? fopen(path, "wb") : NULL;
    if (res == gvqSuccess && (f == NULL || fwrite(buf, 1, n, f) != n)) {
        GVQ_WARN("%s: cannot write '%s'", fn, path);
        res = gvqSystemError;
    }
    if (f != NULL && fclose(f) != 0 && res == gvqSuccess) {
        GVQ_WARN("%s: cannot write '%s' (close failed)", fn, path);
        res = gvqSystemError;
    }
    free(buf);
    return res;
}

gvqResult_t gvq_blob_load_file(const char *fn, const char *path, gvq_load_fn_t load, void *obj) {
    if (path == NULL) {
        GVQ_WARN("%s: path is NULL", fn);
        return gvqInvalidArgument;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        GVQ_WARN("%s: cannot open '%s'", fn, path);
        return gvqSystemError;
    }
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    void *buf = n > 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n) : NULL;
    gvqResult_t res = gvqSuccess;
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        GVQ_WARN("%s: cannot read '%s'%s", fn, path, n == 0 ? " (empty file)" : "");
        res = gvqSystemError;
    }
    fclose(f);
    if (res == gvqSuccess) res = load(obj, buf, (size_t)n);
    free(buf);
    return res;
}
