// `strata serve` through the official OpenAI client (npm `openai`): chat with and without streaming, a tool-call
// round trip, json_schema output validated with ajv, completions, models, concurrency, cancellation and prefix reuse.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { mainServer, startServer, metricValue, waitFor, healthOk, banEndTokens } from './lib.mjs';

let server;
let client;
let model;
const ajv = new Ajv({ allErrors: true, strict: false });

before(async () => {
  server = await mainServer();
  client = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'not-needed', maxRetries: 0, timeout: 120000 });
  const models = await client.models.list();
  model = models.data[0].id;
});

after(async () => {
  if (server) await server.stop();
});

const greedy = { temperature: 0, top_p: 1 };

function assertUsage(usage, maxCompletion) {
  assert.ok(usage, 'usage is present');
  assert.ok(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0, `prompt_tokens ${usage.prompt_tokens}`);
  assert.ok(Number.isInteger(usage.completion_tokens) && usage.completion_tokens > 0,
    `completion_tokens ${usage.completion_tokens}`);
  if (maxCompletion) assert.ok(usage.completion_tokens <= maxCompletion, `completion_tokens ${usage.completion_tokens} > ${maxCompletion}`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
}

// Collects a streamed chat completion: text, reasoning, tool calls (merged by index), finish reason, usage.
async function collectStream(stream) {
  const out = { content: '', reasoning: '', toolCalls: [], finish: null, usage: null, chunks: 0, ids: new Set() };
  for await (const chunk of stream) {
    out.chunks++;
    out.ids.add(chunk.id);
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) out.usage = chunk.usage;
    for (const choice of chunk.choices) {
      assert.equal(choice.index, 0);
      const d = choice.delta || {};
      if (d.content) out.content += d.content;
      if (d.reasoning_content) out.reasoning += d.reasoning_content;
      for (const tc of d.tool_calls || []) {
        const slot = (out.toolCalls[tc.index] ||= { id: '', type: '', function: { name: '', arguments: '' } });
        if (tc.id) slot.id = tc.id;
        if (tc.type) slot.type = tc.type;
        if (tc.function?.name) slot.function.name += tc.function.name;
        if (tc.function?.arguments) slot.function.arguments += tc.function.arguments;
      }
      if (choice.finish_reason) {
        assert.equal(out.finish, null, 'finish_reason appears once');
        out.finish = choice.finish_reason;
      }
    }
  }
  return out;
}

test('GET /v1/models lists the loaded model', async () => {
  const models = await client.models.list();
  assert.ok(models.data.length >= 1);
  for (const m of models.data) {
    assert.equal(typeof m.id, 'string');
    assert.ok(m.id.length > 0);
    assert.equal(m.object, 'model');
  }
  const one = await client.models.retrieve(model).catch((e) => e);
  // Retrieving one model is optional in our API; when present it must agree with the list.
  if (!(one instanceof Error)) assert.equal(one.id, model);
});

test('chat completion without streaming', async () => {
  const res = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 16, ...greedy,
  });
  assert.equal(res.object, 'chat.completion');
  assert.equal(typeof res.id, 'string');
  assert.equal(res.choices.length, 1);
  const choice = res.choices[0];
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.ok(['stop', 'length'].includes(choice.finish_reason), `finish_reason ${choice.finish_reason}`);
  assertUsage(res.usage, 16);
  if (choice.finish_reason === 'length') assert.equal(res.usage.completion_tokens, 16);
});

test('chat completion streaming equals non-streaming (greedy), usage in the last chunk', async () => {
  const req = { model, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Count to five.' }],
    max_tokens: 24, seed: 7, ...greedy };
  const plain = await client.chat.completions.create(req);
  const streamed = await collectStream(await client.chat.completions.create({
    ...req, stream: true, stream_options: { include_usage: true },
  }));
  assert.ok(streamed.chunks >= 2, `only ${streamed.chunks} chunks`);
  assert.equal(streamed.ids.size, 1, 'one id for all chunks');
  assert.equal(streamed.content, plain.choices[0].message.content);
  assert.equal(streamed.finish, plain.choices[0].finish_reason);
  assertUsage(streamed.usage, 24);
  assert.equal(streamed.usage.completion_tokens, plain.usage.completion_tokens);
  assert.equal(streamed.usage.prompt_tokens, plain.usage.prompt_tokens);
});

