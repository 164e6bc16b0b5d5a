"""Glue CUDA graphs (sglang_ddtree.srt.ddtree_glue_graph) and the step halves they capture (core.step).

CPU: the step halves equal their parts; SegmentGraphs runs CPU tensors eagerly. GPU (``gpu``
marker): a replay follows new copied inputs, recaptures when a bound input moves, runs a
side-effecting segment exactly once per call, falls back to eager when capture fails, and the
captured step halves equal eager runs over many random steps.
"""

from __future__ import annotations

import logging

import pytest
import torch

from sglang_ddtree.core.accept import accept_greedy
from sglang_ddtree.core.commit import commit_accepted
from sglang_ddtree.core.layout import flatten_verify_mask, scatter_verify_mask
from sglang_ddtree.core.step import accept_and_commit, draft_to_tree
from sglang_ddtree.core.tree import build_tree_from_candidates, select_candidates
from sglang_ddtree.srt.ddtree_glue_graph import SegmentGraphs, quiet_captures

HAS_CUDA = torch.cuda.is_available()
ALL = 1 << 30  # SGLang's top_k for "no top-k" (TOP_K_ALL); top_k 1 marks a greedy row
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def _tree_inputs(bs, block, hid, vocab, device, seed, pool=8, max_len=512):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(bs * block, hid, generator=g).to(device)
    lm_head = torch.randn(vocab, hid, generator=g).to(device)
    bonus = torch.randint(0, vocab, (bs,), generator=g).to(device)
    seq_lens = torch.randint(1, 200, (bs,), generator=g).to(device)
    req_pool_indices = torch.randperm(pool, generator=g)[:bs].to(device)
    req_to_token = torch.randint(0, 10_000, (pool, max_len), generator=g, dtype=torch.int32)
    return hidden, lm_head, bonus, seq_lens, req_pool_indices, req_to_token.to(device)


def _tree_case(bs, block, hid, vocab, budget, topk, seed):
    """`_tree_inputs` on the CPU, the step shape `make_tree_fns` reads, and the tree
    `draft_to_tree` builds from them (what the segment functions must reproduce)."""
    from types import SimpleNamespace

    inputs = _tree_inputs(bs, block, hid, vocab, "cpu", seed=seed)
    shape = SimpleNamespace(block_size=block, max_depth=block - 1, budget=budget)
    want = draft_to_tree(*inputs, block_size=block, max_depth=block - 1, budget=budget, topk=topk)
    return inputs, shape, want


@pytest.mark.parametrize("bs,block,budget", [(1, 4, 6), (3, 5, 9), (2, 8, 3)])
def test_draft_to_tree_matches_its_parts(bs, block, budget):
    vocab, hid, topk = 40, 16, 5
    hidden, lm_head, bonus, seq_lens, pool_idx, r2t = _tree_inputs(bs, block, hid, vocab, "cpu", 0)
    depth = min(block - 1, budget)
    out = draft_to_tree(
        hidden,
        lm_head,
        bonus,
        seq_lens,
        pool_idx,
        r2t,
        block_size=block,
        max_depth=depth,
        budget=budget,
        topk=topk,
    )
    logits = (hidden.view(bs, block, hid)[:, 1 : 1 + depth] @ lm_head.T).float()
    tree = build_tree_from_candidates(
        *select_candidates(logits, topk, normalize=True), bonus, budget
    )
    n = budget + 1
    assert torch.equal(out.tokens, tree.tokens)
    assert out.tokens.shape == (bs, n) and out.layout.tree_mask.shape == (bs, n, n)
    for b in range(bs):  # verify slots = req_to_token[req, prefix .. prefix + W)
        start = int(seq_lens[b])
        want = r2t[int(pool_idx[b]), start : start + n].to(torch.int64)
        assert torch.equal(out.verify_loc.view(bs, n)[b], want)
    total = int(sum(n * (int(p) + n) for p in seq_lens))
    flat = flatten_verify_mask(out.layout.tree_mask, seq_lens, total)
    assert torch.equal(scatter_verify_mask(out.layout.tree_mask, out.mask_cells, total), flat)


def test_draft_lm_head_is_one_gemm():
    """The drafter block's LM head is one [bs * D, H] x [H, V] GEMM, not a batched GEMM that
    reads the LM head once per request (measured: bs x 295 us on the 8B shape)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    bs, block, budget, vocab, hid = 4, 6, 9, 50, 16
    hidden, lm_head, bonus, seq_lens, pool_idx, r2t = _tree_inputs(bs, block, hid, vocab, "cpu", 1)
    with Ops() as ops:
        draft_to_tree(
            hidden, lm_head, bonus, seq_lens, pool_idx, r2t,
            block_size=block, max_depth=block - 1, budget=budget, topk=4,
        )  # fmt: skip
    gemms = [n for n in ops.names if n in ("mm", "bmm", "baddbmm", "addmm", "matmul")]
    assert gemms == ["mm"], gemms


def _random_tree(bs, n, vocab, seed, device="cpu"):
    """A random best-first tree (via the real builder) and logits over its nodes."""
    g = torch.Generator().manual_seed(seed)
    depth = 4
    lp = torch.randn(bs, depth, vocab, generator=g).log_softmax(-1).to(device)
    cand = select_candidates(lp, 4)
    roots = torch.randint(0, vocab, (bs,), generator=g).to(device)
    tree = build_tree_from_candidates(*cand, roots, n - 1)
    from sglang_ddtree.core.layout import tree_to_retrieve_arrays

    prefix = torch.randint(1, 50, (bs,), generator=g).to(device)
    layout = tree_to_retrieve_arrays(tree, prefix, max_depth=depth)
    # Logits that often agree with the draft: the node's first child token gets a boost.
    logits = torch.randn(bs * n, vocab, generator=g).to(device)
    child = layout.retrieve_next_token.clamp(min=0)
    boost_tok = torch.gather(tree.tokens, 1, child).reshape(-1)
    logits[torch.arange(bs * n, device=device), boost_tok] += 4.0
    return tree, layout, prefix, logits, depth + 1


def test_accept_and_commit_greedy_matches_its_parts():
    bs, n, vocab = 4, 9, 30
    tree, layout, prefix, logits, s = _random_tree(bs, n, vocab, 1)
    out = accept_and_commit(logits, tree.tokens, layout, prefix, accept_width=s)
    res = accept_greedy(layout, tree.tokens, logits.argmax(-1).view(bs, n), s)
    plan = commit_accepted(res, prefix, n)
    assert torch.equal(out.next_token_ids, plan.out_tokens.clamp(min=0).reshape(-1))
    assert torch.equal(out.keep_index, plan.keep_index)
    assert torch.equal(out.commit_lens, plan.commit_lens)
    assert torch.equal(out.new_seq_lens, prefix + plan.commit_lens)
    assert torch.equal(out.bonus, plan.bonus)
    assert out.accept_length.float().mean() > 0  # the boosted logits do accept drafts


def test_accept_and_commit_mixed_rows():
    """Rows with top_k <= 1 are greedy even in a sampled batch; sampled rows emit a path."""
    bs, n, vocab = 6, 9, 30
    tree, layout, prefix, logits, s = _random_tree(bs, n, vocab, 2)
    top_ks = torch.tensor([1, ALL, 1, ALL, 1, 40], dtype=torch.int32)
    temps = torch.tensor([1.0, 0.8, 1.0, 1.0, 1.0, 1.3])
    top_ps = torch.tensor([1.0, 0.9, 1.0, 1.0, 1.0, 0.95])
    args = (logits, tree.tokens, layout, prefix)
    sampled = dict(accept_width=s, temperatures=temps, top_ks=top_ks, top_ps=top_ps)
    torch.manual_seed(0)
    out = accept_and_commit(*args, **sampled)
    greedy = accept_and_commit(*args, accept_width=s)
    coins, final = torch.rand(bs, n), torch.rand(bs)
    given = [accept_and_commit(*args, **sampled, coins=coins, final_coins=final) for _ in "ab"]
    assert all(torch.equal(a, b) for a, b in zip(*given))  # given coins: deterministic
    rows = top_ks <= 1
    assert torch.equal(
        out.next_token_ids.view(bs, s)[rows], greedy.next_token_ids.view(bs, s)[rows]
    )
    assert torch.equal(out.accept_length[rows], greedy.accept_length[rows])
    # Sampled rows: kept nodes form a root-first path of parent -> child links.
    for b in torch.nonzero(~rows).flatten().tolist():
        k = int(out.accept_length[b])
        nodes = (out.keep_index[b, : k + 1] - b * n).tolist()
        assert nodes[0] == 0
        for parent, child in zip(nodes, nodes[1:]):
            assert int(tree.parents[b, child]) == parent


def test_cpu_tensors_run_eagerly():
    seg = SegmentGraphs("cpu", lambda x, y: x * 2 + y)
    for i in range(3):
        out = seg(("k",), {"x": torch.full((3,), float(i))}, {"y": torch.ones(3)})
        assert torch.equal(out, torch.full((3,), 2.0 * i + 1))
    assert seg.counts["eager"] == 3 and seg.counts["graph"] == 0 and not seg.entries
    assert seg.counts["capture_ms"] == 0.0


def test_output_nests_are_mapped_and_copied():
    """Outputs are allocated outside the graph pool by structure (NamedTuples inside tuples)."""
    from sglang_ddtree.srt.ddtree_glue_graph import _copy_tensors, _map_tensors

    tree, layout, prefix, logits, s = _random_tree(2, 5, 11, 4)
    src = (accept_and_commit(logits, tree.tokens, layout, prefix, accept_width=s), layout, None)
    dst = _map_tensors(torch.empty_like, src)
    assert type(dst[0]) is type(src[0]) and type(dst[1]) is type(layout) and dst[2] is None
    _copy_tensors(dst, src)
    for a, b in zip(dst[0] + dst[1], src[0] + src[1]):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()


def test_output_group_keys_share_buffers_of_one_layout():
    """`SegmentGraphs`' output buffers (allocated before a capture, CPU-checkable): keys of one
    output group with equal output layouts get the same buffers; another group, another
    layout or another container type gets its own; without ``outputs_by`` every key its own."""
    from sglang_ddtree.srt.ddtree_step import accept_output_group

    tree, layout, prefix, logits, s = _random_tree(2, 5, 11, 4)
    plan = accept_and_commit(logits, tree.tokens, layout, prefix, accept_width=s)
    grouped = SegmentGraphs("accept", lambda: None, outputs_by=accept_output_group)
    greedy = grouped._output_buffers((2, "greedy"), plan)
    sampled = grouped._output_buffers((2, "sampled", True, True, False), plan)
    assert sampled is greedy and type(greedy) is type(plan)
    assert all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(greedy, plan))
    assert grouped._output_buffers((3, "greedy"), plan) is not greedy  # another batch size
    wider = plan._replace(keep_index=torch.zeros(2, s + 1, dtype=plan.keep_index.dtype))
    assert grouped._output_buffers((2, "greedy"), wider) is not greedy  # another layout
    assert grouped._output_buffers((2, "greedy"), tuple(plan)) is not greedy  # another type
    own = SegmentGraphs("accept", lambda: None)
    assert own._output_buffers((2, "greedy"), plan) is not own._output_buffers((2, "x"), plan)


# ---------------------------------------------------------------------------------- GPU ----
@pytest.mark.gpu
@needs_cuda
def test_replay_follows_copied_inputs_and_recaptures_moved_bound(caplog):
    seg = SegmentGraphs("t", lambda x, y: (x * 2 + y).sum(-1, keepdim=True) + y)
    x = torch.randn(4, 8, device="cuda")
    with caplog.at_level(logging.INFO, logger="sglang_ddtree.srt.ddtree_glue_graph"):
        for _ in range(5):
            y = torch.randn(4, 1, device="cuda")  # a new tensor every step: copied, not bound
            x.normal_()  # bound: same memory, new content
            out = seg((4,), {"x": x}, {"y": y})
            assert torch.allclose(out, (x * 2 + y).sum(-1, keepdim=True) + y)
    assert seg.counts["captures"] == 1 and seg.counts["graph"] == 4
    # Every capture is logged (a server's log shows captures made while serving).
    assert caplog.text.count("glue graph t: captured key (4,)") == 1
    assert seg.counts["capture_ms"] > 0.0
    x2 = torch.randn(4, 8, device="cuda")  # the bound input moved: capture again
    out = seg((4,), {"x": x2}, {"y": y})
    assert torch.allclose(out, (x2 * 2 + y).sum(-1, keepdim=True) + y)
    assert seg.counts["recaptures"] == 1 and seg.counts["captures"] == 2
    out = seg(None, {"x": x}, {"y": y})  # key None: eager, nothing captured or replayed
    assert torch.allclose(out, (x * 2 + y).sum(-1, keepdim=True) + y)
    assert seg.counts["captures"] == 2 and seg.counts["graph"] == 4 and len(seg.entries) == 1
    # Within the startup capture's block a capture is logged at DEBUG only.
    caplog.clear()
    with (
        quiet_captures([seg]),
        caplog.at_level(logging.DEBUG, "sglang_ddtree.srt.ddtree_glue_graph"),
    ):
        seg((8,), {"x": torch.randn(8, 8, device="cuda")}, {"y": torch.randn(8, 1, device="cuda")})
    quiet = [r for r in caplog.records if "glue graph t: captured key (8,)" in r.getMessage()]
    assert [r.levelno for r in quiet] == [logging.DEBUG] and seg.counts["captures"] == 3


def test_quiet_captures_lowers_the_log_level_within_its_block_only():
    """The startup capture's keys log at DEBUG; before and after, and after an error inside,
    every segment logs its captures at its own level again."""
    a, b = SegmentGraphs("a", lambda x: x), SegmentGraphs("b", lambda x: x)
    b.capture_log_level = logging.WARNING
    with quiet_captures([a, b]):
        assert a.capture_log_level == b.capture_log_level == logging.DEBUG
    assert (a.capture_log_level, b.capture_log_level) == (logging.INFO, logging.WARNING)
    with pytest.raises(RuntimeError), quiet_captures([a]):
        raise RuntimeError("a batch size's capture failed")
    assert a.capture_log_level == logging.INFO


@pytest.mark.gpu
@needs_cuda
def test_outputs_survive_another_graphs_scratch():
    """Graph K (captured first) has a 4 MB scratch tensor; graph L (captured later, same pool)
    has a 4 MB output. Replaying K after L must not change L's output (in a shared pool L's
    output could take K's freed scratch block)."""
    pool = torch.cuda.graph_pool_handle()
    k = SegmentGraphs("k", lambda x: (x * 3.0).sum(0), pool=pool)
    l_seg = SegmentGraphs("l", lambda y: y + 1.0, pool=pool)
    x = torch.randn(1024, 1024, device="cuda")
    y = torch.randn(1024, 1024, device="cuda")
    k((1,), {"x": x})
    l_seg((1,), {"y": y})
    for _ in range(3):
        out = l_seg((1,), {"y": y})
        k((1,), {"x": x})
        assert torch.equal(out, y + 1.0)
    assert k.counts["graph"] == 3 and l_seg.counts["graph"] == 3


