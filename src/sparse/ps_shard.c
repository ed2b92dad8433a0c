/*
 * ps_shard.c -- what every parameter-server path does to this rank's shards (gvq_ps.h): check a
 * received block of indices, add rows to the pending sums, run the rule on the pending slots;
 * and the sorted-index helpers of the pulls.
 * The synchronous calls (ps_push.c, ps_pull.c) and the served mode's thread (ps_serve.c) share
 * them, so both sum and update alike.
 */
#include "gvq_ps.h"

size_t gvq_ps_check_block(gvqPs_t ps, const int64_t *idx, size_t n, int owner_check) {
    size_t bad =
        GVQ_MIN(gvq_sparse_find_out_of_range(idx, n, ps->rows), gvq_sparse_find_unsorted(idx, n));
    if (owner_check)
        for (size_t i = 0; i < bad; i++) {
            int rank;
            uint64_t slot;
            gvq_part_locate(&ps->map, (uint64_t)idx[i], &rank, &slot);
            if (rank != ps->comm->rank) return i;
        }
    return bad;
}

gvqResult_t gvq_ps_add_pending(gvqPs_t ps, const int64_t *idx, const char *vals, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int rank;
        uint64_t slot;
        gvq_part_locate(&ps->map, (uint64_t)idx[i], &rank, &slot);
        char *sum = gvq_ps_row(ps, ps->grad_sum, slot);
        const char *row = vals + i * ps->row_bytes;
        if (!ps->is_pending[slot]) {
            ps->is_pending[slot] = 1;
            ps->pending_slots[ps->npending++] = slot;
            memcpy(sum, row, ps->row_bytes);
        } else {
            GVQCHECK(ps->comm->dev->reduce(sum, sum, row, ps->dim, ps->dtype, gvqSum));
        }
    }
    return gvqSuccess;
}

void gvq_ps_apply_pending(gvqPs_t ps, double gscale) {
    gvq_rule_t rule = {ps->cfg.rule, ps->cfg.lr, ps->cfg.momentum, ps->cfg.eps, gscale};
    for (size_t i = 0; i < ps->npending; i++) {
        uint64_t slot = ps->pending_slots[i];
        char *state = ps->rule_state != NULL ? gvq_ps_row(ps, ps->rule_state, slot) : NULL;
        gvq_rule_apply(&rule, ps->dtype, ps->dim, gvq_ps_row(ps, ps->values, slot), state,
                       gvq_ps_row(ps, ps->grad_sum, slot));
        ps->is_pending[slot] = 0;
    }
    ps->npending = 0;
}

int gvq_ps_i64_cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

size_t gvq_ps_find_sorted(const int64_t *sorted, size_t n, int64_t v) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (sorted[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
