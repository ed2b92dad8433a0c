/*
 * gvq_zero_code.h -- zero-code mode: with GVQ_CODEC set, a plain float sum/avg gvqAllReduce
 * goes through compressors attached to the communicator for its (recvbuff, count), split per
 * layer when a layout describes the buffer.
 *
 *   zero_code_layout.c  a layout checked (gvqCommSetLayout's rules) and parsed from text
 *                       (gvqCommSetLayoutString, GVQ_LAYOUT)
 *   zero_code_plan.c    a buffer's plan: its parts, their codecs and compressors, agreed
 *   zero_code.c         the plans attached to the communicator, one call split into its parts,
 *                       the statistics, gvqAllReduce
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

/* ---- zero_code.c and zero_code_plan.c ---- */

#define GVQ_ZC_FN "gvqAllReduce (zero-code, GVQ_CODEC)" /* the name in their WARN lines */

/* Zero-code GradiVeQ keeps this many slices of each reuse group per sampling call (spread over
 * it) unless GVQ_GRADIVEQ_SAMPLE_SLICES says otherwise: 100 calls x 64 = 6400 samples for a
 * 256 x 256 covariance, a few MB and tens of ms per fit whatever the buffer's size. */
#define ZC_SAMPLE_SLICES 64

#define PART_WHOLE (-1) /* the part is the whole buffer (no layout) */
#define PART_GAP (-2)   /* the part is a gap between layers */

typedef struct {
    size_t offset, count;
    int layer;            /* index in the layout, PART_WHOLE or PART_GAP */
    int codec;            /* gvqCodec_t; gvqCodecNone: summed by the plain allreduce */
    gvqCompressor_t comp; /* NULL when plain */
} zc_part_t;

typedef struct {
    size_t offset, count;
} zc_range_t;

typedef struct zc_entry {
    struct zc_entry *next;
    const void *buf;
    size_t count;
    int split; /* 1: parts follow the communicator's layout */
    int nparts;
    zc_part_t *parts; /* in offset order */
    int nranges;
    zc_range_t *plain;  /* the plain parts, adjacent ones merged, in offset order */
    size_t plain_count; /* their elements */
    float *gather;      /* plain_count floats when nranges > 1 */
    long long calls;
    unsigned long long plain_wire, plain_raw; /* the plain allreduce's bytes, all calls */
} zc_entry_t;

/* The attachment: the list of buffers, the layout set by a call and the call counter. */
typedef struct {
    zc_entry_t *first;
    int have_layout; /* 1: `layout` replaces GVQ_LAYOUT on this communicator */
    gvq_layout_t layout;
    long long calls;
    int seeds; /* compressors made so far: the next one's seed (QSGD's random stream) */
} zc_state_t;

/* zero_code_plan.c: the layout in force on the communicator (its own, else GVQ_LAYOUT; NULL:
 * none; a refused GVQ_LAYOUT refuses the call); the codec GVQ_CODEC's master setting gives a
 * layer; and a new buffer's plan, its compressors made and agreed with the other ranks. */
gvqResult_t gvq_zc_current_layout(const zc_state_t *st, const gvq_layout_t **out);
int gvq_zc_layer_codec(int master, const gvqLayer_t *l);
gvqResult_t gvq_zc_new_entry(gvqComm_t comm, zc_state_t *st, int master, const void *buf,
                             size_t count, zc_entry_t **out);
/* zero_code.c: free an entry and its compressors. */
void gvq_zc_entry_free(zc_entry_t *e);

/* zero_code.c also defines gvqAllReduce: its op carries the table (gvq_group.h) through which
 * collectives.c asks for the settings' fingerprint in the call's signature (0 when GVQ_CODEC is
 * unset or the call is not one zero-code mode takes; its low byte names GVQ_CODEC's codec, so
 * ranks whose settings differ fail their first such call together) and lets zero-code mode
 * take the call. */

#endif /* GVQ_ZERO_CODE_H_ */
