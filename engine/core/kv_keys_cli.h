#ifndef ATC_KV_KEYS_CLI_H
#define ATC_KV_KEYS_CLI_H

/** `atc kv-keys [--hash H] [--block-size N] [--seed S] TOKENS...`: prints the block keys an engine
 * would publish for that token list (request/kv_keys.h), one per line as an unsigned decimal, so an
 * operator can check them against the engine's KV events. TOKENS may also come one or several a line
 * on stdin when none are given. argv[0] is "kv-keys". Returns 0, or 2 on a usage error. */
int atc_kv_keys_main(int argc, char **argv);

#endif
