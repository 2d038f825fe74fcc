// Tokenizer goldens from HF tokenizers 0.23.2 (the official Rust library through its Node binding; the same version
// as the Python tokenizers on the GPU machine). Writes tests/data/tokenizer/:
//   qwen2/tokenizer.json, qwen35/tokenizer.json   byte-level BPEs trained here on TRAINING_TEXT with the Qwen2 /
//                                                 Qwen3.5 Split regex (Isolated) + ByteLevel(use_regex=false) + NFC,
//                                                 the Qwen added tokens (special <|...|>, non-special <think> ...)
//   corpus_<name>.json                            every corpus text with the oracle's ids (parse_special and
//                                                 not), and its decode
// Run from the repository root: node tools/goldens/make_tokenizer_goldens.mjs (needs tests/interop's node_modules).
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const require = createRequire(path.resolve('tests/interop/package.json'));
const { Tokenizer, AddedToken } = require('tokenizers');
const OUT = 'tests/data/tokenizer';

const QWEN2 = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const QWEN35 = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

const TRAINING_TEXT = `
Once upon a time, in a kingdom by the sea, there lived a curious engineer who measured everything twice and
trusted nothing she had not measured herself. Her workshop smelled of solder, coffee and old paper; shelves held
oscilloscopes, notebooks, broken keyboards, a brass telescope and three sleeping cats named Ada, Grace and Linus.
Every morning she wrote a prediction before running an experiment, because a result without a prediction teaches
little. Benchmarks, profilers, flame graphs, cache misses, branch mispredictions, vectorization, memory bandwidth,
latency and throughput were her daily vocabulary. Compilers optimize loops; allocators fragment heaps; schedulers
preempt threads; kernels dispatch interrupts; networks drop packets; disks fail silently; users type unexpected input.
class Matrix:
    def __init__(self, rows, cols):
        self.rows, self.cols = rows, cols
        self.data = [[0.0] * cols for _ in range(rows)]
    def transpose(self):
        result = Matrix(self.cols, self.rows)
        for i in range(self.rows):
            for j in range(self.cols):
                result.data[j][i] = self.data[i][j]
        return result
fn parse_header(bytes: &[u8]) -> Result<Header, ParseError> { let magic = u32::from_le_bytes(bytes[0..4].try_into()?); Ok(Header { magic }) }
const express = require('express'); app.get('/api/users/:id', async (req, res) => { res.json(await db.find(req.params.id)); });
春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。床前明月光，疑是地上霜。举头望明月，低头思故乡。
吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。
Weather forecast: sunny intervals, scattered showers, temperatures between 12 and 18 degrees, light westerly winds.
The quick brown fox jumps over the lazy dog. It's a truth universally acknowledged that a single man in possession
of a good fortune must be in want of a wife. DON'T PANIC! I'LL be there at 10:30, we'll see; they're late, you've
been warned, she'd know. Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 1,000,000 -17 +3e10 0xFF 0b1010.
Email me at someone@example.com or visit https://example.org/path?query=1&x=y#frag for more information.
Tokenizers split text into words, then words into subword units; frequent words become single tokens while rare
words are spelled out from smaller pieces. Whitespace matters:  two spaces,   three spaces,\tone tab,\t\ttwo tabs.
Windows line endings\r\nand Unix ones\nand old Mac ones\r. Trailing spaces    
    indented line
        deeper indentation
def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

#include <vector>
int main(int argc, char** argv) {
    std::vector<int> v{1, 2, 3};
    for (auto& x : v) { x *= 2; }
    return v.size() > 2 ? 0 : 1;  // done
}
{"name": "strata", "version": "0.1.0", "tags": ["llm", "gguf"], "nested": {"a": [1, 2, {"b": null}]}, "ok": true}
SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC LIMIT 10;
<div class="container"><p>Hello, <b>world</b>!</p><a href="/x">link</a></div>
$ ./configure --prefix=/usr/local && make -j8 && sudo make install
人工智能正在改变世界。我们今天学习自然语言处理和分词器的工作原理。中文没有空格，所以分词很重要。北京、上海、广州、深圳。
日本語のテキストも含めます。ひらがな、カタカナ、漢字が混ざっています。東京は日本の首都です。ありがとうございます。
한국어 문장도 있습니다. 안녕하세요, 만나서 반갑습니다. 서울은 대한민국의 수도입니다.
Русский текст: Москва — столица России. Привет, как дела? Съешь же ещё этих мягких французских булок.
Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο. Καλημέρα!
العربية: مرحبا بالعالم. اللغة العربية جميلة جداً. السلام عليكم ورحمة الله.
עברית: שלום עולם. זהו משפט בעברית עם ניקוד: שָׁלוֹם.
हिन्दी: नमस्ते दुनिया। यह एक परीक्षण वाक्य है। भारत की राजधानी नई दिल्ली है।
ไทย: สวัสดีครับ ภาษาไทยไม่มีช่องว่างระหว่างคำ
Tiếng Việt: Xin chào thế giới. Tôi đang học xử lý ngôn ngữ tự nhiên.
Deutsch: Größe, Straße, Übermäßig, schön. Français: déjà vu, naïve, façade, Noël, où, être. Español: ¿Qué tal? ¡Olé! niño.
Emoji: 😀 😃 😄 👍 👍🏽 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇯🇵 🇺🇸 ✨ 🔥 🚀 🤖 ✅ ❌
Math: ∀x ∈ ℝ, x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2; α β γ δ ε π σ ω ∞ ≈ ≠ ≤ ≥ → ⇒ ∂ ∇ √
Symbols: © ® ™ § ¶ † ‡ • … ‰ € £ ¥ ¢ ° ± × ÷ ¼ ½ ¾ « » “ ” ‘ ’ — –
<|im_start|>user
What is the capital of France?<|im_end|>
<|im_start|>assistant
<think>
The user asks a simple question.
</think>
The capital of France is Paris.<|im_end|>
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call>
`;

