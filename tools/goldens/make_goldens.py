#!/usr/bin/env python3
"""Build small random-weight reference models with HF transformers and record golden outputs.

Run on a machine with torch + transformers 5.17 (the GPU machine; everything runs on CPU in float32):

    python3 tools/goldens/make_goldens.py --out DIR [--extra [--extra-out DIR2]]

For every fixture NAME it writes DIR/NAME/:
    hf/            config.json + model.safetensors exactly as `save_pretrained` writes them
                   (qwen4exp also gets tokenizer.json + tokenizer_config.json)
    logits.f32     prefill logits, raw little-endian float32, row-major [n_tokens x vocab]
    prompt.txt     prompt token ids, space separated
    greedy.txt     greedy continuation ids (no kv cache, full recompute every step, no EOS stop)
    meta.json      what was built and how, plus sanity statistics
    keys.txt       safetensors tensor names, dtypes and shapes ("name<TAB>dtype<TAB>shape")

See tools/goldens/README.md.
"""

import argparse
import glob
import json
import math
import os
import sys
import time
import traceback

# Nothing here may touch the network (the GPU machine has none; hub lookups would only stall).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import transformers  # noqa: E402

GREEDY_STEPS = 24
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Qwen2-family pre-tokenization split (a property of Qwen's published tokenizer.json files).
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def log(*args):
    print(*args, flush=True)


# --------------------------------------------------------------------------------------------------------------------
# Fixture definitions
# --------------------------------------------------------------------------------------------------------------------

LIN = "linear_attention"
QSA = "qwen_sparse_attention"
FULL = "full_attention"


def fixtures_main():
    return [
        dict(
            name="qwen4exp",
            arch="qwen4exp",
            seed=1001,
            n_prompt=40,
            eos_positions=[9, 23],
            tokenizer=True,  # eos_token_id is replaced by the id of <|endoftext|>
            description=(
                "Qwen4-Exp text model (Flash-Next family). 4 layers: 3 GatedDeltaNet + 1 QSA attention. "
                "GDN grouped heads 2 k / 4 v (dims 16/16), conv kernel 4, sigmoid output gate. "
                "Attention 4 q heads / 2 kv heads, head_dim 32, gated q_proj, partial rotary 0.25 (8 dims, "
                "interleaved mrope [2,1,1]). QSA indexer 2 heads x 16, budget 8, compress ratio 4 (prompt 40 > 12). "
                "MoE 8 experts top-2 (norm_topk_prob) + sigmoid-gated shared expert. Hyper-connections hc_count 3, "
                "lowrank 16. PLE on layer 2 (1-based, linear layer): ngram 3, 2 heads per ngram (4 heads x 16), "
                "base 1000, table split into 4 shards; EOS at prompt positions 9 and 23."
            ),
            config=dict(
                vocab_size=512,
                hidden_size=64,
                num_hidden_layers=4,
                layer_types=[LIN, LIN, LIN, QSA],
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 1000000.0,
                    "partial_rotary_factor": 0.25,
                    "mrope_section": [2, 1, 1],
                    "mrope_interleaved": True,
                },
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                linear_conv_kernel_dim=4,
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=48,
                hc_count=3,
                hc_lowrank=16,
                ple_layer_ids=[2],
                ngram_size=3,
                heads_per_ngram=2,
                ngram_vocab_size_base=1000,
                make_ngram_vocab_size_divisible_by=128,
                split_ngram_parts=4,
                indexer_n_heads=4,
                indexer_kv_heads=1,
                indexer_head_dim=16,
                indexer_budget=8,
                indexer_compress_ratio=4,
                eos_token_id=5,
                output_gate_type="sigmoid",
                max_position_embeddings=4096,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
            ),
        ),
        dict(
            name="qwen35moe",
            arch="qwen35moe",
            seed=2002,
            n_prompt=40,
            eos_positions=[9, 23],
            description=(
                "Qwen3.5-MoE text model. 4 layers: 3 GatedDeltaNet + 1 full attention. GDN grouped heads "
                "2 k / 4 v (dims 16/16), conv kernel 4, silu output gate. Attention 4 q / 2 kv heads, head_dim 32, "
                "gated q_proj, partial rotary 0.25 (8 dims, interleaved mrope [2,1,1]). MoE 8 experts top-2 + "
                "sigmoid-gated shared expert. Zero-centred RMSNorms, final norm."
            ),
            config=dict(
                vocab_size=512,
                hidden_size=64,
                num_hidden_layers=4,
                layer_types=[LIN, LIN, LIN, FULL],
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 1000000.0,
                    "partial_rotary_factor": 0.25,
                    "mrope_section": [2, 1, 1],
                    "mrope_interleaved": True,
                },
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                linear_conv_kernel_dim=4,
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=48,
                eos_token_id=5,
                max_position_embeddings=4096,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
            ),
        ),
        dict(
            name="qwen3next",
            arch="qwen3next",
            seed=3003,
            n_prompt=40,
            eos_positions=[9, 23],
            description=(
                "Qwen3-Next model. 4 layers: 3 GatedDeltaNet (fused in_proj_qkvz / in_proj_ba) + 1 full attention. "
                "GDN grouped heads 2 k / 4 v (dims 16/16), conv kernel 4, silu output gate. Attention 4 q / 2 kv "
                "heads, head_dim 32, gated q_proj, partial rotary 0.25 (8 dims, plain rope). Every layer MoE: "
                "8 experts top-2 + sigmoid-gated shared expert (decoder_sparse_step 1, no mlp_only_layers)."
            ),
            config=dict(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=4,
                layer_types=[LIN, LIN, LIN, FULL],
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                linear_conv_kernel_dim=4,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                num_experts=8,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=48,
                eos_token_id=5,
                max_position_embeddings=4096,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
            ),
        ),
    ]


