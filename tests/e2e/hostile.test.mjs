// A corpus of malformed and hostile requests. Each must get a 4xx with a JSON error body ({"error": {...}} with a
// message), and /health must answer 200 after each one. Requests are written byte for byte on a socket, so broken
// JSON, invalid UTF-8, bad headers and oversize bodies reach the server exactly as written.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { mainServer, startServer, healthOk, firstModelId, freePort, strataBinary, testModel, sleep } from './lib.mjs';

let server;
let model;

before(async () => {
  server = await mainServer();
  model = await firstModelId(server.url);
});

after(async () => {
  if (server) await server.stop();
});

// Sends one HTTP/1.1 request as raw bytes and reads the response until the server closes the connection.
function raw(url, { method = 'POST', path = '/v1/chat/completions', headers = {}, body, rawHead } = {}) {
  const { hostname, port } = new URL(url);
  const payload = body === undefined ? Buffer.alloc(0) : Buffer.isBuffer(body) ? body : Buffer.from(
    typeof body === 'string' ? body : JSON.stringify(body));
  const head = rawHead ?? [
    `${method} ${path} HTTP/1.1`,
    ...(headers.Host ? [] : [`Host: ${hostname}:${port}`]),
    'Connection: close',
    ...Object.entries({ 'Content-Type': 'application/json', ...headers })
      .filter(([, v]) => v !== null).map(([k, v]) => `${k}: ${v}`),
    ...(body === undefined && method === 'GET' ? [] : [`Content-Length: ${payload.length}`]),
    '', '',
  ].join('\r\n');
  return new Promise((resolve, reject) => {
    const chunks = [];
    const socket = net.connect({ host: hostname, port: Number(port) });
    socket.setTimeout(60000, () => socket.destroy(new Error('timed out waiting for the response')));
    socket.on('data', (d) => chunks.push(d));
    socket.on('error', (e) => {
      // A server may answer early (413) and close while the body is still being written: keep what arrived.
      if (chunks.length) finish(); else reject(e);
    });
    socket.on('end', () => finish());
    socket.on('close', () => finish());
    let done = false;
    function finish() {
      if (done) return;
      done = true;
      socket.destroy();
      try { resolve(parseResponse(Buffer.concat(chunks))); } catch (e) { reject(e); }
    }
    socket.write(head);
    if (payload.length) socket.write(payload, () => {});
  });
}

function parseResponse(buf) {
  const sep = buf.indexOf('\r\n\r\n');
  if (sep < 0) throw new Error(`no complete HTTP response (${buf.length} bytes: ${JSON.stringify(buf.toString('latin1').slice(0, 200))})`);
  const lines = buf.subarray(0, sep).toString('latin1').split('\r\n');
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0])?.[1]);
  const headers = {};
  for (const line of lines.slice(1)) {
    const k = line.indexOf(':');
    if (k > 0) headers[line.slice(0, k).trim().toLowerCase()] = line.slice(k + 1).trim();
  }
  let body = buf.subarray(sep + 4);
  if (/chunked/i.test(headers['transfer-encoding'] || '')) {
    const parts = [];
    let at = 0;
    for (;;) {
      const eol = body.indexOf('\r\n', at);
      if (eol < 0) break;
      const size = parseInt(body.subarray(at, eol).toString('latin1'), 16);
      if (!size) break;
      parts.push(body.subarray(eol + 2, eol + 2 + size));
      at = eol + 2 + size + 2;
    }
    body = Buffer.concat(parts);
  }
  const text = body.toString('utf8');
  let json = null;
  try { json = JSON.parse(text); } catch { /* left null */ }
  return { status, headers, text, json };
}

function assertJSONError(res, allowed) {
  const where = `status ${res.status}, body ${res.text.slice(0, 300)}`;
  if (allowed) assert.ok(allowed.includes(res.status), `expected ${allowed.join(' or ')}; got ${where}`);
  else assert.ok(res.status >= 400 && res.status < 500, `expected a 4xx; got ${where}`);
  assert.match(res.headers['content-type'] || '', /application\/json/, `content-type ${res.headers['content-type']}; ${where}`);
  assert.ok(res.json && typeof res.json === 'object', `body is not JSON: ${where}`);
  const message = res.json.error?.message;
  assert.equal(typeof message, 'string', `no error.message: ${where}`);
  assert.ok(message.length > 0);
}

