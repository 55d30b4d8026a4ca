/* The Prometheus text format (prometheus.h). One pass over the page, line by line, with no copy of
 * the page: names point into it, and only label values (which have escapes) are unescaped, into a
 * scratch buffer sized to the line before the line is parsed, so the pointers handed to the callback
 * never move while it runs. */

#include "fleet/prometheus.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Longest value or timestamp token: far beyond any float Go or C prints (they need about 25). */
#define MAX_NUMBER_CHARS 64

struct parser {
    const char *p, *end; /* the rest of the current line */
    char *scratch;       /* unescaped strings of the current line */
    size_t scratch_len, scratch_cap;
    struct atc_prom_label *labels;
    size_t nlabels, cap_labels;
    const char *err;
    int stop; /* the callback's nonzero answer */
};

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

static bool is_name_start(char c, bool metric)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (metric && c == ':');
}

static bool is_name_char(char c, bool metric)
{
    return is_name_start(c, metric) || (c >= '0' && c <= '9');
}

static void skip_space(struct parser *ps)
{
    while (ps->p < ps->end && is_space(*ps->p))
        ps->p++;
}

static bool at(const struct parser *ps, char c)
{
    return ps->p < ps->end && *ps->p == c;
}

static int fail(struct parser *ps, const char *msg)
{
    ps->err = msg;
    return -1;
}

/* A plain name ([a-zA-Z_:][a-zA-Z0-9_:]*, no ':' for labels) at the cursor. */
static int plain_name(struct parser *ps, bool metric, const char **name, size_t *len)
{
    const char *s = ps->p;
    if (ps->p >= ps->end || !is_name_start(*ps->p, metric))
        return fail(ps, metric ? "expected a metric name" : "expected a label name");
    while (ps->p < ps->end && is_name_char(*ps->p, metric))
        ps->p++;
    *name = s;
    *len = (size_t)(ps->p - s);
    return 0;
}

/* A double-quoted string at the cursor, unescaped (\\, \", \n; any other escaped character stands for
 * itself) into the scratch buffer. */
static int quoted(struct parser *ps, const char **out, size_t *len)
{
    char *dst = ps->scratch + ps->scratch_len;
    size_t n = 0;
    if (!at(ps, '"'))
        return fail(ps, "expected '\"'");
    for (ps->p++;; ps->p++) {
        if (ps->p >= ps->end)
            return fail(ps, "unterminated quoted string");
        char c = *ps->p;
        if (c == '"')
            break;
        if (c == '\\') {
            if (++ps->p >= ps->end)
                return fail(ps, "unterminated quoted string");
            c = *ps->p == 'n' ? '\n' : *ps->p;
        }
        dst[n++] = c;
    }
    ps->p++;
    ps->scratch_len += n;
    *out = dst;
    *len = n;
    return 0;
}

/* A quoted metric or label name (Prometheus 3): like any name, it may not be empty. */
static int quoted_name(struct parser *ps, const char **out, size_t *len)
{
    if (quoted(ps, out, len) < 0)
        return -1;
    return *len > 0 ? 0 : fail(ps, "empty name");
}

static int add_label(struct parser *ps, const char *name, size_t name_len, const char *value,
                     size_t value_len)
{
    for (size_t i = 0; i < ps->nlabels; i++)
        if (ps->labels[i].name_len == name_len && memcmp(ps->labels[i].name, name, name_len) == 0)
            return fail(ps, "duplicate label name");
    if (ps->nlabels == ps->cap_labels) {
        size_t cap = ps->cap_labels ? ps->cap_labels * 2 : 8;
        struct atc_prom_label *v = realloc(ps->labels, cap * sizeof(*v));
        if (v == NULL)
            return fail(ps, "out of memory");
        ps->labels = v;
        ps->cap_labels = cap;
    }
    ps->labels[ps->nlabels++] = (struct atc_prom_label){name, name_len, value, value_len};
    return 0;
}

/* The label set after '{' up to and including '}'. A quoted string standing alone as the first item
 * is the metric name (Prometheus 3); *name must then not be set yet. */
