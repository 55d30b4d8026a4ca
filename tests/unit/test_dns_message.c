/* dns_message.c: the SRV query atc sends, answers as DNS servers write them (Kubernetes' CoreDNS puts each
 * target's A record in the additional section), and answers that must be refused rather than misread:
 * every truncation of a good one, compression pointers that loop or run long, lengths past the end.
 * Each message under test is copied into a buffer of exactly its size, so a read past its end is an
 * ASan report in the sanitizer build. */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "base/dns_message.h"

/* ---- building messages ---- */

struct msg {
    uint8_t b[16384];
    size_t n;
};

static void u8(struct msg *m, unsigned v)
{
    assert_true(m->n < sizeof(m->b));
    m->b[m->n++] = (uint8_t)v;
}

static void u16(struct msg *m, unsigned v)
{
    u8(m, v >> 8);
    u8(m, v & 0xFF);
}

static void u32(struct msg *m, uint32_t v)
{
    u16(m, v >> 16);
    u16(m, v & 0xFFFF);
}

/* A name as labels, uncompressed ("" is the root). */
static void name(struct msg *m, const char *text)
{
    while (*text) {
        const char *dot = strchr(text, '.');
        size_t l = dot ? (size_t)(dot - text) : strlen(text);
        u8(m, (unsigned)l);
        for (size_t i = 0; i < l; i++)
            u8(m, (uint8_t)text[i]);
        text += l + (dot != NULL);
    }
    u8(m, 0);
}

static void ptr(struct msg *m, unsigned to)
{
    u16(m, 0xC000 | to);
}

static void header(struct msg *m, unsigned id, unsigned flags, unsigned qd, unsigned an, unsigned ns,
                   unsigned ar)
{
    m->n = 0;
    u16(m, id);
    u16(m, flags);
    u16(m, qd);
    u16(m, an);
    u16(m, ns);
    u16(m, ar);
}

static void question(struct msg *m, const char *q, unsigned qtype)
{
    name(m, q);
    u16(m, qtype);
    u16(m, 1);
}

/* A record's type, class IN, TTL and rdlength, after its owner. */
static void rr(struct msg *m, unsigned type, unsigned rdlen)
{
    u16(m, type);
    u16(m, 1);
    u32(m, 30);
    u16(m, rdlen);
}

/* SRV rdata with an uncompressed target. */
static void srv_rdata(struct msg *m, unsigned prio, unsigned weight, unsigned port, const char *target)
{
    size_t tl = strlen(target) ? strlen(target) + 2 : 1;
    rr(m, ATC_DNS_TYPE_SRV, 6 + (unsigned)tl);
    u16(m, prio);
    u16(m, weight);
    u16(m, port);
    name(m, target);
}

static int parse(const struct msg *m, size_t len, struct atc_dns_answer *a, const char **err)
{
    uint8_t *exact = test_malloc(len ? len : 1);
    memcpy(exact, m->b, len);
    int rc = atc_dns_answer_parse(exact, len, a, err);
    test_free(exact);
    return rc;
}

static struct atc_dns_answer *answer_new(void)
{
    struct atc_dns_answer *a = test_malloc(sizeof(*a));
    memset(a, 0xA5, sizeof(*a)); /* parse must set what it reports */
    return a;
}

#define SRV_NAME "_http._tcp.vllm.default.svc.cluster.local"

/* The answer CoreDNS gives for a headless Service's named port: two pods, their A records added. */
static void kubernetes_answer(struct msg *m)
{
    header(m, 0x1234, 0x8580, 1, 2, 0, 2);
    question(m, SRV_NAME, ATC_DNS_TYPE_SRV); /* at 12; "vllm.default..." at 12 + 11 = 23 */
    ptr(m, 12);
    srv_rdata(m, 0, 50, 8000, "10-244-1-5.vllm.default.svc.cluster.local");
    ptr(m, 12);
    /* the second target compressed: its first label, then the Service's name in the question */
    rr(m, ATC_DNS_TYPE_SRV, 6 + 12 + 2);
    u16(m, 0);
    u16(m, 50);
    u16(m, 8001);
    u8(m, 11);
    for (const char *c = "10-244-2-7X"; *c; c++) /* upper case on the wire */
        u8(m, (uint8_t)*c);
    ptr(m, 23);
    name(m, "10-244-1-5.vllm.default.svc.cluster.local");
    rr(m, ATC_DNS_TYPE_A, 4);
    u32(m, 0x0AF40105);
    name(m, "10-244-2-7X.VLLM.default.svc.cluster.local");
    rr(m, ATC_DNS_TYPE_AAAA, 16);
    for (int i = 0; i < 15; i++)
        u8(m, 0);
    u8(m, 1);
}

