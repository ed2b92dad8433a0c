/*
 * crc.c -- CRC-32C (Castagnoli), the checksum of saved states (blob.c).
 *
 * The reflected CRC with polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF (the
 * iSCSI / ext4 one: "123456789" -> 0xE3069283). It detects every error burst of up to 32 bits
 * and every odd number of flipped bits; any other corruption passes with odds 2^-32. It is a
 * guard against damaged files, not against forged ones (anyone can recompute it): a load
 * therefore also checks every field it reads.
 *
 * Eight bytes per step ("slicing by 8"): table k maps a byte to its CRC followed by k zero
 * bytes, so the eight lookups of one step are independent:
 *
 *   b0..b7 = the next 8 bytes, the first 4 xor-ed with crc
 *   crc    = T7[b0] ^ T6[b1] ^ T5[b2] ^ T4[b3] ^ T3[b4] ^ T2[b5] ^ T1[b6] ^ T0[b7]
 *
 * The tables are built once, on first use.
 */
#include <pthread.h>

#include "gvq_util.h"

#define CRC32C_POLY 0x82F63B78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1u)));
        table[0][b] = c;
    }
    for (int t = 1; t < 8; t++)
        for (uint32_t b = 0; b < 256; b++)
            table[t][b] = (table[t - 1][b] >> 8) ^ table[0][table[t - 1][b] & 0xFFu];
}

/* Little-endian 32-bit word at p (any alignment). */
static uint32_t load_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t gvq_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&table_once, build_tables);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = load_le32(p) ^ c, hi = load_le32(p + 4);
        c = table[7][lo & 0xFFu] ^ table[6][(lo >> 8) & 0xFFu] ^ table[5][(lo >> 16) & 0xFFu] ^
            table[4][lo >> 24] ^ table[3][hi & 0xFFu] ^ table[2][(hi >> 8) & 0xFFu] ^
            table[1][(hi >> 16) & 0xFFu] ^ table[0][hi >> 24];
    }
    for (; n > 0; n--, p++)
        c = (c >> 8) ^ table[0][(c ^ *p) & 0xFFu];
    return ~c;
}
