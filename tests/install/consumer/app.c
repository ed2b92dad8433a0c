/* A program built against an installed gvq through find_package(gvq). */
#include <stdio.h>

#include "gvq.h"

int main(void) {
    int v = 0;
    if (gvqGetVersion(&v) != gvqSuccess || v != GVQ_VERSION) {
        fprintf(stderr, "installed gvq reports version %d, header says %d\n", v, GVQ_VERSION);
        return 1;
    }
    printf("installed gvq %d found and linked\n", v);
    return 0;
}