@pytest.mark.gpu
@needs_cuda
def test_side_effect_segment_runs_once_per_call():
    counter = torch.zeros(1, device="cuda")

    def bump(step):
        counter.add_(step)

    seg = SegmentGraphs("kv", bump, pure=False)
    step = torch.ones(1, device="cuda")
    for i in range(1, 6):
        seg((1,), {"step": step})
        torch.cuda.synchronize()
        assert counter.item() == i  # the capture call ran it once, each replay once more


@pytest.mark.gpu
@needs_cuda
def test_capture_failure_falls_back_to_eager(caplog):
    def host_sync(x):
        return x * float(x.sum().item())  # a device read: not capturable

    seg = SegmentGraphs("bad", host_sync)
    x = torch.ones(3, device="cuda")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert torch.equal(seg((3,), {"x": x}), torch.full((3,), 3.0, device="cuda"))
    assert seg.counts["capture_failures"] == 1 and seg.counts["graph"] == 0
    assert "capture failed" in caplog.text
    # No capture state is left behind: the RNG works and a later segment with RNG captures.
    torch.randn(4, device="cuda")
    noisy = SegmentGraphs("rng", lambda x: x + torch.rand_like(x))
    outs = [noisy((3,), {"x": x}).clone() for _ in range(4)]
    assert noisy.counts["graph"] == 3 and noisy.counts["capture_failures"] == 0
    assert not torch.equal(outs[2], outs[3])  # each replay draws new numbers


