/* libevent's small allocations in their own region (event_memory.c): the records libevent keeps per fd
 * number land there, a wave of connections' heap memory goes back to the kernel once they close, and
 * the hooks keep malloc's contract (realloc across the slot size, free of either kind). Installed once,
 * before this process's first libevent call, as main() does. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "heap_rss.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "base/event_memory.c" /* the hooks themselves, for the contract tests */
#include "proxy/worker.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

static void on_nothing(evutil_socket_t fd, short what, void *arg) {}

/* Each fd number an event_base has watched keeps a record in the region, after its event is gone. */
static void test_fd_records_take_slots(void **state)
{
    struct event_base *base = atc_event_base_new();
    assert_non_null(base);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct atc_event_memory_stats s0, s1, s2;
    atc_event_memory_stats(&s0);
    enum { N = 300 };
    int fds[N];
    struct event *evs[N];
    for (int i = 0; i < N; i++) {
        fds[i] = dup(sv[0]);
        assert_true(fds[i] >= 0);
        evs[i] = event_new(base, fds[i], EV_READ | EV_PERSIST, on_nothing, NULL);
        assert_int_equal(event_add(evs[i], NULL), 0);
    }
    assert_true(event_base_loop(base, EVLOOP_NONBLOCK) >= 0);
    atc_event_memory_stats(&s1);
    assert_true(s1.slots_live >= s0.slots_live + N);
    for (int i = 0; i < N; i++) {
        event_free(evs[i]);
        close(fds[i]);
    }
    assert_true(event_base_loop(base, EVLOOP_NONBLOCK) >= 0);
    atc_event_memory_stats(&s2);
    assert_true(s2.slots_live >= s0.slots_live + N); /* libevent keeps them until the base goes */
    assert_int_equal(s2.overflowed, 0);
    event_base_free(base);
    atc_event_memory_stats(&s2);
    assert_true(s2.slots_live <= s0.slots_live); /* and gives them back then */
    close(sv[0]);
    close(sv[1]);
}

/* What the hold benchmark does in small: fd numbers first watched while the heap grows for each
 * connection's memory, then every connection gone. The heap goes back near where it started: no page of
 * it is kept for a record libevent still holds. */
static void test_heap_goes_back_after_a_wave(void **state)
{
#ifdef UNDER_ASAN
    skip(); /* ASan's allocator keeps freed blocks in quarantine: no RSS to compare */
#endif
    struct event_base *base = atc_event_base_new();
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    enum { N = 2000, CONN_BYTES = 8 * 1024 };
    static int fds[N];
    static struct event *evs[N];
    static char *mem[N];
    malloc_trim(0);
    long before = heap_rss_kib();
    for (int i = 0; i < N; i++) {
        mem[i] = malloc(CONN_BYTES); /* the connection's own memory, touched */
        assert_non_null(mem[i]);
        memset(mem[i], 1, CONN_BYTES);
        fds[i] = dup(sv[0]);
        assert_true(fds[i] >= 0);
        evs[i] = event_new(base, fds[i], EV_READ | EV_PERSIST, on_nothing, NULL);
        assert_int_equal(event_add(evs[i], NULL), 0); /* the fd number's record is made here */
    }
    assert_true(event_base_loop(base, EVLOOP_NONBLOCK) >= 0);
    long peak = heap_rss_kib();
    for (int i = 0; i < N; i++) {
        event_free(evs[i]);
        close(fds[i]);
        free(mem[i]);
    }
    assert_true(event_base_loop(base, EVLOOP_NONBLOCK) >= 0);
    malloc_trim(0);
    long after = heap_rss_kib();
    print_message("heap RSS before %ld KiB, peak %ld KiB, after %ld KiB\n", before, peak, after);
    assert_true(peak - before >= N * CONN_BYTES / 1024 / 2);
    /* with the records among the connections' memory: one page kept per fd, 8,000 KiB here */
    assert_true(after - before < (peak - before) / 10);
    event_base_free(base);
    close(sv[0]);
    close(sv[1]);
}

/* The hooks as malloc: sizes up to a slot take one, larger ones and growth leave the region intact. */
static void test_hooks_keep_malloc_contract(void **state)
{
    char *a = on_malloc(20);
    assert_true(in_region(a));
    assert_int_equal((uintptr_t)a % 16, 0);
    memcpy(a, "0123456789abcdefghi", 20);
    assert_ptr_equal(on_realloc(a, ATC_EVENT_MEMORY_SLOT), a); /* still fits its slot */
    char *b = on_realloc(a, 100);                              /* out of the region, contents kept */
    assert_false(in_region(b));
    assert_string_equal(b, "0123456789abcdefghi");
    char *c = on_malloc(20);
    assert_ptr_equal(c, a); /* the slot b left is reused first */
    char *d = on_realloc(NULL, 8);
    assert_true(in_region(d));
    char *e = on_malloc(ATC_EVENT_MEMORY_SLOT + 1);
    assert_false(in_region(e));
    on_free(b);
    on_free(c);
    on_free(d);
    on_free(e);
    on_free(NULL);
}

int main(void)
{
    if (atc_event_memory_install() < 0) {
        fprintf(stderr, "cannot reserve the region\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_records_take_slots),
        cmocka_unit_test(test_heap_goes_back_after_a_wave),
        cmocka_unit_test(test_hooks_keep_malloc_contract),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