const chat = (fields) => ({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...fields });
const nest = (depth) => '['.repeat(depth) + ']'.repeat(depth);

// name -> request description, allowed statuses (default: any 4xx). Bodies that need `model` are functions.
const corpus = [
  ['bad JSON (not JSON at all)', { body: 'hello, server' }],
  ['truncated JSON', () => ({ body: JSON.stringify(chat()).slice(0, 25) })],
  ['empty body', { body: '' }],
  ['JSON array instead of an object', { body: '[]' }],
  ['JSON string instead of an object', { body: '"chat"' }],
  ['JSON with a trailing comma', () => ({ body: `{"model":"${model}","messages":[{"role":"user","content":"x"}],}` })],
  ['NaN literal (not JSON)', () => ({ body: `{"model":"${model}","messages":[{"role":"user","content":"x"}],"temperature":NaN}` })],
  ['messages missing', () => ({ body: { model, max_tokens: 4 } })],
  ['messages is a string', () => ({ body: chat({ messages: 'hi' }) })],
  ['messages is empty', () => ({ body: chat({ messages: [] }) })],
  ['message is a number', () => ({ body: chat({ messages: [1] }) })],
  ['unknown role', () => ({ body: chat({ messages: [{ role: 'wizard', content: 'x' }] }) })],
  ['role missing', () => ({ body: chat({ messages: [{ content: 'x' }] }) })],
  ['role is a number', () => ({ body: chat({ messages: [{ role: 7, content: 'x' }] }) })],
  ['content is a number', () => ({ body: chat({ messages: [{ role: 'user', content: 42 }] }) })],
  ['user content is null', () => ({ body: chat({ messages: [{ role: 'user', content: null }] }) })],
  ['content part of an unknown type', () => ({ body: chat({ messages: [{ role: 'user', content: [{ type: 'bogus', x: 1 }] }] }) })],
  ['model is a number', () => ({ body: chat({ model: 12 }) })],
  ['unknown model', () => ({ body: chat({ model: 'no-such-model-xyz' }) }), [400, 404]],
  ['max_tokens negative', () => ({ body: chat({ max_tokens: -5 }) })],
  ['max_tokens zero', () => ({ body: chat({ max_tokens: 0 }) })],
  ['max_tokens a string', () => ({ body: chat({ max_tokens: 'ten' }) })],
  ['max_tokens a NaN-ish string', () => ({ body: chat({ max_tokens: 'NaN' }) })],
  ['max_tokens fractional', () => ({ body: chat({ max_tokens: 2.5 }) })],
  ['max_tokens huge (1e30)', () => ({ body: chat({ max_tokens: 1e30 }) })],
  ['max_tokens beyond int64', () => ({ body: `{"model":"${model}","messages":[{"role":"user","content":"x"}],"max_tokens":99999999999999999999999999}` })],
  ['max_completion_tokens negative', () => ({ body: chat({ max_tokens: undefined, max_completion_tokens: -1 }) })],
  ['temperature a string', () => ({ body: chat({ temperature: 'hot' }) })],
  ['temperature "Infinity"', () => ({ body: chat({ temperature: 'Infinity' }) })],
  ['temperature negative', () => ({ body: chat({ temperature: -1 }) })],
  ['temperature huge (1e308)', () => ({ body: chat({ temperature: 1e308 }) })],
  ['number overflowing a double (1e400)', () => ({ body: `{"model":"${model}","messages":[{"role":"user","content":"x"}],"temperature":1e400}` })],
  ['top_p above 1', () => ({ body: chat({ top_p: 5 }) })],
  ['top_p "NaN"', () => ({ body: chat({ top_p: 'NaN' }) })],
  ['stream is a string', () => ({ body: chat({ stream: 'yes' }) })],
  ['stop is a number', () => ({ body: chat({ stop: 12345 }) })],
  ['too many stop strings (100)', () => ({ body: chat({ stop: Array.from({ length: 100 }, (_, k) => 'stop' + k) }) })],
  ['a 100 KB stop string', () => ({ body: chat({ stop: ['x'.repeat(100000)] }) })],
  ['seed a string', () => ({ body: chat({ seed: 'abc' }) })],
  ['n = 5', () => ({ body: chat({ n: 5 }) })],
  ['logit_bias value out of range', () => ({ body: chat({ logit_bias: { 5: 500 } }) })],
  ['logit_bias key not a token id', () => ({ body: chat({ logit_bias: { abc: 1 } }) })],
  ['logit_bias token id beyond the vocabulary', () => ({ body: chat({ logit_bias: { 999999999: 1 } }) })],
  ['top_logprobs 100', () => ({ body: chat({ logprobs: true, top_logprobs: 100 }) })],
  ['logprobs a string', () => ({ body: chat({ logprobs: 'yes' }) })],
  ['tools is an object', () => ({ body: chat({ tools: { name: 'x' } }) })],
  ['tool without a name', () => ({ body: chat({ tools: [{ type: 'function', function: { parameters: { type: 'object' } } }] }) })],
  ['tool with an invalid JSON schema', () => ({ body: chat({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'bogus-type' } } } } }] }) })],
  ['tool_choice naming a missing tool', () => ({ body: chat({ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }], tool_choice: { type: 'function', function: { name: 'g' } } }) })],
  ['tool_choice "required" without tools', () => ({ body: chat({ tool_choice: 'required' }) })],
  ['response_format of an unknown type', () => ({ body: chat({ response_format: { type: 'xml' } }) })],
  ['response_format json_schema without a schema', () => ({ body: chat({ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }) })],
  ['response_format with an invalid schema', () => ({ body: chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 12 } } } }) })],
  ['deep nesting: 10000 levels in content', () => ({ body: `{"model":"${model}","messages":[{"role":"user","content":${nest(10000)}}]}` })],
  ['deep nesting: 100000 levels as the whole body', { body: nest(100000) }],
  ['deep nesting: 10000 objects', () => ({ body: '{"a":'.repeat(10000) + '1' + '}'.repeat(10000) })],
  ['invalid UTF-8 bytes in a string', () => ({ body: Buffer.concat([Buffer.from(`{"model":"${model}","messages":[{"role":"user","content":"ab`), Buffer.from([0xff, 0xfe, 0xc3, 0x28]), Buffer.from('"}]}')]) })],
  ['overlong UTF-8 encoding of "/"', () => ({ body: Buffer.concat([Buffer.from(`{"model":"${model}","messages":[{"role":"user","content":"`), Buffer.from([0xc0, 0xaf]), Buffer.from('"}]}')]) })],
  ['lone surrogate escape', () => ({ body: `{"model":"${model}","messages":[{"role":"user","content":"\\ud800x"}]}` })],
  ['10 MB body', () => ({ body: JSON.stringify(chat({ messages: [{ role: 'user', content: 'a'.repeat(10 * 1024 * 1024) }] })) }), [413, 400]],
  ['5 MB body sent chunked (no Content-Length)', () => {
    const json = Buffer.from(JSON.stringify({ content: 'a'.repeat(5 * 1024 * 1024) }));
    const parts = [];
    for (let at = 0; at < json.length; at += 65536) {
      const piece = json.subarray(at, at + 65536);
      parts.push(Buffer.from(piece.length.toString(16) + '\r\n'), piece, Buffer.from('\r\n'));
    }
    parts.push(Buffer.from('0\r\n\r\n'));
    return {
      rawHead: `POST /tokenize HTTP/1.1\r\nHost: ${new URL(server.url).host}\r\nConnection: close\r\n` +
        'Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n',
      body: Buffer.concat(parts),
    };
  }, [411, 413]],
  ['prompt longer than the context', () => ({ body: chat({ messages: [{ role: 'user', content: 'hello world '.repeat(20000) }] }) })],
  ['completions: prompt is an object', () => ({ path: '/v1/completions', body: { model, prompt: { a: 1 }, max_tokens: 4 } })],
  ['completions: token ids beyond the vocabulary', () => ({ path: '/v1/completions', body: { model, prompt: [999999999, -3], max_tokens: 4 } })],
  ['completions: negative max_tokens', () => ({ path: '/v1/completions', body: { model, prompt: 'x', max_tokens: -1 } })],
  ['completions: prompt missing', () => ({ path: '/v1/completions', body: { model, max_tokens: 4 } })],
  ['messages (Anthropic): max_tokens missing', () => ({ path: '/v1/messages', body: { model, messages: [{ role: 'user', content: 'x' }] } })],
  ['messages (Anthropic): role "system" inside messages', () => ({ path: '/v1/messages', body: { model, max_tokens: 4, messages: [{ role: 'system', content: 'x' }] } })],
  ['messages (Anthropic): content block of an unknown type', () => ({ path: '/v1/messages', body: { model, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'hologram' }] }] } })],
  ['messages (Anthropic): tool_choice naming a missing tool', () => ({ path: '/v1/messages', body: { model, max_tokens: 4, messages: [{ role: 'user', content: 'x' }], tools: [{ name: 'f', input_schema: { type: 'object' } }], tool_choice: { type: 'tool', name: 'g' } } })],
  ['tokenize: content is a number', { path: '/tokenize', body: { content: 12 } }],
  ['detokenize: token ids out of range', { path: '/detokenize', body: { tokens: [-1, 999999999] } }],
  ['detokenize: tokens is a string', { path: '/detokenize', body: { tokens: 'abc' } }],
  ['unknown endpoint', { method: 'GET', path: '/v1/does-not-exist' }, [404]],
  ['unknown endpoint (POST)', { path: '/admin/shutdown', body: {} }, [404]],
  ['path traversal', { method: 'GET', path: '/../../../../etc/passwd' }, [400, 404]],
  ['encoded path traversal', { method: 'GET', path: '/%2e%2e/%2e%2e/etc/passwd' }, [400, 404]],
  ['wrong method: GET on chat completions', { method: 'GET', path: '/v1/chat/completions' }, [404, 405]],
  ['wrong method: DELETE on models', { method: 'DELETE', path: '/v1/models' }, [404, 405]],
  ['wrong method: PUT on messages', () => ({ method: 'PUT', path: '/v1/messages', body: { model } }), [404, 405]],
  ['cross-site Origin', () => ({ headers: { Origin: 'https://evil.example' }, body: chat() }), [403]],
  ['cross-site form post (CSRF shape)', () => ({ headers: { Origin: 'https://evil.example', 'Content-Type': 'text/plain' }, body: chat() }), [403]],
  ['Sec-Fetch-Site: cross-site without Origin', () => ({ headers: { 'Sec-Fetch-Site': 'cross-site' }, body: chat() }), [403]],
  ['Origin "null" (sandboxed page)', () => ({ headers: { Origin: 'null' }, body: chat() }), [403]],
  ['bad Content-Length', () => ({ rawHead: `POST /v1/chat/completions HTTP/1.1\r\nHost: ${new URL(server.url).host}\r\nConnection: close\r\nContent-Length: abc\r\n\r\n` }), [400, 411]],
  ['negative Content-Length', () => ({ rawHead: `POST /v1/chat/completions HTTP/1.1\r\nHost: ${new URL(server.url).host}\r\nConnection: close\r\nContent-Length: -5\r\n\r\n` }), [400, 411, 413]],
  ['Host header naming another site (DNS rebinding)', () => ({ headers: { Host: 'evil.example' }, body: chat() }), [400, 403, 421]],
  ['header over 64 KB', { method: 'GET', path: '/v1/models', headers: { 'X-Big': 'a'.repeat(70000) } }, [400, 413, 431]],
];