@pytest.mark.gpu
@needs_cuda
def test_sampled_accept_in_graph():
    """The worker's sampled accept (coins drawn eagerly, copied in) replayed from a graph equals
    the eager function on the same coins, step after step; greedy rows equal the greedy walk;
    fresh coins give varying accept lengths."""
    bs, n, vocab = 6, 17, 64
    tree, layout, prefix, logits, s = _random_tree(bs, n, vocab, 3, device="cuda")
    top_ks = torch.tensor([1, ALL, 1, ALL, ALL, 40], dtype=torch.int32, device="cuda")
    temps = torch.tensor([1.0, 1.0, 1.0, 0.7, 1.0, 1.2], device="cuda")
    top_ps = torch.full((bs,), 0.95, device="cuda")
    params = dict(temperatures=temps, top_ks=top_ks, top_ps=top_ps)
    flags = {"need_top_k": True, "need_top_p": True}

    def fn(logits, tokens, seq_lens, coins, final_coins, **rest):
        return accept_and_commit(
            logits, tokens, layout, seq_lens, accept_width=s, coins=coins,
            final_coins=final_coins, **rest,
        )  # fmt: skip

    seg = SegmentGraphs("sampled", fn)
    greedy = accept_and_commit(logits, tree.tokens, layout, prefix, accept_width=s)
    rows = (top_ks <= 1).cpu()
    lengths = set()
    for _ in range(20):
        coins, final = torch.rand(bs, n, device="cuda"), torch.rand(bs, device="cuda")
        bound = {"logits": logits, "tokens": tree.tokens, "seq_lens": prefix}
        out = seg((bs, "sampled"), bound, {"coins": coins, "final_coins": final, **params}, flags)
        ref = fn(**bound, coins=coins, final_coins=final, **params, **flags)
        for name, a, b in zip(out._fields, out, ref):
            assert torch.equal(a, b), name
        acc = out.accept_length.cpu()
        assert torch.equal(acc[rows], greedy.accept_length.cpu()[rows])
        lengths.add(tuple(acc[~rows].tolist()))
    assert seg.counts["graph"] == 19
    assert len(lengths) > 1  # fresh coins, different paths


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("bs", [1, 5])
def test_step_halves_graph_equals_eager(bs):
    """draft_to_tree + accept_and_commit (greedy) replayed from graphs == eager, 12 steps."""
    block, hid, vocab, budget, topk = 8, 64, 128, 20, 8
    base = _tree_inputs(bs, block, hid, vocab, "cuda", 0)
    hidden, lm_head, r2t = base[0].clone(), base[1], base[5]
    kw = dict(block_size=block, max_depth=block - 1, budget=budget, topk=topk)
    tree_seg = SegmentGraphs(
        "tree",
        lambda hidden, bonus, seq_lens, pool: draft_to_tree(
            hidden, lm_head, bonus, seq_lens, pool, r2t, **kw
        ),
    )
    logits = torch.empty(bs * (budget + 1), vocab, device="cuda")

    def accept(
        logits,
        tokens,
        seq_lens,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        positions,
        tree_mask,
    ):
        from sglang_ddtree.core.layout import TreeLayout

        lay = TreeLayout(
            retrieve_index, retrieve_next_token, retrieve_next_sibling, positions, tree_mask
        )
        return accept_and_commit(logits, tokens, lay, seq_lens, accept_width=block)

    acc_seg = SegmentGraphs("accept", accept)
    for step in range(12):
        _, _, bonus, seq_lens, pool, _ = _tree_inputs(bs, block, hid, vocab, "cuda", 100 + step)
        hidden.normal_()
        tree = tree_seg(
            (bs,), {"hidden": hidden}, {"bonus": bonus, "seq_lens": seq_lens, "pool": pool}
        )
        want = draft_to_tree(hidden, lm_head, bonus, seq_lens, pool, r2t, **kw)
        for name in ("tokens", "verify_loc", "mask_cells", "seq_lens"):
            assert torch.equal(getattr(tree, name), getattr(want, name)), (step, name)
        for a, b in zip(tree.layout, want.layout):
            assert torch.equal(a, b), step
        # Logits that follow the draft on some nodes, so paths of several lengths occur.
        logits.normal_()
        child = want.layout.retrieve_next_token.clamp(min=0)
        tok = torch.gather(want.tokens, 1, child).reshape(-1)
        logits[torch.arange(logits.shape[0], device="cuda"), tok] += 3.0
        bound = {
            "logits": logits,
            "tokens": tree.tokens,
            "seq_lens": tree.seq_lens,
            **tree.layout._asdict(),
        }
        got = acc_seg((bs,), bound)
        ref = accept_and_commit(logits, want.tokens, want.layout, seq_lens, accept_width=block)
        for name, a, b in zip(got._fields, got, ref):
            assert torch.equal(a, b), (step, name)
    assert tree_seg.counts["graph"] == 11 and acc_seg.counts["graph"] == 11


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("shared_outputs", [True, False])
def test_kv_segment_keeps_its_graph_when_batches_switch_mode(shared_outputs):
    """The worker's accept segment has one graph per mode (greedy, sampled), all writing the
    batch size's output buffers (`accept_output_group`), and the KV segment, keyed by the
    batch size, binds them. Batches of one size that alternate greedy / sampled (mixed
    traffic) must replay one KV graph, not recapture it every step and then give up on it, and
    each replay must read the mode that just ran. Per-mode outputs are the calibration: the KV
    graph recaptures, then goes eager."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_step import accept_mode, accept_output_group

    group = {"outputs_by": accept_output_group} if shared_outputs else {}
    acc = SegmentGraphs("accept", lambda x, scale: x * scale, **group)
    kv = SegmentGraphs("kv", lambda keep: keep.sum(), pure=False)
    x = torch.randn(8, device="cuda")
    greedy = SimpleNamespace(is_all_greedy=True)
    sampled = SimpleNamespace(
        is_all_greedy=False, need_top_k_sampling=False, need_top_p_sampling=True
    )
    for step in range(12):
        info = greedy if step % 2 == 0 else sampled
        mode = accept_mode(info)
        scale = 1.0 if mode == ("greedy",) else 2.0
        keep = acc((8, *mode), {"x": x}, static={"scale": scale})
        got = kv((8,), {"keep": keep})
        torch.testing.assert_close(got, (x * scale).sum())  # this step's mode, not the last
    if shared_outputs:
        assert (
            acc.counts["captures"] == 2 and len({id(e.outputs) for e in acc.entries.values()}) == 1
        )
        assert kv.counts["recaptures"] == 0 and kv.counts["captures"] == 1
        assert kv.counts["graph"] == 11 and not kv.eager_keys
    else:
        assert kv.counts["recaptures"] > 0 and kv.eager_keys == {(8,)}


def test_accept_mode_names_every_host_branch():
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_step import accept_mode

    assert accept_mode(None) == ("greedy",)
    assert accept_mode(SimpleNamespace(is_all_greedy=True)) == ("greedy",)
    modes = {
        accept_mode(SimpleNamespace(is_all_greedy=False, need_top_k_sampling=k,
                                    need_top_p_sampling=p, need_min_p_sampling=m))
        for k in (False, True) for p in (False, True) for m in (False, True)
    }  # fmt: skip
    # Four without min-p; with it every row on SGLang's sequential min-p path, the top-p pass
    # always (as SGLang), the top-k pass where some row has top-k: two modes.
    assert len(modes) == 6 and all(m[0] == "sampled" for m in modes)
    assert {m for m in modes if m[3]} == {
        ("sampled", False, True, True),
        ("sampled", True, True, True),
    }


def test_accept_tree_greedy_and_sampled_dispatch():
    """``ddtree_step.accept_tree`` (the step's accept decision) through an eager accept
    segment equals ``accept_and_commit`` directly: all-greedy batches (no sampling info) take
    the greedy walk; mixed batches draw their coins from the given generator."""
    from types import SimpleNamespace

    from sglang_ddtree.core.sampling import draw_coins
    from sglang_ddtree.core.step import draft_to_tree, make_accept_fn
    from sglang_ddtree.srt.ddtree_step import accept_tree

    bs, block, hid, vocab, budget = 3, 6, 16, 40, 10
    hidden, lm_head, bonus, seq_lens, pool_rows, req_to_token = _tree_inputs(
        bs, block, hid, vocab, "cpu", seed=7
    )
    tree = draft_to_tree(
        hidden, lm_head, bonus, seq_lens, pool_rows, req_to_token,
        block_size=block, max_depth=block - 1, budget=budget, topk=4,
    )  # fmt: skip
    w, s = budget + 1, block
    logits = torch.randn(bs * w, vocab, generator=torch.Generator().manual_seed(1))
    graphs = SegmentGraphs("accept", make_accept_fn(s), enabled=False)
    args = (logits, tree.tokens, tree.layout, tree.seq_lens)

    got = accept_tree(tree, logits, None, graphs, None, None)
    want = accept_and_commit(*args, accept_width=s)
    assert all(torch.equal(a, b) for a, b in zip(got, want))

    info = SimpleNamespace(
        is_all_greedy=False, need_top_k_sampling=True, need_top_p_sampling=True,
        temperatures=torch.tensor([1.0, 0.7, 1.0]), top_ks=torch.tensor([ALL, 1, 20]),
        top_ps=torch.tensor([0.95, 1.0, 1.0]),
    )  # fmt: skip
    got = accept_tree(tree, logits, info, graphs, None, torch.Generator().manual_seed(5))
    coins, final = draw_coins(bs, w, "cpu", generator=torch.Generator().manual_seed(5))
    want = accept_and_commit(
        *args, accept_width=s, temperatures=info.temperatures, top_ks=info.top_ks,
        top_ps=info.top_ps, coins=coins, final_coins=final,
    )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    greedy = accept_and_commit(*args, accept_width=s)
    assert torch.equal(got.accept_length[1], greedy.accept_length[1])  # top_k 1: greedy row
    # The mode the worker computed once per step is taken as given (same result, same key).
    mode = ("sampled", True, True, False)
    again = accept_tree(tree, logits, info, graphs, None, torch.Generator().manual_seed(5), mode)
    assert all(torch.equal(a, b) for a, b in zip(again, want))
    keys = []
    record = lambda key, bound, copied=None, static=None: keys.append(key)  # noqa: E731
    accept_tree(
        tree, logits, info, record, (bs,), torch.Generator(), ("sampled", False, True, False)
    )
    assert keys == [(bs, "sampled", False, True, False)]

    # SGLang's min-p path: the batch flag takes every row through top-k, top-p, then min-p,
    # with each row's min_p copied in.
    info_min_p = SimpleNamespace(
        **vars(info), need_min_p_sampling=True, min_ps=torch.tensor([0.3, 0.0, 0.5])
    )
    got = accept_tree(tree, logits, info_min_p, graphs, None, torch.Generator().manual_seed(5))
    want = accept_and_commit(
        *args, accept_width=s, temperatures=info.temperatures, top_ks=info.top_ks,
        top_ps=info.top_ps, coins=coins, final_coins=final, min_ps=info_min_p.min_ps,
        need_min_p=True,
    )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    keys.clear()
    accept_tree(tree, logits, info_min_p, record, (bs,), torch.Generator())
    assert keys == [(bs, "sampled", True, True, True)]


def test_verify_mask_is_sized_from_host_lengths():
    """The mask buffer holds every prefix the device may see: the reserved lengths first (they
    bound the device's under overlap), else the committed ones; neither is an error."""
    from types import SimpleNamespace

    from sglang_ddtree.core.layout import verify_mask_numel
    from sglang_ddtree.core.step import draft_to_tree
    from sglang_ddtree.srt.ddtree_step import verify_mask

    hidden, lm_head, bonus, seq_lens, pool_rows, req_to_token = _tree_inputs(2, 4, 8, 30, "cpu", 3)
    tree = draft_to_tree(
        hidden, lm_head, bonus, seq_lens, pool_rows, req_to_token,
        block_size=4, max_depth=3, budget=6, topk=3,
    )  # fmt: skip
    reserved = seq_lens.cpu() + 14
    batch = SimpleNamespace(seq_lens_cpu=seq_lens.cpu())
    mask = verify_mask(tree, batch, SimpleNamespace(reserved_seq_lens_cpu=reserved), 7)
    assert mask.numel() == verify_mask_numel(7, reserved) > verify_mask_numel(7, seq_lens.cpu())
    mask = verify_mask(tree, batch, SimpleNamespace(reserved_seq_lens_cpu=None), 7)
    assert mask.numel() == verify_mask_numel(7, seq_lens.cpu())
    # A graph's buffer holds fewer cells than the reserved lengths ask near the context limit:
    # the mask is cut to it, and every tree cell the device lengths place is still written.
    exact = verify_mask(tree, batch, SimpleNamespace(reserved_seq_lens_cpu=None), 7)
    need = verify_mask_numel(7, seq_lens.cpu())
    drafted = SimpleNamespace(reserved_seq_lens_cpu=reserved)
    cut = verify_mask(tree, batch, drafted, 7, capacity=need + 5)
    assert cut.numel() == need + 5 and torch.equal(cut[:need], exact)
    assert verify_mask(tree, batch, drafted, 7, capacity=10**9).numel() == verify_mask_numel(
        7, reserved
    )
    # A buffer too small for the device's own lengths: the scatter's bounds check fails.
    with pytest.raises(IndexError):
        verify_mask(tree, batch, drafted, 7, capacity=need - 1)
    with pytest.raises(RuntimeError, match="host sequence lengths"):
        verify_mask(
            tree, SimpleNamespace(seq_lens_cpu=None), SimpleNamespace(reserved_seq_lens_cpu=None), 7
        )


def test_rank_fingerprint_detects_any_disagreement():
    """Two simulated ranks: an all-reduce MAX of their fingerprints says they agree exactly
    when their trees and accepted paths are equal, also for a one-token difference and for
    differences that a plain sum would cancel."""
    from sglang_ddtree.core.fingerprint import rank_fingerprint, ranks_agree

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 163840, (4, 17), generator=g)
    path = torch.randint(0, 163840, (4 * 8,), generator=g)
    keep = torch.randint(-1, 68, (4, 8), generator=g)

    def agree(a, b):
        return bool(ranks_agree(torch.maximum(rank_fingerprint(*a), rank_fingerprint(*b))))

    same = (tokens, path, keep)
    assert agree(same, (tokens.clone(), path.clone(), keep.clone()))
    one = path.clone()
    one[5] += 1
    assert not agree(same, (tokens, one, keep))
    swapped = keep.clone()
    swapped[0, 1], swapped[0, 2] = keep[0, 2], keep[0, 1]  # same sum, other order
    assert bool((swapped != keep).any()) == (int(keep[0, 1]) != int(keep[0, 2]))
    if int(keep[0, 1]) != int(keep[0, 2]):
        assert not agree(same, (tokens, path, swapped))
    cancel = tokens.clone()
    cancel[0, 0] += 3
    cancel[1, 0] -= 3  # sums unchanged
    assert not agree(same, (cancel, path, keep))


def test_startup_modes_are_every_accept_mode():
    """The startup capture covers each accept-graph mode once, with placeholders that the
    step's own mode function reads as that mode."""
    from sglang_ddtree.srt.ddtree_glue_warmup import accept_modes, dummy_sampling_info
    from sglang_ddtree.srt.ddtree_step import accept_mode

    modes = accept_modes()
    assert len(set(modes)) == len(modes) == 7
    for mode in modes:
        info = dummy_sampling_info(mode, 3, "cpu")
        assert accept_mode(info) == mode
        if info is not None:
            assert info.temperatures.shape == (3, 1) and info.top_ks.dtype == torch.int32


def _seg(graph, eager, captures):
    """One glue segment's counts in the graph counts' file (`testing.inject`)."""
    return {"graph": graph, "eager": eager, "captures": captures, "capture_failures": 0}


def _adaptive_stats(glue: dict) -> dict:
    """Graph stats of an adaptive run whose verifies all replayed, with the glue counts given."""
    from sglang_ddtree.testing import e2e

    widths = {"33": {"graph": 5, "eager": 0}, "17": {"graph": 5, "eager": 0}}
    return {"by_width": widths, "width_mismatches": 0, "schedule": e2e.ADAPTIVE_SCHEDULE,
            "glue": glue}  # fmt: skip


def test_adaptive_check_fails_on_a_capture_while_serving():
    """The e2e adaptive check with glue graphs captured at startup: the segments serving used
    replay, and one capture after startup fails the check."""
    from sglang_ddtree.testing import e2e

    outputs = {bs: [[1, 2]] * bs for bs in e2e.ADAPTIVE_BATCH_SIZES}
    startup = {"glue": {"tree_w33": _seg(0, 3, 3), "accept_w33": _seg(0, 5, 5)}}
    stats = _adaptive_stats({"tree_w33": _seg(10, 3, 3), "accept_w33": _seg(0, 5, 5)})
    got = {"outputs": outputs, "accept": [2.0], "stats": stats, "startup_stats": startup}
    ok = e2e._adaptive_summary(outputs, got)
    assert ok["passed"] and ok["glue_captures_while_serving"] == 0
    assert list(ok["glue_graphs_ok"]) == ["tree_w33"]  # the unserved sampled mode is not judged
    stats["glue"]["tree_w33"] = _seg(10, 4, 4)  # one more capture after startup
    bad = e2e._adaptive_summary(outputs, got)
    assert not bad["passed"] and bad["glue_captures_while_serving"] == 1
    # The draft tree has a graph per captured size (keyed by the padded batch size) and the
    # KV commit one per batch size: at least as many.
    startup["glue"]["tree_w33"] = _seg(0, 4, 4)
    stats["glue"]["tree_w33"] = _seg(10, 4, 4)
    for kv_captures, ok in ((4, True), (9, True), (3, False)):
        startup["glue"]["kv_w33"] = _seg(0, kv_captures, kv_captures)
        stats["glue"]["kv_w33"] = _seg(10, kv_captures, kv_captures)
        check = e2e._adaptive_summary(outputs, got)
        assert check["passed"] is ok and check["kv_graph_per_batch_size"] == {"kv_w33": ok}
    del startup["glue"]["kv_w33"], stats["glue"]["kv_w33"]
    # No counts before the first request: fails.
    lazy_stats = {**stats, "glue": {"tree_w33": _seg(10, 3, 3), "accept_w33": _seg(10, 5, 5)}}
    lazy = {**got, "stats": lazy_stats, "startup_stats": None}
    assert not e2e._adaptive_summary(outputs, lazy)["passed"]


def test_startup_warns_when_the_glue_graphs_outgrow_what_was_held():
    """Within the slack: no warning. Beyond it: one naming the GiB taken, held and over, and
    what to lower; the e2e check's limit is the same one (one constant)."""
    from sglang_ddtree.srt.ddtree_glue_warmup import (
        GLUE_MEMORY_SLACK,
        glue_memory_excess,
        glue_memory_limit,
        glue_memory_warning,
    )
    from sglang_ddtree.testing import e2e

    assert e2e.glue_memory_limit is glue_memory_limit  # the check's edge is the warning's
    share, fixed = GLUE_MEMORY_SLACK
    gib = 2**30
    held = 8 * gib
    limit = held * (1 + share) + fixed * gib
    assert glue_memory_excess(int(limit) - 1, held) == 0
    assert glue_memory_warning(int(limit) - 1, held, 256) is None
    assert abs(glue_memory_excess(int(limit) + gib, held) - gib) <= 1  # float rounding of the limit
    # The measured start at max bs 256 on the Qwen3-8B shape: 9.29 GiB taken, 8.25 held.
    text = glue_memory_warning(int(9.29 * gib), int(8.25 * gib), 256)
    assert text is not None
    for part in ("9.29 GiB", "1.04 GiB more", "8.25 GiB held", "--cuda-graph-max-bs", "now 256"):
        assert part in text, (part, text)
    # e2e's check and the warning agree on the edge.
    within = {"memory_gib": (limit - 1) / gib, "reserved_gib": held / gib}
    assert e2e.glue_memory_check(within)["passed"]
    over = {"memory_gib": (limit + gib) / gib, "reserved_gib": held / gib}
    assert not e2e.glue_memory_check(over)["passed"]


def test_adaptive_check_fails_when_startup_capture_outgrows_what_was_held():
    """The startup capture's memory must fit in what the constructor held before the KV pool
    was sized (plus the stated slack); more fails the adaptive check."""
    from sglang_ddtree.srt.ddtree_glue_warmup import GLUE_MEMORY_SLACK
    from sglang_ddtree.testing import e2e

    share, fixed = GLUE_MEMORY_SLACK
    assert e2e.glue_memory_check(None) == {"passed": None}  # startup capture off
    assert e2e.glue_memory_check({"memory_gib": 0.2})["passed"] is False  # a number missing
    held = 0.5
    limit = held * (1 + share) + fixed
    assert e2e.glue_memory_check({"memory_gib": limit - 1e-3, "reserved_gib": held})["passed"]
    assert not e2e.glue_memory_check({"memory_gib": limit + 1e-3, "reserved_gib": held})["passed"]

    outputs = {bs: [[1, 2]] * bs for bs in e2e.ADAPTIVE_BATCH_SIZES}
    stats = _adaptive_stats({"tree_w33": _seg(10, 3, 3)})
    for grown, ok in ((held, True), (limit + 0.01, False)):
        at_start = {"tree_w33": _seg(0, 3, 3)}  # captured at startup, replayed while serving
        startup = {"glue": at_start, "startup": {"memory_gib": grown, "reserved_gib": held}}
        got = {"outputs": outputs, "accept": [2.0], "stats": stats, "startup_stats": startup}
        assert e2e._adaptive_summary(outputs, got)["passed"] is ok


def test_largest_keys_cover_each_width_at_its_largest_batch():
    """The glue memory held before the KV pool is sized is measured at these keys: for each W
    the largest batch size it serves within SGLang's graph range."""
    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_glue_warmup import largest_keys

    schedule = BudgetSchedule.parse("1:33,4:17,32:16")
    # Largest batch first, as the startup capture goes: measured in increasing order, each key
    # needed new blocks and the measure held far more than the startup capture took.
    assert largest_keys(schedule, 64) == [(64, 16), (31, 17), (3, 33)]
    assert largest_keys(schedule, 8) == [(8, 17), (3, 33)]  # the bs >= 32 bucket: no graphs
    assert largest_keys(schedule, 1) == [(1, 33)]
    assert largest_keys(BudgetSchedule.fixed(65), 16) == [(16, 65)]


# W -> accept width S of a three-bucket schedule, for the drafter-KV workspace's size.
KV_SCHEDULE = "1:33,4:17,32:16"
KV_ACCEPT_WIDTHS = ((33, 9), (17, 9), (16, 8))


def test_draft_kv_rows_is_the_largest_keys_accepted_path_rows():
    """DFLASH's fused drafter-KV materializer is sized in the constructor for the most rows one
    KV segment appends at startup: bs x S, the maximum over each W's largest batch size."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_glue_warmup import draft_kv_rows

    shapes = {w: SimpleNamespace(accept_width=s) for w, s in KV_ACCEPT_WIDTHS}
    schedule = BudgetSchedule.parse(KV_SCHEDULE)
    assert draft_kv_rows(schedule, shapes, 64) == max(64 * 8, 31 * 9, 3 * 9) == 512
    assert draft_kv_rows(schedule, shapes, 8) == 8 * 9  # W 16 starts above bs 8
    # A wider accepted path at a smaller batch can be the maximum.
    wide = {33: SimpleNamespace(accept_width=40), 17: SimpleNamespace(accept_width=9),
            16: SimpleNamespace(accept_width=2)}  # fmt: skip
    assert draft_kv_rows(schedule, wide, 64) == 31 * 9 == 279
    assert draft_kv_rows(schedule, shapes, 0) == 0  # no graphs: nothing to size


def test_presized_drafter_kv_workspace_is_not_grown_by_any_key(source):
    """The worker sizes the KV segment's own drafter-KV workspace with SGLang's own
    ``FusedKVMaterializeHelper._ensure_workspace`` (taken from pristine SGLang 0.5.17's source
    and run on the CPU) at ``draft_kv_rows``, reading the helper's ``flat_kv_weight_t`` dtype:
    after that, no key's KV segment (bs x S rows at any batch size up to the largest) makes
    SGLang reallocate it, so the startup capture allocates no workspace among its temporaries;
    one row more would."""
    import ast
    from types import SimpleNamespace

    from conftest import pristine_functions

    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_glue_warmup import draft_kv_rows

    path = "python/sglang/kernels/ops/speculative/fused_kv_materialize.py"
    text = source.read(path).decode()
    (cls,) = [n for n in ast.parse(text).body
              if isinstance(n, ast.ClassDef) and n.name == "FusedKVMaterializeHelper"]  # fmt: skip
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    assigned = {t.attr for n in ast.walk(methods["__init__"]) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute)}  # fmt: skip
    assert "flat_kv_weight_t" in assigned
    name = "FusedKVMaterializeHelper._ensure_workspace"
    ensure = pristine_functions(source, path, [name])[name]

    helper = SimpleNamespace(
        _workspace_capacity=0, _workspace_dtype=None, _proj_workspace=None, _k_workspace=None,
        _v_workspace=None, n_layers=2, layer_out_dim=16, num_kv_heads=2, head_dim=4,
        device="cpu", flat_kv_weight_t=torch.zeros(8, 64, dtype=torch.bfloat16),
    )  # fmt: skip
    schedule = BudgetSchedule.parse(KV_SCHEDULE)
    shapes = {w: SimpleNamespace(accept_width=s) for w, s in KV_ACCEPT_WIDTHS}
    rows = draft_kv_rows(schedule, shapes, 64)
    ensure(helper, rows, helper.flat_kv_weight_t.dtype)  # what the constructor does
    workspace = helper._k_workspace
    for bs in range(1, 65):
        ensure(helper, bs * shapes[schedule.num_nodes_for(bs)].accept_width, torch.bfloat16)
        assert helper._k_workspace is workspace
    ensure(helper, rows + 1, torch.bfloat16)
    assert helper._k_workspace is not workspace


def test_kv_segment_workspace_never_moves_when_dflash_grows_its_own(source):
    """The KV segment appends on a workspace of its own (`own_draft_kv_workspace`, SGLang
    0.5.17's pristine ``_ensure_workspace`` run on the CPU): DFLASH's prefill growing its
    helper's workspace past the presized rows (a long prefill chunk) replaces that helper's
    tensors, never the KV segment's, which every key's append reaches through
    `kv_commit_workspace`; an append above the presized rows (an eager step above the
    captured batch sizes) goes through DFLASH's helper. The weights are shared, not copied."""
    from types import SimpleNamespace

    from conftest import pristine_functions

    from sglang_ddtree.srt.ddtree_kv_commit import kv_commit_workspace, own_draft_kv_workspace

    path = "python/sglang/kernels/ops/speculative/fused_kv_materialize.py"
    name = "FusedKVMaterializeHelper._ensure_workspace"
    ensure = pristine_functions(source, path, [name])[name]

    class Helper(SimpleNamespace):
        _ensure_workspace = ensure

    dflash = Helper(
        _workspace_capacity=0, _workspace_dtype=None, _proj_workspace=None, _k_workspace=None,
        _v_workspace=None, n_layers=2, layer_out_dim=16, num_kv_heads=2, head_dim=4,
        device="cpu", flat_kv_weight_t=torch.zeros(8, 64, dtype=torch.bfloat16),
    )  # fmt: skip
    rows = 9 * 8
    own = own_draft_kv_workspace(dflash, rows)
    assert own.flat_kv_weight_t is dflash.flat_kv_weight_t
    bound = (own._proj_workspace, own._k_workspace, own._v_workspace)
    assert own._workspace_capacity == rows and all(t is not None for t in bound)
    assert dflash._k_workspace is None  # DFLASH's helper keeps its own (lazy) workspace
    worker = SimpleNamespace(_fused_kv_helper=dflash)

    ensure(dflash, 8192, torch.bfloat16)  # a long prefill chunk on DFLASH's helper
    for n in (8, rows):  # every captured key's append
        with kv_commit_workspace(worker, own, rows, n):
            assert worker._fused_kv_helper is own
            worker._fused_kv_helper._ensure_workspace(n, torch.bfloat16)
        assert worker._fused_kv_helper is dflash
    assert all(a is b for a, b in zip(bound, (own._proj_workspace, own._k_workspace,
                                                own._v_workspace)))  # fmt: skip
    with kv_commit_workspace(
        worker, own, rows, rows + 1
    ):  # above the captured keys: DFLASH's, eager
        assert worker._fused_kv_helper is dflash
    with kv_commit_workspace(worker, own, rows, 8):  # DFLASH's fused path failing drops the helper
        worker._fused_kv_helper = None
    assert worker._fused_kv_helper is None
    assert own_draft_kv_workspace(None, rows) is None and own_draft_kv_workspace(dflash, 0) is None


def test_commit_kv_keys_on_the_step_and_binds_the_kv_function_arguments():
    """The KV commit call (`DDTreeStep.commit_kv`, of the decode step and the startup capture):
    key = the step's key whatever the accept mode (every mode writes the batch size's outputs;
    None stays eager), bound names = the KV function's arguments, the segment the tree's W's."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_step import DDTreeStep

    calls = []
    t = torch.zeros(2, 3)
    commit = SimpleNamespace(keep_index=t, accept_length=t, commit_lens=t)
    tree = SimpleNamespace(tokens=t, verify_loc=t, seq_lens=t, req_pool_indices=t)
    record = lambda key, bound: calls.append((key, bound))  # noqa: E731
    segments = {3: {"tree": None, "accept": None, "kv": record}}
    step = DDTreeStep(segments, None, BudgetSchedule.fixed(3))
    step.mode = ("greedy",)  # as after an accept
    step.commit_kv((4,), t, commit, tree)
    step.commit_kv(None, t, commit, tree)
    assert [c[0] for c in calls] == [(4,), None]
    names = ("hidden", "keep_index", "accept_length", "commit_lens", "verify_loc", "seq_lens")
    assert tuple(calls[0][1]) == (*names, "pool_idx")


def test_glue_output_bytes_sum_every_key_buffers():
    """Per batch size one tree key and seven accept keys, each with its own copied inputs and
    all seven with one set of outputs; the W follows the schedule; every tensor may round up
    by one allocator block."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_glue_warmup import BLOCK, glue_output_bytes, nest_bytes

    schedule = BudgetSchedule.parse("1:33,4:17")
    per_width = {33: (1000.0, 10, 60.0, 3, 100.0, 8), 17: (500.0, 10, 30.0, 3, 50.0, 8)}
    got = glue_output_bytes(per_width, schedule, 5)  # seven accept modes a batch size
    want = sum(bs * (1000 + 60 + 7 * 100) for bs in (1, 2, 3)) + sum(
        bs * (500 + 30 + 7 * 50) for bs in (4, 5)
    )
    assert got == want + 5 * BLOCK * (10 + 3 + 7 * 8)
    nest = (
        SimpleNamespace(),
        (torch.zeros(3, 4), [torch.zeros(2, dtype=torch.int64)]),
        {"a": torch.zeros(1)},
    )
    assert nest_bytes(nest) == (3 * 4 * 4 + 2 * 8 + 4, 3)


def test_glue_working_set_runs_the_real_segments_on_placeholders(monkeypatch):
    """The constructor's measurement end to end on the CPU (the device's memory counters
    stubbed): it runs the real tree build and sampled accept at each W's largest batch size
    and sums the per-key buffers from their real output shapes."""
    from sglang_ddtree.srt import ddtree_glue_warmup as warm

    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 1234)
    worker = _fake_worker("cpu")
    schedule = worker.budget_schedule
    peak, key, per_width = warm.glue_working_set(worker, max_bs=4)
    assert peak == 1234 and key == (4, 5)  # the first W measured (largest batch) keeps the tie
    outputs = warm.glue_output_bytes(per_width, schedule, 4)

    # By hand, per request (S = 4): the tree's outputs are 6 int64 [W] rows (tokens, four
    # layout arrays, verify_loc), the bool [W, W] mask, the int64 [W, W] mask cells, two
    # int64 lengths, and three copied int64 inputs: 48 W + 9 W^2 + 40 bytes in 13 tensors.
    # The accept, measured in the min-p mode (the most any mode copies): its outputs, one set
    # per batch size, are 4 int64 [S] rows and two int32 and two int64 scalars of the commit
    # plan (32 S + 24 bytes in 8 tensors); each of the seven accept keys copies temperature,
    # top_k, top_p, min_p, final coin (4 bytes each) and coins [W] float32 (20 + 4 W bytes in 6
    # tensors).
    def per_request(w):
        return (48 * w + 9 * w * w + 40) + (32 * 4 + 24) + 7 * (20 + 4 * w)

    want = (1 + 2) * per_request(9) + (3 + 4) * per_request(5)
    want += 4 * warm.BLOCK * (13 + 8 + 7 * 6)
    assert outputs == want


def _fake_worker(device, schedule="1:9,3:5", vocab=64, hidden=16, block=4, dtype=torch.float32):
    """The worker surface the glue memory measurements read (`DDTreeWorkerV2`'s public
    fields and its step's `tree_fns` / `accept_fn`, here with the torch top-K and FlashInfer's
    nucleus): schedule, shapes, LM head."""
    from types import SimpleNamespace

    from sglang_ddtree.core.step import make_accept_fn, make_tree_fns
    from sglang_ddtree.srt.ddtree_args import DDTreeShape
    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule

    schedule = BudgetSchedule.parse(schedule)
    widths = sorted(set(schedule.num_nodes))
    shapes = {w: DDTreeShape(num_nodes=w, block_size=block, topk=4) for w in widths}
    weight = torch.randn(vocab, hidden, device=device).to(dtype)

    def tree_fns(shape, lm_head, req_to_token):
        k = shape.candidates_per_depth(vocab)
        return make_tree_fns(shape, vocab, k, "torch", lm_head=lm_head, req_to_token=req_to_token)

    return SimpleNamespace(
        device=torch.device(device),
        model_runner=SimpleNamespace(model_config=SimpleNamespace(vocab_size=vocab)),
        target_worker=SimpleNamespace(
            model_runner=SimpleNamespace(
                model=SimpleNamespace(lm_head=SimpleNamespace(weight=weight))
            )
        ),
        budget_schedule=schedule,
        ddtree_shapes=shapes,
        tp_size=1,
        ddtree_step=SimpleNamespace(
            tree_fns=tree_fns, accept_fn=lambda shape: make_accept_fn(shape.accept_width)
        ),
        glue_stream=torch.cuda.Stream() if device == "cuda" else None,
        tp_rank=0,
    )


def test_glue_output_bytes_skips_the_measured_batch_sizes():
    """The keys measured by capture hold their own buffers already: only the others add."""
    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_glue_warmup import glue_output_bytes

    schedule = BudgetSchedule.parse("1:33,4:17")
    per_width = {33: (1000.0, 10, 60.0, 3, 100.0, 8), 17: (500.0, 10, 30.0, 3, 50.0, 8)}
    every = glue_output_bytes(per_width, schedule, 5)
    one = {bs: glue_output_bytes(per_width, schedule, bs) - glue_output_bytes(per_width, schedule, bs - 1) for bs in range(1, 6)}  # fmt: skip
    assert (
        glue_output_bytes(per_width, schedule, 5, skip=frozenset({3, 5})) == every - one[3] - one[5]
    )
    assert glue_output_bytes(per_width, schedule, 5, skip=frozenset(range(1, 6))) == 0


def test_glue_capture_footprint_runs_every_segment_and_frees_them(monkeypatch):
    """The constructor's capture measurement end to end on the CPU (segments run eagerly there;
    the device's counters stubbed): the tree and the accept in every mode at each W's largest
    batch size, the growth read after them, and everything freed before it returns."""
    from sglang_ddtree.srt import ddtree_glue_warmup as warm

    reserved = {"n": 1 << 30}
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: reserved["n"])
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 7))
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: object())
    ran = []
    real_accept = warm.accept_tree

    def counting_accept(tree, logits, info, graphs, key, gen, mode):
        ran.append((tuple(tree.tokens.shape), tuple(logits.shape), key, mode))
        reserved["n"] += 1 << 20  # what the "captures" keep
        return real_accept(tree, logits, info, graphs, key, gen, mode)

    monkeypatch.setattr(warm, "accept_tree", counting_accept)
    worker = _fake_worker("cpu")
    kept = warm.glue_capture_footprint(worker, max_bs=4)
    assert kept == 14 << 20  # two keys x seven modes, 1 MiB each
    modes = warm.accept_modes()
    # Largest batch first, as the startup capture goes (the pool's blocks reused the same way).
    assert ran == [((4, 5), (20, 64), (4,), m) for m in modes] + [
        ((2, 9), (18, 64), (2,), m) for m in modes
    ]
    assert calls[-1] == "empty_cache"  # freed on the way out


