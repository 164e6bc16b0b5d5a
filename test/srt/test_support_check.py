"""The top-k support check (`sglang_ddtree.testing.support`): its judge on the CPU, and the
check itself on a CUDA machine (``gpu``): DDTREE on the Kimi-shaped tiny pair with a TP-8
rank's 8 heads and dense layers (MLA attention, no MoE router whose bfloat16 near-ties would
move the top-k set between two forwards), bfloat16, on flashmla at page 64 (the deployment's
backend) and on triton, never emits a token outside a request's top-k set."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from sglang_ddtree.testing import support

# One prompt's top logprobs after prefixes () and (7,): token, logprob, best first.
TOPS = {
    (0, ()): [(7, -0.5), (3, -1.0), (9, -1.1), (4, -3.0), (5, -4.0)],
    (0, (7,)): [(2, -0.2), (8, -2.0), (6, -2.05), (1, -5.0)],
}


def test_judge_sorts_inside_edge_and_violation():
    counts = Counter({
        (0, (), 2, 7): 10,  # rank 0 < k: inside
        (0, (), 2, 9): 4,  # rank 2, 0.1 nats under the 2nd: edge at tolerance 0.25
        (0, (), 2, 4): 3,  # rank 3, 2.0 under: violation
        (0, (7,), 2, 6): 5,  # rank 2, 0.05 under: edge
        (0, (7,), 2, 11): 1,  # not among the read ranks: violation
    })  # fmt: skip
    got = support.judge(counts, TOPS, tolerance=0.25)
    assert got["per_k"] == {"2": {"inside": 10, "edge": 9, "violation": 4}}
    assert got["violations"] == 2
    assert [(w["token"], w["count"], w["rank"]) for w in got["worst"]] == [(4, 3, 3), (11, 1, None)]
    # A tighter tolerance turns the edges into violations; none is ever dropped.
    tight = support.judge(counts, TOPS, tolerance=0.01)
    assert tight["per_k"]["2"] == {"inside": 10, "edge": 0, "violation": 13}


def test_events_judge_each_token_at_its_prefix_and_k():
    idx = [0, 0, 0, 0]
    labels = [2, 0, -1, 5]
    completions = [[7, 6], [3, 3], [7, 2], [9]]
    got = support.events(idx, labels, completions)
    # top-p rows (label 0) and greedy rows (label -1) are not judged unless mapped
    assert got == Counter({(0, (), 2, 7): 1, (0, (7,), 2, 6): 1, (0, (), 5, 9): 1})
    mapped = support.events(idx, labels, completions, as_k={0: 2})
    assert mapped[(0, (), 2, 3)] == 1 and mapped[(0, (3,), 2, 3)] == 1


def test_requests_mix_every_label_per_prompt():
    idx, params, labels = support.build_requests([[1, 2], [3]], [2, 5], samples=3)
    per_prompt = len(idx) // 2
    assert per_prompt == 3 * 3 + support.GREEDY_PER_PROMPT
    assert Counter(labels) == Counter({2: 6, 5: 6, 0: 6, -1: 2 * support.GREEDY_PER_PROMPT})
    for sp, label in zip(params, labels):
        assert sp["max_new_tokens"] == support.NEW_TOKENS and sp["ignore_eos"]
        if label > 0:
            assert sp["top_k"] == label and sp["top_p"] == 1.0
        elif label == 0:
            assert sp["top_k"] == -1 and sp["top_p"] == support.TOP_P_ONLY
        else:
            assert sp["temperature"] == 0.0


def test_bad_top_k_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        support.main(["--top-ks", "1,5"])
    assert e.value.code == 2
    assert "at least 2" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flashmla", "triton"])
def test_ddtree_never_leaves_the_top_k_set(tmp_path, run_gpu_check, backend):
    """16 prompts x (top_k 2, top_k 5, top-p 0.95 alone) x 256 completions of 6 tokens, with
    greedy rows in the same batches, up to 128 running (padded batch sizes included): no token
    outside its prefix's top k (beyond the bfloat16 rounding tolerance), where the
    non-speculative server's own samples show none and its top-p samples judged at k = 2 do
    (the judge catches a known error)."""
    out = os.environ.get("DDTREE_SUPPORT_OUT") or str(tmp_path)
    args = ["--arch", "mla8-dense", "--dtype", "bfloat16", "--attention-backend", backend]
    if backend == "flashmla":
        args += ["--draft-attention-backend", "triton"]
    summary = run_gpu_check(out, "sglang_ddtree.testing.support", args, "support_summary.json", 900)
    assert summary["calibrated"], summary["calibration"]
    assert summary["null_clean"], summary["null"]
    assert summary["spec"]["violations"] == 0, summary["spec"]["worst"][:5]
