// The web app at / in headless Chromium (Debian's chromium driven by playwright-core): send a message and watch the
// reply stream in, stop a long generation, keep conversations across a reload, render markdown safely, open the
// Monitor. Saves webapp-chat.png and webapp-monitor.png to $STRATA_E2E_OUT (default build/e2e).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { mainServer, outDir, metricValue, waitFor, banEndTokens } from './lib.mjs';

const executablePath = process.env.STRATA_E2E_CHROMIUM || '/usr/bin/chromium';
const haveChromium = existsSync(executablePath);
// In CI (CI set) a missing browser is a failure, not a skip: the web app test is part of what CI must run.
if (!haveChromium && process.env.CI) throw new Error(`no Chromium at ${executablePath} in CI (scripts/setup.sh installs it)`);
const skip = haveChromium ? false : `no Chromium at ${executablePath} (apt-get install chromium)`;

let server;
let browser;
let page;
let cdp;
const problems = []; // console errors, page errors, CSP violations

before(async () => {
  if (!haveChromium) return;
  server = await mainServer();
  browser = await chromium.launch({ executablePath, args: ['--no-sandbox'], headless: true });
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  page.on('console', (msg) => {
    // The browser asks for /favicon.ico by itself; the app has none (three files only), so its 404 is expected.
    if (msg.type() === 'error' && !/\/favicon\.ico$/.test(msg.location()?.url || '')) {
      problems.push('console: ' + msg.text() + ' at ' + (msg.location()?.url || '?'));
    }
  });
  page.on('pageerror', (err) => problems.push('pageerror: ' + err.message));
  cdp = await context.newCDPSession(page);
  await cdp.send('Network.enable');
  await page.goto(server.url + '/');
  await page.waitForSelector('body[data-ready="true"]');
});

after(async () => {
  if (browser) await browser.close();
  if (server) await server.stop();
});

const byId = (id) => `[data-testid="${id}"]`;
const lastAssistant = () => page.locator(`${byId('message')}[data-role="assistant"]`).last();

// Slows the browser's network so a reply that the tiny model makes in milliseconds arrives over seconds.
async function throttle(bytesPerSecond) {
  await cdp.send('Network.emulateNetworkConditions', {
    offline: false, latency: 0, downloadThroughput: bytesPerSecond, uploadThroughput: -1,
  });
}

async function setSetting(id, value) {
  await page.locator('summary', { hasText: 'Settings' }).click();
  const input = page.locator(byId(id));
  await input.fill(String(value));
  await input.dispatchEvent('change');
  await page.locator('summary', { hasText: 'Settings' }).click();
}

async function screenshot(name) {
  const dir = outDir();
  mkdirSync(dir, { recursive: true });
  await page.screenshot({ path: path.join(dir, name), fullPage: false });
}

test('the page loads without errors and shows the model', { skip }, async () => {
  await waitFor(async () => !/connecting/.test(await page.locator(byId('model-name')).innerText()),
    { what: 'the model name' });
  const name = await page.locator(byId('model-name')).innerText();
  assert.ok(name.length > 0 && !/unreachable|needed/.test(name), `model name: ${name}`);
  assert.deepEqual(problems, []);
});

test('Shift+Enter makes a new line, Enter sends; the reply streams in', { skip }, async () => {
  await throttle(4000);
  await setSetting('setting-max-tokens', 160);
  await setSetting('setting-temperature', 0); // greedy: the same reply every run
  const input = page.locator(byId('chat-input'));
  await input.click();
  await input.type('Hello');
  await input.press('Shift+Enter');
  await input.type('Strata');
  assert.equal(await input.inputValue(), 'Hello\nStrata');
  assert.equal(await page.locator(byId('message')).count(), 0, 'Shift+Enter must not send');
  await input.press('Enter');

  const user = page.locator(`${byId('message')}[data-role="user"]`).last();
  assert.equal(await user.locator(byId('message-content')).innerText(), 'Hello\nStrata');
  await page.locator(byId('stop-button')).waitFor({ state: 'visible' });
  const content = lastAssistant().locator(byId('message-content'));
  // Sample the reply's length while it streams: it must grow in several steps.
  const lengths = [];
  const t0 = Date.now();
  while (Date.now() - t0 < 20000) {
    lengths.push((await content.innerText()).length);
    if (await page.locator(byId('send-button')).isVisible()) break;
    await page.waitForTimeout(100);
  }
  lengths.push((await content.innerText()).length);
  const increases = lengths.filter((v, k) => k > 0 && v > lengths[k - 1]).length;
  assert.ok(increases >= 3, `the text grew only ${increases} times: ${lengths.join(',')}`);
  await page.locator(byId('send-button')).waitFor({ state: 'visible', timeout: 30000 });
  const meta = await lastAssistant().locator(byId('message-meta')).innerText();
  assert.match(meta, /\d+ tokens/);
  assert.match(meta, /tok\/s/);
  await throttle(-1);
  await screenshot('webapp-chat.png');
  assert.deepEqual(problems, []);
});

