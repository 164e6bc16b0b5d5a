"""committed_logprobs against a per-token replay of SGLang's non-speculative server (CPU).

The reference, `sglang_token_logprobs`, handles one committed token at a time the way the
non-speculative server would have produced it: the tokens generated before it are the emitted
ones and the committed ones before it; it finds the tree node whose path is exactly those
committed tokens (by parent pointers, not by the accepted path), replays SGLang's penalizers over
the generated tokens on that node's raw logits (`test_penalties.sglang_replay_row`), then runs
the sampler's logprob steps on that one row (in place, as ``Sampler.forward``: divide by the
temperature, softmax, log; ``log_softmax`` for an all-greedy batch), clamps, gathers and takes
``topk``.

Sample sizes: 32 random batches (`test_penalties.Case`: bs 1-8, budget 1-32, draft depth 1-8,
V 50-300, emitted tokens repeated on the paths; target logits pushed toward each node's children
so the accepted paths run deep), a quarter of them all-greedy (greedy walk, no temperature), the
rest sampled (temperatures in [0.5, 1.5], target-only tree sampling with fixed coins), top_n 0-6:
308 committed tokens, 157 of them predicted by a draft node. Each is compared bit for bit (its
logprob and the top values; top ids by the logprob they name). `test_wrong_variants_are_caught`
runs four deliberately wrong readings (the predicting node one too deep or one too shallow, the
raw logits without penalties, the temperature left out of a sampled batch) over the same
batches and requires each to differ in at least a third of them; the all-greedy batches, given
temperature 0.7, must differ when read as sampled batches.

The serving path (`write_step_logprobs`: one max and log-sum a predicting row, the tokens' own
logits) is compared with `committed_logprobs` within `ATOL` / `RTOL`, as SGLang's scheduler code
reads it, and its Triton kernels with torch under the interpreter and on a GPU.
"""

import pytest
import torch
from test_penalties import Case, path_tokens, sglang_replay_row

from sglang_ddtree.core.accept import accept_greedy, accept_sampled_reference
from sglang_ddtree.core.commit import commit_accepted
from sglang_ddtree.core.logprobs import committed_logprobs
from sglang_ddtree.core.sampling import draw_coins, target_probs

NUM_CASES = 32
CHILD_BOOST = 10.0  # target logit added to each node's children's tokens: paths run deep
FLOAT32_MIN = torch.finfo(torch.float32).min


class Step:
    """One verify step: a `test_penalties.Case` batch, accepted and committed."""

    def __init__(self, seed: int):
        case = Case(1000 + seed)
        gen = torch.Generator().manual_seed(seed)
        tree, bs, w = case.tree, *case.tree.tokens.shape
        for b in range(bs):  # the target agrees with the draft often enough to go deep
            for c in range(1, w):
                if bool(tree.valid[b, c]):
                    case.logits[b, int(tree.parents[b, c]), int(tree.tokens[b, c])] += CHILD_BOOST
        self.case = case
        self.raw = case.logits
        self.processed = case.apply()
        self.all_greedy = seed % 4 == 0
        self.top_n = int(torch.randint(0, 7, (), generator=gen))
        self.temperature = (
            torch.ones(bs) if self.all_greedy else torch.rand(bs, generator=gen) + 0.5
        )
        width = int(tree.depths.max()) + 1
        if self.all_greedy:
            predict = self.processed.argmax(-1)
            result = accept_greedy(case.layout, tree.tokens, predict, width, backend="torch")
        else:
            no_top_k, no_top_p = torch.zeros(bs, dtype=torch.int64), torch.ones(bs)
            probs = target_probs(self.processed, self.temperature, no_top_k, no_top_p)
            coins, final = draw_coins(bs, w, "cpu", generator=gen)
            result = accept_sampled_reference(case.layout, tree.tokens, probs, coins, final, width)
        self.plan = commit_accepted(result, torch.zeros(bs, dtype=torch.int64), w)

    def got(self, logits=None, keep_nodes=None, **kw):
        kw = dict(all_greedy=self.all_greedy) | kw
        return committed_logprobs(
            self.processed if logits is None else logits,
            self.plan.keep_nodes if keep_nodes is None else keep_nodes,
            self.plan.out_tokens,
            self.temperature,
            self.top_n,
            **kw,
        )


