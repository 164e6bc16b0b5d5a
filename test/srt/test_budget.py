"""CPU tests of the adaptive tree budget (`sglang_ddtree.srt.ddtree_budget`): parsing, refusals, bucket
lookup, the capture plan handed to the graph runner, and resolution from flags / env."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ddtree.srt import ddtree_args as dargs
from sglang_ddtree.srt.ddtree_budget import (
    SCHEDULE_ENV,
    SCHEDULE_FLAG,
    BudgetSchedule,
    capture_union,
    default_schedule,
    is_moe_target,
    resolve_schedule,
)

# SGLang's default decode capture list, cut at a typical --cuda-graph-max-bs.
SGLANG_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]


@pytest.fixture(autouse=True)
def no_schedule_env(monkeypatch):
    """``SGLANG_DDTREE_BUDGET_SCHEDULE`` unset unless a test sets it (the readers read
    ``os.environ`` through ``envs``, as SGLang's own do)."""
    monkeypatch.delenv(SCHEDULE_ENV, raising=False)


def test_parse_and_lookup():
    s = BudgetSchedule.parse(" 1:65, 8:33 ,32:17 ")
    assert (s.thresholds, s.num_nodes) == ((1, 8, 32), (65, 33, 17))
    assert str(s) == "1:65,8:33,32:17"
    assert [s.num_nodes_for(b) for b in (1, 7, 8, 31, 32, 1000)] == [65, 65, 33, 33, 17, 17]
    assert s.max_num_nodes == 65 and not s.is_fixed
    assert s.bucket_range(0) == (1, 7) and s.bucket_range(2) == (32, None)
    assert BudgetSchedule.parse(str(s)) == s


def test_fixed_is_one_bucket():
    s = BudgetSchedule.fixed(17)
    assert s.is_fixed and s.max_num_nodes == 17 and str(s) == "1:17"
    assert s.num_nodes_for(1) == s.num_nodes_for(4096) == 17
    assert s.buckets(SGLANG_BS) == [(17, SGLANG_BS)]


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "empty"),
        ("1:65,8", "min_batch_size:num_nodes"),
        ("1:65,x:33", "min_batch_size:num_nodes"),
        ("1:65:3", "min_batch_size:num_nodes"),
        ("2:65,8:33", "first budget-schedule threshold must be 1"),
        ("1:65,8:33,8:17", "must increase"),
        ("1:65,8:33,4:17", "must increase"),
        ("1:0", ">= 1"),
    ],
)
def test_parse_errors_say_what_to_pass(text, match):
    with pytest.raises(ValueError, match=match) as e:
        BudgetSchedule.parse(text)
    assert SCHEDULE_ENV in str(e.value)


def test_bs_below_one_is_refused():
    with pytest.raises(ValueError):
        BudgetSchedule.fixed(9).num_nodes_for(0)


def test_check_names_the_bucket_and_the_fix():
    s = BudgetSchedule.parse("1:33,8:17,32:5")
    errors = s.check(block_size=8)
    assert len(errors) == 1
    assert "W=5 for bs >= 32" in errors[0] and "below the drafter block size 8" in errors[0]
    assert "1:16,4:8" in errors[0]  # the default for B=8, valid
    first = BudgetSchedule.parse("1:7,4:9").check(8)[0]
    assert first.startswith(f"{SCHEDULE_ENV}: W=7 for bs 1..3")


def test_default_schedule():
    for b in (2, 8, 16):
        s = default_schedule(b)
        assert str(s) == f"1:{2 * b},4:{b}"
        assert s.check(b) == []
        assert s.max_num_nodes == 2 * b
        # W = B at bs >= 4: no request verifies fewer nodes than the chain's block.
        assert s.num_nodes_for(4) == s.num_nodes_for(512) == b
        assert all(w % b == 0 for w in s.num_nodes)  # multiples of the block, never one over


def test_default_schedule_of_moe_targets(monkeypatch):
    """Mixture-of-experts targets verify the chain's width, B, at every batch size."""
    for b in (2, 8, 16):
        s = default_schedule(b, moe=True)
        assert str(s) == f"1:{b}" and s.check(b) == [] and s.max_num_nodes == b
        assert s.num_nodes_for(1) == s.num_nodes_for(512) == b
    assert resolve_schedule(None, 8, moe=True) == default_schedule(8, moe=True)
    assert str(resolve_schedule(24, 8, moe=True)) == "1:24"
    # What is given wins over the default, for MoE targets as for dense ones.
    monkeypatch.setenv(SCHEDULE_ENV, "1:16,4:8")
    assert str(resolve_schedule(None, 8, moe=True)) == "1:16,4:8"


def test_is_moe_target():
    """Routed experts by any of the names the families use, also under ``text_config``."""
    from types import SimpleNamespace as Cfg

    assert is_moe_target(Cfg(n_routed_experts=384))  # DeepSeek-V3 / Kimi K2
    assert is_moe_target(Cfg(num_experts=128))  # Qwen3-MoE
    assert is_moe_target(Cfg(num_local_experts=8))  # Mixtral
    assert is_moe_target(Cfg(text_config=Cfg(num_experts=64)))  # a multimodal wrapper
    assert is_moe_target(Cfg(text_config={"n_routed_experts": 384}))  # Kimi K2.6, text as a dict
    assert not is_moe_target(Cfg(num_hidden_layers=36))  # Qwen3-8B
    assert not is_moe_target(Cfg(num_experts=0, n_routed_experts=None))


def test_buckets_example():
    s = BudgetSchedule.parse("1:65,8:33,32:17")
    plan = s.buckets(SGLANG_BS)
    # bs 5..7 pad to 7 (inserted), not to 8 (W=33); bs 25..31 pad to 31, not to 32.
    assert plan == [(65, [1, 2, 4, 7]), (33, [8, 12, 16, 24, 31]), (17, [32, 40, 48])]
    assert capture_union(plan) == [1, 2, 4, 7, 8, 12, 16, 24, 31, 32, 40, 48]