def test_glue_reserve_holds_the_captured_footprint_or_says_it_fell_back(monkeypatch, caplog):
    """What the constructor holds: the captured footprint plus the unmeasured keys' buffers;
    if the measuring captures fail, the eager working set plus every key's buffers, with a
    warning (an estimate that undercounts must say so)."""
    import logging

    from sglang_ddtree.srt import ddtree_glue_warmup as warm

    per_width = {9: (100.0, 2, 6.0, 1, 10.0, 1), 5: (50.0, 2, 3.0, 1, 5.0, 1)}
    monkeypatch.setattr(warm, "glue_working_set", lambda w, m: (7000, (2, 9), per_width))
    monkeypatch.setattr(warm, "glue_capture_footprint", lambda w, m: 9000)
    worker = _fake_worker("cpu")
    schedule = worker.budget_schedule
    reserve = warm.GlueReserve(worker, 4)
    others = warm.glue_output_bytes(per_width, schedule, 4, skip=frozenset({2, 4}))
    assert reserve.nbytes == 9000 + others and reserve._held.numel() == reserve.nbytes
    assert 0 < others < reserve.outputs

    def fails(w, m):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(warm, "glue_capture_footprint", fails)
    with caplog.at_level(logging.WARNING):
        reserve = warm.GlueReserve(worker, 4)
    assert reserve.nbytes == 7000 + warm.glue_output_bytes(per_width, schedule, 4)
    assert reserve.captured is None and "could not measure them by capture" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_glue_capture_footprint_on_the_device_is_repeatable_and_freed():
    """On a GPU the measuring captures run for real: the footprint is positive and at least
    the eager working set, the same when measured twice on the same capture stream, and what
    it allocated goes back (but a per-stream workspace)."""
    from sglang_ddtree.srt import ddtree_glue_warmup as warm

    worker = _fake_worker("cuda", schedule="1:17,8:9", vocab=32000, hidden=256, block=8,
                          dtype=torch.bfloat16)  # fmt: skip
    peak, _, _ = warm.glue_working_set(worker, 16)  # also the kernels' first compile
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    first = warm.glue_capture_footprint(worker, 16)
    after = torch.cuda.memory_reserved()
    second = warm.glue_capture_footprint(worker, 16)
    again = torch.cuda.memory_reserved()
    # What stays: at most what a capture allocates once per stream (cuBLAS's workspace), and
    # nothing more on a second measurement on the same stream.
    assert after <= before + (64 << 20) and again <= after + (2 << 20), (before, after, again)
    assert first > 0 and first >= 0.9 * peak, (first, peak)
    assert first - (64 << 20) <= second <= first + (2 << 20), (first, second)


