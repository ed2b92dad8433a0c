/*
 * gvq_bootstrap.h -- the bootstrap's id and wire messages (bootstrap_wire.c; the root side in
 * bootstrap_root.c, the rank side in bootstrap.c), for the bootstrap
 * itself, its tests and its fuzz target. comm.c sees only gvq_comm.h's two entry points.
 *
 * Every message is a fixed layout of little-endian fields. The parsers below are pure: bytes in,
 * a verdict and the decoded fields out, no I/O, no allocation; they check size, magic, the id's
 * tag, the MAC (SipHash-2-4 keyed by the id's secret) and then every field's range.
 *
 *   challenge  root -> rank   "gvqCHAL1" tag challenge[16]                              32 bytes
 *   hello      rank -> root   "gvqHELO1" tag nranks rank timeout_ms info[24] nonce[16] mac
 *                             mac = SipHash(key, 'H' challenge hello[0..72))             80 bytes
 *   blob       rank -> root   blob[info.blob_bytes] mac     (only when info.blob_bytes > 0)
 *                             mac = SipHash(key, 'B' challenge blob)
 *   reply      root -> rank   "gvqRPLY1" status nranks detail rank [table: nranks x 24, then
 *                             every rank's blob in rank order] mac
 *                             mac = SipHash(key, 'R' challenge nonce reply[0..24) digest)
 *                             digest = SipHash(key, 'T' table blobs), 0 without a table
 *
 * A table entry is world_rank world_size pid blob_bytes host_key (4+4+4+4+8). The blob is what a
 * rank's transport needs the others to know (the UCX transport's worker address); MPI sends none.
 */
#ifndef GVQ_BOOTSTRAP_H_
#define GVQ_BOOTSTRAP_H_

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#include "gvq_comm.h"
#include "gvq_siphash.h"

#define GVQ_BOOT_ID_MAGIC 0x3274306f6f627167ull /* "gqboot2" */
#define GVQ_BOOT_SECRET_BYTES GVQ_SIPHASH_KEY_BYTES
#define GVQ_BOOT_NONCE_BYTES 16
#define GVQ_BOOT_CHALLENGE_BYTES 32
#define GVQ_BOOT_HELLO_BYTES 80
#define GVQ_BOOT_REPLY_HEAD_BYTES 24
#define GVQ_BOOT_PEER_BYTES 24 /* one table entry (gvq_peer_info_t on the wire) */
#define GVQ_BOOT_MAC_BYTES 8
#define GVQ_BOOT_MAX_RANKS (1 << 20)

/* The id's content: the first bytes of gvqUniqueId.internal. */
typedef struct {
    uint64_t magic;                        /* GVQ_BOOT_ID_MAGIC */
    uint64_t tag;                          /* random, public: names the id on the wire */
    struct sockaddr_in addr;               /* the root's listener */
    uint8_t secret[GVQ_BOOT_SECRET_BYTES]; /* the MAC key: never sent */
} gvq_boot_id_t;

/* The reply's status. */
enum {
    GVQ_BOOT_OK = 0,
    GVQ_BOOT_NRANKS_MISMATCH, /* detail: the other nranks */
    GVQ_BOOT_DUP_RANK,        /* detail: the rank claimed twice */
    GVQ_BOOT_TIMEOUT,         /* detail: how many ranks joined */
    GVQ_BOOT_NO_MEMORY,
    GVQ_BOOT_STATUS_COUNT
};

typedef struct {
    int32_t nranks, rank;
    int64_t timeout_ms; /* the rank's timeout; the first hello's sets the root's deadline */
    gvq_peer_info_t info;
    uint8_t nonce[GVQ_BOOT_NONCE_BYTES]; /* the rank's challenge to the root */
} gvq_boot_hello_t;

typedef struct {
    int32_t status, nranks, detail, rank; /* rank: the one the reply is for */
} gvq_boot_reply_t;

/* What a parser found. */
typedef enum {
    GVQ_BOOT_MSG_OK = 0,
    GVQ_BOOT_MSG_SIZE,  /* not the message's size */
    GVQ_BOOT_MSG_MAGIC, /* not this kind of gvq message */
    GVQ_BOOT_MSG_ID,    /* for another id (tag) */
    GVQ_BOOT_MSG_MAC,   /* fails authentication: sent without the id's secret, or altered */
    GVQ_BOOT_MSG_FIELD  /* authentic, but a field out of range */
} gvq_boot_msg_t;
const char *gvq_boot_msg_text(gvq_boot_msg_t m);

/* The id <-> its bytes; decode refuses (0) a wrong magic, family or port, or an empty secret. */
void gvq_boot_id_encode(gvqUniqueId *out, const gvq_boot_id_t *id);
int gvq_boot_id_decode(const gvqUniqueId *in, gvq_boot_id_t *id);