test('max_completion_tokens is honoured like max_tokens', async () => {
  const res = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Write a long story.' }], max_completion_tokens: 5, ...greedy,
  });
  assert.ok(res.usage.completion_tokens <= 5);
});

test('logprobs with top_logprobs', async () => {
  const res = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, logprobs: true, top_logprobs: 3, ...greedy,
  });
  const lp = res.choices[0].logprobs;
  assert.ok(lp && Array.isArray(lp.content) && lp.content.length > 0, 'logprobs.content present');
  for (const entry of lp.content) {
    assert.equal(typeof entry.token, 'string');
    assert.ok(entry.logprob <= 0 && Number.isFinite(entry.logprob), `logprob ${entry.logprob}`);
    assert.equal(entry.top_logprobs.length, 3);
    // Greedy: the chosen token is the most likely one.
    assert.ok(entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob);
    assert.ok(Math.abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-4);
  }
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather for a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', maxLength: 16 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};

test('tool call round trip with tool_choice "required"', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await client.chat.completions.create({
    model, messages, tools: [weatherTool], tool_choice: 'required', max_tokens: 1024, parallel_tool_calls: false, ...greedy,
  });
  const choice = first.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  const calls = choice.message.tool_calls;
  assert.ok(Array.isArray(calls) && calls.length >= 1, 'tool_calls present');
  const validate = ajv.compile(weatherTool.function.parameters);
  for (const call of calls) {
    assert.equal(call.type, 'function');
    assert.equal(typeof call.id, 'string');
    assert.ok(call.id.length > 0);
    assert.equal(call.function.name, 'get_weather');
    const args = JSON.parse(call.function.arguments);
    assert.ok(validate(args), `arguments ${call.function.arguments}: ${ajv.errorsText(validate.errors)}`);
  }
  // Send the call and its result back; the model answers (text or another call) without an error.
  const second = await client.chat.completions.create({
    model,
    messages: [
      ...messages,
      { role: 'assistant', content: choice.message.content ?? null, tool_calls: calls },
      ...calls.map((c) => ({ role: 'tool', tool_call_id: c.id, content: JSON.stringify({ temperature: 21, unit: 'celsius' }) })),
    ],
    tools: [weatherTool],
    max_tokens: 16,
    ...greedy,
  });
  assert.equal(second.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(second.choices[0].finish_reason));
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens, 'the tool result is part of the prompt');
});

test('tool call while streaming arrives as tool_calls deltas', async () => {
  const out = await collectStream(await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Weather in Oslo?' }], tools: [weatherTool], tool_choice: 'required',
    max_tokens: 1024, parallel_tool_calls: false, stream: true, ...greedy,
  }));
  assert.equal(out.finish, 'tool_calls');
  assert.ok(out.toolCalls.length >= 1);
  const validate = ajv.compile(weatherTool.function.parameters);
  for (const call of out.toolCalls) {
    assert.equal(call.function.name, 'get_weather');
    assert.ok(call.id.length > 0);
    const args = JSON.parse(call.function.arguments);
    assert.ok(validate(args), `arguments ${call.function.arguments}: ${ajv.errorsText(validate.errors)}`);
  }
});