def test_bucket_above_max_captured_bs_is_empty():
    s = BudgetSchedule.parse("1:33,4:17,64:9")
    assert s.buckets([1, 2, 4, 8, 12, 16]) == [(33, [1, 2, 3]), (17, [4, 8, 12, 16]), (9, [])]


def test_e2e_adaptive_schedule_plan():
    # The e2e `adaptive` check: "1:33,4:17", block-8 drafter, --cuda-graph-max-bs 16.
    s = BudgetSchedule.parse("1:33,4:17")
    assert s.check(8) == []
    assert s.buckets([1, 2, 4, 8, 12, 16]) == [(33, [1, 2, 3]), (17, [4, 8, 12, 16])]


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 5))
    ts = sorted(draw(st.sets(st.integers(2, 80), min_size=n - 1, max_size=n - 1)))
    ws = draw(st.lists(st.integers(1, 130), min_size=n, max_size=n))
    return BudgetSchedule(thresholds=(1, *ts), num_nodes=tuple(ws))


@settings(deadline=None)  # timing-free: a loaded CI machine must not fail it
@given(schedules(), st.sets(st.integers(1, 96), min_size=1, max_size=12))
def test_padding_never_leaves_the_bucket(s, capture):
    """SGLang pads bs to the smallest captured size >= bs; that size must carry bs's W."""
    plan = s.buckets(capture)
    union = capture_union(plan)
    width_of = {bs: w for w, sizes in plan for bs in sizes}
    assert len(width_of) == sum(len(sizes) for _, sizes in plan)  # disjoint buckets
    assert max(union) == max(capture)  # the runner's max_bs is unchanged
    assert set(capture) <= set(union)  # every size SGLang asked for is still captured
    for bs in range(1, max(capture) + 1):
        padded = union[bisect.bisect_left(union, bs)]
        assert width_of[padded] == s.num_nodes_for(bs)
    for w, sizes in plan:
        assert sizes == sorted(sizes)
        assert all(s.num_nodes_for(bs) == w for bs in sizes)


@settings(deadline=None)
@given(schedules())
def test_str_roundtrip(s):
    assert BudgetSchedule.parse(str(s)) == s


def test_resolve_sources(monkeypatch):
    assert resolve_schedule(17, 8) == BudgetSchedule.fixed(17)
    assert resolve_schedule(None, 8) == default_schedule(8)
    monkeypatch.setenv(SCHEDULE_ENV, "  ")  # blank: unset
    assert resolve_schedule(17, 8) == BudgetSchedule.fixed(17)
    monkeypatch.setenv(SCHEDULE_ENV, "1:33,4:17")
    assert str(resolve_schedule(None, 8)) == "1:33,4:17"
    with pytest.raises(ValueError, match="ambiguous") as e:
        resolve_schedule(17, 8)
    assert "drop --speculative-num-draft-tokens" in str(e.value) and SCHEDULE_ENV in str(e.value)
    with pytest.raises(ValueError, match="below the drafter block size 20"):
        resolve_schedule(None, 20)


def test_fixed_w_below_block_keeps_the_flag_message():
    # A fixed W is checked by args.check_shape (the existing rule and message).
    s = resolve_schedule(4, 8)
    shape = dargs.DDTreeShape(num_nodes=s.max_num_nodes, block_size=8, topk=8)
    assert "--speculative-num-draft-tokens 16" in dargs.check_shape(shape)[0]


def test_a_bad_flag_value_names_the_flag_and_what_to_pass(monkeypatch):
    """A schedule given on the command line is refused in the flag's words (the env var is not
    what the user typed); one from the env var keeps naming the env var."""
    with pytest.raises(ValueError) as e:
        resolve_schedule(None, 8, flag="garbage")
    assert str(e.value) == (
        "--speculative-ddtree-budget-schedule: 'garbage' is not 'min_batch_size:num_nodes' "
        "(two integers); pass e.g. --speculative-ddtree-budget-schedule 1:65,8:33,32:17."
    )
    for flag, problem in (("2:16", "first budget-schedule threshold must be 1"),
                          ("1:16,1:8", "must increase"), ("1:0", ">= 1")):  # fmt: skip
        with pytest.raises(ValueError, match=problem) as e:
            resolve_schedule(None, 8, flag=flag)
        assert str(e.value).startswith(f"{SCHEDULE_FLAG}: ")
        assert f"pass e.g. {SCHEDULE_FLAG} " in str(e.value) and SCHEDULE_ENV not in str(e.value)
    with pytest.raises(ValueError) as e:
        resolve_schedule(None, 8, flag="1:4")  # W < B
    assert str(e.value).endswith(
        f"{SCHEDULE_FLAG}: W=4 for bs >= 1 is below the drafter block size 8; every W must be "
        f">= 8: pass e.g. {SCHEDULE_FLAG} 1:16,4:8."
    )
    with pytest.raises(ValueError, match="ambiguous") as e:
        resolve_schedule(17, 8, flag="1:33")
    assert f"drop {SCHEDULE_FLAG}" in str(e.value) and SCHEDULE_ENV not in str(e.value)
    # From the env var: its name and the env form of the fix.
    monkeypatch.setenv(SCHEDULE_ENV, "garbage")
    with pytest.raises(ValueError) as e:
        resolve_schedule(None, 8)
    assert str(e.value).startswith(f"{SCHEDULE_ENV}: 'garbage' is not")
    assert f"set e.g. {SCHEDULE_ENV}='1:65,8:33,32:17'" in str(e.value)
    assert SCHEDULE_FLAG not in str(e.value)
