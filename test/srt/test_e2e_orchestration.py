"""The end-to-end check's orchestration (``testing.e2e.run_checks``) on the CPU, with a stand-in
engine: which engines start in which order, and that the greedy verdict is handed out as soon
as its two engines have run (a run stopped during a later engine keeps it)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import pytest

from sglang_ddtree.testing import e2e


class _Stop(Exception):
    pass


def _stand_in(monkeypatch, stop_at: str | None):
    """Engines that echo each prompt's first tokens (greedy equal everywhere); starting the
    engine named ``stop_at`` raises `_Stop`, as a run killed at that point would end."""
    started = []

    class Engine:
        def generate(self, input_ids, sampling_params):
            n = (sampling_params if isinstance(sampling_params, dict) else sampling_params[0])[
                "max_new_tokens"
            ]
            return [
                {"output_ids": list(p[:1]) * n, "meta_info": {"spec_accept_length": 1.0}}
                for p in input_ids
            ]

    @contextmanager
    def engine(**kw):
        name = kw.get("speculative_algorithm") or "none"
        if name == "DDTREE" and e2e.inject.WRONG_COINS_ENV in e2e.os.environ:
            name = "wrong"
        started.append(name)
        if name == stop_at:
            raise _Stop(name)
        yield Engine()

    monkeypatch.setattr(e2e, "engine", engine)
    return started


def test_greedy_verdict_is_handed_out_before_the_later_engines(monkeypatch):
    started = _stand_in(monkeypatch, stop_at="wrong")
    seen = []
    summary: dict = {}
    prompts = e2e.make_prompts(5, 50, 8, seed=0)
    # The wrong-law engine fails to start: the checks after it fail, greedy does not.
    e2e.run_checks("/t", "/d", prompts, ["greedy", "sampling"], summary, seen.append)
    assert started == ["none", "DDTREE", "wrong"]
    assert len(seen) == 1 and seen[0]["greedy"]["passed"] is True
    # DDTREE's law is handed out with it, before the calibration's engine fails.
    assert set(seen[0]["sampling_law"]) == {"T1.0", "T0.7_p0.9"}
    assert summary["greedy"]["passed"] is True
    assert summary["sampling"]["passed"] is False and "wrong" in summary["sampling"]["error"]


def test_a_failed_engine_fails_the_greedy_verdict(monkeypatch):
    started = _stand_in(monkeypatch, stop_at="DDTREE")
    summary: dict = {}
    e2e.run_checks("/t", "/d", e2e.make_prompts(5, 50, 4, seed=0), ["greedy"], summary)
    assert started == ["none", "DDTREE"]
    assert summary["greedy"]["passed"] is False and "_Stop" in summary["greedy"]["error"]


@pytest.mark.parametrize("checks", [["sampling"], ["accept"]])
def test_no_greedy_verdict_without_the_greedy_check(monkeypatch, checks):
    _stand_in(monkeypatch, stop_at=None)
    seen = []
    summary: dict = {}
    e2e.run_checks("/t", "/d", e2e.make_prompts(5, 50, 4, seed=0), checks, summary, seen.append)
    assert all("greedy" not in s for s in seen) and "greedy" not in summary
    assert checks[0] in summary
    # With the sampling check, only DDTREE's law (before calibration) is handed out early.
    assert len(seen) == (checks == ["sampling"])
    if checks == ["sampling"]:  # the verdict's DDTREE tests are the early ones, not redone
        assert summary["sampling"]["tests"]["T1.0"] == summary["sampling_law"]["T1.0"]
        assert "wrong_variant_T1.0" in summary["sampling"]["tests"]


def _differing_engines(monkeypatch, differ: dict[str, int]):
    """Engines whose greedy output is the prompt's first token repeated, except on the first
    ``differ[name]`` prompts (a token no other engine emits); the top-2 probe's engine has no
    logprobs, so every difference stays a fault."""
    started = []

    class Engine:
        def __init__(self, name):
            self.name = name

        def generate(self, input_ids, sampling_params, **kw):
            if kw:
                raise RuntimeError("stand-in engine: no logprobs")
            params = sampling_params if isinstance(sampling_params, dict) else sampling_params[0]
            n = params["max_new_tokens"]
            outs = []
            for p in input_ids:
                altered = e2e_prompts.index(list(p)) < differ.get(self.name, 0)
                outs.append({"output_ids": [999 if altered else p[0]] * n,
                             "meta_info": {"spec_accept_length": 1.0}})  # fmt: skip
            return outs

    @contextmanager
    def engine(**kw):
        name = kw.get("speculative_algorithm") or "none"
        started.append(name)
        yield Engine(name)

    monkeypatch.setattr(e2e, "engine", engine)
    return started


e2e_prompts = e2e.make_prompts(5, 50, 32, seed=3)


def test_excess_p_is_calibrated():
    """Equal counts (the null) give a large p; DDTREE differing on 25 of 32 prompts where the
    chain differs on 5 (the excess a real fault would add) a small one."""
    assert e2e.excess_p(7, 7, 32) > 0.5
    assert e2e.excess_p(5, 9, 32) > 0.5
    assert e2e.excess_p(25, 5, 32) < 1e-4


@pytest.mark.parametrize("tree,chain,passes", [(6, 6, True), (20, 2, False)])
def test_chain_check_judges_greedy_against_the_chain(monkeypatch, tree, chain, passes):
    started = _differing_engines(monkeypatch, {"DDTREE": tree, "DFLASH": chain})
    summary: dict = {}
    e2e.run_checks("/t", "/d", e2e_prompts, ["greedy", "chain"], summary)
    assert started[:2] == ["none", "DDTREE"] and "DFLASH" in started
    assert summary["greedy"]["by_batch"]["1"]["mismatches"] == tree
    assert summary["chain"]["greedy"]["by_batch"]["1"]["mismatches"] == chain
    assert summary["greedy"]["passed_against_chain"] is passes
    assert summary["greedy"]["passed"] is passes  # no difference here is a near-tie


def test_chain_check_reports_the_chains_law(monkeypatch):
    _differing_engines(monkeypatch, {})
    monkeypatch.setattr(e2e, "SAMPLES_PER_PROMPT", 4)
    summary: dict = {}
    e2e.run_checks("/t", "/d", e2e_prompts, ["sampling", "chain"], summary)
    assert set(summary["chain"]["sampling"]) == {n for n, _, _ in e2e.SAMPLING_CASES}
    assert "greedy" not in summary["chain"]


def test_backend_floor_runs_the_nonspeculative_server_on_triton(monkeypatch):
    """``backend_floor`` on flashmla: one more non-speculative engine, on triton; every other
    engine (the wrong law's included) stays on the chosen backend; its law tests are reported
    beside DDTREE's."""
    backends = []

    @contextmanager
    def engine(**kw):
        backends.append((kw.get("speculative_algorithm") or "none", kw["attention_backend"]))

        class Engine:
            def generate(self, input_ids, sampling_params):
                n = sampling_params["max_new_tokens"]
                return [{"output_ids": [7] * n, "meta_info": {}} for _ in input_ids]

        yield Engine()

    monkeypatch.setattr(e2e, "engine", engine)
    monkeypatch.setitem(e2e.ENGINE_EXTRA, "attention_backend", "flashmla")
    monkeypatch.setattr(e2e, "SAMPLES_PER_PROMPT", 4)
    summary: dict = {}
    prompts = e2e.make_prompts(5, 50, 4, seed=0)
    e2e.run_checks("/t", "/d", prompts, ["sampling", "backend_floor"], summary)
    assert backends == [
        ("none", "flashmla"), ("DDTREE", "flashmla"), ("none", "triton"), ("DDTREE", "flashmla")
    ]  # fmt: skip
    floor = summary["backend_floor"]
    assert floor["backend"] == "triton" and set(floor["tests"]) == {"T1.0", "T0.7_p0.9"}


def test_trained_pair_takes_its_own_dirs_and_prompts(monkeypatch, tmp_path):
    """``--pair trained``: the checks get the shipped pair's directories and its held-out
    prompts (tokenized as the law tool's; the first `NUM_PROMPTS`, the logprobs check
    `SAMPLED_PROMPTS` of them; the tiny pair's logprobs check as many of its own); with
    ``--arch`` or ``--models`` it is refused."""
    from sglang_ddtree.pair import DRAFTER_DIR, TARGET_DIR
    from sglang_ddtree.testing import logprobs_check
    from sglang_ddtree.testing.law import tokenized_prompts

    got = {}

    def fake_run_checks(target, draft, prompts, checks, summary, on_verdict=None):
        got.update(target=target, draft=draft, prompts=prompts)
        for name in checks:
            summary[name] = {"passed": True}

    def fake_logprobs(engine_kwargs, engine, prompts, new_tokens, summary):
        got["logprob_prompts"] = prompts
        summary["logprobs"] = {"passed": True}

    monkeypatch.setattr(e2e, "run_checks", fake_run_checks)
    monkeypatch.setattr(logprobs_check, "check_logprobs", fake_logprobs)
    argv = ["e2e", "--out", str(tmp_path), "--checks", "greedy,logprobs"]
    monkeypatch.setattr(sys, "argv", argv + ["--pair", "trained"])
    assert e2e.main() == 0
    assert (got["target"], got["draft"]) == (str(TARGET_DIR), str(DRAFTER_DIR))
    held_out = tokenized_prompts()
    assert got["prompts"] == held_out[: e2e.NUM_PROMPTS]
    assert got["logprob_prompts"] == held_out[: logprobs_check.SAMPLED_PROMPTS]
    assert len(got["logprob_prompts"]) == logprobs_check.SAMPLED_PROMPTS > e2e.NUM_PROMPTS
    monkeypatch.setattr(sys, "argv", argv)  # the tiny pair
    assert e2e.main() == 0
    assert len(got["prompts"]) == e2e.NUM_PROMPTS
    assert len(got["logprob_prompts"]) == logprobs_check.SAMPLED_PROMPTS
    for extra in (["--arch", "mla"], ["--models", str(tmp_path)]):
        monkeypatch.setattr(sys, "argv", argv + ["--pair", "trained"] + extra)
        with pytest.raises(SystemExit):
            e2e.main()
