/*
 * gvq_zero_code.h -- zero-code mode: with GVQ_CODEC set, a plain float sum/avg gvqAllReduce
 * goes through compressors attached to the communicator for its (recvbuff, count), split per
 * layer when a layout describes the buffer.
 *
 *   zero_code_layout.c  a layout checked (gvqCommSetLayout's rules) and parsed from text
 *                       (gvqCommSetLayoutString, GVQ_LAYOUT)
 *   zero_code.c         the compressors attached to the communicator, one call split into its
 *                       parts, the statistics
 */
#ifndef GVQ_ZERO_CODE_H_
#define GVQ_ZERO_CODE_H_

#include "gvq_comm.h"

/* GVQ_CODEC's value for "auto" (the values below it are gvqCodec_t). */
#define GVQ_ZERO_CODE_AUTO 4

/* A checked layout: layers in the caller's order (count filled in for conv and fc), and their
 * indices in ascending offset. */
typedef struct {
    size_t count; /* elements of the buffer it describes */
    int nlayers;
    gvqLayer_t *layers;
    int *by_offset;
} gvq_layout_t;

/* Check nlayers layers of a buffer of count elements and copy them into *out (caller's memory,
 * freed with gvq_layout_free). Refuses with gvqInvalidArgument and a WARN naming fn, the layer
 * and the rule. */
gvqResult_t gvq_layout_make(const char *fn, size_t count, const gvqLayer_t *layers, int nlayers,
                            gvq_layout_t *out);
/* Parse the text syntax (gvqCommSetLayoutString) into *out; every malformed entry is WARNed
 * (naming fn and the entry) before the refusal. An empty text gives an empty layout. */
gvqResult_t gvq_layout_parse(const char *fn, const char *text, gvq_layout_t *out);
void gvq_layout_free(gvq_layout_t *layout);
/* FNV-1a of the count and every layer's kind, offset, count and dims (equal layouts, equal
 * hashes, on every rank). */
uint64_t gvq_layout_hash(const gvq_layout_t *layout);
/* "conv", "fc" or "other" */
const char *gvq_layer_kind_name(int kind);

/* zero_code.c also defines gvqAllReduce: its op carries the table (gvq_group.h) through which
 * collectives.c asks for the settings' fingerprint in the call's signature (0 when GVQ_CODEC is
 * unset or the call is not one zero-code mode takes; its low byte names GVQ_CODEC's codec, so
 * ranks whose settings differ fail their first such call together) and lets zero-code mode
 * take the call. */

#endif /* GVQ_ZERO_CODE_H_ */
