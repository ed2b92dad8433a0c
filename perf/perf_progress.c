/*
 * perf_progress.c -- gvq-perf's progress line (see perf_progress.h).
 *
 *   gvq-perf: 41% (allreduce 16777216 B mpi), 0:12 elapsed, about 0:17 left
 *
 * The time left is the elapsed time scaled by the weight still to run over the weight done; the
 * line is written with '\r' and erased with "\r\033[K" (an ANSI terminal), so that the table on
 * stdout, which shares the terminal, never mixes with it.
 */
#include "perf_progress.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "perf_common.h"

#define SHOW_AFTER_S 3.0 /* runs shorter than this never show the line */
#define REDRAW_S 0.25

static struct {
    int on;
    double total, done, t0, last;
    int shown;
} pg;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 1 when the parent process is mpirun (or another launcher that forwards the ranks' stderr)
 * and its own stderr is a terminal (Linux /proc). */
static int launcher_stderr_is_terminal(void) {
    char path[64], buf[256];
    int ppid = (int)getppid();
    snprintf(path, sizeof path, "/proc/%d/comm", ppid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    int got = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!got) return 0;
    buf[strcspn(buf, "\n")] = '\0';
    static const char *const launchers[] = {"mpirun",  "mpiexec", "orterun",
                                            "prterun", "orted",   "prted"};
    int launcher = 0;
    for (size_t k = 0; k < sizeof launchers / sizeof launchers[0]; k++)
        launcher |= strcmp(buf, launchers[k]) == 0;
    if (!launcher) return 0;
    snprintf(path, sizeof path, "/proc/%d/fd/2", ppid);
    ssize_t n = readlink(path, buf, sizeof buf - 1);
    if (n <= 0) return 0;
    buf[n] = '\0';
    return strncmp(buf, "/dev/pts/", 9) == 0 || strncmp(buf, "/dev/tty", 8) == 0;
}

/* stderr is a terminal: ours, or, when ours is the pipe mpirun forwards, mpirun's. */
static int stderr_is_terminal(void) {
    if (isatty(STDERR_FILENO)) return 1;
    struct stat st;
    if (fstat(STDERR_FILENO, &st) != 0 || !S_ISFIFO(st.st_mode)) return 0;
    return launcher_stderr_is_terminal();
}

void perf_progress_start(int enabled, double total) {
    memset(&pg, 0, sizeof pg);
    pg.on = enabled && perf_rank == 0 && total > 0.0 && stderr_is_terminal();
    pg.total = total;
    pg.t0 = pg.last = now_s();
}

double perf_progress_weight(long long calls, size_t bytes) {
    return (double)(calls > 0 ? calls : 1) * ((double)bytes + 65536.0);
}

/* m:ss, or h:mm:ss from an hour up. */
static void fmt_duration(char *buf, size_t len, double s) {
    long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

void perf_progress_step(double weight, const char *what) {
    if (!pg.on) return;
    pg.done += weight;
    double t = now_s(), elapsed = t - pg.t0;
    if (elapsed < SHOW_AFTER_S || (pg.shown && t - pg.last < REDRAW_S)) return;
    double frac = pg.done < pg.total ? pg.done / pg.total : 1.0;
    char el[32], left[32];
    fmt_duration(el, sizeof el, elapsed);
    fmt_duration(left, sizeof left, frac > 0.0 ? elapsed * (1.0 - frac) / frac : 0.0);
    fprintf(stderr, "\r\033[Kgvq-perf: %3.0f%% (%s), %s elapsed, about %s left", 100.0 * frac, what,
            el, left);
    fflush(stderr);
    pg.shown = 1;
    pg.last = t;
}

void perf_progress_clear(void) {
    if (!pg.on || !pg.shown) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    pg.shown = 0;
    /* under mpirun stderr and stdout reach the terminal by different paths: give the erase a
     * head start on the row that follows it on stdout */
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
}

void perf_progress_end(void) {
    perf_progress_clear();
    pg.on = 0;
}
