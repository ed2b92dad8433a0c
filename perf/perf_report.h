/*
 * perf_report.h -- the output of gvq-perf's benchmarks (perf_report.c): header, table
 * rows, CSV rows and the summary at the end.
 */
#ifndef PERF_REPORT_H_
#define PERF_REPORT_H_

#include <stddef.h>
#include <stdio.h>

#include "perf_args.h"
#include "perf_bench.h"
#include "perf_gradsrc.h"

/* The run's header (options, the compressed codecs' settings when `lossy`), the ranks' pids and
 * hosts, and a warning when the check cannot be exact. Collective. */
void perf_report_start(const opts_t *o, int lossy, const gs_source_t *src);

/* The header of o->coll's table: what is measured against what, the busbw factor, the codecs
 * skipped and why. */
void perf_print_coll_header(const opts_t *o, const char *const skips[NUM_CODECS]);

/* The table's column headers; `extra`: with the ratio and rel_err columns. */
void perf_print_table_header(int extra);

/* One (size, codec) row: out-of-place, then in-place. */
void perf_print_row(const opts_t *o, size_t bytes, size_t count, codec_t codec,
                    const result_t res[2], int extra);

/* Opens --csv on rank 0 and writes its header line (`lossy`: with the ratio and rel_err fields);
 * *csv stays NULL elsewhere or without --csv. 0, or -1 on every rank when it could not be opened
 * (reported on rank 0). Collective. */
int perf_csv_open(const opts_t *o, int lossy, FILE **csv);

/* The CSV line of one (collective, size, codec). */
void perf_csv_row(FILE *f, const opts_t *o, size_t bytes, size_t count, codec_t codec,
                  const result_t res[2], int extra);

/* Everything after the table: totals, average bus bandwidths, compressor details and the ratio
 * tables. */
void perf_print_summary(const opts_t *o, const perf_results_t *r);

#endif /* PERF_REPORT_H_ */
