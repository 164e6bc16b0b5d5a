"""The top-k support check (`sglang_ddtree.testing.support`): its judge on the CPU, and the
check itself on a CUDA machine (``gpu``): DDTREE on the Kimi-shaped tiny pair with a TP-8
rank's 8 heads and dense layers (MLA attention, no MoE router whose bfloat16 near-ties would
move the top-k set between two forwards), bfloat16, on flashmla at page 64 (the deployment's
backend) and on triton, never emits a token outside a request's top-k set."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import torch

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


class _ToyEngine:
    """A stand-in ``sgl.Engine`` over a toy model (logits a fixed function of the last two
    tokens, vocab 40): samples by the law of `core.sampling` (``ignore_top_k``: a wrong law
    that drops the top-k filter), and answers ``top_logprobs_num`` requests with its raw top
    logprobs after the prompt, as the server's first output token."""

    vocab = 40

    def __init__(self, seed: int, ignore_top_k: bool = False):
        self.rng = torch.Generator().manual_seed(seed)
        self.ignore_top_k = ignore_top_k

    def logits(self, ids):
        g = torch.Generator().manual_seed(hash(tuple(ids[-2:])) % (2**31))
        return torch.randn(self.vocab, generator=g) * 2.0

    def generate(self, input_ids, sampling_params, return_logprob=False, top_logprobs_num=0):
        from sglang_ddtree.core.sampling import target_probs

        out = []
        for ids, sp in zip(input_ids, sampling_params):
            ids = list(ids)
            if return_logprob:
                lp = torch.log_softmax(self.logits(ids), -1)
                v, t = lp.topk(top_logprobs_num)
                rows = [(float(a), int(b), None) for a, b in zip(v, t)]
                out.append(
                    {"output_ids": [int(t[0])], "meta_info": {"output_top_logprobs": [rows]}}
                )
                continue
            new = []
            for _ in range(sp["max_new_tokens"]):
                logits = self.logits(ids + new)
                if sp["temperature"] == 0.0:
                    new.append(int(logits.argmax()))
                    continue
                k = -1 if self.ignore_top_k else sp["top_k"]
                probs = target_probs(
                    logits[None, None], torch.tensor([sp["temperature"]]),
                    torch.tensor([k if k > 0 else 0]), torch.tensor([sp["top_p"]]),
                )[0, 0]  # fmt: skip
                new.append(int(torch.multinomial(probs, 1, generator=self.rng)))
            out.append({"output_ids": new, "meta_info": {}})
        return out


def _run_support(monkeypatch, tmp_path, ignore_top_k: bool) -> dict:
    from contextlib import contextmanager
    from types import SimpleNamespace

    from sglang_ddtree.testing import e2e, tiny_models

    @contextmanager
    def engine(**kwargs):
        spec = kwargs.get("speculative_algorithm") is not None
        yield _ToyEngine(seed=1 if spec else 2, ignore_top_k=spec and ignore_top_k)

    monkeypatch.setattr(e2e, "engine", engine)
    monkeypatch.setattr(e2e, "ENGINE_EXTRA", {})
    monkeypatch.setattr(
        tiny_models, "make_pair", lambda arch, d: ("t", "d", SimpleNamespace(vocab_size=40))
    )
    code = support.main(["--out", str(tmp_path), "--prompts", "3", "--samples", "64"])
    with open(tmp_path / "support_summary.json") as f:
        summary = json.load(f)
    assert (code == 0) == summary["passed"]
    return summary


def test_support_check_end_to_end_on_a_toy_engine(monkeypatch, tmp_path):
    """The whole check against stand-in engines (3 prompts x 64 completions of 6 tokens per
    top-k and top-p): a speculative engine with the right law passes, with a calibrated judge
    (the null clean, the top-p samples judged at k 2 flagged); one that drops the top-k filter
    fails with its violations named."""
    good = _run_support(monkeypatch, tmp_path / "good", ignore_top_k=False)
    assert good["passed"] and good["calibrated"] and good["null_clean"], good
    assert good["spec"]["violations"] == 0 and good["spec"]["per_k"]["5"]["inside"] > 0
    bad = _run_support(monkeypatch, tmp_path / "bad", ignore_top_k=True)
    assert not bad["passed"] and bad["spec"]["violations"] > 0
    worst = bad["spec"]["worst"][0]
    assert worst["rank"] is None or worst["rank"] >= worst["k"]


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
