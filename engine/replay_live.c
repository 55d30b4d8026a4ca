#include "replay.h"
#include <stdlib.h>
#include <string.h>
int atc_replay_live(const struct atc_trace *t, const struct atc_replay_live_options *o,
                    struct atc_replay_result *out, char **err)
{
    *err = strdup("not yet");
    return -1;
}