void gvq_boot_challenge_encode(uint8_t out[GVQ_BOOT_CHALLENGE_BYTES], const gvq_boot_id_t *id,
                               const uint8_t challenge[GVQ_BOOT_NONCE_BYTES]);
gvq_boot_msg_t gvq_boot_challenge_parse(const uint8_t *buf, size_t len, const gvq_boot_id_t *id,
                                        uint8_t challenge[GVQ_BOOT_NONCE_BYTES]);

/* The MAC of a hello's first 72 bytes; encode writes it, parse checks it. */
uint64_t gvq_boot_hello_mac(const gvq_boot_id_t *id, const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                            const uint8_t hello[GVQ_BOOT_HELLO_BYTES]);
void gvq_boot_hello_encode(uint8_t out[GVQ_BOOT_HELLO_BYTES], const gvq_boot_id_t *id,
                           const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                           const gvq_boot_hello_t *h);
gvq_boot_msg_t gvq_boot_hello_parse(const uint8_t *buf, size_t len, const gvq_boot_id_t *id,
                                    const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                                    gvq_boot_hello_t *out);

/* A blob message: bytes of blob and its MAC (out: bytes + GVQ_BOOT_MAC_BYTES). parse checks
 * the length (the hello's blob_bytes, already authenticated) and the MAC. */
uint64_t gvq_boot_blob_mac(const gvq_boot_id_t *id, const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                           const uint8_t *blob, size_t bytes);
void gvq_boot_blob_encode(uint8_t *out, const gvq_boot_id_t *id,
                          const uint8_t challenge[GVQ_BOOT_NONCE_BYTES], const void *blob,
                          size_t bytes);
gvq_boot_msg_t gvq_boot_blob_parse(const uint8_t *buf, size_t len, size_t bytes,
                                   const gvq_boot_id_t *id,
                                   const uint8_t challenge[GVQ_BOOT_NONCE_BYTES]);
/* The blobs an encoded table of nranks entries announces, in bytes (each entry's length capped at
 * GVQ_BOOT_MAX_BLOB; a longer one fails the entry's decoding later). */
size_t gvq_boot_table_blob_bytes(const uint8_t *table, int32_t nranks);

/* A reply's size without blobs: with the table for GVQ_BOOT_OK, without for the errors. A
 * GVQ_BOOT_OK reply is longer by gvq_boot_table_blob_bytes of its table. */
size_t gvq_boot_reply_bytes(int32_t status, int32_t nranks);
void gvq_boot_reply_head_encode(uint8_t out[GVQ_BOOT_REPLY_HEAD_BYTES], const gvq_boot_reply_t *r);
void gvq_boot_table_encode(uint8_t *out, const gvq_peer_info_t *table, int nranks);
uint64_t gvq_boot_table_digest(const gvq_boot_id_t *id, const uint8_t *table, size_t bytes);
uint64_t gvq_boot_reply_mac(const gvq_boot_id_t *id, const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                            const uint8_t nonce[GVQ_BOOT_NONCE_BYTES],
                            const uint8_t head[GVQ_BOOT_REPLY_HEAD_BYTES], uint64_t digest);
/* A whole reply for the rank that sent `nonce` as `rank` of `nranks` answering `challenge`.
 * table (nranks entries) is written for GVQ_BOOT_OK only; the blobs are then the bytes after the
 * table (buf + GVQ_BOOT_REPLY_HEAD_BYTES + nranks * GVQ_BOOT_PEER_BYTES). */
gvq_boot_msg_t gvq_boot_reply_parse(const uint8_t *buf, size_t len, const gvq_boot_id_t *id,
                                    const uint8_t challenge[GVQ_BOOT_NONCE_BYTES],
                                    const uint8_t nonce[GVQ_BOOT_NONCE_BYTES], int32_t nranks,
                                    int32_t rank, gvq_boot_reply_t *out, gvq_peer_info_t *table);

/* bootstrap.c, for both sides: n random bytes from getrandom(2) (0, or -1 with errno), an
 * address as "a.b.c.d:port", and the root's interface address (GVQ_SOCKET_IFNAME, else the
 * first non-loopback IPv4 interface that is up, else loopback; 0, or -1). */
int gvq_boot_random(void *p, size_t n);
void gvq_boot_addr_text(const struct sockaddr_in *a, char *out, size_t n);
int gvq_boot_pick_address(struct in_addr *out);
/* Move len bytes over a socket (writing or reading), giving up at deadline (ns, 0: never): 0, or
 * -errno (-ETIMEDOUT, -ECONNRESET when the peer closed). */
int gvq_boot_io_until(int fd, void *buf, size_t len, int writing, uint64_t deadline);

#endif /* GVQ_BOOTSTRAP_H_ */
