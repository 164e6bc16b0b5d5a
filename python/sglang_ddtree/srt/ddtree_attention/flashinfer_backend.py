"""FlashInfer's own custom-mask verify: its paged prefill applies SGLang's FULL_MASK. Its MLA
backend (``FlashInferMLAAttnBackend``) applies no per-branch tree mask, so MHA targets only."""

from __future__ import annotations

from sglang_ddtree.srt.ddtree_attention.verify_backend import VerifyAttentionBackend


class FlashInferVerify(VerifyAttentionBackend):
    name = attention_backend = "flashinfer"
    backend_class = "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend"
    page_sizes = (1,)
