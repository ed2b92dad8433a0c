/*
 * bootstrap_wire.c -- the bootstrap's id and messages as bytes (layouts in gvq_bootstrap.h).
 *
 * Parsing is in one order for every message: size, magic, the id's tag, the MAC, then the
 * fields. Nothing a peer sends is trusted before its MAC is checked, and no field of an
 * authentic message is used before its range is: these functions are what the fuzz target
 * (tests/fuzz/fuzz_bootstrap.c) drives with arbitrary bytes.
 */
#include <string.h>

#include "gvq_bootstrap.h"

static const char MAGIC_CHALLENGE[8] = {'g', 'v', 'q', 'C', 'H', 'A', 'L', '1'};
static const char MAGIC_HELLO[8] = {'g', 'v', 'q', 'H', 'E', 'L', 'O', '1'};
static const char MAGIC_REPLY[8] = {'g', 'v', 'q', 'R', 'P', 'L', 'Y', '1'};

static void put64(uint8_t *p, uint64_t x) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}
static void put32(uint8_t *p, uint32_t x) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}
static uint64_t get64(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}
static uint32_t get32(const uint8_t *p) {
    uint32_t x = 0;
    for (int i = 3; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

/* Equal MACs, in time independent of where they differ. */
static int mac_equal(uint64_t a, uint64_t b) {
    uint64_t d = a ^ b;
    d |= d >> 32;
    d |= d >> 16;
    d |= d >> 8;
    return (d & 0xff) == 0;
}

static void peer_encode(uint8_t *p, const gvq_peer_info_t *i) {
    put32(p, (uint32_t)i->world_rank);
    put32(p + 4, (uint32_t)i->world_size);
    put32(p + 8, (uint32_t)i->pid);
    put32(p + 12, (uint32_t)i->blob_bytes);
    put64(p + 16, i->host_key);
}

/* 0 when the entry is out of range (the world ranks themselves are checked by comm.c). */
static int peer_decode(const uint8_t *p, gvq_peer_info_t *i) {
    i->world_rank = (int32_t)get32(p);
    i->world_size = (int32_t)get32(p + 4);
    i->pid = (int32_t)get32(p + 8);
    i->blob_bytes = (int32_t)get32(p + 12);
    i->host_key = get64(p + 16);
    return i->blob_bytes >= 0 && i->blob_bytes <= GVQ_BOOT_MAX_BLOB && i->world_size >= 1 &&
           i->world_rank >= 0 && i->world_rank < i->world_size;
}

const char *gvq_boot_msg_text(gvq_boot_msg_t m) {
    switch (m) {
    case GVQ_BOOT_MSG_OK:
        return "ok";
    case GVQ_BOOT_MSG_SIZE:
        return "wrong size";
    case GVQ_BOOT_MSG_MAGIC:
        return "not a gvq bootstrap message of this kind (wrong magic)";
    case GVQ_BOOT_MSG_ID:
        return "meant for another bootstrap id (wrong tag)";
    case GVQ_BOOT_MSG_MAC:
        return "failed authentication (wrong MAC: sent without this id's secret, or altered)";
    case GVQ_BOOT_MSG_FIELD:
        return "a field is out of range";
    }
    return "unknown";
}

void gvq_boot_id_encode(gvqUniqueId *out, const gvq_boot_id_t *id) {
    _Static_assert(sizeof(gvq_boot_id_t) <= GVQ_UNIQUE_ID_BYTES, "bootstrap id too large");
    memset(out, 0, sizeof *out);
    memcpy(out->internal, id, sizeof *id);
}

int gvq_boot_id_decode(const gvqUniqueId *in, gvq_boot_id_t *id) {
    memcpy(id, in->internal, sizeof *id);
    uint8_t any = 0;
    for (int i = 0; i < GVQ_BOOT_SECRET_BYTES; i++)
        any |= id->secret[i];
    return id->magic == GVQ_BOOT_ID_MAGIC && id->addr.sin_family == AF_INET &&
           id->addr.sin_port != 0 && any != 0;
}

void gvq_boot_challenge_encode(uint8_t out[GVQ_BOOT_CHALLENGE_BYTES], const gvq_boot_id_t *id,
                               const uint8_t challenge[GVQ_BOOT_NONCE_BYTES]) {
    memcpy(out, MAGIC_CHALLENGE, 8);
    put64(out + 8, id->tag);
    memcpy(out + 16, challenge, GVQ_BOOT_NONCE_BYTES);
}

gvq_boot_msg_t gvq_boot_challenge_parse(const uint8_t *buf, size_t len, const gvq_boot_id_t *id,
                                        uint8_t challenge[GVQ_BOOT_NONCE_BYTES]) {
    if (len != GVQ_BOOT_CHALLENGE_BYTES) return GVQ_BOOT_MSG_SIZE;
    if (memcmp(buf, MAGIC_CHALLENGE, 8) != 0) return GVQ_BOOT_MSG_MAGIC;
    if (get64(buf + 8) != id->tag) return GVQ_BOOT_MSG_ID;
    memcpy(challenge, buf + 16, GVQ_BOOT_NONCE_BYTES);
    return GVQ_BOOT_MSG_OK;
}

uint64_t gvq_boot_hello_mac(const gvq_boot_id_t *id, const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                            const uint8_t hello[GVQ_BOOT_HELLO_BYTES]) {
    gvq_siphash_t s;
    gvq_siphash_init(&s, id->secret);
    gvq_siphash_update(&s, "H", 1);
    gvq_siphash_update(&s, challenge, GVQ_BOOT_NONCE_BYTES);
    gvq_siphash_update(&s, hello, GVQ_BOOT_HELLO_BYTES - GVQ_BOOT_MAC_BYTES);
    return gvq_siphash_final(&s);
}

void gvq_boot_hello_encode(uint8_t out[GVQ_BOOT_HELLO_BYTES], const gvq_boot_id_t *id,
                           const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                           const gvq_boot_hello_t *h) {
    memcpy(out, MAGIC_HELLO, 8);
    put64(out + 8, id->tag);
    put32(out + 16, (uint32_t)h->nranks);
    put32(out + 20, (uint32_t)h->rank);
    put64(out + 24, (uint64_t)h->timeout_ms);
    peer_encode(out + 32, &h->info);
    memcpy(out + 56, h->nonce, GVQ_BOOT_NONCE_BYTES);
    put64(out + 72, gvq_boot_hello_mac(id, challenge, out));
}

gvq_boot_msg_t gvq_boot_hello_parse(const uint8_t *buf, size_t len, const gvq_boot_id_t *id,
                                    const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                                    gvq_boot_hello_t *out) {
    if (len != GVQ_BOOT_HELLO_BYTES) return GVQ_BOOT_MSG_SIZE;
    if (memcmp(buf, MAGIC_HELLO, 8) != 0) return GVQ_BOOT_MSG_MAGIC;
    if (get64(buf + 8) != id->tag) return GVQ_BOOT_MSG_ID;
    if (!mac_equal(get64(buf + 72), gvq_boot_hello_mac(id, challenge, buf)))
        return GVQ_BOOT_MSG_MAC;
    gvq_boot_hello_t h;
    h.nranks = (int32_t)get32(buf + 16);
    h.rank = (int32_t)get32(buf + 20);
    h.timeout_ms = (int64_t)get64(buf + 24);
    int info_ok = peer_decode(buf + 32, &h.info);
    memcpy(h.nonce, buf + 56, GVQ_BOOT_NONCE_BYTES);
    if (!info_ok || h.nranks < 1 || h.nranks > GVQ_BOOT_MAX_RANKS || h.rank < 0 ||
        h.rank >= h.nranks || h.timeout_ms < 0)
        return GVQ_BOOT_MSG_FIELD;
    *out = h;
    return GVQ_BOOT_MSG_OK;
}

uint64_t gvq_boot_blob_mac(const gvq_boot_id_t *id, const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                           const uint8_t *blob, size_t bytes) {
    gvq_siphash_t s;
    gvq_siphash_init(&s, id->secret);
    gvq_siphash_update(&s, "B", 1);
    gvq_siphash_update(&s, challenge, GVQ_BOOT_NONCE_BYTES);
    gvq_siphash_update(&s, blob, bytes);
    return gvq_siphash_final(&s);
}

void gvq_boot_blob_encode(uint8_t *out, const gvq_boot_id_t *id,
                          const uint8_t challenge[GVQ_BOOT_NONCE_BYTES], const void *blob,
                          size_t bytes) {
    if (bytes > 0) memcpy(out, blob, bytes);
    put64(out + bytes, gvq_boot_blob_mac(id, challenge, out, bytes));
}

gvq_boot_msg_t gvq_boot_blob_parse(const uint8_t *buf, size_t len, size_t bytes,
                                   const gvq_boot_id_t *id,
                                   const uint8_t challenge[GVQ_BOOT_NONCE_BYTES]) {
    if (bytes > GVQ_BOOT_MAX_BLOB || len != bytes + GVQ_BOOT_MAC_BYTES) return GVQ_BOOT_MSG_SIZE;
    if (!mac_equal(get64(buf + bytes), gvq_boot_blob_mac(id, challenge, buf, bytes)))
        return GVQ_BOOT_MSG_MAC;
    return GVQ_BOOT_MSG_OK;
}

size_t gvq_boot_table_blob_bytes(const uint8_t *table, int32_t nranks) {
    size_t sum = 0;
    for (int32_t r = 0; r < nranks; r++) {
        uint32_t b = get32(table + (size_t)r * GVQ_BOOT_PEER_BYTES + 12);
        sum += b <= GVQ_BOOT_MAX_BLOB ? b : GVQ_BOOT_MAX_BLOB;
    }
    return sum;
}

size_t gvq_boot_reply_bytes(int32_t status, int32_t nranks) {
    size_t table = status == GVQ_BOOT_OK && nranks > 0 ? (size_t)nranks * GVQ_BOOT_PEER_BYTES : 0;
    return GVQ_BOOT_REPLY_HEAD_BYTES + table + GVQ_BOOT_MAC_BYTES;
}

void gvq_boot_reply_head_encode(uint8_t out[GVQ_BOOT_REPLY_HEAD_BYTES], const gvq_boot_reply_t *r) {
    memcpy(out, MAGIC_REPLY, 8);
    put32(out + 8, (uint32_t)r->status);
    put32(out + 12, (uint32_t)r->nranks);
    put32(out + 16, (uint32_t)r->detail);
    put32(out + 20, (uint32_t)r->rank);
}

void gvq_boot_table_encode(uint8_t *out, const gvq_peer_info_t *table, int nranks) {
    for (int r = 0; r < nranks; r++)
        peer_encode(out + (size_t)r * GVQ_BOOT_PEER_BYTES, &table[r]);
}

uint64_t gvq_boot_table_digest(const gvq_boot_id_t *id, const uint8_t *table, size_t bytes) {
    if (bytes == 0) return 0;
    gvq_siphash_t s;
    gvq_siphash_init(&s, id->secret);
    gvq_siphash_update(&s, "T", 1);
    gvq_siphash_update(&s, table, bytes);
    return gvq_siphash_final(&s);
}

uint64_t gvq_boot_reply_mac(const gvq_boot_id_t *id, const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                            const uint8_t nonce[GVQ_BOOT_NONCE_BYTES],
                            const uint8_t head[GVQ_BOOT_REPLY_HEAD_BYTES], uint64_t digest) {
    uint8_t d[8];
    put64(d, digest);
    gvq_siphash_t s;
    gvq_siphash_init(&s, id->secret);
    gvq_siphash_update(&s, "R", 1);
    gvq_siphash_update(&s, challenge, GVQ_BOOT_NONCE_BYTES);
    gvq_siphash_update(&s, nonce, GVQ_BOOT_NONCE_BYTES);
    gvq_siphash_update(&s, head, GVQ_BOOT_REPLY_HEAD_BYTES);
    gvq_siphash_update(&s, d, sizeof d);
    return gvq_siphash_final(&s);
}

gvq_boot_msg_t gvq_boot_reply_parse(const uint8_t *buf, size_t len, const gvq_boot_id_t *id,
                                    const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                                    const uint8_t nonce[GVQ_BOOT_NONCE_BYTES], int32_t nranks,
                                    int32_t rank, gvq_boot_reply_t *out, gvq_peer_info_t *table) {
    if (len < GVQ_BOOT_REPLY_HEAD_BYTES + GVQ_BOOT_MAC_BYTES) return GVQ_BOOT_MSG_SIZE;
    if (memcmp(buf, MAGIC_REPLY, 8) != 0) return GVQ_BOOT_MSG_MAGIC;
    gvq_boot_reply_t r;
    r.status = (int32_t)get32(buf + 8);
    r.nranks = (int32_t)get32(buf + 12);
    r.detail = (int32_t)get32(buf + 16);
    r.rank = (int32_t)get32(buf + 20);
    /* the size follows from the caller's nranks, never from the unauthenticated head */
    int32_t status_for_size = r.status == GVQ_BOOT_OK ? GVQ_BOOT_OK : GVQ_BOOT_STATUS_COUNT;
    if (nranks < 1 || nranks > GVQ_BOOT_MAX_RANKS) return GVQ_BOOT_MSG_SIZE;
    size_t fixed = gvq_boot_reply_bytes(status_for_size, nranks);
    /* a table's entries name the lengths of the blobs after it (checked by the MAC below) */
    if (len < fixed ||
        len != fixed + (r.status == GVQ_BOOT_OK
                            ? gvq_boot_table_blob_bytes(buf + GVQ_BOOT_REPLY_HEAD_BYTES, nranks)
                            : 0))
        return GVQ_BOOT_MSG_SIZE;
    size_t tbytes = len - GVQ_BOOT_REPLY_HEAD_BYTES - GVQ_BOOT_MAC_BYTES;
    const uint8_t *tab = buf + GVQ_BOOT_REPLY_HEAD_BYTES;
    uint64_t mac =
        gvq_boot_reply_mac(id, challenge, nonce, buf, gvq_boot_table_digest(id, tab, tbytes));
    if (!mac_equal(get64(buf + len - GVQ_BOOT_MAC_BYTES), mac)) return GVQ_BOOT_MSG_MAC;
    if (r.status < 0 || r.status >= GVQ_BOOT_STATUS_COUNT || r.rank != rank ||
        (r.status == GVQ_BOOT_OK && r.nranks != nranks))
        return GVQ_BOOT_MSG_FIELD;
    if (r.status == GVQ_BOOT_OK) {
        for (int32_t i = 0; i < nranks; i++)
            if (!peer_decode(tab + (size_t)i * GVQ_BOOT_PEER_BYTES, &table[i]))
                return GVQ_BOOT_MSG_FIELD;
    }
    *out = r;
    return GVQ_BOOT_MSG_OK;
}
