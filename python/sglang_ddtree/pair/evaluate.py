"""Plain-PyTorch measurements of the pair: target held-out loss, drafter per-position top-1
agreement, and the DFlash chain accept length at temperature 0.

Chain accept length, exactly and cheaply: at T=0 speculative decoding is lossless, so the tokens it
commits are the target's greedy continuation. A round that starts at anchor ``a`` (the bonus
token ``x[a]``, context = target features of positions ``< a``) drafts ``x[a+1 .. a+bs-1]`` and
accepts the first ``m`` drafts that equal the greedy tokens, committing ``m + 1`` tokens (``m``
drafts plus the target's bonus). The target features of the committed prefix are the same as in a
teacher-forced pass over the greedy sequence, so we draft *every* anchor in one batched pass and
then walk ``a -> a + m(a) + 1`` from the first generated position. ``accept length`` = committed
tokens / rounds (bonus included, as SGLang and the DFlash paper count it).

``python -m sglang_ddtree.pair.evaluate`` measures the shipped pair on the shipped held-out prompts
(CPU, float32) and stores the result in ``assets/metrics.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import modeling as M


def windows(stream, length: int, count: int | None = None) -> torch.Tensor:
    """Non-overlapping windows [N, length] of a 1-D token stream; with ``count``, ``count``
    evenly spaced ones."""
    t = torch.as_tensor(np.asarray(stream, dtype=np.int64))
    n = (len(t) - 1) // length
    if count is not None and count < n:
        starts = torch.arange(count) * ((len(t) - length) // count)
    else:
        starts = torch.arange(n) * length
    return torch.stack([t[s : s + length] for s in starts.tolist()])


@torch.no_grad()
def lm_loss(target: M.Qwen3ForCausalLM, seqs: torch.Tensor, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats) over all positions 1..T-1 of seqs [N, T]."""
    dev = target.model.embed_tokens.weight.device
    total, count = 0.0, 0
    feature_ids, target.feature_layer_ids = target.feature_layer_ids, ()
    try:
        for i in range(0, len(seqs), batch_size):
            x = seqs[i : i + batch_size].to(dev)
            logits, _ = target(x[:, :-1])
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
            )
            total += float(loss)
            count += x[:, 1:].numel()
    finally:
        target.feature_layer_ids = feature_ids
    return total / count


@torch.no_grad()
def anchor_matches(
    target: M.Qwen3ForCausalLM,
    drafter: M.DFlashDraftModel,
    seqs: torch.Tensor,
    first_anchor: int,
    last_anchor: int | None = None,
    chunk: int = 64,
) -> torch.Tensor:
    """Teacher-forced drafts at every anchor ``first_anchor .. last_anchor`` (default
    ``S - block_size``) of seqs [B, S]. Returns bool [B, A, bs-1]: draft argmax == seqs token."""
    bs = drafter.block_size
    last = seqs.shape[1] - bs if last_anchor is None else last_anchor
    _, feats = target(seqs, logits_to_keep=0)
    out = []
    for a0 in range(first_anchor, last + 1, chunk):
        anchors = torch.arange(a0, min(a0 + chunk, last + 1), device=seqs.device)
        anchors = anchors[None].expand(seqs.shape[0], -1)
        logits, labels = M.draft_at_anchors(drafter, feats, seqs, anchors)
        out.append(logits.argmax(-1) == labels)
    return torch.cat(out, dim=1)


def accepted_drafts(matches: torch.Tensor) -> torch.Tensor:
    """[..., bs-1] bool -> [...] number of leading True (accepted drafts per round)."""
    return matches.int().cumprod(-1).sum(-1)


def chain_walk(m: list[int], num_tokens: int) -> list[int]:
    """m[i] = accepted drafts of a round anchored i tokens after the start. Returns the tokens
    committed per round until ``num_tokens`` are generated."""
    rounds, i = [], 0
    while i < num_tokens:
        step = min(m[i] + 1, num_tokens - i)
        rounds.append(step)
        i += step
    return rounds


