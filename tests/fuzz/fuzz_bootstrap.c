/*
 * fuzz_bootstrap.c -- libFuzzer target: the bootstrap's message parsers (bootstrap_wire.c) on
 * any bytes, as a stranger on the network would send them.
 *
 *   input: | selector | message ... |      (fuzz_common.h)
 *   selector & 3 picks the parser: 0 challenge, 1 hello (the root's), 2 and 3 reply (a rank's);
 *   ((selector >> 2) & 15) + 1 is the nranks a rank expects a reply for (its rank: nranks - 1);
 *   bit 7 (FUZZ_RESEAL) writes the right MAC into a hello or reply before parsing, so the
 *   fuzzer reaches the field checks behind the MAC as a peer holding the secret would.
 *
 * The id, challenge and nonce are fixed. Each message is copied into a buffer of exactly its
 * size (ASan sees any over-read). An accepted message must be what its encoder writes for the
 * decoded fields: a parser that accepts bytes its encoder would not produce is a finding.
 * Seeds (GVQ_FUZZ_WRITE_SEEDS): a real challenge, hello, and replies with and without a table.
 */
#include <arpa/inet.h>

#include "fuzz_common.h"
#include "gvq_bootstrap.h"

static gvq_boot_id_t id;
static uint8_t challenge[GVQ_BOOT_NONCE_BYTES], nonce[GVQ_BOOT_NONCE_BYTES];

static void put_mac(uint8_t *p, uint64_t mac) {
    for (int i = 0; i < GVQ_BOOT_MAC_BYTES; i++)
        p[i] = (uint8_t)(mac >> (8 * i));
}

/* A reply as the root writes it; n bytes in *out (malloc'd). */
static uint8_t *make_reply(int32_t status, int32_t nranks, int32_t rank, size_t *n) {
    *n = gvq_boot_reply_bytes(status, nranks);
    uint8_t *r = calloc(1, *n);
    gvq_boot_reply_t rep = {status, nranks, status == GVQ_BOOT_OK ? 0 : 1, rank};
    gvq_boot_reply_head_encode(r, &rep);
    size_t tb = *n - GVQ_BOOT_REPLY_HEAD_BYTES - GVQ_BOOT_MAC_BYTES;
    if (tb > 0) {
        gvq_peer_info_t t[16];
        for (int i = 0; i < nranks; i++)
            t[i] = (gvq_peer_info_t){i, nranks, 1000 + i, 0, (uint64_t)i / 2};
        gvq_boot_table_encode(r + GVQ_BOOT_REPLY_HEAD_BYTES, t, nranks);
    }
    uint64_t d = gvq_boot_table_digest(&id, r + GVQ_BOOT_REPLY_HEAD_BYTES, tb);
    put_mac(r + *n - GVQ_BOOT_MAC_BYTES, gvq_boot_reply_mac(&id, challenge, nonce, r, d));
    return r;
}

static void write_seeds(const char *dir) {
    uint8_t c[GVQ_BOOT_CHALLENGE_BYTES], h[GVQ_BOOT_HELLO_BYTES];
    gvq_boot_challenge_encode(c, &id, challenge);
    fuzz_write_seed(dir, "challenge", 0, c, sizeof c);
    uint8_t blob[40 + GVQ_BOOT_MAC_BYTES];
    gvq_boot_blob_encode(blob, &id, challenge, "a UCX worker address, forty bytes long.", 40);
    fuzz_write_seed(dir, "blob_resealed", 0 | FUZZ_RESEAL, blob, sizeof blob);
    gvq_boot_hello_t hello = {4, 1, 5000, {1, 4, 4242, 0, 7}, {0}};
    memcpy(hello.nonce, nonce, sizeof nonce);
    gvq_boot_hello_encode(h, &id, challenge, &hello);
    fuzz_write_seed(dir, "hello", 1, h, sizeof h);
    fuzz_write_seed(dir, "hello_resealed", 1 | FUZZ_RESEAL, h, sizeof h);
    size_t n;
    uint8_t *r = make_reply(GVQ_BOOT_OK, 4, 3, &n); /* selector: nranks (3 << 2) + 1 = 4 */
    fuzz_write_seed(dir, "reply_table", 2 | (3 << 2), r, n);
    fuzz_write_seed(dir, "reply_table_resealed", 2 | (3 << 2) | FUZZ_RESEAL, r, n);
    free(r);
    r = make_reply(GVQ_BOOT_DUP_RANK, 2, 1, &n);
    fuzz_write_seed(dir, "reply_dup", 2 | (1 << 2), r, n);
    free(r);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    id.magic = GVQ_BOOT_ID_MAGIC;
    id.tag = 0x0123456789abcdefull;
    id.addr.sin_family = AF_INET;
    id.addr.sin_port = htons(4242);
    for (int i = 0; i < GVQ_BOOT_SECRET_BYTES; i++)
        id.secret[i] = (uint8_t)(31 * i + 7);
    for (int i = 0; i < GVQ_BOOT_NONCE_BYTES; i++) {
        challenge[i] = (uint8_t)(3 * i + 1);
        nonce[i] = (uint8_t)(250 - 5 * i);
    }
    const char *dir = fuzz_seed_dir();
    if (dir != NULL) {
        write_seeds(dir);
        exit(0);
    }
    return 0;
}

