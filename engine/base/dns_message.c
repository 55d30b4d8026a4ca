/* DNS queries and answers (dns_message.h): why this is hand-written, and what it checks, is there. */

#include "base/dns_message.h"

#include <string.h>

#define HEADER 12
#define CLASS_IN 1
#define TYPE_OPT 41
#define FLAG_QR 0x8000
#define FLAG_TC 0x0200
#define FLAG_RD 0x0100
#define WIRE_NAME_MAX 255 /* RFC 1035 2.3.4: labels, their length bytes and the final zero */

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint8_t *put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
    return p + 2;
}

static int fail(const char **err, const char *why)
{
    *err = why;
    return -1;
}

/* The name written from @p off as text into @p out (lower case, dots between labels, "" for the root).
 * *next: the offset just after the name where it is written (after its first pointer, if any). Labels
 * may hold only printable ASCII other than '.' and '\\', so the text means what the wire does. */
static int read_name(const uint8_t *msg, size_t len, size_t off, char *out, size_t *next, const char **err)
{
    size_t pos = off, run = off, wire = 1, o = 0;
    unsigned jumps = 0;
    bool jumped = false;

    for (;;) {
        if (pos >= len)
            return fail(err, "malformed answer: a name runs past the end");
        uint8_t l = msg[pos];
        if ((l & 0xC0) == 0xC0) {
            if (pos + 1 >= len)
                return fail(err, "malformed answer: a name's pointer runs past the end");
            size_t to = (size_t)get16(msg + pos) & 0x3FFF;
            if (to >= run) /* only back, before these labels: a chain of pointers cannot go round */
                return fail(err, "malformed answer: a name's pointer does not point back");
            if (++jumps > ATC_DNS_JUMPS_MAX)
                return fail(err, "malformed answer: too many pointers in a name");
            if (!jumped)
                *next = pos + 2;
            jumped = true;
            pos = run = to;
            continue;
        }
        if (l & 0xC0)
            return fail(err, "malformed answer: a label of an unknown type");
        if (l == 0)
            break;
        if (l > len - pos - 1)
            return fail(err, "malformed answer: a label runs past the end");
        if ((wire += 1u + l) > WIRE_NAME_MAX)
            return fail(err, "malformed answer: a name longer than 255 bytes");
        if (o > 0)
            out[o++] = '.';
        for (size_t i = 1; i <= l; i++) {
            uint8_t c = msg[pos + i];
            if (c <= ' ' || c >= 0x7F || c == '.' || c == '\\')
                return fail(err, "malformed answer: a name with a byte that is not printable, or a dot");
            out[o++] = (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
        }
        pos += 1u + l;
    }
    out[o] = '\0'; /* o <= wire - 2 <= 253 */
    if (!jumped)
        *next = pos + 1;
    return 0;
}

int atc_dns_query_encode(uint8_t *buf, uint16_t id, const char *name, uint16_t qtype, const char **err)
{
    size_t n = strlen(name);
    if (n > 0 && name[n - 1] == '.')
        n--;
    if (n == 0)
        return fail(err, "an empty name");
    if (n > ATC_DNS_NAME_MAX - 1)
        return fail(err, "a name longer than 253 bytes");
    uint8_t *p = put16(buf, id);
    p = put16(p, FLAG_RD);
    p = put16(p, 1); /* one question */
    p = put16(p, 0);
    p = put16(p, 0);
    p = put16(p, 1); /* the EDNS0 record */
    for (size_t i = 0;; i++) { /* i: the start of a label; after it, a dot or the end */
        size_t l = 0;
        while (i + l < n && name[i + l] != '.') {
            char c = name[i + l];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                  c == '_'))
                return fail(err, "a name of letters, digits, '-' and '_' between dots");
            l++;
        }
        if (l == 0)
            return fail(err, "an empty label (two dots in a row, or a leading dot)");
        if (l > 63)
            return fail(err, "a label longer than 63 bytes");
        *p++ = (uint8_t)l;
        memcpy(p, name + i, l);
        p += l;
        if ((i += l) == n)
            break;
    }
    *p++ = 0;
    p = put16(p, qtype);
    p = put16(p, CLASS_IN);
    *p++ = 0; /* OPT (RFC 6891): the root's, class = the UDP size we take, TTL 0, no options */
    p = put16(p, TYPE_OPT);
    p = put16(p, ATC_DNS_UDP_SIZE);
    p = put16(p, 0);
    p = put16(p, 0);
    p = put16(p, 0);
    return (int)(p - buf);
}

int atc_dns_name_check(const char *name, const char **err)
{
    uint8_t buf[ATC_DNS_QUERY_MAX];
    return atc_dns_query_encode(buf, 0, name, ATC_DNS_TYPE_SRV, err) < 0 ? -1 : 0;
}