def fixtures_configs():
    """Issue 30: configs transformers runs that llama.cpp's GGUF keys cannot all carry. Committed to tests/data."""
    import copy

    main = {fx["name"]: fx for fx in fixtures_main()}

    def variant(base, name, seed, description, tokenizer=False, drop_rope=(), **changes):
        fx = copy.deepcopy(main[base])
        fx.update(name=name, seed=seed, description=description, tokenizer=tokenizer)
        fx["config"].update(changes)
        for key in drop_rope:
            fx["config"]["rope_parameters"].pop(key)
        fx["absent_rope_keys"] = list(drop_rope)
        return fx

    return [
        variant(
            "qwen4exp",
            "qwen4exp_uneven",
            1101,
            "qwen4exp fixture with GDN value heads of 32 against key heads of 16 (linear_value_head_dim != "
            "linear_key_head_dim) and a PLE n-gram embedding of 32 (4 heads x 8) against hidden_size 64 "
            "(ple_embed_dim != hidden_size); no tokenizer (eos 5). strata writes strata.qwen4exp.* keys for both; "
            "llama.cpp cannot load the file.",
            linear_value_head_dim=32,
            ple_embed_dim=32,
        ),
        variant(
            "qwen35moe",
            "qwen35moe_uneven",
            2102,
            "qwen35moe fixture with GDN value heads of 16 against key heads of 32 (linear_value_head_dim < "
            "linear_key_head_dim). llama.cpp cannot load the converted file.",
            linear_key_head_dim=32,
        ),
        variant(
            "qwen3next",
            "qwen3next_uneven",
            3103,
            "qwen3next fixture with GDN value heads of 32 against key heads of 16 (fused in_proj_qkvz with wider "
            "v and z). llama.cpp cannot load the converted file.",
            linear_value_head_dim=32,
        ),
        small_qwen3next_dense(),
        small_qwen4exp_ple3(),
        variant(
            "qwen4exp",
            "qwen4exp_rope8",
            1104,
            "qwen4exp fixture without mrope_section: head_dim 32, partial rotary 0.25 (8 dims), so transformers' "
            "default sections [11, 11, 10] name more pairs than the 4 there are; indexer heads of 16. strata writes "
            "rope.dimension_sections [2, 1, 1, 0]; [11, 11, 10, 0] aborted llama.cpp's rope. No tokenizer (eos 5).",
            drop_rope=("mrope_section",),
        ),
    ]


