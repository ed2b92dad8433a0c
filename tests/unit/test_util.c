/*
 * test_util.c -- result strings, tunables, and the fp16/bf16 conversions against an
 * independent reference (exhaustive over all 65536 half values through ldexp, and round-trips
 * of random floats checked for nearest-even rounding).
 */
#include <math.h>

#include "gvq_rng.h"
#include "gvq_test.h"

/* Reference half -> double from the IEEE definition. */
static double ref_half(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    double v;
    if (exp == 31)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(man, -24);
    else
        v = ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

static double ref_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    int sign = bits >> 31, exp = (bits >> 23) & 255, man = bits & 0x7fffff;
    double v;
    if (exp == 255)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(man, -149);
    else
        v = ldexp(0x800000 + man, exp - 150);
    return sign ? -v : v;
}

/* Nearest representable by brute force over all codes with the same sign, ties to even. */
static uint16_t ref_round(double x, double (*dec)(uint16_t), int is_half) {
    uint16_t best = 0;
    double bestd = INFINITY;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    int maxcode = is_half ? 0x7c00 : 0x7f80;
    for (int c = 0; c <= maxcode; c++) {
        double v = dec((uint16_t)(sign | c));
        double d = fabs(v - x);
        if (d < bestd || (d == bestd && (c & 1) == 0)) {
            bestd = d;
            best = (uint16_t)(sign | c);
        }
    }
    return best;
}

