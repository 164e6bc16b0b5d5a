"""@@ALGORITHM@@ greedy decoding against the same server without speculation.

Generated from sglang-ddtree's upstream/templates/test_ddtree.py.
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
# Near-ties in bf16 can flip a greedy token between two servers whose forwards round
# differently (batch shapes, tree rows in one extend); SGLang's DFLASH chain shows the same
# rate. The tree itself must not add mismatches beyond that floor.
MAX_MISMATCHED_PROMPTS = 1


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
            *extra_args,
        ],
    )


def _generate(prompts):
    res = requests.post(
        DEFAULT_URL_FOR_TEST + "/generate",
        json={
            "text": prompts,
            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS},
        },
        timeout=600,
    )
    res.raise_for_status()
    return res.json()


class TestDDTreeGreedyMatchesNoSpeculation(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        process = _launch([])
        try:
            cls.reference = [o["output_ids"] for o in _generate(PROMPTS)]
        finally:
            kill_process_tree(process.pid)
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
        got = [o["output_ids"] for o in outputs]
        mismatched = [i for i, (a, b) in enumerate(zip(self.reference, got)) if a != b]
        print(f"mismatched prompts: {mismatched}")
        self.assertLessEqual(len(mismatched), MAX_MISMATCHED_PROMPTS)

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
