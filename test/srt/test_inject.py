"""The tests' injection into DDTREE's processes (`sglang_ddtree.testing.inject`), on the CPU:
nothing happens unless the environment names a change; the wrong-coins change scales exactly
the coins the accept draws (the accept then leaves the law: the e2e law test's power), and the
server's own modules carry no test switch."""

from __future__ import annotations

from pathlib import Path

import torch

from sglang_ddtree.testing import inject

REPO = Path(__file__).resolve().parents[2]


def test_nothing_without_the_environment():
    assert inject.install_from_env({}) == []


def test_wrong_coins_scale_what_the_accept_draws(monkeypatch):
    from sglang_ddtree.srt import ddtree_utils

    monkeypatch.setattr(ddtree_utils, "draw_coins", ddtree_utils.draw_coins)  # restored after
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    coins, final = ddtree_utils.draw_coins(2, 5, "cpu", generator=g())
    assert inject.install_from_env({inject.WRONG_COINS_ENV: "0.5"}) == [inject.WRONG_COINS_ENV]
    scaled, scaled_final = ddtree_utils.draw_coins(2, 5, "cpu", generator=g())
    assert torch.equal(scaled, coins * 0.5) and torch.equal(scaled_final, final)


def test_no_test_switch_in_the_server():
    """The worker, its glue and the core read no test-only variable and take no wrong-law knob."""
    for path in [*(REPO / "python/sglang_ddtree/srt").glob("*.py"),
                 *(REPO / "python/sglang_ddtree/core").glob("*.py")]:  # fmt: skip
        text = path.read_text()
        for word in ("coin_scale", "TEST_COIN", "RANK_SKEW", "GRAPH_STATS", "DDTREE_TESTING_"):
            assert word not in text, (path.name, word)
