/* atc_dns_answer_parse over any bytes: an answer to discover: srv:'s SRV query, as the nameserver (or
 * anyone who can reach atc's UDP port) sends it.
 *
 * Besides not crashing or reading outside the message (it is copied into a buffer of exactly its size): a
 * failure says why; a success keeps within the caps, and every name it reports is one a query could
 * carry back (labels of printable bytes, no empty label, at most 253 bytes); a response with an error code
 * or TC reports no records. The question's name, when atc_dns_query_encode takes it, comes back the same
 * from a query written for it and read as an answer. The input as a name goes through the encoder too. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fuzz.h"
#include "base/dns_message.h"

static void check_name(const char *name, bool may_be_root)
{
    size_t n = strnlen(name, ATC_DNS_NAME_MAX);
    CHECK(n < ATC_DNS_NAME_MAX);
    CHECK(n > 0 || may_be_root);
    if (n == 0)
        return;
    CHECK(name[0] != '.' && name[n - 1] != '.' && strstr(name, "..") == NULL);
    for (size_t i = 0; i < n; i++)
        CHECK(name[i] > ' ' && name[i] < 0x7F && name[i] != '\\' && !(name[i] >= 'A' && name[i] <= 'Z'));
}

/* A query for @p name, read back as an answer, asks for the same name. */
static void round_trip(struct atc_dns_answer *a, const char *name, uint16_t qtype)
{
    uint8_t q[ATC_DNS_QUERY_MAX];
    const char *err = NULL;
    int n = atc_dns_query_encode(q, 0x4242, name, qtype, &err);
    if (n < 0) {
        CHECK(err != NULL);
        return;
    }
    CHECK(n <= ATC_DNS_QUERY_MAX);
    q[2] |= 0x80; /* QR: as if answered, with no records */
    CHECK(atc_dns_answer_parse(q, (size_t)n, a, &err) == 0);
    CHECK(a->id == 0x4242 && a->qtype == qtype && a->nsrv == 0 && a->naddrs == 0);
    size_t len = strlen(name) - (name[strlen(name) - 1] == '.');
    CHECK(strlen(a->qname) == len && strncasecmp(a->qname, name, len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *msg = malloc(size ? size : 1); /* exactly the message: an overread is an ASan report */
    memcpy(msg, data, size);
    struct atc_dns_answer *a = malloc(sizeof(*a));
    const char *err = NULL;
    int rc = atc_dns_answer_parse(msg, size, a, &err);
    CHECK(rc == 0 || rc == -1);
    if (rc < 0) {
        CHECK(err != NULL && strncmp(err, "malformed answer: ", 18) == 0);
    } else {
        CHECK(err == NULL);
        CHECK(a->nsrv <= ATC_DNS_SRV_MAX && a->naddrs <= ATC_DNS_ADDRS_MAX);
        if (a->truncated || a->rcode != ATC_DNS_RCODE_NOERROR)
            CHECK(a->nsrv == 0 && a->naddrs == 0 && a->srv_dropped == 0 && a->addrs_dropped == 0);
        check_name(a->qname, true);
        for (size_t i = 0; i < a->nsrv; i++)
            check_name(a->srv[i].target, true);
        for (size_t i = 0; i < a->naddrs; i++) {
            check_name(a->addrs[i].name, true);
            CHECK(a->addrs[i].len == 4 || a->addrs[i].len == 16);
        }
        if (a->qname[0] != '\0') {
            char qname[ATC_DNS_NAME_MAX];
            uint16_t qtype = a->qtype;
            memcpy(qname, a->qname, sizeof(qname));
            round_trip(a, qname, qtype);
        }
    }
    /* the input as a name (up to its first NUL) */
    char name[512];
    size_t n = size < sizeof(name) - 1 ? size : sizeof(name) - 1;
    memcpy(name, data, n);
    name[n] = '\0';
    if (name[0] != '\0')
        round_trip(a, name, ATC_DNS_TYPE_SRV);
    free(a);
    free(msg);
    return 0;
}