/* One resource record of @p a's answer, authority or additional section. */
static int read_record(const uint8_t *msg, size_t len, size_t *pos, unsigned section, char *alias,
                       struct atc_dns_answer *a, const char **err)
{
    char owner[ATC_DNS_NAME_MAX];
    size_t at;
    if (read_name(msg, len, *pos, owner, &at, err) < 0)
        return -1;
    if (len - at < 10)
        return fail(err, "malformed answer: a record runs past the end");
    uint16_t type = get16(msg + at), class = get16(msg + at + 2), rdlen = get16(msg + at + 8);
    size_t rd = at + 10;
    if (rdlen > len - rd)
        return fail(err, "malformed answer: a record's data runs past the end");
    *pos = rd + rdlen;
    if (class != CLASS_IN || type == TYPE_OPT)
        return 0;
    if (type == ATC_DNS_TYPE_A || type == ATC_DNS_TYPE_AAAA) {
        uint8_t want = type == ATC_DNS_TYPE_A ? 4 : 16;
        if (rdlen != want)
            return fail(err, "malformed answer: an address record of the wrong length");
        if (a->naddrs == ATC_DNS_ADDRS_MAX) {
            a->addrs_dropped++;
            return 0;
        }
        struct atc_dns_addr *d = &a->addrs[a->naddrs++];
        memcpy(d->name, owner, sizeof(owner));
        d->len = want;
        memcpy(d->addr, msg + rd, want);
        return 0;
    }
    if (section != 0 || (type != ATC_DNS_TYPE_SRV && type != ATC_DNS_TYPE_CNAME))
        return 0;
    char target[ATC_DNS_NAME_MAX];
    size_t end;
    size_t name_at = rd + (type == ATC_DNS_TYPE_SRV ? 6 : 0);
    if (rdlen < name_at - rd + 1)
        return fail(err, "malformed answer: an SRV record shorter than its fields");
    if (read_name(msg, rd + rdlen, name_at, target, &end, err) < 0) /* within the record's data */
        return -1;
    if (end != rd + rdlen)
        return fail(err, "malformed answer: a record's name does not fill its data");
    if (strcmp(owner, alias) != 0)
        return 0; /* about another name */
    if (type == ATC_DNS_TYPE_CNAME) {
        memcpy(alias, target, sizeof(target));
        return 0;
    }
    if (a->nsrv == ATC_DNS_SRV_MAX) {
        a->srv_dropped++;
        return 0;
    }
    struct atc_dns_srv *s = &a->srv[a->nsrv++];
    s->priority = get16(msg + rd);
    s->weight = get16(msg + rd + 2);
    s->port = get16(msg + rd + 4);
    memcpy(s->target, target, sizeof(target));
    return 0;
}

int atc_dns_answer_parse(const uint8_t *msg, size_t len, struct atc_dns_answer *a, const char **err)
{
    a->id = 0;
    a->rcode = 0;
    a->truncated = false;
    a->qname[0] = '\0';
    a->qtype = 0;
    a->nsrv = a->srv_dropped = a->naddrs = a->addrs_dropped = 0;
    *err = NULL;
    if (len < HEADER)
        return fail(err, "malformed answer: shorter than a header");
    uint16_t flags = get16(msg + 2), qd = get16(msg + 4);
    unsigned counts[3] = {get16(msg + 6), get16(msg + 8), get16(msg + 10)};
    a->id = get16(msg);
    a->rcode = flags & 0xF;
    a->truncated = (flags & FLAG_TC) != 0;
    if (!(flags & FLAG_QR) || ((flags >> 11) & 0xF) != 0)
        return fail(err, "malformed answer: not a response to a standard query");
    if (qd > 1)
        return fail(err, "malformed answer: more than one question");
    size_t pos = HEADER;
    if (qd == 1) {
        if (read_name(msg, len, pos, a->qname, &pos, err) < 0)
            return -1;
        if (len - pos < 4)
            return fail(err, "malformed answer: the question runs past the end");
        a->qtype = get16(msg + pos);
        pos += 4;
    }
    if (a->rcode != ATC_DNS_RCODE_NOERROR || a->truncated)
        return 0;
    char alias[ATC_DNS_NAME_MAX]; /* whose SRV records count: the question's name, or its CNAME's */
    memcpy(alias, a->qname, sizeof(alias));
    for (unsigned s = 0; s < 3; s++)
        for (unsigned i = 0; i < counts[s]; i++) /* each record takes 11 bytes or more: pos grows */
            if (read_record(msg, len, &pos, s, alias, a, err) < 0)
                return -1;
    return 0;
}

const char *atc_dns_rcode_text(unsigned rcode)
{
    switch (rcode) {
    case 0:
        return "no error";
    case 1:
        return "format error (FORMERR)";
    case 2:
        return "server failure (SERVFAIL)";
    case 3:
        return "no such name (NXDOMAIN)";
    case 4:
        return "not implemented (NOTIMP)";
    case 5:
        return "refused (REFUSED)";
    default:
        return "an error response";
    }
}
