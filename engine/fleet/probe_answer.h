#ifndef ATC_PROBE_ANSWER_H
#define ATC_PROBE_ANSWER_H

/* What a good answer to a health probe is (health.c runs the probes). Pure functions of the answer's
 * body: any thread. */

#include <stddef.h>

/** Whether the ready probe's answer @p js (@p len bytes, an OpenAI model list {"data": [{"id": ...}]})
 * names @p model. NULL when it does, else why not (a static string). */
const char *atc_probe_answer_lists_model(const char *js, size_t len, const char *model);

/** Whether the deep probe's answer @p js (@p len bytes) is an inference answer: a JSON object with
 * "choices" (completions) or "data" (embeddings). NULL when it is, else why not (a static string). */
const char *atc_probe_answer_inference(const char *js, size_t len);

#endif
