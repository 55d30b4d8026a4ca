#ifndef ATC_CLI_H
#define ATC_CLI_H

/** `atc status|reload|drain|enable ...` (argv[0] is the command): talks to a running atc's admin API.
 * Returns the exit status. */
int atc_cli_main(int argc, char **argv);

#endif
