/*
 * gvq_ps_wire.h -- the layouts rows travel in between ranks, in one place: the row block of
 * src/algorithms/gvq_sparse.h (what the parameter server's exchanges and gvqSparseAllGatherv send)
 * and the answer to a pull request.
 *
 *   row block of n rows:   | index 0 | index 1 | .. | index n-1 | values 0 | .. | values n-1 |
 *                            int64 each (GVQ_WIRE_INDEX_BYTES)     row_bytes each
 *                          (a pull request is a block with row_bytes 0: the indices only)
 *
 *   pull reply of k rows:  | status | values 0 | values 1 | .. | values k-1 |
 *                            int64    row_bytes each, in the order of the request's indices
 *                          (status 0: served; 1: the request was malformed, values all zero)
 */
#ifndef GVQ_PS_WIRE_H_
#define GVQ_PS_WIRE_H_

#include <stdint.h>
#include <string.h>

#define GVQ_WIRE_INDEX_BYTES sizeof(int64_t)
#define GVQ_WIRE_STATUS_BYTES sizeof(int64_t)

/* ---- row blocks ---------------------------------------------------------------------------- */

/* Bytes of a block of n rows. */
static inline size_t gvq_wire_block_bytes(size_t n, size_t row_bytes) {
    return n * (GVQ_WIRE_INDEX_BYTES + row_bytes);
}

/* The indices of a block (n of them, at its start). */
static inline int64_t *gvq_wire_block_indices(void *block) {
    return (int64_t *)block;
}

/* The values of a block of n rows (behind its indices). */
static inline char *gvq_wire_block_values(void *block, size_t n) {
    return (char *)block + n * GVQ_WIRE_INDEX_BYTES;
}

/* Write n rows (indices idx, values val) as a block. */
static inline void gvq_wire_block_pack(void *block, const int64_t *idx, const void *val, size_t n,
                                       size_t row_bytes) {
    memcpy(gvq_wire_block_indices(block), idx, n * GVQ_WIRE_INDEX_BYTES);
    memcpy(gvq_wire_block_values(block, n), val, n * row_bytes);
}

/* Write row `at` of a block of n rows. */
static inline void gvq_wire_block_put(void *block, size_t n, size_t at, int64_t index,
                                      const void *val, size_t row_bytes) {
    gvq_wire_block_indices(block)[at] = index;
    memcpy(gvq_wire_block_values(block, n) + at * row_bytes, val, row_bytes);
}

/* Copy the n rows of a block out into separate index and value arrays. */
static inline void gvq_wire_block_unpack(const void *block, size_t n, size_t row_bytes,
                                         int64_t *idx, void *val) {
    memcpy(idx, block, n * GVQ_WIRE_INDEX_BYTES);
    memcpy(val, (const char *)block + n * GVQ_WIRE_INDEX_BYTES, n * row_bytes);
}

/* ---- pull replies -------------------------------------------------------------------------- */

/* Bytes of a reply carrying k rows. */
static inline size_t gvq_wire_reply_bytes(size_t k, size_t row_bytes) {
    return GVQ_WIRE_STATUS_BYTES + k * row_bytes;
}

static inline int64_t gvq_wire_reply_status(const void *reply) {
    int64_t status;
    memcpy(&status, reply, sizeof status);
    return status;
}

static inline void gvq_wire_reply_set_status(void *reply, int64_t status) {
    memcpy(reply, &status, sizeof status);
}

/* Where row i of a reply lies. */
static inline char *gvq_wire_reply_row(void *reply, size_t i, size_t row_bytes) {
    return (char *)reply + GVQ_WIRE_STATUS_BYTES + i * row_bytes;
}

#endif /* GVQ_PS_WIRE_H_ */