@torch.no_grad()
def chain_accept_on_sequences(
    target, drafter, seqs: torch.Tensor, prompt_len: int, num_tokens: int
) -> dict:
    """Chain accept length for greedy sequences seqs [B, prompt_len + num_tokens + bs - 1]
    (the target's own greedy continuation of equal-length prompts)."""
    bs = drafter.block_size
    matches = anchor_matches(target, drafter, seqs, prompt_len, prompt_len + num_tokens - 1)
    m = accepted_drafts(matches).tolist()
    rounds = [r for row in m for r in chain_walk(row, num_tokens)]
    return {
        "accept_length": sum(rounds) / len(rounds),
        "rounds": len(rounds),
        "tokens": sum(rounds),
        "per_position_top1": [round(float(x), 4) for x in matches.float().mean((0, 1))],
        "per_anchor_accept": float(accepted_drafts(matches).float().mean() + 1),
        "block_size": bs,
    }


@torch.no_grad()
def chain_accept_on_prompts(
    target, drafter, prompts: list[list[int]], num_tokens: int = 256
) -> dict:
    """Greedy-generate ``num_tokens`` (stop tokens ignored) after each prompt, then measure the
    DFlash chain accept length at T=0 (see module doc). Batch 1 per prompt."""
    dev = target.model.embed_tokens.weight.device
    bs = drafter.block_size
    rounds_all, per_prompt, match_rows = [], [], []
    prefixes = [n for n in (32, 64, 128) if n < num_tokens]
    by_prefix = {n: [] for n in prefixes}
    for ids in prompts:
        x = torch.tensor([ids], device=dev)
        seq = M.generate(target, x, num_tokens + bs - 1)
        matches = anchor_matches(target, drafter, seq, len(ids), len(ids) + num_tokens - 1)
        m = accepted_drafts(matches)[0].tolist()
        rounds = chain_walk(m, num_tokens)
        rounds_all += rounds
        for n in prefixes:
            by_prefix[n] += chain_walk(m, n)
        per_prompt.append(round(sum(rounds) / len(rounds), 3))
        match_rows.append(matches[0])
    matches = torch.cat(match_rows)
    return {
        "accept_length": sum(rounds_all) / len(rounds_all),
        "rounds": len(rounds_all),
        "tokens": sum(rounds_all),
        # the same walks cut after the first n generated tokens of each prompt
        "accept_length_first_n_tokens": {
            str(n): round(sum(r) / len(r), 4) for n, r in by_prefix.items()
        },
        "per_prompt": per_prompt,
        "per_position_top1": [round(float(x), 4) for x in matches.float().mean(0)],
        "num_prompts": len(prompts),
        "num_tokens": num_tokens,
        "block_size": bs,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Measure the shipped pair on held-out prompts (CPU).")
    ap.add_argument("--assets", default=str(M.ASSETS_DIR))
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--num-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = Path(args.assets)
    target, drafter, tok = M.load_pair(root)
    prompts = json.loads((root / "heldout_prompts.json").read_text())[: args.num_prompts]
    t0 = time.time()
    res = chain_accept_on_prompts(
        target, drafter, [tok.encode(p["prompt"]) for p in prompts], args.num_tokens
    )
    res["seconds"] = round(time.time() - t0, 1)
    res["device"] = "cpu, float32 (bf16 weights upcast)"
    sample = torch.from_numpy(np.load(root / "heldout_sample.npy").astype(np.int64))
    res["heldout_sample_loss_cpu"] = lm_loss(target, sample)
    print(json.dumps(res, indent=1))
    if not args.no_write:
        path = root / "metrics.json"
        metrics = json.loads(path.read_text())
        metrics["chain_T0_heldout_prompts_cpu"] = res
        path.write_text(json.dumps(metrics, indent=1) + "\n")


if __name__ == "__main__":
    main()
