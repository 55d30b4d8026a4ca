#ifndef ATC_EVENT_MEMORY_H
#define ATC_EVENT_MEMORY_H

/* libevent's smallest allocations in a region of their own, away from the heap.
 *
 * Why: libevent keeps one small record per file descriptor number it has ever watched (its fd map,
 * 20 bytes each with the changelist) and frees none of them before the event_base goes. When thousands
 * of connections open, each new fd number's record is allocated among those connections' own memory
 * (their structs, buffers, relays); after they close, those records are what is left alive on the
 * heap: measured after 8,000 held streams, 15,756 of them pinned 4,800 pages (19 MiB of the 21.5 MiB
 * the heap kept resident; under 1 MiB was in use), which malloc_trim cannot give back. Here every
 * allocation libevent makes of at most ATC_EVENT_MEMORY_SLOT bytes takes a slot of one reserved
 * region instead, so those records sit side by side (16,000 fds: 0.5 MiB) and the heap pages of the
 * connections go back to the kernel once they close.
 *
 * Process-wide, because libevent's memory hooks are: install once, before any other libevent call. The
 * region's slots are shared by every thread under one mutex (a few small allocations per connection,
 * none per request on the serving path). Freed slots are reused, never returned: the region holds what
 * was live at once at most. When it is full, small allocations go to malloc as before. */

#include <stddef.h>

/* The largest allocation that takes a slot, and a slot's size (a multiple of malloc's alignment). */
#define ATC_EVENT_MEMORY_SLOT 32

/** Routes libevent's allocations through the pool (event_set_mem_functions). Call before any other
 * libevent function, once per process. Returns 0, or -1 when the region cannot be reserved (libevent
 * then keeps using malloc). */
int atc_event_memory_install(void);

struct atc_event_memory_stats {
    size_t slots_live;    /* small allocations held now */
    size_t slots_touched; /* slots ever used: the region's resident size is this x ATC_EVENT_MEMORY_SLOT */
    size_t overflowed;    /* small allocations that went to malloc because the region was full */
};

/** Fills @p out (zeros before install). */
void atc_event_memory_stats(struct atc_event_memory_stats *out);

#endif