def test_e2e_greedy_difference_passes_only_as_a_nospec_near_tie():
    """The e2e greedy and adaptive checks compare DDTREE with the non-speculative engine token
    for token; a difference passes only where that engine's top two tokens after the common
    prefix are the two tokens, within ``NEAR_TIE_NATS``. The probe runs only on a difference,
    on prompt plus common prefix; a wider margin, a third token or a failed probe fails."""
    from sglang_ddtree.testing import e2e
    from sglang_ddtree.testing.near_tie import NEAR_TIE_NATS

    prompts = [[5, 6], [7, 8, 9]]
    base, tree = [[1, 2, 3], [4, 4, 4]], [[1, 2, 3], [4, 9, 4]]
    asked = []

    def probe_with(top2, margin):
        def probe(prefix):
            asked.append(prefix)
            return top2, margin

        return probe

    same = e2e._compare_outputs(base, base, prompts, probe_with([0, 0], 0.0))
    assert same["mismatches"] == 0 and e2e._rows_ok({"1": same}) and asked == []
    tie = e2e._compare_outputs(base, tree, prompts, probe_with([9, 4], NEAR_TIE_NATS / 2))
    assert asked == [[7, 8, 9, 4]]  # the prompt and the tokens both runs agree on
    assert tie["mismatches"] == 1 and tie["near_ties"] == 1 and e2e._rows_ok({"1": tie})
    assert tie["differences"][0]["prompt"] == 1 and tie["differences"][0]["tokens"] == [4, 9]
    for top2, margin in (([9, 4], 2 * NEAR_TIE_NATS), ([9, 7], 0.0)):
        bad = e2e._compare_outputs(base, tree, prompts, probe_with(top2, margin))
        assert bad["near_ties"] == 0 and not e2e._rows_ok({"1": bad}), bad

    def broken(prefix):
        raise RuntimeError("engine down")

    failed = e2e._compare_outputs(base, tree, prompts, broken)
    assert (
        not e2e._rows_ok({"1": failed}) and "engine down" in failed["differences"][0]["probe_error"]
    )
    assert not e2e._rows_ok({"1": e2e._compare_outputs(base, tree, prompts, None)})

    # Through the adaptive summary: the same outputs pass with a near-tie probe, fail without.
    outputs = {bs: base for bs in e2e.ADAPTIVE_BATCH_SIZES}
    served = {bs: tree for bs in e2e.ADAPTIVE_BATCH_SIZES}
    stats = _adaptive_stats({"tree_w33": _seg(10, 3, 3)})
    startup = {"glue": {"tree_w33": _seg(0, 3, 3)}}
    got = {"outputs": served, "accept": [2.0], "stats": stats, "startup_stats": startup}
    tie_probe = probe_with([4, 9], 0.001)
    assert e2e._adaptive_summary(outputs, got, prompts, tie_probe)["passed"]
    assert not e2e._adaptive_summary(outputs, got, prompts, None)["passed"]


