// The official OpenAI Node SDK against atc: each step's outcome, printed as one JSON object for
// tests/integration/test_openai_sdk.py to check. Usage: node client.mjs BASE_URL
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "not-checked", maxRetries: 0, timeout: 20000 });
const messages = [{ role: "user", content: "Hello from the SDK" }];
const out = {};

async function step(name, fn) {
  try {
    out[name] = await fn();
  } catch (err) {
    out[name] = { error: err.constructor.name, status: err.status ?? null, code: err.code ?? null,
                  message: String(err.message) };
  }
}

await step("models", async () => (await client.models.list()).data.map((m) => m.id));
await step("chat", async () => {
  const r = await client.chat.completions.create({ model: "llama-3-8b", messages, max_tokens: 5 });
  return { content: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage };
});
await step("stream", async () => {
  const s = await client.chat.completions.create({ model: "llama-3-8b", messages, max_tokens: 6, stream: true,
                                                   stream_options: { include_usage: true } });
  let text = "", deltas = 0, usage = null, finish = null;
  for await (const chunk of s) {
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (c?.delta?.content) { text += c.delta.content; deltas++; }
    if (c?.finish_reason) finish = c.finish_reason;
  }
  return { text, deltas, usage, finish };
});
await step("headers", async () => {
  const { data, response } = await client.chat.completions
    .create({ model: "llama-3-8b", messages, max_tokens: 2 }).withResponse();
  return { endpoint: response.headers.get("x-atc-endpoint"), request_id: response.headers.get("x-request-id"),
           object: data.object };
});
await step("completion", async () => {
  const r = await client.completions.create({ model: "llama-3-8b", prompt: "Once upon a time", max_tokens: 4 });
  return { text: r.choices[0].text, usage: r.usage };
});
await step("embeddings", async () => {
  // the SDK asks for base64 and decodes it into floats
  const r = await client.embeddings.create({ model: "llama-3-8b", input: ["one", "two", "one"] });
  return r.data.map((d) => ({ index: d.index, embedding: Array.from(d.embedding) }));
});
await step("unknown_model", () => client.chat.completions.create({ model: "no-such-model", messages }));
await step("bad_request", () => client.chat.completions.create({ model: "llama-3-8b", messages, max_tokens: 1e9 }));
await step("aborted", async () => {
  const controller = new AbortController();
  const s = await client.chat.completions.create({ model: "llama-3-8b", messages, max_tokens: 2000, stream: true },
                                                 { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const _ of s) if (++chunks === 3) controller.abort();
  } catch (err) {
    return { chunks, error: err.constructor.name };
  }
  return { chunks };
});
console.log(JSON.stringify(out));