const SPECIAL = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];
const NON_SPECIAL = ['<think>', '</think>', '<tool_call>', '</tool_call>'];

function baseJson(regex) {
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: [],
    normalizer: { type: 'NFC' },
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: regex }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false }] },
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: {}, merges: [] },
  };
}

// Trains with the model's default BpeTrainer (the Node binding exposes no trainer options); the text is small
// enough that training ends when every word is one token, which gives a few thousand tokens. Bytes the text does
// not contain are appended to the vocabulary afterwards, so every byte has a token as in the real Qwen files.
function train(regex, extraAdded) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tkgold-'));
  const corpus = path.join(tmp, 'train.txt');
  fs.writeFileSync(corpus, TRAINING_TEXT.repeat(3));
  const tok = Tokenizer.fromString(JSON.stringify(baseJson(regex)));
  tok.train([corpus]);
  const trained = path.join(tmp, 'trained.json');
  tok.save(trained, false);
  const j = JSON.parse(fs.readFileSync(trained, 'utf8'));
  const vocab = j.model.vocab;
  let next = Math.max(...Object.values(vocab)) + 1;
  for (const ch of require('tokenizers').byteLevelAlphabet()) if (!(ch in vocab)) vocab[ch] = next++;
  const added = [];
  const add = (content, special, opts = {}) => added.push({ id: next++, content, single_word: false,
    lstrip: !!opts.lstrip, rstrip: !!opts.rstrip, normalized: !!opts.normalized, special });
  for (const s of SPECIAL) add(s, true);
  for (const s of NON_SPECIAL) add(s, false);
  for (const [content, special, opts] of extraAdded) add(content, special, opts);
  j.added_tokens = added;
  fs.rmSync(tmp, { recursive: true });
  return Tokenizer.fromString(JSON.stringify(j)) && j;
}

// The same tokenizer without its special added tokens: HF's encode of it is llama.cpp's parse_special = false.
function withoutSpecial(j) {
  const looksSpecial = (t) => (t.startsWith('<|') && t.endsWith('|>') && t.length > 4);
  const k = JSON.parse(JSON.stringify(j));
  k.added_tokens = k.added_tokens.filter((a) => !(a.special || looksSpecial(a.content)));
  return k;
}