# Issue 30, item 2's remainder: the last configs transformers builds that llama.cpp's keys cannot carry. Small shapes
# (hidden 32, vocab 256, prompt 40) keep each fixture near 250 KB; the shapes are ones the CUDA trunk runs (attention
# heads of 32, GDN key heads of 16).
def small_qwen3next_dense():
    return dict(
        name="qwen3next_dense",
        arch="qwen3next",
        seed=3205,
        n_prompt=40,
        eos_positions=[9, 23],
        expect_modules={
            "model.layers.0.mlp": "Qwen3NextMLP",
            "model.layers.1.mlp": "Qwen3NextMLP",
            "model.layers.2.mlp": "Qwen3NextMLP",
            "model.layers.3.mlp": "Qwen3NextSparseMoeBlock",
        },
        description=(
            "Qwen3-Next with dense MLP layers: mlp_only_layers [1] and decoder_sparse_step 2 on 4 layers (LLLF), so "
            "layers 0 and 2 are dense by the step rule, layer 1 by mlp_only_layers and layer 3 is MoE (8 experts "
            "top-2 + shared expert). Dense MLP: SwiGLU of intermediate_size 48, no shared expert. Hidden 32, vocab "
            "128, GDN 1 k / 2 v heads of 16, attention 2 q / 1 kv heads of 32. llama.cpp cannot load the "
            "conversion (its qwen3next loader wants the MoE tensors in every block)."
        ),
        config=dict(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=4,
            layer_types=[LIN, LIN, LIN, FULL],
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            decoder_sparse_step=2,
            mlp_only_layers=[1],
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            eos_token_id=5,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
    )


def small_qwen4exp_ple3():
    return dict(
        name="qwen4exp_ple3",
        arch="qwen4exp",
        seed=1205,
        n_prompt=40,
        eos_positions=[9, 23],
        tokenizer=False,
        expect_modules={
            "model.layers.0.ple": "Qwen4ExpTextPLELayer",
            "model.layers.1.ple": "Qwen4ExpTextPLELayer",
            "model.layers.3.ple": "Qwen4ExpTextPLELayer",
        },
        description=(
            "Qwen4-Exp with PLE on three GDN layers: ple_layer_ids [1, 2, 4] (1-based) on 4 layers (L L Q L), so "
            "PLE layer index 2 (the third table and hashes) sits on layer 4, after the QSA layer. ngram 3, 1 head "
            "per ngram (2 heads x 16), base 50 (tables of 112, 128 and 144 rows), 2 shards per table. Hidden 32, "
            "vocab 128, hc 2, GDN 1 k / 2 v heads of 16, attention 2 q / 1 kv heads of 32, QSA budget 8 ratio 4, "
            "4 experts top-2. No tokenizer (eos 5). llama.cpp cannot load the conversion (one PLE layer there)."
        ),
        config=dict(
            vocab_size=256,
            hidden_size=32,
            num_hidden_layers=4,
            layer_types=[LIN, LIN, QSA, LIN],
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            hc_count=2,
            hc_lowrank=8,
            ple_layer_ids=[1, 2, 4],
            ngram_size=3,
            heads_per_ngram=1,
            ngram_vocab_size_base=50,
            make_ngram_vocab_size_divisible_by=4,
            split_ngram_parts=2,
            indexer_n_heads=2,
            indexer_kv_heads=1,
            indexer_head_dim=16,
            indexer_budget=8,
            indexer_compress_ratio=4,
            eos_token_id=5,
            output_gate_type="sigmoid",
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
    )


def fixtures_extra():
    return [
        dict(
            name="extra_qwen4exp_a",
            arch="qwen4exp",
            seed=4004,
            n_prompt=64,
            eos_positions=[5, 30, 31, 50],
            description=(
                "Qwen4-Exp, 8 layers (LLLQ LLLQ: 2 QSA layers), hidden 96, GDN 1 k head / 3 v heads (k 32, v 32), "
                "attention 4 q / 1 kv head, head_dim 32, partial rotary 0.5 (16 dims, mrope [4,2,2]), QSA 3 index "
                "heads x 16, budget 12, ratio 2, 16 experts top-3, hc_count 2, lowrank 8, PLE on layer 6 "
                "(1-based) with ngram 4, 2 heads per ngram (6 heads x 16, ple_embed_dim 96), PLE conv kernel 3, "
                "8 shards per table, EOS at 5, 30, 31 (adjacent) and 50; prompt 64."
            ),
            config=dict(
                vocab_size=384,
                hidden_size=96,
                num_hidden_layers=8,
                layer_types=[LIN, LIN, LIN, QSA, LIN, LIN, LIN, QSA],
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=32,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.5,
                    "mrope_section": [4, 2, 2],
                    "mrope_interleaved": True,
                },
                linear_num_key_heads=1,
                linear_num_value_heads=3,
                linear_key_head_dim=32,
                linear_value_head_dim=32,
                linear_conv_kernel_dim=4,
                num_experts=16,
                num_experts_per_tok=3,
                moe_intermediate_size=24,
                shared_expert_intermediate_size=40,
                hc_count=2,
                hc_lowrank=8,
                ple_layer_ids=[6],
                ple_embed_dim=96,
                ple_conv_kernel_size=3,
                ngram_size=4,
                heads_per_ngram=2,
                ngram_vocab_size_base=500,
                make_ngram_vocab_size_divisible_by=128,
                split_ngram_parts=8,
                indexer_n_heads=3,
                indexer_kv_heads=1,
                indexer_head_dim=16,
                indexer_budget=12,
                indexer_compress_ratio=2,
                eos_token_id=7,
                output_gate_type="sigmoid",
                max_position_embeddings=4096,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
            ),
        ),
        dict(
            name="extra_qwen35moe_b",
            arch="qwen35moe",
            seed=5005,
            n_prompt=64,
            eos_positions=[5, 30, 31, 50],
            description=(
                "Qwen3.5-MoE, 8 layers (LLLF LLLF), hidden 96, GDN 1 k head / 3 v heads (k 32, v 32), attention "
                "6 q / 2 kv heads, head_dim 16, partial rotary 0.5 (8 dims, mrope [2,1,1]), 16 experts top-3; "
                "prompt 64."
            ),
            config=dict(
                vocab_size=384,
                hidden_size=96,
                num_hidden_layers=8,
                layer_types=[LIN, LIN, LIN, FULL, LIN, LIN, LIN, FULL],
                num_attention_heads=6,
                num_key_value_heads=2,
                head_dim=16,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.5,
                    "mrope_section": [2, 1, 1],
                    "mrope_interleaved": True,
                },
                linear_num_key_heads=1,
                linear_num_value_heads=3,
                linear_key_head_dim=32,
                linear_value_head_dim=32,
                linear_conv_kernel_dim=4,
                num_experts=16,
                num_experts_per_tok=3,
                moe_intermediate_size=24,
                shared_expert_intermediate_size=40,
                eos_token_id=7,
                max_position_embeddings=4096,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
            ),
        ),
        dict(
            name="extra_qwen3next_c",
            arch="qwen3next",
            seed=6006,
            n_prompt=64,
            eos_positions=[5, 30, 31, 50],
            description=(
                "Qwen3-Next, 6 layers (LLF LLF), hidden 128, GDN 2 k heads / 6 v heads (16/16), attention 8 q / "
                "2 kv heads, head_dim 16, partial rotary 0.25 (4 dims), 16 experts top-3, all layers MoE; prompt 64."
            ),
            config=dict(
                vocab_size=320,
                hidden_size=128,
                intermediate_size=96,
                num_hidden_layers=6,
                layer_types=[LIN, LIN, FULL, LIN, LIN, FULL],
                num_attention_heads=8,
                num_key_value_heads=2,
                head_dim=16,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                linear_num_key_heads=2,
                linear_num_value_heads=6,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                linear_conv_kernel_dim=4,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                num_experts=16,
                num_experts_per_tok=3,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=48,
                eos_token_id=7,
                max_position_embeddings=4096,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
            ),
        ),
        dict(
            name="extra_qwen4exp_d",
            arch="qwen4exp",
            seed=7007,
            n_prompt=50,
            eos_positions=[0, 1, 40],
            description=(
                "Qwen4-Exp, 5 layers (L Q L L Q), hidden 64, GDN 2 k / 2 v heads (32/32, no grouping), sigmoid "
                "output gate, attention 2 q / 2 kv heads, head_dim 64, partial rotary 0.25 (16 dims, mrope [4,2,2]), "
                "QSA 4 index heads x 32, budget 16, ratio 8, 6 experts top-2, "
                "hc_count 4, lowrank 32, PLE on layer 3 (1-based; llama.cpp's qwen4exp has one PLE layer) "
                "with ngram 2, 4 heads per ngram (4 heads x 16, ple_embed_dim 64), 2 shards per table, eos id 0 at positions 0, 1 and 40; prompt 50."
            ),
            config=dict(
                vocab_size=256,
                hidden_size=64,
                num_hidden_layers=5,
                layer_types=[LIN, QSA, LIN, LIN, QSA],
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=64,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 1000000.0,
                    "partial_rotary_factor": 0.25,
                    "mrope_section": [4, 2, 2],
                    "mrope_interleaved": True,
                },
                linear_num_key_heads=2,
                linear_num_value_heads=2,
                linear_key_head_dim=32,
                linear_value_head_dim=32,
                linear_conv_kernel_dim=4,
                num_experts=6,
                num_experts_per_tok=2,
                norm_topk_prob=True,
                moe_intermediate_size=16,
                shared_expert_intermediate_size=32,
                hc_count=4,
                hc_lowrank=32,
                ple_layer_ids=[3],
                ple_embed_dim=64,
                ngram_size=2,
                heads_per_ngram=4,
                ngram_vocab_size_base=300,
                make_ngram_vocab_size_divisible_by=128,
                split_ngram_parts=2,
                indexer_n_heads=4,
                indexer_kv_heads=1,
                indexer_head_dim=32,
                indexer_budget=16,
                indexer_compress_ratio=8,
                eos_token_id=0,
                output_gate_type="sigmoid",
                max_position_embeddings=4096,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
            ),
        ),
    ]


