#ifndef ATC_DNS_MESSAGE_H
#define ATC_DNS_MESSAGE_H

/* DNS messages (RFC 1035; SRV records, RFC 2782), for `discover: {srv: ...}` (core/dns_query.c asks,
 * core/discovery.c uses the answer).
 *
 * Hand-written, and small on purpose: libevent's evdns (which resolves `discover: {dns: ...}`) can ask
 * only for A, AAAA and PTR records, it has no query of another type, and libc's res_query blocks the
 * thread it runs on, which is the main loop. Only what one question and its answer need: a query with an
 * EDNS0 record (so that an answer may be up to ATC_DNS_UDP_SIZE bytes), and a reader of the answer that
 * trusts nothing in it: every length is checked against the message's end, a compression pointer must
 * point before the labels it ends (so a chain of them only goes back: no loop) and at most
 * ATC_DNS_JUMPS_MAX of them are followed in one name, a name is at most 255
 * bytes on the wire (RFC 1035 2.3.4), and records past the caps below are counted and dropped. No
 * allocation; pure functions, so the fuzz target (tests/fuzz/fuzz_dns.c) reaches all of it. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ATC_DNS_TYPE_A 1
#define ATC_DNS_TYPE_CNAME 5
#define ATC_DNS_TYPE_AAAA 28
#define ATC_DNS_TYPE_SRV 33

#define ATC_DNS_NAME_MAX 254  /* a name as text (no final dot, at most 253 bytes) and its NUL */
#define ATC_DNS_QUERY_MAX 300 /* header, the longest question and the EDNS0 record: 12 + 259 + 11 */
#define ATC_DNS_UDP_SIZE 4096 /* the answer size the query's EDNS0 record offers to take */
#define ATC_DNS_JUMPS_MAX 64  /* compression pointers followed in one name */
#define ATC_DNS_SRV_MAX 128   /* SRV records kept of one answer */
#define ATC_DNS_ADDRS_MAX 256 /* A and AAAA records kept of one answer */

/* The response codes a caller branches on (the rest: atc_dns_rcode_text). */
#define ATC_DNS_RCODE_NOERROR 0
#define ATC_DNS_RCODE_NXDOMAIN 3

struct atc_dns_srv {
    uint16_t priority, weight, port;
    char target[ATC_DNS_NAME_MAX]; /* lower case, no final dot; "" is the root ("."): no such service */
};

/* An A or AAAA record of any section (the additional section carries SRV targets' addresses). */
struct atc_dns_addr {
    char name[ATC_DNS_NAME_MAX]; /* its owner, lower case */
    uint8_t len;                 /* 4 (A) or 16 (AAAA) */
    uint8_t addr[16];            /* network order */
};

/* What atc_dns_answer_parse reads of a response. Large (about 100 KiB): allocate it. */
struct atc_dns_answer {
    uint16_t id;
    uint8_t rcode;                /* ATC_DNS_RCODE_* */
    bool truncated;               /* TC: the records did not fit; they are then not read */
    char qname[ATC_DNS_NAME_MAX]; /* the question, as the query's own (lower case); "" when none */
    uint16_t qtype;
    struct atc_dns_srv srv[ATC_DNS_SRV_MAX]; /* the answer section's SRV records of qname (or of the
                                              * name a CNAME there leads to from it), in order */
    size_t nsrv, srv_dropped;
    struct atc_dns_addr addrs[ATC_DNS_ADDRS_MAX];
    size_t naddrs, addrs_dropped;
};

/** Writes a query (recursion desired) with id @p id for the records of type @p qtype of @p name, and an
 * EDNS0 record offering ATC_DNS_UDP_SIZE, into @p buf (ATC_DNS_QUERY_MAX bytes). @p name is text: labels
 * of 1 to 63 letters, digits, '-' or '_' joined by dots, at most 253 bytes, an optional final dot (the
 * name is always asked as written: no search domains). Returns the query's length, or -1 with a fixed
 * message in *err when @p name is not such a name. */
int atc_dns_query_encode(uint8_t *buf, uint16_t id, const char *name, uint16_t qtype, const char **err);

/** 0 when atc_dns_query_encode takes @p name; -1 with its reason in *err (for the config's checks). */
int atc_dns_name_check(const char *name, const char **err);

/** Reads response @p msg of @p len bytes into @p out (which it overwrites). A response with a bad rcode
 * or TC is read as far as its header and question. The caller compares out->id, out->qname and
 * out->qtype with what it asked, then out->rcode and out->truncated. Returns 0, or -1 with a fixed
 * message ("malformed answer: ...") in *err for anything that is not a well-formed DNS response. Never
 * reads outside [msg, msg + len). */
int atc_dns_answer_parse(const uint8_t *msg, size_t len, struct atc_dns_answer *out, const char **err);

/** A fixed text for response code @p rcode: "server failure (SERVFAIL)", "no such name (NXDOMAIN)", ... */
const char *atc_dns_rcode_text(unsigned rcode);

#endif