// mulberry32: a small seeded PRNG so the corpus is the same on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomText(rand, len) {
  const pools = [
    () => 0x20 + Math.floor(rand() * 0x5f),             // ASCII printable
    () => ' \t\n\r'.codePointAt(Math.floor(rand() * 4)),
    () => 0xa0 + Math.floor(rand() * 0x1e0),            // Latin-1, Latin Extended
    () => 0x300 + Math.floor(rand() * 0x70),            // combining diacritics
    () => 0x4e00 + Math.floor(rand() * 0x5200),         // CJK
    () => 0x600 + Math.floor(rand() * 0x100),           // Arabic
    () => 0x900 + Math.floor(rand() * 0x80),            // Devanagari
    () => 0x1f300 + Math.floor(rand() * 0x300),         // emoji
    () => [0x200d, 0xfe0f, 0x1f3fb, 0x1f3fd, 0x2028, 0x85, 0x3000, 0xa0, 0x180e][Math.floor(rand() * 9)],
    () => 0x10000 + Math.floor(rand() * 0x100000),      // anywhere in the astral planes
    () => { let c; do { c = 1 + Math.floor(rand() * 0xfffe); } while (c >= 0xd800 && c <= 0xdfff); return c; },
  ];
  let s = '';
  for (let i = 0; i < len; i++) {
    if (rand() < 0.03) { s += [...SPECIAL, ...NON_SPECIAL][Math.floor(rand() * 7)]; continue; }
    if (rand() < 0.02) { s += ["'s", "'T", "'LL", "'ve", "'Re", "'d"][Math.floor(rand() * 6)]; continue; }
    s += String.fromCodePoint(pools[Math.floor(rand() * pools.length)]());
  }
  return s;
}

function corpus() {
  const texts = [
    '', ' ', 'a', 'Hello world', 'Hello, world!', 'hello   world', ' leading space', 'trailing space ',
    'The quick brown fox jumps over the lazy dog.',
    "DON'T STOP. I'LL GO. WE'RE HERE. THEY'VE LEFT. HE'D SAY. I'M FINE. IT'S OK. don't i'll we're 'S 'LL",
    "rock 'n' roll, the '90s, 'quoted', ''double'', '''triple'''",
    '人工智能正在改变世界。', '日本語のテキスト、カタカナとひらがな。', '안녕하세요 세계', '中文English混合mixed文本',
    '👍 👍🏻 👍🏽 👍🏿 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏽‍🚀 ❤️‍🔥 🇯🇵🇺🇸', '😀😃😄😁😆😅😂🤣',
    'Cafe\u0301 re\u0301sume\u0301 nai\u0308ve', 'Café résumé naïve', 'e\u0301\u0301\u0301 a\u0316\u0301 \u1e0b\u0323',
    'ḍ̇ q̣̇ \u0041\u030a \u212b \u2126 한\u11a8 \u1100\u1161\u11a8',
    'مرحبا بالعالم', 'שָׁלוֹם עולם', 'العربية English עברית mixed', 'नमस्ते दुनिया', 'สวัสดีครับ',
    'def f(x):\n    return x ** 2\n', 'int main() {\n\treturn 0;\n}\n', '{"a": [1, 2, 3], "b": {"c": null}}',
    'for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }', '<div class="x">text</div>',
    'tabs\t\tand\tspaces    mixed \t \t end', 'line1\r\nline2\r\n\r\nline4\n\n\nline7\r', '   \n   \n  x',
    '\n', '\r\n', '\t', '    ', ' \n ', 'a\n\n', '!!!\n\n', '...   ', ' ?!\r\n',
    '0 1 12 123 1234 12345 3.14159 1,000,000 -42 +7 1e-10 0x1F', '٠١٢٣ ۴۵۶ १२३ ①②③ ¼½ Ⅻ',
    '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n', 'x<|im_end|>y<|endoftext|>z',
    '<|im_start|><|im_start|><|im_end|>', '<|im_end', 'im_end|>', '<<|im_end|>>', '<think>\nreasoning\n</think>\n\nanswer',
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', ' <think> spaced </think> ', '<|endoftext|>',
    'a'.repeat(300), 'ab'.repeat(150), ' '.repeat(300), '\n'.repeat(300), '1'.repeat(300), '中'.repeat(300),
    '😀'.repeat(300), 'e\u0301'.repeat(150), '!'.repeat(300), 'xyz '.repeat(75), 'Supercalifragilistic'.repeat(15),
    '\u00a0\u2000\u3000\u2028\u0085\u180e mixed spaces\u00a0x', '\u200b\u200c\u200d\ufeff zero widths',
    'ſ\'ſ \'ſ K\u212a', 'İstanbul ǅ ǈ ß ẞ ﬁ ﬀ', '\u{10000}\u{1F600}\u{20000}\u{E0001}\u{10FFFD}',
    'Café [MASK] x', 'x  [MASK]  y', 'Cafe\u0301 and Café', '\ufffd replacement',
  ];
  const rand = rng(12345);
  for (let i = 0; i < 150; i++) texts.push(randomText(rand, 1 + Math.floor(rand() * 60)));
  return texts;
}