# --------------------------------------------------------------------------------------------------------------------
# Model construction
# --------------------------------------------------------------------------------------------------------------------


def arch_classes(arch):
    if arch == "qwen4exp":
        from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
        from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM

        return Qwen4ExpTextConfig, Qwen4ExpForCausalLM
    if arch == "qwen35moe":
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

        return Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM
    if arch == "qwen3next":
        from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextForCausalLM

        return Qwen3NextConfig, Qwen3NextForCausalLM
    raise ValueError(f"unknown arch {arch}")


def check_config(cfg, wanted):
    """Every value we asked for must be present on the config object as given (catches renamed/ignored keys)."""
    problems = []
    for key, value in wanted.items():
        if not hasattr(cfg, key):
            problems.append(f"{key}: missing on config")
            continue
        got = getattr(cfg, key)
        if key == "rope_parameters":
            for rk, rv in value.items():
                if not isinstance(got, dict) or got.get(rk) != rv:
                    problems.append(f"rope_parameters[{rk}]: wanted {rv!r}, got {got!r}")
            continue
        if key == "layer_types":
            # qwen4exp maps full_attention -> qwen_sparse_attention, others keep full_attention.
            continue
        if got != value:
            problems.append(f"{key}: wanted {value!r}, got {got!r}")
    return problems


@torch.no_grad()
def reinit_weights(model, seed, log_lines):
    """Give every parameter a realistic scale. Integer buffers are not parameters and are left alone."""
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean

    # GPT-2-style residual scaling: the projections that write into the residual stream get 1/sqrt(2 * layers), so
    # each block adds a small update to the stream as in trained models, instead of replacing it (with full-size
    # updates a single top-k routing flip moves the logits by whole units).
    residual_scale = (2 * model.config.num_hidden_layers) ** -0.5
    handled = {}
    for mod_name, mod in model.named_modules():
        cls = type(mod).__name__
        for p_name, param in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            shape = tuple(param.shape)
            rule = None
            if cls.endswith("RMSNormGated"):
                new, rule = normal(shape, 0.2, 1.0), "1+N(0,0.2) gated norm"
            elif "RMSNorm" in cls:
                new, rule = normal(shape, 0.2), "N(0,0.2) zero-centred norm"
            elif isinstance(mod, nn.Embedding):
                new, rule = normal(shape, 1.0), "N(0,1) embedding"
            elif isinstance(mod, nn.Conv1d):
                if ".ple." in f".{full}":
                    new, rule = normal(shape, 0.3), "N(0,0.3) PLE conv"
                else:
                    new, rule = normal(shape, 0.5), "N(0,0.5) conv"
            elif param.dim() == 3 and p_name == "down_proj":
                new, rule = normal(shape, shape[-1] ** -0.5 * residual_scale), "N(0,1/fan_in)/sqrt(2L) expert down"
            elif param.dim() == 3 and (cls.endswith("Experts") or p_name == "gate_up_proj"):
                new, rule = normal(shape, shape[-1] ** -0.5), "N(0,1/fan_in) expert"
            elif cls.endswith("Router") or full.endswith("mlp.gate.weight"):
                new, rule = normal(shape, 3.0 * shape[-1] ** -0.5), "N(0,9/hidden) router"
            elif p_name == "A_log":
                u = torch.rand(shape, generator=gen, dtype=torch.float32) * 15.0 + 1.0
                new, rule = torch.log(u), "log(U(1,16))"
            elif p_name == "dt_bias":
                new, rule = normal(shape, 0.5), "N(0,0.5) dt_bias"
            elif isinstance(mod, nn.Linear):
                if p_name == "bias":
                    new, rule = normal(shape, 0.1), "N(0,0.1) bias"
                elif full == "lm_head.weight":
                    new, rule = normal(shape, 3.0 * shape[-1] ** -0.5), "N(0,9/hidden) lm_head"
                elif full.endswith("shared_expert_gate.weight"):
                    new, rule = normal(shape, shape[-1] ** -0.5), "N(0,1/hidden) shared gate"
                elif full.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                    new, rule = normal(shape, shape[-1] ** -0.5 * residual_scale), "N(0,1/fan_in)/sqrt(2L) residual out"
                else:
                    new, rule = normal(shape, shape[-1] ** -0.5), "N(0,1/fan_in) linear"
            if rule is None:
                raise RuntimeError(f"reinit: no rule for parameter {full} (module class {cls}, shape {shape})")
            if not param.dtype.is_floating_point:
                raise RuntimeError(f"reinit: parameter {full} is not floating point ({param.dtype})")
            param.copy_(new.to(param.dtype))
            handled[full] = rule
    all_names = {n for n, _ in model.named_parameters()}
    missing = sorted(all_names - set(handled))
    if missing:
        raise RuntimeError(f"reinit: parameters not re-initialized: {missing}")
    for name in sorted(handled):
        log_lines.append(f"  {name}: {handled[name]}")
    return handled


