/*
 * codec_kernels_dispatch.c -- which codec_kernels.c path this process runs (codec_kernels.h):
 * GVQ_SIMD, or the widest the CPU supports. Every path gives the same bits, so the choice
 * changes speed only.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "codec_kernels.h"
#include "gvq_util.h"

#if defined(GVQ_KERNELS_X86)
#include <cpuid.h>
#endif

static _Atomic(const gvq_kernels_t *) chosen;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

#if defined(GVQ_KERNELS_X86)
/* F16C and FMA, which both vector paths use, from CPUID leaf 1 (clang's __builtin_cpu_supports
 * does not know "f16c") */
static int cpu_f16c_fma(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    return (c & bit_F16C) != 0 && (c & bit_FMA) != 0;
}
#endif

static int cpu_has(const char *name) {
#if defined(GVQ_KERNELS_X86)
    __builtin_cpu_init();
    if (strcmp(name, "avx2") == 0) return __builtin_cpu_supports("avx2") && cpu_f16c_fma();
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               cpu_f16c_fma();
#endif
    return strcmp(name, "scalar") == 0;
}

const gvq_kernels_t *gvq_kernels_named(const char *name) {
    if (name == NULL || !cpu_has(name)) return NULL;
#if defined(GVQ_KERNELS_X86)
    if (strcmp(name, "avx512") == 0) return &gvq_kernels_avx512;
    if (strcmp(name, "avx2") == 0) return &gvq_kernels_avx2;
#endif
    return &gvq_kernels_scalar;
}

static void choose(void) {
    static const char *const names[] = {"auto", "scalar", "avx2", "avx512"};
    int64_t want = gvq_param(GVQ_PARAM_SIMD);
    const gvq_kernels_t *k = NULL;
    if (want > 0 && want < 4) {
        k = gvq_kernels_named(names[want]);
        if (k == NULL)
            GVQ_WARN("GVQ_SIMD=%s: this CPU or build does not run it; using the widest it has",
                     names[want]);
    }
    if (k == NULL) k = gvq_kernels_named("avx512");
    if (k == NULL) k = gvq_kernels_named("avx2");
    if (k == NULL) k = &gvq_kernels_scalar;
    const gvq_kernels_t *none = NULL;
    atomic_compare_exchange_strong(&chosen, &none, k); /* a gvq_kernels_force first wins */
    GVQ_INFO("codec kernels: %s", atomic_load(&chosen)->name);
}

const gvq_kernels_t *gvq_kernels(void) {
    const gvq_kernels_t *k = atomic_load_explicit(&chosen, memory_order_acquire);
    if (k != NULL) return k;
    pthread_once(&chosen_once, choose);
    return atomic_load(&chosen);
}

int gvq_kernels_force(const char *name) {
    const gvq_kernels_t *k = gvq_kernels_named(name);
    if (k == NULL) return -1;
    atomic_store(&chosen, k);
    return 0;
}
