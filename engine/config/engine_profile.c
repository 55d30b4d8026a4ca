/* The engine profiles (engine_profile.h). Each entry says where its facts come from: the engine's own
 * source, as read for issue 27. Metric names are load_scrape.c's business (its table is by engine). */

#include "config/engine_profile.h"

#include <stddef.h>

#define MINUTES(n) ((uint64_t)(n)*60 * 1000)

const char *const atc_engine_names[] = {
    [ATC_ENGINE_OPENAI] = "openai",     [ATC_ENGINE_VLLM] = "vllm", [ATC_ENGINE_SGLANG] = "sglang",
    [ATC_ENGINE_LLAMACPP] = "llamacpp", [ATC_ENGINE_TGI] = "tgi",   [ATC_ENGINE_COUNT] = NULL,
};

static const struct atc_engine_profile profiles[ATC_ENGINE_COUNT] = {
    /* Any OpenAI-compatible server: atc's defaults as they always were. */
    [ATC_ENGINE_OPENAI] = {.name = "openai"},
    /* vLLM (vllm-project/vllm, vllm/entrypoints/openai/api_server.py): the HTTP server binds only once
     * the engine is built, so a loading vLLM refuses connections; /health is a flag read; --api-key
     * guards every path under /v1 (so the ready probe /v1/models too), not /health or /metrics. */
    [ATC_ENGINE_VLLM] = {.name = "vllm", .startup_grace_ms = MINUTES(10)},
    /* SGLang (sgl-project/sglang, python/sglang/srt/entrypoints/http_server.py, health_generate):
     * /health and /health_generate are one handler that sends a one-token generation and polls it with
     * asyncio.sleep(1), so an answer takes a second or more (unless the server runs with
     * SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false), and answers 503 while the server is starting.
     * The check stays on /health (it proves the scheduler works) with a timeout that fits it. */
    [ATC_ENGINE_SGLANG] = {.name = "sglang",
                           .live_timeout_ms = 5000,
                           .startup_grace_ms = MINUTES(10),
                           .loading_503 = true},
    /* llama.cpp (ggml-org/llama.cpp, tools/server/server-http.cpp, middleware_server_state): until the
     * model is loaded every request is answered 503 {"error":{"code":503,"message":"Loading model",
     * "type":"unavailable_error"}}; --api-key exempts /health, /v1/health, /models, /v1/models and /. */
    [ATC_ENGINE_LLAMACPP] = {.name = "llamacpp", .startup_grace_ms = MINUTES(10), .loading_503 = true},
    /* TGI (huggingface/text-generation-inference, router/src/server.rs): the router starts once the
     * shards have loaded (connections are refused until then); /v1/models names the model_id it was
     * started with, not a served name, so readiness is /health (2xx: the shards answer); an overloaded
     * queue answers 429 "Model is overloaded" (InferError::Overloaded -> TOO_MANY_REQUESTS); --api-key
     * guards the inference routes only (/health, /info, /metrics, /v1/models are open). */
    [ATC_ENGINE_TGI] = {.name = "tgi",
                        .ready_path = "/health",
                        .live_timeout_ms = 5000, /* /health runs a prefill on an idle server */
                        .startup_grace_ms = MINUTES(10)},
};

const struct atc_engine_profile *atc_engine_profile(unsigned engine)
{
    return &profiles[engine < ATC_ENGINE_COUNT ? engine : ATC_ENGINE_OPENAI];
}
