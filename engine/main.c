#include <stdio.h>
#include <string.h>

#include "sim_server.h"

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "sim") == 0)
        return atc_sim_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("atc %s\n", ATC_VERSION);
        return 0;
    }
    fprintf(stderr, "usage: atc <serve|check|sim> ...\n");
    return 2;
}