@torch.no_grad()
def align_gdn_query_key(model, log_lines):
    """Make each GDN key head a noisy copy of its query head (projection rows and conv taps).

    With independent random q and k, q.k of the L2-normalized heads is near zero, the delta-rule output is ~100x
    smaller than v, and the gated RMSNorm then blows weight-rounding noise up by the same factor: a q8_0 copy of such a
    model disagrees with itself for reasons no trained model has. Trained GDN layers have aligned q and k.
    """
    for name, mod in model.named_modules():
        if not hasattr(mod, "conv1d") or not hasattr(mod, "head_k_dim") or not hasattr(mod, "num_k_heads"):
            continue
        dk, nk = mod.head_k_dim, mod.num_k_heads
        conv = mod.conv1d.weight  # [C, 1, K], channels in the projection's output order
        if hasattr(mod, "in_proj_qkv"):
            w = mod.in_proj_qkv.weight
            q_rows = torch.arange(0, nk * dk)
            k_rows = q_rows + nk * dk
        elif hasattr(mod, "in_proj_qkvz"):
            w = mod.in_proj_qkvz.weight  # per key head: [q (dk) | k (dk) | v | z]
            group = w.shape[0] // nk
            q_rows = torch.cat([torch.arange(g * group, g * group + dk) for g in range(nk)])
            k_rows = q_rows + dk
        else:
            continue
        w[k_rows] = 0.8 * w[q_rows] + 0.6 * w[k_rows]
        # the conv always runs over q|k|v channels (qwen3next regroups its fused projection before the conv)
        kq = torch.arange(0, nk * dk)
        conv[kq + nk * dk] = conv[kq]
        log_lines.append(f"  {name}: key heads aligned with query heads (0.8 q + 0.6 noise), conv taps shared")


@torch.no_grad()
def q8_0_sensitivity(model, prompt, ref_logits):
    """How far a Q8_0 copy of the model moves from f32 (mean KL, top-1 agreement), measured in transformers itself.

    Every weight that strata's converter stores as Q8_0 (2-D or 3-D, input dim a multiple of 32, not a router or a
    conv) is rounded through Q8_0 blocks along its input dimension: d = max|x| / 127, q = round(x / d).
    """
    saved = {}
    for name, p in model.named_parameters():
        if p.dim() < 2 or p.shape[-1] % 32 or "conv1d" in name or name.endswith("mlp.gate.weight"):
            continue
        saved[name] = p.detach().clone()
        blocks = p.detach().reshape(-1, 32)
        d = blocks.abs().amax(dim=1, keepdim=True) / 127.0
        d16 = d.to(torch.float16).to(torch.float32)  # the scale is stored as f16
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        q = torch.round(blocks * inv).clamp(-127, 127)
        p.copy_((q * d16).reshape(p.shape))
    out = model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=False).logits[0].float().cpu().numpy()
    for name, p in model.named_parameters():
        if name in saved:
            p.copy_(saved[name])
    lp = ref_logits - ref_logits.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    lq = out - out.max(-1, keepdims=True)
    lq = lq - np.log(np.exp(lq).sum(-1, keepdims=True))
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    top1 = float((ref_logits.argmax(-1) == out.argmax(-1)).mean())
    return {"mean_kl": float(kl.mean()), "max_kl": float(kl.max()), "top1": top1}


@torch.no_grad()
def count_selection_ties(model, prompt, steps=GREEDY_STEPS):
    """Runs the prompt and its greedy continuation, counting 1-D topk calls (the QSA indexer's block selection) whose
    k-th and (k+1)-th largest values are equal, i.e. whose result depends on how ties are broken."""
    ties = 0
    original = torch.Tensor.topk

    def checked(self, k, *args, **kwargs):
        nonlocal ties
        if self.dim() == 1 and 0 < k < self.numel():
            top = torch.sort(self, descending=True).values
            ties += int(top[k - 1] == top[k])
        return original(self, k, *args, **kwargs)

    torch.Tensor.topk = checked
    try:
        seq = list(prompt)
        for _ in range(steps):
            out = model(input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False).logits[0, -1]
            seq.append(int(torch.argmax(out)))
        model(input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False)
    finally:
        torch.Tensor.topk = original
    return ties


