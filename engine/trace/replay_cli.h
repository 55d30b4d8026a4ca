#ifndef ATC_REPLAY_CLI_H
#define ATC_REPLAY_CLI_H


/** `atc replay ...`; returns the exit status. */
int atc_replay_main(int argc, char **argv);

#endif