test('Stop ends a long generation and resets the buttons', { skip }, async () => {
  const cancelledBefore = (await metricValue(server.url, 'strata:requests_cancelled_total')) ?? 0;
  await throttle(3000);
  await setSetting('setting-max-tokens', 3000);
  await page.locator(byId('chat-input')).fill('Write a very long story.');
  await page.locator(byId('send-button')).click();
  const content = lastAssistant().locator(byId('message-content'));
  await waitFor(async () => (await content.innerText()).length > 5, { what: 'streamed text', timeoutMs: 20000 });
  await page.locator(byId('stop-button')).click();
  await page.locator(byId('send-button')).waitFor({ state: 'visible', timeout: 3000 });
  assert.equal(await page.locator(byId('stop-button')).isVisible(), false);
  const stoppedAt = (await content.innerText()).length;
  await page.waitForTimeout(1000);
  assert.equal((await content.innerText()).length, stoppedAt, 'text kept growing after Stop');
  assert.match(await lastAssistant().locator(byId('message-meta')).innerText(), /stopped/);
  await throttle(-1);
  // The server saw the browser go away (or finished first, when the whole reply was already in its socket buffers).
  const cancelledAfter = (await metricValue(server.url, 'strata:requests_cancelled_total')) ?? 0;
  assert.ok(cancelledAfter >= cancelledBefore);
  assert.deepEqual(problems, []);
});

test('conversations persist across a reload; rename and delete work', { skip }, async () => {
  const count = await page.locator(byId('conversation-item')).count();
  assert.ok(count >= 1);
  const messagesBefore = await page.locator(byId('message')).count();
  await page.reload();
  await page.waitForSelector('body[data-ready="true"]');
  assert.equal(await page.locator(byId('message')).count(), messagesBefore);

  await page.locator(byId('conversation-rename')).first().click();
  const rename = page.locator(byId('conversation-rename-input'));
  await rename.fill('Renamed chat');
  await rename.press('Enter');
  await waitFor(async () => (await page.locator(byId('conversation-open')).allInnerTexts()).includes('Renamed chat'),
    { what: 'the renamed conversation' });

  await page.locator(byId('new-conversation')).click();
  assert.equal(await page.locator(byId('message')).count(), 0);
  await page.locator(byId('chat-input')).fill('second conversation');
  await page.locator(byId('chat-input')).press('Enter');
  await page.locator(byId('send-button')).waitFor({ state: 'visible', timeout: 30000 });
  assert.equal(await page.locator(byId('conversation-item')).count(), count + 1);
  const del = page.locator(`${byId('conversation-item')}:has(${byId('conversation-open')}[aria-current="true"]) ${byId('conversation-delete')}`);
  await del.click();
  await del.click(); // the second click confirms
  await waitFor(async () => (await page.locator(byId('conversation-item')).count()) === count, { what: 'the deletion' });
  await page.reload();
  await page.waitForSelector('body[data-ready="true"]');
  assert.equal(await page.locator(byId('conversation-item')).count(), count);
});

