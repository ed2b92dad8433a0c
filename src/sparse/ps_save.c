/*
 * ps_save.c -- gvqPsSave / gvqPsLoad and their file forms: one rank's shards with the shape
 * they belong to.
 *
 *   | header: 13 x uint64                                   | values   | rule state   | pending |
 *   | magic bytes rows dim dtype partitions partitioning     | nlocal   | nlocal rows  | npending|
 *   | rule nranks rank nlocal npending checksum              | rows     | (not for SGD)| entries |
 *
 *   pending entry: | slot (uint64) | its gradient sum (row_bytes) |, in the order first pushed
 *
 * The checksum is the CRC-32C of the whole state (gvq_blob_seal). A load trusts nothing: it
 * checks everything (magic, size, checksum, shape, config, rank, every pending slot inside the
 * shard and named once, Adagrad's accumulators not negative) before it changes anything. The
 * file forms go through gvq_blob_save_file / gvq_blob_load_file.
 */
#include <stdlib.h>

#include "gvq_stream.h"
#include "gvq_ps.h"

#define PS_SAVE_MAGIC 0x3253505152564721ull /* "!GVRQPS2" */

typedef struct {
    uint64_t magic, bytes;
    uint64_t rows, dim, dtype, partitions, partitioning, rule, nranks, rank, nlocal, npending;
    uint64_t checksum; /* gvq_blob_seal's */
} ps_save_hdr_t;

#define CHECKSUM_AT offsetof(ps_save_hdr_t, checksum)

#define PENDING_SLOT_BYTES sizeof(uint64_t)

static size_t pending_entry_bytes(gvqPs_t ps) {
    return PENDING_SLOT_BYTES + ps->row_bytes;
}

/* Bytes of the values and the rule state. */
static size_t rows_bytes(gvqPs_t ps) {
    return ps->nlocal * ps->row_bytes * (ps->rule_state != NULL ? 2 : 1);
}

static size_t save_size(gvqPs_t ps, size_t npending) {
    return sizeof(ps_save_hdr_t) + rows_bytes(ps) + npending * pending_entry_bytes(ps);
}

static ps_save_hdr_t header_of(gvqPs_t ps, size_t bytes) {
    return (ps_save_hdr_t){.magic = PS_SAVE_MAGIC,
                           .bytes = bytes,
                           .rows = ps->rows,
                           .dim = ps->dim,
                           .dtype = (uint64_t)ps->dtype,
                           .partitions = (uint64_t)ps->cfg.partitions,
                           .partitioning = (uint64_t)ps->cfg.partitioning,
                           .rule = (uint64_t)ps->cfg.rule,
                           .nranks = (uint64_t)ps->comm->nranks,
                           .rank = (uint64_t)ps->comm->rank,
                           .nlocal = ps->nlocal,
                           .npending = ps->npending};
}

/* Copy n bytes to *p and move *p past them. */
static void put(char **p, const void *src, size_t n) {
    memcpy(*p, src, n);
    *p += n;
}

