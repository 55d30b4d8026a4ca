/* atc_kv_batch_decode over any bytes: the msgpack payload of an engine's KV-event message, and the
 * index fed from what decodes.
 *
 * Besides not crashing, leaking or reading outside the payload: a refusal names a reason and leaves
 * the batch empty; a batch that decodes has only known event types with a valid tier, and applied to
 * an index with a small cap (as kv_events.c applies it) never holds more blocks than the cap. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/kv_event_decode.h"
#include "fleet/kv_index.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1); /* exactly the payload: an overread is an ASan report */
    memcpy(copy, data, size);
    struct atc_kv_batch b;
    const char *err = NULL;
    int rc = atc_kv_batch_decode(copy, size, &b, &err);
    if (rc < 0) {
        CHECK(err != NULL && b.nevents == 0 && b.events == NULL);
    } else {
        CHECK(rc == 0 && err == NULL);
        size_t caps[2] = {8, 8};
        struct atc_kv_index *ix = atc_kv_index_create(caps, 2);
        CHECK(ix != NULL);
        size_t unknown = 0;
        for (size_t i = 0; i < b.nevents; i++) {
            const struct atc_kv_event *e = &b.events[i];
            CHECK(e->type <= ATC_KV_UNKNOWN && (e->tier == ATC_KV_GPU || e->tier == ATC_KV_CPU));
            unknown += e->type == ATC_KV_UNKNOWN;
            for (size_t k = 0; k < e->nkeys; k++) {
                if (e->type == ATC_KV_STORED)
                    CHECK(atc_kv_index_store(ix, (unsigned)(k & 1), e->keys[k], e->tier) >= 0);
                else
                    atc_kv_index_remove(ix, (unsigned)(k & 1), e->keys[k], e->tier);
            }
            if (e->type == ATC_KV_CLEARED)
                atc_kv_index_clear(ix, 0);
            for (unsigned ep = 0; ep < 2; ep++)
                CHECK(atc_kv_index_blocks(ix, ep, ATC_KV_GPU) + atc_kv_index_blocks(ix, ep, ATC_KV_CPU) <= 8);
        }
        CHECK(unknown == b.unknown);
        atc_kv_index_destroy(ix);
    }
    atc_kv_batch_dispose(&b);
    free(copy);
    return 0;
}
