"""Trains the bundled code model on one GPU, evaluates it and writes the checkpoint `strata convert` reads.

    python3 tools/train/train.py --data DATA_DIR --out OUT_DIR --steps N [--seed S] [--eval] [--export]

Fixed seeds and deterministic kernels: a second run from scratch reproduces the loss curve (run.sh runs two).
Writes OUT_DIR/loss.json (the curve), metrics.json (held-out NLL, QSA dense vs sparse, MTP acceptance, routing
statistics), and with --export hf/ (config.json, bf16 safetensors shards, tokenizer) and goldens.bin.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402


def seed_everything(seed):
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def batches(stream, batch, seq, steps, seed):
    """Random windows of seq+1 tokens, the same ones for the same seed."""
    rng = np.random.default_rng(seed)
    n = stream.size - seq - 1
    for _ in range(steps):
        starts = rng.integers(0, n, size=batch)
        yield np.stack([stream[s : s + seq + 1] for s in starts]).astype(np.int64)


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(args, model, train_ids, device):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name or "embed" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=False, foreach=False,
    )
    dense_steps = int(args.steps * args.dense_fraction)
    curve, t0 = [], time.time()
    model.train()
    for step, window in enumerate(batches(train_ids, args.batch, args.seq, args.steps, args.seed)):
        x = torch.from_numpy(window).to(device)
        inputs, labels = x[:, :-1], x[:, 1:]
        # Dense attention while the indexer learns where attention goes, then the sparse selection it makes.
        M.set_attention_mode(model.lm, dense=step < dense_steps)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out, mtp_logits = model(inputs, with_mtp=True, router_logits=True)
        main = F.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]), labels.reshape(-1))
        # MTP cell i sees tokens up to i+1 and predicts token i+2 = labels[i+1].
        mtp = F.cross_entropy(mtp_logits.float().reshape(-1, mtp_logits.shape[-1]), labels[:, 1:].reshape(-1))
        kls = M.indexer_losses(model.lm)
        kl = torch.stack(kls).mean() if kls else torch.zeros((), device=device)
        aux = out.aux_loss.float()
        loss = main + args.mtp_weight * mtp + args.router_aux * aux + args.indexer_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            row = {
                "step": step, "loss": round(main.item(), 5), "mtp": round(mtp.item(), 5),
                "indexer_kl": round(kl.item(), 5), "aux": round(aux.item(), 5), "gnorm": round(gnorm.item(), 4),
                "lr": lr_at(step, args.steps, args.lr, args.warmup), "dense": step < dense_steps,
                "seconds": round(time.time() - t0, 1),
            }
            curve.append(row)
            print("train " + json.dumps(row), flush=True)
    torch.cuda.synchronize()
    return curve, time.time() - t0


@torch.no_grad()
def round_to_bf16(model):
    """The shipped weights are bf16: round the master weights once, then every figure is of the shipped model."""
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16).float())


def windows(stream, seq, count):
    """count windows of seq+1 tokens spread evenly over the stream, as one (count, seq+1) int64 array."""
    step = max(seq, (stream.size - seq - 1) // count)
    starts = list(range(0, stream.size - seq - 1, step))[:count]
    return np.stack([stream[s : s + seq + 1] for s in starts]).astype(np.int64)


@torch.no_grad()
def evaluate(args, model, held_ids, device, batch=16):
    model.eval()
    lm = model.lm
    metrics = {}

    def nll(seq, count, dense):
        M.set_attention_mode(lm, dense=dense, train_indexer=False)
        w = torch.from_numpy(windows(held_ids, seq, count)).to(device)
        total = 0.0
        for i in range(0, w.shape[0], batch):
            x = w[i : i + batch]
            logits = lm(input_ids=x[:, :-1], use_cache=False).logits.float()
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
        return total / (w.shape[0] * seq), int(w.shape[0] * seq)

    budget = lm.config.indexer_budget
    metrics["heldout_nll"], metrics["heldout_tokens"] = nll(args.seq, args.eval_windows, dense=False)
    for mult in (4, 8):
        seq = mult * budget
        count = args.eval_windows * args.seq // seq
        sparse, n = nll(seq, count, dense=False)
        dense, _ = nll(seq, count, dense=True)
        metrics[f"qsa_{mult}x_budget"] = {"seq": seq, "tokens": n, "nll_sparse": sparse, "nll_dense": dense,
                                          "relative": sparse / dense - 1}
    M.set_attention_mode(lm, dense=False, train_indexer=False)

    # MTP at depth 1: the draft for position i+2 (MTP cell i) against the main model's greedy choice there.
    E, k = lm.config.num_experts, lm.config.num_experts_per_tok
    n_layers = len(lm.model.layers)
    load = torch.zeros(n_layers, E, device=device)
    reuse_hits = torch.zeros(n_layers, device=device)
    reuse_total = torch.zeros(n_layers, device=device)
    routes = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: routes.append(o[2])) for layer in lm.model.layers]
    agree, total, mtp_nll = 0, 0, 0.0
    w = torch.from_numpy(windows(held_ids, args.seq, args.eval_windows)).to(device)
    for i in range(0, w.shape[0], batch):
        routes.clear()
        x = w[i : i + batch]
        out, mtp_logits = model(x[:, :-1], with_mtp=True)
        main_next = out.logits[:, 1:].argmax(-1)  # main's choice for token i+2, given tokens up to i+1
        draft = mtp_logits.argmax(-1)
        agree += (draft == main_next).sum().item()
        total += main_next.numel()
        mtp_nll += F.cross_entropy(mtp_logits.float().reshape(-1, mtp_logits.shape[-1]), x[:, 2:].reshape(-1),
                                   reduction="sum").item()
        B, T = x.shape[0], x.shape[1] - 1
        for li, idx in enumerate(routes):
            load[li] += torch.bincount(idx.reshape(-1), minlength=E).float()
            onehot = F.one_hot(idx.reshape(B, T, k), E).sum(2)  # (B, T, E)
            reuse_hits[li] += (onehot[:, 1:] * onehot[:, :-1]).sum()
            reuse_total[li] += k * B * (T - 1)
    for h in hooks:
        h.remove()
    metrics["mtp_acceptance_depth1"] = agree / total
    metrics["mtp_positions"] = total
    metrics["mtp_nll"] = mtp_nll / total
    share = load / load.sum(-1, keepdim=True)
    metrics["routing"] = [
        {
            "layer": li,
            "max_share": share[li].max().item(),
            "min_share": share[li].min().item(),
            "uniform_share": 1 / E,
            "cv": (share[li].std() / share[li].mean()).item(),
            "entropy_bits": float(-(share[li] * share[li].clamp_min(1e-12).log2()).sum().item()),
            "reuse_prev_token": (reuse_hits[li] / reuse_total[li]).item(),
            "reuse_if_random": k / E,
        }
        for li in range(n_layers)
    ]
    return metrics


@torch.no_grad()
def export(args, model, held_ids, data_dir, out_dir, device):
    """bf16 safetensors shards (small enough to come back from the GPU machine), config, tokenizer, goldens."""
    from safetensors.torch import save_file

    hf_dir = os.path.join(out_dir, "hf")
    os.makedirs(hf_dir, exist_ok=True)
    model.lm.config.architectures = ["Qwen4ExpForCausalLM"]
    model.lm.config.save_pretrained(hf_dir)
    sd = model.checkpoint_state_dict()
    shards, current, size, weight_map = [], {}, 0, {}
    for name in sorted(sd):
        t = sd[name].detach().cpu().contiguous()
        if t.is_floating_point():
            t = t.to(torch.bfloat16)
        if current and size + t.numel() * t.element_size() > 15_000_000:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += t.numel() * t.element_size()
    shards.append(current)
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(hf_dir, fname), metadata={"format": "pt"})
        for name in shard:
            weight_map[name] = fname
    with open(os.path.join(hf_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(data_dir, name), hf_dir)

    # Goldens: transformers' own forward (its looping QSA selection), f32, on the start of the held-out stream.
    model.eval()
    M.set_attention_mode(model.lm, dense=False, train_indexer=False)
    ids = torch.from_numpy(held_ids[: args.golden_tokens].astype(np.int64)).to(device)[None]
    rel, logits = M.check_indexer_against_transformers(model, ids)
    logits = logits[0].cpu().numpy().astype(np.float32)
    with open(os.path.join(out_dir, "goldens.bin"), "wb") as f:
        # header: magic, n_tokens, n_vocab; ids (i32); argmax (i32); logits (f32, row-major)
        f.write(b"STGL" + struct.pack("<ii", logits.shape[0], logits.shape[1]))
        f.write(ids[0].cpu().numpy().astype(np.int32).tobytes())
        f.write(logits.argmax(-1).astype(np.int32).tobytes())
        f.write(logits.tobytes())
    return {"vectorised_vs_transformers_rel": rel, "golden_tokens": int(logits.shape[0])}


@torch.no_grad()
def sample(model, tokenizer_path, prompt, n, device):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    ids = tok.encode(prompt).ids
    M.set_attention_mode(model.lm, dense=False, train_indexer=False)
    for _ in range(n):
        x = torch.tensor([ids], device=device)
        ids.append(int(model.lm(input_ids=x, use_cache=False).logits[0, -1].argmax()))
    return tok.decode(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--dense-fraction", type=float, default=0.15)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--router-aux", type=float, default=0.01)
    ap.add_argument("--indexer-weight", type=float, default=1.0)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--golden-tokens", type=int, default=192)
    ap.add_argument("--export", action="store_true")
    ap.add_argument("--copy-to", default="", help="folder that receives the shards and goldens right after export")
    ap.add_argument("--shape", default="{}", help="JSON overrides of the model shape (smoke tests)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda")
    seed_everything(args.seed)
    M.install_training_attention()

    train_ids = np.fromfile(os.path.join(args.data, "train.bin"), dtype=np.uint16)
    held_ids = np.fromfile(os.path.join(args.data, "heldout.bin"), dtype=np.uint16)
    with open(os.path.join(args.data, "tokenizer.json")) as f:
        vocab = len(json.load(f)["model"]["vocab"])
    config = M.make_config(vocab_size=vocab, eos_token_id=0, **json.loads(args.shape))
    model = M.BundledModel(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in model.mtp.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters ({n_mtp / 1e6:.2f}M in MTP), vocab {vocab}", flush=True)

    curve, seconds = train(args, model, train_ids, device)
    with open(os.path.join(args.out, "loss.json"), "w") as f:
        json.dump({"seconds": seconds, "args": vars(args), "curve": curve}, f, indent=1)
    round_to_bf16(model)
    metrics = {"parameters": n_params, "mtp_parameters": n_mtp, "train_seconds": seconds,
               "train_tokens": args.steps * args.batch * args.seq}
    if args.export:
        metrics.update(export(args, model, held_ids, args.data, args.out, device))
        if args.copy_to:  # the device tool returns what is there even if a later step runs out of time
            for name in os.listdir(os.path.join(args.out, "hf")):
                if name.endswith(".safetensors"):
                    shutil.copy(os.path.join(args.out, "hf", name), args.copy_to)
            shutil.copy(os.path.join(args.out, "goldens.bin"), args.copy_to)
            import tarfile
            with tarfile.open(os.path.join(args.copy_to, "export.tar.gz"), "w:gz") as tar:
                for name in ("config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"):
                    tar.add(os.path.join(args.out, "hf", name), arcname="hf/" + name)
                tar.add(os.path.join(args.out, "loss.json"), arcname="loss.json")
        print("exported " + json.dumps(metrics), flush=True)
    metrics.update(evaluate(args, model, held_ids, device))
    if args.export:
        metrics["sample_fibonacci"] = sample(model, os.path.join(args.data, "tokenizer.json"),
                                             "def fibonacci(n):", 48, device)
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print("metrics " + json.dumps(metrics), flush=True)


if __name__ == "__main__":
    main()
