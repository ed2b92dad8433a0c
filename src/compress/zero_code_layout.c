/*
 * zero_code_layout.c -- the layout of a flat gradient buffer (gvq_zero_code.h): the layers a
 * program gives gvqCommSetLayout, checked, or the text of gvqCommSetLayoutString / GVQ_LAYOUT
 * parsed into them.
 *
 *   buffer  [ conv 0 ][gap][ fc 1 ............ ][ other 2 ][gap]
 *           0                                                   count
 *
 * Rules: every layer's header comes from the GVQ_LAYER_* macros, conv dims K D H W >= 1, fc
 * dims out in >= 1 (the last two 0 or 1), a conv/fc count 0 or the product of its dims, an other
 * count >= 1, every layer inside [0, count), no two overlapping (checked in offset order).
 *
 * Text: "conv:OFFSET:KxDxHxW,fc:OFFSET:OUTxIN,other:OFFSET:COUNT,count:COUNT" -- entries split
 * at commas, fields at colons, dims at 'x'; decimal integers only.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq_zero_code.h"

const char *gvq_layer_kind_name(int kind) {
    switch (kind) {
    case gvqLayerConv:
        return "conv";
    case gvqLayerFc:
        return "fc";
    case gvqLayerOther:
        return "other";
    default:
        return "unknown";
    }
}

void gvq_layout_free(gvq_layout_t *layout) {
    free(layout->layers);
    free(layout->by_offset);
    memset(layout, 0, sizeof *layout);
}

/* ---- checks ---------------------------------------------------------------------------------- */

