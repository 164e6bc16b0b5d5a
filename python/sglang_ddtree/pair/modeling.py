"""Plain-PyTorch Qwen3 target and DFlash drafter of the shipped pair (small and readable).

Both modules use the Hugging Face / SGLang checkpoint names as their ``state_dict`` keys, so one
set of safetensors files loads here (CPU demo, training) and in SGLang 0.5.17
(``Qwen3ForCausalLM`` target, ``DFlashDraftModel`` drafter).

Notation: B batch, T new tokens, S cached + new tokens, H hidden size, V vocabulary, K number of
target feature layers (``len(target_layer_ids)``), D head dim.

Target (:class:`Qwen3ForCausalLM`): pre-norm decoder layers with per-head q/k RMSNorm (Qwen3), RoPE
(neox/rotate-half style), GQA, SwiGLU MLP, tied embeddings. Its forward also returns the *context
features* the drafter needs: the residual stream after each layer in ``feature_layer_ids``
(HF ``hidden_states[i + 1]``, SGLang's aux hidden state captured before layer ``i + 1``),
concatenated to ``[B, T, K*H]``.

Drafter (:class:`DFlashDraftModel`, DFlash "KV injection"): ``ctx = hidden_norm(fc(features))``;
each layer's attention takes Q from the block tokens only and K/V from ``concat[ctx, block]``
(the context K/V use the layer's own k/v projections, k_norm and RoPE, without the layer's input
norm, exactly as SGLang's ``DFlashDraftModel``); no causal mask; then a final ``norm``. It has no
embedding and no LM head of its own: it borrows the target's (:meth:`DFlashDraftModel.bind_target`).
The block is ``[last committed (bonus) token, MASK x (block_size - 1)]`` and positions
``1..block_size-1`` give the draft distributions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ASSETS_DIR = Path(__file__).parent / "assets"
TARGET_DIR = ASSETS_DIR / "target"
DRAFTER_DIR = ASSETS_DIR / "drafter"


@dataclass
class ModelArgs:
    """Architecture hyper-parameters (the HF config fields this code reads)."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 5
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    # DFlash drafter only (``dflash_config`` in the drafter's config.json)
    block_size: int = 16
    target_layer_ids: tuple[int, ...] = ()
    mask_token_id: int = 3
    num_target_layers: int = 0

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelArgs:
        kw = {f.name: cfg[f.name] for f in fields(cls) if f.name in cfg}
        rope = cfg.get("rope_parameters") or {}
        if "rope_theta" in rope:
            kw["rope_theta"] = rope["rope_theta"]
        for k, v in (cfg.get("dflash_config") or {}).items():
            if k in ("block_size", "target_layer_ids", "mask_token_id", "num_target_layers"):
                kw[k] = v
        if "target_layer_ids" in kw:
            kw["target_layer_ids"] = tuple(int(i) for i in kw["target_layer_ids"])
        return cls(**kw)

    @classmethod
    def load(cls, model_dir: str | Path) -> ModelArgs:
        return cls.from_hf(json.loads((Path(model_dir) / "config.json").read_text()))


def _common_hf_config(a: ModelArgs, eos_token_id: int, pad_token_id: int) -> dict:
    return {
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": a.intermediate_size,
        "max_position_embeddings": a.max_position_embeddings,
        "max_window_layers": a.num_hidden_layers,
        "num_attention_heads": a.num_attention_heads,
        "num_hidden_layers": a.num_hidden_layers,
        "num_key_value_heads": a.num_key_value_heads,
        "rms_norm_eps": a.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": a.rope_theta},
        "rope_theta": a.rope_theta,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": a.tie_word_embeddings,
        "dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": a.vocab_size,
    }


