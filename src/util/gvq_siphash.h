/*
 * gvq_siphash.h -- SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF",
 * 2012): a keyed 64-bit pseudo-random function, used as a message authentication code where the
 * messages are short and the key is a 128-bit secret (the bootstrap's challenge-response).
 *
 * One-shot (gvq_siphash) or incremental (init, update any number of times, final); both give
 * the same value for the same bytes however they were split.
 */
#ifndef GVQ_SIPHASH_H_
#define GVQ_SIPHASH_H_

#include <stddef.h>
#include <stdint.h>

#define GVQ_SIPHASH_KEY_BYTES 16

typedef struct {
    uint64_t v[4];
    uint64_t tail; /* the bytes of the unfinished 8-byte word, little-endian */
    size_t len;    /* bytes seen so far */
} gvq_siphash_t;

void gvq_siphash_init(gvq_siphash_t *s, const uint8_t key[GVQ_SIPHASH_KEY_BYTES]);
void gvq_siphash_update(gvq_siphash_t *s, const void *data, size_t n);
uint64_t gvq_siphash_final(const gvq_siphash_t *s);
uint64_t gvq_siphash(const uint8_t key[GVQ_SIPHASH_KEY_BYTES], const void *data, size_t n);

#endif /* GVQ_SIPHASH_H_ */
