/*
 * param.c -- the tunables of GVQ_PARAM_LIST (gvq_util.h), read once from the environment.
 * A value that does not parse as its kind is reported at WARN and the default used.
 */
#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "gvq_util.h"

typedef struct {
    const char *env;
    gvq_param_kind_t kind;
    double def;
    const char *choices; /* CHOICE: "a,b,c" */
    const char *help;
} param_desc_t;

static const param_desc_t param_desc[GVQ_PARAM_COUNT] = {
#define GVQ_PARAM_DESC(id, env, kind, def, choices, help) \
    [GVQ_PARAM_##id] = {env, GVQ_PARAM_##kind, def, choices, help},
    GVQ_PARAM_LIST(GVQ_PARAM_DESC)
#undef GVQ_PARAM_DESC
};

static double param_value[GVQ_PARAM_COUNT];
static const char *param_text[GVQ_PARAM_COUNT]; /* TEXT: the environment's string */
static int param_from_env[GVQ_PARAM_COUNT];
static const char *param_rejected[GVQ_PARAM_COUNT]; /* a value that did not parse, or NULL */
static pthread_once_t param_once = PTHREAD_ONCE_INIT;
static int param_ready; /* param_init has run (release) */

/* The index of `s` among the comma-separated names of `choices` (case does not matter:
 * GVQ_CODEC=QSGD is qsgd), or -1. */
static int choice_index(const char *choices, const char *s) {
    size_t len = strlen(s);
    int i = 0;
    for (const char *p = choices; *p != '\0'; i++) {
        const char *end = strchr(p, ',');
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        if (n == len && strncasecmp(p, s, n) == 0) return i;
        p += n + (end != NULL);
    }
    return -1;
}

/* The name of choice i of `choices` into out. */
static void choice_name(const char *choices, int i, char *out, size_t size) {
    const char *p = choices;
    for (int k = 0; k < i && p != NULL; k++)
        if ((p = strchr(p, ',')) != NULL) p++;
    size_t n = p == NULL ? 0 : strchr(p, ',') != NULL ? (size_t)(strchr(p, ',') - p) : strlen(p);
    snprintf(out, size, "%.*s", (int)n, p != NULL ? p : "");
}

/* Parse s as d's kind into *v; 0 when it does not parse. */
static int parse_value(const param_desc_t *d, const char *s, double *v) {
    char *end = NULL;
    errno = 0;
    if (d->kind == GVQ_PARAM_CHOICE) {
        int i = choice_index(d->choices, s);
        *v = i;
        return i >= 0;
    }
    if (d->kind == GVQ_PARAM_REAL) {
        *v = strtod(s, &end);
        return errno == 0 && end != s && *end == '\0' && isfinite(*v);
    }
    long long i = strtoll(s, &end, 0);
    *v = (double)i;
    return errno == 0 && end != s && *end == '\0' && (d->kind == GVQ_PARAM_INT || i >= 0);
}

static const char *kind_text(const param_desc_t *d) {
    switch (d->kind) {
    case GVQ_PARAM_UINT:
        return "a non-negative integer";
    case GVQ_PARAM_INT:
        return "an integer";
    case GVQ_PARAM_REAL:
        return "a number";
    default:
        return "one of";
    }
}

static void param_init(void) {
    for (int i = 0; i < GVQ_PARAM_COUNT; i++) {
        const param_desc_t *d = &param_desc[i];
        param_value[i] = d->def;
        const char *s = getenv(d->env);
        param_text[i] = "";
        if (s == NULL || s[0] == '\0') continue;
        if (d->kind == GVQ_PARAM_TEXT) {
            param_text[i] = s;
            param_from_env[i] = 1;
            continue;
        }
        double v;
        if (!parse_value(d, s, &v)) {
            param_rejected[i] = s;
            if (d->kind == GVQ_PARAM_CHOICE) {
                char def[32];
                choice_name(d->choices, (int)d->def, def, sizeof def);
                GVQ_WARN("%s='%s' is not one of %s (in any case); using the default '%s'%s", d->env,
                         s, d->choices, def,
                         i == GVQ_PARAM_CODEC ? ", and every zero-code call is refused rather "
                                                "than run uncompressed"
                                              : "");
            } else {
                GVQ_WARN("%s='%s' is not %s; using the default %g", d->env, s, kind_text(d),
                         d->def);
            }
            continue;
        }
        param_value[i] = v;
        param_from_env[i] = 1;
    }
    __atomic_store_n(&param_ready, 1, __ATOMIC_RELEASE);
}

/* Read on every call of the hot paths: after the first, one load instead of pthread_once. */
static void param_ensure(void) {
    if (!__atomic_load_n(&param_ready, __ATOMIC_ACQUIRE)) pthread_once(&param_once, param_init);
}

int64_t gvq_param(gvq_param_id_t id) {
    param_ensure();
    return (int64_t)param_value[id];
}

double gvq_param_real(gvq_param_id_t id) {
    param_ensure();
    return param_value[id];
}

const char *gvq_param_text(gvq_param_id_t id) {
    param_ensure();
    return param_text[id];
}

int gvq_param_is_set(gvq_param_id_t id) {
    param_ensure();
    return param_from_env[id];
}

const char *gvq_param_rejected(gvq_param_id_t id) {
    param_ensure();
    return param_rejected[id];
}

void gvq_param_dump(void) {
    pthread_once(&param_once, param_init);
    for (int i = 0; i < GVQ_PARAM_COUNT; i++) {
        const param_desc_t *d = &param_desc[i];
        char value[64], name[32];
        if (d->kind == GVQ_PARAM_TEXT && strlen(param_text[i]) + 3 > sizeof value) {
            GVQ_INFO("param %s='%s' (environment) -- %s", d->env, param_text[i], d->help);
            continue; /* in full: a layout is longer than any fixed field */
        }
        if (d->kind == GVQ_PARAM_TEXT) {
            snprintf(value, sizeof value, "'%s'", param_text[i]);
        } else if (d->kind == GVQ_PARAM_CHOICE) {
            choice_name(d->choices, (int)param_value[i], name, sizeof name);
            snprintf(value, sizeof value, "%s", name);
        } else if (param_value[i] == (double)INT32_MIN) {
            snprintf(value, sizeof value, "unset");
        } else {
            snprintf(value, sizeof value, "%.17g", param_value[i]);
        }
        GVQ_INFO("param %s=%s (%s) -- %s%s%s", d->env, value,
                 param_from_env[i] ? "environment" : "default", d->help,
                 d->choices != NULL ? "; choices: " : "", d->choices != NULL ? d->choices : "");
    }
}

uint64_t gvq_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
