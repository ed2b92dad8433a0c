/*
 * test_saved_state.c -- a saved compressor or parameter-server state is outside input: every
 * corruption of it is refused, and a refusal changes nothing.
 *
 * Subjects, each saved from a real handle on one in-process rank:
 *   gq        GradiVeQ with error feedback after its fit (compressed phase, d > 0)
 *   gq-sample GradiVeQ with a warm-up, in the middle of sampling
 *   qsgd      QSGD with error feedback
 *   powersgd  PowerSGD with error feedback (the warm-start Q and the residual)
 *   ps-adagrad / ps-momentum   parameter servers with pending gradient sums
 * Corruptions of each saved state:
 *   header fields   every field set to values out of range or inconsistent with the handle,
 *                   once as is (the checksum catches it) and once with the checksum recomputed
 *                   (a forged file: the field check must catch it, with a WARN naming the field)
 *   payload         one flipped bit at every byte; NaN / Inf / negative values with the checksum
 *                   recomputed
 *   length          truncated to every shorter length, extended by 1, 7 and 64 bytes, extended
 *                   with the header's size field and checksum made to match
 * After each: gvqInvalidArgument (never success, never a crash: the ASan/UBSan runs of the unit
 * tests cover over-reads), and the handle saves exactly the bytes it saved before. At the end
 * the handle loads its real state and keeps working exactly like a twin loaded from it.
 */
#include <math.h>
#include <stddef.h>

#include "gvq_compressor.h"
#include "gvq_test.h"

/* The compressor's header as compressor_save.c lays it out (the checksum last). */
typedef struct {
    uint64_t magic, bytes;
    gvq_comp_cfg_t cfg;
    gvq_comp_state_t st;
    uint64_t ngroups, checksum;
} comp_hdr_t;
#define COMP_CK offsetof(comp_hdr_t, checksum)
#define H(f) offsetof(comp_hdr_t, f)

/* The parameter server's: 13 words, the checksum last. */
#define PS_WORDS 13
#define PS_CK (12 * 8)

/* A handle under test and the state it saved. */
typedef struct {
    const char *name;
    int is_ps;
    gvqCompressor_t c;
    gvqPs_t ps;
    char *orig;
    size_t n;
    size_t ck_at; /* where the checksum lives */
    int cases;    /* loads tried */
} subject_t;

static gvqResult_t load(subject_t *s, const void *buf, size_t n) {
    return s->is_ps ? gvqPsLoad(s->ps, buf, n) : gvqCompressorLoad(s->c, buf, n);
}

static char *save(subject_t *s, size_t *n) {
    *n = 0;
    gvqResult_t r = s->is_ps ? gvqPsSave(s->ps, NULL, n) : gvqCompressorSave(s->c, NULL, n);
    char *buf = malloc(*n ? *n : 1);
    if (r == gvqSuccess) r = s->is_ps ? gvqPsSave(s->ps, buf, n) : gvqCompressorSave(s->c, buf, n);
    EXPECT(r == gvqSuccess, "%s: save failed: %s", s->name, gvqGetErrorString(r));
    return buf;
}

/* Load buf (n bytes): refused with gvqInvalidArgument, a WARN holding `warn` (NULL: any), and
 * the handle unchanged. */
static void expect_refused(subject_t *s, const char *buf, size_t n, const char *what,
                           const char *warn) {
    s->cases++;
    gvqResult_t r = load(s, buf, n);
    const char *text = gvqGetLastError(NULL);
    EXPECT(r == gvqInvalidArgument, "%s, %s: load returned %s (WARN: %s)", s->name, what,
           gvqGetErrorString(r), text);
    if (r == gvqInvalidArgument && warn != NULL)
        EXPECT(strstr(text, warn) != NULL, "%s, %s: WARN should name '%s': %s", s->name, what, warn,
               text);
    size_t m;
    char *now = save(s, &m);
    EXPECT(m == s->n && memcmp(now, s->orig, m) == 0, "%s, %s: a refused load changed the state",
           s->name, what);
    free(now);
    if (r == gvqSuccess) load(s, s->orig, s->n); /* back to the real state for the next case */
}

/* The saved state with `width` bytes at `off` set to the low bytes of v, then loaded twice: as
 * is, and with the checksum recomputed (a forged file). */
