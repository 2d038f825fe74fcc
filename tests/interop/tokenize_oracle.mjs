// HF tokenizers 0.23.2 as the oracle for strata's tokenizer (tests/test_tokenizer.cpp, bench/tokenize).
//   node tokenize_oracle.mjs encode TOKENIZER.json TEXTS.json OUT.json
//     TEXTS.json: a JSON array of strings. OUT.json: {"ids": [[...]], "ids_no_special": [[...]]}; ids_no_special is
//     HF's encode with the special added tokens taken out of the tokenizer, i.e. llama.cpp's parse_special = false.
//   node tokenize_oracle.mjs bench TOKENIZER.json TEXT_FILE REPEATS [CHUNK]
//     prints {"bytes": N, "tokens": T, "checksum": C, "seconds": [..]}: wall time of encoding the text per repeat,
//     loading excluded; CHUNK > 0 encodes pieces of about CHUNK bytes (cut after the next newline), one call each.
import { createRequire } from 'node:module';
import fs from 'node:fs';

const require = createRequire(import.meta.url);
const { Tokenizer } = require('tokenizers');

const [mode, tokPath, input, arg] = process.argv.slice(2);
const json = JSON.parse(fs.readFileSync(tokPath, 'utf8'));
const tok = Tokenizer.fromString(JSON.stringify(json));

if (mode === 'encode') {
  const looksSpecial = (t) => t.startsWith('<|') && t.endsWith('|>') && t.length > 4;
  const stripped = JSON.parse(JSON.stringify(json));
  stripped.added_tokens = (stripped.added_tokens || []).filter((a) => !(a.special || looksSpecial(a.content)));
  const plain = Tokenizer.fromString(JSON.stringify(stripped));
  const texts = JSON.parse(fs.readFileSync(input, 'utf8'));
  const ids = [], idsNoSpecial = [];
  for (const t of texts) {
    ids.push((await tok.encode(t, null, { addSpecialTokens: false })).getIds());
    // HF renumbers added tokens on load; map the stripped tokenizer's ids back through their text
    idsNoSpecial.push((await plain.encode(t, null, { addSpecialTokens: false })).getIds()
      .map((id) => tok.tokenToId(plain.idToToken(id))));
  }
  fs.writeFileSync(arg, JSON.stringify({ ids, ids_no_special: idsNoSpecial }));
} else if (mode === 'bench') {
  const buf = fs.readFileSync(input);
  const chunk = Number(process.argv[7] || 0);
  const pieces = [];  // cut in bytes like the C++ side, then decoded
  for (let i = 0; i < buf.length;) {
    let j = chunk === 0 ? buf.length : Math.min(buf.length, i + chunk);
    if (j < buf.length) { const nl = buf.indexOf(10, j); j = nl < 0 ? buf.length : nl + 1; }
    pieces.push(buf.subarray(i, j).toString('utf8'));
    i = j;
  }
  const seconds = [];
  let ids = [];
  for (let r = 0; r < Number(arg || 5); r++) {
    const encs = [];
    const t0 = process.hrtime.bigint();
    for (const p of pieces) encs.push(await tok.encode(p, null, { addSpecialTokens: false }));
    const t1 = process.hrtime.bigint();
    seconds.push(Number(t1 - t0) / 1e9);
    ids = encs;
  }
  let tokens = 0, checksum = 2166136261;
  for (const e of ids) for (const id of e.getIds()) { tokens++; checksum = Math.imul(checksum ^ id, 16777619) >>> 0; }
  console.log(JSON.stringify({ bytes: buf.length, tokens, checksum, seconds }));
} else {
  console.error('usage: tokenize_oracle.mjs encode|bench ...');
  process.exit(2);
}