def qwen3_hf_config(a: ModelArgs, eos_token_id: int, pad_token_id: int) -> dict:
    """config.json of the target, loadable as ``Qwen3ForCausalLM`` (SGLang, transformers)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        **_common_hf_config(a, eos_token_id, pad_token_id),
    }


def dflash_hf_config(a: ModelArgs, eos_token_id: int, pad_token_id: int, mask_token: str) -> dict:
    """config.json of the drafter, loadable by SGLang 0.5.17 as ``DFlashDraftModel``."""
    cfg = {
        "architectures": ["DFlashDraftModel"],
        **_common_hf_config(a, eos_token_id, pad_token_id),
    }
    cfg["block_size"] = a.block_size
    cfg["num_target_layers"] = a.num_target_layers
    cfg["dflash_config"] = {
        "block_size": a.block_size,
        "target_layer_ids": list(a.target_layer_ids),
        "mask_token": mask_token,
        "mask_token_id": a.mask_token_id,
        "num_target_layers": a.num_target_layers,
    }
    return cfg


# --------------------------------------------------------------------------------------------
# building blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] (int) -> cos, sin [B, 1, T, D] (rotate-half layout, as HF Qwen3)."""
    inv = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv = 1.0 / (theta**inv)
    f = positions.float()[..., None] * inv
    emb = torch.cat([f, f], dim=-1)
    return emb.cos()[:, None].to(dtype), emb.sin()[:, None].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, n, T, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = (
            a.num_attention_heads,
            a.num_key_value_heads,
            a.head_dim,
        )
        h, d = a.hidden_size, a.head_dim
        self.q_proj = nn.Linear(h, self.n_head * d, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_head * d, h, bias=False)
        self.q_norm = RMSNorm(d, a.rms_norm_eps)
        self.k_norm = RMSNorm(d, a.rms_norm_eps)

    def project_q(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """h [B, T, H] -> q [B, n_head, T, D] (q_norm, then RoPE)."""
        b, t, _ = h.shape
        q = self.q_norm(self.q_proj(h).view(b, t, self.n_head, self.head_dim)).transpose(1, 2)
        return apply_rope(q, cos, sin)

    def project_kv(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h [B, T, H] -> k, v [B, n_kv, T, D] (k: k_norm, then RoPE)."""
        b, t, _ = h.shape
        k = self.k_norm(self.k_proj(h).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
    ) -> torch.Tensor:
        """q [B, n_head, T, D], k/v [B, n_kv, S, D], mask bool [B|1, 1, T, S] (True = visible)."""
        rep = self.n_head // self.n_kv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        b, _, t, _ = q.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = Attention(a)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = MLP(a)


def _positions(positions, b: int, t: int, start: int, device) -> torch.Tensor:
    if positions is None:
        positions = torch.arange(start, start + t, device=device)
    positions = torch.as_tensor(positions, device=device)
    if positions.dim() == 1:
        positions = positions[None].expand(b, t)
    return positions


# --------------------------------------------------------------------------------------------
# target


class KVCache:
    """Static target K/V: ``k``, ``v`` of shape [num_layers, B, n_kv, max_len, D].

    ``length`` is the number of committed positions (shared by all batch rows). A forward writes
    the T new tokens' K/V at slots ``[length, length + T)``; with ``commit=True`` (default)
    ``length`` then advances by T, otherwise the slots stay *pending* until :meth:`commit`.
    """

    def __init__(self, a: ModelArgs, batch_size: int, max_len: int, device=None, dtype=None):
        shape = (a.num_hidden_layers, batch_size, a.num_key_value_heads, max_len, a.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def commit(self, keep: int | torch.Tensor) -> None:
        """Commit pending slots. ``keep=n``: the first n (chain verify). ``keep`` = sorted 1-D
        tensor of pending offsets (tree verify): those slots are compacted to the front."""
        if isinstance(keep, int):
            self.length += keep
            return
        keep = torch.as_tensor(keep, device=self.k.device, dtype=torch.long)
        n = int(keep.numel())
        src = self.length + keep
        dst = torch.arange(self.length, self.length + n, device=self.k.device)
        self.k[:, :, :, dst] = self.k[:, :, :, src]
        self.v[:, :, :, dst] = self.v[:, :, :, src]
        self.length += n

    def crop(self, length: int) -> None:
        self.length = length


class Qwen3Model(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(a) for _ in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)


class Qwen3ForCausalLM(nn.Module):
    """Qwen3 causal LM (HF key names). ``feature_layer_ids`` selects the drafter's context
    features (set by :func:`load_pair` from the drafter's ``target_layer_ids``)."""

    def __init__(self, a: ModelArgs, feature_layer_ids: tuple[int, ...] = ()):
        super().__init__()
        self.args = a
        self.model = Qwen3Model(a)
        self.lm_head = nn.Linear(a.hidden_size, a.vocab_size, bias=False)
        if a.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.feature_layer_ids = tuple(feature_layer_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        commit: bool = True,
        logits_to_keep: int | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Run T new tokens.

        Args:
            input_ids: [B, T].
            positions: [B, T] or [T] RoPE positions; default ``past + arange(T)`` (``past`` =
                ``cache.length`` or 0). Tree verification passes ``past + depth``.
            cache: optional :class:`KVCache`; the new tokens attend to its ``length`` committed
                slots plus themselves.
            attn_mask: optional bool [B|1, T, T] among the new tokens (True = visible), e.g. a
                tree's ancestor mask; default causal. Committed slots are always visible.
            commit: advance ``cache.length`` by T (else the K/V stay pending, see KVCache).
            logits_to_keep: None = logits for all T positions, 0 = none, k = the last k.

        Returns:
            logits [B, T', V] float32 (or None), and features [B, T, K*H] (or None when
            ``feature_layer_ids`` is empty).
        """
        b, t = input_ids.shape
        past = cache.length if cache is not None else 0
        pos = _positions(positions, b, t, past, input_ids.device)
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(pos, self.args.head_dim, self.args.rope_theta, x.dtype)

        causal = False
        if attn_mask is None and past == 0:
            mask, causal = None, t > 1
        elif attn_mask is None and t == 1:
            mask = None
        else:
            new = attn_mask
            if new is None:
                new = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            new = new.to(device=x.device, dtype=torch.bool)
            if new.dim() == 2:
                new = new[None]
            prefix = torch.ones(new.shape[0], t, past, dtype=torch.bool, device=x.device)
            mask = torch.cat([prefix, new], dim=-1)[:, None]

        feats = []
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.project_q(h, cos, sin)
            k, v = attn.project_kv(h, cos, sin)
            if cache is not None:
                cache.k[i, :, :, past : past + t] = k
                cache.v[i, :, :, past : past + t] = v
                k, v = cache.k[i, :, :, : past + t], cache.v[i, :, :, : past + t]
            x = x + attn.attend(q, k, v, mask, causal)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in self.feature_layer_ids:
                feats.append(x)
        if cache is not None and commit:
            cache.length += t

        features = None
        if self.feature_layer_ids:
            by_id = dict(zip(sorted(self.feature_layer_ids), feats))
            features = torch.cat([by_id[i] for i in self.feature_layer_ids], dim=-1)
        logits = None
        if logits_to_keep != 0:
            h = x if logits_to_keep is None else x[:, -logits_to_keep:]
            logits = self.lm_head(self.model.norm(h)).float()
        return logits, features


# --------------------------------------------------------------------------------------------
# drafter


class DraftKVCache:
    """Drafter context K/V: ``k``, ``v`` of shape [num_layers, B, n_kv, max_len, D]; ``length``
    committed context tokens. Context tokens are always committed ones, so it only grows (or is
    cropped)."""

    def __init__(self, a: ModelArgs, batch_size: int, max_len: int, device=None, dtype=None):
        shape = (a.num_hidden_layers, batch_size, a.num_key_value_heads, max_len, a.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    def crop(self, length: int) -> None:
        self.length = length


class DFlashDraftModel(nn.Module):
    """DFlash block drafter (SGLang ``DFlashDraftModel`` key names: ``layers.*``, ``norm``,
    ``fc``, ``hidden_norm``). Call :meth:`bind_target` before :meth:`forward`."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        assert a.target_layer_ids, "DFlash drafter needs target_layer_ids"
        self.args = a
        self.layers = nn.ModuleList(DecoderLayer(a) for _ in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.fc = nn.Linear(len(a.target_layer_ids) * a.hidden_size, a.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self._borrowed: tuple = ()  # (target,), kept out of state_dict / parameters()

    @property
    def block_size(self) -> int:
        return self.args.block_size

    @property
    def mask_token_id(self) -> int:
        return self.args.mask_token_id

    def bind_target(self, target: Qwen3ForCausalLM) -> None:
        """Borrow the target's ``embed_tokens`` and ``lm_head`` (not registered as submodules)."""
        self._borrowed = (target,)

    @property
    def target(self) -> Qwen3ForCausalLM:
        if not self._borrowed:
            raise RuntimeError("call drafter.bind_target(target) first")
        return self._borrowed[0]

    def run_layers(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        q_pos: torch.Tensor,
        ctx_pos: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: DraftKVCache | None = None,
    ) -> torch.Tensor:
        """Core: x [B, M, H] block embeddings, ctx [B, C, H] projected context
        (``hidden_norm(fc(features))``), q_pos [B, M], ctx_pos [B, C], mask bool
        [B|1, 1, M, C' + M] (C' = all visible context incl. the cache; None = all visible).
        Returns the final-normed hidden states [B, M, H]."""
        a = self.args
        cos_q, sin_q = rope_cos_sin(q_pos, a.head_dim, a.rope_theta, x.dtype)
        cos_c, sin_c = rope_cos_sin(ctx_pos, a.head_dim, a.rope_theta, x.dtype)
        past, c = (cache.length if cache is not None else 0), ctx.shape[1]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            kc, vc = attn.project_kv(ctx, cos_c, sin_c)  # no input_layernorm on the context
            if cache is not None:
                cache.k[i, :, :, past : past + c] = kc
                cache.v[i, :, :, past : past + c] = vc
                kc, vc = cache.k[i, :, :, : past + c], cache.v[i, :, :, : past + c]
            h = layer.input_layernorm(x)
            q = attn.project_q(h, cos_q, sin_q)
            kn, vn = attn.project_kv(h, cos_q, sin_q)
            k, v = torch.cat([kc, kn], dim=2), torch.cat([vc, vn], dim=2)
            x = x + attn.attend(q, k, v, mask, causal=False)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if cache is not None:
            cache.length += c
        return self.norm(x)

    def forward(
        self,
        context_features: torch.Tensor,
        block_token_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        context_positions: torch.Tensor | None = None,
        cache: DraftKVCache | None = None,
    ) -> torch.Tensor:
        """One block-diffusion draft step.

        Args:
            context_features: [B, C, K*H] target features (:meth:`Qwen3ForCausalLM.forward`) of
                the committed tokens before the block; with ``cache``, only those not yet in it
                (C may be 0).
            block_token_ids: [B, S] with S <= block_size, normally
                ``[last committed (bonus) token, MASK * (S - 1)]``.
            positions: [B, S] or [S] positions of the block; default right after the context
                (``C + arange(S)``, with a cache ``cache.length + C + arange(S)``).
            context_positions: [B, C] or [C]; default the C positions before the block.
            cache: optional :class:`DraftKVCache`; the new context K/V are appended to it.

        Returns:
            logits [B, S - 1, V] float32: the draft distributions of block positions 1..S-1.
        """
        b, s = block_token_ids.shape
        c = context_features.shape[1]
        dev = block_token_ids.device
        past = cache.length if cache is not None else 0
        target = self.target
        x = target.model.embed_tokens(block_token_ids)
        ctx = self.hidden_norm(self.fc(context_features.to(x.dtype)))
        ctx_pos = _positions(context_positions, b, c, past, dev)
        pos = _positions(positions, b, s, past + c, dev)
        h = self.run_layers(x, ctx, pos, ctx_pos, None, cache)
        return target.lm_head(h[:, 1:]).float()


# --------------------------------------------------------------------------------------------
# anchors (training and teacher-forced evaluation)


def anchor_blocks(
    ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Many draft blocks per sequence in one drafter pass.

    ids [B, S] (a token sequence whose target features are the context), anchors [B, n] with
    ``anchor + block_size <= S``. Block j of row b is ``[ids[b, a], MASK...]`` at positions
    ``a .. a + block_size - 1`` (a = anchors[b, j]); it sees context positions ``< a`` and its own
    block only.

    Returns block_ids [B, n*bs], block_pos [B, n*bs], labels [B, n, bs-1] (= ids[a+1 .. a+bs-1]),
    mask bool [B, 1, n*bs, S + n*bs].
    """
    b, s = ids.shape
    n = anchors.shape[1]
    dev = ids.device
    offs = torch.arange(block_size, device=dev)
    pos = anchors[..., None] + offs  # [B, n, bs]
    block_ids = torch.full_like(pos, mask_token_id)
    block_ids[..., 0] = ids.gather(1, anchors)
    labels = ids.gather(1, pos[..., 1:].reshape(b, -1)).view(b, n, block_size - 1)
    ctx_vis = torch.arange(s, device=dev)[None, None] < anchors[..., None]  # [B, n, S]
    ctx_vis = ctx_vis[:, :, None].expand(b, n, block_size, s).reshape(b, n * block_size, s)
    same = torch.eye(n, dtype=torch.bool, device=dev)[:, None, :, None]
    same = same.expand(n, block_size, n, block_size).reshape(n * block_size, n * block_size)
    mask = torch.cat([ctx_vis, same[None].expand(b, -1, -1)], dim=-1)[:, None]
    return block_ids.view(b, -1), pos.view(b, -1), labels, mask


def draft_at_anchors(
    drafter: DFlashDraftModel, features: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced drafts: features [B, S, K*H] of ids [B, S]; anchors [B, n].
    Returns logits [B, n, bs-1, V] (float32) and labels [B, n, bs-1]."""
    bs = drafter.block_size
    block_ids, block_pos, labels, mask = anchor_blocks(ids, anchors, bs, drafter.mask_token_id)
    target = drafter.target
    x = target.model.embed_tokens(block_ids)
    ctx = drafter.hidden_norm(drafter.fc(features.to(x.dtype)))
    ctx_pos = torch.arange(ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
    h = drafter.run_layers(x, ctx, block_pos, ctx_pos, mask)
    b, n = anchors.shape
    h = h.view(b, n, bs, -1)[:, :, 1:]
    return target.lm_head(h).float(), labels


# --------------------------------------------------------------------------------------------
# generation, loading, saving


@torch.no_grad()
def generate(
    target: Qwen3ForCausalLM,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Plain autoregressive decoding of a batch of equal-length prompts, for a fixed number of
    tokens (no stop tokens). input_ids [B, P] -> [B, P + max_new_tokens]."""
    b, p = input_ids.shape
    dtype = target.model.embed_tokens.weight.dtype
    cache = KVCache(target.args, b, p + max_new_tokens, input_ids.device, dtype)
    out = [input_ids]
    logits, _ = target(input_ids, cache=cache, logits_to_keep=1)
    for step in range(max_new_tokens):
        nxt = sample(logits[:, -1], temperature, top_p, generator)
        out.append(nxt[:, None])
        if step + 1 < max_new_tokens:
            logits, _ = target(nxt[:, None], cache=cache, logits_to_keep=1)
    return torch.cat(out, dim=1)


def sample(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits [B, V] -> token ids [B]; temperature 0 = argmax."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        drop = sp.cumsum(-1) - sp > top_p
        sp = sp.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, si, sp)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def save_model(model: nn.Module, path: str | Path, dtype=torch.bfloat16) -> None:
    """safetensors in HF layout (a tied ``lm_head.weight`` is left out, as HF does)."""
    from safetensors.torch import save_file

    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    if getattr(getattr(model, "args", None), "tie_word_embeddings", False) and hasattr(
        model, "lm_head"
    ):
        sd.pop("lm_head.weight", None)
    save_file(sd, str(path), metadata={"format": "pt"})


def _load_state(model: nn.Module, path: Path) -> None:
    from safetensors.torch import load_file

    sd = load_file(str(path))
    if isinstance(model, Qwen3ForCausalLM) and model.args.tie_word_embeddings:
        sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
    model.load_state_dict(sd, strict=True)


def load_target(model_dir=TARGET_DIR, device="cpu", dtype=torch.float32) -> Qwen3ForCausalLM:
    model_dir = Path(model_dir)
    target = Qwen3ForCausalLM(ModelArgs.load(model_dir))
    _load_state(target, model_dir / "model.safetensors")
    return target.to(device=device, dtype=dtype).eval()


def load_drafter(model_dir=DRAFTER_DIR, device="cpu", dtype=torch.float32) -> DFlashDraftModel:
    model_dir = Path(model_dir)
    drafter = DFlashDraftModel(ModelArgs.load(model_dir))
    _load_state(drafter, model_dir / "model.safetensors")
    return drafter.to(device=device, dtype=dtype).eval()


def load_pair(path: str | Path | None = None, device="cpu", dtype=torch.float32):
    """Load the shipped pair -> (target, drafter, tokenizer).

    ``path`` is the assets folder (default: the one inside this package) holding ``target/``
    (config, weights, tokenizer) and ``drafter/``. The target's ``feature_layer_ids`` are set to
    the drafter's ``target_layer_ids`` and the drafter is bound to the target. The tokenizer is a
    :class:`~sglang_ddtree.pair.tokenizer.PairTokenizer`. Weights are stored in bf16 and cast to
    ``dtype`` (float32 by default, for CPUs).
    """
    from .tokenizer import PairTokenizer

    root = Path(path) if path is not None else ASSETS_DIR
    target = load_target(root / "target", device, dtype)
    drafter = load_drafter(root / "drafter", device, dtype)
    target.feature_layer_ids = drafter.args.target_layer_ids
    drafter.bind_target(target)
    return target, drafter, PairTokenizer(root / "target")
