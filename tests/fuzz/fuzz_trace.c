/* The trace readers over any bytes (atc_trace_load): atc's own MessagePack format and the importers of
 * public traces (Mooncake JSON lines, Azure CSV, atc's JSON lines), as `atc replay` and `atc trace`
 * read a file someone handed over.
 *
 * Input: byte 0 picks the format (auto, native, mooncake, azure, jsonl), the rest is the file (a
 * memfd, read through its /proc path). Besides not crashing or leaking: a loaded trace is normalized
 * (sorted by arrival, the first at 0), and saving it in atc's format and loading that back gives the
 * same records. */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "trace/trace.h"
#include "trace/trace_import.h"

static int in_fd = -1, out_fd = -1;
static char in_path[64], out_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    in_fd = memfd_create("fuzz-trace-in", 0);
    out_fd = memfd_create("fuzz-trace-out", 0);
    CHECK(in_fd >= 0 && out_fd >= 0);
    snprintf(in_path, sizeof(in_path), "/proc/self/fd/%d", in_fd);
    snprintf(out_path, sizeof(out_path), "/proc/self/fd/%d", out_fd);
    return 0;
}

static bool same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0) ||
           (a == NULL && b != NULL && b[0] == '\0') || (b == NULL && a != NULL && a[0] == '\0');
}

static bool same_num(double a, double b)
{
    return (isnan(a) && isnan(b)) || a == b;
}

static void check_same(const struct atc_trace_record *a, const struct atc_trace_record *b)
{
    CHECK(a->at_us == b->at_us);
    CHECK(same_str(a->id, b->id) && same_str(a->model, b->model) && same_str(a->tenant, b->tenant));
    CHECK(same_str(a->session, b->session) && same_str(a->endpoint, b->endpoint));
    CHECK(same_str(a->decision, b->decision));
    CHECK(a->kind == b->kind && a->prompt_tokens == b->prompt_tokens && a->max_tokens == b->max_tokens);
    CHECK(a->output_tokens == b->output_tokens && a->priority == b->priority && a->stream == b->stream);
    /* block_tokens says what a block covers: without blocks it means nothing, and is not written */
    CHECK(a->nblocks == b->nblocks && (a->nblocks == 0 || a->block_tokens == b->block_tokens));
    CHECK(a->nblocks == 0 || memcmp(a->blocks, b->blocks, a->nblocks * sizeof(uint64_t)) == 0);
    CHECK(a->prompt_len == b->prompt_len &&
          (a->prompt_len == 0 || memcmp(a->prompt, b->prompt, a->prompt_len) == 0));
    CHECK(a->policy_version == b->policy_version && a->attempts == b->attempts && a->status == b->status);
    CHECK(same_num(a->ttft_ms, b->ttft_ms) && same_num(a->total_ms, b->total_ms));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const enum atc_trace_format formats[] = {ATC_TRACE_AUTO, ATC_TRACE_NATIVE, ATC_TRACE_MOONCAKE,
                                                    ATC_TRACE_AZURE, ATC_TRACE_JSONL};
    struct atc_trace_import_options o = {.format = formats[data[0] % 5]};
    CHECK(ftruncate(in_fd, 0) == 0);
    CHECK(pwrite(in_fd, data + 1, size - 1, 0) == (ssize_t)(size - 1));

    struct atc_trace *t = NULL;
    char *err = NULL;
    size_t bad = 0;
    if (atc_trace_load(in_path, &o, &t, &bad, &err) < 0) {
        CHECK(t == NULL && err != NULL);
        free(err);
        return 0;
    }
    CHECK(t != NULL && err == NULL);
    for (size_t i = 0; i < t->n; i++) {
        const struct atc_trace_record *r = &t->records[i];
        CHECK(r->model != NULL && r->tenant != NULL && r->session != NULL);
        CHECK(r->nblocks <= ATC_TRACE_BLOCKS_MAX && (r->nblocks == 0 || r->blocks != NULL));
        CHECK(i == 0 ? r->at_us == 0 : r->at_us >= t->records[i - 1].at_us);
    }

    CHECK(ftruncate(out_fd, 0) == 0);
    CHECK(atc_trace_save(t, out_path, &err) == 0);
    struct atc_trace *back = NULL;
    struct atc_trace_import_options native = {.format = ATC_TRACE_NATIVE};
    if (atc_trace_load(out_path, &native, &back, &bad, &err) < 0) {
        fprintf(stderr, "a saved trace does not load: %s\n", err);
        abort();
    }
    CHECK(back->n == t->n);
    for (size_t i = 0; i < t->n; i++)
        check_same(&t->records[i], &back->records[i]);
    atc_trace_free(back);
    atc_trace_free(t);
    return 0;
}
