"""Greedy and sampled rows of one batch keep their own accept results."""

import torch

from sglang_ddtree.core.accept import AcceptResult
from sglang_ddtree.core.batch_accept import greedy_rows, merge_accept


def _result(bs, n, s, fill):
    return AcceptResult(
        predict=torch.full((bs * n,), fill, dtype=torch.int32),
        accept_index=torch.full((bs, s), fill, dtype=torch.int32),
        accept_length=torch.full((bs,), fill, dtype=torch.int32),
    )


def test_merge_rowwise():
    bs, n, s = 3, 5, 4
    top_ks = torch.tensor([1, 1 << 30, 1], dtype=torch.int32)
    rows = greedy_rows(top_ks)
    assert rows.tolist() == [True, False, True]
    m = merge_accept(_result(bs, n, s, 7), _result(bs, n, s, 9), rows, n)
    assert m.predict.view(bs, n)[:, 0].tolist() == [7, 9, 7]
    assert (m.predict.view(bs, n) == m.predict.view(bs, n)[:, :1]).all()
    assert m.accept_index[:, 0].tolist() == [7, 9, 7]
    assert m.accept_length.tolist() == [7, 9, 7]
    assert m.predict.dtype == torch.int32 and m.accept_index.shape == (bs, s)