def sglang_token_logprobs(step: Step, b: int, j: int):
    """(token logprob, top values [n], top ids [n]) of committed token j of request b."""
    case, tree = step.case, step.case.tree
    committed = step.plan.out_tokens[b, :j].tolist()
    nodes = [
        v
        for v in range(tree.tokens.shape[1])
        if bool(tree.valid[b, v]) and path_tokens(tree, b, v) == committed
    ]
    assert len(nodes) == 1, (b, j, nodes)
    p = case.penalties
    row = sglang_replay_row(
        step.raw[b, nodes[0]],
        case.emitted[b].tolist() + committed,
        float(p.frequency_penalty[b]),
        float(p.presence_penalty[b]),
        float(p.repetition_penalty[b]),
        int(p.min_new_tokens[b]),
        p.stop_token_ids[b].tolist(),
    )
    logits = row[None].clone()  # the sampler's next_token_logits row, float32
    if step.all_greedy:
        logprobs = torch.nn.functional.log_softmax(logits, dim=-1)
    else:
        logits.div_(step.temperature[b].view(1, 1))
        logits[:] = torch.softmax(logits, dim=-1)
        logprobs = torch.log(logits)
    logprobs.clamp_(min=FLOAT32_MIN)
    token = int(step.plan.out_tokens[b, j])
    values, ids = logprobs.topk(step.top_n, dim=-1)
    return logprobs[0, token], values[0], ids[0], logprobs[0]


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def matches(step: Step, got) -> bool:
    """Every committed token bit for bit; pads as documented."""
    bs, s = step.plan.out_tokens.shape
    for b in range(bs):
        n = int(step.plan.commit_lens[b])
        for j in range(s):
            if j >= n:
                if got.token_logprobs[b, j] != 0 or bool((got.top_ids[b, j] != -1).any()):
                    return False
                continue
            token_logprob, values, ids, row = sglang_token_logprobs(step, b, j)
            if not torch.equal(bits(got.token_logprobs[b, j]), bits(token_logprob)):
                return False
            if not torch.equal(bits(got.top_logprobs[b, j]), bits(values)):
                return False
            top = got.top_ids[b, j]
            if len(set(top.tolist())) != step.top_n:
                return False
            if not torch.equal(bits(row[top]), bits(values)):  # ties may order ids either way
                return False
    return True


@pytest.fixture(scope="module")
def steps():
    return [Step(seed) for seed in range(NUM_CASES)]


def test_matches_the_non_speculative_server(steps):
    for seed, step in enumerate(steps):
        got = step.got()
        bs, s = step.plan.out_tokens.shape
        assert got.token_logprobs.shape == (bs, s) and got.token_logprobs.dtype == torch.float32
        assert got.top_ids.shape == got.top_logprobs.shape == (bs, s, step.top_n)
        assert matches(step, got), f"case {seed}"


def test_cases_exercise_the_mapping(steps):
    """Deep paths (tokens predicted by draft nodes, not the root), both kinds of batches, pads,
    and top_n 0."""
    deep = sum(int((s.plan.commit_lens - 1).clamp(min=0).sum()) for s in steps)
    padded = sum(int((s.plan.out_tokens < 0).sum()) for s in steps)
    greedy = sum(s.all_greedy for s in steps)
    assert deep >= 100 and padded >= 20 and 0 < greedy < NUM_CASES, (deep, padded, greedy)
    assert any(s.top_n == 0 for s in steps) and any(s.top_n > 0 for s in steps)


def _one_too_deep(keep_nodes: torch.Tensor) -> torch.Tensor:
    """Token j read from node j + 1 (its own node; the bonus from the last accepted one)."""
    shifted = torch.cat([keep_nodes[:, 1:], keep_nodes[:, -1:]], dim=1)
    return torch.where((shifted >= 0) | (keep_nodes < 0), shifted, keep_nodes)