static void test_query_bytes(void **state)
{
    (void)state;
    uint8_t buf[ATC_DNS_QUERY_MAX];
    const char *err = NULL;
    int n = atc_dns_query_encode(buf, 0xBEEF, "_http._tcp.llm.test.", ATC_DNS_TYPE_SRV, &err);
    static const uint8_t want[] = {
        0xBE, 0xEF, 0x01, 0x00, 0,    1,   0,   0,   0,   0,   0,   1, /* header: RD, 1 q, 1 additional */
        5,    '_',  'h',  't',  't',  'p', 4,   '_', 't', 'c', 'p', 3,
        'l',  'l',  'm',  4,    't',  'e', 's', 't', 0,           /* name */
        0,    33,   0,    1,                                      /* SRV IN */
        0,    0,    41,   0x10, 0x00, 0,   0,   0,   0,   0,   0, /* OPT: 4096 bytes, no options */
    };
    assert_int_equal(n, sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));
    /* the same name without its final dot is the same query */
    uint8_t again[ATC_DNS_QUERY_MAX];
    assert_int_equal(atc_dns_query_encode(again, 0xBEEF, "_http._tcp.llm.test", ATC_DNS_TYPE_SRV, &err), n);
    assert_memory_equal(buf, again, (size_t)n);
    /* the longest name fits the buffer: 253 bytes, labels of 63, 63, 63, 59 and 1 */
    char longest[254];
    memset(longest, 'a', 253);
    longest[63] = longest[127] = longest[191] = longest[251] = '.';
    longest[253] = '\0';
    n = atc_dns_query_encode(buf, 1, longest, ATC_DNS_TYPE_SRV, &err);
    assert_int_equal(n, 12 + 255 + 4 + 11);
    assert_true(n <= ATC_DNS_QUERY_MAX);
}

static void test_bad_names(void **state)
{
    (void)state;
    char label64[80], long254[260];
    memset(label64, 'a', 64);
    strcpy(label64 + 64, ".test");
    memset(long254, 'a', 254);
    for (int i = 50; i < 254; i += 50)
        long254[i] = '.';
    long254[254] = '\0';
    const char *bad[] = {"",         ".",           "a..b", "a.b..", ".a.b",
                         "a b.test", "a.b\xc3\xa9", "a/b",  label64, long254};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *err = NULL;
        assert_int_equal(atc_dns_name_check(bad[i], &err), -1);
        assert_non_null(err);
    }
    const char *err = NULL;
    assert_int_equal(atc_dns_name_check(SRV_NAME, &err), 0);
    assert_int_equal(atc_dns_name_check("a-b_c.D9.", &err), 0);
}

static void test_kubernetes_answer(void **state)
{
    (void)state;
    struct msg m;
    kubernetes_answer(&m);
    struct atc_dns_answer *a = answer_new();
    const char *err = NULL;
    assert_int_equal(parse(&m, m.n, a, &err), 0);
    assert_null(err);
    assert_int_equal(a->id, 0x1234);
    assert_int_equal(a->rcode, ATC_DNS_RCODE_NOERROR);
    assert_false(a->truncated);
    assert_string_equal(a->qname, SRV_NAME);
    assert_int_equal(a->qtype, ATC_DNS_TYPE_SRV);
    assert_int_equal(a->nsrv, 2);
    assert_int_equal(a->srv_dropped, 0);
    assert_int_equal(a->srv[0].port, 8000);
    assert_int_equal(a->srv[0].weight, 50);
    assert_string_equal(a->srv[0].target, "10-244-1-5.vllm.default.svc.cluster.local");
    assert_int_equal(a->srv[1].port, 8001);
    assert_string_equal(a->srv[1].target, "10-244-2-7x.vllm.default.svc.cluster.local");
    assert_int_equal(a->naddrs, 2);
    assert_string_equal(a->addrs[0].name, "10-244-1-5.vllm.default.svc.cluster.local");
    assert_int_equal(a->addrs[0].len, 4);
    assert_memory_equal(a->addrs[0].addr, "\x0a\xf4\x01\x05", 4);
    assert_string_equal(a->addrs[1].name, "10-244-2-7x.vllm.default.svc.cluster.local"); /* lower case */
    assert_int_equal(a->addrs[1].len, 16);
    assert_int_equal(a->addrs[1].addr[15], 1);
    test_free(a);
}