describe('hostile requests: 4xx with a JSON error, server stays up', () => {
  test('the corpus is at least 30 requests', () => {
    assert.ok(corpus.length >= 30, `${corpus.length} cases`);
  });
  for (const [name, make, allowed] of corpus) {
    test(name, async () => {
      const req = typeof make === 'function' ? make() : make;
      const res = await raw(server.url, req);
      assertJSONError(res, allowed);
      assert.ok(await healthOk(server.url), `/health is not ok after: ${name}`);
    });
  }
  test('a normal request still works after the corpus', async () => {
    const res = await raw(server.url, { body: chat() });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.json.object, 'chat.completion');
  });
  test('a same-origin browser request (the web app) is allowed', async () => {
    const origin = server.url;
    const res = await raw(server.url, { headers: { Origin: origin, 'Sec-Fetch-Site': 'same-origin' }, body: chat() });
    assert.equal(res.status, 200, res.text);
  });
  test('a CORS preflight from another site is not granted', async () => {
    const res = await raw(server.url, {
      method: 'OPTIONS', body: undefined,
      headers: { Origin: 'https://evil.example', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'content-type' },
    });
    const allow = res.headers['access-control-allow-origin'];
    assert.ok(allow !== '*' && allow !== 'https://evil.example', `preflight granted: ${allow}`);
  });
  test('the web app is served with a strict Content-Security-Policy', async () => {
    const res = await fetch(server.url + '/');
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') || '', /text\/html/);
    const csp = res.headers.get('content-security-policy') || '';
    assert.ok(csp.length > 0, 'no CSP header');
    assert.ok(!/unsafe-inline|unsafe-eval/.test(csp), `CSP allows inline code: ${csp}`);
    assert.ok(!/\*/.test(csp.replace(/\s+/g, ' ')), `CSP has a wildcard: ${csp}`);
  });
});

