"""The bundled model: transformers 5.17's Qwen4Exp text model, plus what training needs.

- The QSA attention's selection is computed for all queries at once (transformers walks queries in a Python loop);
  `check_indexer_against_transformers` shows the two select the same cells and give the same logits.
- The indexer learns by a KL loss towards the dense attention distribution aggregated per key block (as DeepSeek
  trains its sparse-attention indexer): the selection is not differentiable, so nothing else would train it. Its input
  is detached so this loss moves only the indexer.
- An MTP draft layer of the Flash-Next form (strata-architecture.md section 1.7, llama.cpp's `nextn`): cell i pairs
  the trunk's final multi-stream residual at i with the embedding of token i+1 and predicts token i+2.
"""

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.models.qwen4_exp import modeling_qwen4_exp as hf
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

LIN, QSA = "linear_attention", "full_attention"

SHAPE = dict(
    hidden_size=256,
    num_hidden_layers=8,
    layer_types=[LIN, LIN, LIN, QSA] * 2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [4, 2, 2],
        "mrope_interleaved": True,
    },
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=80,
    shared_expert_intermediate_size=192,
    norm_topk_prob=True,
    router_aux_loss_coef=0.01,
    hc_count=2,
    hc_lowrank=16,
    ple_layer_ids=[1],
    ngram_size=3,
    heads_per_ngram=2,
    ngram_vocab_size_base=4093,
    make_ngram_vocab_size_divisible_by=64,
    split_ngram_parts=1,
    ple_embed_dim=256,
    ple_conv_kernel_size=4,
    indexer_n_heads=4,
    indexer_kv_heads=1,
    indexer_head_dim=32,
    indexer_budget=64,
    indexer_compress_ratio=4,
    output_gate_type="sigmoid",
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    seed=1234,
)


def make_config(vocab_size, eos_token_id, **overrides):
    kwargs = dict(SHAPE)
    kwargs.update(overrides)
    return Qwen4ExpTextConfig(vocab_size=vocab_size, eos_token_id=eos_token_id, pad_token_id=None, **kwargs)


# --------------------------------------------------------------------------------------------------------------------
# QSA: vectorised selection and the indexer's KL loss
# --------------------------------------------------------------------------------------------------------------------


def indexer_block_scores(indexer, hidden_states, cos, sin):
    """Scores of every query against every complete key block, (B, T, NB), as transformers' indexer computes them."""
    B, T, _ = hidden_states.shape
    nh, di, r = indexer.index_n_heads, indexer.index_head_dim, indexer.compress_ratio
    q, k = torch.split(indexer.index_qk_proj(hidden_states), [nh * di, di], dim=-1)
    q = indexer.q_layernorm(q.reshape(B, T, nh, di))
    q = hf.apply_rotary_pos_emb(q, cos=cos, sin=sin, unsqueeze_dim=2)
    nb = T // r
    pooled = k[:, : nb * r].reshape(B, nb, r, di).float().mean(dim=2).to(k.dtype)
    pooled = indexer.k_layernorm(pooled)
    starts = torch.arange(nb, device=hidden_states.device) * r
    pooled = hf.apply_rotary_pos_emb(
        pooled.unsqueeze(2), cos=cos[:, starts], sin=sin[:, starts], unsqueeze_dim=2
    ).squeeze(2)
    scores = torch.einsum("bthd,bnd->bthn", q.float(), pooled.float())
    return torch.relu(scores).sum(dim=2) / math.sqrt(di)


def selection_mask(scores, T, ratio, block_topk):
    """(B, T, T) bool: the cells each query attends to: its best block_topk complete blocks plus the partial tail."""
    B, _, nb = scores.shape
    device = scores.device
    t = torch.arange(T, device=device)
    complete = (t + 1) // ratio  # complete blocks visible to query t
    valid = torch.arange(nb, device=device)[None, :] < complete[:, None]  # (T, NB)
    masked = scores.masked_fill(~valid[None], float("-inf"))
    k = min(block_topk, nb)
    mask = torch.zeros(B, T, T, dtype=torch.bool, device=device)
    if k > 0:
        top = masked.topk(k, dim=-1)
        chosen = torch.zeros(B, T, nb, dtype=torch.bool, device=device)
        chosen.scatter_(-1, top.indices, top.values > float("-inf"))
        mask[:, :, : nb * ratio] = chosen.repeat_interleave(ratio, dim=-1)
    j = torch.arange(T, device=device)
    tail = (j[None, :] >= (complete * ratio)[:, None]) & (j[None, :] <= t[:, None])
    return mask | tail[None]


