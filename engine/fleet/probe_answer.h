#ifndef ATC_PROBE_ANSWER_H
#define ATC_PROBE_ANSWER_H

/* What a good answer to a health probe is (health.c runs the probes). */

#include <stddef.h>

/* Whether an OpenAI model list ({"data": [{"id": ...}, ...]}) names @p model. NULL when it does, else
 * why not. */
const char *models_list_has(const char *js, size_t len, const char *model);

/* A deep probe's answer: a JSON object with "choices" (completions) or "data" (embeddings). */
const char *inference_answer_ok(const char *js, size_t len);

#endif
