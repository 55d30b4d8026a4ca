#ifndef ATC_TEST_HEAP_RSS_H
#define ATC_TEST_HEAP_RSS_H

/* For the unit tests that check memory goes back to the kernel (include after cmocka.h). */

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The heap's resident KiB ([heap] in smaps: the main arena, where the test's thread allocates). */
static inline long heap_rss_kib(void)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    char line[512];
    bool in_heap = false;
    long rss = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strchr(line, '-') != NULL && strstr(line, " rw-p ") != NULL)
            in_heap = strstr(line, "[heap]") != NULL;
        else if (in_heap && strncmp(line, "Rss:", 4) == 0)
            rss = strtol(line + 4, NULL, 10);
    }
    fclose(f);
    return rss;
}

#endif