describe('API key (--api-key)', () => {
  let keyed;
  const key = 's3cret-key-for-tests';
  before(async () => { keyed = await startServer({ args: ['--api-key', key] }); });
  after(async () => { if (keyed) await keyed.stop(); });

  const cases = [
    ['no key', {}, 401],
    ['wrong bearer key', { Authorization: 'Bearer wrong' }, 401],
    ['key with a different length', { Authorization: 'Bearer ' + key + 'x' }, 401],
    ['key as a prefix', { Authorization: 'Bearer ' + key.slice(0, 5) }, 401],
    ['empty bearer', { Authorization: 'Bearer ' }, 401],
    ['basic auth instead of bearer', { Authorization: 'Basic ' + Buffer.from('user:' + key).toString('base64') }, 401],
    ['right key', { Authorization: 'Bearer ' + key }, 200],
  ];
  for (const [name, headers, status] of cases) {
    test(`chat completions: ${name} -> ${status}`, async () => {
      const m = status === 200 ? await firstModelId(keyed.url, { Authorization: 'Bearer ' + key }) : model;
      const res = await raw(keyed.url, { headers, body: { model: m, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 } });
      if (status === 200) assert.equal(res.status, 200, res.text);
      else assertJSONError(res, [status]);
    });
  }
  test('Anthropic x-api-key: wrong -> 401, right -> 200', async () => {
    const body = { model, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] };
    assertJSONError(await raw(keyed.url, { path: '/v1/messages', headers: { 'x-api-key': 'nope' }, body }), [401]);
    const ok = await raw(keyed.url, { path: '/v1/messages', headers: { 'x-api-key': key }, body });
    assert.equal(ok.status, 200, ok.text);
  });
  test('/v1/models and /metrics need the key too', async () => {
    assertJSONError(await raw(keyed.url, { method: 'GET', path: '/v1/models' }), [401]);
    assertJSONError(await raw(keyed.url, { method: 'GET', path: '/metrics' }), [401]);
    assert.equal((await raw(keyed.url, { method: 'GET', path: '/v1/models', headers: { Authorization: 'Bearer ' + key } })).status, 200);
  });
  test('/health answers without a key', async () => {
    assert.ok(await healthOk(keyed.url));
  });
});

