#ifndef ATC_SIM_CLI_H
#define ATC_SIM_CLI_H

/** `atc sim [flags]`: a standalone simulated server; argv[0] is "sim". Returns the exit status:
 * 0 after SIGTERM/SIGINT, 1 when it died (die_after) or could not start, 2 on a usage error. */
int atc_sim_main(int argc, char **argv);

#endif