/* A CNAME leads from the question to the name whose SRV records count; others' do not. "." is kept
 * as "" (no service there), and records of other classes and an OPT record are skipped. */
static void test_cname_root_target_and_other_records(void **state)
{
    (void)state;
    struct msg m;
    header(&m, 7, 0x8180, 1, 4, 0, 1);
    question(&m, "_x._tcp.a.test", ATC_DNS_TYPE_SRV);
    ptr(&m, 12);
    rr(&m, ATC_DNS_TYPE_CNAME, 8);
    name(&m, "b.test");
    name(&m, "c.test"); /* not the question's: ignored */
    srv_rdata(&m, 1, 1, 9, "nope.test");
    name(&m, "b.test");
    srv_rdata(&m, 1, 1, 80, "");
    name(&m, "b.test");
    u16(&m, ATC_DNS_TYPE_SRV);
    u16(&m, 3); /* class CH */
    u32(&m, 0);
    u16(&m, 0);
    name(&m, ""); /* OPT */
    u16(&m, 41);
    u16(&m, 4096);
    u32(&m, 0);
    u16(&m, 0);
    struct atc_dns_answer *a = answer_new();
    const char *err = NULL;
    assert_int_equal(parse(&m, m.n, a, &err), 0);
    assert_int_equal(a->nsrv, 1);
    assert_string_equal(a->srv[0].target, "");
    assert_int_equal(a->srv[0].port, 80);
    assert_int_equal(a->naddrs, 0);
    test_free(a);
}

static void test_rcode_and_tc_read_no_records(void **state)
{
    (void)state;
    struct msg m;
    struct atc_dns_answer *a = answer_new();
    const char *err = NULL;
    header(&m, 9, 0x8183, 1, 0, 0, 0); /* NXDOMAIN */
    question(&m, "x.test", ATC_DNS_TYPE_SRV);
    assert_int_equal(parse(&m, m.n, a, &err), 0);
    assert_int_equal(a->rcode, ATC_DNS_RCODE_NXDOMAIN);
    assert_string_equal(atc_dns_rcode_text(a->rcode), "no such name (NXDOMAIN)");
    header(&m, 9, 0x8182, 0, 0, 0, 0); /* SERVFAIL without the question */
    assert_int_equal(parse(&m, m.n, a, &err), 0);
    assert_int_equal(a->rcode, 2);
    assert_string_equal(a->qname, "");
    /* TC: the counts promise records the message does not hold; they are not read */
    header(&m, 9, 0x8380, 1, 50, 0, 0);
    question(&m, "x.test", ATC_DNS_TYPE_SRV);
    assert_int_equal(parse(&m, m.n, a, &err), 0);
    assert_true(a->truncated);
    assert_int_equal(a->nsrv, 0);
    test_free(a);
}

/* No prefix of a good answer parses: each one cuts a record the counts promise. */
static void test_every_truncation_fails(void **state)
{
    (void)state;
    struct msg m;
    kubernetes_answer(&m);
    struct atc_dns_answer *a = answer_new();
    for (size_t len = 0; len < m.n; len++) {
        const char *err = NULL;
        if (parse(&m, len, a, &err) != -1)
            fail_msg("a prefix of %zu of %zu bytes parsed", len, m.n);
        assert_non_null(err);
        assert_true(strncmp(err, "malformed answer: ", 18) == 0);
    }
    test_free(a);
}

