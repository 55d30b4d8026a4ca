#ifndef ATC_FUZZ_H
#define ATC_FUZZ_H

/* Helpers shared by the fuzz targets. CHECK stays on in release builds (assert would not): a broken
 * invariant is a finding like a crash, and libFuzzer keeps the input that broke it. */

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                         \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

#endif