static void try_field(subject_t *s, const char *what, size_t off, size_t width, int64_t v,
                      const char *warn) {
    char *b = malloc(s->n);
    memcpy(b, s->orig, s->n);
    if (width == 4) {
        int32_t v32 = (int32_t)v;
        memcpy(b + off, &v32, 4);
    } else {
        memcpy(b + off, &v, 8);
    }
    if (memcmp(b, s->orig, s->n) == 0) { /* not a change: the test's own mistake */
        EXPECT(0, "%s, %s: the edit changes nothing", s->name, what);
        free(b);
        return;
    }
    char label[160];
    snprintf(label, sizeof label, "%s (checksum as saved)", what);
    expect_refused(s, b, s->n, label, NULL);
    gvq_blob_seal(b, s->n, s->ck_at);
    snprintf(label, sizeof label, "%s (checksum recomputed)", what);
    expect_refused(s, b, s->n, label, warn);
    free(b);
}

static void try_double(subject_t *s, const char *what, size_t off, double v, const char *warn) {
    int64_t bits;
    memcpy(&bits, &v, 8);
    try_field(s, what, off, 8, bits, warn);
}

static void try_float(subject_t *s, const char *what, size_t off, float v, const char *warn) {
    int32_t bits;
    memcpy(&bits, &v, 4);
    try_field(s, what, off, 4, bits, warn);
}

/* What every state must survive: flipped bits, truncation, extension, a bad checksum. */
static void try_bytes(subject_t *s) {
    char *b = malloc(s->n + 64);
    char label[96];
    for (size_t i = 0; i < s->n; i++) {
        memcpy(b, s->orig, s->n);
        b[i] ^= (char)(1u << (i % 8));
        snprintf(label, sizeof label, "bit %zu of byte %zu flipped", i % 8, i);
        expect_refused(s, b, s->n, label, i < 16 ? NULL : "checksum");
    }
    memcpy(b, s->orig, s->n);
    for (size_t len = 0; len < s->n; len++) {
        snprintf(label, sizeof label, "truncated to %zu bytes", len);
        expect_refused(s, b, len, label, NULL);
    }
    memset(b + s->n, 0, 64);
    size_t ext[] = {1, 7, 64};
    for (size_t k = 0; k < 3; k++) {
        snprintf(label, sizeof label, "extended by %zu bytes", ext[k]);
        expect_refused(s, b, s->n + ext[k], label, "size");
    }
    uint64_t bigger = s->n + 8; /* the header says so too, checksum recomputed */
    memcpy(b + 8, &bigger, 8);
    gvq_blob_seal(b, s->n + 8, s->ck_at);
    expect_refused(s, b, s->n + 8, "extended by 8 bytes, size and checksum to match", NULL);
    memcpy(b, s->orig, s->n);
    b[s->ck_at] ^= 0x10;
    expect_refused(s, b, s->n, "checksum edited", "checksum");
    free(b);
}

/* ---- compressors ----------------------------------------------------------------------------- */

#define SL 16

static float grad(int t, size_t i) {
    double ph = 6.283185307179586 * (double)(i % SL) / SL, s = (double)(i / SL);
    return (float)(sin(0.7 * t + s) * cos(ph) + cos(1.3 * t + 0.5 * s) * sin(ph) +
                   0.01 * sin(3.1 * (double)i + t));
}

static gvqResult_t step(gvqCompressor_t c, gvqComm_t comm, size_t count, int t, float *y) {
    float *x = malloc(sizeof(float) * count);
    for (size_t i = 0; i < count; i++)
        x[i] = grad(t, i);
    gvqResult_t r = gvqAllReduceCompressed(x, y, count, gvqFloat32, gvqSum, c, comm, NULL);
    free(x);
    return r;
}