static void expect_malformed(const struct msg *m, const char *why)
{
    struct atc_dns_answer *a = answer_new();
    const char *err = NULL;
    assert_int_equal(parse(m, m->n, a, &err), -1);
    assert_non_null(err);
    if (strstr(err, why) == NULL)
        fail_msg("expected '%s', got '%s'", why, err);
    test_free(a);
}

static void test_hostile_names(void **state)
{
    (void)state;
    struct msg m;

    /* the question's name is a pointer to itself */
    header(&m, 1, 0x8180, 1, 0, 0, 0);
    ptr(&m, 12);
    u16(&m, 33);
    u16(&m, 1);
    expect_malformed(&m, "does not point back");

    /* a label, then a pointer back to that label: a loop through a pointer that does point back */
    header(&m, 1, 0x8180, 1, 1, 0, 0);
    question(&m, "a.test", 33);
    u8(&m, 1);
    u8(&m, 'x');
    ptr(&m, (unsigned)m.n - 2);
    rr(&m, 1, 4);
    u32(&m, 0);
    expect_malformed(&m, "does not point back");

    /* two names pointing at each other */
    header(&m, 1, 0x8180, 1, 2, 0, 0);
    question(&m, "a.test", 33);
    size_t first = m.n;
    ptr(&m, (unsigned)first + 2 + 10 + 4); /* forward, to the second record's owner */
    rr(&m, 1, 4);
    u32(&m, 0);
    ptr(&m, (unsigned)first);
    rr(&m, 1, 4);
    u32(&m, 0);
    expect_malformed(&m, "does not point back");

    /* a chain of 70 pointers, each to the one before: every one points back, the chain is too long. The
     * chain is the data of a record of an unknown type; the next record's owner points at its end. */
    header(&m, 1, 0x8180, 1, 2, 0, 0);
    question(&m, "a.test", 33);
    u8(&m, 0);
    rr(&m, 99, 140);
    size_t chain = m.n;
    ptr(&m, 12);
    for (unsigned i = 1; i < 70; i++)
        ptr(&m, (unsigned)chain + 2 * (i - 1));
    ptr(&m, (unsigned)chain + 2 * 69);
    rr(&m, 1, 4);
    u32(&m, 0);
    expect_malformed(&m, "too many pointers");

    /* a name of more than 255 bytes: labels of 63, each followed by a pointer to the one before */
    header(&m, 1, 0x8180, 1, 2, 0, 0);
    question(&m, "a.test", 33);
    u8(&m, 0);
    rr(&m, 99, 4 * 66);
    size_t labels = m.n;
    for (unsigned i = 0; i < 4; i++) {
        u8(&m, 63);
        for (int j = 0; j < 63; j++)
            u8(&m, 'a');
        if (i == 0) {
            u8(&m, 0); /* the end of the name, and a byte to keep 66 per entry */
            u8(&m, 0);
        } else {
            ptr(&m, (unsigned)labels + 66 * (i - 1));
        }
    }
    ptr(&m, (unsigned)labels + 66 * 3);
    rr(&m, 1, 4);
    u32(&m, 0);
    expect_malformed(&m, "longer than 255 bytes");

    /* a label whose length runs past the end */
    header(&m, 1, 0x8180, 1, 0, 0, 0);
    u8(&m, 40);
    u8(&m, 'a');
    expect_malformed(&m, "runs past the end");

    /* a pointer past the end of the message */
    header(&m, 1, 0x8180, 1, 0, 0, 0);
    ptr(&m, 0x3FFF);
    expect_malformed(&m, "does not point back");

    /* labels of the reserved types 01 and 10 */
    header(&m, 1, 0x8180, 1, 0, 0, 0);
    u8(&m, 0x41);
    u8(&m, 0);
    expect_malformed(&m, "unknown type");

    /* bytes a name cannot carry as text */
    header(&m, 1, 0x8180, 1, 0, 0, 0);
    question(&m, "a\x01.test", 33);
    expect_malformed(&m, "not printable");
    header(&m, 1, 0x8180, 1, 0, 0, 0);
    u8(&m, 3);
    u8(&m, 'a');
    u8(&m, '.');
    u8(&m, 'b');
    u8(&m, 0);
    u16(&m, 33);
    u16(&m, 1);
    expect_malformed(&m, "a dot");
}