static int labels(struct parser *ps, const char **name, size_t *name_len)
{
    bool first = true;
    for (;;) {
        const char *ln, *lv;
        size_t lnlen, lvlen;
        skip_space(ps);
        if (at(ps, '}')) {
            ps->p++;
            return 0;
        }
        if (at(ps, '"')) {
            if (quoted_name(ps, &ln, &lnlen) < 0)
                return -1;
            skip_space(ps);
            if (first && (at(ps, ',') || at(ps, '}'))) {
                if (*name != NULL)
                    return fail(ps, "a metric name both before and inside the braces");
                *name = ln;
                *name_len = lnlen;
                goto next;
            }
        } else if (plain_name(ps, false, &ln, &lnlen) < 0) {
            return -1;
        }
        skip_space(ps);
        if (!at(ps, '='))
            return fail(ps, "expected '=' after a label name");
        ps->p++;
        skip_space(ps);
        if (quoted(ps, &lv, &lvlen) < 0 || add_label(ps, ln, lnlen, lv, lvlen) < 0)
            return -1;
    next:
        first = false;
        skip_space(ps);
        if (at(ps, ','))
            ps->p++;
        else if (!at(ps, '}'))
            return fail(ps, "expected ',' or '}' in the label set");
    }
}

/* The token at the cursor (up to a space or the end of the line), copied NUL-terminated into @p buf. */
static int token(struct parser *ps, char *buf, const char *what)
{
    const char *s = ps->p;
    while (ps->p < ps->end && !is_space(*ps->p))
        ps->p++;
    size_t n = (size_t)(ps->p - s);
    if (n == 0)
        return fail(ps, what);
    if (n >= MAX_NUMBER_CHARS)
        return fail(ps, "number too long");
    memcpy(buf, s, n);
    buf[n] = '\0';
    return 0;
}

/* A float as Go's strconv.ParseFloat reads it, which is what Prometheus accepts: the usual decimal
 * forms and NaN / Inf / +Inf / -Inf in any case. */
static int parse_value(const char *s, double *v)
{
    const char *u = (*s == '+' || *s == '-') ? s + 1 : s;
    if (strcasecmp(u, "inf") == 0 || strcasecmp(u, "infinity") == 0) {
        *v = *s == '-' ? -INFINITY : INFINITY;
        return 0;
    }
    if (strcasecmp(s, "nan") == 0) {
        *v = NAN;
        return 0;
    }
    /* strtod would also take "nan(...)", "infinity" prefixes and leading spaces: only plain numbers
     * get this far. */
    for (const char *c = u; *c; c++)
        if (!((*c >= '0' && *c <= '9') || *c == '.' || *c == 'e' || *c == 'E' || *c == '+' || *c == '-' ||
              *c == 'x' || *c == 'X' || *c == 'p' || *c == 'P' || (*c >= 'a' && *c <= 'f') ||
              (*c >= 'A' && *c <= 'F')))
            return -1;
    if (*u == '\0' || !((*u >= '0' && *u <= '9') || *u == '.'))
        return -1;
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    /* ERANGE on underflow is fine (a tiny number is ~0); overflow gives ±HUGE_VAL, which is Inf. */
    return *end == '\0' ? 0 : -1;
}

static int parse_timestamp(const char *s, int64_t *ts)
{
    const char *d = *s == '-' ? s + 1 : s;
    if (*d < '0' || *d > '9')
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || errno != 0)
        return -1;
    *ts = v;
    return 0;
}

static const char *const types[] = {"counter", "gauge", "histogram",      "summary",  "untyped",
                                    "unknown", "info",  "gaugehistogram", "stateset", NULL};

/* A line starting with '#'. Returns 1 at "# EOF", 0 otherwise, -1 when a HELP or TYPE line is bad. */
static int comment(struct parser *ps)
{
    ps->p++;
    skip_space(ps);
    const char *w = ps->p;
    while (ps->p < ps->end && !is_space(*ps->p))
        ps->p++;
    size_t wlen = (size_t)(ps->p - w);
    bool help = wlen == 4 && memcmp(w, "HELP", 4) == 0, type = wlen == 4 && memcmp(w, "TYPE", 4) == 0;
    if (wlen == 3 && memcmp(w, "EOF", 3) == 0) {
        skip_space(ps);
        return ps->p == ps->end ? 1 : 0;
    }
    if (!help && !type)
        return 0; /* a plain comment */
    if (ps->p == ps->end || !is_space(*ps->p))
        return 0; /* "# HELPING ..." or a bare "# HELP": a comment too */
    skip_space(ps);
    const char *name;
    size_t len;
    if (at(ps, '"') ? quoted_name(ps, &name, &len) < 0 : plain_name(ps, true, &name, &len) < 0)
        return -1;
    if (ps->p < ps->end && !is_space(*ps->p))
        return fail(ps, "bad character in a metric name");
    if (help)
        return 0; /* the docstring is free text */
    skip_space(ps);
    const char *t = ps->p;
    while (ps->p < ps->end && !is_space(*ps->p))
        ps->p++;
    size_t tlen = (size_t)(ps->p - t);
    skip_space(ps);
    if (ps->p != ps->end)
        return fail(ps, "unexpected text after the type");
    for (const char *const *k = types; *k != NULL; k++)
        if (strlen(*k) == tlen && memcmp(*k, t, tlen) == 0)
            return 0;
    return fail(ps, "unknown metric type");
}

