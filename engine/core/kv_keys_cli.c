/* `atc kv-keys` (kv_keys_cli.h). */

#include "core/kv_keys_cli.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request/kv_keys.h"

static const char usage[] =
    "usage: atc kv-keys [--hash sha256_cbor|xxhash_cbor|sglang] [--block-size N] [--seed S] [--signed]\n"
    "                   [TOKENS...]\n"
    "\n"
    "Prints the block keys an engine publishes in its KV-cache events for a prompt of these token ids\n"
    "(or, with no TOKENS, the ids read from stdin, separated by spaces, commas or newlines): one line\n"
    "per full block, an unsigned 64-bit decimal (--signed: as SGLang prints it, a signed one).\n"
    "  --hash H         the engine's --prefix-caching-hash-algo (vLLM) or sglang (default sha256_cbor)\n"
    "  --block-size N   tokens per block: vLLM's --block-size, SGLang's --page-size (default 16)\n"
    "  --seed S         the engine's PYTHONHASHSEED (default 0; sglang has none)\n"
    "Get the token ids from the engine itself: POST /tokenize {\"model\": ..., \"prompt\": ...}.\n";

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    if (s[0] == '-' || s[0] == '\0')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Appends token @p t to *toks, growing it. Returns 0, or -1 out of memory. */
static int push(uint32_t **toks, size_t *n, size_t *cap, uint32_t t)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        uint32_t *p = realloc(*toks, c * sizeof *p);
        if (p == NULL)
            return -1;
        *toks = p;
        *cap = c;
    }
    (*toks)[(*n)++] = t;
    return 0;
}

int atc_kv_keys_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"hash", required_argument, NULL, 'H'}, {"block-size", required_argument, NULL, 'b'},
        {"seed", required_argument, NULL, 's'}, {"signed", no_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0},
    };
    enum atc_kv_hash hash = ATC_KV_HASH_SHA256_CBOR;
    uint64_t block = 16, seed = 0;
    int sign = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'H':
            if (atc_kv_hash_parse(optarg, &hash) != 0) {
                fprintf(stderr, "atc kv-keys: --hash: '%s' is not sha256_cbor, xxhash_cbor or sglang\n",
                        optarg);
                return 2;
            }
            break;
        case 'b':
            if (parse_u64(optarg, 65536, &block) != 0 || block == 0) {
                fprintf(stderr, "atc kv-keys: --block-size: '%s' is not a number in 1..65536\n", optarg);
                return 2;
            }
            break;
        case 's':
            if (parse_u64(optarg, UINT64_MAX, &seed) != 0) {
                fprintf(stderr, "atc kv-keys: --seed: '%s' is not an unsigned integer\n", optarg);
                return 2;
            }
            break;
        case 'S':
            sign = 1;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    uint32_t *toks = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    if (optind < argc) {
        for (int i = optind; i < argc && rc == 0; i++) {
            uint64_t t;
            if (parse_u64(argv[i], UINT32_MAX, &t) != 0) {
                fprintf(stderr, "atc kv-keys: '%s' is not a token id (0..4294967295)\n", argv[i]);
                rc = 2;
            } else if (push(&toks, &n, &cap, (uint32_t)t) != 0) {
                rc = 1;
            }
        }
    } else {
        char word[32];
        size_t w = 0;
        for (int ch = getchar();; ch = getchar()) {
            if (ch == EOF || ch == ' ' || ch == ',' || ch == '\n' || ch == '\t' || ch == '\r' || ch == '[' ||
                ch == ']') {
                uint64_t t;
                word[w] = '\0';
                if (w > 0 &&
                    (parse_u64(word, UINT32_MAX, &t) != 0 || push(&toks, &n, &cap, (uint32_t)t) != 0)) {
                    fprintf(stderr, "atc kv-keys: '%s' is not a token id (0..4294967295)\n", word);
                    rc = 2;
                    break;
                }
                w = 0;
                if (ch == EOF)
                    break;
            } else if (w < sizeof word - 1) {
                word[w++] = (char)ch;
            } else {
                fputs("atc kv-keys: a token id too long on stdin\n", stderr);
                rc = 2;
                break;
            }
        }
    }
    struct atc_kv_keyer k;
    if (rc == 0 && atc_kv_keyer_init(&k, hash, (uint32_t)block, seed) == 0) {
        size_t nb = n / block;
        uint64_t *keys = nb > 0 ? malloc(nb * sizeof *keys) : NULL;
        if (nb > 0 && keys == NULL) {
            rc = 1;
        } else {
            nb = atc_kv_keys(&k, toks, n, keys, nb);
            for (size_t i = 0; i < nb; i++) {
                if (sign)
                    printf("%" PRId64 "\n", (int64_t)keys[i]);
                else
                    printf("%" PRIu64 "\n", keys[i]);
            }
        }
        free(keys);
    }
    free(toks);
    return rc;
}
