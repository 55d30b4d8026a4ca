/* What a good answer to a health probe is (probe_answer.h): the ready check's model list and the deep
 * check's inference answer, read with the engine's JSON reader (base/json.h). */

#include "fleet/probe_answer.h"

#include <stdbool.h>
#include <string.h>

#include "base/json.h"

const char *atc_probe_answer_lists_model(const char *js, size_t len, const char *model)
{
    struct atc_json j = {0};
    const char *why = "the model list does not name this endpoint's model";
    if (atc_json_parse(&j, js, len, NULL) < 0 || atc_json_type(&j, 0) != ATC_JSON_OBJECT) {
        why = "the answer is not a JSON object";
        goto done;
    }
    int data = atc_json_get(&j, 0, "data");
    if (atc_json_type(&j, data) != ATC_JSON_ARRAY) {
        why = "the answer has no 'data' list of models";
        goto done;
    }
    for (int i = data + 1, k = 0; k < atc_json_count(&j, data); k++, i = atc_json_next(&j, i)) {
        char id[512];
        if (atc_json_string(&j, atc_json_get(&j, i, "id"), id, sizeof(id), NULL) == 0 &&
            strcmp(id, model) == 0) {
            why = NULL;
            goto done;
        }
    }
done:
    atc_json_dispose(&j);
    return why;
}

const char *atc_probe_answer_inference(const char *js, size_t len)
{
    struct atc_json j = {0};
    const char *why = NULL;
    if (atc_json_parse(&j, js, len, NULL) < 0 || atc_json_type(&j, 0) != ATC_JSON_OBJECT)
        why = "the answer is not a JSON object";
    else if (atc_json_get(&j, 0, "choices") < 0 && atc_json_get(&j, 0, "data") < 0)
        why = "the answer has neither 'choices' nor 'data'";
    atc_json_dispose(&j);
    return why;
}
