// Strata web app: Chat (streaming /v1/chat/completions) and Monitor (/metrics + /v1/status).
// No framework and no build step. Every piece of text that comes from the model, the server or the user reaches the
// page through text nodes (createTextNode / textContent), never through innerHTML, so nothing can inject markup.
'use strict';

(() => {
  const STORE_CONVS = 'strata.conversations.v1';
  const STORE_SETTINGS = 'strata.settings.v1';
  const DEFAULT_SETTINGS = Object.freeze({
    system: '', temperature: 0.7, top_p: 0.95, max_tokens: 1024, thinking: false, apiKey: '',
  });
  const POLL_MS = 1000;
  const SPARK_POINTS = 60;

  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    if (attrs) {
      for (const [key, value] of Object.entries(attrs)) {
        if (value === undefined || value === null || value === false) continue;
        if (key === 'text') node.textContent = value;
        else if (key === 'className') node.className = value;
        else if (key === 'dataset') Object.assign(node.dataset, value);
        else node.setAttribute(key, value === true ? '' : String(value));
      }
    }
    if (children) for (const child of children) if (child != null) node.append(child);
    return node;
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Markdown: a small renderer that builds DOM nodes. Blocks: paragraphs, ATX headings, fenced code (with a copy
  // button), bullet and ordered lists (nested by indentation), block quotes, rules, pipe tables. Inline: code spans,
  // bold, italic, strikethrough, links (http, https, mailto only; rel=noopener), bare URLs, hard line breaks.

  const RE_FENCE = /^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$/;
  const RE_HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
  const RE_RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const RE_QUOTE = /^ {0,3}> ?(.*)$/;
  const RE_LIST = /^( *)([-*+]|\d{1,9}[.)])(?:[ \t]+(.*)|$)/;
  const RE_TABLE_SEP = /^ *\|? *:?-+:? *(\| *:?-+:? *)*\|? *$/;
  const isBlank = (line) => /^\s*$/.test(line);
  const indentOf = (line) => /^ */.exec(line)[0].length;

  function startsBlock(line) {
    return RE_FENCE.test(line) || RE_HEADING.test(line) || RE_RULE.test(line) || RE_QUOTE.test(line) ||
      RE_LIST.test(line);
  }

  function renderMarkdown(source, container) {
    const lines = source.replace(/\r\n?/g, '\n').replace(/\t/g, '    ').split('\n');
    container.replaceChildren(...renderBlocks(lines, 0));
  }

  function renderBlocks(lines, depth) {
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (isBlank(line)) { i++; continue; }
      let m;
      if ((m = RE_FENCE.exec(line))) {
        const fence = m[1];
        const body = [];
        i++;
        while (i < lines.length) {
          const close = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(lines[i]);
          if (close && close[1][0] === fence[0] && close[1].length >= fence.length) { i++; break; }
          body.push(lines[i]);
          i++;
        }
        out.push(codeBlock(body.join('\n'), m[2]));
        continue;
      }
      if ((m = RE_HEADING.exec(line))) {
        const h = el('h' + m[1].length);
        renderInline(m[2] || '', h);
        out.push(h);
        i++;
        continue;
      }
      if (RE_RULE.test(line)) { out.push(el('hr')); i++; continue; }
      if (RE_QUOTE.test(line)) {
        const body = [];
        while (i < lines.length && !isBlank(lines[i])) {
          const q = RE_QUOTE.exec(lines[i]);
          body.push(q ? q[1] : lines[i]);
          i++;
        }
        const quote = el('blockquote');
        if (depth < 16) quote.append(...renderBlocks(body, depth + 1));
        else renderInline(body.join('\n'), quote);
        out.push(quote);
        continue;
      }
      if (RE_LIST.exec(line) && depth < 16) {
        const parsed = parseList(lines, i, depth);
        out.push(parsed.node);
        i = parsed.next;
        continue;
      }
      if (line.includes('|') && i + 1 < lines.length && RE_TABLE_SEP.test(lines[i + 1]) &&
          lines[i + 1].includes('-')) {
        const parsed = parseTable(lines, i);
        out.push(parsed.node);
        i = parsed.next;
        continue;
      }
      const para = [line.trim()];
      i++;
      while (i < lines.length && !isBlank(lines[i]) && !startsBlock(lines[i])) {
        para.push(lines[i].trim());
        i++;
      }
      const p = el('p');
      renderInline(para.join('\n'), p);
      out.push(p);
    }
    return out;
  }

  function parseList(lines, start, depth) {
    const first = RE_LIST.exec(lines[start]);
    const baseIndent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const list = el(ordered ? 'ol' : 'ul');
    if (ordered) {
      const n = parseInt(first[2], 10);
      if (n !== 1) list.setAttribute('start', String(n));
    }
    const items = [];
    let loose = false;
    let i = start;
    while (i < lines.length) {
      const m = RE_LIST.exec(lines[i]);
      if (!m || m[1].length > baseIndent + 1 || /\d/.test(m[2]) !== ordered) break;
      const contentIndent = m[1].length + m[2].length + 1;
      const body = [m[3] || ''];
      let blankBefore = false;
      i++;
      while (i < lines.length) {
        const line = lines[i];
        if (isBlank(line)) { body.push(''); blankBefore = true; i++; continue; }
        const ind = indentOf(line);
        if (ind > baseIndent + 1) { body.push(line.slice(Math.min(ind, contentIndent))); blankBefore = false; i++; continue; }
        if (blankBefore || RE_LIST.test(line) || startsBlock(line)) break;
        body.push(line.trim()); // lazy continuation of the item's paragraph
        i++;
      }
      let trailingBlank = false;
      while (body.length > 1 && body[body.length - 1] === '') { body.pop(); trailingBlank = true; }
      if (body.includes('')) loose = true;
      items.push(body);
      const next = i < lines.length ? RE_LIST.exec(lines[i]) : null;
      if (trailingBlank && next && next[1].length <= baseIndent + 1) loose = true;
      if (trailingBlank && !next) break;
    }
    for (const body of items) {
      const li = el('li');
      const blocks = renderBlocks(body, depth + 1);
      for (const block of blocks) {
        if (!loose && block.tagName === 'P') li.append(...block.childNodes);
        else li.append(block);
      }
      list.append(li);
    }
    return { node: list, next: i };
  }

  function splitRow(line) {
    let s = line.trim();
    if (s.startsWith('|')) s = s.slice(1);
    if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
    return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, '|'));
  }

  function parseTable(lines, start) {
    const header = splitRow(lines[start]);
    const aligns = splitRow(lines[start + 1]).map((c) =>
      c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : c.startsWith(':') ? 'left' : '');
    const table = el('table');
    const headRow = el('tr');
    header.forEach((cell, k) => {
      const th = el('th', aligns[k] ? { align: aligns[k] } : null);
      renderInline(cell, th);
      headRow.append(th);
    });
    table.append(el('thead', null, [headRow]));
    const tbody = el('tbody');
    let i = start + 2;
    while (i < lines.length && !isBlank(lines[i]) && lines[i].includes('|')) {
      const row = el('tr');
      const cells = splitRow(lines[i]);
      for (let k = 0; k < header.length; k++) {
        const td = el('td', aligns[k] ? { align: aligns[k] } : null);
        renderInline(cells[k] || '', td);
        row.append(td);
      }
      tbody.append(row);
      i++;
    }
    table.append(tbody);
    return { node: table, next: i };
  }

  function codeBlock(code, lang) {
    const copy = el('button', { type: 'button', className: 'icon copy-code', text: 'Copy', 'data-testid': 'copy-code',
      'aria-label': 'Copy code' });
    copy.addEventListener('click', () => copyText(code, copy));
    const codeEl = el('code', { text: code });
    if (lang) codeEl.dataset.lang = lang;
    return el('div', { className: 'codeblock', 'data-testid': 'code-block' }, [
      el('div', { className: 'codeblock-head' }, [el('span', { text: lang || 'code' }), copy]),
      el('pre', null, [codeEl]),
    ]);
  }

  async function copyText(text, button) {
    let ok = false;
    try {
      await navigator.clipboard.writeText(text);
      ok = true;
    } catch {
      const area = el('textarea', { className: 'visually-hidden' });
      area.value = text;
      document.body.append(area);
      area.select();
      try { ok = document.execCommand('copy'); } catch { ok = false; }
      area.remove();
    }
    button.textContent = ok ? 'Copied' : 'Copy failed';
    setTimeout(() => { button.textContent = 'Copy'; }, 1500);
  }

  function safeHref(raw) {
    const url = raw.trim().replace(/^<(.*)>$/, '$1');
    try {
      const parsed = new URL(url, window.location.href);
      if (parsed.protocol === 'http:' || parsed.protocol === 'https:' || parsed.protocol === 'mailto:') {
        return parsed.href;
      }
    } catch { /* not a URL */ }
    return null;
  }

  function link(href, parent) {
    const a = el('a', { href, rel: 'noopener noreferrer nofollow', target: '_blank' });
    parent.append(a);
    return a;
  }

  const SCAN_LIMIT = 4000; // characters an inline construct may span
  const INLINE_BUDGET = 2000000; // characters scanned for closing delimiters per paragraph
  const RE_BARE_URL = /^https?:\/\/[^\s<>"'`]*[^\s<>"'`.,;:!?)\]}*_~]/;
  const PUNCT = '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~';

  // Renders inline markdown of `text` into `parent`. Hostile text cannot make this slow: `depth` bounds recursion,
  // `budget` (shared by the nested calls) bounds the characters scanned looking for closing delimiters, after which
  // the rest is plain text, and `known` remembers how far each delimiter is known to have no valid close.
  function renderInline(text, parent, depth = 0, budget = { left: INLINE_BUDGET }) {
    const known = {};
    let buf = '';
    const flush = () => { if (buf) { parent.append(document.createTextNode(buf)); buf = ''; } };
    const n = text.length;
    let i = 0;
    while (i < n) {
      const c = text[i];
      if (c === '\\' && i + 1 < n && PUNCT.includes(text[i + 1])) { buf += text[i + 1]; i += 2; continue; }
      if (c === '\n') { flush(); parent.append(el('br')); i++; continue; }
      if (c === '`') {
        let run = 1;
        while (text[i + run] === '`') run++;
        const ticks = '`'.repeat(run);
        let close = text.indexOf(ticks, i + run);
        while (close !== -1 && text[close + run] === '`') close = text.indexOf(ticks, close + run + 1);
        if (close - i > SCAN_LIMIT * 8) close = -1; // bounded work per delimiter on hostile text
        if (close !== -1) {
          flush();
          let inner = text.slice(i + run, close).replace(/\n/g, ' ');
          if (inner.length > 2 && inner.startsWith(' ') && inner.endsWith(' ')) inner = inner.slice(1, -1);
          parent.append(el('code', { text: inner }));
          i = close + run;
          continue;
        }
        buf += ticks;
        i += run;
        continue;
      }
      if (depth < 8 && budget.left > 0) {
        if (c === '[') {
          const parsed = parseLink(text, i, budget);
          if (parsed) {
            flush();
            const href = safeHref(parsed.url);
            if (href) renderInline(parsed.label, link(href, parent), depth + 1, budget);
            else renderInline(parsed.label, parent, depth + 1, budget);
            i = parsed.end;
            continue;
          }
        }
        if ((c === '*' || c === '_' || c === '~') && text[i + 1] === c && (c !== '_' || !/\w/.test(text[i - 1] || ''))) {
          const delim = c + c;
          const close = findClose(text, i + 2, delim, known, budget);
          if (close !== -1) {
            flush();
            const node = el(c === '~' ? 'del' : 'strong');
            renderInline(text.slice(i + 2, close), node, depth + 1, budget);
            parent.append(node);
            i = close + 2;
            continue;
          }
        }
        if ((c === '*' || c === '_') && text[i + 1] !== c && (c === '*' || !/\w/.test(text[i - 1] || ''))) {
          const close = findClose(text, i + 1, c, known, budget);
          if (close !== -1) {
            flush();
            const node = el('em');
            renderInline(text.slice(i + 1, close), node, depth + 1, budget);
            parent.append(node);
            i = close + 1;
            continue;
          }
        }
      }
      if (c === 'h' && !/\w/.test(text[i - 1] || '')) {
        const m = RE_BARE_URL.exec(text.slice(i, i + 2048));
        if (m) {
          const href = safeHref(m[0]);
          if (href) {
            flush();
            link(href, parent).textContent = m[0];
            i += m[0].length;
            continue;
          }
        }
      }
      buf += c;
      i++;
    }
    flush();
  }

  // Closing delimiter for emphasis: content non-empty, no space just inside, `_` only at a word boundary. Whether a
  // position closes does not depend on where the search started, so a failed search up to `end` means no later
  // search needs to look before `end` (known[delim]): unmatched delimiters cost linear time in all.
  function findClose(text, from, delim, known, budget) {
    if (from >= text.length || /\s/.test(text[from])) return -1;
    let k = Math.max(from, known[delim] || 0);
    const end = Math.min(text.length, from + SCAN_LIMIT);
    const start = k;
    while ((k = text.indexOf(delim, k)) !== -1 && k <= end) {
      if (k > from && !/\s/.test(text[k - 1]) && (delim.length === 2 || text[k + 1] !== delim) &&
          (delim !== '_' || !/\w/.test(text[k + 1] || ''))) {
        budget.left -= k - start;
        return k;
      }
      k += delim.length;
    }
    budget.left -= end - start;
    known[delim] = Math.max(known[delim] || 0, end);
    return -1;
  }

  function parseLink(text, start, budget) {
    let depth = 0;
    let k = start;
    const end = Math.min(text.length, start + SCAN_LIMIT);
    for (; k < end; k++) {
      const ch = text[k];
      if (ch === '\\') { k++; continue; }
      if (ch === '[') depth++;
      else if (ch === ']' && --depth === 0) break;
      else if (ch === '\n' && text[k + 1] === '\n') return null;
    }
    budget.left -= k - start;
    if (k >= end || text[k + 1] !== '(') return null;
    const close = text.indexOf(')', k + 2);
    if (close === -1 || close - k > SCAN_LIMIT) return null;
    const target = text.slice(k + 2, close).trim();
    const url = target.split(/\s+/)[0] || '';
    if (!url) return null;
    return { label: text.slice(start + 1, k), url, end: close + 1 };
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Storage

  function loadJSON(key, fallback) {
    try {
      const raw = localStorage.getItem(key);
      return raw ? JSON.parse(raw) : fallback;
    } catch {
      return fallback;
    }
  }

  function saveJSON(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
      return true;
    } catch (e) {
      setStatus('Could not save to browser storage: ' + e.message, true);
      return false;
    }
  }

  const state = {
    settings: { ...DEFAULT_SETTINGS, ...loadJSON(STORE_SETTINGS, {}) },
    convs: [],
    currentId: null,
    busy: false,
    controller: null,
    model: null,
  };

  {
    const stored = loadJSON(STORE_CONVS, null);
    if (stored && Array.isArray(stored.convs)) {
      state.convs = stored.convs.filter((c) => c && typeof c.id === 'string' && Array.isArray(c.messages));
      state.currentId = stored.currentId;
    }
  }

  const saveConvs = () => saveJSON(STORE_CONVS, { convs: state.convs, currentId: state.currentId });
  const currentConv = () => state.convs.find((c) => c.id === state.currentId) || null;
  const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

  function authHeaders() {
    const headers = {};
    if (state.settings.apiKey) headers.Authorization = 'Bearer ' + state.settings.apiKey;
    return headers;
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Tabs

  const tabs = [$('tab-chat'), $('tab-monitor')];

  function selectTab(tab, focus) {
    for (const t of tabs) {
      const selected = t === tab;
      t.setAttribute('aria-selected', String(selected));
      t.tabIndex = selected ? 0 : -1;
      $(t.getAttribute('aria-controls')).hidden = !selected;
    }
    if (focus) tab.focus();
    const monitor = tab.id === 'tab-monitor';
    if (window.location.hash !== (monitor ? '#monitor' : '')) {
      history.replaceState(null, '', monitor ? '#monitor' : window.location.pathname + window.location.search);
    }
    if (monitor) startMonitor(); else stopMonitor();
  }

  for (const tab of tabs) {
    tab.addEventListener('click', () => selectTab(tab, false));
    tab.addEventListener('keydown', (e) => {
      const k = tabs.indexOf(tab);
      let next = null;
      if (e.key === 'ArrowRight') next = tabs[(k + 1) % tabs.length];
      else if (e.key === 'ArrowLeft') next = tabs[(k + tabs.length - 1) % tabs.length];
      else if (e.key === 'Home') next = tabs[0];
      else if (e.key === 'End') next = tabs[tabs.length - 1];
      if (next) { e.preventDefault(); selectTab(next, true); }
    });
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Settings

  const settingInputs = {
    system: $('set-system'), temperature: $('set-temperature'), top_p: $('set-top-p'),
    max_tokens: $('set-max-tokens'), thinking: $('set-thinking'), apiKey: $('set-api-key'),
  };

  function showSettings() {
    for (const [key, input] of Object.entries(settingInputs)) {
      if (input.type === 'checkbox') input.checked = Boolean(state.settings[key]);
      else input.value = state.settings[key] ?? '';
    }
  }

  function readSetting(key, input) {
    if (input.type === 'checkbox') return input.checked;
    if (input.type === 'number') {
      const v = Number(input.value);
      return input.value === '' || !Number.isFinite(v) ? DEFAULT_SETTINGS[key] : v;
    }
    return input.value;
  }

  for (const [key, input] of Object.entries(settingInputs)) {
    input.addEventListener('change', () => {
      state.settings[key] = readSetting(key, input);
      saveJSON(STORE_SETTINGS, state.settings);
      if (key === 'apiKey') loadModel();
    });
  }
  // Enter in a settings field must not submit (and reload) the page; `change` has already saved the value.
  $('settings-form').addEventListener('submit', (e) => e.preventDefault());
  $('set-reset').addEventListener('click', () => {
    const apiKey = state.settings.apiKey;
    state.settings = { ...DEFAULT_SETTINGS, apiKey };
    saveJSON(STORE_SETTINGS, state.settings);
    showSettings();
  });

  // ---------------------------------------------------------------------------------------------------------------
  // Conversations list

  const convList = $('conv-list');

  function renderConvList() {
    const items = [...state.convs].sort((a, b) => (b.updated || 0) - (a.updated || 0)).map((conv) => {
      const active = conv.id === state.currentId;
      const open = el('button', { type: 'button', className: 'conv-open', text: conv.title || 'New chat',
        title: conv.title || 'New chat', 'data-testid': 'conversation-open', 'aria-current': active ? 'true' : null,
        disabled: state.busy });
      open.addEventListener('click', () => openConv(conv.id));
      const rename = el('button', { type: 'button', className: 'icon', text: 'Rename', 'data-testid': 'conversation-rename',
        'aria-label': 'Rename ' + (conv.title || 'chat'), disabled: state.busy });
      rename.addEventListener('click', () => startRename(li, conv));
      const del = el('button', { type: 'button', className: 'icon', text: 'Delete', 'data-testid': 'conversation-delete',
        'aria-label': 'Delete ' + (conv.title || 'chat'), disabled: state.busy });
      del.addEventListener('click', () => {
        // Two clicks: the first arms the button, so a stray click does not lose a conversation.
        if (del.dataset.armed) { deleteConv(conv.id); return; }
        del.dataset.armed = '1';
        del.textContent = 'Sure?';
        setTimeout(() => { if (del.isConnected) { delete del.dataset.armed; del.textContent = 'Delete'; } }, 3000);
      });
      const li = el('li', { className: 'conv-item' + (active ? ' active' : ''), 'data-testid': 'conversation-item',
        'data-conv-id': conv.id }, [open, rename, del]);
      return li;
    });
    convList.replaceChildren(...items);
  }

  function startRename(li, conv) {
    const input = el('input', { type: 'text', 'aria-label': 'Conversation name', 'data-testid': 'conversation-rename-input',
      maxlength: 200 });
    input.value = conv.title || '';
    let done = false;
    const finish = (commit) => {
      if (done) return;
      done = true;
      if (commit && input.value.trim()) {
        conv.title = input.value.trim();
        saveConvs();
      }
      renderConvList();
    };
    input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') { e.preventDefault(); finish(true); }
      else if (e.key === 'Escape') { e.preventDefault(); finish(false); }
    });
    input.addEventListener('blur', () => finish(true));
    li.replaceChildren(input);
    input.focus();
    input.select();
  }

  function newConv() {
    if (state.busy) return;
    const current = currentConv();
    if (current && current.messages.length === 0) { $('chat-input').focus(); return; }
    const conv = { id: newId(), title: '', created: Date.now(), updated: Date.now(), messages: [] };
    state.convs.push(conv);
    state.currentId = conv.id;
    saveConvs();
    renderConvList();
    renderMessages();
    $('chat-input').focus();
  }

  function openConv(id) {
    if (state.busy) return;
    state.currentId = id;
    saveConvs();
    renderConvList();
    renderMessages();
  }

  function deleteConv(id) {
    if (state.busy) return;
    state.convs = state.convs.filter((c) => c.id !== id);
    if (state.currentId === id) {
      const latest = [...state.convs].sort((a, b) => (b.updated || 0) - (a.updated || 0))[0];
      state.currentId = latest ? latest.id : null;
    }
    saveConvs();
    renderConvList();
    renderMessages();
  }

  $('new-conv').addEventListener('click', newConv);

  // ---------------------------------------------------------------------------------------------------------------
  // Messages

  const messagesEl = $('messages');
  const emptyHint = $('empty-hint');

  function nearBottom() {
    return messagesEl.scrollHeight - messagesEl.scrollTop - messagesEl.clientHeight < 80;
  }

  function scrollToBottom() { messagesEl.scrollTop = messagesEl.scrollHeight; }

  // Splits `<think>...</think>` out of content for servers or templates that leave it in the text.
  function splitThink(content) {
    const m = /^\s*<think>([\s\S]*?)(<\/think>|$)([\s\S]*)$/.exec(content);
    if (!m) return { reasoning: '', content };
    return { reasoning: m[1], content: m[2] ? m[3].replace(/^\s+/, '') : '', thinkingOpen: !m[2] };
  }

  function formatMeta(msg) {
    const parts = [];
    if (msg.stopped) parts.push('stopped');
    if (msg.finish_reason === 'length') parts.push('hit max tokens');
    if (msg.tokens != null) parts.push(msg.tokens + ' tokens');
    if (msg.tps != null && Number.isFinite(msg.tps)) parts.push(msg.tps.toFixed(1) + ' tok/s');
    if (msg.ttft_ms != null) parts.push('first token ' + Math.round(msg.ttft_ms) + ' ms');
    if (msg.cached_tokens) parts.push(msg.cached_tokens + ' prompt tokens reused');
    return parts.join(' · ');
  }

  // Builds the view of one message; returns an updater used while streaming.
  function messageView(msg) {
    const body = el('div', { className: 'msg-body', 'data-testid': 'message-content' });
    const meta = el('div', { className: 'msg-meta', 'data-testid': 'message-meta' });
    const root = el('article', {
      className: 'msg ' + (msg.error ? 'error' : msg.role), 'data-testid': 'message', 'data-role': msg.role,
    }, [el('div', { className: 'msg-role', text: msg.role === 'user' ? 'You' : 'Assistant' })]);
    let thinking = null;
    let thinkingBody = null;
    let userToggled = false;
    if (msg.role === 'assistant') {
      thinkingBody = el('div', { className: 'thinking-body', 'data-testid': 'thinking-content' });
      const summary = el('summary', { text: 'Thinking' });
      thinking = el('details', { className: 'thinking', 'data-testid': 'thinking', hidden: true }, [summary, thinkingBody]);
      summary.addEventListener('click', () => { userToggled = true; });
      root.append(thinking);
    }
    root.append(body, meta);

    const update = (streaming) => {
      if (msg.role === 'user') {
        body.textContent = msg.content;
      } else if (msg.error && !msg.content) {
        body.className = 'msg-body msg-error';
        body.textContent = msg.error;
      } else {
        const split = msg.reasoning ? { reasoning: msg.reasoning, content: msg.content } : splitThink(msg.content || '');
        if (split.reasoning) {
          thinking.hidden = false;
          thinkingBody.textContent = split.reasoning;
          const stillThinking = streaming && (!split.content || split.thinkingOpen);
          if (!userToggled) thinking.open = stillThinking;
          thinking.firstChild.textContent = stillThinking ? 'Thinking…' : 'Thinking';
        }
        body.className = 'msg-body md' + (streaming ? ' streaming' : '');
        renderMarkdown(split.content, body);
        if (msg.error) body.append(el('p', { className: 'msg-error', text: msg.error }));
      }
      meta.textContent = formatMeta(msg);
      meta.hidden = !meta.textContent;
    };
    update(false);
    return { root, update };
  }

  function renderMessages() {
    const conv = currentConv();
    const views = conv ? conv.messages.map((m) => messageView(m).root) : [];
    emptyHint.hidden = views.length > 0;
    messagesEl.replaceChildren(emptyHint, ...views);
    scrollToBottom();
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Streaming chat

  // Yields the server-sent events of a fetch response as { event, data } (data lines joined by newlines).
  async function* sseEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    let data = [];
    let event = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (value) buf += decoder.decode(value, { stream: true });
      if (done) buf += decoder.decode() + '\n\n';
      let nl;
      while ((nl = buf.indexOf('\n')) !== -1) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          if (data.length) yield { event, data: data.join('\n') };
          data = [];
          event = '';
        } else if (line.startsWith(':')) {
          // comment / keep-alive
        } else {
          const colon = line.indexOf(':');
          const field = colon === -1 ? line : line.slice(0, colon);
          let val = colon === -1 ? '' : line.slice(colon + 1);
          if (val.startsWith(' ')) val = val.slice(1);
          if (field === 'data') data.push(val);
          else if (field === 'event') event = val;
        }
      }
      if (done) return;
    }
  }

  async function errorMessage(response) {
    let text = '';
    try { text = await response.text(); } catch { /* ignore */ }
    try {
      const body = JSON.parse(text);
      const err = body.error || body;
      const message = typeof err === 'string' ? err : err.message;
      if (message) return `${response.status}: ${message}`;
    } catch { /* not JSON */ }
    return `${response.status} ${response.statusText}${text ? ': ' + text.slice(0, 300) : ''}`;
  }

  function buildRequest(conv) {
    const s = state.settings;
    const messages = [];
    if (s.system && s.system.trim()) messages.push({ role: 'system', content: s.system });
    for (const m of conv.messages) {
      if (m.error && !m.content) continue;
      if (m.role === 'user' || m.role === 'assistant') messages.push({ role: m.role, content: m.content || '' });
    }
    const req = {
      model: state.model || 'default',
      messages,
      stream: true,
      stream_options: { include_usage: true },
      temperature: Number(s.temperature),
      top_p: Number(s.top_p),
      max_tokens: Math.max(1, Math.round(Number(s.max_tokens))),
      chat_template_kwargs: { enable_thinking: Boolean(s.thinking) },
    };
    return req;
  }

  const input = $('chat-input');
  const sendButton = $('send-button');
  const stopButton = $('stop-button');
  const statusEl = $('composer-status');

  function setStatus(text, isError) {
    statusEl.textContent = text || '';
    statusEl.classList.toggle('error', Boolean(isError));
  }

  function setBusy(busy) {
    state.busy = busy;
    sendButton.hidden = busy;
    stopButton.hidden = !busy;
    document.body.dataset.busy = busy ? 'true' : 'false';
    $('new-conv').disabled = busy;
    renderConvList();
  }

  async function send() {
    const text = input.value;
    if (state.busy || !text.trim()) return;
    let conv = currentConv();
    if (!conv) {
      conv = { id: newId(), title: '', created: Date.now(), updated: Date.now(), messages: [] };
      state.convs.push(conv);
      state.currentId = conv.id;
    }
    if (!conv.title) conv.title = text.trim().replace(/\s+/g, ' ').slice(0, 60);
    const userMsg = { role: 'user', content: text };
    conv.messages.push(userMsg);
    conv.updated = Date.now();
    input.value = '';
    emptyHint.hidden = true;
    messagesEl.append(messageView(userMsg).root);

    const msg = { role: 'assistant', content: '', reasoning: '' };
    const request = buildRequest(conv);
    conv.messages.push(msg);
    const view = messageView(msg);
    messagesEl.append(view.root);
    scrollToBottom();
    saveConvs();

    const controller = new AbortController();
    state.controller = controller;
    setBusy(true);
    setStatus('Generating…');

    const started = performance.now();
    let firstAt = null;
    let chunks = 0;
    let pending = false;
    const scheduleRender = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        const stick = nearBottom();
        view.update(state.controller === controller);
        if (stick) scrollToBottom();
      });
    };

    try {
      const response = await fetch('/v1/chat/completions', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream', ...authHeaders() },
        body: JSON.stringify(request),
        signal: controller.signal,
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      for await (const ev of sseEvents(response)) {
        if (ev.data === '[DONE]') break;
        let obj;
        try { obj = JSON.parse(ev.data); } catch { continue; }
        if (obj.error) throw new Error(typeof obj.error === 'string' ? obj.error : obj.error.message || 'server error');
        if (obj.usage) {
          msg.tokens = obj.usage.completion_tokens;
          const details = obj.usage.prompt_tokens_details;
          if (details && details.cached_tokens) msg.cached_tokens = details.cached_tokens;
        }
        for (const choice of obj.choices || []) {
          const delta = choice.delta || {};
          const reasoning = delta.reasoning_content || delta.reasoning;
          if (typeof reasoning === 'string' && reasoning) msg.reasoning += reasoning;
          if (typeof delta.content === 'string' && delta.content) msg.content += delta.content;
          if ((reasoning || delta.content) && firstAt === null) firstAt = performance.now();
          if (reasoning || delta.content) chunks++;
          if (choice.finish_reason) msg.finish_reason = choice.finish_reason;
        }
        scheduleRender();
      }
    } catch (e) {
      if (e.name === 'AbortError') msg.stopped = true;
      else msg.error = e.message || String(e);
    } finally {
      const end = performance.now();
      if (msg.tokens == null && chunks) msg.tokens = chunks;
      if (firstAt !== null) {
        msg.ttft_ms = firstAt - started;
        // Decode speed after the first token; when the whole reply arrived in a few network reads that window is
        // too short to time, so fall back to tokens over the whole request (a lower bound).
        const genSeconds = (end - firstAt) / 1000;
        if (msg.tokens > 1 && genSeconds >= 0.25) msg.tps = (msg.tokens - 1) / genSeconds;
        else if (msg.tokens > 0 && end > started) msg.tps = msg.tokens / ((end - started) / 1000);
      }
      if (!msg.reasoning) delete msg.reasoning;
      state.controller = null;
      conv.updated = Date.now();
      const stick = nearBottom();
      view.update(false);
      if (stick) scrollToBottom();
      setBusy(false);
      setStatus(msg.error ? 'Error: ' + msg.error : msg.stopped ? 'Stopped.' : '', Boolean(msg.error));
      saveConvs();
      input.focus();
    }
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  stopButton.addEventListener('click', stop);
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    } else if (e.key === 'Escape' && state.busy) {
      e.preventDefault();
      stop();
    }
  });

  // ---------------------------------------------------------------------------------------------------------------
  // Server identity

  const dot = $('server-dot');
  const modelName = $('model-name');

  async function loadModel() {
    try {
      const response = await fetch('/v1/models', { headers: authHeaders() });
      if (response.status === 401) {
        dot.className = 'dot bad';
        modelName.textContent = 'API key needed (Settings)';
        $('settings').open = true; // show where the key goes
        return;
      }
      if (!response.ok) throw new Error(await errorMessage(response));
      const body = await response.json();
      const first = body && Array.isArray(body.data) && body.data[0];
      state.model = first && typeof first.id === 'string' ? first.id : null;
      modelName.textContent = state.model || 'no model';
      dot.className = 'dot ok';
    } catch (e) {
      dot.className = 'dot bad';
      modelName.textContent = 'server unreachable';
    }
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Monitor

  // Parses Prometheus text exposition into name -> summed value (labels summed; enough for our gauges and counters).
  function parsePrometheus(text) {
    const values = new Map();
    for (const line of text.split('\n')) {
      if (!line || line.startsWith('#')) continue;
      const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const v = Number(m[3] === '+Inf' ? Infinity : m[3] === '-Inf' ? -Infinity : m[3]);
      if (Number.isNaN(v)) continue;
      // Histogram buckets are kept per `le` only through _sum/_count, which is all the monitor needs.
      if (m[1].endsWith('_bucket')) continue;
      values.set(m[1], (values.get(m[1]) || 0) + v);
    }
    return values;
  }

  const metric = (values, name) => {
    for (const n of [name, name.replace(/^strata:/, 'strata_')]) if (values.has(n)) return values.get(n);
    return undefined;
  };

  function fmtNumber(v, digits = 0) {
    if (v === undefined || v === null || !Number.isFinite(v)) return '–';
    return v.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }

  function fmtBytes(v) {
    if (!Number.isFinite(v)) return String(v);
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let k = 0;
    let x = Math.abs(v);
    while (x >= 1024 && k < units.length - 1) { x /= 1024; k++; }
    return (v < 0 ? '-' : '') + (k === 0 ? x : x.toFixed(x < 10 ? 2 : 1)) + ' ' + units[k];
  }

  function fmtDuration(seconds) {
    if (!Number.isFinite(seconds)) return '–';
    const s = Math.floor(seconds);
    const d = Math.floor(s / 86400);
    const h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60);
    const pad = (x) => String(x).padStart(2, '0');
    return (d ? d + 'd ' : '') + pad(h) + ':' + pad(m) + ':' + pad(s % 60);
  }

  function fmtMs(seconds) {
    if (!Number.isFinite(seconds)) return '–';
    return seconds < 10 ? Math.round(seconds * 1000) + ' ms' : seconds.toFixed(1) + ' s';
  }

  // Metric and JSON keys as labels: no prefix, no unit suffix (the value shows the unit), spaces for underscores.
  const prettyKey = (k) => k.replace(/^strata[:_]/, '').replace(/_(bytes|total)$/, '').replace(/_/g, ' ');

  function fmtValue(key, v) {
    if (typeof v === 'number') {
      if (/bytes?$|_bytes_|^bytes/i.test(key)) return fmtBytes(v);
      if (/seconds?$|_s$/i.test(key) && /uptime/i.test(key)) return fmtDuration(v);
      return Number.isInteger(v) ? fmtNumber(v) : fmtNumber(v, 3);
    }
    if (typeof v === 'boolean') return v ? 'yes' : 'no';
    if (v === null || v === undefined) return '–';
    return String(v);
  }

  // Flattens nested JSON into [key, value] pairs ("a.b.c"); arrays of scalars are joined.
  function flatten(obj, prefix = '', out = [], depth = 0) {
    if (obj === null || typeof obj !== 'object' || depth > 4) {
      out.push([prefix || 'value', obj]);
      return out;
    }
    if (Array.isArray(obj)) {
      if (obj.every((x) => x === null || typeof x !== 'object')) out.push([prefix, obj.join(', ')]);
      else obj.forEach((x, k) => flatten(x, prefix + '[' + k + ']', out, depth + 1));
      return out;
    }
    for (const [k, v] of Object.entries(obj)) flatten(v, prefix ? prefix + '.' + k : k, out, depth + 1);
    return out;
  }

  // pairs: [key, value] (key shown prettified, value formatted by its key) or [label, value, 'bytes'].
  function fillKV(dl, pairs) {
    const nodes = [];
    for (const [k, v, unit] of pairs.slice(0, 80)) {
      const text = unit === 'bytes' && typeof v === 'number' ? fmtBytes(v) : fmtValue(k, v);
      nodes.push(el('dt', { text: unit ? k : prettyKey(k) }), el('dd', { text, 'data-key': k }));
    }
    dl.replaceChildren(...nodes);
  }

  // A memory plan: {items: [{what, bytes}], total_bytes, ...} as one row per item, or any JSON flattened.
  function memoryPairs(memory) {
    if (memory && typeof memory === 'object' && Array.isArray(memory.items)) {
      const pairs = memory.items.slice(0, 60).map((it) => [String(it?.what ?? it?.name ?? '?'), it?.bytes, 'bytes']);
      for (const [k, v] of Object.entries(memory)) if (k !== 'items') pairs.push(...flatten(v, k));
      return pairs;
    }
    return flatten(memory);
  }

  const monitor = { timer: null, prev: null, tpsHistory: [], recentTtft: null, running: false };

  function startMonitor() {
    if (monitor.running) return;
    monitor.running = true;
    pollOnce();
  }

  function stopMonitor() {
    monitor.running = false;
    if (monitor.timer) clearTimeout(monitor.timer);
    monitor.timer = null;
  }

  async function fetchWithTimeout(url, ms) {
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(), ms);
    try {
      return await fetch(url, { headers: authHeaders(), signal: ctl.signal, cache: 'no-store' });
    } finally {
      clearTimeout(t);
    }
  }

  async function pollOnce() {
    if (!monitor.running) return;
    const started = performance.now();
    try {
      const [metricsRes, statusRes] = await Promise.all([
        fetchWithTimeout('/metrics', 2500), fetchWithTimeout('/v1/status', 2500),
      ]);
      if (metricsRes.ok) showMetrics(parsePrometheus(await metricsRes.text()));
      else showError('metrics: ' + (await errorMessage(metricsRes)));
      if (statusRes.ok) showStatus(await statusRes.json());
      else showError('status: ' + (await errorMessage(statusRes)));
      if (metricsRes.ok && statusRes.ok) {
        dot.className = 'dot ok';
        $('mon-updated').textContent = 'Updated ' + new Date().toLocaleTimeString();
      }
    } catch (e) {
      dot.className = 'dot bad';
      showError(e.name === 'AbortError' ? 'server did not answer' : e.message);
    }
    if (monitor.running) {
      monitor.timer = setTimeout(pollOnce, Math.max(100, POLL_MS - (performance.now() - started)));
    }
  }

  function showError(text) {
    $('mon-updated').textContent = 'Monitor: ' + text;
  }

  function showMetrics(values) {
    const now = performance.now() / 1000;
    const gen = metric(values, 'strata:generation_tokens_total');
    const ttftSum = metric(values, 'strata:time_to_first_token_seconds_sum');
    const ttftCount = metric(values, 'strata:time_to_first_token_seconds_count');
    const prev = monitor.prev;
    if (prev && gen !== undefined && prev.gen !== undefined && now > prev.t) {
      const tps = Math.max(0, (gen - prev.gen) / (now - prev.t));
      $('mon-tps').textContent = fmtNumber(tps, 1);
      monitor.tpsHistory.push(tps);
      if (monitor.tpsHistory.length > SPARK_POINTS) monitor.tpsHistory.shift();
      drawSpark();
    } else if (gen === undefined) {
      $('mon-tps').textContent = '–';
    } else if (!prev) {
      $('mon-tps').textContent = fmtNumber(0, 1);
    }
    if (prev && ttftCount !== undefined && prev.ttftCount !== undefined && ttftCount > prev.ttftCount) {
      monitor.recentTtft = (ttftSum - prev.ttftSum) / (ttftCount - prev.ttftCount);
    }
    const ttftAvg = ttftCount ? ttftSum / ttftCount : NaN;
    $('mon-ttft').textContent = monitor.recentTtft !== null ? fmtMs(monitor.recentTtft)
      : Number.isFinite(ttftAvg) ? fmtMs(ttftAvg) : '–';
    $('mon-ttft-sub').textContent = Number.isFinite(ttftAvg)
      ? `average ${fmtMs(ttftAvg)} over ${fmtNumber(ttftCount)} requests` : 'no requests yet';
    monitor.prev = { t: now, gen, ttftSum, ttftCount };

    $('mon-running').textContent = fmtNumber(metric(values, 'strata:num_requests_running'));
    $('mon-waiting').textContent = fmtNumber(metric(values, 'strata:num_requests_waiting'));
    const kv = metric(values, 'strata:kv_cache_usage_perc');
    if (kv === undefined) {
      $('mon-kv').textContent = '–';
    } else {
      const pct = kv <= 1 ? kv * 100 : kv; // vLLM convention: a fraction in [0, 1]
      $('mon-kv').textContent = fmtNumber(pct, 1) + ' %';
      $('mon-kv-bar').style.width = Math.min(100, Math.max(0, pct)) + '%';
    }

    // Speculative decoding since the start: the share of draft tokens accepted, and the tokens a verification round
    // gives (its accepted drafts plus the model's own next token).
    const rounds = metric(values, 'strata:spec_rounds_total');
    const drafted = metric(values, 'strata:spec_draft_tokens_total');
    const accepted = metric(values, 'strata:spec_accepted_tokens_total');
    if (rounds === undefined || drafted === undefined || accepted === undefined) {
      $('mon-spec').textContent = '–';
      $('mon-spec-sub').textContent = 'not reported';
    } else if (!(rounds > 0) || !(drafted > 0)) {
      $('mon-spec').textContent = '–';
      $('mon-spec-sub').textContent = 'no speculative rounds yet';
    } else {
      $('mon-spec').textContent = fmtNumber(100 * accepted / drafted, 1) + ' %';
      $('mon-spec-sub').textContent = `accepted; ${fmtNumber((accepted + rounds) / rounds, 2)} tokens a round over ` +
        `${fmtNumber(rounds)} rounds`;
    }

    const totals = [];
    for (const [name, v] of values) {
      if (/_total$/.test(name)) totals.push([name, v]);
    }
    totals.sort((a, b) => a[0].localeCompare(b[0]));
    fillKV($('mon-totals'), totals);
  }

  function drawSpark() {
    const canvas = $('mon-tps-chart');
    const ctx = canvas.getContext && canvas.getContext('2d');
    if (!ctx) return;
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 300;
    const h = canvas.clientHeight || 48;
    if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const data = monitor.tpsHistory;
    if (data.length < 2) return;
    const max = Math.max(1, ...data);
    ctx.strokeStyle = getComputedStyle(document.documentElement).getPropertyValue('--accent').trim() || '#2f6fde';
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    data.forEach((v, k) => {
      const x = w - ((data.length - 1 - k) / (SPARK_POINTS - 1)) * w; // newest at the right edge
      const y = h - 2 - (v / max) * (h - 4);
      if (k === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }

  function findKey(obj, names) {
    if (!obj || typeof obj !== 'object') return undefined;
    for (const n of names) if (obj[n] !== undefined && obj[n] !== null) return obj[n];
    return undefined;
  }

  function showStatus(status) {
    if (!status || typeof status !== 'object') return;
    const server = [];
    const model = status.model;
    if (typeof model === 'string') server.push(['model', model]);
    else if (model && typeof model === 'object') server.push(...flatten(model, 'model'));
    if (status.version !== undefined) server.push(['version', status.version]);
    const uptime = findKey(status, ['uptime_seconds', 'uptime_s', 'uptime']);
    if (typeof uptime === 'number') server.push(['uptime', fmtDuration(uptime)]);
    else if (uptime !== undefined) server.push(['uptime', uptime]);
    for (const k of ['backend', 'threads', 'context_length', 'n_ctx', 'parallel', 'build', 'settings']) {
      if (status[k] !== undefined) server.push(...flatten(status[k], k));
    }
    fillKV($('mon-server'), server);

    const memory = findKey(status, ['memory_plan', 'memory', 'plan']);
    fillKV($('mon-memory'), memory !== undefined ? memoryPairs(memory) : [['memory plan', 'not reported']]);

    const slots = findKey(status, ['slots']);
    const slotsEl = $('mon-slots');
    if (Array.isArray(slots) && slots.length && slots.every((s) => s && typeof s === 'object')) {
      const cols = [...new Set(slots.flatMap((s) => Object.keys(s).filter((k) => typeof s[k] !== 'object' || s[k] === null)))]
        .filter((k) => k !== 'request_id').slice(0, 7);
      const head = el('tr', null, cols.map((c) => el('th', { scope: 'col', text: prettyKey(c) })));
      const rows = slots.slice(0, 256).map((s) => el('tr', { 'data-testid': 'monitor-slot' },
        cols.map((c) => el('td', { text: fmtValue(c, s[c]) }))));
      slotsEl.replaceChildren(el('div', { className: 'table-scroll' }, [
        el('table', { className: 'slots-table' }, [el('thead', null, [head]), el('tbody', null, rows)])]));
    } else if (slots !== undefined) {
      const dl = el('dl', { className: 'kv' });
      fillKV(dl, flatten(slots, 'slots'));
      slotsEl.replaceChildren(dl);
    } else {
      slotsEl.replaceChildren();
    }
    const queue = findKey(status, ['queue', 'scheduler']);
    fillKV($('mon-queue'), queue !== undefined ? flatten(queue, 'queue') : []);

    showStages(status.cuda_stages);

    const experts = findKey(status, ['expert_cache', 'experts']) ??
      (memory && typeof memory === 'object' ? findKey(memory, ['expert_cache', 'experts']) : undefined);
    const panel = $('mon-experts-panel');
    if (experts !== undefined && experts !== null) {
      panel.hidden = false;
      fillKV($('mon-experts'), flatten(experts));
    } else {
      panel.hidden = true;
    }
  }

  // A split over several GPUs (--split): each stage's card, its blocks and their share, its VRAM and expert slots.
  function showStages(stages) {
    const panel = $('mon-stages-panel');
    if (!Array.isArray(stages) || !stages.length) {
      panel.hidden = true;
      return;
    }
    const num = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
    const slotsText = (slots) => {
      const s = Array.isArray(slots) ? slots.filter((v) => typeof v === 'number' && v > 0) : [];
      if (!s.length) return 'all in VRAM';
      const lo = Math.min(...s), hi = Math.max(...s);
      return (lo === hi ? String(lo) : `${lo}-${hi}`) + ' a layer';
    };
    const head = el('tr', null, ['Stage', 'GPU', 'Blocks', 'Share', 'VRAM', 'Expert slots'].map(
      (c) => el('th', { scope: 'col', text: c })));
    const rows = stages.slice(0, 16).map((s, k) => {
      const first = num(s?.first_block), last = num(s?.last_block), share = num(s?.block_share);
      const used = num(s?.vram_bytes), budget = num(s?.vram_budget_bytes);
      return el('tr', { 'data-testid': 'monitor-stage', title: typeof s?.summary === 'string' ? s.summary : null }, [
        el('td', { text: String(num(s?.stage) ?? k) }),
        el('td', { text: num(s?.device) !== null && s.device >= 0 ? String(s.device) : '?' }),
        el('td', { text: first !== null && last !== null ? `${first}-${last}` : '?' }),
        el('td', { text: share !== null ? (100 * share).toFixed(0) + '%' : '?' }),
        el('td', { text: used !== null ? fmtBytes(used) + (budget !== null ? ' of ' + fmtBytes(budget) : '') : '?' }),
        el('td', { text: slotsText(s?.expert_cache_slots) }),
      ]);
    });
    $('mon-stages').replaceChildren(el('div', { className: 'table-scroll' }, [
      el('table', { className: 'slots-table' }, [el('thead', null, [head]), el('tbody', null, rows)])]));
    panel.hidden = false;
  }

  // ---------------------------------------------------------------------------------------------------------------
  // Start

  window.addEventListener('storage', (e) => {
    // Another tab changed the conversations: pick them up when idle.
    if (e.key === STORE_CONVS && !state.busy) {
      const stored = loadJSON(STORE_CONVS, null);
      if (stored && Array.isArray(stored.convs)) {
        state.convs = stored.convs;
        if (!currentConv()) state.currentId = stored.currentId;
        renderConvList();
        renderMessages();
      }
    }
  });

  // Exposed for tests of the renderer (pure functions; no access to anything else).
  window.strataMarkdown = { renderMarkdown, renderInline };

  showSettings();
  renderConvList();
  renderMessages();
  setBusy(false);
  loadModel();
  selectTab(window.location.hash === '#monitor' ? tabs[1] : tabs[0], false);
  document.body.dataset.ready = 'true';
})();
