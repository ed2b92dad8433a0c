/*
 * methods.c -- the registry of compression methods (gvq_method.h): one line per method. A
 * config is served by the first method here whose serves() takes it; the fused calls of a set
 * run in this order.
 */
#include "gvq_method.h"

/* each method's table, defined in its file of methods/ */
extern const gvq_method_t gvq_method_plain, gvq_method_gradiveq, gvq_method_gradiveq_track,
    gvq_method_powersgd, gvq_method_qsgd;

const gvq_method_t *const gvq_methods[] = {
    &gvq_method_plain,          /* codec none */
    &gvq_method_gradiveq,       /* a basis fitted in sampling phases */
    &gvq_method_gradiveq_track, /* a basis tracked on every call */
    &gvq_method_powersgd,       &gvq_method_qsgd, NULL,
};

const gvq_method_t *gvq_method_of(const gvq_comp_cfg_t *cfg) {
    for (size_t i = 0; gvq_methods[i] != NULL; i++)
        if (gvq_methods[i]->serves(cfg)) return gvq_methods[i];
    return &gvq_method_plain; /* not reached: the config was resolved */
}