test('binding a non-loopback address without an API key is refused', async () => {
  const port = await freePort();
  const env = { ...process.env };
  delete env.STRATA_API_KEY;
  const proc = spawn(strataBinary(), ['serve', '--model', testModel(), '--host', '0.0.0.0', '--port', String(port)], {
    env, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  proc.stdout.on('data', (d) => { output += d; });
  proc.stderr.on('data', (d) => { output += d; });
  const exit = await Promise.race([
    new Promise((resolve) => proc.on('exit', (code) => resolve(code))),
    sleep(15000).then(() => 'still running'),
  ]);
  if (exit === 'still running') proc.kill('SIGKILL');
  assert.notEqual(exit, 'still running', 'the server started on 0.0.0.0 without a key');
  assert.notEqual(exit, 0);
  assert.match(output, /api.?key/i, `the message does not mention the API key: ${output}`);
});

test('a second server on a port that is in use is refused', async () => {
  const port = new URL(server.url).port;
  const env = { ...process.env };
  delete env.STRATA_API_KEY;
  const proc = spawn(strataBinary(), ['serve', '--model', testModel(), '--port', port], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  proc.stdout.on('data', (d) => { output += d; });
  proc.stderr.on('data', (d) => { output += d; });
  const exit = await Promise.race([
    new Promise((resolve) => proc.on('exit', (code) => resolve(code))),
    sleep(6000).then(() => 'still running'),
  ]);
  if (exit === 'still running') proc.kill('SIGKILL');
  // Both would otherwise listen (SO_REUSEPORT) and the kernel would split connections between two servers.
  assert.notEqual(exit, 'still running', `a second server started on port ${port}: ${output}`);
  assert.notEqual(exit, 0);
  assert.ok(await healthOk(server.url));
});