/* The fields of a compressor's header, to out-of-range and inconsistent values. */
static void try_comp_header(subject_t *s, const comp_hdr_t *h) {
    const gvq_comp_cfg_t *cfg = &h->cfg;
    const gvq_comp_state_t *st = &h->st;
    int scheduled = cfg->codec == gvqCodecGradiveq;
    try_field(s, "magic of version 3", H(magic), 8, 0x33524d4351564721ll, "magic");
    try_field(s, "magic 0", H(magic), 8, 0, "magic");
    try_field(s, "bytes - 1", H(bytes), 8, (int64_t)h->bytes - 1, "size");
    try_field(s, "bytes 2^63", H(bytes), 8, INT64_MIN, "size");
    for (size_t w = 0; w < sizeof(gvq_comp_cfg_t) / 4; w++) {
        char what[64];
        int32_t v;
        memcpy(&v, (const char *)cfg + 4 * w, 4);
        if (w == offsetof(gvq_comp_cfg_t, seed) / 4) { /* the seed: a state loads whatever it */
            char *b = malloc(s->n);                    /* was (it draws the calls to come) */
            memcpy(b, s->orig, s->n);
            int32_t other = v ^ 1;
            memcpy(b + H(cfg) + 4 * w, &other, 4);
            gvq_blob_seal(b, s->n, s->ck_at);
            s->cases++;
            gvqResult_t r = load(s, b, s->n);
            EXPECT(r == gvqSuccess, "%s: a state saved with another seed was refused: %s", s->name,
                   gvqGetLastError(NULL));
            size_t m;
            char *now = save(s, &m);
            EXPECT(m == s->n && memcmp(now, s->orig, m) == 0,
                   "%s: loading a state of another seed changed the compressor's own seed",
                   s->name);
            free(now);
            free(b);
            load(s, s->orig, s->n);
            continue;
        }
        snprintf(what, sizeof what, "config word %zu xor 1", w);
        try_field(s, what, H(cfg) + 4 * w, 4, v ^ 1, "config");
        snprintf(what, sizeof what, "config word %zu = INT32_MIN", w);
        if (v != INT32_MIN) try_field(s, what, H(cfg) + 4 * w, 4, INT32_MIN, "config");
    }
    try_field(s, "ngroups + 1", H(ngroups), 8, (int64_t)h->ngroups + 1, "ngroups");
    try_field(s, "ngroups 2^62", H(ngroups), 8, (int64_t)1 << 62, "ngroups");
    try_field(s, "phase -1", H(st.phase), 4, -1, "phase");
    try_field(s, "phase 4", H(st.phase), 4, 4, "phase");
    try_field(s, "phase INT32_MAX", H(st.phase), 4, INT32_MAX, "phase");
    try_field(s, "d -1", H(st.d), 4, -1, ": d ");
    try_field(s, "d INT32_MIN", H(st.d), 4, INT32_MIN, ": d ");
    try_field(s, "d maxDims + 1", H(st.d), 4, cfg->dmax + 1, ": d ");
    try_field(s, "d INT32_MAX", H(st.d), 4, INT32_MAX, ": d ");
    try_field(s, "iteration -1", H(st.iter), 8, -1, "iteration");
    try_field(s, "phaseIter -1", H(st.phase_iter), 8, -1, "phaseIter");
    try_field(s, "phaseIter > iteration", H(st.phase_iter), 8, st->iter + 1, "phaseIter");
    try_field(s, "nsamples -1", H(st.nsamples), 8, -1, "nsamples");
    try_field(s, "nsamples T + 1", H(st.nsamples), 8, cfg->sample + 1, "nsamples");
    try_field(s, "nsamples INT64_MAX", H(st.nsamples), 8, INT64_MAX, "nsamples");
    try_field(s, "stats.codec + 1", H(st.stats.codec), 4, st->stats.codec + 1, "stats.codec");
    try_field(s, "stats.sliceSize + 1", H(st.stats.sliceSize), 4, st->stats.sliceSize + 1,
              "stats.codec");
    try_field(s, "stats.groups - 1", H(st.stats.groups), 4, st->stats.groups - 1, "stats.codec");
    try_field(s, "stats.fits -1", H(st.stats.fits), 8, -1, "stats.fits");
    try_field(s, "stats.earlyExits -1", H(st.stats.earlyExits), 8, -1, "stats.fits");
    try_double(s, "stats.ratio -1", H(st.stats.ratio), -1.0, "stats.ratio");
    {
        char *b = malloc(s->n);
        memcpy(b, s->orig, s->n);
        memset(b + H(st.stats.reason), 'x', sizeof st->stats.reason);
        gvq_blob_seal(b, s->n, s->ck_at);
        expect_refused(s, b, s->n, "stats.reason without a NUL", "stats.reason");
        free(b);
    }
    if (scheduled) {
        try_field(s, "phase plain", H(st.phase), 4, gvqPhasePlain, "phase plain");
        if (st->phase != gvqPhaseCompressed) {
            try_field(s, "phase compressed with d 0", H(st.phase), 4, gvqPhaseCompressed,
                      "phase compressed");
            try_field(s, "nsamples T in the sample phase", H(st.nsamples), 8, cfg->sample,
                      "phase sample");
        } else {
            try_field(s, "compressed with d 0", H(st.d), 4, 0, "phase compressed");
            try_field(s, "phaseIter compressedIters", H(st.phase_iter), 8, cfg->compressed,
                      "phaseIter");
            try_field(s, "phase warm-up without warmupIters", H(st.phase), 4, gvqPhaseWarmup,
                      "phase warm-up");
            try_field(s, "d + 1 (size does not follow)", H(st.d), 4, st->d + 1, "with d");
            try_field(s, "d - 1 (size does not follow)", H(st.d), 4, st->d - 1, "with d");
        }
    } else {
        for (int p = gvqPhaseWarmup; p <= gvqPhaseCompressed; p++)
            try_field(s, "a GradiVeQ phase", H(st.phase), 4, p, "phase");
        try_field(s, "d 1 without GradiVeQ", H(st.d), 4, 1, ": d ");
        try_field(s, "nsamples 1 without GradiVeQ", H(st.nsamples), 8, 1, "nsamples");
    }
}

