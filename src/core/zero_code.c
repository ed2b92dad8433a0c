/*
 * zero_code.c -- zero-code mode (gvq_zero_code.h): with GVQ_CODEC=gradiveq|qsgd, a plain
 * gvqAllReduce of floats (sum or avg) runs through a compressor made on the first such call for
 * its (recvbuff, count) and kept on the communicator as an attachment, destroyed with it.
 *
 *   gvqAllReduce(send, recv, count, float, sum|avg)
 *     -> attached list of comm: (recv, count) known? -- no --> gvqCompressorCreate (GVQ_CODEC,
 *        GVQ_GRADIVEQ_EPS, _VOTE, _SAMPLE_SLICES; out-of-range values refused naming the field)
 *     -> the compressed allreduce of that compressor
 */
#include <stdlib.h>

#include "gvq_compressor.h"
#include "gvq_zero_code.h"

typedef struct zero_code_entry {
    struct zero_code_entry *next;
    const void *buf;
    size_t count;
    gvqCompressor_t comp;
} zero_code_entry_t;

/* The list head lives in the attachment, so the communicator frees it without knowing it. */
typedef struct {
    zero_code_entry_t *first;
} zero_code_list_t;

static const char attachment_key = 0; /* its address names the attachment */

static void detach(void *state) {
    zero_code_list_t *list = state;
    for (zero_code_entry_t *e = list->first, *next; e != NULL; e = next) {
        next = e->next;
        gvqCompressorDestroy(e->comp);
        free(e);
    }
    free(list);
}

static gvqResult_t attached_list(gvqComm_t comm, zero_code_list_t **out) {
    zero_code_list_t *list = gvq_comm_attached(comm, &attachment_key);
    if (list == NULL) {
        if ((list = calloc(1, sizeof *list)) == NULL) return gvqSystemError;
        gvqResult_t res = gvq_comm_attach(comm, &attachment_key, list, detach);
        if (res != gvqSuccess) {
            free(list);
            return res;
        }
    }
    *out = list;
    return gvqSuccess;
}

/* A compressor for (buf, count) of the zero-code codec, made by the environment's knobs. */
static gvqResult_t new_entry(gvqComm_t comm, int codec, const void *buf, size_t count,
                             zero_code_entry_t **out) {
    zero_code_entry_t *e = calloc(1, sizeof *e);
    if (e == NULL) return gvqSystemError;
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = codec;
    cfg.lossThreshold = (float)gvq_param_real(GVQ_PARAM_GRADIVEQ_EPS);
    cfg.voteThreshold = (float)gvq_param_real(GVQ_PARAM_GRADIVEQ_VOTE);
    cfg.sampleSlices = (int)gvq_param(GVQ_PARAM_GRADIVEQ_SAMPLE_SLICES);
    gvqResult_t res = gvqCompressorCreate(comm, count, &cfg, &e->comp);
    if (res != gvqSuccess) {
        free(e);
        return res;
    }
    e->buf = buf;
    e->count = count;
    *out = e;
    GVQ_INFO("GVQ_CODEC: attached a compressor to buffer %p count %zu", buf, count);
    return gvqSuccess;
}

gvqResult_t gvq_zero_code_allreduce(gvqComm_t comm, const void *send, void *recv, size_t count,
                                    gvqDataType_t dtype, gvqRedOp_t op, int *handled) {
    int codec = (int)gvq_param(GVQ_PARAM_CODEC);
    *handled = 0;
    if (codec == gvqCodecNone || dtype != gvqFloat32 || (op != gvqSum && op != gvqAvg) ||
        count == 0)
        return gvqSuccess;
    zero_code_list_t *list;
    GVQCHECK(attached_list(comm, &list));
    zero_code_entry_t *e = list->first;
    while (e != NULL && !(e->buf == recv && e->count == count))
        e = e->next;
    if (e == NULL) {
        GVQCHECK(new_entry(comm, codec, recv, count, &e));
        e->next = list->first;
        list->first = e;
    }
    *handled = 1;
    return gvq_compressed_allreduce_entered(e->comp, send, recv, op);
}
