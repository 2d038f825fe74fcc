"""Corpus, tokenizer and token streams for the bundled code model (runs on the GPU machine, CPU only).

Data: every Python source file of the machine's Python installation (standard library and installed packages),
deduplicated by content, split into train and held-out BY FILE (a hash of the content decides), so no held-out file
was seen in any form. A slice of the training files is also turned into ChatML conversations (a function's docstring
as the request, the function as the answer), so the chat template and its special tokens are exercised in training.

Outputs in OUT_DIR: tokenizer.json, tokenizer_config.json (ChatML chat template), train.bin / heldout.bin (uint16
token streams, documents separated by <|endoftext|>), heldout_files.txt, data_stats.json.
"""

import argparse
import ast
import hashlib
import json
import os
import random
import sys
import time

import numpy as np

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
# Qwen2's pre-tokenizer split (a format fact: llama.cpp recognises this exact pattern as the "qwen2" pre-tokenizer).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML with Qwen's tool-call conventions, written for this model: tools are listed in the system turn as JSON lines
# inside <tools></tools>; an assistant's calls are <tool_call>{"name": ..., "arguments": ...}</tool_call> blocks; tool
# results come back in a user turn inside <tool_response></tool_response>; reasoning sits in <think></think>.
CHAT_TEMPLATE = r"""{%- if tools -%}
<|im_start|>system
{% if messages and messages[0].role == 'system' %}{{ messages[0].content }}{{ '\n\n' }}{% endif -%}
You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}{{ '\n' }}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages and messages[0].role == 'system' -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- if not loop.first %}{{ raise_exception('the system message must come first') }}{% endif -%}
{%- elif message.role == 'user' -%}
<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' -%}
<|im_start|>assistant
{% if message.reasoning_content %}<think>
{{ message.reasoning_content | trim }}
</think>

{% endif %}{% if message.content %}{{ message.content }}{% endif -%}
{%- if message.tool_calls -%}
{%- for call in message.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- if message.content or not loop.first %}{{ '\n' }}{% endif -%}
<tool_call>
{"name": "{{ fn.name }}", "arguments": {% if fn.arguments is string %}{{ fn.arguments }}{% else %}{{ fn.arguments | tojson }}{% endif %}}
</tool_call>
{%- endfor -%}
{%- endif %}<|im_end|>
{% elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}{{ '\n' }}<tool_response>
{{ message.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>{{ '\n' }}{% endif -%}
{%- else -%}
{{ raise_exception('unknown role: ' + message.role) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{%- endif -%}
"""


def find_sources(roots, max_bytes_per_file):
    seen, files = set(), []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    with open(path, "rb") as f:
                        raw = f.read(max_bytes_per_file + 1)
                except OSError:
                    continue
                if not raw.strip() or len(raw) > max_bytes_per_file:
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                # Dedupe on content with line endings and trailing spaces normalised (vendored copies differ there).
                norm = "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n")).strip()
                digest = hashlib.sha256(norm.encode()).hexdigest()
                if digest in seen:
                    continue
                seen.add(digest)
                files.append((path, norm + "\n", digest))
    return files


def docstring_conversations(text, rng, limit):
    """(request, answer) pairs: a top-level function's docstring summary as the request, its source as the answer."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        doc = ast.get_docstring(node)
        src = ast.get_source_segment(text, node)
        if not doc or not src or len(src) > 2000:
            continue
        summary = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
        if not (10 <= len(summary) <= 300):
            continue
        request = rng.choice(
            [
                "Write a Python function `{n}`: {s}",
                "{s} Call it `{n}`.",
                "Implement `{n}` in Python. {s}",
            ]
        ).format(n=node.name, s=summary)
        out.append((request, "```python\n" + src + "\n```"))
        if len(out) >= limit:
            break
    return out


def chatml(request, answer):
    return (
        "<|im_start|>user\n" + request + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" + answer + "<|im_end|>\n"
    )


def train_tokenizer(texts, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--roots", nargs="+", required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--max-train-bytes", type=int, default=160_000_000)
    ap.add_argument("--tokenizer-sample-bytes", type=int, default=40_000_000)
    ap.add_argument("--heldout-percent", type=float, default=2.0)
    ap.add_argument("--chat-fraction", type=float, default=0.06, help="share of training bytes as ChatML")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    rng = random.Random(args.seed)

    files = find_sources(args.roots, max_bytes_per_file=400_000)
    # Held out by file: the content hash decides, so the split does not depend on paths or the order of the walk.
    held = [f for f in files if int(f[2][:8], 16) % 10000 < args.heldout_percent * 100]
    train = [f for f in files if int(f[2][:8], 16) % 10000 >= args.heldout_percent * 100]
    rng.shuffle(train)
    total = sum(len(f[1]) for f in train)
    budget = min(total, args.max_train_bytes)
    picked, used = [], 0
    for f in train:
        if used >= budget:
            break
        picked.append(f)
        used += len(f[1])
    print(f"data: {len(files)} unique files ({total / 1e6:.1f} MB train pool), {len(held)} held out, "
          f"{len(picked)} train files ({used / 1e6:.1f} MB) in {time.time() - t0:.1f} s", flush=True)

    docs = [f[1] for f in picked]
    chat_docs, chat_bytes = [], 0
    for _, text, _ in picked:
        if chat_bytes >= args.chat_fraction * used:
            break
        for req, ans in docstring_conversations(text, rng, limit=4):
            chat_docs.append(chatml(req, ans))
            chat_bytes += len(chat_docs[-1])
    docs += chat_docs
    rng.shuffle(docs)

    sample, n = [], 0
    for d in docs:
        if n >= args.tokenizer_sample_bytes:
            break
        sample.append(d)
        n += len(d)
    tok = train_tokenizer(sample, args.vocab)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "add_bos_token": False,
                "model_max_length": 4096,
                "chat_template": CHAT_TEMPLATE,
            },
            f,
            indent=2,
        )
    print(f"tokenizer: {tok.get_vocab_size()} tokens in {time.time() - t0:.1f} s", flush=True)

    eot = tok.token_to_id("<|endoftext|>")
    assert eot == 0, eot

    def encode_stream(texts):
        ids = []
        for start in range(0, len(texts), 2048):
            for enc in tok.encode_batch(texts[start:start + 2048]):
                ids.extend(enc.ids)
                ids.append(eot)
        return np.asarray(ids, dtype=np.uint16)

    train_ids = encode_stream(docs)
    held_texts = [f[1] for f in sorted(held, key=lambda f: f[2])]
    held_ids = encode_stream(held_texts)
    train_ids.tofile(os.path.join(args.out, "train.bin"))
    held_ids.tofile(os.path.join(args.out, "heldout.bin"))
    with open(os.path.join(args.out, "heldout_files.txt"), "w") as f:
        for path, _, digest in sorted(held, key=lambda f: f[2]):
            f.write(f"{digest[:16]}\t{path}\n")
    stats = {
        "unique_files": len(files),
        "train_files": len(picked),
        "train_bytes": used,
        "chat_conversations": len(chat_docs),
        "heldout_files": len(held),
        "heldout_bytes": sum(len(t) for t in held_texts),
        "train_tokens": int(train_ids.size),
        "heldout_tokens": int(held_ids.size),
        "bytes_per_token": used / max(1, train_ids.size),
        "roots": args.roots,
        "seconds": time.time() - t0,
    }
    with open(os.path.join(args.out, "data_stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    print("data_stats " + json.dumps(stats), flush=True)


if __name__ == "__main__":
    sys.exit(main())
