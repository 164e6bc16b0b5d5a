"""@@ALGORITHM@@ refuses the request options whose exact law over a tree it does not implement
(custom logit processors): HTTP 400 naming @@ALGORITHM@@, and the server keeps serving; it
serves the others, logprobs included.
"""

import unittest

import requests

from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor
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

register_cuda_ci(est_time=200, stage="base-b", runner_config="1-gpu-small")

REFUSED = {
    "custom_logit_processor": (
        {"custom_params": {"token_ids": [5]}},
        {"custom_logit_processor": DisallowedTokensLogitsProcessor.to_str()},
    ),
}


class TestDDTreeRefusals(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.base_url = DEFAULT_URL_FOR_TEST
        cls.process = popen_launch_server(
            DEFAULT_TARGET_MODEL_DFLASH,
            cls.base_url,
            timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
            other_args=[
                "--trust-remote-code",
                "--attention-backend",
                "triton",
                "--page-size",
                "1",
                "--mem-fraction-static",
                "0.7",
                "--enable-custom-logit-processor",
                "--speculative-algorithm",
                "@@ALGORITHM@@",
                "--speculative-draft-model-path",
                DEFAULT_DRAFT_MODEL_DFLASH,
            ],
        )

    @classmethod
    def tearDownClass(cls):
        kill_process_tree(cls.process.pid)

    def _post(self, sampling_params, extra):
        return requests.post(
            self.base_url + "/generate",
            json={
                "text": "The capital of France is",
                "sampling_params": {"temperature": 0, "max_new_tokens": 8, **sampling_params},
                **extra,
            },
            timeout=120,
        )

    def test_refused_options_return_400(self):
        for name, (sampling_params, extra) in REFUSED.items():
            with self.subTest(option=name):
                res = self._post(sampling_params, extra)
                self.assertEqual(res.status_code, 400, res.text)
                self.assertIn("@@ALGORITHM@@", res.text)
        # Still serving, and accepted options still work (a per-request seed, a grammar, the
        # penalties and min_new_tokens included: a regex-constrained reply matches the regex).
        accepted = (
            {},
            {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "sampling_seed": 1},
            {"temperature": 1.0, "regex": "(yes|no)"},
            {"temperature": 1.0, "top_k": 20, "top_p": 0.9, "min_p": 0.05},
            {"temperature": 1.0, "frequency_penalty": 0.5, "presence_penalty": 0.5},
            {"temperature": 1.0, "repetition_penalty": 1.2, "min_new_tokens": 4},
        )
        for params in accepted:
            res = self._post(params, {})
            self.assertEqual(res.status_code, 200, res.text)
            if "regex" in params:
                self.assertIn(res.json()["text"], ("yes", "no"))
        # Logprobs: one logprob and a top two per output token.
        res = self._post({"temperature": 1.0}, {"return_logprob": True, "top_logprobs_num": 2})
        self.assertEqual(res.status_code, 200, res.text)
        meta = res.json()["meta_info"]
        self.assertEqual(len(meta["output_token_logprobs"]), meta["completion_tokens"])
        self.assertTrue(all(len(top) == 2 for top in meta["output_top_logprobs"]))
        self.assertIsNone(self.process.poll())

    def test_bad_flag_refused_at_launch(self):
        from sglang.srt.server_args import prepare_server_args

        with self.assertRaisesRegex(ValueError, "speculative-ddtree"):
            prepare_server_args(
                [
                    "--model-path",
                    DEFAULT_TARGET_MODEL_DFLASH,
                    "--speculative-algorithm",
                    "EAGLE",
                    "--speculative-ddtree-topk",
                    "4",
                ]
            )


if __name__ == "__main__":
    unittest.main()