/* Non-finite values in the basis, residual and Q (checksum recomputed). */
static void try_comp_payload(subject_t *s, const comp_hdr_t *h, size_t count, size_t qlen) {
    size_t L = (size_t)h->cfg.L, G = h->ngroups, d = (size_t)h->st.d;
    size_t samples = h->cfg.codec == gvqCodecGradiveq
                         ? G * (size_t)h->cfg.sample * (size_t)h->cfg.sample_slices * L
                         : 0;
    size_t at = sizeof(comp_hdr_t) + 4 * samples;
    if (d > 0) {
        try_float(s, "U[0] NaN", at, NAN, "U[");
        try_float(s, "U[last] Inf", at + 4 * (G * L * d - 1), INFINITY, "U[");
        try_float(s, "Z[0] -Inf", at + 4 * G * L * d, -INFINITY, "Z[");
        at += 4 * (G * L * d + G * L);
    }
    if (h->cfg.error_feedback) {
        try_float(s, "residual[1] NaN", at + 4, NAN, "residual[");
        at += 4 * count;
    }
    if (qlen > 0) try_float(s, "Q[0] Inf", at, INFINITY, "Q[");
    EXPECT(at + 4 * qlen == s->n, "%s: the test's layout (%zu bytes) is not the saved one (%zu)",
           s->name, at + 4 * qlen, s->n);
}

typedef struct {
    const char *name;
    size_t count;
    int codec, warmup, calls;
    size_t qlen; /* PowerSGD's m x r */
} comp_case_t;

static gvqCompressorConfig_t comp_cfg(const comp_case_t *k) {
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = k->codec;
    cfg.errorFeedback = 1;
    if (k->codec == gvqCodecGradiveq) {
        cfg.sliceSize = SL;
        cfg.warmupIters = k->warmup;
        cfg.sampleIters = 4;
        cfg.compressedIters = 50;
        cfg.voteThreshold = 1; /* no early exit: the state stays compressed */
    }
    if (k->codec == gvqCodecPowersgd) cfg.powerRank = 2;
    return cfg;
}