def make_prompt(n, vocab, eos, eos_positions, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
    ids = [(t + 1) % vocab if t == eos else t for t in ids]  # EOS only where we put it
    for p in eos_positions:
        ids[p] = eos
    return ids


# --------------------------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------------------------

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.",
    "Strata is an inference engine. It loads a model, reads the prompt, and writes the next token until it stops.",
    "Once upon a time there was a little town by the sea. Every morning the fishermen went out in their boats, "
    "and every evening they came back with baskets full of silver fish. The children ran along the beach, "
    "the dogs barked at the waves, and the old lighthouse keeper counted the ships as they passed.",
    "Hello, world! How are you today? I am fine, thank you. What time is it? It is half past seven.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 65536 3.14159 2.71828 1e-6 -17.",
    "Machine learning models learn patterns from data. A transformer uses attention to mix information "
    "between tokens, while a recurrent layer keeps a running state. Mixture-of-experts layers route each "
    "token to a few experts, and the router decides which ones.",
    "The weather was cold and wet, but the market was busy. People bought bread, cheese, apples, and tea. "
    "A man played the violin near the fountain, and a woman sold flowers from a wooden cart.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
    "    def __len__(self):\n        return len(self.items)\n\n",
    "import os\nimport sys\n\n\ndef main(argv):\n    if len(argv) < 2:\n        print('usage: prog FILE')\n"
    "        return 1\n    with open(argv[1], 'r', encoding='utf-8') as f:\n        for line in f:\n"
    "            print(line.strip())\n    return 0\n\n\nif __name__ == '__main__':\n    sys.exit(main(sys.argv))\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(f'{i} is even')\n    else:\n        print(f'{i} is odd')\n",
    "result = {key: value for key, value in zip(keys, values) if value is not None}\n",
    "Questions and answers: What is the capital of France? Paris. What is two plus two? Four. "
    "Who wrote the play about the prince of Denmark? Shakespeare.",
    "She said: \"I don't think we'll make it in time.\" He replied: \"We've got to try; it's our last chance.\"",
    "Café, naïve, über, señor, 東京, Привет, مرحبا — unicode text should round-trip through bytes.",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a haiku.<|im_end|>\n",
]


