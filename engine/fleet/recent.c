/* The last minute of one endpoint (recent.h): per-second slots packed with their second. */

#include "fleet/recent.h"

#include <math.h>

#define VALUE_BITS 40
#define VALUE_MASK ((UINT64_C(1) << VALUE_BITS) - 1)
#define SECOND_MASK ((UINT64_C(1) << (64 - VALUE_BITS)) - 1) /* 2^24 s: 194 days before a second repeats */
/* One sample counts at most an hour (a slot saturates rather than wraps into the second's bits). */
#define TTFT_US_MAX UINT64_C(3600000000)

static uint64_t second_of(uint64_t now_ms)
{
    return (now_ms / 1000) & SECOND_MASK;
}

/* Adds @p v to the slot of second @p sec, or starts the slot over at @p v if it holds an older second. */
static void slot_add(_Atomic uint64_t *slot, uint64_t sec, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(slot, memory_order_relaxed), next;
    do {
        uint64_t n = cur >> VALUE_BITS == sec ? (cur & VALUE_MASK) + v : v;
        next = sec << VALUE_BITS | (n > VALUE_MASK ? VALUE_MASK : n);
    } while (
        !atomic_compare_exchange_weak_explicit(slot, &cur, next, memory_order_relaxed, memory_order_relaxed));
}

/* The slot's value if its second is within the window that ends at second @p now_sec, else 0. */
static uint64_t slot_get(const _Atomic uint64_t *slot, uint64_t now_sec)
{
    uint64_t v = atomic_load_explicit(slot, memory_order_relaxed);
    uint64_t age = (now_sec - (v >> VALUE_BITS)) & SECOND_MASK;
    return age < ATC_RECENT_SECONDS ? v & VALUE_MASK : 0;
}

void atc_recent_record(struct atc_recent *r, uint64_t now_ms, bool ok, double ttft_ms)
{
    uint64_t sec = second_of(now_ms);
    size_t i = (size_t)(sec % ATC_RECENT_SECONDS);
    slot_add(&r->attempts[i], sec, 1);
    /* A slot of an older second reads 0 and starts over at its next add: the others need no touch. */
    if (!ok)
        slot_add(&r->errors[i], sec, 1);
    if (ok && ttft_ms >= 0 && isfinite(ttft_ms)) {
        double us = ttft_ms * 1000.0;
        slot_add(&r->ttft_n[i], sec, 1);
        slot_add(&r->ttft_us[i], sec, us < (double)TTFT_US_MAX ? (uint64_t)us : TTFT_US_MAX);
    }
}

void atc_recent_sum(const struct atc_recent *r, uint64_t now_ms, struct atc_recent_sum *out)
{
    uint64_t sec = second_of(now_ms), us = 0;
    *out = (struct atc_recent_sum){0};
    for (size_t i = 0; i < ATC_RECENT_SECONDS; i++) {
        out->attempts += slot_get(&r->attempts[i], sec);
        out->errors += slot_get(&r->errors[i], sec);
        out->ttft_n += slot_get(&r->ttft_n[i], sec);
        us += slot_get(&r->ttft_us[i], sec);
    }
    out->ttft_ms = out->ttft_n > 0 ? (double)us / 1000.0 / (double)out->ttft_n : NAN;
}

void atc_recent_note_change(struct atc_recent *r, uint64_t now_ms, int from, int to)
{
    r->changes[r->nchanges % ATC_RECENT_CHANGES] = (struct atc_recent_change){now_ms, from, to};
    r->nchanges++;
}

size_t atc_recent_changes(const struct atc_recent *r, struct atc_recent_change *out)
{
    uint64_t first = r->nchanges > ATC_RECENT_CHANGES ? r->nchanges - ATC_RECENT_CHANGES : 0;
    size_t n = 0;
    for (uint64_t k = first; k < r->nchanges; k++)
        out[n++] = r->changes[k % ATC_RECENT_CHANGES];
    return n;
}
