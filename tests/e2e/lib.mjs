// Shared helpers for the end-to-end tests: start/stop `strata serve`, wait for /health, read /metrics.
//
// run.sh starts one server and passes it in STRATA_E2E_URL; it also passes STRATA_E2E_BIN (the strata executable)
// and STRATA_E2E_MODEL (the synth model) so tests can start extra servers with other flags (--api-key,
// --no-prefix-cache). A test file run on its own (node --test clients.test.mjs) starts its own main server from
// STRATA_E2E_BIN/STRATA_E2E_MODEL when STRATA_E2E_URL is not set.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, existsSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(HERE, '..', '..');

export function strataBinary() {
  const bin = process.env.STRATA_E2E_BIN || path.join(REPO, 'build', 'strata');
  if (!existsSync(bin)) throw new Error(`strata executable not found at ${bin} (set STRATA_E2E_BIN)`);
  return bin;
}

let synthModel = null;
export function testModel() {
  if (process.env.STRATA_E2E_MODEL) return process.env.STRATA_E2E_MODEL;
  if (!synthModel) {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'strata-e2e-'));
    synthModel = path.join(dir, 'tiny.gguf');
    const r = spawnSync(strataBinary(), ['synth', '--preset', 'tiny', '--out', synthModel], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`strata synth failed: ${r.stderr}`);
  }
  return synthModel;
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function healthOk(url, timeoutMs = 3000) {
  try {
    const res = await fetch(url + '/health', { signal: AbortSignal.timeout(timeoutMs) });
    await res.arrayBuffer();
    return res.status === 200;
  } catch {
    return false;
  }
}

// Starts `strata serve --model M --port P ...args` and waits for /health. Returns { url, port, proc, log(), stop() }.
export async function startServer({ args = [], env = {}, model = testModel(), timeoutMs = 60000 } = {}) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  // The server's environment: ours without STRATA_API_KEY (a test that wants a key passes it), plus `env`.
  const childEnv = { ...process.env };
  delete childEnv.STRATA_API_KEY;
  const proc = spawn(strataBinary(), ['serve', '--model', model, '--port', String(port), ...args], {
    env: { ...childEnv, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  const keep = (chunk) => { output = (output + chunk.toString()).slice(-200000); };
  proc.stdout.on('data', keep);
  proc.stderr.on('data', keep);
  let exited = null;
  proc.on('exit', (code, signal) => { exited = { code, signal }; });
  const deadline = Date.now() + timeoutMs;
  while (!(await healthOk(url, 1000))) {
    if (exited) throw new Error(`strata serve exited (${JSON.stringify(exited)}) before /health was ok:\n${output}`);
    if (Date.now() > deadline) {
      proc.kill('SIGKILL');
      throw new Error(`strata serve did not answer /health within ${timeoutMs} ms:\n${output}`);
    }
    await sleep(100);
  }
  return {
    url,
    port,
    proc,
    log: () => output,
    exited: () => exited,
    async stop() {
      if (exited) return exited;
      proc.kill('SIGTERM');
      const t0 = Date.now();
      while (!exited && Date.now() - t0 < 10000) await sleep(50);
      if (!exited) proc.kill('SIGKILL');
      return exited;
    },
  };
}

// The server the tests share: run.sh's, or one started for this file (stopped by the returned release()).
export async function mainServer() {
  if (process.env.STRATA_E2E_URL) return { url: process.env.STRATA_E2E_URL.replace(/\/$/, ''), stop: async () => {} };
  return startServer();
}

// Prometheus text -> Map(name -> summed value over label sets).
export function parseMetrics(text) {
  const values = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    values.set(m[1], (values.get(m[1]) || 0) + Number(m[3]));
  }
  return values;
}

export async function metrics(url, headers = {}) {
  const res = await fetch(url + '/metrics', { headers });
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}`);
  return { contentType: res.headers.get('content-type'), text: await res.text() };
}

export async function metricValue(url, name) {
  return parseMetrics((await metrics(url)).text).get(name);
}

export async function firstModelId(url, headers = {}) {
  const res = await fetch(url + '/v1/models', { headers });
  const body = await res.json();
  return body.data[0].id;
}

export async function postJSON(url, pathName, body, headers = {}) {
  const res = await fetch(url + pathName, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* left null */ }
  return { status: res.status, headers: res.headers, text, json };
}

export async function waitFor(predicate, { timeoutMs = 10000, intervalMs = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await predicate();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(intervalMs);
  }
}

// A logit_bias that bans the end-of-generation tokens, so a random-weight model keeps generating: the candidates that
// tokenize to a single token (/tokenize with special tokens parsed).
export async function banEndTokens(url, headers = {}) {
  const bias = {};
  for (const text of ['<|endoftext|>', '<|im_end|>', '</s>', '<|end|>']) {
    const res = await fetch(url + '/tokenize', {
      method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ content: text }),
    });
    if (res.status !== 200) continue;
    const { tokens } = await res.json();
    if (Array.isArray(tokens) && tokens.length === 1) bias[tokens[0]] = -100;
  }
  return bias;
}

// Where screenshots and other artefacts go.
export function outDir() {
  return process.env.STRATA_E2E_OUT || path.join(REPO, 'build', 'e2e');
}
