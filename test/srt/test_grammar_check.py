"""The e2e ``grammar`` check's validators and verdict on the CPU, with stand-in engines: a run
where every output obeys its constraint and equals the non-speculative one passes; an invalid
JSON among the sampled outputs, a greedy difference, or another law fails it."""

from __future__ import annotations

import json
import random
from contextlib import contextmanager

import pytest

from sglang_ddtree.testing import e2e
from sglang_ddtree.testing import grammar_check as gc


def test_valid_json_accepts_the_schema_and_nothing_else():
    assert gc.valid_json('{"color":"red","size":"xl","ok":true}')
    assert gc.valid_json('{"ok": false, "size": "s", "color": "blue"}')
    assert not gc.valid_json('{"color":"red","size":"xl"}')  # a required key missing
    assert not gc.valid_json('{"color":"red","size":"xl","ok":true,"x":1}')  # an extra key
    assert not gc.valid_json('{"color":"pink","size":"xl","ok":true}')  # not in the enum
    assert not gc.valid_json('{"color":"red","size":"xl","ok":1}')  # not a boolean
    assert not gc.valid_json('{"color":"red","size":"xl","ok":tru')  # cut off
    assert not gc.valid_json('["red"]')


def test_patterns():
    assert gc.matches(gc.REGEX, "abcd ef gh.") and not gc.matches(gc.REGEX, "abcd ef")
    assert gc.matches(gc.EBNF_PATTERN, "answer: maybe.")
    assert not gc.matches(gc.EBNF_PATTERN, "answer: perhaps.")
    assert gc.matches(gc.LAW_REGEX, "a" * gc.LAW_TOKENS)


def _stand_in(monkeypatch, faults: dict[str, str]):
    """Engines answering each constraint with a valid output (ids from the text); the DDTREE
    engine injects ``faults``: ``bad_json`` (one sampled JSON cut off), ``greedy`` (another
    regex output on prompt 0), ``law`` (another letter distribution under LAW_REGEX)."""

    class Engine:
        def __init__(self, name):
            self.name = name
            self.rng = random.Random(0 if name == "none" else 1)

        def generate(self, input_ids, sampling_params, **kw):
            plist = sampling_params if isinstance(sampling_params, list) else None
            outs = []
            for i, p in enumerate(input_ids):
                params = plist[i] if plist else sampling_params
                outs.append(self._one(i, p, params))
            return outs

        def _one(self, i, prompt, params):
            tree = self.name == "DDTREE"
            if "regex" in params and params["regex"] == gc.LAW_REGEX:
                letters = "ab" if tree and "law" in faults else "abcd"
                text = "".join(self.rng.choice(letters) for _ in range(gc.LAW_TOKENS))
            elif "regex" in params:
                text = "wxyz ab." if tree and "greedy" in faults and i == 0 else "abcd ef."
            elif "ebnf" in params:
                text = "answer: yes."
            elif "json_schema" in params:
                text = '{"color":"red","size":"m","ok":true}'
                if tree and "bad_json" in faults and params["temperature"] > 0 and i == 3:
                    text = text[:-1]
            else:
                text = "free text"
            return {"output_ids": [ord(c) for c in text], "text": text, "meta_info": {}}

    @contextmanager
    def engine(**kw):
        assert kw["constrained_json_disable_any_whitespace"] is True
        yield Engine(kw.get("speculative_algorithm") or "none")

    monkeypatch.setattr(e2e, "engine", engine)


@pytest.mark.parametrize("fault", [None, "bad_json", "greedy", "law"])
def test_grammar_verdict(monkeypatch, fault):
    _stand_in(monkeypatch, {fault} if fault else set())
    monkeypatch.setattr(gc, "JSON_SAMPLES", 40)
    summary: dict = {}
    prompts = e2e.make_prompts(5, 50, 8, seed=0)
    e2e.run_checks("/t", "/d", prompts, ["grammar"], summary)
    got = summary["grammar"]
    assert got["passed"] is (fault is None), json.dumps(got)[:500]
    assert got["valid"]["json_sampled"] == {"valid": 40 - (fault == "bad_json"), "of": 40}
    assert got["greedy"]["regex"]["mismatches"] == (fault == "greedy")
    assert (got["law"]["p_combined"] < 1e-3) is (fault == "law")