def _one_too_shallow(keep_nodes: torch.Tensor) -> torch.Tensor:
    """Token j read from node j - 1 (the root for the first token)."""
    shifted = torch.cat([keep_nodes[:, :1], keep_nodes[:, :-1]], dim=1)
    return torch.where(keep_nodes >= 0, shifted, keep_nodes)


WRONG_VARIANTS = {
    "predicting node one too deep": lambda s: s.got(keep_nodes=_one_too_deep(s.plan.keep_nodes)),
    "predicting node one too shallow": lambda s: s.got(
        keep_nodes=_one_too_shallow(s.plan.keep_nodes)
    ),
    "raw logits (penalties not applied)": lambda s: s.got(logits=s.raw),
    "temperature left out of a sampled batch": lambda s: s.got(before_temperature=True),
}


def test_wrong_variants_are_caught(steps):
    caught = {name: 0 for name in WRONG_VARIANTS}
    for step in steps:
        for name, variant in WRONG_VARIANTS.items():
            caught[name] += not matches(step, variant(step))
    assert all(n >= NUM_CASES // 3 for n in caught.values()), caught


def test_temperature_in_an_all_greedy_batch_is_caught(steps):
    """All-greedy batches use temperature 1 here; give them another one and reading them as a
    sampled batch must differ in every such batch that commits a token."""
    greedy = [s for s in steps if s.all_greedy]
    for step in greedy:
        step.temperature = torch.full_like(step.temperature, 0.7)
        try:
            assert matches(step, step.got()), "all-greedy batches ignore the temperature"
            assert not matches(step, step.got(all_greedy=False))
        finally:
            step.temperature = torch.ones_like(step.temperature)


def test_underflow_reports_the_float32_minimum():
    """A token 200 logits below the top: its probability underflows to 0 in a sampled batch and
    SGLang reports the float32 minimum (log of 0, clamped); log_softmax would give about -200,
    and so it does in an all-greedy batch."""
    logits = torch.zeros(1, 1, 4)
    logits[0, 0, 3] = -200.0
    nodes, tokens = torch.tensor([[0]]), torch.tensor([[3]])
    sampled = committed_logprobs(logits, nodes, tokens, torch.ones(1), top_n=4)
    assert float(sampled.token_logprobs[0, 0]) == FLOAT32_MIN
    assert float(sampled.top_logprobs[0, 0, -1]) == FLOAT32_MIN
    greedy = committed_logprobs(logits, nodes, tokens, torch.ones(1), top_n=4, all_greedy=True)
    assert -201.5 < float(greedy.token_logprobs[0, 0]) < -200.0


def test_hand_computed_chain():
    """A chain root -> a -> b, accepted whole, then the bonus: three committed tokens, predicted
    by the root, a and b in that order; top-1 at each is the argmax of that node."""
    logits = torch.log(
        torch.tensor(
            [
                [[0.5, 0.25, 0.125, 0.125]],  # root: predicts token 1 (logprob log 0.25)
                [[0.125, 0.125, 0.25, 0.5]],  # a: predicts token 3 (log 0.5)
                [[0.25, 0.5, 0.125, 0.125]],  # b: the bonus 0 (log 0.25)
            ]
        ).transpose(0, 1)
    )  # [1, 3, 4]
    keep_nodes = torch.tensor([[0, 1, 2, -1]])
    out_tokens = torch.tensor([[1, 3, 0, -1]])
    got = committed_logprobs(logits, keep_nodes, out_tokens, torch.ones(1), top_n=1)
    want = torch.log(torch.tensor([0.25, 0.5, 0.25]))
    torch.testing.assert_close(got.token_logprobs[0, :3], want)
    assert got.top_ids[0, :, 0].tolist() == [0, 3, 1, -1]
    assert got.token_logprobs[0, 3] == 0 and got.top_logprobs[0, 3, 0] == 0


# The serving path (`write_step_logprobs`: one max and log-sum a predicting row) against the
# reference (`committed_logprobs`: the sampler's log of a softmax, or log_softmax): the same
# numbers up to float32 rounding, which these bounds hold with room (measured: 5e-7 on the
# committed tokens, 3e-5 on values near -100 in a sampled batch's subnormal tail).
ATOL, RTOL = 1e-5, 1e-6


def close(got, want) -> bool:
    got, want = torch.as_tensor(got, dtype=torch.float32), torch.as_tensor(want)
    return got.shape == want.shape and torch.allclose(got, want, atol=ATOL, rtol=RTOL)


def same_top(values, ids, want_values, row) -> bool:
    """The top-n values are the reference's, and each id names its value in the reference row
    (tied tokens may come in either order)."""
    return close(values, want_values) and len(set(ids)) == len(ids) and close(row[ids], values)


def test_step_logprobs_are_read_by_the_scheduler_as_the_core_reports_them(steps):
    """`write_step_logprobs` on the verify's [bs * W, V] logits: the scheduler's reads of a
    speculative batch (``next_token_logprobs[i][j]``, top-n and requested ids at row
    ``i * S + j``, for j below request i's commit length) give `committed_logprobs`' values
    (to `ATOL` / `RTOL`), each request's top-n cut to its own ``top_logprobs_num``; a request
    asking ids gets their logprobs at its predicting node. Calibration: the rows read one too
    deep differ."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_logprobs import write_step_logprobs

    checked = 0
    for seed, step in enumerate(steps):
        bs, w, vocab = step.processed.shape
        s = step.plan.out_tokens.shape[1]
        want = committed_logprobs(step.processed, step.plan.keep_nodes, step.plan.out_tokens,
                                  step.temperature, vocab, all_greedy=step.all_greedy)  # fmt: skip
        top_nums = [(seed + i) % 4 for i in range(bs)]
        token_ids = [[1, 2] if i % 2 else None for i in range(bs)]
        out = SimpleNamespace()
        write_step_logprobs(
            out, step.processed.reshape(bs * w, vocab),
            step.plan.keep_nodes, step.plan.next_token_ids, step.temperature, step.all_greedy,
            top_nums, token_ids,
        )  # fmt: skip
        assert out.next_token_logprobs.shape == (bs, s)
        for i in range(bs):
            for j in range(int(step.plan.commit_lens[i])):
                flat = i * s + j
                assert close(out.next_token_logprobs[i, j], want.token_logprobs[i, j])
                k = top_nums[i]
                row = predicting_row(step, i, int(step.plan.keep_nodes[i, j]))
                if any(top_nums):
                    got_top = out.next_token_top_logprobs_val[flat].tolist()
                    got_ids = out.next_token_top_logprobs_idx[flat].tolist()
                    assert same_top(got_top, got_ids, want.top_logprobs[i, j, :k], row), (
                        seed, i, j,
                    )  # fmt: skip
                if token_ids[i] is not None:
                    got = out.next_token_token_ids_logprobs_val[flat].tolist()
                    assert close(got, row[[1, 2]])
                    assert out.next_token_token_ids_logprobs_idx[flat] == [1, 2]
                checked += 1
        deeper = SimpleNamespace()
        write_step_logprobs(
            deeper, step.processed.reshape(bs * w, vocab),
            _one_too_deep(step.plan.keep_nodes), step.plan.next_token_ids, step.temperature,
            step.all_greedy, None, None,
        )  # fmt: skip
        if int((step.plan.commit_lens > 1).sum()):  # a draft node to misread
            assert not torch.equal(deeper.next_token_logprobs, out.next_token_logprobs), seed
    assert checked >= 300, checked


PROCESSOR = "SchedulerBatchResultProcessor"


def _pristine_scheduler_reads(source):
    """From pristine SGLang 0.5.17's source (`conftest.pristine_functions`):
    ``GenerationBatchResult.copy_to_cpu`` (the overlap scheduler's copy of a step's outputs,
    with its ``_async_d2h``), and the batch result processor's ``_normalize_decode_outputs`` and
    ``_apply_decode_logprobs`` (a decode step's logprobs into each request)."""
    from conftest import pristine_functions

    copy = "GenerationBatchResult.copy_to_cpu"
    utils = pristine_functions(source, "python/sglang/srt/managers/utils.py", ["_async_d2h", copy])
    proc = pristine_functions(
        source,
        "python/sglang/srt/managers/scheduler_components/batch_result_processor.py",
        [f"{PROCESSOR}._normalize_decode_outputs", f"{PROCESSOR}._apply_decode_logprobs"],
    )
    return (
        utils[copy],
        proc[f"{PROCESSOR}._normalize_decode_outputs"],
        proc[f"{PROCESSOR}._apply_decode_logprobs"],
    )


def _scheduler_reads(reads, step, keep_nodes, top_nums, token_ids, accepted):
    """Each request's logprob record after SGLang's scheduler code (``reads``:
    `_pristine_scheduler_reads`) took in `write_step_logprobs`' output for ``step`` read at
    ``keep_nodes``."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_logprobs import write_step_logprobs

    copy_to_cpu, normalize, apply = reads
    bs, w, vocab = step.processed.shape
    out = SimpleNamespace(
        next_token_top_logprobs_val=None, next_token_top_logprobs_idx=None,
        next_token_token_ids_logprobs_val=None, next_token_token_ids_logprobs_idx=None,
        input_token_logprobs=None, hidden_states=None,
    )  # fmt: skip
    write_step_logprobs(
        out, step.processed.reshape(bs * w, vocab),
        keep_nodes, step.plan.next_token_ids, step.temperature, step.all_greedy,
        top_nums, token_ids,
    )  # fmt: skip
    assert not any(torch.is_tensor(v) for v in out.next_token_top_logprobs_val)
    assert not any(torch.is_tensor(v) for v in out.next_token_token_ids_logprobs_val or [])
    result = SimpleNamespace(
        logits_output=out, next_token_ids=step.plan.next_token_ids, accept_lens=None,
        block_accept_lens=None, cap_lens=None, routed_experts_output=None,
        indexer_topk_output=None, expert_distribution_metrics=None,
        copy_done=SimpleNamespace(record=lambda: None),
    )  # fmt: skip
    copy_to_cpu(result, return_logprob=True)
    batch = SimpleNamespace(
        spec_algorithm=SimpleNamespace(is_none=lambda: False), return_logprob=True
    )
    processor = SimpleNamespace(_resolve_spec_v2_tokens=lambda r, b: accepted)
    ids, logprobs = normalize(processor, batch=batch, result=result,
                              logits_output=out, next_token_ids=None)  # fmt: skip
    reqs = []
    for i in range(bs):
        log = SimpleNamespace(
            top_logprobs_num=top_nums[i], token_ids_logprob=token_ids[i],
            output_token_logprobs_val=[], output_token_logprobs_idx=[],
            output_top_logprobs_val=[], output_top_logprobs_idx=[],
            output_token_ids_logprobs_val=[], output_token_ids_logprobs_idx=[],
        )  # fmt: skip
        req = SimpleNamespace(logprob=log)
        apply(processor, req=req, i=i, batch=batch, next_token_id=ids[i],
              next_token_logprobs=logprobs, logits_output=out)  # fmt: skip
        reqs.append(log)
    return reqs


def test_sglang_s_scheduler_reads_the_step_logprobs_as_the_core_reports_them(steps, source):
    """SGLang 0.5.17's own scheduler code (`_pristine_scheduler_reads`: the overlap copy, then
    the decode step's logprob normalization and per-request append) on `write_step_logprobs`'
    output: each request's appended logprobs, top-n (values and ids) and requested ids'
    logprobs are `committed_logprobs`' for its committed tokens (to `ATOL` / `RTOL`). The
    top-n and ids entries are not device tensors, so the copy takes none of them one by one.
    Calibration: the same reads of the logprobs of the rows one too deep differ."""
    reads = _pristine_scheduler_reads(source)
    checked = caught = 0
    for seed, step in enumerate(steps):
        bs, w, vocab = step.processed.shape
        want = committed_logprobs(step.processed, step.plan.keep_nodes, step.plan.out_tokens,
                                  step.temperature, vocab, all_greedy=step.all_greedy)  # fmt: skip
        top_nums = [1 + (seed + i) % 4 for i in range(bs)]
        token_ids = [[2, 1] if i % 2 else None for i in range(bs)]
        accepted = [step.plan.out_tokens[i, : int(step.plan.commit_lens[i])].tolist()
                    for i in range(bs)]  # fmt: skip

        reqs = _scheduler_reads(reads, step, step.plan.keep_nodes, top_nums, token_ids, accepted)
        for i, log in enumerate(reqs):
            n = len(accepted[i])
            assert log.output_token_logprobs_idx == accepted[i]
            assert close(log.output_token_logprobs_val, want.token_logprobs[i, :n]), seed
            k = top_nums[i]
            assert len(log.output_top_logprobs_val) == len(log.output_top_logprobs_idx) == n
            rows = [predicting_row(step, i, int(step.plan.keep_nodes[i, j])) for j in range(n)]
            for j, row in enumerate(rows):
                assert same_top(log.output_top_logprobs_val[j], log.output_top_logprobs_idx[j],
                                want.top_logprobs[i, j, :k], row), (seed, i, j)  # fmt: skip
            if token_ids[i] is not None:
                assert close(log.output_token_ids_logprobs_val, [r[[2, 1]].tolist() for r in rows])
                assert log.output_token_ids_logprobs_idx == [[2, 1]] * n
            checked += n
        if int((step.plan.commit_lens > 1).sum()):  # a draft node to misread
            deeper = _scheduler_reads(
                reads, step, _one_too_deep(step.plan.keep_nodes), top_nums, token_ids, accepted
            )
            caught += any(a.output_top_logprobs_val != b.output_top_logprobs_val
                          for a, b in zip(deeper, reqs))  # fmt: skip
    assert checked >= 300, checked
    assert caught >= 10, caught


def predicting_row(step, i: int, node: int) -> torch.Tensor:
    """Request i's reported logprob row at ``node`` (the sampler's rule, clamped)."""
    from sglang_ddtree.core.logprobs import node_logprobs

    row = node_logprobs(step.processed[i, node], step.temperature[i].view(1), step.all_greedy)
    return row.clamp(min=FLOAT32_MIN)


def test_prefill_with_logprobs_passes_dflash_s_door_and_the_target_gets_the_batch():
    """DFLASH's forward refuses a batch asking for logprobs; through `prefill_with_logprobs` it
    runs on a copy without the flag while the target worker's forward receives the batch
    itself (flag set), its result comes back, and the target worker's method is its own again
    afterwards, also when the prefill raises. Without it, the door refuses (calibration)."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_logprobs import prefill_with_logprobs

    class Target:
        def __init__(self):
            self.seen = []

        def forward_batch_generation(self, batch, capture_hidden_mode=None):
            self.seen.append((batch, capture_hidden_mode))
            return "result"

    target = Target()

    def dflash_forward(batch):  # the door, then the target's forward, as DFLASH's prefill
        if getattr(batch, "return_logprob", False):
            raise ValueError("DFLASH speculative decoding does not support return_logprob yet.")
        return target.forward_batch_generation(batch, capture_hidden_mode="FULL")

    batch = SimpleNamespace(return_logprob=True, seq_lens=torch.tensor([5]))
    with pytest.raises(ValueError, match="return_logprob"):
        dflash_forward(batch)
    assert prefill_with_logprobs(dflash_forward, target, batch) == "result"
    assert target.seen == [(batch, "FULL")] and batch.return_logprob
    assert "forward_batch_generation" not in vars(target)

    def failing(b):
        target.forward_batch_generation(b)
        raise RuntimeError("prefill failed")

    with pytest.raises(RuntimeError, match="prefill failed"):
        prefill_with_logprobs(failing, target, batch)
    assert target.seen[-1][0] is batch and "forward_batch_generation" not in vars(target)


@pytest.mark.gpu
def test_host_rows_read_a_cuda_tensor_after_its_copy():
    """`HostRows` on CUDA: the copy is non-blocking into pinned memory, and each entry's
    ``tolist()`` is its row's first ``counts[r]`` values of the tensor as it was when the rows
    were made (a later in-place write on the same stream does not reach them). Sizes: 512 rows
    of 5 float32 and int64 values, the bs 32 x S 16 of a step."""
    from sglang_ddtree.srt.ddtree_logprobs import HostRows

    gen = torch.Generator(device="cuda").manual_seed(0)
    values = torch.randn(512, 5, device="cuda", generator=gen)
    ids = torch.randint(0, 151_936, (512, 5), device="cuda", generator=gen)
    counts = [r % 6 for r in range(512)]
    want_values, want_ids = values.tolist(), ids.tolist()
    value_rows, id_rows = HostRows(values, counts), HostRows(ids, counts)
    values.zero_()
    ids.zero_()
    assert [e.tolist() for e in value_rows.entries] == [
        row[:k] for row, k in zip(want_values, counts)
    ]
    assert [e.tolist() for e in id_rows.entries] == [row[:k] for row, k in zip(want_ids, counts)]
    assert not any(torch.is_tensor(e) for e in value_rows.entries)


@pytest.mark.gpu
def test_step_logprobs_on_cuda_equal_the_cpu_s(steps):
    """`write_step_logprobs` on CUDA tensors (pinned copies both ways) reports what it reports
    on the CPU: every batch's committed-token logprobs, top-n values and requested ids'
    logprobs, compared as the lists the scheduler reads (to `ATOL` / `RTOL`: the Triton
    normalizer on CUDA, torch's on the CPU)."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_logprobs import write_step_logprobs

    def report(step, device):
        bs, w, vocab = step.processed.shape
        out = SimpleNamespace()
        write_step_logprobs(
            out, step.processed.reshape(bs * w, vocab).to(device),
            step.plan.keep_nodes.to(device), step.plan.next_token_ids.to(device),
            step.temperature.to(device), step.all_greedy,
            [1 + i % 3 for i in range(bs)], [[0, 3] if i % 2 else None for i in range(bs)],
        )  # fmt: skip
        ids = getattr(out, "next_token_token_ids_logprobs_val", None) or []
        return (
            out.next_token_logprobs.cpu(),
            torch.tensor([v for e in out.next_token_top_logprobs_val for v in e.tolist()]),
            torch.tensor([v for e in ids for v in e.tolist()]),
        )

    for step in steps:
        cpu, cuda = report(step, "cpu"), report(step, "cuda")
        for got, want in zip(cuda, cpu):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


def test_serving_path_reads_the_tail_as_the_sampler_does():
    """`write_step_logprobs` at a row of one node: a token 200 below the others underflows in a
    sampled batch (the float32 minimum) and not in an all-greedy one (about -201); a token
    101.7 below has a subnormal probability, whose log the sampler reports from its few bits:
    the serving path gives the reference's value (`committed_logprobs`, the sampler's
    arithmetic) to `ATOL` / `RTOL`, where the exact log-softmax value is 0.2 away (calibration:
    the tail read without the sampler's rounding would be caught)."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_logprobs import write_step_logprobs

    logits = torch.tensor([[0.0, 0.0, 0.0, -101.7, -200.0]])
    keep, tokens = torch.tensor([[0]]), torch.tensor([[3]])

    def served(all_greedy):
        out = SimpleNamespace()
        write_step_logprobs(out, logits, keep, tokens.view(-1), torch.ones(1), all_greedy,
                            [5], [[4]])  # fmt: skip
        return (out.next_token_logprobs[0, 0], out.next_token_top_logprobs_val[0].tolist(),
                out.next_token_token_ids_logprobs_val[0].tolist())  # fmt: skip

    token, top, ids = served(all_greedy=False)
    want = committed_logprobs(logits[None], keep, tokens, torch.ones(1), top_n=5)
    assert close(token, want.token_logprobs[0, 0]) and close(top, want.top_logprobs[0, 0])
    assert ids == [FLOAT32_MIN] and top[-1] == FLOAT32_MIN
    exact = float(torch.log_softmax(logits[0], -1)[3])
    assert abs(exact - float(want.token_logprobs[0, 0])) > 0.1
    token, top, ids = served(all_greedy=True)
    assert close(token, exact) and -201.5 < ids[0] < -200.0


_INTERPRETED_NORMALIZERS = """
import torch
from sglang_ddtree.core.logprobs_triton import row_max_log_sum

g = torch.Generator().manual_seed(0)
for n, vocab, block, dtype in ((6, 1000, 128, torch.float32), (4, 300, 512, torch.bfloat16),
                               (3, 1, 16, torch.float32)):
    logits = (torch.randn(n, vocab, generator=g) * 4).to(dtype)
    logits[0, 1:] = float("-inf")  # a grammar that allows one token
    logits[1 % n, : vocab // 2] = float("-inf")  # whole blocks masked
    rows = torch.tensor([0, n - 1, 1 % n, 0, n // 2])  # repeats, any order
    scale = torch.rand(rows.shape, generator=g) + 0.5
    got_max, got_log_sum = row_max_log_sum(logits, rows, scale, block=block)
    y = logits[rows].float() / scale[:, None]
    want_max = y.amax(-1)
    want_log_sum = torch.log(torch.exp(y - want_max[:, None]).sum(-1))
    assert torch.equal(got_max, want_max), (n, vocab)
    torch.testing.assert_close(got_log_sum, want_log_sum, atol=1e-6, rtol=1e-6)
print("interpreted normalizers OK")
"""


def test_normalizer_kernel_interpreted_equals_torch(run_interpreted):
    """`logprobs_triton.row_max_log_sum` under Triton's interpreter against torch on the
    gathered rows: the max exactly, the log-sum within float32 rounding; rows read through an
    index with repeats, several blocks with a partial last one, one block wider than the row,
    V = 1, bfloat16 logits, a row with one finite logit, masked blocks."""
    run_interpreted(_INTERPRETED_NORMALIZERS, "interpreted normalizers OK")


@pytest.mark.gpu
def test_normalizer_kernel_at_a_step_s_shape():
    """`row_max_log_sum` on CUDA at bs 32 x S 16 predicting rows of a [bs * W 33, 151,936]
    float32 verify (Qwen3's vocabulary), against torch on the gathered rows: the max exactly,
    the log-sum to 1e-5."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sglang_ddtree.core.logprobs_triton import row_max_log_sum

    g = torch.Generator(device="cuda").manual_seed(3)
    bs, w, s, vocab = 32, 33, 16, 151_936
    logits = torch.randn(bs * w, vocab, device="cuda", generator=g) * 3
    rows = (torch.arange(bs, device="cuda")[:, None] * w
            + torch.randint(0, w, (bs, s), device="cuda", generator=g)).view(-1)  # fmt: skip
    scale = torch.rand(bs * s, device="cuda", generator=g) + 0.5
    got_max, got_log_sum = row_max_log_sum(logits, rows, scale)
    y = logits[rows] / scale[:, None]
    assert torch.equal(got_max, y.amax(-1))
    torch.testing.assert_close(got_log_sum, torch.logsumexp(y - y.amax(-1, keepdim=True), -1),
                               atol=1e-5, rtol=1e-6)  # fmt: skip


def test_top_n_past_the_kernel_gathers_a_batch_of_rows_at_a_time():
    """The top-n above the kernel's reach (torch.topk) gathers ``chunk_rows`` slots at a time:
    its largest allocation is one ``[bs, V]`` block, as the non-speculative sampler's logprobs,
    not ``[bs * S, V]``; values and ids equal one topk over all the slots' rows."""
    from torch.profiler import ProfilerActivity, profile

    from sglang_ddtree.core.logprobs import TRITON_TOP_N, predicting_normalizers, top_logprobs

    gen = torch.Generator().manual_seed(5)
    bs, w, s, vocab, n = 4, 8, 6, 20000, TRITON_TOP_N + 8
    logits = torch.randn(bs * w, vocab, generator=gen)
    keep = torch.randint(0, w, (bs, s), generator=gen)
    norm = predicting_normalizers(logits, keep, torch.full((bs,), 0.8))
    want = logits.index_select(0, norm.rows).topk(n, dim=-1)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        values, ids = top_logprobs(logits, norm, n, chunk_rows=bs)
    largest = max(e.cpu_memory_usage for e in prof.events())
    block = bs * vocab * logits.element_size()
    assert largest <= block < bs * s * vocab * logits.element_size()
    assert torch.equal(ids, want.indices)
    assert torch.equal(values, top_logprobs(logits, norm, n, chunk_rows=bs * s)[0])
