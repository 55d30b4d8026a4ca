#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("atc %s\n", ATC_VERSION);
        return 0;
    }
    fprintf(stderr, "usage: atc <serve|check|sim> ...\n");
    return 2;
}
