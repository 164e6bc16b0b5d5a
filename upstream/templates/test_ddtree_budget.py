"""@@ALGORITHM@@'s tree budget by batch size: the schedule's buckets, the defaults for dense
and mixture-of-experts targets, and the messages of a malformed or contradictory setting; its
environment variables, fields of ``envs`` refused at start when they do not parse.
"""

import unittest

from sglang.srt.environ import envs
from sglang.srt.speculative.ddtree_args import invalid_env_settings, read_topk
from sglang.srt.speculative.ddtree_budget import (
    SCHEDULE_ENV,
    BudgetSchedule,
    default_schedule,
    resolve_schedule,
)
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=5, stage="base-b", runner_config="1-gpu-small")


class TestDDTreeBudget(CustomTestCase):
    def test_buckets(self):
        s = BudgetSchedule.parse(" 1:65, 8:33 ,32:17")
        self.assertEqual(str(s), "1:65,8:33,32:17")
        want = {1: 65, 7: 65, 8: 33, 31: 33, 32: 17, 4096: 17}
        self.assertEqual({bs: s.num_nodes_for(bs) for bs in want}, want)
        self.assertEqual(s.max_num_nodes, 65)
        self.assertTrue(BudgetSchedule.fixed(16).is_fixed)

    def test_defaults(self):
        self.assertEqual(str(default_schedule(8)), "1:16,4:8")  # dense: 2B at bs 1-3, then B
        self.assertEqual(str(default_schedule(8, moe=True)), "1:8")  # MoE: B everywhere
        self.assertEqual(str(resolve_schedule(None, 8)), "1:16,4:8")
        self.assertEqual(str(resolve_schedule(24, 8)), "1:24")
        with envs.SGLANG_DDTREE_BUDGET_SCHEDULE.override("1:16,8:8"):
            self.assertEqual(str(resolve_schedule(None, 8)), "1:16,8:8")

    def test_bad_settings_say_what_to_pass(self):
        for text in ("", "1:16,x", "2:16", "1:16,1:8", "1:0"):
            with self.assertRaises(ValueError) as cm:
                BudgetSchedule.parse(text)
            self.assertIn(SCHEDULE_ENV if text in ("", "1:16,x") else "e.g.", str(cm.exception))
        with envs.SGLANG_DDTREE_BUDGET_SCHEDULE.override("1:16"):
            with self.assertRaises(ValueError):  # a schedule and a fixed W together: ambiguous
                resolve_schedule(24, 8)

    def test_env_values_are_checked_at_start(self):
        self.assertEqual(SCHEDULE_ENV, "SGLANG_DDTREE_BUDGET_SCHEDULE")
        with envs.SGLANG_DDTREE_TOPK.override(4):
            self.assertEqual(invalid_env_settings(), [])
            self.assertEqual(read_topk(), 4)
            with self.assertRaisesRegex(ValueError, "disagree"):
                read_topk(flag=5)
        with envs.SGLANG_DDTREE_TOPK.override("eight"):  # get() would warn and read 8
            self.assertEqual(
                invalid_env_settings(),
                ["SGLANG_DDTREE_TOPK='eight' is not an integer; set it to e.g. 8."],
            )


if __name__ == "__main__":
    unittest.main()