static gvqResult_t save_locked(gvqPs_t ps, void *buf, size_t *size) {
    size_t need = save_size(ps, ps->npending);
    if (buf == NULL) {
        *size = need;
        return gvqSuccess;
    }
    if (*size < need) {
        GVQ_WARN("gvqPsSave: buffer of %zu bytes, %zu needed", *size, need);
        *size = need;
        return gvqInvalidArgument;
    }
    ps_save_hdr_t h = header_of(ps, need);
    size_t nbytes = ps->nlocal * ps->row_bytes;
    char *p = buf;
    put(&p, &h, sizeof h);
    put(&p, ps->values, nbytes);
    if (ps->rule_state != NULL) put(&p, ps->rule_state, nbytes);
    for (size_t i = 0; i < ps->npending; i++) {
        uint64_t slot = ps->pending_slots[i];
        put(&p, &slot, PENDING_SLOT_BYTES);
        put(&p, gvq_ps_row(ps, ps->grad_sum, slot), ps->row_bytes);
    }
    gvq_blob_seal(buf, need, CHECKSUM_AT);
    *size = need;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPsSave(gvqPs_t ps, void *buf, size_t *size) {
    if (!gvq_ps_live(ps) || size == NULL) {
        GVQ_WARN("gvqPsSave: %s", size == NULL ? "size is NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    gvq_stream_comm_settle(ps->comm); /* pushes and applies queued on the config's stream */
    gvq_ps_pin_t pin;                 /* the served mode's thread applies steps */
    GVQCHECK(gvq_ps_pin(ps, "gvqPsSave", &pin));
    gvqResult_t res = save_locked(ps, buf, size);
    gvq_ps_unpin(&pin);
    return res;
}

/* The saved header against this server: a saved state, of this size and checksum, shape,
 * config and rank. */
static gvqResult_t check_header(const char *fn, gvqPs_t ps, const ps_save_hdr_t *h, const void *buf,
                                size_t size) {
    if (h->magic != PS_SAVE_MAGIC) {
        GVQ_WARN("%s: magic 0x%016llx is not a saved parameter-server state of this version "
                 "(0x%016llx)",
                 fn, (unsigned long long)h->magic, (unsigned long long)PS_SAVE_MAGIC);
        return gvqInvalidArgument;
    }
    if (h->bytes != size) {
        GVQ_WARN("%s: the header's size %llu is not the %zu bytes given (truncated or extended)",
                 fn, (unsigned long long)h->bytes, size);
        return gvqInvalidArgument;
    }
    GVQCHECK(gvq_blob_verify(fn, buf, size, CHECKSUM_AT));
    if (h->rows != ps->rows || h->dim != ps->dim || h->dtype != (uint64_t)ps->dtype ||
        h->partitions != (uint64_t)ps->cfg.partitions ||
        h->partitioning != (uint64_t)ps->cfg.partitioning || h->rule != (uint64_t)ps->cfg.rule ||
        h->nranks != (uint64_t)ps->comm->nranks || h->rank != (uint64_t)ps->comm->rank ||
        h->nlocal != ps->nlocal) {
        GVQ_WARN("%s: the state was saved from another shape, config or rank (rows %llu dim %llu "
                 "partitions %llu rule %llu rank %llu of %llu)",
                 fn, (unsigned long long)h->rows, (unsigned long long)h->dim,
                 (unsigned long long)h->partitions, (unsigned long long)h->rule,
                 (unsigned long long)h->rank, (unsigned long long)h->nranks);
        return gvqInvalidArgument;
    }
    if (h->npending > ps->nlocal || save_size(ps, (size_t)h->npending) != size) {
        GVQ_WARN("%s: the saved state's pending rows (%llu) do not match its size", fn,
                 (unsigned long long)h->npending);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* Every saved pending entry names a slot of the shard, and no slot twice. */
static gvqResult_t check_pending(const char *fn, gvqPs_t ps, const char *entries, size_t n) {
    uint8_t *seen = calloc(GVQ_MAX(ps->nlocal, (size_t)1), 1);
    if (seen == NULL) return gvqSystemError;
    gvqResult_t res = gvqSuccess;
    for (size_t i = 0; i < n && res == gvqSuccess; i++) {
        uint64_t slot;
        memcpy(&slot, entries + i * pending_entry_bytes(ps), PENDING_SLOT_BYTES);
        if (slot >= ps->nlocal || seen[slot]) {
            GVQ_WARN("%s: pending row %zu names slot %llu, %s", fn, i, (unsigned long long)slot,
                     slot >= ps->nlocal ? "outside the shard" : "twice");
            res = gvqInvalidArgument;
        } else {
            seen[slot] = 1;
        }
    }
    free(seen);
    return res;
}

/* Adagrad's accumulators (sums of squares from a non-negative start) are not negative: a
 * negative one would make sqrt(a) NaN at the next apply. */
static gvqResult_t check_rule_state(const char *fn, gvqPs_t ps, const char *state) {
    if (ps->cfg.rule != gvqPsAdagrad) return gvqSuccess;
    size_t n = ps->nlocal * ps->dim;
    for (size_t i = 0; i < n; i++) {
        double a;
        if (ps->dtype == gvqFloat32) {
            float f;
            memcpy(&f, state + i * sizeof f, sizeof f);
            a = f;
        } else {
            memcpy(&a, state + i * sizeof a, sizeof a);
        }
        if (a < 0) {
            GVQ_WARN("%s: Adagrad accumulator %zu (slot %zu) is %g: negative", fn, i, i / ps->dim,
                     a);
            return gvqInvalidArgument;
        }
    }
    return gvqSuccess;
}

/* Copy n bytes from *p and move *p past them. */
static void take(const char **p, void *dst, size_t n) {
    memcpy(dst, *p, n);
    *p += n;
}

/* Replace the shard's values, rule state and pending sums by the checked saved ones. */
static void restore(gvqPs_t ps, const char *p, size_t npending) {
    size_t nbytes = ps->nlocal * ps->row_bytes;
    take(&p, ps->values, nbytes);
    if (ps->rule_state != NULL) take(&p, ps->rule_state, nbytes);
    for (size_t i = 0; i < ps->npending; i++)
        ps->is_pending[ps->pending_slots[i]] = 0;
    ps->npending = 0;
    for (size_t i = 0; i < npending; i++) {
        uint64_t slot;
        take(&p, &slot, PENDING_SLOT_BYTES);
        take(&p, gvq_ps_row(ps, ps->grad_sum, slot), ps->row_bytes);
        ps->is_pending[slot] = 1;
        ps->pending_slots[ps->npending++] = slot;
    }
}

GVQ_API gvqResult_t gvqPsLoad(gvqPs_t ps, const void *buf, size_t size) {
    const char *fn = "gvqPsLoad";
    if (!gvq_ps_live(ps) || buf == NULL) {
        GVQ_WARN("%s: %s", fn, buf == NULL ? "buf is NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    gvq_stream_comm_settle(ps->comm);
    ps_save_hdr_t h;
    if (size < sizeof h) {
        GVQ_WARN("%s: %zu bytes is too short for a saved parameter server", fn, size);
        return gvqInvalidArgument;
    }
    memcpy(&h, buf, sizeof h);
    GVQCHECK(check_header(fn, ps, &h, buf, size));
    const char *rows = (const char *)buf + sizeof h;
    if (ps->rule_state != NULL)
        GVQCHECK(check_rule_state(fn, ps, rows + ps->nlocal * ps->row_bytes));
    GVQCHECK(check_pending(fn, ps, rows + rows_bytes(ps), (size_t)h.npending));
    gvq_ps_pin_t pin;
    GVQCHECK(gvq_ps_pin(ps, fn, &pin));
    restore(ps, rows, (size_t)h.npending);
    gvq_ps_unpin(&pin);
    return gvqSuccess;
}

/* gvqPsSave / gvqPsLoad as gvq_blob_save_file and gvq_blob_load_file call them. */
static gvqResult_t save_to(void *ps, void *buf, size_t *size) {
    return gvqPsSave(ps, buf, size);
}
static gvqResult_t load_from(void *ps, const void *buf, size_t size) {
    return gvqPsLoad(ps, buf, size);
}

GVQ_API gvqResult_t gvqPsSaveFile(gvqPs_t ps, const char *path) {
    return gvq_blob_save_file("gvqPsSaveFile", path, save_to, ps);
}

GVQ_API gvqResult_t gvqPsLoadFile(gvqPs_t ps, const char *path) {
    return gvq_blob_load_file("gvqPsLoadFile", path, load_from, ps);
}