test('markdown renders safely: no markup from text, only http(s)/mailto links', { skip }, async () => {
  const result = await page.evaluate(() => {
    const div = document.createElement('div');
    const md = [
      '# Title', '', 'Some **bold**, *italic*, `code <b>`, and a [link](https://example.com/a?b=1).',
      '', '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>',
      '', '[bad](javascript:window.__pwned=3) [data](data:text/html,hi)', '',
      '- one', '- two', '  - nested', '', '1. first', '2. second', '', '```js', 'const x = "<b>";', '```',
    ].join('\n');
    window.strataMarkdown.renderMarkdown(md, div);
    document.body.append(div);
    const out = {
      h1: div.querySelector('h1')?.textContent,
      strong: div.querySelector('strong')?.textContent,
      em: div.querySelector('em')?.textContent,
      inlineCode: div.querySelector('p code')?.textContent,
      links: [...div.querySelectorAll('a')].map((a) => ({ href: a.getAttribute('href'), rel: a.rel })),
      imgs: div.querySelectorAll('img').length,
      scripts: div.querySelectorAll('script').length,
      nested: div.querySelectorAll('ul ul li').length,
      ol: div.querySelectorAll('ol li').length,
      code: div.querySelector('pre code')?.textContent,
      copy: div.querySelectorAll('[data-testid="copy-code"]').length,
      pwned: window.__pwned ?? null,
    };
    div.remove();
    return out;
  });
  assert.equal(result.h1, 'Title');
  assert.equal(result.strong, 'bold');
  assert.equal(result.em, 'italic');
  assert.equal(result.inlineCode, 'code <b>');
  assert.deepEqual(result.links, [{ href: 'https://example.com/a?b=1', rel: 'noopener noreferrer nofollow' }]);
  assert.equal(result.imgs, 0);
  assert.equal(result.scripts, 0);
  assert.equal(result.nested, 1);
  assert.equal(result.ol, 2);
  assert.equal(result.code, 'const x = "<b>";');
  assert.equal(result.copy, 1);
  assert.equal(result.pwned, null);
  // Hostile model output must not freeze the page: 120 KB of unmatched delimiters renders in well under a second.
  const times = await page.evaluate(() => {
    const out = {};
    for (const [name, md] of Object.entries({
      stars: '*a '.repeat(40000), underscores: '_a '.repeat(40000), brackets: '[a '.repeat(40000),
      ticks: 'x` '.repeat(40000), nested: Array.from({ length: 3000 }, (_, k) => ' '.repeat(k % 40) + '- item').join('\n'),
    })) {
      const t0 = performance.now();
      window.strataMarkdown.renderMarkdown(md, document.createElement('div'));
      out[name] = performance.now() - t0;
    }
    return out;
  });
  for (const [name, ms] of Object.entries(times)) assert.ok(ms < 1000, `${name}: ${ms.toFixed(0)} ms`);
});

test('reasoning_content goes to a collapsible Thinking section; markdown and code render (scripted stream)', { skip }, async () => {
  // The random test model never thinks, so this reply is scripted: the browser's request is answered by the test.
  const chunk = (delta, extra = {}) => 'data: ' + JSON.stringify({
    id: 'chatcmpl-test', object: 'chat.completion.chunk', created: 0, model: 'm',
    choices: [{ index: 0, delta, finish_reason: null }], ...extra }) + '\n\n';
  const body = chunk({ role: 'assistant', reasoning_content: 'Let me think <b>hard</b>' }) +
    chunk({ reasoning_content: ' about it.' }) +
    chunk({ content: '## Answer\n\nUse `x`:\n\n```py\nprint(1)\n```\n' }) +
    'data: ' + JSON.stringify({ id: 'chatcmpl-test', object: 'chat.completion.chunk', created: 0, model: 'm',
      choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }) + '\n\n' +
    'data: ' + JSON.stringify({ id: 'chatcmpl-test', object: 'chat.completion.chunk', created: 0, model: 'm', choices: [],
      usage: { prompt_tokens: 5, completion_tokens: 9, total_tokens: 14 } }) + '\n\ndata: [DONE]\n\n';
  let sent = null;
  await page.route('**/v1/chat/completions', async (route) => {
    sent = JSON.parse(route.request().postData());
    await route.fulfill({ status: 200, headers: { 'content-type': 'text/event-stream' }, body });
  });
  try {
    await setSetting('setting-system', 'You are a test.');
    await page.locator(byId('chat-input')).fill('think please');
    await page.locator(byId('chat-input')).press('Enter');
    await page.locator(byId('send-button')).waitFor({ state: 'visible', timeout: 10000 });
    const msg = lastAssistant();
    const thinking = msg.locator(byId('thinking'));
    assert.equal(await thinking.isVisible(), true);
    assert.equal(await thinking.evaluate((d) => d.open), false, 'thinking is collapsed once the answer is there');
    await thinking.locator('summary').click();
    assert.equal(await msg.locator(byId('thinking-content')).innerText(), 'Let me think <b>hard</b> about it.');
    assert.equal(await msg.locator('h2').innerText(), 'Answer');
    assert.equal(await msg.locator('pre code').innerText(), 'print(1)');
    assert.equal(await msg.locator(byId('copy-code')).count(), 1);
    assert.match(await msg.locator(byId('message-meta')).innerText(), /9 tokens/);
    // The request: streamed, usage asked for, the system prompt first, the settings applied.
    assert.equal(sent.stream, true);
    assert.deepEqual(sent.stream_options, { include_usage: true });
    assert.deepEqual(sent.messages[0], { role: 'system', content: 'You are a test.' });
    assert.deepEqual(sent.messages.at(-1), { role: 'user', content: 'think please' });
    assert.equal(sent.max_tokens, 3000);
    assert.equal(typeof sent.chat_template_kwargs.enable_thinking, 'boolean');
  } finally {
    await page.unroute('**/v1/chat/completions');
    await setSetting('setting-system', '');
  }
});

