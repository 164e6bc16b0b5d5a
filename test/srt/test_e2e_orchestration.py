"""The end-to-end check's orchestration (``testing.e2e.run_checks``) on the CPU, with a stand-in
engine: which engines start in which order, and that the greedy verdict is handed out as soon
as its two engines have run (a run stopped during a later engine keeps it)."""

from __future__ import annotations

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
        if name == "DDTREE" and "SGLANG_DDTREE_TEST_COIN_SCALE" in e2e.os.environ:
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
    assert seen == [] and "greedy" not in summary and checks[0] in summary
