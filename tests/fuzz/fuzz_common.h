/*
 * fuzz_common.h -- what the libFuzzer targets of tests/fuzz/ share (header only; each target is
 * one fuzz_<name>.c, built by tests/fuzz/CMakeLists.txt and run by scripts/fuzz.sh):
 *
 *   fuzz_quiet()        logs off (a refusal's WARN per input would drown the fuzzer's output)
 *   fuzz_comm()         one 1-rank in-process communicator per process, made on first use
 *   fuzz_seed_dir()     GVQ_FUZZ_WRITE_SEEDS: the folder a target writes its seed corpus into
 *                       (scripts/fuzz.sh --seeds), or NULL when fuzzing
 *   fuzz_write_seed()   one seed file: a selector byte, then the bytes
 *
 * The saved-state targets read their input as | selector | state bytes |: the selector's low
 * bits pick a handle, its bit 7 asks for the state's checksum to be recomputed before the load,
 * so the fuzzer reaches the field checks behind the checksum as a forged file would.
 *
 *   fuzz_state_init()   a saved-state target's LLVMFuzzerInitialize: its handles made, their
 *                       states kept (or written as seeds)
 *   fuzz_state_one()    its LLVMFuzzerTestOneInput: a refused load must be gvqInvalidArgument,
 *                       an accepted one must leave the handle working; then the handle's own
 *                       state is loaded back, so every input starts from the same state
 */
#ifndef GVQ_FUZZ_COMMON_H_
#define GVQ_FUZZ_COMMON_H_

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_comm.h"

#define FUZZ_RESEAL 0x80u

static inline void fuzz_quiet(void) {
    setenv("GVQ_DEBUG", "NONE", 1);
}

static inline gvqComm_t fuzz_comm(void) {
    static gvqComm_t comm;
    if (comm == NULL && gvq_comm_init_inproc(1, NULL, &comm) != gvqSuccess) {
        fprintf(stderr, "fuzz: cannot create an in-process communicator\n");
        abort();
    }
    return comm;
}

/* Abort (a finding) when a call on a handle that must work fails. */
#define FUZZ_OK(call)                                                                          \
    do {                                                                                       \
        gvqResult_t fuzz_res_ = (call);                                                        \
        if (fuzz_res_ != gvqSuccess) {                                                         \
            fprintf(stderr, "fuzz: %s failed: %s (%s)\n", #call, gvqGetErrorString(fuzz_res_), \
                    gvqGetLastError(NULL));                                                    \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

static inline const char *fuzz_seed_dir(void) {
    const char *dir = getenv("GVQ_FUZZ_WRITE_SEEDS");
    return dir != NULL && dir[0] != '\0' ? dir : NULL;
}

static inline void fuzz_write_seed(const char *dir, const char *name, uint8_t selector,
                                   const void *bytes, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(&selector, 1, 1, f) != 1 || fwrite(bytes, 1, n, f) != n) {
        fprintf(stderr, "fuzz: cannot write the seed %s\n", path);
        abort();
    }
    fclose(f);
}

/* The saved-state targets' seeds: every subject's state as saved (`<name>.state`) and with the
 * reseal bit (`<name>_resealed.state`). name(k) names subject k. */
static inline void fuzz_write_state_seeds(const char *dir, int nsubj, const char *(*name)(int),
                                          char *const *state, const size_t *bytes) {
    for (int k = 0; k < nsubj; k++) {
        char file[96];
        snprintf(file, sizeof file, "%s.state", name(k));
        fuzz_write_seed(dir, file, (uint8_t)k, state[k], bytes[k]);
        snprintf(file, sizeof file, "%s_resealed.state", name(k));
        fuzz_write_seed(dir, file, (uint8_t)(k | FUZZ_RESEAL), state[k], bytes[k]);
    }
}

/* A saved-state target's input | selector | state |: *k the subject (of nsubj), and a copy of
 * exactly the *n state bytes (so ASan sees any over-read; the caller frees it), its checksum at
 * offset checksum_at recomputed when the selector asks. NULL for an empty input. */
static inline uint8_t *fuzz_state_input(const uint8_t *data, size_t size, int nsubj,
                                        size_t checksum_at, int *k, size_t *n) {
    if (size < 1) return NULL;
    *k = (data[0] & 0x7F) % nsubj;
    *n = size - 1;
    uint8_t *buf = malloc(*n > 0 ? *n : 1);
    if (buf == NULL) abort();
    memcpy(buf, data + 1, *n);
    if ((data[0] & FUZZ_RESEAL) && *n >= checksum_at + 8) gvq_blob_seal(buf, *n, checksum_at);
    return buf;
}

/* A saved-state target: its handles (subjects) and what to do with them. */
typedef struct {
    int nsubj;
    size_t checksum_at;    /* where the state's header keeps its checksum */
    const char *load_name; /* the load call, for the abort message */
    void (*make)(int k);   /* drive subject k into a real state, saved in orig[k], orig_n[k] */
    const char *(*name)(int k);
    gvqResult_t (*load)(int k, const void *buf, size_t n);
    void (*exercise)(int k); /* after an accepted load: the handle must work (FUZZ_OK inside) */
    char **orig;
    size_t *orig_n;
} fuzz_state_target_t;

static inline void fuzz_state_init(const fuzz_state_target_t *t) {
    fuzz_quiet();
    for (int k = 0; k < t->nsubj; k++)
        t->make(k);
    const char *dir = fuzz_seed_dir();
    if (dir != NULL) {
        fuzz_write_state_seeds(dir, t->nsubj, t->name, t->orig, t->orig_n);
        exit(0);
    }
}

static inline void fuzz_state_one(const fuzz_state_target_t *t, const uint8_t *data, size_t size) {
    int k;
    size_t n;
    uint8_t *buf = fuzz_state_input(data, size, t->nsubj, t->checksum_at, &k, &n);
    if (buf == NULL) return;
    gvqResult_t res = t->load(k, buf, n);
    free(buf);
    if (res == gvqSuccess) {
        t->exercise(k);
    } else if (res != gvqInvalidArgument) {
        fprintf(stderr, "fuzz: %s returned %s\n", t->load_name, gvqGetErrorString(res));
        abort();
    }
    FUZZ_OK(t->load(k, t->orig[k], t->orig_n[k]));
}

#endif /* GVQ_FUZZ_COMMON_H_ */