static void test_compressor_case(gvqComm_t comm, const comp_case_t *k) {
    gvqCompressorConfig_t cfg = comp_cfg(k);
    subject_t s = {.name = k->name, .ck_at = COMP_CK};
    gvqCompressor_t twin = NULL;
    EXPECT_RES(gvqCompressorCreate(comm, k->count, &cfg, &s.c), gvqSuccess);
    EXPECT_RES(gvqCompressorCreate(comm, k->count, &cfg, &twin), gvqSuccess);
    if (s.c == NULL || twin == NULL) return;
    float *y = malloc(sizeof(float) * k->count), *z = malloc(sizeof(float) * k->count);
    for (int t = 0; t < k->calls; t++)
        EXPECT_RES(step(s.c, comm, k->count, t, y), gvqSuccess);
    s.orig = save(&s, &s.n);
    comp_hdr_t h;
    EXPECT(s.n >= sizeof h, "%s: saved %zu bytes", k->name, s.n);
    memcpy(&h, s.orig, sizeof h);
    if (k->codec == gvqCodecGradiveq && k->warmup == 0)
        EXPECT(h.st.phase == gvqPhaseCompressed && h.st.d > 0, "%s: phase %d d %d, not fitted",
               k->name, h.st.phase, h.st.d);
    try_comp_header(&s, &h);
    try_comp_payload(&s, &h, k->count, k->qlen);
    try_bytes(&s);
    /* still working: the real state loads, and the handle continues exactly as a twin */
    EXPECT_RES(gvqCompressorLoad(s.c, s.orig, s.n), gvqSuccess);
    EXPECT_RES(gvqCompressorLoad(twin, s.orig, s.n), gvqSuccess);
    for (int t = k->calls; t < k->calls + 3; t++) {
        EXPECT_RES(step(s.c, comm, k->count, t, y), gvqSuccess);
        EXPECT_RES(step(twin, comm, k->count, t, z), gvqSuccess);
        int finite = 1;
        for (size_t i = 0; i < k->count; i++)
            finite &= isfinite(y[i]) != 0;
        EXPECT(finite && memcmp(y, z, sizeof(float) * k->count) == 0,
               "%s: call %d after the refused loads differs from the twin's (or is not finite)",
               k->name, t);
    }
    printf("%s: %d corrupted states refused\n", k->name, s.cases);
    free(y), free(z), free(s.orig);
    gvqCompressorDestroy(s.c);
    gvqCompressorDestroy(twin);
}

/* ---- parameter servers ----------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int rule, dtype, partitions;
    size_t rows, dim;
} ps_case_t;

static gvqPs_t make_ps(gvqComm_t comm, const ps_case_t *k) {
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.rule = k->rule;
    cfg.partitions = k->partitions;
    cfg.partitioning = gvqPsContiguous;
    cfg.init = gvqPsInitUniform;
    cfg.seed = 7;
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, k->rows, k->dim, k->dtype, &cfg, &ps), gvqSuccess);
    return ps;
}

/* Push rows idx (gradient values from t), in the server's type. */
static gvqResult_t ps_push(gvqPs_t ps, const ps_case_t *k, const int64_t *idx, size_t n, int t) {
    double g[64];
    float gf[64];
    for (size_t i = 0; i < n * k->dim; i++)
        g[i] = sin(0.9 * (double)i + t), gf[i] = (float)g[i];
    return gvqPsPush(ps, idx, k->dtype == gvqFloat32 ? (const void *)gf : (const void *)g, n);
}

static void try_ps_fields(subject_t *s, const ps_case_t *k) {
    static const char *const names[12] = {"magic",  "bytes",      "rows",         "dim",
                                          "dtype",  "partitions", "partitioning", "rule",
                                          "nranks", "rank",       "nlocal",       "npending"};
    static const char *const warns[12] = {"magic",         "size",          "another shape",
                                          "another shape", "another shape", "another shape",
                                          "another shape", "another shape", "another shape",
                                          "another shape", "another shape", "pending"};
    uint64_t w[PS_WORDS];
    memcpy(w, s->orig, sizeof w);
    for (int i = 0; i < 12; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s + 1", names[i]);
        try_field(s, what, 8 * (size_t)i, 8, (int64_t)(w[i] + 1), warns[i]);
        snprintf(what, sizeof what, "%s all ones", names[i]);
        try_field(s, what, 8 * (size_t)i, 8, -1, warns[i]);
        snprintf(what, sizeof what, "%s 2^40", names[i]);
        try_field(s, what, 8 * (size_t)i, 8, (int64_t)1 << 40, warns[i]);
    }
    size_t esize = k->dtype == gvqFloat32 ? 4 : 8, row = k->dim * esize, nlocal = w[10];
    size_t rows_bytes = nlocal * row * (k->rule == gvqPsSgd ? 1 : 2);
    size_t pend = PS_WORDS * 8 + rows_bytes, entry = 8 + row;
    EXPECT(w[11] >= 2 && pend + w[11] * entry == s->n,
           "%s: layout or pending rows (%llu) not as "
           "the test expects",
           s->name, (unsigned long long)w[11]);
    try_field(s, "pending slot = nlocal", pend, 8, (int64_t)nlocal, "outside the shard");
    try_field(s, "pending slot 2^63", pend, 8, INT64_MIN, "outside the shard");
    uint64_t first;
    memcpy(&first, s->orig + pend, 8);
    try_field(s, "pending slot named twice", pend + entry, 8, (int64_t)first, "twice");
    if (k->rule == gvqPsAdagrad) {
        size_t acc = PS_WORDS * 8 + nlocal * row + esize; /* the accumulator of element 1 */
        if (esize == 4)
            try_float(s, "Adagrad accumulator -1", acc, -1.0f, "accumulator");
        else
            try_double(s, "Adagrad accumulator -1", acc, -1.0, "accumulator");
    }
}