async function encodeAll(tok, texts) {
  const out = [];
  for (const t of texts) out.push((await tok.encode(t, null, { addSpecialTokens: false })).getIds());
  return out;
}

async function writeGoldens(name, tokJson, tokPath) {
  const tok = Tokenizer.fromString(JSON.stringify(tokJson));
  const plain = Tokenizer.fromString(JSON.stringify(withoutSpecial(tokJson)));
  const texts = corpus();
  const ids = await encodeAll(tok, texts);
  // HF numbers added tokens consecutively after the model vocabulary when it loads a file, so the stripped
  // tokenizer's ids for the remaining added tokens differ: map them back through their text.
  const idsNoSpecial = (await encodeAll(plain, texts)).map((row) => row.map((id) => tok.tokenToId(plain.idToToken(id))));
  const cases = [];
  for (let i = 0; i < texts.length; i++) {
    cases.push({ text: texts[i], ids: ids[i], ids_no_special: idsNoSpecial[i], decoded: await tok.decode(ids[i], false) });
  }
  const file = path.join(OUT, `corpus_${name}.json`);
  fs.writeFileSync(file, JSON.stringify({ tokenizer: tokPath, oracle: 'HF tokenizers 0.23.2 (node binding)',
    cases }, null, 0) + '\n');
  console.log(`wrote ${file}: ${cases.length} texts`);
}

const extra35 = [['[MASK]', true, { lstrip: true, rstrip: true }], ['Café', false, { normalized: true }]];
const trained = { qwen2: train(QWEN2, []), qwen35: train(QWEN35, extra35) };
for (const [name, j] of Object.entries(trained)) {
  fs.mkdirSync(path.join(OUT, name), { recursive: true });
  fs.writeFileSync(path.join(OUT, name, 'tokenizer.json'), JSON.stringify(j, null, 1) + '\n');
  fs.writeFileSync(path.join(OUT, name, 'tokenizer_config.json'), JSON.stringify({
    tokenizer_class: 'Qwen2Tokenizer', bos_token: null, eos_token: '<|im_end|>', pad_token: '<|endoftext|>',
    chat_template: "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
  }, null, 2) + '\n');
  console.log(`${name}: ${Object.keys(j.model.vocab).length} vocab, ${j.model.merges.length} merges, ` +
    `${j.added_tokens.length} added tokens`);
  await writeGoldens(name, j, `${name}/tokenizer.json`);
}
const fixture = 'tests/data/qwen4exp/hf/tokenizer.json';
await writeGoldens('qwen4exp_fixture', JSON.parse(fs.readFileSync(fixture, 'utf8')), '../qwen4exp/hf/tokenizer.json');
