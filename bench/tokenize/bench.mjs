// Tokenization throughput, strata vs HF tokenizers 0.23.2 (bench/NOTES.md). Run through bench/tokenize/run.sh.
//   node bench/tokenize/bench.mjs STRATA_BENCH_BINARY WORK_DIR [ROUNDS]
import { createRequire } from 'node:module';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

const require = createRequire(path.resolve('tests/interop/package.json'));
const { Tokenizer } = require('tokenizers');
const [strataBench, work, roundsArg] = process.argv.slice(2);
const rounds = Number(roundsArg || 3);
fs.mkdirSync(work, { recursive: true });

// ~4 MB of text: code, English documentation, multilingual lines. Sorted file lists keep it the same on every run.
function listFiles(dir, pred, out = []) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name < b.name ? -1 : 1)) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) listFiles(p, pred, out); else if (e.isFile() && pred(p)) out.push(p);
  }
  return out;
}
function take(files, limit) {
  let s = '';
  for (const f of files) { if (s.length >= limit) break; s += fs.readFileSync(f, 'utf8') + '\n'; }
  return s.slice(0, limit);
}
const textPath = path.join(work, 'text.txt');
if (!fs.existsSync(textPath)) {
  const code = take(listFiles('/usr/lib/python3.11', (p) => p.endsWith('.py') && !p.includes('/test')), 1_600_000);
  const docs = take(listFiles('/usr/share/doc', (p) => !p.endsWith('.gz') && fs.statSync(p).size > 2000), 1_800_000);
  const corpus = JSON.parse(fs.readFileSync('tests/data/tokenizer/corpus_qwen2.json', 'utf8')).cases
    .map((c) => c.text).filter((t) => t.length > 8);
  let multi = '';
  for (let i = 0; multi.length < 600_000; i++) multi += corpus[(i * 7919) % corpus.length] + (i % 5 ? ' ' : '\n');
  fs.writeFileSync(textPath, code + docs + multi);
}

// A 30,000-id byte-level BPE trained by HF on the text (the binding's default trainer), Qwen2 regex + NFC.
const tokPath = path.join(work, 'tokenizer.json');
if (!fs.existsSync(tokPath)) {
  const QWEN2 = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
  const base = { version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: { type: 'NFC' },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: QWEN2 }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false }] },
    post_processor: null, decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: {}, merges: [] } };
  const tok = Tokenizer.fromString(JSON.stringify(base));
  tok.train([textPath]);
  const trained = path.join(work, 'trained.json');
  tok.save(trained, false);
  const j = JSON.parse(fs.readFileSync(trained, 'utf8'));
  let next = Math.max(...Object.values(j.model.vocab)) + 1;
  for (const ch of require('tokenizers').byteLevelAlphabet()) if (!(ch in j.model.vocab)) j.model.vocab[ch] = next++;
  j.added_tokens = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<think>', '</think>'].map((content, k) => ({
    id: next + k, content, single_word: false, lstrip: false, rstrip: false, normalized: false,
    special: content.startsWith('<|') }));
  fs.writeFileSync(tokPath, JSON.stringify(j));
}

const env = { ...process.env, RAYON_NUM_THREADS: '1', TOKENIZERS_PARALLELISM: 'false' };
const oracle = path.resolve('tests/interop/tokenize_oracle.mjs');
const mbps = (bytes, s) => bytes / s / 1e6;
const median = (a) => { const b = [...a].sort((x, y) => x - y); return b[Math.floor(b.length / 2)]; };
const report = { vocab: Tokenizer.fromFile(tokPath).getVocabSize(true), rounds, modes: {} };
// whole: the text in one encode call; chunked: about 4 KB per call (documents, chat turns)
for (const [mode, chunk] of [['whole', 0], ['chunked_4KB', 4096]]) {
  const runs = { strata: [], hf: [] };
  const res = {};
  for (let r = 0; r < rounds; r++) {
    for (const side of ['strata', 'hf']) {  // interleaved
      const out = side === 'strata'
        ? execFileSync(strataBench, [tokPath, textPath, '5', String(chunk)], { env })
        : execFileSync('node', [oracle, 'bench', tokPath, textPath, '5', String(chunk)], { env });
      res[side] = JSON.parse(out.toString());
      runs[side].push(res[side].seconds);
    }
  }
  const summary = {};
  for (const side of ['strata', 'hf']) {
    summary[side] = {
      cold_MBps: mbps(res[side].bytes, median(runs[side].map((s) => s[0]))),
      warm_MBps: mbps(res[side].bytes, median(runs[side].flatMap((s) => s.slice(1)))),
      tokens: res[side].tokens, checksum: res[side].checksum };
  }
  report.bytes = res.strata.bytes;
  report.modes[mode] = { ...summary, ratio_warm: summary.strata.warm_MBps / summary.hf.warm_MBps,
    ratio_cold: summary.strata.cold_MBps / summary.hf.cold_MBps,
    same_ids: summary.strata.checksum === summary.hf.checksum && summary.strata.tokens === summary.hf.tokens };
}
console.log(JSON.stringify(report, null, 1));
