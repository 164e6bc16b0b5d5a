"""The tests' injection into DDTREE's processes (`sglang_ddtree.testing.inject`), on the CPU:
nothing happens unless the environment names a change; the wrong-coins change scales exactly
the coins the accept draws (the accept then leaves the law: the e2e law test's power), and the
server's own modules carry no test switch."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sglang_ddtree.testing import inject

REPO = Path(__file__).resolve().parents[2]


def test_nothing_without_the_environment():
    assert inject.install_from_env({}) == []


def test_wrong_coins_scale_what_the_accept_draws(monkeypatch):
    from sglang_ddtree.srt import ddtree_step

    monkeypatch.setattr(ddtree_step, "draw_coins", ddtree_step.draw_coins)  # restored after
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    coins, final = ddtree_step.draw_coins(2, 5, "cpu", generator=g())
    assert inject.install_from_env({inject.WRONG_COINS_ENV: "0.5"}) == [inject.WRONG_COINS_ENV]
    scaled, scaled_final = ddtree_step.draw_coins(2, 5, "cpu", generator=g())
    assert torch.equal(scaled, coins * 0.5) and torch.equal(scaled_final, final)


def test_graph_stats_written_after_the_capture_and_every_decode_step(monkeypatch, tmp_path):
    """``GRAPH_STATS_ENV``: the worker's counts replace the file once its graphs are captured
    and after every decode step, each call's result unchanged (a stand-in worker module)."""
    import json
    import sys
    import types

    class Stats:
        def __init__(self):
            self.steps = 0

        def as_dict(self):
            return {"steps": self.steps}

    class Worker:
        def __init__(self):
            self.graph_stats = Stats()

        def init_cuda_graphs(self):
            return "captured"

        def _decode_step(self, batch):
            self.graph_stats.steps += 1
            return batch * 2

    module = types.ModuleType("ddtree_fake.ddtree_worker_v2")
    module.DDTreeWorkerV2 = Worker
    monkeypatch.setitem(sys.modules, "ddtree_fake", types.ModuleType("ddtree_fake"))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    path = tmp_path / "graph_stats.json"
    env = {inject.GRAPH_STATS_ENV: str(path)}
    assert inject.install_from_env(env, package="ddtree_fake") == [inject.GRAPH_STATS_ENV]
    worker = Worker()
    assert not path.exists()
    assert worker.init_cuda_graphs() == "captured"
    assert json.loads(path.read_text()) == {"steps": 0}  # before any request
    for step in (1, 2):
        assert worker._decode_step(21) == 42
        assert json.loads(path.read_text()) == {"steps": step}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_no_test_switch_in_the_server():
    """The worker, its glue and the core read no test-only variable and take no wrong-law knob."""
    for path in [*(REPO / "python/sglang_ddtree/srt").glob("*.py"),
                 *(REPO / "python/sglang_ddtree/core").glob("*.py")]:  # fmt: skip
        text = path.read_text()
        for word in ("coin_scale", "TEST_COIN", "RANK_SKEW", "GRAPH_STATS", "DDTREE_TESTING_"):
            assert word not in text, (path.name, word)


def test_a_spawned_process_gets_the_change(tmp_path):
    """The mechanism the e2e tools rely on: SGLang spawns its processes
    (``mp.set_start_method("spawn")``), and a spawned process imports the launching module again
    (``python -m``), so `install_from_env` at import reaches it; without the variable it does
    not."""
    import subprocess
    import sys

    (tmp_path / "launcher.py").write_text(
        "import multiprocessing as mp\n"
        "from sglang_ddtree.testing import inject\n"
        "inject.install_from_env()\n"
        "def child(q):\n"
        "    from sglang_ddtree.srt import ddtree_step\n"
        "    q.put(ddtree_step.draw_coins.__name__)\n"
        "if __name__ == '__main__':\n"
        "    mp.set_start_method('spawn', force=True)\n"
        "    q = mp.Queue()\n"
        "    p = mp.Process(target=child, args=(q,))\n"
        "    p.start()\n"
        "    print('child:', q.get(timeout=120))\n"
        "    p.join()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    for value, want in (("0.5", "scaled"), (None, "draw_coins")):
        run_env = dict(env)
        run_env.pop(inject.WRONG_COINS_ENV, None)
        if value is not None:
            run_env[inject.WRONG_COINS_ENV] = value
        out = subprocess.run(
            [sys.executable, "-m", "launcher"], env=run_env, capture_output=True, text=True,
            timeout=300, cwd=tmp_path,
        )  # fmt: skip
        assert f"child: {want}" in out.stdout, out.stdout + out.stderr[-2000:]