def build_tokenizer(vocab_size, out_dir, meta):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    n_regular = vocab_size - len(SPECIAL_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=n_regular,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    corpus = [t for t in TRAIN_TEXT if "<|im_start|>" not in t] * 3
    tok.train_from_iterator(corpus, trainer=trainer)
    got = tok.get_vocab_size()
    if got < n_regular:
        # Not enough merges found: reserve the rest as special placeholders so ids stay dense.
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(n_regular - got)])
        log(f"  tokenizer: only {got} regular tokens learned, padded with {n_regular - got} reserved specials")
    tok.add_special_tokens(SPECIAL_TOKENS)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer vocab {tok.get_vocab_size()} != {vocab_size}")
    ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHATML_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2)
        f.write("\n")

    samples = [
        "Hello, world! How are you today?",
        "def f(x):\n    return x + 1\n",
        "Café 東京 — 3.14159 and 1024 tokens.",
        "<|im_start|>user\nWrite a haiku.<|im_end|>\n<|im_start|>assistant\n",
        "  leading spaces, trailing spaces  \n\n\nnewlines",
    ]
    checks = []
    for s in samples:
        enc = tok.encode(s)
        checks.append({"text": s, "ids": enc.ids, "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    meta["tokenizer"] = {
        "special_token_ids": ids,
        "n_merges_vocab": got,
        "pre_tokenizer": "Sequence[Split(Qwen2 regex, isolated), ByteLevel(add_prefix_space=False, use_regex=False)]",
        "normalizer": "NFC",
        "encode_checks": checks,
    }
    # Cross-check through transformers' AutoTokenizer + the chat template (best effort).
    try:
        from transformers import AutoTokenizer

        at = AutoTokenizer.from_pretrained(out_dir)
        msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi there!"}]
        rendered = at.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        chat_ids = tok.encode(rendered).ids
        same = [at.encode(c["text"], add_special_tokens=False) == c["ids"] for c in checks]
        meta["tokenizer"]["chat_check"] = {"messages": msgs, "rendered": rendered, "ids": chat_ids}
        meta["tokenizer"]["autotokenizer_class"] = type(at).__name__
        meta["tokenizer"]["autotokenizer_matches"] = same
        log(f"  tokenizer: AutoTokenizer {type(at).__name__}, matches {same}")
    except Exception as e:  # noqa: BLE001
        meta["tokenizer"]["autotokenizer_error"] = f"{type(e).__name__}: {e}"
        log(f"  tokenizer: AutoTokenizer check failed: {type(e).__name__}: {e}")
    return ids["<|endoftext|>"]


# --------------------------------------------------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------------------------------------------------


def list_safetensors(hf_dir):
    from safetensors import safe_open

    rows = []
    for path in sorted(glob.glob(os.path.join(hf_dir, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                rows.append((key, str(sl.get_dtype()), list(sl.get_shape()), os.path.basename(path)))
    rows.sort()
    return rows


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for fn in files:
            total += os.path.getsize(os.path.join(root, fn))
    return total


def attach_router_counters(model):
    counts = {}
    hooks = []
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("TopKRouter"):
            counts[name] = None

            def hook(m, inp, out, name=name):
                try:
                    idx = out[2] if isinstance(out, (tuple, list)) and len(out) >= 3 else None
                    if idx is None:
                        return
                    c = torch.bincount(idx.reshape(-1).long(), minlength=m.num_experts).tolist()
                    counts[name] = c
                except Exception:  # noqa: BLE001
                    pass

            hooks.append(mod.register_forward_hook(hook))
    return counts, hooks


def build_fixture(fx, out_root):
    name, arch, seed = fx["name"], fx["arch"], fx["seed"]
    t0 = time.time()
    log(f"=== {name} ({arch}) ===")
    fdir = os.path.join(out_root, name)
    hf_dir = os.path.join(fdir, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    meta = {
        "name": name,
        "arch": arch,
        "seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "dtype": "float32",
        "device": "cpu",
        "description": fx["description"],
    }
    cfg_kwargs = dict(fx["config"])
    if fx.get("tokenizer"):
        eos = build_tokenizer(cfg_kwargs["vocab_size"], hf_dir, meta)
        cfg_kwargs["eos_token_id"] = eos
        log(f"  tokenizer: <|endoftext|> = {eos}")

    config_cls, model_cls = arch_classes(arch)
    config = config_cls(**cfg_kwargs)
    problems = check_config(config, cfg_kwargs)
    if problems:
        raise RuntimeError(f"{name}: config mismatch: {problems}")
    meta["model_class"] = model_cls.__name__
    meta["config_class"] = config_cls.__name__
    meta["layer_types"] = list(config.layer_types)

    torch.manual_seed(seed)
    model = model_cls(config)
    model.eval()
    # A fixture about which layers get which module checks that the library built them so (module path -> class).
    modules = dict(model.named_modules())
    for path, cls in fx.get("expect_modules", {}).items():
        got = type(modules[path]).__name__ if path in modules else None
        if got != cls:
            raise RuntimeError(f"{name}: {path} is {got}, the fixture expects {cls}")
    meta["expect_modules"] = fx.get("expect_modules", {})
    attn_impl = None
    try:
        model.set_attn_implementation("eager")
    except Exception as e:  # noqa: BLE001
        log(f"  set_attn_implementation('eager') failed ({type(e).__name__}: {e}); keeping default")
    attn_impl = getattr(model.config, "_attn_implementation", None)
    meta["attn_implementation"] = attn_impl
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as e:  # noqa: BLE001
            log(f"  set_experts_implementation('eager') failed ({type(e).__name__}: {e}); keeping default")
    meta["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    model.to(torch.float32)

    vocab = config.vocab_size
    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    prompt = make_prompt(fx["n_prompt"], vocab, eos, fx["eos_positions"], seed + 2)
    # The QSA indexer scores blocks by a sum of ReLUs, so blocks can tie at exactly 0, and which of them torch.topk
    # keeps is decided by its algorithm's swaps. By default, draw weights until no query's selection depends on a tie;
    # fixtures with selection_ties="wanted" (make_qsa_goldens.py) need the opposite: draws where ties decide some.
    want_ties = fx.get("selection_ties") == "wanted"
    for attempt in range(20):
        init_lines = []
        reinit_weights(model, seed + 1 + 1000 * attempt, init_lines)
        align_gdn_query_key(model, init_lines)
        if fx.get("post_init"):
            fx["post_init"](model, init_lines)
        ties = count_selection_ties(model, prompt)
        log(f"  init attempt {attempt}: {ties} QSA selections decided by a tie")
        if (ties > 0) == want_ties:
            break
    else:
        raise RuntimeError(f"{name}: no weight draw gave {'some' if want_ties else 'no'} QSA selection ties")
    meta["init_attempt"] = attempt
    meta["selection_ties"] = ties
    n_params = sum(p.numel() for p in model.parameters())
    meta["n_parameters"] = n_params
    buffers = {n: [str(b.dtype), list(b.shape)] for n, b in model.named_buffers()}
    meta["model_buffers"] = buffers
    log(f"  params {n_params}, attn {attn_impl}, buffers {len(buffers)}")

    meta.update(
        n_tokens=len(prompt),
        vocab=vocab,
        eos_token_id=eos,
        eos_positions=fx["eos_positions"],
        greedy_steps=GREEDY_STEPS,
    )

    counts, hooks = attach_router_counters(model)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=False).logits
    for h in hooks:
        h.remove()
    logits = logits[0].float().cpu().numpy()
    if logits.shape != (len(prompt), vocab):
        raise RuntimeError(f"{name}: logits shape {logits.shape}")
    if not np.all(np.isfinite(logits)):
        raise RuntimeError(f"{name}: non-finite logits")
    logits.astype("<f4").tofile(os.path.join(fdir, "logits.f32"))
    srt = np.sort(logits, axis=-1)
    margins = srt[:, -1] - srt[:, -2]
    meta["expert_usage_prefill"] = counts
    meta["logits_stats"] = {
        "max_abs": float(np.abs(logits).max()),
        "std": float(logits.std()),
        "mean_row_spread": float((logits.max(-1) - logits.min(-1)).mean()),
        "min_top1_margin": float(margins.min()),
        "n_unique_argmax": int(len(set(logits.argmax(-1).tolist()))),
    }

    meta["q8_0_sensitivity"] = q8_0_sensitivity(model, prompt, logits)
    log(f"  q8_0 fake-quant vs f32: {meta['q8_0_sensitivity']}")

    # Greedy continuation: full recompute every step, no cache, no EOS stop.
    seq = list(prompt)
    greedy, gmargins = [], []
    with torch.inference_mode():
        for _ in range(GREEDY_STEPS):
            out = model(input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False).logits[0, -1].float()
            top2 = torch.topk(out, 2).values
            nxt = int(torch.argmax(out))
            greedy.append(nxt)
            gmargins.append(float(top2[0] - top2[1]))
            seq.append(nxt)
    meta["greedy_min_margin"] = min(gmargins)
    meta["greedy_margins"] = gmargins
    # The last-row prefill logits must equal step 0 of the greedy loop (same computation).
    if int(np.argmax(logits[-1])) != greedy[0]:
        log(f"  WARNING: prefill argmax {int(np.argmax(logits[-1]))} != greedy[0] {greedy[0]}")

    with open(os.path.join(fdir, "prompt.txt"), "w") as f:
        f.write(" ".join(map(str, prompt)) + "\n")
    with open(os.path.join(fdir, "greedy.txt"), "w") as f:
        f.write(" ".join(map(str, greedy)) + "\n")

    # Save as transformers writes it.
    model.save_pretrained(hf_dir, safe_serialization=True)
    rows = list_safetensors(hf_dir)
    with open(os.path.join(fdir, "keys.txt"), "w") as f:
        for key, dt, shape, fname in rows:
            f.write(f"{key}\t{dt}\t{shape}\n")
    meta["safetensors_files"] = sorted({r[3] for r in rows})
    meta["n_keys"] = len(rows)
    log(f"  safetensors keys ({len(rows)}):")
    for key, dt, shape, _ in rows:
        log(f"    {key}\t{dt}\t{shape}")
    with open(os.path.join(hf_dir, "config.json")) as f:
        meta["saved_config"] = json.load(f)
    # A fixture about an absent rope field must not have had it filled in (by the config class or save_pretrained).
    saved_rope = meta["saved_config"].get("rope_parameters") or {}
    for key in fx.get("absent_rope_keys", ()):
        if key in saved_rope or key in meta["saved_config"]:
            raise RuntimeError(f"{name}: the saved config.json has {key}, the fixture is about its absence")
    for mod_name, mod in model.named_modules():
        if type(mod).__name__.endswith("RotaryEmbedding") and hasattr(mod, "mrope_section"):
            meta["rotary_mrope_section"] = list(mod.mrope_section)  # what the forward pass used
            log(f"  {mod_name}: mrope_section {list(mod.mrope_section)}")
            break

    # Round trip: load what was written and compare logits.
    try:
        kw = dict(attn_implementation="eager")
        try:
            re_model = model_cls.from_pretrained(hf_dir, dtype=torch.float32, output_loading_info=True, **kw)
        except TypeError:
            re_model = model_cls.from_pretrained(hf_dir, torch_dtype=torch.float32, output_loading_info=True, **kw)
        re_model, info = re_model if isinstance(re_model, tuple) else (re_model, {})
        re_model.eval()
        if hasattr(re_model, "set_experts_implementation"):
            try:
                re_model.set_experts_implementation("eager")
            except Exception:  # noqa: BLE001
                pass
        with torch.inference_mode():
            re_logits = re_model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].float().numpy()
        diff = float(np.abs(re_logits - logits).max())
        meta["roundtrip_max_abs_diff"] = diff
        try:
            meta["roundtrip_loading_info"] = {k: sorted(map(str, v)) for k, v in dict(info).items()}
        except Exception:  # noqa: BLE001
            meta["roundtrip_loading_info"] = str(info)
        log(f"  round trip max |diff| {diff:.3g}, loading info {meta['roundtrip_loading_info']}")
        del re_model
    except Exception as e:  # noqa: BLE001
        meta["roundtrip_error"] = f"{type(e).__name__}: {e}"
        log(f"  round trip FAILED: {type(e).__name__}: {e}")
        traceback.print_exc()

    meta["reinit_rules"] = init_lines
    meta["seconds"] = round(time.time() - t0, 2)
    with open(os.path.join(fdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")

    summary = {
        "name": name,
        "keys": len(rows),
        "bytes": dir_bytes(fdir),
        "max_abs": meta["logits_stats"]["max_abs"],
        "spread": meta["logits_stats"]["mean_row_spread"],
        "uniq_argmax": meta["logits_stats"]["n_unique_argmax"],
        "min_margin": min(meta["logits_stats"]["min_top1_margin"], meta["greedy_min_margin"]),
        "roundtrip": meta.get("roundtrip_max_abs_diff", meta.get("roundtrip_error")),
        "greedy": greedy,
        "q8": meta["q8_0_sensitivity"],
        "seconds": meta["seconds"],
    }
    log(f"  done in {meta['seconds']} s, {summary['bytes']} bytes")
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory for the main fixtures")
    ap.add_argument("--extra", action="store_true", help="also build the extra generalization fixtures")
    ap.add_argument("--extra-out", default=None, help="output directory for extras (default: <out>_extras)")
    ap.add_argument("--only", default=None, help="comma-separated fixture names to build")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
    jobs = [(fx, args.out) for fx in fixtures_main() + fixtures_configs()]
    if args.extra:
        extra_out = args.extra_out or (args.out.rstrip("/") + "_extras")
        jobs += [(fx, extra_out) for fx in fixtures_extra()]
    if args.only:
        wanted = set(args.only.split(","))
        jobs = [j for j in jobs if j[0]["name"] in wanted]

    summaries, failures = [], []
    for fx, out_root in jobs:
        os.makedirs(out_root, exist_ok=True)
        try:
            summaries.append(build_fixture(fx, out_root))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            failures.append(f"{fx['name']}: {type(e).__name__}: {e}")

    log("\n=== summary ===")
    for s in summaries:
        log(
            f"{s['name']}: keys {s['keys']}, {s['bytes']} bytes, logits max|x| {s['max_abs']:.3f}, "
            f"row spread {s['spread']:.3f}, unique argmax {s['uniq_argmax']}, min margin {s['min_margin']:.4f}, q8_0 {s['q8']}, "
            f"roundtrip {s['roundtrip']}, {s['seconds']} s"
        )
        log(f"  greedy: {' '.join(map(str, s['greedy']))}")
    for fl in failures:
        log(f"FAILED {fl}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
