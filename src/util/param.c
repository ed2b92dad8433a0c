/*
 * param.c -- the tunables of GVQ_PARAM_LIST, read once from the environment.
 * A value that does not parse as an integer is reported and the default used.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "gvq_util.h"

typedef struct {
    const char *env;
    int64_t def;
    const char *help;
} param_desc_t;

static const param_desc_t param_desc[GVQ_PARAM_COUNT] = {
#define GVQ_PARAM_DESC(id, env, def, help) [GVQ_PARAM_##id] = {env, def, help},
    GVQ_PARAM_LIST(GVQ_PARAM_DESC)
#undef GVQ_PARAM_DESC
};

static int64_t param_value[GVQ_PARAM_COUNT];
static int param_from_env[GVQ_PARAM_COUNT];
static pthread_once_t param_once = PTHREAD_ONCE_INIT;

static void param_init(void) {
    for (int i = 0; i < GVQ_PARAM_COUNT; i++) {
        param_value[i] = param_desc[i].def;
        const char *s = getenv(param_desc[i].env);
        if (s == NULL || s[0] == '\0') continue;
        char *end = NULL;
        errno = 0;
        long long v = strtoll(s, &end, 0);
        if (errno != 0 || end == s || *end != '\0' || v < 0) {
            GVQ_WARN("%s='%s' is not a non-negative integer; using the default %lld",
                     param_desc[i].env, s, (long long)param_desc[i].def);
            continue;
        }
        param_value[i] = v;
        param_from_env[i] = 1;
    }
}

int64_t gvq_param(gvq_param_id_t id) {
    pthread_once(&param_once, param_init);
    return param_value[id];
}

void gvq_param_dump(void) {
    pthread_once(&param_once, param_init);
    for (int i = 0; i < GVQ_PARAM_COUNT; i++)
        GVQ_INFO("param %s=%lld (%s) -- %s", param_desc[i].env, (long long)param_value[i],
                 param_from_env[i] ? "environment" : "default", param_desc[i].help);
}

uint64_t gvq_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
