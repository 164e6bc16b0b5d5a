"""Triton's own custom-mask verify: SGLang's extend kernel, every node reading its whole prefix
under the FULL_MASK. The reference DDTREE's split (``triton_backend``) is tested against, and
what that split leaves the calls it does not take to; a server verifies on it alone with
``--speculative-ddtree-verify-attention triton_extend``."""

from __future__ import annotations

from sglang_ddtree.srt.ddtree_attention.verify_backend import VerifyAttentionBackend


class TritonExtendVerify(VerifyAttentionBackend):
    name = "triton_extend"
    attention_backend = "triton"
    backend_class = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
    serves_mla = True