test('json_schema response_format: output parses and validates', async () => {
  const schema = {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 24 },
      age: { type: 'integer' },
      member: { type: 'boolean' },
      colour: { type: 'string', enum: ['red', 'green', 'blue'] },
      tags: { type: 'array', items: { type: 'string', maxLength: 12 }, maxItems: 3 },
    },
    required: ['name', 'age', 'member', 'colour', 'tags'],
    additionalProperties: false,
  };
  const validate = ajv.compile(schema);
  for (const [k, sampling] of [greedy, { temperature: 1.0, seed: 11 }, { temperature: 1.2, seed: 12 }].entries()) {
    const res = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Describe a person as JSON.' }], max_tokens: 400,
      response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } }, ...sampling,
    });
    const text = res.choices[0].message.content;
    assert.equal(res.choices[0].finish_reason, 'stop', `run ${k}: finish_reason ${res.choices[0].finish_reason}: ${text}`);
    let value;
    assert.doesNotThrow(() => { value = JSON.parse(text); }, `run ${k}: not JSON: ${text}`);
    assert.ok(validate(value), `run ${k}: ${text}: ${ajv.errorsText(validate.errors)}`);
  }
});

test('json_object response_format gives a JSON object', async () => {
  const res = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'JSON please' }], max_tokens: 300,
    response_format: { type: 'json_object' }, ...greedy,
  });
  const value = JSON.parse(res.choices[0].message.content);
  assert.equal(typeof value, 'object');
  assert.ok(value !== null && !Array.isArray(value));
});

test('completions: text, usage, streaming equals non-streaming', async () => {
  const req = { model, prompt: 'Once upon a time', max_tokens: 12, ...greedy };
  const res = await client.completions.create(req);
  assert.equal(res.object, 'text_completion');
  assert.equal(res.choices.length, 1);
  assert.equal(typeof res.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(res.choices[0].finish_reason));
  assertUsage(res.usage, 12);
  let text = '';
  for await (const chunk of await client.completions.create({ ...req, stream: true })) {
    for (const c of chunk.choices) text += c.text || '';
  }
  assert.equal(text, res.choices[0].text);
});

test('stop strings end the output before the match', async () => {
  const base = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Tell me something.' }], max_tokens: 40, ...greedy,
  });
  const full = base.choices[0].message.content;
  // Pick a stop string from the middle of the greedy output: the same request with it must end just before it.
  const chars = [...full];
  if (chars.length < 6) return; // nothing to cut (an early end-of-generation): nothing to check
  let mid = Math.floor(chars.length / 2);
  // Avoid U+FFFD: it stands for bytes that were not valid UTF-8, which a stop string cannot name.
  while (mid + 2 < chars.length && chars.slice(mid, mid + 2).includes('\uFFFD')) mid++;
  const stop = chars.slice(mid, mid + 2).join('');
  if (stop.includes('\uFFFD')) return;
  const cut = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Tell me something.' }], max_tokens: 40, stop: [stop], ...greedy,
  });
  assert.equal(cut.choices[0].finish_reason, 'stop');
  assert.equal(cut.choices[0].message.content, full.slice(0, full.indexOf(stop)));
});

test('8 concurrent streaming requests all complete, each as it would alone (greedy)', async () => {
  const prompts = Array.from({ length: 8 }, (_, k) => `Request number ${k}: ${'abcdefgh'.slice(0, k + 1)}`);
  const run = async (content) => collectStream(await client.chat.completions.create({
    model, messages: [{ role: 'user', content }], max_tokens: 48, stream: true,
    stream_options: { include_usage: true }, ...greedy,
  }));
  const alone = [];
  for (const p of prompts) alone.push(await run(p));
  const together = await Promise.all(prompts.map(run));
  together.forEach((out, k) => {
    assert.ok(out.finish === 'stop' || out.finish === 'length', `request ${k}: finish ${out.finish}`);
    assertUsage(out.usage, 48);
    assert.equal(out.content, alone[k].content, `request ${k}: batched output differs from single`);
  });
});

