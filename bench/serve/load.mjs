#!/usr/bin/env node
// Load benchmark for a running `strata serve`: N concurrent clients send streaming chat requests for T seconds.
// Reports requests/s, output tokens/s, p50/p99 time to first token and errors (which must be 0), next to what one
// client alone gets, as a table and one JSON line. Needs only node >= 18 (fetch); no npm packages.
//
//   node bench/serve/load.mjs [--url http://127.0.0.1:8080] [--clients 16] [--seconds 60] [--max-tokens 128]
//                             [--single-seconds 15] [--model ID] [--api-key KEY] [--temperature 0.8] [--same-prompt]
//
// The API key may also come from STRATA_API_KEY. Only loopback addresses are accepted unless --allow-remote is given.
// Exit status: 0 when every request succeeded, 1 when any failed, 2 for bad arguments or an unreachable server.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const DEFAULTS = {
  url: 'http://127.0.0.1:8080', clients: 16, seconds: 60, 'max-tokens': 128, 'single-seconds': 15,
  model: '', 'api-key': process.env.STRATA_API_KEY || '', temperature: 0.8, 'same-prompt': false,
  'allow-remote': false, 'request-timeout': 300,
};

function parseArgs(argv) {
  const opts = { ...DEFAULTS };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '-h' || arg === '--help') {
      console.log(readFileSync(fileURLToPath(import.meta.url), 'utf8').split('\n').slice(1, 10)
        .map((l) => l.replace(/^\/\/ ?/, '')).join('\n'));
      process.exit(0);
    }
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
    if (!m || !(m[1] in DEFAULTS)) fail(`unknown argument '${arg}' (see --help)`);
    const key = m[1];
    if (typeof DEFAULTS[key] === 'boolean') { opts[key] = true; continue; }
    const value = m[2] ?? argv[++i];
    if (value === undefined) fail(`--${key} needs a value`);
    if (typeof DEFAULTS[key] === 'number') {
      const n = Number(value);
      if (!Number.isFinite(n) || n < 0) fail(`--${key} must be a non-negative number, not '${value}'`);
      opts[key] = n;
    } else {
      opts[key] = value;
    }
  }
  if (!Number.isInteger(opts.clients) || opts.clients < 1) fail('--clients must be a whole number >= 1');
  if (!Number.isInteger(opts['max-tokens']) || opts['max-tokens'] < 1) fail('--max-tokens must be a whole number >= 1');
  if (opts.seconds <= 0) fail('--seconds must be > 0');
  opts.url = opts.url.replace(/\/+$/, '');
  let host;
  try { host = new URL(opts.url).hostname; } catch { fail(`--url '${opts.url}' is not a URL`); }
  const loopback = /^127\.\d+\.\d+\.\d+$/.test(host) || host === 'localhost' || host === '[::1]' || host === '::1';
  if (!loopback && !opts['allow-remote']) fail(`--url ${opts.url} is not a loopback address (pass --allow-remote to load another host)`);
  return opts;
}

function fail(message) {
  console.error('load.mjs: ' + message);
  process.exit(2);
}

function headers(opts) {
  const h = { 'content-type': 'application/json', accept: 'text/event-stream' };
  if (opts['api-key']) h.authorization = 'Bearer ' + opts['api-key'];
  return h;
}

// Reads an SSE body; calls onData(text) for each event's data.
async function readSSE(body, onData) {
  const decoder = new TextDecoder();
  let buf = '';
  let data = [];
  for await (const chunk of body) {
    buf += decoder.decode(chunk, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) !== -1) {
      let line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line === '') {
        if (data.length) onData(data.join('\n'));
        data = [];
      } else if (line.startsWith('data:')) {
        data.push(line.slice(5).replace(/^ /, ''));
      }
    }
  }
  if (data.length) onData(data.join('\n'));
}