static void test_hostile_records(void **state)
{
    (void)state;
    struct msg m;

    header(&m, 1, 0x8180, 1, 1, 0, 0); /* rdlength past the end */
    question(&m, "a.test", 33);
    ptr(&m, 12);
    rr(&m, 33, 400);
    u16(&m, 0);
    expect_malformed(&m, "data runs past the end");

    header(&m, 1, 0x8180, 1, 1, 0, 0); /* an A record of 5 bytes */
    question(&m, "a.test", 33);
    ptr(&m, 12);
    rr(&m, 1, 5);
    u32(&m, 0);
    u8(&m, 0);
    expect_malformed(&m, "wrong length");

    header(&m, 1, 0x8180, 1, 1, 0, 0); /* an SRV record of 5 bytes */
    question(&m, "a.test", 33);
    ptr(&m, 12);
    rr(&m, 33, 5);
    u32(&m, 0);
    u8(&m, 0);
    expect_malformed(&m, "shorter than its fields");

    header(&m, 1, 0x8180, 1, 1, 0, 0); /* an SRV target that runs past its record's data */
    question(&m, "a.test", 33);
    ptr(&m, 12);
    rr(&m, 33, 8);
    u16(&m, 0);
    u16(&m, 0);
    u16(&m, 80);
    name(&m, "abc.test");
    expect_malformed(&m, "runs past the end");

    header(&m, 1, 0x8180, 1, 1, 0, 0); /* an SRV target shorter than its record's data */
    question(&m, "a.test", 33);
    ptr(&m, 12);
    rr(&m, 33, 6 + 2 + 3);
    u16(&m, 0);
    u16(&m, 0);
    u16(&m, 80);
    ptr(&m, 12);
    for (int i = 0; i < 3; i++)
        u8(&m, 0);
    expect_malformed(&m, "does not fill its data");

    header(&m, 1, 0x0180, 1, 0, 0, 0); /* a query, not a response */
    question(&m, "a.test", 33);
    expect_malformed(&m, "not a response");
    header(&m, 1, 0x8980, 1, 0, 0, 0); /* opcode 1 */
    question(&m, "a.test", 33);
    expect_malformed(&m, "not a response");
    header(&m, 1, 0x8180, 2, 0, 0, 0);
    question(&m, "a.test", 33);
    question(&m, "b.test", 33);
    expect_malformed(&m, "more than one question");
    header(&m, 1, 0x8180, 1, 0, 0, 0);
    m.n = 11;
    expect_malformed(&m, "shorter than a header");
}

/* More records than kept: the first ones, and the rest counted. */
static void test_caps(void **state)
{
    (void)state;
    struct msg m;
    header(&m, 1, 0x8180, 1, 200, 0, 300);
    question(&m, "a.test", 33);
    for (unsigned i = 0; i < 200; i++) {
        ptr(&m, 12);
        srv_rdata(&m, 0, 0, 1000 + i, "");
    }
    for (unsigned i = 0; i < 300; i++) {
        ptr(&m, 12);
        rr(&m, 1, 4);
        u32(&m, i);
    }
    struct atc_dns_answer *a = answer_new();
    const char *err = NULL;
    assert_int_equal(parse(&m, m.n, a, &err), 0);
    assert_int_equal(a->nsrv, ATC_DNS_SRV_MAX);
    assert_int_equal(a->srv_dropped, 200 - ATC_DNS_SRV_MAX);
    assert_int_equal(a->srv[ATC_DNS_SRV_MAX - 1].port, 1000 + ATC_DNS_SRV_MAX - 1);
    assert_int_equal(a->naddrs, ATC_DNS_ADDRS_MAX);
    assert_int_equal(a->addrs_dropped, 300 - ATC_DNS_ADDRS_MAX);
    test_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_query_bytes),
        cmocka_unit_test(test_bad_names),
        cmocka_unit_test(test_kubernetes_answer),
        cmocka_unit_test(test_cname_root_target_and_other_records),
        cmocka_unit_test(test_rcode_and_tc_read_no_records),
        cmocka_unit_test(test_every_truncation_fails),
        cmocka_unit_test(test_hostile_names),
        cmocka_unit_test(test_hostile_records),
        cmocka_unit_test(test_caps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
