"""The tiny-pair end-to-end checks on a CUDA machine with sglang 0.5.17: ``pytest -m gpu test/srt``.

Runs ``python -m sglang_ddtree.testing.e2e`` once (tiny random Qwen3 target + DFlash drafter,
triton attention, CUDA graphs on) and checks each part of its summary:
a. greedy DDTREE == greedy without speculation, 32 prompts at batch 1, 4, 16, 32;
b. sampled law at T=1.0 and T=0.7/top_p=0.9 equals no-speculation (p > 0.001), and a
   deliberately wrong variant is rejected (p < 0.001);
c. launch_server + OpenAI API with temperature, JSON mode and forced tool calls (Kimi K2's
   parser), min_p, accept length, HTTP 400, keeps serving;
c2. constrained decoding (``testing.grammar_check``): regex, JSON schema and EBNF outputs all
   valid and greedy-equal to no speculation, a mixed constrained / free batch, 512 JSON
   completions sampled at T 1.0 / top_p 0.95 all valid, the law under a regex equal;
d. mean accept length DDTREE >= DFLASH;
e. adaptive budget (schedule 1:33,4:17): greedy == no speculation across both buckets, every
   verify step of both widths replayed a CUDA graph, and so did every glue segment after its
   capture step;
   The run's log shows that the split tree-verify attention (the default) took the verifies;
f. with triton's custom-mask extend kernel instead (the reference verify backend,
   ``--verify-attention triton_extend``): a and b again, and the log shows that the split
   kernels did not run;
g. the split attention on the Kimi-shaped MLA + MoE pair (``--arch mla``): b, through the split
   kernels (MLA's 512-wide values tiled). Greedy is left out there: on that random-router target
   greedy outputs differ from no speculation at expert-routing near-ties with either attention
   (RESULTS.md);
h. logprobs (``--checks logprobs``, bfloat16): DDTREE's greedy and sampled logprobs against the
   non-speculative server's, per position kind, within that server's own extend-versus-decode
   differences (``testing.logprobs_check``).
"""

from __future__ import annotations

import json
import os

import pytest

from sglang_ddtree.srt.ddtree_attention.verify_backend import SPLIT_LOG_LINE

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def e2e_out(tmp_path_factory):
    return os.environ.get("DDTREE_E2E_OUT") or str(tmp_path_factory.mktemp("e2e"))


@pytest.fixture(scope="module")
def summary(e2e_out, run_gpu_check):
    return run_gpu_check(e2e_out, "sglang_ddtree.testing.e2e", [], "e2e_summary.json", 1800)


def test_a_greedy_equals_no_spec(summary, e2e_out):
    g = summary["greedy"]
    assert g["passed"], json.dumps(g, indent=1)
    with open(os.path.join(e2e_out, "e2e_stdout.log")) as f:
        assert SPLIT_LOG_LINE in f.read()  # the default attention took the verifies


def test_b_sampling_law(summary):
    s = summary["sampling"]
    assert s["passed"], json.dumps(s, indent=1)
    for name in ("T1.0", "T0.7_p0.9"):
        assert s["tests"][name]["tokens"] >= 20000


def test_c_server(summary):
    s = summary["server"]
    assert s["passed"], json.dumps(s, indent=1)


def test_c2_constrained_decoding(summary):
    g = summary["grammar"]
    assert g["passed"], json.dumps(g, indent=1)[:4000]
    assert g["valid"]["json_sampled"]["of"] >= 500


def test_d_accept_length_vs_dflash(summary):
    a = summary["accept"]
    assert a["passed"], json.dumps(a, indent=1)


def test_e_adaptive_budget(summary):
    a = summary["adaptive"]
    assert a["passed"], json.dumps(a, indent=1)


def _attention_run(tmp_path_factory, run_gpu_check, name: str, args: list[str]):
    """(summary, stdout) of the e2e module with ``args``."""
    out = str(tmp_path_factory.mktemp(name))
    summary = run_gpu_check(out, "sglang_ddtree.testing.e2e", args, "e2e_summary.json", 900)
    with open(os.path.join(out, "e2e_stdout.log")) as f:
        return summary, f.read()


@pytest.fixture(scope="module")
def extend_attention(tmp_path_factory, run_gpu_check):
    args = ["--checks", "greedy,sampling", "--verify-attention", "triton_extend"]
    return _attention_run(tmp_path_factory, run_gpu_check, "e2e_extend_attention", args)


def test_f_extend_kernel_attention(extend_attention):
    summary, log = extend_attention
    assert summary["verify_attention"] == "triton_extend"
    assert SPLIT_LOG_LINE not in log  # the reference kept the backend's own kernel
    assert summary["greedy"]["passed"], json.dumps(summary["greedy"], indent=1)
    assert summary["sampling"]["passed"], json.dumps(summary["sampling"], indent=1)


@pytest.fixture(scope="module")
def split_attention_mla(tmp_path_factory, run_gpu_check):
    args = ["--arch", "mla", "--checks", "sampling"]  # the default verify: the split
    return _attention_run(tmp_path_factory, run_gpu_check, "e2e_split_mla", args)


def test_g_split_tree_attention_mla(split_attention_mla):
    summary, log = split_attention_mla
    assert SPLIT_LOG_LINE in log
    assert summary["arch"] == "mla"
    assert summary["sampling"]["passed"], json.dumps(summary["sampling"], indent=1)


@pytest.fixture(scope="module")
def logprobs_run(tmp_path_factory, run_gpu_check):
    out = str(tmp_path_factory.mktemp("e2e_logprobs"))
    args = ["--dtype", "bfloat16", "--checks", "logprobs"]
    return run_gpu_check(out, "sglang_ddtree.testing.e2e", args, "e2e_summary.json", 600)


def test_h_logprobs_within_the_servers_floor(logprobs_run):
    """DDTREE's logprobs against the non-speculative server's in bfloat16, one request at a
    time, per position kind: the token logprob's p99 difference at most 1.25x the server's own
    extend-versus-decode p99 and its maximum at most 0.1; greedy against its outputs, sampled
    at T 1.0 / top_p 0.95 against its scoring of DDTREE's tokens (`testing.logprobs_check`);
    reading them one position late is caught in both."""
    lp = logprobs_run["logprobs"]
    assert lp["greedy"]["one_position_late_caught"] and lp["sampled"]["one_position_late_caught"]
    assert lp["passed"], json.dumps(lp, indent=1)
