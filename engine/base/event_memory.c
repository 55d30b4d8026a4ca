/* libevent's smallest allocations in a region of their own (event_memory.h says why).
 *
 * The region is reserved once (address space only: a page becomes resident when its first slot is
 * used) and cut into slots of ATC_EVENT_MEMORY_SLOT bytes, handed out from a free list first, then from
 * the untouched rest. Whether a pointer is a slot is one range check, so free and realloc know which
 * allocator a pointer came from without a header. The state is static because libevent's hooks take
 * no context. */
#include "base/event_memory.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <event2/event.h>

/* 2^20 slots, 32 MiB of address space: one per fd up to a million open at once. */
#define REGION_SLOTS ((size_t)1 << 20)

_Static_assert(ATC_EVENT_MEMORY_SLOT % 16 == 0, "a slot keeps malloc's alignment");

struct free_slot {
    struct free_slot *next;
};

static struct {
    pthread_mutex_t mu;
    char *base;             /* the region; written once by install, before any other thread runs */
    size_t used;            /* slots handed out from the untouched rest so far */
    struct free_slot *free; /* slots given back, reused first */
    size_t live, overflowed;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int in_region(const void *p)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)pool.base;
    return pool.base != NULL && a >= b && a - b < REGION_SLOTS * ATC_EVENT_MEMORY_SLOT;
}

/* A slot, or NULL when the region is full. */
static void *slot_take(void)
{
    void *p = NULL;
    pthread_mutex_lock(&pool.mu);
    if (pool.free != NULL) {
        p = pool.free;
        pool.free = pool.free->next;
    } else if (pool.used < REGION_SLOTS) {
        p = pool.base + pool.used++ * ATC_EVENT_MEMORY_SLOT;
    }
    if (p != NULL)
        pool.live++;
    else
        pool.overflowed++;
    pthread_mutex_unlock(&pool.mu);
    return p;
}

static void slot_give(void *p)
{
    struct free_slot *s = p;
    pthread_mutex_lock(&pool.mu);
    s->next = pool.free;
    pool.free = s;
    pool.live--;
    pthread_mutex_unlock(&pool.mu);
}

static void *on_malloc(size_t size)
{
    if (size <= ATC_EVENT_MEMORY_SLOT) {
        void *p = slot_take();
        if (p != NULL)
            return p;
    }
    return malloc(size);
}

static void *on_realloc(void *ptr, size_t size)
{
    if (ptr == NULL)
        return on_malloc(size);
    if (!in_region(ptr))
        return realloc(ptr, size); /* a small one stays in the heap: libevent grows arrays, not records */
    if (size <= ATC_EVENT_MEMORY_SLOT)
        return ptr;
    void *p = malloc(size);
    if (p == NULL)
        return NULL; /* ptr stays valid, as realloc leaves it */
    memcpy(p, ptr, ATC_EVENT_MEMORY_SLOT);
    slot_give(ptr);
    return p;
}

static void on_free(void *ptr)
{
    if (in_region(ptr))
        slot_give(ptr);
    else
        free(ptr);
}

int atc_event_memory_install(void)
{
    if (pool.base != NULL)
        return 0;
    void *base = mmap(NULL, REGION_SLOTS * ATC_EVENT_MEMORY_SLOT, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return -1;
    pool.base = base;
    event_set_mem_functions(on_malloc, on_realloc, on_free);
    return 0;
}

void atc_event_memory_stats(struct atc_event_memory_stats *out)
{
    pthread_mutex_lock(&pool.mu);
    *out = (struct atc_event_memory_stats){
        .slots_live = pool.live, .slots_touched = pool.used, .overflowed = pool.overflowed};
    pthread_mutex_unlock(&pool.mu);
}
