/* A config file's errors (config_errors.h): collected, then sorted by position and joined. */

#include "config/config_errors.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Messages quote keys and values from the file, and a quoted YAML key may hold a newline: escape
 * control characters so that each error stays on one line. Takes @p text, returns it or a new copy. */
static char *escape_controls(char *text)
{
    size_t extra = 0, i, o;
    char *out;

    for (i = 0; text[i]; i++)
        extra += (unsigned char)text[i] < 0x20 || text[i] == 0x7f ? 3 : 0;
    if (extra == 0 || !(out = malloc(i + extra + 1)))
        return text; /* (out of memory: the message keeps its raw bytes) */
    for (i = 0, o = 0; text[i]; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(out + o, 5, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    out[o] = '\0';
    free(text);
    return out;
}

static void push_error(struct atc_config_errors *e, size_t line, size_t col, char *text)
{
    if (text)
        text = escape_controls(text);
    if (!text) {
        e->oom = true;
        return;
    }
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 16;
        struct atc_config_error *v = realloc(e->v, cap * sizeof *v);
        if (!v) {
            free(text);
            e->oom = true;
            return;
        }
        e->v = v;
        e->cap = cap;
    }
    e->v[e->n] = (struct atc_config_error){line, col, e->n, text};
    e->n++;
}

void atc_config_report(struct atc_config_errors *e, yaml_mark_t at, const char *key, const char *fmt, ...)
{
    char msg[512];
    char *text;
    va_list ap;
    bool keyed = key && *key;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (asprintf(&text, "%s:%zu:%zu: %s%s%s%s", e->name, at.line + 1, at.column + 1, keyed ? "key '" : "",
                 keyed ? key : "", keyed ? "': " : "", msg) < 0)
        text = NULL;
    push_error(e, at.line + 1, at.column + 1, text);
}

void atc_config_report_syntax(struct atc_config_errors *e, const yaml_parser_t *y)
{
    if (y->error == YAML_MEMORY_ERROR) {
        e->oom = true;
        return;
    }
    if (y->context)
        atc_config_report(e, y->problem_mark, NULL, "YAML syntax error: %s (%s at %zu:%zu)",
                          y->problem ? y->problem : "unexpected input", y->context, y->context_mark.line + 1,
                          y->context_mark.column + 1);
    else
        atc_config_report(e, y->problem_mark, NULL, "YAML syntax error: %s",
                          y->problem ? y->problem : "unreadable input");
}

bool atc_config_errors_any(const struct atc_config_errors *e)
{
    return e->n > 0 || e->oom;
}

static int by_position(const void *a, const void *b)
{
    const struct atc_config_error *x = a, *y = b;

    if (x->line != y->line)
        return x->line < y->line ? -1 : 1;
    if (x->col != y->col)
        return x->col < y->col ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

char *atc_config_errors_join(struct atc_config_errors *e)
{
    size_t total = 1, o = 0;
    char *all, *oom;

    if (e->oom && asprintf(&oom, "%s: out of memory", e->name) >= 0)
        push_error(e, SIZE_MAX, 0, oom);
    qsort(e->v, e->n, sizeof *e->v, by_position);
    for (size_t i = 0; i < e->n; i++)
        total += strlen(e->v[i].text) + 1;
    if ((all = malloc(total)))
        all[0] = '\0';
    for (size_t i = 0; i < e->n; i++) {
        if (all)
            o += (size_t)snprintf(all + o, total - o, "%s%s", i ? "\n" : "", e->v[i].text);
        free(e->v[i].text);
    }
    free(e->v);
    e->v = NULL;
    e->n = e->cap = 0;
    return all;
}

bool atc_yaml_is_null(const yaml_node_t *n)
{
    const char *s;

    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    s = (const char *)n->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

const char *atc_yaml_describe(const yaml_node_t *n, char *buf, size_t size)
{
    const unsigned char *v;
    size_t i, o = 0, len;

    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    if (atc_yaml_is_null(n))
        return "nothing";
    v = n->data.scalar.value;
    len = n->data.scalar.length;
    buf[o++] = '\'';
    for (i = 0; i < len && o < size - 6; i++)
        buf[o++] = v[i] < 0x20 || v[i] == 0x7f ? '?' : (char)v[i];
    if (i < len) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o++] = '\'';
    buf[o] = '\0';
    return buf;
}

char *atc_config_format(const char *fmt, ...)
{
    va_list ap;
    char *s;

    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !(s = malloc((size_t)n + 1)))
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}
