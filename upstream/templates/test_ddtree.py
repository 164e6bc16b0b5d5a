"""@@ALGORITHM@@ greedy decoding against the same server without speculation.

Two servers whose forwards round differently (a verify is an extend over the tree's
nodes; the batches differ) may pick different greedy tokens where the reference's two
best tokens are nearly tied. So outputs need not be equal, but an output that differs
must differ first at a near-tie of the reference (``near_tie``). A wrong accept rule
or a corrupted KV mapping changes the distribution itself, far beyond that margin.
"""

import unittest

import requests

from sglang.srt.utils import kill_process_tree
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import (
    DEFAULT_DRAFT_MODEL_DFLASH,
    DEFAULT_TARGET_MODEL_DFLASH,
    DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
    DEFAULT_URL_FOR_TEST,
    CustomTestCase,
    popen_launch_server,
)

register_cuda_ci(est_time=400, stage="base-b", runner_config="1-gpu-small")

PROMPTS = [
    "The capital of France is",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three prime numbers greater than 100:",
    "Explain in one paragraph why the sky is blue.",
    "def quicksort(xs):",
    "Translate to German: The weather is nice today.",
    "Q: What is 17 * 23? A:",
    "Once upon a time, in a small village by the sea,",
]
MAX_NEW_TOKENS = 64
TOP_LOGPROBS = "output_top_logprobs"
# The widest top-two logit margin (nats) of the reference at which a greedy difference
# is a near-tie. Both servers compute logits in float32 (--enable-fp32-lm-head), so
# margins are not rounded to bfloat16 steps; bfloat16 activations still move a logit of
# magnitude 10-30 by up to about 0.1.
NEAR_TIE_NATS = 0.1


def near_tie(reference, reference_top2, output):
    """Judge a greedy ``output`` that differs from the ``reference`` of its prompt.

    ``reference_top2[i]``: the reference server's two most likely tokens at output
    position ``i``, as ``[(logprob, token id), ...]``. A near-tie iff, at the first
    position where the outputs differ, their two tokens are exactly the reference's top
    two there, at most ``NEAR_TIE_NATS`` apart. One output a prefix of the other
    (another length) is never a near-tie.
    """
    n = min(len(reference), len(output))
    i = next((j for j in range(n) if reference[j] != output[j]), None)
    if i is None:
        return {"position": n, "near_tie": False, "why": "one output ends early"}
    (lp1, id1), (lp2, id2) = reference_top2[i][:2]
    tokens = [reference[i], output[i]]
    margin = lp1 - lp2
    tie = sorted(tokens) == sorted([id1, id2]) and margin <= NEAR_TIE_NATS
    return {
        "position": i,
        "tokens": tokens,
        "top2": [id1, id2],
        "margin": round(margin, 4),
        "near_tie": tie,
    }


def _launch(extra_args):
    return popen_launch_server(
        DEFAULT_TARGET_MODEL_DFLASH,
        DEFAULT_URL_FOR_TEST,
        timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
        other_args=[
            "--trust-remote-code",
            "--attention-backend",
            "triton",
            "--page-size",
            "1",
            "--mem-fraction-static",
            "0.7",
            "--enable-fp32-lm-head",
            *extra_args,
        ],
    )


def _generate(prompts, top2=False):
    """Greedy outputs; ``top2``: with the two most likely tokens at every position."""
    payload = {
        "text": prompts,
        "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS},
    }
    if top2:
        payload.update(return_logprob=True, top_logprobs_num=2)
    res = requests.post(DEFAULT_URL_FOR_TEST + "/generate", json=payload, timeout=600)
    res.raise_for_status()
    return res.json()


class TestDDTreeGreedyMatchesNoSpeculation(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        process = _launch([])
        try:
            reference = _generate(PROMPTS, top2=True)
        finally:
            kill_process_tree(process.pid)
        cls.reference = [o["output_ids"] for o in reference]
        # output_top_logprobs: per position, [logprob, token id, text] of the top two.
        cls.reference_top2 = [
            [[(t[0], t[1]) for t in top] for top in o["meta_info"][TOP_LOGPROBS]]
            for o in reference
        ]
        cls.process = _launch(
            [
                "--speculative-algorithm",
                "@@ALGORITHM@@",
                "--speculative-draft-model-path",
                DEFAULT_DRAFT_MODEL_DFLASH,
                "--speculative-ddtree-budget-schedule",
                "1:33,4:17",
                "--speculative-ddtree-topk",
                "8",
            ]
        )

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "process", None):
            kill_process_tree(cls.process.pid)

    def _check(self, outputs):
        self.assertEqual(len(outputs), len(PROMPTS))
        faults = []
        for i, output in enumerate(outputs):
            got = output["output_ids"]
            if got == self.reference[i]:
                continue
            verdict = near_tie(self.reference[i], self.reference_top2[i], got)
            print(f"prompt {i} differs: {verdict}")
            if not verdict["near_tie"]:
                faults.append((i, verdict))
        self.assertEqual(faults, [])

    def test_greedy_one_by_one(self):
        self._check([_generate([p])[0] for p in PROMPTS])

    def test_greedy_batched(self):
        outputs = _generate(PROMPTS)
        self._check(outputs)
        verify_steps = sum(o["meta_info"]["spec_verify_ct"] for o in outputs)
        tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
        accept_length = tokens / max(verify_steps, 1)
        print(f"accept length: {accept_length:.2f}")
        self.assertGreater(accept_length, 1.5)
        self.assertIsNone(self.process.poll())


if __name__ == "__main__":
    unittest.main()
