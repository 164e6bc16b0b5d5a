"""The tree verify of an MHA target on a prefix part laid out as FlashInfer's batch prefill
returns it (W query rows a request: a token-major output and a base-2 log-sum-exp), then the
ancestor block and the merge in the tree kernel (``core.tree_attention_with_prefix`` with
``prefix_lse_log2``, over `token_major_prefix_part`'s views).

CPU: the views; the merge of a token-major, base-2 prefix part under Triton's interpreter, the
prefix part from torch, against the masked reference; calibrated (the same part read as a
natural log fails).
"""

from __future__ import annotations

import torch

from sglang_ddtree.core.tree_attention import token_major_prefix_part


def test_token_major_prefix_part_is_a_view():
    """Row ``b * W + i`` of a token-major part is node i of request b: the output as
    [bs, W, Hq, Dv], the lse as [bs, Hq, W], on the same memory."""
    bs, w, hq, dv = 2, 3, 4, 5
    out = torch.randn(bs * w, hq, dv)
    lse = torch.randn(bs * w, hq)
    got_out, got_lse = token_major_prefix_part(out, lse, w)
    assert got_out.shape == (bs, w, hq, dv) and got_lse.shape == (bs, hq, w)
    assert got_out.data_ptr() == out.data_ptr() and got_lse.data_ptr() == lse.data_ptr()
    for b in range(bs):
        for i in range(w):
            assert torch.equal(got_out[b, i], out[b * w + i])
            assert torch.equal(got_lse[b, :, i], lse[b * w + i])


_INTERPRETED_CHECK = """
import math
import torch
from test_tree_attention import random_case
from test_flashmla_verify import prefix_part_reference
from sglang_ddtree.core.tree_attention import (
    token_major_prefix_part, tree_attention_reference, tree_attention_with_prefix,
)

cases = [
    dict(bs=3, w=5, hq=4, hkv=2, d=32, dv=32, prefix=[1, 16, 37], seed=1),  # grouped heads
    dict(bs=2, w=17, hq=4, hkv=1, d=16, dv=16, prefix=[15, 2], seed=2),  # W > 16: two row tiles
]
for case in cases:
    args, scale = random_case(**case)
    q, k, v, indptr, indices, loc, mask = args
    w, hq = mask.shape[1], q.shape[1]
    out, lse = prefix_part_reference(q, k, v, indptr, indices, w, scale)
    # As FlashInfer returns it: token-major rows (b * W + i), the log-sum-exp in base 2.
    out_rows = out.reshape(-1, hq, out.shape[-1])
    lse2_rows = (lse / math.log(2)).transpose(1, 2).reshape(-1, hq).contiguous()
    prefix_out, prefix_lse = token_major_prefix_part(out_rows, lse2_rows, w)
    want = tree_attention_reference(*args, scale)
    got = tree_attention_with_prefix(q, k, v, loc, mask, scale, prefix_out, prefix_lse,
                                     prefix_lse_log2=True)
    err = (got - want).abs().max().item()
    assert err < 1e-4, (case, err)
    # Calibration: the base-2 lse read as a natural log is far from the reference.
    bad = tree_attention_with_prefix(q, k, v, loc, mask, scale, prefix_out, prefix_lse)
    assert (bad - want).abs().max().item() > 1e-2, case
print("interpreted base-2 prefix merge OK")
"""


def test_base2_token_major_prefix_merge_interpreted(run_interpreted):
    run_interpreted(_INTERPRETED_CHECK, "interpreted base-2 prefix merge OK")