int main(void) {
    /* result strings: distinct and non-empty */
    for (int a = 0; a < gvqNumResults; a++) {
        const char *sa = gvqGetErrorString((gvqResult_t)a);
        EXPECT(sa != NULL && sa[0] != '\0', "result %d has no string", a);
        for (int b = 0; b < a; b++)
            EXPECT(strcmp(sa, gvqGetErrorString((gvqResult_t)b)) != 0,
                   "results %d and %d share '%s'", a, b, sa);
    }
    EXPECT(gvqGetErrorString((gvqResult_t)99) != NULL, "unknown code");
    int v = 0;
    EXPECT(gvqGetVersion(&v) == gvqSuccess && v == GVQ_VERSION, "version %d", v);
    EXPECT(gvqGetVersion(NULL) == gvqInvalidArgument, "NULL version accepted");
    EXPECT(strstr(gvqGetLastError(NULL), "version") != NULL, "last error '%s'",
           gvqGetLastError(NULL));

    /* tunables come from the environment, a bad value falls back to the default */
    setenv("GVQ_CHUNK_BYTES", "4096", 1);
    setenv("GVQ_SPIN_BEFORE_YIELD", "banana", 1);
    /* each kind: a name among the choices, a real, a negative integer, and refusals of each */
    setenv("GVQ_CODEC", "qsgd", 1);
    setenv("GVQ_GRADIVEQ_EPS", "0.125", 1);
    setenv("GVQ_GRADIVEQ_VOTE", "nan", 1);
    setenv("GVQ_GRADIVEQ_SAMPLE_SLICES", "-3", 1);
    setenv("GVQ_BOOTSTRAP_PORT", "-3", 1);
    EXPECT(gvq_param(GVQ_PARAM_CHUNK_BYTES) == 4096, "chunk %lld",
           (long long)gvq_param(GVQ_PARAM_CHUNK_BYTES));
    EXPECT(gvq_param(GVQ_PARAM_SPIN_BEFORE_YIELD) == 16, "spin %lld",
           (long long)gvq_param(GVQ_PARAM_SPIN_BEFORE_YIELD));
    EXPECT(gvq_param(GVQ_PARAM_TIMEOUT_MS) == 600000, "timeout default");
    EXPECT(gvq_param(GVQ_PARAM_CODEC) == gvqCodecQsgd, "codec %lld",
           (long long)gvq_param(GVQ_PARAM_CODEC));
    EXPECT(gvq_param_real(GVQ_PARAM_GRADIVEQ_EPS) == 0.125, "eps %g",
           gvq_param_real(GVQ_PARAM_GRADIVEQ_EPS));
    EXPECT(gvq_param_real(GVQ_PARAM_GRADIVEQ_VOTE) == -1, "vote %g",
           gvq_param_real(GVQ_PARAM_GRADIVEQ_VOTE));
    EXPECT(gvq_param(GVQ_PARAM_GRADIVEQ_SAMPLE_SLICES) == -3, "slices %lld",
           (long long)gvq_param(GVQ_PARAM_GRADIVEQ_SAMPLE_SLICES));
    EXPECT(gvq_param(GVQ_PARAM_BOOTSTRAP_PORT) == 0, "port %lld",
           (long long)gvq_param(GVQ_PARAM_BOOTSTRAP_PORT));

    /* every half and bf16 code decodes to the reference value */
    for (int c = 0; c < 65536; c++) {
        double want = ref_half((uint16_t)c), got = gvq_half_to_float((uint16_t)c);
        EXPECT((isnan(want) && isnan(got)) || want == got, "half 0x%04x: %g vs %g", c, got, want);
        want = ref_bf16((uint16_t)c);
        got = gvq_bf16_to_float((uint16_t)c);
        EXPECT((isnan(want) && isnan(got)) || want == got, "bf16 0x%04x: %g vs %g", c, got, want);
    }
    /* float -> half/bf16 rounds to nearest even: random floats across the ranges, halfway
     * points, subnormals and overflow */
    uint64_t s = 12345;
    for (int i = 0; i < 1000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double mag = ldexp((double)(s >> 11) / 9007199254740992.0 + 0.5, (int)((s >> 3) % 44) - 28);
        float x = (float)((s & 1) ? -mag : mag);
        uint16_t want = ref_round(x, ref_half, 1);
        if (fabs(x) >= 65520.0) want = (uint16_t)((x < 0 ? 0x8000 : 0) | 0x7c00);
        EXPECT(gvq_float_to_half(x) == want, "half(%.9g) = 0x%04x, want 0x%04x", x,
               gvq_float_to_half(x), want);
        float y = (float)((s & 2) ? -ldexp(mag, (int)((s >> 20) % 200) - 100)
                                  : ldexp(mag, (int)((s >> 20) % 200) - 100));
        uint16_t wb = ref_round(y, ref_bf16, 0);
        EXPECT(gvq_float_to_bf16(y) == wb, "bf16(%.9g) = 0x%04x, want 0x%04x", y,
               gvq_float_to_bf16(y), wb);
    }
    for (int c = 0; c < 0x7bff; c += 7) { /* exact halfway points between neighbours */
        double mid = (ref_half((uint16_t)c) + ref_half((uint16_t)(c + 1))) / 2;
        uint16_t want = (c & 1) ? (uint16_t)(c + 1) : (uint16_t)c;
        EXPECT(gvq_float_to_half((float)mid) == want, "tie %.9g -> 0x%04x want 0x%04x", mid,
               gvq_float_to_half((float)mid), want);
    }
    EXPECT(isnan(gvq_half_to_float(gvq_float_to_half(NAN))), "half nan");
    EXPECT(isnan(gvq_bf16_to_float(gvq_float_to_bf16(NAN))), "bf16 nan");
    EXPECT(gvq_float_to_half(1e6f) == 0x7c00, "overflow to inf");
    /* Philox4x32-10 known-answer vectors of Random123 (counter, key -> output) */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {~0u, ~0u, ~0u, ~0u, ~0u, ~0u, 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        gvq_philox4x32_10(kat[i], kat[i] + 4, out);
        EXPECT(memcmp(out, kat[i] + 6, sizeof out) == 0, "philox KAT %d: %08x %08x %08x %08x", i,
               out[0], out[1], out[2], out[3]);
    }
    return gvq_test_finish("test_util");
}