static void fuzz_hello(uint8_t *buf, size_t n, int reseal) {
    if (reseal && n == GVQ_BOOT_HELLO_BYTES)
        put_mac(buf + n - GVQ_BOOT_MAC_BYTES, gvq_boot_hello_mac(&id, challenge, buf));
    gvq_boot_hello_t h;
    if (gvq_boot_hello_parse(buf, n, &id, challenge, &h) != GVQ_BOOT_MSG_OK) return;
    if (h.nranks < 1 || h.rank < 0 || h.rank >= h.nranks || h.timeout_ms < 0) abort();
    uint8_t again[GVQ_BOOT_HELLO_BYTES];
    gvq_boot_hello_encode(again, &id, challenge, &h);
    if (memcmp(again, buf, n) != 0) abort(); /* accepted what the encoder would not write */
}

static void fuzz_reply(uint8_t *buf, size_t n, int32_t nranks, int reseal) {
    int32_t rank = nranks - 1;
    if (reseal && n >= GVQ_BOOT_REPLY_HEAD_BYTES + GVQ_BOOT_MAC_BYTES) {
        size_t tb = n - GVQ_BOOT_REPLY_HEAD_BYTES - GVQ_BOOT_MAC_BYTES;
        uint64_t d = gvq_boot_table_digest(&id, buf + GVQ_BOOT_REPLY_HEAD_BYTES, tb);
        put_mac(buf + n - GVQ_BOOT_MAC_BYTES, gvq_boot_reply_mac(&id, challenge, nonce, buf, d));
    }
    gvq_boot_reply_t r;
    gvq_peer_info_t table[16];
    if (gvq_boot_reply_parse(buf, n, &id, challenge, nonce, nranks, rank, &r, table) !=
        GVQ_BOOT_MSG_OK)
        return;
    size_t blobs = 0;
    for (int32_t i = 0; r.status == GVQ_BOOT_OK && i < nranks; i++) {
        if (table[i].world_rank < 0 || table[i].world_rank >= table[i].world_size ||
            table[i].blob_bytes < 0 || table[i].blob_bytes > GVQ_BOOT_MAX_BLOB)
            abort();
        blobs += (size_t)table[i].blob_bytes;
    }
    if (r.status < 0 || r.status >= GVQ_BOOT_STATUS_COUNT || r.rank != rank ||
        n != gvq_boot_reply_bytes(r.status, nranks) + blobs)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    size_t n = size - 1;
    uint8_t *buf = malloc(n > 0 ? n : 1); /* exactly n bytes: ASan sees any over-read */
    memcpy(buf, data + 1, n);
    int reseal = (sel & FUZZ_RESEAL) != 0;
    switch (sel & 3) {
    case 0: {
        uint8_t ch[GVQ_BOOT_NONCE_BYTES];
        if (gvq_boot_challenge_parse(buf, n, &id, ch) == GVQ_BOOT_MSG_OK &&
            (n != GVQ_BOOT_CHALLENGE_BYTES || gvq_boot_msg_text(GVQ_BOOT_MSG_OK) == NULL))
            abort();
        /* the same bytes as a blob message of the length they imply */
        size_t bb = n >= GVQ_BOOT_MAC_BYTES ? n - GVQ_BOOT_MAC_BYTES : 0;
        if (reseal && n >= GVQ_BOOT_MAC_BYTES && bb <= GVQ_BOOT_MAX_BLOB)
            put_mac(buf + bb, gvq_boot_blob_mac(&id, challenge, buf, bb));
        gvq_boot_msg_t m = gvq_boot_blob_parse(buf, n, bb, &id, challenge);
        if (m == GVQ_BOOT_MSG_OK && (n < GVQ_BOOT_MAC_BYTES || bb > GVQ_BOOT_MAX_BLOB)) abort();
        break;
    }
    case 1:
        fuzz_hello(buf, n, reseal);
        break;
    default:
        fuzz_reply(buf, n, (int32_t)((sel >> 2) & 15) + 1, reseal);
    }
    free(buf);
    return 0;
}