/* The layer's count from its dims (conv, fc) or its own (other); refuses bad dims. */
static gvqResult_t layer_count(const char *fn, int i, const gvqLayer_t *l, size_t *count) {
    int ndims = l->kind == gvqLayerConv ? 4 : 2;
    if (l->kind == gvqLayerOther) {
        if (l->count == 0) {
            GVQ_WARN("%s: layer %d (other at offset %zu) has count 0", fn, i, l->offset);
            return gvqInvalidArgument;
        }
        *count = l->count;
        return gvqSuccess;
    }
    uint64_t prod = 1;
    for (int d = 0; d < 4; d++) {
        int v = l->dims[d];
        if (d >= ndims ? (v != 0 && v != 1) : v < 1) {
            GVQ_WARN("%s: layer %d (%s at offset %zu) has dims[%d] = %d: %s", fn, i,
                     gvq_layer_kind_name(l->kind), l->offset, d, v,
                     d >= ndims ? "must be 0 or 1 for fc" : "must be >= 1");
            return gvqInvalidArgument;
        }
        if (d < ndims) prod *= (uint64_t)v; /* <= 2^40 x 2^31 before the check: no overflow */
        if (prod > ((uint64_t)1 << 40)) {
            GVQ_WARN("%s: layer %d (%s at offset %zu): dims product above 2^40", fn, i,
                     gvq_layer_kind_name(l->kind), l->offset);
            return gvqInvalidArgument;
        }
    }
    if (l->count != 0 && l->count != prod) {
        GVQ_WARN("%s: layer %d (%s at offset %zu) has count %zu but dims %dx%dx%dx%d make %llu", fn,
                 i, gvq_layer_kind_name(l->kind), l->offset, l->count, l->dims[0], l->dims[1],
                 l->dims[2], l->dims[3], (unsigned long long)prod);
        return gvqInvalidArgument;
    }
    *count = (size_t)prod;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqLayoutAppend(gvqLayer_t *layers, int capacity, int *nlayers, size_t *offset,
                                    int kind, const int *dims, size_t count) {
    const char *fn = "gvqLayoutAppend";
    if (layers == NULL || nlayers == NULL || offset == NULL) {
        GVQ_WARN("%s: layers %p, nlayers %p, offset %p: none may be NULL", fn, (void *)layers,
                 (void *)nlayers, (void *)offset);
        return gvqInvalidArgument;
    }
    if (*nlayers < 0 || *nlayers >= capacity) {
        GVQ_WARN("%s: no room for layer %d (capacity %d)", fn, *nlayers, capacity);
        return gvqInvalidArgument;
    }
    if (kind != gvqLayerConv && kind != gvqLayerFc && kind != gvqLayerOther) {
        GVQ_WARN("%s: layer %d: kind %d is not gvqLayerConv, gvqLayerFc or gvqLayerOther", fn,
                 *nlayers, kind);
        return gvqInvalidArgument;
    }
    if (kind != gvqLayerOther && dims == NULL) {
        GVQ_WARN("%s: layer %d (%s): dims is NULL", fn, *nlayers, gvq_layer_kind_name(kind));
        return gvqInvalidArgument;
    }
    gvqLayer_t l = GVQ_LAYER_OF(kind, *offset, kind == gvqLayerOther ? count : 0, 0, 0, 0, 0);
    for (int d = 0; kind != gvqLayerOther && d < (kind == gvqLayerConv ? 4 : 2); d++)
        l.dims[d] = dims[d];
    size_t n;
    GVQCHECK(layer_count(fn, *nlayers, &l, &n));
    if (n > SIZE_MAX - *offset) {
        GVQ_WARN("%s: layer %d ends past SIZE_MAX", fn, *nlayers);
        return gvqInvalidArgument;
    }
    layers[(*nlayers)++] = l;
    *offset += n;
    return gvqSuccess;
}

static gvqResult_t check_layer(const char *fn, int i, const gvqLayer_t *in, size_t count,
                               gvqLayer_t *out) {
    char what[32];
    snprintf(what, sizeof what, "layers[%d]", i);
    GVQCHECK(gvq_config_header_check(fn, what, in->size, in->magic, in->version, GVQ_LAYER_MAGIC,
                                     sizeof(gvqLayer_t), sizeof(gvqLayer_t),
                                     "GVQ_LAYER_CONV/FC/OTHER"));
    if (in->kind != gvqLayerConv && in->kind != gvqLayerFc && in->kind != gvqLayerOther) {
        GVQ_WARN("%s: layer %d has kind %d, not gvqLayerConv, gvqLayerFc or gvqLayerOther", fn, i,
                 in->kind);
        return gvqInvalidArgument;
    }
    *out = *in;
    GVQCHECK(layer_count(fn, i, in, &out->count));
    if (in->offset > count || out->count > count - in->offset) {
        GVQ_WARN("%s: layer %d (%s at offset %zu, %zu elements) ends past the buffer's count %zu",
                 fn, i, gvq_layer_kind_name(in->kind), in->offset, out->count, count);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* Sort indices by offset (insertion sort: no shared state, layouts are short). */
static void sort_by_offset(const gvqLayer_t *layers, int n, int *idx) {
    for (int i = 0; i < n; i++) {
        int v = idx[i] = i, j = i;
        while (j > 0 && layers[idx[j - 1]].offset > layers[v].offset) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

gvqResult_t gvq_layout_make(const char *fn, size_t count, const gvqLayer_t *layers, int nlayers,
                            gvq_layout_t *out) {
    memset(out, 0, sizeof *out);
    if (nlayers < 0 || (nlayers > 0 && layers == NULL)) {
        GVQ_WARN("%s: nlayers %d with layers %p", fn, nlayers, (const void *)layers);
        return gvqInvalidArgument;
    }
    if (nlayers > 0 && count == 0) {
        GVQ_WARN("%s: count 0 with %d layers", fn, nlayers);
        return gvqInvalidArgument;
    }
    gvq_layout_t l = {count, nlayers, NULL, NULL};
    if (nlayers == 0) {
        *out = l;
        return gvqSuccess;
    }
    l.layers = malloc(sizeof *l.layers * (size_t)nlayers);
    l.by_offset = malloc(sizeof *l.by_offset * (size_t)nlayers);
    gvqResult_t res = gvqSuccess;
    if (l.layers == NULL || l.by_offset == NULL) {
        res = gvqSystemError;
        goto err_free;
    }
    for (int i = 0; i < nlayers; i++)
        GVQCHECKGOTO(check_layer(fn, i, &layers[i], count, &l.layers[i]), res, err_free);
    sort_by_offset(l.layers, nlayers, l.by_offset);
    for (int k = 1; k < nlayers; k++) {
        const gvqLayer_t *a = &l.layers[l.by_offset[k - 1]], *b = &l.layers[l.by_offset[k]];
        if (a->offset + a->count > b->offset) {
            GVQ_WARN("%s: layer %d (%s at [%zu, %zu)) overlaps layer %d (%s at [%zu, %zu))", fn,
                     l.by_offset[k - 1], gvq_layer_kind_name(a->kind), a->offset,
                     a->offset + a->count, l.by_offset[k], gvq_layer_kind_name(b->kind), b->offset,
                     b->offset + b->count);
            res = gvqInvalidArgument;
            goto err_free;
        }
    }
    *out = l;
    return gvqSuccess;
err_free:
    gvq_layout_free(&l);
    return res;
}

uint64_t gvq_layout_hash(const gvq_layout_t *layout) {
    uint64_t h = 1469598103934665603ull;
    uint64_t words[8];
    size_t nw = 0;
#define MIX(v)                                         \
    do {                                               \
        uint64_t v_ = (uint64_t)(v);                   \
        for (int b_ = 0; b_ < 8; b_++, v_ >>= 8)       \
            h = (h ^ (v_ & 0xffu)) * 1099511628211ull; \
    } while (0)
    MIX(layout->count);
    MIX(layout->nlayers);
    for (int i = 0; i < layout->nlayers; i++) {
        const gvqLayer_t *l = &layout->layers[i];
        nw = 0;
        words[nw++] = (uint64_t)l->kind;
        words[nw++] = l->offset;
        words[nw++] = l->count;
        for (int d = 0; d < 4; d++)
            words[nw++] = (uint64_t)(uint32_t)l->dims[d];
        for (size_t w = 0; w < nw; w++)
            MIX(words[w]);
    }
#undef MIX
    return h;
}

/* ---- text ------------------------------------------------------------------------------------ */

/* A decimal integer in [lo, hi] filling s[0..n) exactly. */
static int parse_uint(const char *s, size_t n, uint64_t lo, uint64_t hi, uint64_t *v) {
    if (n == 0 || n > 20) return 0;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return 0;
        unsigned dgt = (unsigned)(s[i] - '0');
        if (x > (UINT64_MAX - dgt) / 10) return 0;
        x = x * 10 + dgt;
    }
    *v = x;
    return x >= lo && x <= hi;
}

/* "AxBx..." with exactly want positive ints. */
static int parse_dims(const char *s, size_t n, int want, int *dims) {
    int got = 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != 'x') continue;
        uint64_t v;
        if (got == want || !parse_uint(s + start, i - start, 1, INT_MAX, &v)) return 0;
        dims[got++] = (int)v;
        start = i + 1;
    }
    return got == want;
}

/* One entry s[0..n) (trimmed) into *l or *count_entry; 0 with *why set when malformed. */
static int parse_entry(const char *s, size_t n, gvqLayer_t *l, uint64_t *count_entry,
                       const char **why) {
    const char *c1 = memchr(s, ':', n);
    if (c1 == NULL) {
        *why = "expected KIND:OFFSET:SHAPE or count:COUNT";
        return 0;
    }
    size_t klen = (size_t)(c1 - s);
    const char *rest = c1 + 1;
    size_t rlen = n - klen - 1;
    if (klen == 5 && strncmp(s, "count", 5) == 0) {
        if (!parse_uint(rest, rlen, 1, (uint64_t)1 << 40, count_entry)) {
            *why = "count:COUNT needs an integer in [1, 2^40]";
            return 0;
        }
        return 1;
    }
    gvqLayer_t z = GVQ_LAYER_OTHER(0, 0);
    *l = z;
    if (klen == 4 && strncmp(s, "conv", 4) == 0)
        l->kind = gvqLayerConv;
    else if (klen == 2 && strncmp(s, "fc", 2) == 0)
        l->kind = gvqLayerFc;
    else if (klen == 5 && strncmp(s, "other", 5) == 0)
        l->kind = gvqLayerOther;
    else {
        *why = "the kind must be conv, fc, other or count";
        return 0;
    }
    const char *c2 = memchr(rest, ':', rlen);
    uint64_t off;
    if (c2 == NULL || !parse_uint(rest, (size_t)(c2 - rest), 0, (uint64_t)1 << 40, &off)) {
        *why = "expected KIND:OFFSET:SHAPE with OFFSET an integer in [0, 2^40]";
        return 0;
    }
    l->offset = (size_t)off;
    const char *shape = c2 + 1;
    size_t slen = rlen - (size_t)(shape - rest);
    if (l->kind == gvqLayerOther) {
        uint64_t cnt;
        if (!parse_uint(shape, slen, 1, (uint64_t)1 << 40, &cnt)) {
            *why = "other:OFFSET:COUNT needs COUNT an integer in [1, 2^40]";
            return 0;
        }
        l->count = (size_t)cnt;
        return 1;
    }
    int want = l->kind == gvqLayerConv ? 4 : 2;
    if (!parse_dims(shape, slen, want, l->dims)) {
        *why = want == 4 ? "conv:OFFSET:KxDxHxW needs four positive integers"
                         : "fc:OFFSET:OUTxIN needs two positive integers";
        return 0;
    }
    return 1;
}

gvqResult_t gvq_layout_parse(const char *fn, const char *text, gvq_layout_t *out) {
    memset(out, 0, sizeof *out);
    size_t len = text != NULL ? strlen(text) : 0, entries = 1;
    for (size_t i = 0; i < len; i++)
        entries += text[i] == ',';
    gvqLayer_t *layers = calloc(entries, sizeof *layers);
    if (layers == NULL) return gvqSystemError;
    int nlayers = 0, bad = 0, have_count = 0;
    char first_bad[160] = "";
    uint64_t count = 0, end = 0;
    size_t start = 0;
    for (size_t i = 0, e = 0; len > 0 && i <= len; i++) {
        if (i < len && text[i] != ',') continue;
        size_t a = start, b = i;
        start = i + 1;
        e++;
        while (a < b && isspace((unsigned char)text[a]))
            a++;
        while (b > a && isspace((unsigned char)text[b - 1]))
            b--;
        const char *why = NULL;
        uint64_t c = 0;
        gvqLayer_t *l = &layers[nlayers];
        if (a == b)
            why = "empty entry";
        else if (parse_entry(text + a, b - a, l, &c, &why)) {
            if (c != 0) {
                if (have_count) {
                    why = "a second count entry";
                } else {
                    have_count = 1;
                    count = c;
                }
            } else {
                uint64_t n = l->kind == gvqLayerOther ? l->count
                             : l->kind == gvqLayerFc
                                 ? (uint64_t)l->dims[0] * (uint64_t)l->dims[1]
                                 : (uint64_t)l->dims[0] * (uint64_t)l->dims[1] *
                                       (uint64_t)l->dims[2] * (uint64_t)l->dims[3];
                if (n > ((uint64_t)1 << 40)) {
                    why = "the layer has more than 2^40 elements";
                } else {
                    end = GVQ_MAX(end, (uint64_t)l->offset + n);
                    nlayers++;
                }
            }
        }
        if (why != NULL) {
            GVQ_WARN("%s: layout entry %zu '%.*s' is malformed: %s", fn, e, (int)GVQ_MIN(b - a, 80),
                     text + a, why);
            if (bad++ == 0)
                snprintf(first_bad, sizeof first_bad, "entry %zu '%.*s': %s", e,
                         (int)GVQ_MIN(b - a, 40), text + a, why);
        }
    }
    gvqResult_t res = gvqInvalidArgument;
    if (bad == 0 && have_count && nlayers == 0) {
        GVQ_WARN("%s: layout '%.80s' has a count but no layers", fn, text);
    } else if (bad == 0) {
        res = gvq_layout_make(fn, have_count ? (size_t)count : (size_t)end, layers, nlayers, out);
    } else {
        GVQ_WARN("%s: layout refused: %d malformed entr%s, the first %s", fn, bad,
                 bad == 1 ? "y" : "ies", first_bad);
    }
    free(layers);
    return res;
}