def test_e2e_top2_probe_starts_one_engine_and_reads_its_top_logprobs(monkeypatch):
    """The probe starts the non-speculative engine once (none where nothing differs), reads
    the top two tokens and their logprob gap from SGLang's ``output_top_logprobs``, and after a
    failed start fails every later probe without starting again."""
    from contextlib import ExitStack, contextmanager

    from sglang_ddtree.testing import e2e

    starts, asked = [], []

    class FakeEngine:
        def generate(self, input_ids, sampling_params, return_logprob, top_logprobs_num):
            asked.append((input_ids, sampling_params["max_new_tokens"], top_logprobs_num))
            return {"meta_info": {"output_top_logprobs": [[(-0.5, 71, None), (-0.504, 70, None)]]}}

    @contextmanager
    def fake_engine(**kwargs):
        starts.append(kwargs.get("speculative_algorithm"))
        yield FakeEngine()

    monkeypatch.setattr(e2e, "engine", fake_engine)
    with ExitStack() as stack:
        probe = e2e._lazy_top2_probe(stack, "t", "d")
        assert starts == []
        for prefix in ([1, 2], [3]):
            top2, margin = probe(prefix)
            assert top2 == [71, 70] and abs(margin - 0.004) < 1e-9
    assert starts == [None] and asked == [([1, 2], 1, 2), ([3], 1, 2)]  # one no-spec engine

    @contextmanager
    def broken_engine(**kwargs):
        starts.append("broken")
        raise RuntimeError("out of memory")
        yield

    monkeypatch.setattr(e2e, "engine", broken_engine)
    with ExitStack() as stack:
        probe = e2e._lazy_top2_probe(stack, "t", "d")
        for _ in range(2):
            with pytest.raises(RuntimeError, match="out of memory"):
                probe([1])
    assert starts.count("broken") == 1


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_tree_segment_functions_build_the_tree_of_draft_to_tree(tp):
    """`make_tree_fns` (the worker's and the start-up measurement's draft-tree segments): one
    rank's ``tree`` is `draft_to_tree`; under tensor parallelism each rank's ``shard`` over its
    LM-head rows, stacked as the all-gather would, then ``tree``, builds the same tree. The
    request-to-token table is looked up at each call, not when the functions are made."""
    from sglang_ddtree.core.step import make_tree_fns

    vocab, topk = 41, 4
    inputs, shape, want = _tree_case(3, 6, 16, vocab, 10, topk, seed=11)
    hidden, lm_head, bonus, seq_lens, pool_rows, req_to_token = inputs
    pool = {"req_to_token": None}  # attached after the functions are made, as in the worker
    width = -(-vocab // tp)

    def rank_rows(r):  # this rank's LM-head rows and the global id of the first
        return lambda: (lm_head[r * width : (r + 1) * width], r * width)

    fns = [
        make_tree_fns(
            shape,
            vocab,
            topk,
            "torch",
            lm_head=lambda: lm_head,
            req_to_token=lambda: pool["req_to_token"],
            lm_head_shard=None if tp == 1 else rank_rows(r),
        )
        for r in range(tp)
    ]
    pool["req_to_token"] = req_to_token
    if tp == 1:
        assert set(fns[0]) == {"tree"}
        got = fns[0]["tree"](hidden, bonus, seq_lens, pool_rows)
    else:
        assert all(set(f) == {"shard", "tree"} for f in fns)
        gathered = torch.stack([f["shard"](hidden) for f in fns])
        got = fns[tp - 1]["tree"](gathered, bonus, seq_lens, pool_rows)
    assert torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.verify_loc, want.verify_loc)
    for name, a, b in zip(want.layout._fields, got.layout, want.layout):
        assert torch.equal(a, b), name
    pool["req_to_token"] = req_to_token + 1  # a later step's table reaches the same functions
    again = (
        fns[0]["tree"](hidden, bonus, seq_lens, pool_rows)
        if tp == 1
        else fns[0]["tree"](gathered, bonus, seq_lens, pool_rows)
    )
    assert torch.equal(again.verify_loc, want.verify_loc + 1)