test('a server error shows in the reply and the composer resets', { skip }, async () => {
  await page.route('**/v1/chat/completions', (route) => route.fulfill({
    status: 400, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ error: { message: 'the prompt is longer than the context', type: 'invalid_request_error' } }),
  }));
  try {
    await page.locator(byId('chat-input')).fill('too long');
    await page.locator(byId('chat-input')).press('Enter');
    await page.locator(byId('send-button')).waitFor({ state: 'visible', timeout: 10000 });
    assert.match(await lastAssistant().innerText(), /400: the prompt is longer than the context/);
    assert.match(await page.locator(byId('composer-status')).innerText(), /Error/);
  } finally {
    await page.unroute('**/v1/chat/completions');
    // The browser logs the deliberate 400 as a failed resource load: not a problem of the page.
    for (let k = problems.length - 1; k >= 0; k--) if (/status of 400/.test(problems[k])) problems.splice(k, 1);
  }
});

// Speculation's card reads the server's spec counters (src/server/metrics.cpp); they are set here so the figures are
// known: 3 of 4 drafts accepted over 2 rounds is 75% and (3 + 2) / 2 = 2.5 tokens a round.
test('Monitor shows the acceptance of speculative decoding', { skip }, async () => {
  let seen = false;
  await page.route('**/metrics', async (route) => {
    const response = await route.fetch();
    const text = (await response.text()).split('\n').filter((l) => !/^strata:spec_/.test(l)).join('\n');
    seen = true;
    await route.fulfill({ status: 200, contentType: 'text/plain; version=0.0.4', body: text +
      'strata:spec_rounds_total 2\nstrata:spec_draft_tokens_total 4\nstrata:spec_accepted_tokens_total 3\n' });
  });
  try {
    await page.locator(byId('tab-monitor')).click();
    await waitFor(async () => /%/.test(await page.locator(byId('monitor-spec-acceptance')).innerText()),
      { what: 'an acceptance figure', timeoutMs: 10000 });
    assert.ok(seen);
    assert.equal(await page.locator(byId('monitor-spec-acceptance')).innerText(), '75.0 %');
    assert.match(await page.locator(byId('monitor-spec-sub')).innerText(), /2\.50 tokens a round over 2 rounds/);
  } finally {
    await page.unroute('**/metrics');
  }
  await page.locator(byId('tab-chat')).click();
});