def attention_forward(self, hidden_states, position_embeddings, attention_mask=None, past_key_values=None, **kwargs):
    """Qwen4ExpTextAttention.forward for whole sequences (training and evaluation; no cache)."""
    if past_key_values is not None:
        raise RuntimeError("the training attention runs on whole sequences only")
    B, T, _ = hidden_states.shape
    cos, sin = position_embeddings
    cos, sin = cos[:, -T:], sin[:, -T:]
    hidden_shape = (B, T, -1, self.head_dim)
    query, gate = torch.chunk(self.q_proj(hidden_states).view(B, T, -1, self.head_dim * 2), 2, dim=-1)
    gate = gate.reshape(B, T, -1)
    query = self.q_norm(query.reshape(hidden_shape)).transpose(1, 2)
    key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    query, key = hf.apply_rotary_pos_emb(query, key, cos, sin)
    key = hf.repeat_kv(key, self.num_key_value_groups)
    value = hf.repeat_kv(value, self.num_key_value_groups)

    causal = torch.ones(T, T, dtype=torch.bool, device=hidden_states.device).tril()
    dense = getattr(self, "force_dense", False) or getattr(self, "dense_mode", False)
    indexer = self.indexer
    mask = causal[None]
    self.indexer_kl = None
    if not getattr(self, "force_dense", False):
        scores = indexer_block_scores(indexer, hidden_states.detach(), cos, sin)
        if self.training and getattr(self, "train_indexer", True):
            self.indexer_kl = indexer_kl_loss(query.detach(), key.detach(), causal, scores, indexer.compress_ratio,
                                              self.scaling)
        if not dense:
            mask = selection_mask(scores.detach(), T, indexer.compress_ratio, indexer.block_topk)
    # The math kernel: cuDNN's and the memory-efficient kernels' backward passes are not deterministic.
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask[:, None], scale=self.scaling)
    out = out.transpose(1, 2).reshape(B, T, -1)
    out = out * torch.sigmoid(gate)
    return self.o_proj(out), None


