/*
 * siphash.c -- SipHash-2-4, written from the paper's specification (section 2):
 *
 *   init:   v0 = k0 ^ "somepseu"  v1 = k1 ^ "dorandom"  v2 = k0 ^ "lygenera"  v3 = k1 ^ "tedbytes"
 *   each 8-byte little-endian word m:  v3 ^= m; 2 SipRounds; v0 ^= m
 *   last word: the 0..7 remaining bytes, with (length mod 256) in its top byte, compressed alike
 *   final:  v2 ^= 0xff; 4 SipRounds; result v0 ^ v1 ^ v2 ^ v3
 *
 * The key k0 || k1 is 16 bytes read as two little-endian 64-bit words.
 */
#include "gvq_siphash.h"

static uint64_t rotl(uint64_t x, int b) {
    return (x << b) | (x >> (64 - b));
}

static uint64_t load_le64(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

static void sip_round(uint64_t v[4]) {
    v[0] += v[1];
    v[1] = rotl(v[1], 13);
    v[1] ^= v[0];
    v[0] = rotl(v[0], 32);
    v[2] += v[3];
    v[3] = rotl(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = rotl(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = rotl(v[1], 17);
    v[1] ^= v[2];
    v[2] = rotl(v[2], 32);
}

static void compress(uint64_t v[4], uint64_t m) {
    v[3] ^= m;
    sip_round(v);
    sip_round(v);
    v[0] ^= m;
}

void gvq_siphash_init(gvq_siphash_t *s, const uint8_t key[GVQ_SIPHASH_KEY_BYTES]) {
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    s->v[0] = k0 ^ 0x736f6d6570736575ull;
    s->v[1] = k1 ^ 0x646f72616e646f6dull;
    s->v[2] = k0 ^ 0x6c7967656e657261ull;
    s->v[3] = k1 ^ 0x7465646279746573ull;
    s->tail = 0;
    s->len = 0;
}

void gvq_siphash_update(gvq_siphash_t *s, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        s->tail |= (uint64_t)p[i] << (8 * (s->len % 8));
        s->len++;
        if (s->len % 8 == 0) {
            compress(s->v, s->tail);
            s->tail = 0;
        }
    }
}

uint64_t gvq_siphash_final(const gvq_siphash_t *s) {
    uint64_t v[4] = {s->v[0], s->v[1], s->v[2], s->v[3]};
    compress(v, s->tail | ((uint64_t)(s->len & 0xff) << 56));
    v[2] ^= 0xff;
    for (int i = 0; i < 4; i++)
        sip_round(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

uint64_t gvq_siphash(const uint8_t key[GVQ_SIPHASH_KEY_BYTES], const void *data, size_t n) {
    gvq_siphash_t s;
    gvq_siphash_init(&s, key);
    gvq_siphash_update(&s, data, n);
    return gvq_siphash_final(&s);
}
