/*
 * log.c -- GVQ_DEBUG=NONE|VERSION|WARN|INFO|TRACE and GVQ_DEBUG_FILE, in the manner of
 * NCCL_DEBUG. Lines look like
 *     host:pid:tid [rank] GVQ WARN gvqAllReduce: invalid datatype 42
 * WARN is the default level. GVQ_DEBUG_FILE names a file instead of stderr; %h in the name
 * becomes the host name and %p the pid, so each rank can write its own file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gvq_util.h"

int gvq_log_level_cached = -1;
static FILE *log_file;
static char log_host[64];
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int log_rank = -1;
static __thread char log_last[1024];

static void log_open_file(const char *pattern) {
    char path[4096];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 32 < sizeof path; p++) {
        if (p[0] == '%' && p[1] == 'h') {
            o += (size_t)snprintf(path + o, sizeof path - o, "%s", log_host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(path + o, sizeof path - o, "%d", (int)getpid());
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o] = '\0';
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        setvbuf(f, NULL, _IOLBF, 0);
        log_file = f;
    } else {
        fprintf(stderr, "%s:%d GVQ WARN cannot open GVQ_DEBUG_FILE '%s': %s; logging to stderr\n",
                log_host, (int)getpid(), path, strerror(errno));
    }
}

static void log_init(void) {
    const char *lvl = getenv("GVQ_DEBUG");
    int level = GVQ_LOG_WARN;
    if (lvl != NULL) {
        if (strcasecmp(lvl, "NONE") == 0)
            level = GVQ_LOG_NONE;
        else if (strcasecmp(lvl, "VERSION") == 0)
            level = GVQ_LOG_VERSION;
        else if (strcasecmp(lvl, "WARN") == 0)
            level = GVQ_LOG_WARN;
        else if (strcasecmp(lvl, "INFO") == 0)
            level = GVQ_LOG_INFO;
        else if (strcasecmp(lvl, "TRACE") == 0)
            level = GVQ_LOG_TRACE;
        else
            fprintf(stderr,
                    "GVQ WARN GVQ_DEBUG='%s' is not NONE|VERSION|WARN|INFO|TRACE; using WARN\n",
                    lvl);
    }
    if (gethostname(log_host, sizeof log_host) != 0) snprintf(log_host, sizeof log_host, "unknown");
    log_host[sizeof log_host - 1] = '\0';
    char *dot = strchr(log_host, '.');
    if (dot != NULL) *dot = '\0';
    log_file = stderr;
    const char *file = getenv("GVQ_DEBUG_FILE");
    if (file != NULL && file[0] != '\0') log_open_file(file);
    __atomic_store_n(&gvq_log_level_cached, level, __ATOMIC_RELEASE);
    if (lvl != NULL && level >= GVQ_LOG_VERSION)
        fprintf(log_file, "%s:%d GVQ INFO gvq version %d.%d.%d\n", log_host, (int)getpid(),
                GVQ_MAJOR, GVQ_MINOR, GVQ_PATCH);
}

int gvq_log_level(void) {
    pthread_once(&log_once, log_init);
    return gvq_log_level_cached;
}

void gvq_log_set_rank(int rank) {
    log_rank = rank;
}

const char *gvq_log_last_warn(void) {
    return log_last;
}

void gvq_log_set_last_warn(const char *text) {
    snprintf(log_last, sizeof log_last, "%s", text);
}

static void log_write(gvq_log_level_t level, const char *file, int line, const char *msg);

void gvq_log(gvq_log_level_t level, const char *file, int line, const char *fmt, ...) {
    int cur = gvq_log_level();
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (level == GVQ_LOG_WARN) snprintf(log_last, sizeof log_last, "%s", msg);
    if (cur < (int)level) return;
    log_write(level, file, line, msg);
}

void gvq_log_note(const char *file, int line, const char *fmt, ...) {
    if (gvq_log_level() < GVQ_LOG_WARN) return;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_write(GVQ_LOG_INFO, file, line, msg);
}

static void log_write(gvq_log_level_t level, const char *file, int line, const char *msg) {
    static const char *names[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE"};
    char rank[24] = "";
    if (log_rank >= 0) snprintf(rank, sizeof rank, " [%d]", log_rank);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    pthread_mutex_lock(&log_lock);
    if (level == GVQ_LOG_TRACE)
        fprintf(log_file, "%s:%d:%ld%s GVQ %s %s:%d %s\n", log_host, (int)getpid(),
                (long)syscall(SYS_gettid), rank, names[level], base, line, msg);
    else
        fprintf(log_file, "%s:%d:%ld%s GVQ %s %s\n", log_host, (int)getpid(),
                (long)syscall(SYS_gettid), rank, names[level], msg);
    fflush(log_file);
    pthread_mutex_unlock(&log_lock);
}