static void test_ps_case(gvqComm_t comm, const ps_case_t *k) {
    subject_t s = {.name = k->name, .is_ps = 1, .ck_at = PS_CK};
    s.ps = make_ps(comm, k);
    gvqPs_t twin = make_ps(comm, k);
    if (s.ps == NULL || twin == NULL) return;
    int64_t a[3] = {1, 4, 7}, b[2] = {2, 4};
    EXPECT_RES(ps_push(s.ps, k, a, 3, 0), gvqSuccess);
    EXPECT_RES(gvqPsApply(s.ps), gvqSuccess);
    EXPECT_RES(ps_push(s.ps, k, b, 2, 1), gvqSuccess); /* pending sums travel with the state */
    s.orig = save(&s, &s.n);
    try_ps_fields(&s, k);
    try_bytes(&s);
    /* still working: the real state loads, and the server continues exactly as a twin */
    EXPECT_RES(gvqPsLoad(s.ps, s.orig, s.n), gvqSuccess);
    EXPECT_RES(gvqPsLoad(twin, s.orig, s.n), gvqSuccess);
    size_t nv = k->rows * k->dim * 8;
    char *v1 = malloc(nv), *v2 = malloc(nv);
    int64_t all[16];
    for (size_t i = 0; i < k->rows; i++)
        all[i] = (int64_t)i;
    gvqPs_t both[2] = {s.ps, twin};
    char *out[2] = {v1, v2};
    for (int j = 0; j < 2; j++) {
        EXPECT_RES(gvqPsApply(both[j]), gvqSuccess);
        EXPECT_RES(ps_push(both[j], k, a, 3, 2), gvqSuccess);
        EXPECT_RES(gvqPsApply(both[j]), gvqSuccess);
        EXPECT_RES(gvqPsPull(both[j], all, out[j], k->rows), gvqSuccess);
    }
    EXPECT(memcmp(v1, v2, k->rows * k->dim * (k->dtype == gvqFloat32 ? 4 : 8)) == 0,
           "%s: the server after the refused loads differs from its twin", k->name);
    printf("%s: %d corrupted states refused\n", k->name, s.cases);
    free(v1), free(v2), free(s.orig);
    gvqPsDestroy(s.ps);
    gvqPsDestroy(twin);
}

static void run_all(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)rank, (void)nranks, (void)arg;
    static const comp_case_t comps[] = {
        {"gq", SL * 8, gvqCodecGradiveq, 0, 6, 0},
        {"gq-sample", SL * 8 + 5, gvqCodecGradiveq, 2, 4, 0},
        {"qsgd", 100, gvqCodecQsgd, 0, 3, 0},
        {"powersgd", 96, gvqCodecPowersgd, 0, 3, 10 * 2}, /* 10 x 10, rank 2 */
    };
    for (size_t i = 0; i < sizeof comps / sizeof *comps; i++)
        test_compressor_case(comm, &comps[i]);
    static const ps_case_t pss[] = {
        {"ps-adagrad", gvqPsAdagrad, gvqFloat32, 1, 10, 3},
        {"ps-momentum", gvqPsMomentum, gvqFloat64, 3, 9, 2},
    };
    for (size_t i = 0; i < sizeof pss / sizeof *pss; i++)
        test_ps_case(comm, &pss[i]);
}

int main(void) {
    /* thousands of refusals, each with its WARN: the checks read them through gvqGetLastError */
    setenv("GVQ_DEBUG", "NONE", 1);
    gvq_test_run(1, NULL, run_all, NULL);
    return gvq_test_finish("test_saved_state");
}