def _rank_tree_fns(shape, vocab, topk, lm_head, req_to_token, tp):
    """Rank 0's draft-tree segment functions (`make_tree_fns`) and, under tensor parallelism,
    the other ranks' shard functions over their LM-head rows (what the all-gather collects)."""
    from sglang_ddtree.core.step import make_tree_fns

    width = -(-vocab // tp)
    fns = make_tree_fns(
        shape, vocab, topk, "torch", lm_head=lambda: lm_head, req_to_token=lambda: req_to_token,
        lm_head_shard=None if tp == 1 else (lambda: (lm_head[:width], 0)),
    )  # fmt: skip
    other_ranks = [
        make_tree_fns(
            shape, vocab, topk, "torch", lm_head=lambda: lm_head,
            req_to_token=lambda: req_to_token,
            lm_head_shard=(lambda r=r: (lm_head[r * width : (r + 1) * width], r * width)),
        )["shard"]
        for r in range(1, tp)
    ]  # fmt: skip
    return fns, other_ranks


@pytest.mark.parametrize("tp", [1, 2])
def test_step_drives_its_segments_as_a_decode_step_does(tp):
    """`DDTreeStep`'s phases (what a decode step and the startup capture run): its draft tree
    equals `draft_to_tree` (under tensor parallelism through the shard segment and the gather
    it is given), its accept equals `accept_tree` with its own coin generator, and its KV commit
    calls the KV segment with the step's mode in the key."""
    from types import SimpleNamespace

    from sglang_ddtree.core.sampling import draw_coins
    from sglang_ddtree.core.step import make_accept_fn
    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_step import DDTreeStep

    bs, block, vocab, budget, topk = 2, 5, 37, 8, 4
    inputs, shape, want = _tree_case(bs, block, 16, vocab, budget, topk, seed=21)
    hidden, lm_head, bonus, seq_lens, pool_rows, req_to_token = inputs
    fns, other_ranks = _rank_tree_fns(shape, vocab, topk, lm_head, req_to_token, tp)

    def gather(packed):  # what the all-gather hands every rank
        return torch.stack([packed, *(f(hidden) for f in other_ranks)])

    kv_calls = []
    segments = {name: SegmentGraphs(name, fn, enabled=False) for name, fn in fns.items()}
    segments["accept"] = SegmentGraphs("accept", make_accept_fn(block), enabled=False)
    segments["kv"] = lambda key, bound: kv_calls.append((key, sorted(bound)))
    w = budget + 1
    schedule = BudgetSchedule.fixed(w)
    glue = DDTreeStep({w: segments}, torch.Generator().manual_seed(4), schedule,
                      gather if tp > 1 else None)  # fmt: skip
    tree = glue.draft_tree(None, hidden, bonus, seq_lens, pool_rows)
    assert torch.equal(tree.tokens, want.tokens) and torch.equal(tree.verify_loc, want.verify_loc)

    logits = torch.randn(bs * w, vocab, generator=torch.Generator().manual_seed(2))
    info = SimpleNamespace(
        is_all_greedy=False, need_top_k_sampling=True, need_top_p_sampling=True,
        temperatures=torch.tensor([1.0, 0.8]), top_ks=torch.tensor([ALL, 10]),
        top_ps=torch.tensor([0.9, 1.0]),
    )  # fmt: skip
    mode = ("sampled", True, True, False)
    got = glue.accept(None, tree, logits, info, mode)
    coins, final = draw_coins(bs, w, "cpu", generator=torch.Generator().manual_seed(4))
    expect = accept_and_commit(
        logits, tree.tokens, tree.layout, tree.seq_lens, accept_width=block,
        temperatures=info.temperatures, top_ks=info.top_ks, top_ps=info.top_ps,
        coins=coins, final_coins=final,
    )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(got, expect))
    assert glue.mode == mode
    glue.commit_kv((bs,), torch.zeros(bs * w, 4), got, tree)
    assert kv_calls and kv_calls[0][0] == (bs,)
    glue.accept(None, tree, logits, None)  # no sampling info: the greedy mode, decided here
    assert glue.mode == ("greedy",)
    with pytest.raises(AssertionError):
        shard = {"tree": None, "accept": None, "kv": None, "shard": None}
        DDTreeStep({w: shard}, glue.coin_generator, schedule)


def test_padded_view_reads_the_padded_rows_of_a_static_buffer():
    """`padded_view`: the first rows of a larger buffer (as SGLang's padded graph replays and
    the padded glue graphs return them) seen with more rows over the same storage; None where
    the storage ends first or the rows are not contiguous. `leading_rows` cuts a nest of
    request-major tensors back to the real requests; `pad_rows` appends fill rows."""
    from collections import namedtuple

    from sglang_ddtree.core.padding import leading_rows, pad_rows, padded_view

    buf = torch.arange(30).view(10, 3)
    view = padded_view(buf[:4], 6)
    assert torch.equal(view, buf[:6]) and view.data_ptr() == buf.data_ptr()
    assert padded_view(buf[:4], 4) is not None and padded_view(buf[:4], 10) is not None
    assert padded_view(buf[:4], 11) is None  # past the storage
    assert padded_view(buf[:4].clone(), 6) is None  # a tensor of its own
    assert padded_view(buf[:4, :2], 6) is None  # not contiguous
    inner, outer = namedtuple("inner", "flat"), namedtuple("outer", "tokens inner")
    tokens, flat = torch.arange(12).view(6, 2), torch.arange(18)  # 6 requests, 2 and 3 rows
    cut = leading_rows(outer(tokens, inner(flat)), bs=4, rows=6)
    assert type(cut) is outer and type(cut.inner) is inner
    assert torch.equal(cut.tokens, tokens[:4]) and torch.equal(cut.inner.flat, flat[:12])
    padded = pad_rows(torch.tensor([3, 4], dtype=torch.int32), 4, 1 << 30)
    assert padded.tolist() == [3, 4, 1 << 30, 1 << 30] and padded.dtype == torch.int32


