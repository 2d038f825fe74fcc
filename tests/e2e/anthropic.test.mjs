// `strata serve`'s /v1/messages through the official Anthropic client (npm `@anthropic-ai/sdk`): a message, a message
// stream read by the SDK's stream helper, and tool use.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';
import { mainServer, firstModelId } from './lib.mjs';

let server;
let client;
let model;
const ajv = new Ajv({ allErrors: true, strict: false });

before(async () => {
  server = await mainServer();
  client = new Anthropic({ baseURL: server.url, apiKey: 'not-needed', maxRetries: 0, timeout: 120000 });
  model = await firstModelId(server.url);
});

after(async () => {
  if (server) await server.stop();
});

const textOf = (message) => message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

function assertMessage(message, maxTokens) {
  assert.equal(message.type, 'message');
  assert.equal(message.role, 'assistant');
  assert.equal(typeof message.id, 'string');
  assert.ok(message.id.length > 0);
  assert.equal(typeof message.model, 'string');
  assert.ok(Array.isArray(message.content));
  assert.ok(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(message.stop_reason),
    `stop_reason ${message.stop_reason}`);
  assert.ok(Number.isInteger(message.usage.input_tokens) && message.usage.input_tokens > 0);
  assert.ok(Number.isInteger(message.usage.output_tokens) && message.usage.output_tokens > 0);
  if (maxTokens) assert.ok(message.usage.output_tokens <= maxTokens, `output_tokens ${message.usage.output_tokens}`);
  if (message.stop_reason === 'max_tokens') assert.equal(message.usage.output_tokens, maxTokens);
}

test('messages.create without streaming', async () => {
  const message = await client.messages.create({
    model, max_tokens: 20, temperature: 0, system: 'You are terse.',
    messages: [{ role: 'user', content: 'Hello there' }],
  });
  assertMessage(message, 20);
  assert.ok(message.content.length >= 1);
  assert.equal(message.content[0].type, 'text');
  assert.equal(typeof message.content[0].text, 'string');
});

test('messages.create accepts content blocks and a multi-turn history', async () => {
  const message = await client.messages.create({
    model, max_tokens: 8, temperature: 0,
    system: [{ type: 'text', text: 'Be kind.' }],
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'Hi' }] },
      { role: 'assistant', content: 'Hello!' },
      { role: 'user', content: [{ type: 'text', text: 'How are you?' }] },
    ],
  });
  assertMessage(message, 8);
});

test('messages.stream: events reach finalMessage, same text as without streaming (greedy)', async () => {
  const req = { model, max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: 'Tell me a fact.' }] };
  const plain = await client.messages.create(req);
  const stream = client.messages.stream(req);
  let deltas = '';
  const events = [];
  stream.on('text', (delta) => { deltas += delta; });
  stream.on('streamEvent', (event) => { events.push(event.type); });
  const final = await stream.finalMessage();
  assertMessage(final, 24);
  assert.equal(textOf(final), deltas);
  assert.equal(textOf(final), textOf(plain));
  assert.equal(final.stop_reason, plain.stop_reason);
  assert.equal(final.usage.output_tokens, plain.usage.output_tokens);
  // The SDK's event order: message_start, content blocks (start, deltas, stop), message_delta, message_stop.
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-1), 'message_stop');
  assert.ok(events.includes('content_block_start') && events.includes('content_block_stop'));
  assert.ok(events.indexOf('message_delta') > events.lastIndexOf('content_block_stop'));
});

test('stop_sequences end the message with stop_reason "stop_sequence"', async () => {
  const req = { model, max_tokens: 40, temperature: 0, messages: [{ role: 'user', content: 'Go on.' }] };
  const full = textOf(await client.messages.create(req));
  const chars = [...full];
  let mid = Math.floor(chars.length / 2);
  while (mid + 2 < chars.length && chars.slice(mid, mid + 2).includes('\uFFFD')) mid++;
  const stop = chars.slice(mid, mid + 2).join('');
  if (chars.length < 6 || stop.includes('\uFFFD')) return; // nothing to cut
  const cut = await client.messages.create({ ...req, stop_sequences: [stop] });
  assert.equal(cut.stop_reason, 'stop_sequence');
  assert.equal(cut.stop_sequence, stop);
  assert.equal(textOf(cut), full.slice(0, full.indexOf(stop)));
});

const weatherTool = {
  name: 'get_weather',
  description: 'Current weather for a city',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 16 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    required: ['city', 'unit'],
    additionalProperties: false,
  },
};

test('tool use with tool_choice {type: "any"}, then a tool_result round trip', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Rome?' }];
  const first = await client.messages.create({
    model, max_tokens: 1024, temperature: 0, tools: [weatherTool], tool_choice: { type: 'any', disable_parallel_tool_use: true },
    messages,
  });
  assertMessage(first, 1024);
  assert.equal(first.stop_reason, 'tool_use');
  const uses = first.content.filter((b) => b.type === 'tool_use');
  assert.ok(uses.length >= 1, 'a tool_use block');
  const validate = ajv.compile(weatherTool.input_schema);
  for (const use of uses) {
    assert.equal(use.name, 'get_weather');
    assert.equal(typeof use.id, 'string');
    assert.ok(use.id.length > 0);
    assert.ok(validate(use.input), `input ${JSON.stringify(use.input)}: ${ajv.errorsText(validate.errors)}`);
  }
  const second = await client.messages.create({
    model, max_tokens: 16, temperature: 0, tools: [weatherTool],
    messages: [
      ...messages,
      { role: 'assistant', content: first.content },
      { role: 'user', content: uses.map((u) => ({ type: 'tool_result', tool_use_id: u.id, content: '21 degrees, sunny' })) },
    ],
  });
  assertMessage(second, 16);
  assert.ok(second.usage.input_tokens > first.usage.input_tokens);
});

test('tool use while streaming: finalMessage has the parsed input', async () => {
  const stream = client.messages.stream({
    model, max_tokens: 1024, temperature: 0, tools: [weatherTool], tool_choice: { type: 'any', disable_parallel_tool_use: true },
    messages: [{ role: 'user', content: 'Weather in Lima?' }],
  });
  let jsonDeltas = '';
  stream.on('inputJson', (partial) => { jsonDeltas += partial; });
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  const uses = final.content.filter((b) => b.type === 'tool_use');
  assert.ok(uses.length >= 1, 'a tool_use block');
  const use = uses[0];
  if (uses.length === 1) assert.deepEqual(JSON.parse(jsonDeltas), use.input);
  const validate = ajv.compile(weatherTool.input_schema);
  assert.ok(validate(use.input), `input ${JSON.stringify(use.input)}: ${ajv.errorsText(validate.errors)}`);
});

test('errors come back in Anthropic shape and the SDK raises them', async () => {
  await assert.rejects(
    client.messages.create({ model, max_tokens: -1, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.APIError && e.status === 400 && e.error?.type === 'error' &&
      typeof e.error?.error?.message === 'string',
  );
});
