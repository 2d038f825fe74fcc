#!/usr/bin/env python3
"""Goldens for QSA block selection where it is hardest: where equal indexer scores straddle the cut.

Runs on the GPU machine's CPU (torch and transformers 5.17), in about a minute:

    PYTHONUNBUFFERED=1 python3 tools/goldens/make_qsa_goldens.py --out /tmp/gold [--only NAME,...]

Writes
  <out>/qsa/topk_ties.txt   (committed gzipped as topk_ties.txt.gz) torch.topk's kept indices on tie-heavy 1-D float32 inputs, through both of its CPU
                            algorithms (std::nth_element, and std::partial_sort when k * 64 <= n); one case a line:
                            "n k | v0 ... (float32 bits, hex) | i0 ...". Read by tests/test_qsa_select.cpp.
  <out>/<name>/             qwen4exp fixtures in make_goldens.py's layout (hf/, logits.f32, prompt.txt, greedy.txt,
                            meta.json), drawn so that ties at zero DO decide some selections (meta.json's
                            selection_ties counts them). Budgets 4-64, ratios 1-4, prompts that run from below the
                            budget to several times it, so the cut falls at every block offset; some fixtures have
                            one indexer head or identical heads, which makes half the blocks score exactly 0.
Copy both into tests/data/: test_model_parity and test_cuda_model pick up every fixture folder, test_interop
compares llama.cpp on them.
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402

LIN, QSA = mg.LIN, mg.QSA


def topk_cases(seed=12345):
    """Tie-heavy inputs for torch.topk: half zeros, a few repeated levels, some distinct values."""
    gen = np.random.default_rng(seed)
    cases = []
    sizes = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 31, 50, 64, 100, 129, 255, 256, 500, 1000, 2048]
    for n in sizes:
        for _ in range(6 if n < 500 else 2):
            kind = gen.integers(0, 10, size=n)
            levels = gen.integers(1, 5, size=n).astype(np.float32) * 0.5
            any_ = gen.uniform(0.0, 8.0, size=n).astype(np.float32)
            v = np.where(kind < 5, np.float32(0.0), np.where(kind < 8, levels, any_)).astype(np.float32)
            ks = {1, 2, max(1, n // 3), max(1, n // 2), max(1, n - 1), n, max(1, n // 64), max(1, n // 130)}
            for k in sorted(ks):
                # Past 500 values only the partial-sort branch's cases, to keep the file small.
                if 0 < k <= n and (n <= 500 or k * 64 <= n):
                    cases.append((v, k))
    return cases


def write_topk_goldens(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    heap = 0
    with open(path, "w") as f:
        f.write(f"# torch {torch.__version__}: torch.topk(values, k).indices on the CPU; "
                "n k | float32 bits (hex) | kept indices\n")
        for v, k in topk_cases():
            idx = torch.from_numpy(v).topk(k).indices.tolist()
            bits = " ".join(f"{b:08x}" for b in v.view(np.uint32).tolist())
            f.write(f"{len(v)} {k} | {bits} | {' '.join(map(str, idx))}\n")
            heap += k * 64 <= len(v)
    mg.log(f"topk goldens: {path} ({heap} cases through the partial-sort branch)")


def same_indexer_heads(model, lines):
    """Every indexer query head a copy of head 0: the score is n_heads x relu(q . k), zero for about half the blocks."""
    for name, mod in model.named_modules():
        if name.endswith("indexer") and hasattr(mod, "index_qk_proj"):
            w = mod.index_qk_proj.weight.data
            d, nh = mod.index_head_dim, mod.index_n_heads
            for h in range(1, nh):
                w[h * d:(h + 1) * d] = w[0:d]
    lines.append("indexer: every query head a copy of head 0 (half the blocks score exactly 0)")


def qsa_fixture(name, seed, n_prompt, budget, ratio, index_heads, layers, description, post_init=None, **extra):
    """A small qwen4exp (hidden 32, hyper-connections 2, MoE 8 top-2, PLE 2-grams) with the given QSA shape, in shapes
    the CUDA trunk also runs (attention heads of 32, GDN key heads of 16)."""
    config = dict(
        vocab_size=512,
        hidden_size=32,
        num_hidden_layers=len(layers),
        layer_types=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # CUDA's attention kernels take heads of 32, 64, 128 or 256
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,  # CUDA's GDN recurrence takes key heads of 16-256
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        hc_count=2,
        hc_lowrank=8,
        ple_layer_ids=[1],  # one-based, a GDN layer
        ngram_size=2,
        heads_per_ngram=2,
        ngram_vocab_size_base=500,
        make_ngram_vocab_size_divisible_by=4,
        split_ngram_parts=2,
        indexer_n_heads=index_heads,
        indexer_kv_heads=1,
        indexer_head_dim=16,
        indexer_budget=budget,
        indexer_compress_ratio=ratio,
        eos_token_id=5,
        output_gate_type="sigmoid",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    config.update(extra)
    return dict(name=name, arch="qwen4exp", seed=seed, n_prompt=n_prompt, eos_positions=[3, n_prompt // 2],
                tokenizer=True, selection_ties="wanted", post_init=post_init, description=description,
                config=config)


def fixtures_qsa():
    return [
        qsa_fixture("qsa_b16_r4", 4101, 70, 16, 4, 1, [LIN, QSA, LIN, QSA],
                    "QSA budget 16, ratio 4 (4 blocks), one indexer head; prompt 70: selection starts dropping "
                    "blocks at position 19, with ties at zero deciding the cut there."),
        qsa_fixture("qsa_b64_r4", 4202, 300, 64, 4, 2, [LIN, QSA, LIN, QSA],
                    "QSA budget 64, ratio 4 (16 blocks), two identical indexer heads; prompt 300.",
                    post_init=same_indexer_heads),
        qsa_fixture("qsa_b12_r3", 4303, 61, 12, 3, 1, [QSA, LIN, QSA],
                    "QSA budget 12, ratio 3 (an odd ratio, 4 blocks), one indexer head, QSA as the first layer; "
                    "prompt 61.", ple_layer_ids=[2]),
        qsa_fixture("qsa_b8_r1", 4404, 40, 8, 1, 2, [LIN, QSA],
                    "QSA budget 8, ratio 1 (blocks of one cell, no partial tail), two identical indexer heads; "
                    "prompt 40.", post_init=same_indexer_heads),
        qsa_fixture("qsa_b4_r2", 4505, 300, 4, 2, 1, [LIN, QSA],
                    "QSA budget 4, ratio 2 (2 blocks), one indexer head; prompt 300, so from position 255 torch.topk "
                    "selects through its partial-sort branch (k * 64 <= blocks)."),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None, help="comma-separated fixture names (topk: the torch.topk file)")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    wanted = set(args.only.split(",")) if args.only else None
    if wanted is None or "topk" in wanted:
        write_topk_goldens(os.path.join(args.out, "qsa", "topk_ties.txt"))
    failures = []
    for fx in fixtures_qsa():
        if wanted is not None and fx["name"] not in wanted:
            continue
        try:
            s = mg.build_fixture(fx, args.out)
            mg.log(f"{s['name']}: {s['bytes']} bytes, min margin {s['min_margin']:.4f}, greedy {s['greedy']}")
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            failures.append(f"{fx['name']}: {type(e).__name__}: {e}")
    for fl in failures:
        mg.log(f"FAILED {fl}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