test('a cancelled stream stops generation and is counted in /metrics', async () => {
  const before = (await metricValue(server.url, 'strata:requests_cancelled_total')) ?? 0;
  const generatedBefore = (await metricValue(server.url, 'strata:generation_tokens_total')) ?? 0;
  const controller = new AbortController();
  // End tokens banned: 3500 tokens to generate, so the request is still running when the client goes away.
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Write forever.' }], max_tokens: 3500, stream: true,
    logit_bias: await banEndTokens(server.url), ...greedy,
  }, { signal: controller.signal });
  let chunks = 0;
  let finish = null;
  try {
    for await (const chunk of stream) {
      if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
      if (chunk.choices[0]?.delta?.content && ++chunks === 3) controller.abort();
    }
  } catch (e) {
    // The client raises an abort error (or just ends the iteration, depending on the version).
    assert.ok(e.name === 'AbortError' || e.constructor?.name === 'APIUserAbortError' || /abort/i.test(String(e)), String(e));
  }
  assert.equal(finish, null, 'the stream finished before the abort: nothing was cancelled');
  const after = await waitFor(async () => {
    const v = (await metricValue(server.url, 'strata:requests_cancelled_total')) ?? 0;
    return v > before ? v : null;
  }, { timeoutMs: 10000, what: 'strata:requests_cancelled_total to increase' });
  assert.ok(after >= before + 1);
  await waitFor(async () => (await metricValue(server.url, 'strata:num_requests_running')) === 0,
    { timeoutMs: 10000, what: 'no running requests after the cancel' });
  // Generation stopped early: far fewer than the 3500 requested tokens were made.
  const generated = (await metricValue(server.url, 'strata:generation_tokens_total')) - generatedBefore;
  assert.ok(generated < 3000, `${generated} tokens generated after the cancel`);
  assert.ok(await healthOk(server.url));
});

test('prefix reuse: the second turn reuses cached tokens and gives the same output as without reuse', async () => {
  const other = await startServer({ args: ['--no-prefix-cache'] });
  try {
    const otherClient = new OpenAI({ baseURL: other.url + '/v1', apiKey: 'x', maxRetries: 0, timeout: 120000 });
    const system = { role: 'system', content: 'You are a careful assistant. ' + 'Answer in one sentence. '.repeat(8) };
    const turn1 = { model, messages: [system, { role: 'user', content: 'What is a prefix cache?' }], max_tokens: 24, ...greedy };
    const a1 = await client.chat.completions.create(turn1);
    const b1 = await otherClient.chat.completions.create(turn1);
    assert.equal(a1.choices[0].message.content, b1.choices[0].message.content, 'turn 1 differs between servers');
    const turn2 = {
      ...turn1,
      messages: [...turn1.messages, { role: 'assistant', content: a1.choices[0].message.content },
        { role: 'user', content: 'And why does it help?' }],
    };
    const a2 = await client.chat.completions.create(turn2);
    const b2 = await otherClient.chat.completions.create(turn2);
    const cached = a2.usage.prompt_tokens_details?.cached_tokens ?? 0;
    assert.ok(cached > 0, `cached_tokens ${cached} on the second turn`);
    assert.ok(cached < a2.usage.prompt_tokens);
    assert.equal(b2.usage.prompt_tokens_details?.cached_tokens ?? 0, 0, '--no-prefix-cache reported cached tokens');
    assert.equal(a2.usage.prompt_tokens, b2.usage.prompt_tokens);
    assert.equal(a2.choices[0].message.content, b2.choices[0].message.content, 'output with reuse differs from without');
    // The same turn-2 request streamed: usage in the last chunk also reports the cached tokens.
    const s2 = await collectStream(await client.chat.completions.create({
      ...turn2, stream: true, stream_options: { include_usage: true },
    }));
    assert.equal(s2.content, b2.choices[0].message.content);
    assert.ok((s2.usage.prompt_tokens_details?.cached_tokens ?? 0) > 0);
  } finally {
    await other.stop();
  }
});