def test_accept_refuses_sampling_rows_that_are_not_the_batchs():
    """`accept_tree` with sampling parameters for another number of requests than the tree's
    (a stale or merged batch state): an assertion at the boundary, padded or not, never a
    request's row filled with the padding's defaults."""
    from types import SimpleNamespace

    from sglang_ddtree.core.step import make_accept_fn
    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_step import DDTreeStep, accept_tree

    bs, rows, block, vocab, budget, topk = 3, 5, 5, 37, 8, 4
    (hidden_buf, lm_head, bonus, seq_lens, pool_rows, req_to_token), shape, _ = _tree_case(
        rows, block, 16, vocab, budget, topk, seed=31
    )
    fns, _ = _rank_tree_fns(shape, vocab, topk, lm_head, req_to_token, 1)
    segments = {name: SegmentGraphs(name, fn, enabled=False) for name, fn in fns.items()}
    segments["accept"] = SegmentGraphs("accept", make_accept_fn(block), enabled=False)
    segments["kv"] = lambda key, bound: None
    schedule = BudgetSchedule.fixed(budget + 1)
    glue = DDTreeStep({budget + 1: segments}, torch.Generator().manual_seed(5), schedule)
    tree = glue.draft_tree(
        None, hidden_buf[: bs * block], bonus[:bs], seq_lens[:bs], pool_rows[:bs]
    )
    logits = torch.randn(bs * (budget + 1), vocab)
    short = SimpleNamespace(
        temperatures=torch.ones(bs - 1, 1), top_ks=torch.full((bs - 1,), 5),
        top_ps=torch.ones(bs - 1), min_ps=torch.zeros(bs - 1),
    )  # fmt: skip
    for key, mode in (
        (None, ("sampled", True, False, False)),
        ((bs,), ("sampled", True, True, True)),
    ):
        with pytest.raises(AssertionError):
            accept_tree(tree, logits, short, segments["accept"], key, None, mode, rows=rows)


def test_padded_size_is_sglangs_next_captured_size():
    """`padded_size`: the smallest captured size >= bs (SGLang's padding), None without a
    runner, without padding, or past the largest size."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_glue_graph import padded_size

    runner = SimpleNamespace(capture_bs=[1, 2, 4, 8, 10, 12], disable_padding=False)
    assert [padded_size(runner, b) for b in (1, 3, 8, 9, 11, 12)] == [1, 4, 8, 10, 12, 12]
    assert padded_size(runner, 13) is None and padded_size(None, 3) is None
    assert padded_size(SimpleNamespace(capture_bs=[1, 2, 4], disable_padding=True), 3) is None


@pytest.mark.parametrize("tp", [1, 2])
def test_step_at_padded_rows_gives_the_real_rows_results(tp):
    """`DDTreeStep` with ``rows`` (`DDTreeStep.glue_rows`): the draft tree and the accept
    run at the padded batch size, keyed by it, over the padded rows of the drafter's and the
    verify's static outputs (``hidden`` and the logits given as their first rows), and return
    the real requests' rows: equal to the unpadded step's (greedy exactly; sampled, equal to
    the real rows' accept with the coins the padded draw gave them). A ``hidden`` with no
    padded rows behind it runs at the real size."""
    from types import SimpleNamespace

    from sglang_ddtree.core.sampling import draw_coins
    from sglang_ddtree.core.step import make_accept_fn
    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_step import DDTreeStep

    bs, rows, block, vocab, budget, topk = 3, 5, 5, 37, 8, 4
    w = budget + 1
    (hidden_buf, lm_head, bonus, seq_lens, pool_rows, req_to_token), shape, _ = _tree_case(
        rows, block, 16, vocab, budget, topk, seed=31
    )
    fns, other = _rank_tree_fns(shape, vocab, topk, lm_head, req_to_token, tp)
    keys = []

    def recorded(name, fn):
        seg = SegmentGraphs(name, fn, enabled=False)

        def call(key, *args, **kwargs):
            keys.append((name, key))
            return seg(key, *args, **kwargs)

        return call

    def glue(seed):
        segments = {name: recorded(name, fn) for name, fn in fns.items()}
        segments["accept"] = recorded("accept", make_accept_fn(block))
        segments["kv"] = lambda key, bound: None

        def gather(packed):  # the other ranks' candidates over the same (padded) rows
            n = packed.shape[0]
            return torch.stack([packed, *(f(padded_hidden[: n * block]) for f in other)])

        generator = torch.Generator().manual_seed(seed)
        return DDTreeStep({w: segments}, generator, BudgetSchedule.fixed(w),
                          gather if tp > 1 else None)  # fmt: skip

    padded_hidden = hidden_buf
    hidden = hidden_buf[: bs * block]  # what the drafter's padded replay returns
    real = (bonus[:bs], seq_lens[:bs], pool_rows[:bs])
    want = glue(5).draft_tree(None, hidden, *real)
    padded_glue = glue(5)
    keys.clear()
    tree = padded_glue.draft_tree((bs,), hidden, *real, rows=rows)
    assert {k for _, k in keys} == {(rows,)}
    for name, a, b in zip(want._fields, tree, want):
        if name == "layout":
            assert all(torch.equal(x, y) for x, y in zip(a, b))
        else:
            assert torch.equal(a, b), name

    logits_buf = torch.randn(rows * w, vocab, generator=torch.Generator().manual_seed(6))
    logits = logits_buf[: bs * w]  # the verify's padded replay, first rows
    keys.clear()
    got = padded_glue.accept((bs,), tree, logits, None, rows=rows)
    assert keys == [("accept", (rows, "greedy"))]
    expect = glue(5).accept(None, want, logits, None)
    assert all(torch.equal(a, b) for a, b in zip(got, expect))

    info = SimpleNamespace(
        is_all_greedy=False, need_top_k_sampling=True, need_top_p_sampling=True,
        temperatures=torch.tensor([[1.0], [0.8], [1.2]]), top_ks=torch.tensor([ALL, 10, 3]),
        top_ps=torch.tensor([0.9, 1.0, 0.7]),
    )  # fmt: skip
    mode = ("sampled", True, True, False)
    got = padded_glue.accept((bs,), tree, logits, info, mode, rows=rows)
    # The padded draw continues the padded glue's generator after its greedy step (none drawn).
    coins, final = draw_coins(rows, w, "cpu", generator=torch.Generator().manual_seed(5))
    expect = accept_and_commit(
        logits, want.tokens, want.layout, want.seq_lens, accept_width=block,
        temperatures=info.temperatures.view(-1), top_ks=info.top_ks, top_ps=info.top_ps,
        coins=coins[:bs], final_coins=final[:bs],
    )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(got, expect))
    assert got.out_tokens.shape[0] == bs

    keys.clear()  # no padded rows behind the hidden states: the real size, the accept too
    alone = padded_glue.draft_tree((bs,), hidden.clone(), *real, rows=rows)
    assert {k for _, k in keys} == {(bs,)} and torch.equal(alone.tokens, want.tokens)
    padded_glue.accept((bs,), alone, logits, None, rows=rows)
    assert keys[-1] == ("accept", (bs, "greedy")) and padded_glue.tree_rows is None


@pytest.mark.gpu
@needs_cuda
def test_padded_glue_graphs_serve_every_batch_size_of_a_captured_size():
    """On the GPU, with capture: batches of 3 and 4 requests padded to 4 (``rows``) over one
    static buffer each for the drafter's hidden states and the verify's logits (as SGLang's
    padded replays hand them over) replay ONE tree graph and one greedy accept graph, and
    every step's real rows equal the unpadded eager step's; 8 steps alternating the size."""
    from sglang_ddtree.core.step import make_accept_fn, make_tree_fns
    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.srt.ddtree_step import DDTreeStep

    rows, block, vocab, budget, topk = 4, 5, 37, 8, 4
    w = budget + 1
    (hidden_buf, lm_head, bonus, seq_lens, pool_rows, req_to_token), shape, _ = _tree_case(
        rows, block, 16, vocab, budget, topk, seed=41
    )
    cuda = [t.cuda() for t in (hidden_buf, lm_head, bonus, seq_lens, pool_rows, req_to_token)]
    hidden_buf, lm_head, bonus, seq_lens, pool_rows, req_to_token = cuda
    fns = make_tree_fns(
        shape, vocab, topk, "torch", lm_head=lambda: lm_head, req_to_token=lambda: req_to_token
    )

    def glue(enabled):
        segments = {"tree": SegmentGraphs("tree", fns["tree"], enabled=enabled)}
        segments["accept"] = SegmentGraphs("accept", make_accept_fn(block), enabled=enabled)
        segments["kv"] = lambda key, bound: None
        generator = torch.Generator(device="cuda").manual_seed(1)
        return DDTreeStep({w: segments}, generator, BudgetSchedule.fixed(w))

    padded, eager = glue(True), glue(False)
    logits_buf = torch.empty(rows * w, vocab, device="cuda")
    for step in range(8):
        bs = 3 if step % 2 == 0 else 4
        hidden_buf.normal_()
        logits_buf.normal_()
        hidden, logits = hidden_buf[: bs * block], logits_buf[: bs * w]
        real = (bonus[:bs], seq_lens[:bs], pool_rows[:bs])
        tree = padded.draft_tree((bs,), hidden, *real, rows=rows)
        want = eager.draft_tree(None, hidden, *real)
        assert torch.equal(tree.tokens, want.tokens) and torch.equal(
            tree.verify_loc, want.verify_loc
        )
        got = padded.accept((bs,), tree, logits, None, rows=rows)
        expect = eager.accept(None, want, logits, None)
        assert all(torch.equal(a, b) for a, b in zip(got, expect)), step
    tree_seg, accept_seg = padded.segments[w]["tree"], padded.segments[w]["accept"]
    assert set(tree_seg.entries) == {(rows,)}
    assert set(accept_seg.entries) == {(rows, "greedy")}
    assert tree_seg.counts["graph"] == 7 and not tree_seg.eager_keys
