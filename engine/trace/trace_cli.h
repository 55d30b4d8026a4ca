#ifndef ATC_TRACE_CLI_H
#define ATC_TRACE_CLI_H

/** `atc trace import|stats|dump ...`; returns the exit status. */
int atc_trace_main(int argc, char **argv);

#endif