def indexer_kl_loss(query, key, causal, scores, ratio, scaling):
    """KL(dense attention mass per block || softmax(indexer scores)), over queries that see a complete block."""
    B, H, T, _ = query.shape
    nb = scores.shape[-1]
    with torch.no_grad():
        logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling
        probs = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1).sum(dim=1)  # (B, T, T)
        mass = probs[:, :, : nb * ratio].reshape(B, T, nb, ratio).sum(-1)
        t = torch.arange(T, device=query.device)
        valid = torch.arange(nb, device=query.device)[None, :] < ((t + 1) // ratio)[:, None]
        mass = mass * valid[None]
        total = mass.sum(-1, keepdim=True)
        rows = (total.squeeze(-1) > 0)
        target = mass / total.clamp_min(1e-12)
    logq = scores.masked_fill(~valid[None], float("-inf")).log_softmax(dim=-1)
    logq = torch.where(valid[None], logq, torch.zeros_like(logq))
    kl = (target * (torch.log(target.clamp_min(1e-12)) - logq)).sum(-1)
    return (kl * rows).sum() / rows.sum().clamp_min(1)


def install_training_attention():
    hf.Qwen4ExpTextAttention.forward = attention_forward


def set_attention_mode(model, dense=False, train_indexer=True):
    for m in model.modules():
        if isinstance(m, hf.Qwen4ExpTextAttention):
            m.dense_mode = dense
            m.train_indexer = train_indexer


def indexer_losses(model):
    return [m.indexer_kl for m in model.modules() if isinstance(m, hf.Qwen4ExpTextAttention)
            and getattr(m, "indexer_kl", None) is not None]


# --------------------------------------------------------------------------------------------------------------------
# MTP
# --------------------------------------------------------------------------------------------------------------------


class MTPHead(nn.Module):
    """Names follow the checkpoint layout strata's converter reads (`mtp.*`)."""

    def __init__(self, config):
        super().__init__()
        H, HC = config.hidden_size, config.hidden_size * config.hc_count
        self.hc_count = config.hc_count
        self.pre_fc_norm_embedding = hf.Qwen4ExpTextRMSNorm(H, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = hf.Qwen4ExpTextRMSNorm(HC, eps=config.rms_norm_eps)  # over all streams at once
        self.fc_embedding = nn.Linear(H, H, bias=False)
        self.fc_hidden = nn.Linear(H, H, bias=False)
        layer_config = copy.deepcopy(config)
        layer_config.layer_types = list(config.layer_types) + ["qwen_sparse_attention"]
        layer = hf.Qwen4ExpTextDecoderLayer(layer_config, config.num_hidden_layers)
        layer.self_attn.force_dense = True  # the draft layer attends densely
        self.layers = nn.ModuleList([layer])
        self.hyper_connection_mixer = hf.Qwen4ExpTextGatedResidual(config, use_combine=False)

    def forward(self, residual, next_embeddings, position_embeddings):
        """residual: (B, T, HC) trunk residual before the final mixer; next_embeddings: (B, T, H) embeddings of the
        following tokens. Returns (B, T, H) hidden states for the head: cell i predicts token i+2."""
        B, T, HC = residual.shape
        e = self.fc_embedding(self.pre_fc_norm_embedding(next_embeddings))
        h = self.fc_hidden(self.pre_fc_norm_hidden(residual).view(B, T, self.hc_count, -1))
        x = (h + e.unsqueeze(2)).reshape(B, T, HC)
        x = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=None)
        return self.hyper_connection_mixer(x)


class BundledModel(nn.Module):
    """Qwen4ExpForCausalLM plus the MTP head; forward returns main logits, MTP logits and the router logits."""

    def __init__(self, config):
        super().__init__()
        self.lm = hf.Qwen4ExpForCausalLM(config)
        self.mtp = MTPHead(config)
        self.mtp.apply(self.lm._init_weights)
        self._residual = None
        self.lm.model.hyper_connection_mixer.register_forward_pre_hook(self._keep_residual)

    def _keep_residual(self, module, args):
        self._residual = args[0]

    def position_embeddings(self, input_ids, hidden):
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device).view(1, 1, -1).expand(3, B, -1)
        return self.lm.model.rotary_emb(hidden, pos)

    def forward(self, input_ids, with_mtp=True, router_logits=False):
        out = self.lm(input_ids=input_ids, use_cache=False, output_router_logits=router_logits)
        mtp_logits = None
        if with_mtp:
            residual = self._residual[:, :-1]
            emb = self.lm.model.embed_tokens(input_ids[:, 1:])
            pe = self.position_embeddings(input_ids[:, :-1], emb)
            hidden = self.mtp(residual, emb, pe)
            mtp_logits = self.lm.lm_head(hidden)
        self._residual = None
        return out, mtp_logits

    def checkpoint_state_dict(self):
        """The HF CausalLM names (model.*, lm_head.*) plus mtp.*: what `strata convert` reads."""
        sd = dict(self.lm.state_dict())
        for name, tensor in self.mtp.state_dict().items():
            sd["mtp." + name] = tensor
        return sd


@torch.no_grad()
def check_indexer_against_transformers(model, input_ids):
    """Logits of the vectorised attention against transformers' own (looping) QSA forward on the same weights."""
    lm = model.lm
    was_training = lm.training
    lm.eval()
    ours = lm(input_ids=input_ids, use_cache=False).logits.float()
    saved = hf.Qwen4ExpTextAttention.forward
    hf.Qwen4ExpTextAttention.forward = ORIGINAL_ATTENTION_FORWARD
    try:
        theirs = lm(input_ids=input_ids, use_cache=False).logits.float()
    finally:
        hf.Qwen4ExpTextAttention.forward = saved
    lm.train(was_training)
    return (ours - theirs).abs().max().item() / theirs.abs().max().item(), theirs


ORIGINAL_ATTENTION_FORWARD = hf.Qwen4ExpTextAttention.forward
