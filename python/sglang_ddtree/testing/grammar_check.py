"""Constrained decoding through DDTREE against the non-speculative engine (the e2e ``grammar``
check), with the tiny pair's character-level tokenizer.

Every engine of the check runs the same requests:
- ``regex``: greedy, each prompt under ``REGEX`` (letters only: the tiny LM head favours a few
  letters, so trees get accepted deep);
- ``json``: greedy, each prompt under ``SCHEMA`` (enums and a boolean: every valid output is
  short and closes);
- ``ebnf``: greedy, each prompt under ``EBNF``;
- ``mixed``: one batch alternating ``REGEX`` requests and free ones (greedy): constrained and
  free rows verified in one step;
- ``json_sampled``: ``JSON_SAMPLES`` completions under ``SCHEMA`` at T 1.0 / top_p 0.95 (the
  first user's setting), each must parse and satisfy the schema;
- ``law``: ``LAW_SAMPLES`` completions of each of ``LAW_PROMPTS`` prompts under
  ``LAW_REGEX`` (exactly ``LAW_TOKENS`` letters) at T 1.0, compared position by position with
  the non-speculative engine's (``e2e.law_test``: chi-squared, Bonferroni, p > 0.001).

Greedy outputs must equal the non-speculative engine's, up to near-ties of its unconstrained
top two (``near_tie``); a difference the grammar moved elsewhere counts as a fault (strict).
The engines need ``constrained_json_disable_any_whitespace`` (``ENGINE_ARGS``): with free
whitespace a random model may pad a JSON object until the token limit.
"""

from __future__ import annotations

import json
import re

REGEX = r"[a-z]{4,12}( [a-z]{2,8}){1,3}\."
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"enum": ["s", "m", "l", "xl"]},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "size", "ok"],
    "additionalProperties": False,
}
EBNF = 'root ::= "answer: " ("yes" | "no" | "maybe") "."'
EBNF_PATTERN = r"answer: (yes|no|maybe)\."
LAW_TOKENS = 24
LAW_REGEX = f"[a-z]{{{LAW_TOKENS}}}"
LAW_PROMPTS = 4
LAW_SAMPLES = 256
JSON_SAMPLES = 512
GREEDY_TOKENS = 64
ENGINE_ARGS = {"constrained_json_disable_any_whitespace": True}


def valid_json(text: str, schema: dict = SCHEMA) -> bool:
    """Whether ``text`` parses as one JSON object that satisfies ``schema`` (the subset used
    here: an object with required keys, no others, each an enum or a boolean)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    props = schema["properties"]
    if not isinstance(obj, dict) or set(obj) != set(schema["required"]) or set(obj) - set(props):
        return False
    for key, rule in props.items():
        value = obj[key]
        if "enum" in rule and value not in rule["enum"]:
            return False
        if rule.get("type") == "boolean" and not isinstance(value, bool):
            return False
    return True


def matches(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text) is not None


def _generate(eng, prompts, params) -> list[dict]:
    out = eng.generate(input_ids=prompts, sampling_params=params)
    return out if isinstance(out, list) else [out]


def run_grammar(eng, prompts: list[list[int]]) -> dict:
    """The check's requests on one engine: output ids and texts per request kind."""
    greedy = {"temperature": 0.0, "max_new_tokens": GREEDY_TOKENS}
    res: dict = {}
    for name, constraint in (
        ("regex", {"regex": REGEX}),
        ("json", {"json_schema": json.dumps(SCHEMA)}),
        ("ebnf", {"ebnf": EBNF}),
    ):
        outs = _generate(eng, prompts, dict(greedy, **constraint))
        res[name] = {"ids": [o["output_ids"] for o in outs], "text": [o["text"] for o in outs]}
    plist = [dict(greedy, regex=REGEX) if i % 2 == 0 else greedy for i in range(len(prompts))]
    outs = _generate(eng, prompts, plist)
    res["mixed"] = {"ids": [o["output_ids"] for o in outs], "text": [o["text"] for o in outs]}
    sampled = {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": GREEDY_TOKENS,
               "json_schema": json.dumps(SCHEMA)}  # fmt: skip
    reps = -(-JSON_SAMPLES // len(prompts))
    outs = _generate(eng, (prompts * reps)[:JSON_SAMPLES], sampled)
    res["json_sampled"] = {"text": [o["text"] for o in outs]}
    law = {"temperature": 1.0, "max_new_tokens": LAW_TOKENS, "regex": LAW_REGEX}
    res["law"] = [
        [o["output_ids"] for o in _generate(eng, [p] * LAW_SAMPLES, law)]
        for p in prompts[:LAW_PROMPTS]
    ]
    return res


def validity(res: dict) -> dict:
    """Per request kind: how many outputs satisfy their constraint, of how many."""
    constrained_mixed = res["mixed"]["text"][::2]
    counts = {
        "regex": [matches(REGEX, t) for t in res["regex"]["text"]],
        "json": [valid_json(t) for t in res["json"]["text"]],
        "ebnf": [matches(EBNF_PATTERN, t) for t in res["ebnf"]["text"]],
        "mixed_constrained": [matches(REGEX, t) for t in constrained_mixed],
        "json_sampled": [valid_json(t) for t in res["json_sampled"]["text"]],
        "law": [len(s) == LAW_TOKENS for prompt in res["law"] for s in prompt],
    }
    return {k: {"valid": sum(v), "of": len(v)} for k, v in counts.items()}


def grammar_summary(base: dict, tree: dict, prompts, compare, law_test) -> dict:
    """The verdict: every DDTREE output valid, greedy equal to the non-speculative engine's
    (``compare(base_ids, tree_ids, prompts)``: e2e's greedy comparison, near-ties judged) in
    every greedy kind, and the sampled law under ``LAW_REGEX`` equal (``law_test``)."""
    valid = validity(tree)
    greedy = {
        kind: compare(base[kind]["ids"], tree[kind]["ids"], prompts)
        for kind in ("regex", "json", "ebnf", "mixed")
    }
    law = law_test(base["law"], tree["law"])
    passed = (
        all(v["valid"] == v["of"] for v in valid.values())
        and all(g["near_ties"] == g["mismatches"] for g in greedy.values())
        and law["p_combined"] > 1e-3
    )
    return {
        "valid": valid,
        "base_valid": validity(base),
        "greedy": greedy,
        "law": law,
        "passed": passed,
    }
