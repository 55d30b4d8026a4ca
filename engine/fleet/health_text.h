#ifndef ATC_HEALTH_TEXT_H
#define ATC_HEALTH_TEXT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* A short text that one thread rewrites while others read it: a seqlock over relaxed atomic words. The
 * writer makes seq odd, stores the words, makes seq even again (release); a reader copies the words and
 * tries again while seq was odd or changed under it. Every access is atomic, so a reader gets the old
 * text or the new one, never a mix, and never blocks the writer. */
#define ATC_HEALTH_TEXT_WORDS 24 /* 192 bytes, the NUL included */
struct atc_health_text {
    _Atomic unsigned seq;
    _Atomic uint64_t words[ATC_HEALTH_TEXT_WORDS];
};

/** Sets @p t to @p s (cut to ATC_HEALTH_TEXT_WORDS * 8 - 1 bytes). One writer thread at a time (for
 * ep->health, the main thread); readers may read meanwhile. */
void atc_health_text_set(struct atc_health_text *t, const char *s);

/** Copies @p t into @p out (@p size > 0 bytes, NUL-terminated, cut to fit) and returns the length copied;
 * 0 and "" when it is empty. Any thread; never blocks the writer (it tries again while one writes). */
size_t atc_health_text_get(const struct atc_health_text *t, char *out, size_t size);

#endif