// The stages of a split over GPUs come from /v1/status's cuda_stages (src/server/http_server.cpp); no GPU here, so
// the server's own status gets two stages added in the shape it writes them.
test('Monitor shows the stages of a split over GPUs', { skip }, async () => {
  const stages = [
    { stage: 0, device: 0, first_block: 0, last_block: 23, block_share: 0.5, vram_budget_bytes: 12 * 2 ** 30,
      vram_bytes: 11.5 * 2 ** 30, expert_cache_slots: [202, 202], summary: 'expert cache 202 of 512 per layer' },
    { stage: 1, device: 1, first_block: 24, last_block: 47, block_share: 0.5, vram_budget_bytes: 12 * 2 ** 30,
      vram_bytes: 11.6 * 2 ** 30, expert_cache_slots: [0, 203, 203], summary: 'expert cache 203 of 512 per layer' },
  ];
  let ownStages;
  await page.route('**/v1/status', async (route) => {
    const response = await route.fetch();
    const json = await response.json();
    ownStages = json.cuda_stages;
    await route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify({ ...json, cuda_stages: stages }) });
  });
  try {
    await page.locator(byId('tab-monitor')).click();
    await waitFor(async () => (await page.locator(byId('monitor-stage')).count()) === 2,
      { what: 'two stage rows', timeoutMs: 10000 });
    assert.equal(ownStages, null, 'a server on one card (or the CPU) reports no stages');
    const rows = await page.locator(byId('monitor-stage')).allInnerTexts();
    assert.match(rows[0], /0\s+0\s+0-23\s+50%\s+11\.5 GiB of 12\.0 GiB\s+202 a layer/);
    assert.match(rows[1], /1\s+1\s+24-47\s+50%\s+11\.6 GiB of 12\.0 GiB\s+203 a layer/);
  } finally {
    await page.unroute('**/v1/status');
  }
  // Back to the server's own status: the panel goes away.
  await waitFor(async () => !(await page.locator(byId('monitor-stages')).isVisible()),
    { what: 'the stages panel hidden again', timeoutMs: 10000 });
  await page.locator(byId('tab-chat')).click();
});

test('Monitor shows tokens/s, time to first token and the memory plan', { skip }, async () => {
  await page.locator(byId('tab-monitor')).click();
  assert.equal(await page.locator(byId('view-monitor')).isVisible(), true);
  assert.equal(await page.locator(byId('view-chat')).isVisible(), false);
  await waitFor(async () => /^\d/.test(await page.locator(byId('monitor-tokens-per-second')).innerText()),
    { what: 'a tokens/s figure', timeoutMs: 10000 });
  await waitFor(async () => /\d/.test(await page.locator(byId('monitor-ttft')).innerText()),
    { what: 'a time-to-first-token figure', timeoutMs: 10000 });
  await waitFor(async () => (await page.locator(`${byId('monitor-memory')} dd`).count()) > 0,
    { what: 'memory plan values', timeoutMs: 10000 });
  const memory = await page.locator(byId('monitor-memory')).innerText();
  assert.ok(/\d/.test(memory) && !/not reported/.test(memory), `memory plan: ${memory}`);
  assert.match(await page.locator(byId('monitor-running')).innerText(), /^\d+$/);
  assert.match(await page.locator(byId('monitor-waiting')).innerText(), /^\d+$/);
  // Generate while the Monitor is open: tokens/s must show a non-zero figure at some poll.
  const logitBias = await banEndTokens(server.url);
  const gen = page.evaluate(async (logit_bias) => {
    const models = await (await fetch('/v1/models')).json();
    const body = { model: models.data[0].id, messages: [{ role: 'user', content: 'go' }], max_tokens: 3000, temperature: 0, logit_bias };
    for (let k = 0; k < 6; k++) {
      await fetch('/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    }
  }, logitBias);
  let sawTokens = false;
  const t0 = Date.now();
  while (Date.now() - t0 < 15000 && !sawTokens) {
    const tps = Number((await page.locator(byId('monitor-tokens-per-second')).innerText()).replace(/,/g, ''));
    sawTokens = tps > 0;
    if (sawTokens) await screenshot('webapp-monitor.png'); // while it generates
    else await page.waitForTimeout(200);
  }
  await gen;
  assert.ok(sawTokens, 'tokens/s stayed at 0 while generating; ' + await page.locator(byId('monitor-updated')).innerText() + ' / ' + await page.locator(byId('monitor-tokens-per-second')).innerText());
  // Keyboard: arrow keys move between tabs.
  await page.locator(byId('tab-monitor')).focus();
  await page.keyboard.press('ArrowLeft');
  assert.equal(await page.locator(byId('view-chat')).isVisible(), true);
  assert.deepEqual(problems, []);
});