test('/metrics is Prometheus text with the documented names', async () => {
  const res = await fetch(server.url + '/metrics');
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type') || '', /text\/plain/);
  const text = await res.text();
  for (const name of ['strata:num_requests_running', 'strata:num_requests_waiting', 'strata:time_to_first_token_seconds',
    'strata:generation_tokens_total', 'strata:requests_cancelled_total', 'strata:prompt_tokens_cached_total',
    'strata:kv_cache_usage_perc']) {
    assert.ok(text.includes(name), `${name} missing from /metrics`);
  }
  assert.match(text, /^# TYPE strata:time_to_first_token_seconds histogram$/m);
  assert.match(text, /^strata:time_to_first_token_seconds_bucket\{le="\+Inf"\} \d+/m);
  assert.ok((await metricValue(server.url, 'strata:generation_tokens_total')) > 0);
});

test('/v1/status describes model, memory, slots, uptime, version', async () => {
  const res = await fetch(server.url + '/v1/status');
  assert.equal(res.status, 200);
  const status = await res.json();
  for (const key of ['model', 'version', 'uptime_seconds', 'slots']) assert.ok(key in status, `status.${key} missing`);
  assert.ok('memory' in status || 'memory_plan' in status, 'status has no memory plan');
});

test('/tokenize and /detokenize round trip', async () => {
  const text = 'Hello, world! 123';
  const tok = await fetch(server.url + '/tokenize', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content: text }),
  });
  assert.equal(tok.status, 200);
  const { tokens } = await tok.json();
  assert.ok(Array.isArray(tokens) && tokens.length > 0 && tokens.every(Number.isInteger));
  const detok = await fetch(server.url + '/detokenize', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ tokens }),
  });
  assert.equal(detok.status, 200);
  assert.equal((await detok.json()).content, text);
});

test('a client that goes away during a non-streaming request cancels it', async () => {
  const before = (await metricValue(server.url, 'strata:requests_cancelled_total')) ?? 0;
  const controller = new AbortController();
  const pending = client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Write forever, no streaming.' }], max_tokens: 3500,
    logit_bias: await banEndTokens(server.url), ...greedy,
  }, { signal: controller.signal });
  setTimeout(() => controller.abort(), 60);
  await assert.rejects(pending);
  await waitFor(async () => ((await metricValue(server.url, 'strata:requests_cancelled_total')) ?? 0) > before,
    { timeoutMs: 10000, what: 'strata:requests_cancelled_total to increase' });
});

test('a full queue answers 503 with a JSON error; the rest complete', async () => {
  const small = await startServer({ args: ['--parallel', '1', '--queue', '1'] });
  try {
    const bias = await banEndTokens(small.url);
    const body = JSON.stringify({ model, messages: [{ role: 'user', content: 'long' }], max_tokens: 3000, logit_bias: bias, ...greedy });
    const results = await Promise.all(Array.from({ length: 4 }, () => fetch(small.url + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' }, body,
    }).then(async (r) => ({ status: r.status, type: r.headers.get('content-type'), text: await r.text() }))));
    const statuses = results.map((r) => r.status).sort();
    assert.ok(statuses.filter((s) => s === 200).length >= 2, `statuses ${statuses}`);
    const refused = results.filter((r) => r.status === 503);
    assert.ok(refused.length >= 1, `no 503 with 1 slot, a queue of 1 and 4 requests: ${statuses}`);
    for (const r of refused) {
      assert.match(r.type || '', /application\/json/);
      assert.equal(typeof JSON.parse(r.text).error.message, 'string');
    }
    assert.deepEqual(statuses.filter((s) => s !== 200 && s !== 503), []);
    assert.ok(await healthOk(small.url));
  } finally {
    await small.stop();
  }
});

test('a new conversation with the same system prompt reuses it (checkpoints at message boundaries)', async () => {
  const system = { role: 'system', content: 'You answer questions about ships. ' + 'Be exact and brief. '.repeat(12) };
  const ask = (q) => client.chat.completions.create({
    model, messages: [system, { role: 'user', content: q }], max_tokens: 4, ...greedy,
  });
  await ask('What is a keel?');
  const other = await ask('What is a rudder made of?');
  const cached = other.usage.prompt_tokens_details?.cached_tokens ?? 0;
  assert.ok(cached > 0, `cached_tokens ${cached} of ${other.usage.prompt_tokens}: the shared system prompt was computed again`);
});
