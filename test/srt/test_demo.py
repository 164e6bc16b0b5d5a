"""The CPU demo (``python -m sglang_ddtree.demo``) on the shipped pair and on the toy pair.

Short runs of the demo's own machinery: greedy DFlash chain and greedy DDTree output must equal
greedy decoding without speculation token for token, the chain's accept length must equal the
teacher-forced reference walk of ``evaluate.chain_accept_on_prompts``, sampled runs must
produce the requested number of tokens, and the toy demo must run.
"""

import pytest
import torch

from sglang_ddtree import demo as D
from sglang_ddtree.pair import evaluate, heldout_prompts, load_pair

NEW_TOKENS = 40
PROMPT = 14  # the demo's default held-out prompt


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    return load_pair()


@pytest.fixture(scope="module")
def prompt(pair):
    return pair[2].encode(heldout_prompts()[PROMPT])


@pytest.fixture(scope="module")
def greedy_runs(pair, prompt):
    rows = D.methods([16, 64], pair[1].block_size - 1)
    return rows, D.run_all(pair, prompt, NEW_TOKENS, rows, [D.Sampling()], trace_budget=16)


def test_greedy_speculation_equals_no_speculation(greedy_runs):
    rows, runs = greedy_runs
    assert D.greedy_mismatches(runs, rows) == {m.name: -1 for m in rows[1:]}
    for m in rows:
        run = runs[m.name, 0.0]
        assert len(run.tokens) == NEW_TOKENS
        assert sum(run.step_lens) == NEW_TOKENS - 1  # the first token comes from the prefill
        assert min(run.step_lens) >= 1 and run.accept_length >= 1.0
    # On this prompt the drafter helps at T=0, and a tree accepts at least as much as the chain.
    chain = runs["DFlash chain (top-1)", 0.0].accept_length
    assert chain > 1.2
    assert runs["DDTree budget 64", 0.0].accept_length >= chain


def test_chain_matches_reference_walk(pair, prompt, greedy_runs):
    _, runs = greedy_runs
    target, drafter, _ = pair
    ref = evaluate.chain_accept_on_prompts(target, drafter, [prompt], NEW_TOKENS - 1)
    run = runs["DFlash chain (top-1)", 0.0]
    assert len(run.step_lens) == ref["rounds"]
    assert run.accept_length == pytest.approx(ref["accept_length"])


def test_rendered_tree_marks_accepted_path(pair, greedy_runs):
    _, runs = greedy_runs
    traces = runs["DDTree budget 16", 0.0].traces
    assert traces and all(len(t.path) >= 1 for t in traces)
    t = D.pick_trace(traces)
    text = D.render_tree(t.tree, 0, set(t.path), D.token_label(pair[2]))
    lines = text.splitlines()
    assert len(lines) == int(t.tree.valid[0].sum()) == 17
    assert sum(line.startswith("*") for line in lines) == len(t.path)


def test_sampled_runs(pair, prompt):
    s = D.Sampling(1.0, 0.95, seed=0)
    for m in D.methods([16], pair[1].block_size - 1):
        run = D.run_method(pair, prompt, 16, m, s)
        assert len(run.tokens) == 16 and min(run.step_lens) >= 1
        assert all(0 <= t < pair[0].args.vocab_size for t in run.tokens)


def test_toy_demo_runs(capsys):
    D.main(["--toy", "--steps", "5", "--budgets", "8"])
    out = capsys.readouterr().out
    assert "greedy DDTree == greedy decoding" in out and "OK" in out
    assert "DDTree budget 8" in out


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--new-tokens", "0"], "--new-tokens 0"),
        (["--prompt", "99"], "0..63"),
        (["--budgets", "0"], "--budgets [0]"),
        (["--top-p", "2"], "(0, 1]"),
        (["--toy", "--depth", "0"], "--depth 0"),
    ],
)
def test_bad_arguments_exit_2_with_the_range(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        D.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_each_run_announces_itself_as_it_starts(pair, prompt):
    """The demo prints a line as each (method, temperature) run starts, before its result."""
    rows = D.methods([16], pair[1].block_size - 1)
    samplings = [D.Sampling(), D.Sampling(1.0, 0.95, 0)]
    lines = []
    runs = D.run_all(pair, prompt, 3, rows, samplings, stage=lines.append)
    assert len(lines) == len(runs) == len(rows) * len(samplings)
    assert lines[0] == "no speculation, T=0: 3 tokens ..."
    assert lines[-1] == "DDTree budget 16, T=1: 3 tokens ..."
