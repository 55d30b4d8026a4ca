/* A short text one thread writes while others read it (health_text.h). */

#include "fleet/health_text.h"

#include <sched.h>
#include <string.h>

/* The seqlock's one writer. The release fence orders the odd seq before the words; the release store of
 * the even seq orders the words before it. */
void atc_health_text_set(struct atc_health_text *t, const char *s)
{
    unsigned seq = atomic_load_explicit(&t->seq, memory_order_relaxed);
    atomic_store_explicit(&t->seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    size_t len = strlen(s), n = 0;
    for (size_t w = 0; w < ATC_HEALTH_TEXT_WORDS; w++) {
        char bytes[8] = {0};
        for (size_t k = 0; k < 8 && n < len && n < ATC_HEALTH_TEXT_WORDS * 8 - 1; k++)
            bytes[k] = s[n++];
        uint64_t word;
        memcpy(&word, bytes, 8);
        atomic_store_explicit(&t->words[w], word, memory_order_relaxed);
    }
    atomic_store_explicit(&t->seq, seq + 2, memory_order_release);
}

size_t atc_health_text_get(const struct atc_health_text *t, char *out, size_t size)
{
    char copy[ATC_HEALTH_TEXT_WORDS * 8];
    unsigned before, after, tries = 0;
    do { /* the writer holds seq odd for the time of a 192-byte copy, once per failed probe at most */
        if (tries++ > 0 && tries % 64 == 0)
            sched_yield(); /* the writer was preempted halfway: let it finish */
        before = atomic_load_explicit(&t->seq, memory_order_acquire);
        for (size_t w = 0; w < ATC_HEALTH_TEXT_WORDS; w++) {
            uint64_t word = atomic_load_explicit(&t->words[w], memory_order_relaxed);
            memcpy(copy + 8 * w, &word, 8);
        }
        atomic_thread_fence(memory_order_acquire);
        after = atomic_load_explicit(&t->seq, memory_order_relaxed);
    } while ((before & 1) != 0 || before != after);
    copy[sizeof(copy) - 1] = '\0';
    size_t len = strnlen(copy, sizeof(copy));
    if (len >= size)
        len = size - 1;
    memcpy(out, copy, len);
    out[len] = '\0';
    return len;
}