// One streaming chat request. Returns { ok, ttft, tokens, seconds, error }.
async function oneRequest(opts, model, prompt) {
  const t0 = performance.now();
  let ttft = null;
  let tokens = 0;
  let chunkTokens = 0;
  let finish = null;
  try {
    const res = await fetch(opts.url + '/v1/chat/completions', {
      method: 'POST',
      headers: headers(opts),
      signal: AbortSignal.timeout(opts['request-timeout'] * 1000),
      body: JSON.stringify({
        model, messages: [{ role: 'user', content: prompt }], max_tokens: opts['max-tokens'],
        temperature: opts.temperature, stream: true, stream_options: { include_usage: true },
      }),
    });
    if (res.status !== 200) {
      const text = await res.text().catch(() => '');
      return { ok: false, error: `HTTP ${res.status}: ${text.slice(0, 200)}` };
    }
    let streamError = null;
    await readSSE(res.body, (data) => {
      if (data === '[DONE]') return;
      let obj;
      try { obj = JSON.parse(data); } catch { streamError = 'bad JSON in stream'; return; }
      if (obj.error) { streamError = obj.error.message || 'error event'; return; }
      if (obj.usage && Number.isInteger(obj.usage.completion_tokens)) tokens = obj.usage.completion_tokens;
      for (const choice of obj.choices || []) {
        const d = choice.delta || {};
        if (d.content || d.reasoning_content || d.tool_calls) {
          if (ttft === null) ttft = (performance.now() - t0) / 1000;
          chunkTokens++;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    });
    const seconds = (performance.now() - t0) / 1000;
    if (streamError) return { ok: false, error: streamError };
    if (!finish) return { ok: false, error: 'stream ended without a finish_reason' };
    if (!tokens) tokens = chunkTokens;
    // A reply that ended at once (end of generation first) has no visible first token: its TTFT is the whole time.
    return { ok: true, ttft: ttft ?? seconds, tokens, seconds };
  } catch (e) {
    return { ok: false, error: e.name === 'TimeoutError' ? 'timed out' : String(e.message || e) };
  }
}

const TOPICS = ['a lighthouse', 'the sea', 'a red fox', 'prime numbers', 'a city at night', 'bread', 'glaciers',
  'a chess game', 'rain', 'an old map', 'bees', 'the moon', 'a train', 'copper', 'a garden', 'a violin'];

function promptFor(opts, client, k) {
  if (opts['same-prompt']) return 'Tell me a short story about a lighthouse.';
  return `Client ${client}, request ${k}: tell me a short story about ${TOPICS[(client + k) % TOPICS.length]}.`;
}

// `clients` loops issue requests until `seconds` have passed; requests in flight then are allowed to finish.
async function runPhase(opts, model, clients, seconds) {
  const results = [];
  const errors = [];
  const start = performance.now();
  const deadline = start + seconds * 1000;
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    for (let k = 0; performance.now() < deadline; k++) {
      const r = await oneRequest(opts, model, promptFor(opts, c, k));
      if (r.ok) results.push(r); else errors.push(r.error);
    }
  }));
  const elapsed = (performance.now() - start) / 1000;
  const tokens = results.reduce((a, r) => a + r.tokens, 0);
  const ttfts = results.map((r) => r.ttft).sort((a, b) => a - b);
  return {
    clients, elapsed, requests: results.length, errors: errors.length, errorSamples: [...new Set(errors)].slice(0, 5),
    tokens, requestsPerSecond: results.length / elapsed, tokensPerSecond: tokens / elapsed,
    ttftP50: percentile(ttfts, 0.5), ttftP99: percentile(ttfts, 0.99),
    perRequestTokensPerSecond: median(results.filter((r) => r.tokens > 1 && r.seconds > r.ttft)
      .map((r) => (r.tokens - 1) / (r.seconds - r.ttft))),
  };
}

// Nearest-rank percentile of sorted values.
function percentile(sorted, p) {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))];
}

function median(values) {
  return percentile([...values].sort((a, b) => a - b), 0.5);
}

const fmt = (v, digits = 1) => (Number.isFinite(v) ? v.toFixed(digits) : '-');
const ms = (s) => (Number.isFinite(s) ? (s * 1000).toFixed(1) + ' ms' : '-');

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  let model = opts.model;
  try {
    const res = await fetch(opts.url + '/v1/models', { headers: headers(opts), signal: AbortSignal.timeout(10000) });
    if (res.status !== 200) fail(`GET ${opts.url}/v1/models answered ${res.status}: ${(await res.text()).slice(0, 200)}`);
    if (!model) model = (await res.json()).data[0].id;
  } catch (e) {
    fail(`cannot reach ${opts.url}: ${e.message}`);
  }

  console.error(`load.mjs: ${opts.url}, model ${model}, max_tokens ${opts['max-tokens']}, temperature ${opts.temperature}`);
  const singleSeconds = Math.min(opts['single-seconds'], opts.seconds);
  console.error(`load.mjs: 1 client for ${singleSeconds} s ...`);
  const single = singleSeconds > 0 ? await runPhase(opts, model, 1, singleSeconds) : null;
  console.error(`load.mjs: ${opts.clients} clients for ${opts.seconds} s ...`);
  const load = await runPhase(opts, model, opts.clients, opts.seconds);

  const rows = [['', '1 client', `${opts.clients} clients`]];
  const add = (name, f) => rows.push([name, single ? f(single) : '-', f(load)]);
  add('requests', (r) => String(r.requests));
  add('errors', (r) => String(r.errors));
  add('wall time', (r) => fmt(r.elapsed) + ' s');
  add('requests/s', (r) => fmt(r.requestsPerSecond, 2));
  add('output tokens/s', (r) => fmt(r.tokensPerSecond));
  add('tokens/s per request (median)', (r) => fmt(r.perRequestTokensPerSecond));
  add('TTFT p50', (r) => ms(r.ttftP50));
  add('TTFT p99', (r) => ms(r.ttftP99));
  const widths = rows[0].map((_, k) => Math.max(...rows.map((r) => r[k].length)));
  for (const [k, row] of rows.entries()) {
    console.log(row.map((cell, j) => (j === 0 ? cell.padEnd(widths[j]) : cell.padStart(widths[j]))).join('  '));
    if (k === 0) console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  }
  const errorSamples = [...(single?.errorSamples || []), ...load.errorSamples];
  if (errorSamples.length) console.log('errors seen: ' + errorSamples.join(' | '));
  const round = (v, d = 3) => (Number.isFinite(v) ? Number(v.toFixed(d)) : null);
  console.log(JSON.stringify({
    bench: 'serve-load', url: opts.url, model, clients: opts.clients, seconds: opts.seconds,
    max_tokens: opts['max-tokens'], requests: load.requests, errors: load.errors + (single?.errors || 0),
    requests_per_s: round(load.requestsPerSecond), output_tokens_per_s: round(load.tokensPerSecond, 1),
    ttft_p50_s: round(load.ttftP50, 4), ttft_p99_s: round(load.ttftP99, 4),
    single_client_tokens_per_s: single ? round(single.tokensPerSecond, 1) : null,
    single_client_ttft_p50_s: single ? round(single.ttftP50, 4) : null,
    speedup: single && single.tokensPerSecond > 0 ? round(load.tokensPerSecond / single.tokensPerSecond, 2) : null,
  }));
  process.exit(load.errors + (single?.errors || 0) > 0 ? 1 : 0);
}

main().catch((e) => { console.error('load.mjs: ' + (e.stack || e)); process.exit(2); });