static int sample(struct parser *ps, atc_prom_on_sample on_sample, void *arg)
{
    struct atc_prom_sample s = {0};
    char buf[MAX_NUMBER_CHARS];

    ps->nlabels = 0;
    if (!at(ps, '{') && plain_name(ps, true, &s.name, &s.name_len) < 0)
        return -1;
    const char *after_name = ps->p;
    skip_space(ps);
    if (at(ps, '{')) {
        ps->p++;
        if (labels(ps, &s.name, &s.name_len) < 0)
            return -1;
    } else {
        ps->p = after_name; /* the spaces are the separator before the value */
    }
    if (s.name == NULL)
        return fail(ps, "expected a metric name");
    if (ps->p == ps->end || !is_space(*ps->p))
        return fail(ps, ps->p == ps->end ? "missing value" : "expected a space before the value");
    skip_space(ps);
    if (token(ps, buf, "missing value") < 0)
        return -1;
    if (parse_value(buf, &s.value) < 0)
        return fail(ps, "bad value");
    skip_space(ps);
    if (ps->p < ps->end) {
        if (token(ps, buf, "missing timestamp") < 0)
            return -1;
        if (parse_timestamp(buf, &s.timestamp_ms) < 0)
            return fail(ps, "bad timestamp");
        s.has_timestamp = true;
        skip_space(ps);
        if (ps->p != ps->end)
            return fail(ps, "unexpected text after the timestamp");
    }
    s.labels = ps->labels;
    s.nlabels = ps->nlabels;
    ps->stop = on_sample(arg, &s);
    return 0;
}

int atc_prom_parse(const char *text, size_t len, atc_prom_on_sample on_sample, void *arg,
                   struct atc_prom_error *err)
{
    struct parser ps = {0};
    const char *p = text, *end = text + len;
    size_t line = 0;
    int rc = 0;

    while (p < end && rc == 0 && ps.stop == 0) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl != NULL ? nl : end;
        line++;
        ps.p = p;
        ps.end = eol > p && eol[-1] == '\r' ? eol - 1 : eol;
        p = nl != NULL ? nl + 1 : end;
        if (memchr(ps.p, '\0', (size_t)(ps.end - ps.p)) != NULL) {
            rc = fail(&ps, "NUL byte");
            break;
        }
        /* Unescaped strings are never longer than the line: size the scratch space once for it. */
        size_t need = (size_t)(ps.end - ps.p) + 1;
        if (need > ps.scratch_cap) {
            char *s = realloc(ps.scratch, need);
            if (s == NULL) {
                rc = fail(&ps, "out of memory");
                break;
            }
            ps.scratch = s;
            ps.scratch_cap = need;
        }
        ps.scratch_len = 0;
        skip_space(&ps);
        if (ps.p == ps.end)
            continue;
        if (*ps.p == '#') {
            int c = comment(&ps);
            if (c == 1)
                break;
            rc = c;
            continue;
        }
        rc = sample(&ps, on_sample, arg);
    }
    if (rc == -1 && err != NULL) {
        err->line = line;
        err->msg = ps.err != NULL ? ps.err : "malformed";
    }
    free(ps.scratch);
    free(ps.labels);
    return rc != 0 ? rc : ps.stop;
}

bool atc_prom_label_is(const struct atc_prom_sample *s, const char *name, const char *value)
{
    size_t nlen = strlen(name), vlen = strlen(value);
    for (size_t i = 0; i < s->nlabels; i++) {
        const struct atc_prom_label *l = &s->labels[i];
        if (l->name_len == nlen && memcmp(l->name, name, nlen) == 0)
            return l->value_len == vlen && memcmp(l->value, value, vlen) == 0;
    }
    return false;
}

bool atc_prom_name_is(const struct atc_prom_sample *s, const char *name)
{
    size_t n = strlen(name);
    return s->name_len == n && memcmp(s->name, name, n) == 0;
}
