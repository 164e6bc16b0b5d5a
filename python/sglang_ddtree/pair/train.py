"""GPU step of the pair recipe: train the target, generate its continuations, train the DFlash
drafter against the frozen target, measure both, and write the asset folder.

Input: the folder written by :mod:`.corpus` (``--data``, default ``.pair-data``). Output
(``--out``): ``target/`` (config.json, generation_config.json, model.safetensors, tokenizer
files), ``drafter/`` (config.json, model.safetensors), ``metrics.json``, ``heldout_sample.npy``,
``heldout_prompts.json``.

Recipe (fixed seeds; GPU kernels are not bitwise deterministic):

1. Target, ``Qwen3ForCausalLM`` (TARGET_ARGS): AdamW (0.9, 0.95), weight decay 0.1 on matrices,
   peak lr 3e-3, linear warmup then cosine to 10%, grad clip 1.0, bf16 autocast, random windows of
   1024 tokens, 64 per step, 3715 steps (``--target-steps``; 0 calibrates the count from the step
   time to fill ``--target-seconds``: the shipped run did that on one H200, 37 ms/step -> 3715
   steps in 140 s, and the defaults now fix those counts).
   Every ``--eval-every`` steps the loss on validation files is measured and the best checkpoint
   kept. Weights are stored in bf16; every later step uses those bf16 weights.
2. Drafter data: ``--gen-seqs`` prompts of 64 tokens (random windows of the train split), each
   continued by the frozen target for 320 tokens: 3/4 greedy, 1/4 sampled (T=1, top-p 0.95).
3. Drafter, ``DFlashDraftModel`` (DRAFTER_ARGS, block 16): block-diffusion objective. Per sequence
   16 random anchors ``a`` in the generated part; block = ``[x[a], MASK x 15]`` at positions
   ``a..a+15``; context = the target's features (layers ``target_layer_ids``) of positions
   ``< a``; loss = cross-entropy of positions 1..15 against ``x[a+1..a+15]`` with weights
   ``exp(-(k-1)/7)`` (DFlash's decay, favouring the early positions that chains accept). AdamW,
   peak lr 2e-3, warmup then cosine, bf16 autocast, 256 sequences per step, 3575 steps (fixed or
   calibrated like the target's; 36 ms/step on the H200); best checkpoint by validation accept
   length.
4. Measurements (metrics.json): held-out loss of the target (float32, from the bf16 weights) on all
   held-out tokens and on the shipped subset; drafter per-position top-1 agreement and chain
   accept length at T=0 on held-out windows.

Usage: ``PYTHONPATH=python python3 -m sglang_ddtree.pair.train --data .pair-data --out DIR``
(``--smoke`` runs a tiny CPU version end to end).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import evaluate as E
from . import modeling as M
from .tokenizer import EOS_ID, IM_END_ID, MASK_ID, MASK_TOKEN

TARGET_ARGS = M.ModelArgs(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=2048,
)
# Features after target layers 1, 2, 3 of 5 (SGLang captures "before layer i + 1", so the last
# layer cannot be used).
DRAFTER_ARGS = replace(
    TARGET_ARGS,
    num_hidden_layers=2,
    block_size=16,
    target_layer_ids=(1, 2, 3),
    mask_token_id=MASK_ID,
    num_target_layers=5,
)
PROMPT_LEN, GEN_LEN = 64, 320
T0 = time.time()


def log(msg: str, **kw) -> None:
    print(json.dumps({"t": round(time.time() - T0, 1), "msg": msg, **kw}), flush=True)


def init_weights(model: torch.nn.Module, num_layers: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            torch.nn.init.ones_(p)
            continue
        std = (
            0.02 / math.sqrt(2 * num_layers)
            if name.endswith(("o_proj.weight", "down_proj.weight"))
            else 0.02
        )
        p.data.copy_(torch.randn(p.shape, generator=g) * std)


def lr_at(step: int, total: int, peak: float, warmup: int, min_frac: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model, lr, wd, dev):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": wd}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=dev.type == "cuda")


def random_windows(stream: torch.Tensor, b: int, t: int, g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - t, (b,), generator=g, device=stream.device)
    return stream[starts[:, None] + torch.arange(t, device=stream.device)]


def autocast(dev):
    return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")


class StepBudget:
    """Fixed step count, or one calibrated from the measured step time to fill `seconds`."""

    def __init__(self, steps: int, seconds: float, calib: int = 30, max_steps: int = 100000):
        self.total = steps if steps > 0 else None
        self.fixed = steps > 0
        self.seconds, self.calib, self.max_steps = seconds, calib, max_steps
        self.t_start = time.time()
        self.t_calib = None

    def planned(self) -> int:
        return self.total if self.total is not None else self.max_steps

    def after_step(self, step: int, sync) -> None:
        if self.total is not None:
            return
        if step == 10:
            sync()
            self.t_calib = time.time()
        elif step == 10 + self.calib:
            sync()
            per = (time.time() - self.t_calib) / self.calib
            left = self.seconds - (time.time() - self.t_start)
            self.total = min(self.max_steps, step + 1 + max(0, int(0.93 * left / per)))
            log("calibrated", step_ms=round(per * 1000, 2), total_steps=self.total)

    def hard_stop(self) -> bool:
        """Safety cap: 1.1x the seconds when calibrating, 3x with a fixed step count."""
        factor = 1.1 if self.fixed is False else 3.0
        return time.time() - self.t_start > factor * self.seconds + 5


def train_target(a, data, dev, cfg) -> tuple[M.Qwen3ForCausalLM, dict]:
    torch.manual_seed(cfg.seed)
    model = M.Qwen3ForCausalLM(TARGET_ARGS)
    init_weights(model, TARGET_ARGS.num_hidden_layers, cfg.seed)
    model.to(dev)
    opt = make_optimizer(model, cfg.target_lr, 0.1, dev)
    g = torch.Generator(device=dev).manual_seed(cfg.seed)
    val = E.windows(data["val"].cpu(), cfg.seq_len + 1, 64)
    budget = StepBudget(cfg.target_steps, cfg.target_seconds)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    best = (float("inf"), -1, None)
    curve, step = [], 0
    while step < budget.planned() and not budget.hard_stop():
        lr = lr_at(step, budget.planned(), cfg.target_lr, cfg.warmup)
        for grp in opt.param_groups:
            grp["lr"] = lr
        x = random_windows(data["train"], cfg.batch, cfg.seq_len + 1, g)
        with autocast(dev):
            logits, _ = model(x[:, :-1])
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        budget.after_step(step, sync)
        step += 1
        if step % cfg.eval_every == 0 or step == budget.planned():
            model.eval()
            with autocast(dev):
                vl = E.lm_loss(model, val, batch_size=32)
            model.train()
            curve.append((step, round(loss.item(), 4), round(vl, 4)))
            log("target", step=step, lr=round(lr, 6), loss=loss.item(), val=vl)
            if vl < best[0]:
                best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
    model.load_state_dict(best[2])
    info = {
        "steps": step,
        "planned_steps": budget.planned(),
        "best_step": best[1],
        "val_loss_bf16_autocast": best[0],
        "seconds": round(time.time() - budget.t_start, 1),
        "tokens_seen": step * cfg.batch * cfg.seq_len,
        "curve_step_train_val": curve,
    }
    return model, info


@torch.no_grad()
def gen_drafter_data(target, data, dev, cfg) -> torch.Tensor:
    g = torch.Generator(device=dev).manual_seed(cfg.seed + 1)
    out = []
    n_batches = max(1, cfg.gen_seqs // cfg.gen_batch)
    for i in range(n_batches):
        prompts = random_windows(data["train"], cfg.gen_batch, PROMPT_LEN, g)
        greedy = i < math.ceil(0.75 * n_batches)
        seqs = M.generate(target, prompts, cfg.gen_len, 0.0 if greedy else 1.0, 0.95, generator=g)
        out.append(seqs.to(torch.int32))
    return torch.cat(out)


def drafter_loss(target, drafter, seqs, n_anchors, weights, g):
    b, s = seqs.shape
    bs = drafter.block_size
    with torch.no_grad():
        _, feats = target(seqs, logits_to_keep=0)
    anchors = torch.randint(PROMPT_LEN, s - bs + 1, (b, n_anchors), generator=g, device=seqs.device)
    logits, labels = M.draft_at_anchors(drafter, feats, seqs, anchors)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    ce = ce.view(b, n_anchors, bs - 1)
    return (ce * weights).sum() / (b * n_anchors * weights.sum())


def train_drafter(target, seqs, val_seqs, dev, cfg) -> tuple[M.DFlashDraftModel, dict]:
    torch.manual_seed(cfg.seed + 2)
    drafter = M.DFlashDraftModel(DRAFTER_ARGS)
    init_weights(drafter, DRAFTER_ARGS.num_hidden_layers, cfg.seed + 2)
    drafter.to(dev)
    drafter.bind_target(target)
    opt = make_optimizer(drafter, cfg.drafter_lr, 0.01, dev)
    g = torch.Generator(device=dev).manual_seed(cfg.seed + 3)
    k = torch.arange(1, DRAFTER_ARGS.block_size, device=dev, dtype=torch.float32)
    weights = torch.exp(-(k - 1) / cfg.gamma)
    budget = StepBudget(cfg.drafter_steps, cfg.drafter_seconds)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    best = (-1.0, -1, None)
    curve, step = [], 0
    while step < budget.planned() and not budget.hard_stop():
        lr = lr_at(step, budget.planned(), cfg.drafter_lr, cfg.warmup)
        for grp in opt.param_groups:
            grp["lr"] = lr
        idx = torch.randint(0, len(seqs), (cfg.drafter_batch,), generator=g, device=dev)
        with autocast(dev):
            loss = drafter_loss(target, drafter, seqs[idx].long(), cfg.anchors, weights, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        budget.after_step(step, sync)
        step += 1
        if step % cfg.eval_every == 0 or step == budget.planned():
            drafter.eval()
            with autocast(dev):
                m = E.anchor_matches(target, drafter, val_seqs, PROMPT_LEN, chunk=64)
            drafter.train()
            acc = float(E.accepted_drafts(m).float().mean() + 1)
            curve.append((step, round(loss.item(), 4), round(acc, 4)))
            log("drafter", step=step, lr=round(lr, 6), loss=loss.item(), val_anchor_accept=acc)
            if acc > best[0]:
                best = (acc, step, {k: v.detach().clone() for k, v in drafter.state_dict().items()})
    drafter.load_state_dict(best[2])
    info = {
        "steps": step,
        "planned_steps": budget.planned(),
        "best_step": best[1],
        "val_per_anchor_accept": best[0],
        "seconds": round(time.time() - budget.t_start, 1),
        "curve_step_loss_valaccept": curve,
    }
    return drafter, info


def write_configs(out: Path, data_dir: Path) -> None:
    (out / "target").mkdir(parents=True, exist_ok=True)
    (out / "drafter").mkdir(parents=True, exist_ok=True)
    tcfg = M.qwen3_hf_config(TARGET_ARGS, EOS_ID, EOS_ID)
    dcfg = M.dflash_hf_config(DRAFTER_ARGS, EOS_ID, EOS_ID, MASK_TOKEN)
    (out / "target/config.json").write_text(json.dumps(tcfg, indent=2) + "\n")
    (out / "drafter/config.json").write_text(json.dumps(dcfg, indent=2) + "\n")
    gen = {"bos_token_id": EOS_ID, "eos_token_id": [EOS_ID, IM_END_ID], "pad_token_id": EOS_ID}
    (out / "target/generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(data_dir / "tokenizer" / name, out / "target" / name)
    for name in ["heldout_sample.npy", "heldout_prompts.json"]:
        shutil.copy(data_dir / name, out / name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train the target + DFlash drafter pair.")
    ap.add_argument("--data", default=".pair-data")
    ap.add_argument("--out", default=str(M.ASSETS_DIR))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target-lr", type=float, default=3e-3)
    ap.add_argument(
        "--target-steps", type=int, default=3715, help="0: calibrate to --target-seconds"
    )
    ap.add_argument("--target-seconds", type=float, default=150)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--gen-seqs", type=int, default=98304)
    ap.add_argument("--gen-batch", type=int, default=8192)
    ap.add_argument("--gen-len", type=int, default=GEN_LEN)
    ap.add_argument("--drafter-lr", type=float, default=2e-3)
    ap.add_argument(
        "--drafter-steps", type=int, default=3575, help="0: calibrate to --drafter-seconds"
    )
    ap.add_argument("--drafter-seconds", type=float, default=140)
    ap.add_argument("--drafter-batch", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--val-seqs", type=int, default=128)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of every stage")
    cfg = ap.parse_args(argv)
    if cfg.smoke:
        cfg.seq_len, cfg.batch, cfg.target_steps, cfg.warmup, cfg.eval_every = 128, 4, 6, 2, 3
        cfg.gen_seqs, cfg.gen_batch, cfg.gen_len = 8, 4, 40
        cfg.drafter_steps, cfg.drafter_batch, cfg.anchors, cfg.val_seqs = 4, 4, 2, 2
    dev = torch.device(cfg.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    data_dir, out = Path(cfg.data), Path(cfg.out)
    write_configs(out, data_dir)
    data = {
        k: torch.from_numpy(np.load(data_dir / f"{k}.npy").astype(np.int64)).to(dev)
        for k in ("train", "val", "heldout")
    }
    log("start", device=str(dev), cfg=vars(cfg), tokens={k: len(v) for k, v in data.items()})

    # 1. target
    target, tinfo = train_target(TARGET_ARGS, data, dev, cfg)
    M.save_model(target, out / "target/model.safetensors")
    log("target saved", **{k: v for k, v in tinfo.items() if k != "curve_step_train_val"})
    target32 = M.load_target(out / "target", dev, torch.float32)
    heldout = E.windows(data["heldout"].cpu(), cfg.seq_len + 1)
    sample = torch.from_numpy(np.load(out / "heldout_sample.npy").astype(np.int64))
    tinfo["heldout_loss"] = E.lm_loss(target32, heldout, batch_size=32)
    tinfo["heldout_tokens"] = int(heldout[:, 1:].numel())
    tinfo["heldout_sample_loss"] = E.lm_loss(target32, sample)
    tinfo["val_loss"] = E.lm_loss(target32, E.windows(data["val"].cpu(), cfg.seq_len + 1))
    del target32
    log("target eval", **{k: tinfo[k] for k in ("heldout_loss", "heldout_sample_loss", "val_loss")})

    # 2. drafter data, from the bf16 target exactly as shipped
    target = M.load_target(out / "target", dev, torch.bfloat16 if dev.type == "cuda" else None)
    target.feature_layer_ids = DRAFTER_ARGS.target_layer_ids
    target.requires_grad_(False)
    t_gen = time.time()
    seqs = gen_drafter_data(target, data, dev, cfg)
    gv = torch.Generator(device=dev).manual_seed(cfg.seed + 4)
    val_prompts = random_windows(data["val"], cfg.val_seqs, PROMPT_LEN, gv)
    val_seqs = M.generate(target, val_prompts, cfg.gen_len)
    gen_info = {
        "sequences": len(seqs),
        "tokens": int(seqs.numel()),
        "greedy_fraction": 0.75,
        "prompt_len": PROMPT_LEN,
        "gen_len": cfg.gen_len,
        "seconds": round(time.time() - t_gen, 1),
    }
    log("drafter data", **gen_info)

    # 3. drafter
    drafter, dinfo = train_drafter(target, seqs, val_seqs, dev, cfg)
    M.save_model(drafter, out / "drafter/model.safetensors")
    log("drafter saved", **{k: v for k, v in dinfo.items() if "curve" not in k})

    # 4. held-out drafter measurements (bf16 on the GPU, greedy continuations of held-out windows)
    drafter = M.load_drafter(out / "drafter", dev, target.model.embed_tokens.weight.dtype)
    drafter.bind_target(target)
    gh = torch.Generator(device=dev).manual_seed(cfg.seed + 5)
    n_tok = min(256, cfg.gen_len - DRAFTER_ARGS.block_size + 1)
    h_prompts = random_windows(data["heldout"], cfg.val_seqs * 2, PROMPT_LEN, gh)
    h_seqs = M.generate(target, h_prompts, n_tok + DRAFTER_ARGS.block_size - 1)
    dinfo["chain_T0_heldout_windows"] = E.chain_accept_on_sequences(
        target, drafter, h_seqs, PROMPT_LEN, n_tok
    )
    dinfo["chain_T0_heldout_windows"]["device"] = (
        f"{dev.type}, {target.model.embed_tokens.weight.dtype}"
    )
    dinfo["chain_T0_heldout_windows"]["num_sequences"] = len(h_seqs)
    log("drafter eval", **dinfo["chain_T0_heldout_windows"])

    def nparams(m):
        return sum(p.numel() for p in m.parameters())

    metrics = {
        "target_args": asdict(TARGET_ARGS),
        "drafter_args": asdict(DRAFTER_ARGS),
        "params": {"target": nparams(target), "drafter": nparams(drafter)},
        "data": json.loads((data_dir / "meta.json").read_text()),
        "cfg": vars(cfg),
        "target": tinfo,
        "drafter_data": gen_info,
        "drafter": dinfo,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "total_seconds": round(time.time() - T0, 1),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    log("done", total_seconds=metrics["total_seconds"])


if __name__ == "__main__":
    main()
