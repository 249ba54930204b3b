"""The CUDA-graph bookkeeping that runs without a GPU: which padded size a step takes, what the
static buffers hold between replays, and the replay path end to end with each graph replaced by
a call of its forward. The capture itself is checked by bench/gpu/gpu_check.sh on a GPU."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from engine_helpers import make_core, request, run

from trio_llm.engine.step.cuda_graphs import (
    MAX_CAPTURE_SIZE,
    Captured,
    DecodeGraphs,
    Forward,
    StaticInputs,
    capture_sizes,
    padded_size,
)


def test_sizes_are_few_and_bounded() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = capture_sizes(10_000)
    assert sizes[-1] == MAX_CAPTURE_SIZE and len(sizes) == 3 + MAX_CAPTURE_SIZE // 8
    assert all(b - a <= 8 for a, b in itertools.pairwise(sizes))


@pytest.mark.parametrize(
    ("batch", "size"), [(1, 1), (3, 4), (5, 8), (8, 8), (9, 16), (20, 20), (21, None), (0, None)]
)
def test_a_step_pads_to_the_smallest_size_that_holds_it(batch: int, size: int | None) -> None:
    assert padded_size(capture_sizes(20), batch) == size


def test_only_decode_only_steps_that_fit_replay() -> None:
    graphs = DecodeGraphs(capture_sizes(16), max_blocks=8, device=torch.device("cpu"))
    assert graphs.fits(16, 16)
    assert not graphs.fits(17, 17)  # past the largest size
    assert not graphs.fits(12, 3)  # a prefill chunk in the step


def _step(n: int, width: int) -> tuple[torch.Tensor, ...]:
    ids = torch.arange(100, 100 + n)
    tables = torch.arange(n * width, dtype=torch.int32).view(n, width) + 1
    lens = torch.full((n,), 7, dtype=torch.int32)
    return ids, ids + 1000, ids + 5000, tables, lens


def test_static_rows_past_a_step_are_padding_again() -> None:
    static = StaticInputs(max_size=8, max_blocks=4, device=torch.device("cpu"))
    static.fill(*_step(6, 3))
    assert static.filled == 6 and static.input_ids[:6].tolist() == list(range(100, 106))
    assert static.block_tables[:6, :3].equal(_step(6, 3)[3])
    static.fill(*_step(2, 2))
    # Rows 2-5 held the last step's sequences: no K/V written there, zeros out of attention.
    assert static.slot_mapping.tolist() == [5100, 5101] + [-1] * 6
    assert static.context_lens.tolist() == [7, 7] + [0] * 6
    assert static.input_ids[2:].eq(0).all() and static.positions[2:].eq(0).all()
    meta = static.metadata(4)
    assert meta.num_decodes == 4 and meta.block_tables.shape == (4, 4)
    assert meta.slot_mapping.data_ptr() == static.slot_mapping.data_ptr()
    with pytest.raises(ValueError, match="do not fit"):
        static.fill(*_step(9, 1))


def test_capture_needs_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: bench/gpu/gpu_check.sh captures for real")
    graphs = DecodeGraphs([1], max_blocks=1, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="CUDA"):
        graphs.capture(lambda ids, pos, meta: ids)


def test_a_cpu_engine_runs_eagerly_whatever_the_flag(tiny_model_dir: Path) -> None:
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7]]
    outs = {}
    for eager in (False, True):
        core = make_core(tiny_model_dir, enforce_eager=eager, device="cpu")
        assert core.runner.graphs is None
        done = run(core, [request(str(i), p, max_tokens=6) for i, p in enumerate(prompts)])
        outs[eager] = [done[str(i)].token_ids for i in range(len(prompts))]
    assert outs[False] == outs[True]


class _ReplayedEagerly(DecodeGraphs):
    """DecodeGraphs with each "graph" a plain call of the captured forward on the static
    buffers: the replay path (filling, padding, slicing the logits) without CUDA."""

    def capture(self, forward: Forward) -> None:
        for size in self.sizes:
            meta = self.static.metadata(size)
            ids, pos = self.static.input_ids[:size], self.static.positions[:size]
            logits = forward(ids, pos, meta).clone()

            class Replay:
                def replay(self, f=forward, a=(ids, pos, meta), out=logits) -> None:
                    out.copy_(f(*a))

            self.graphs[size] = Captured(Replay(), logits)  # type: ignore[arg-type]


def test_padded_replays_give_the_eager_tokens(tiny_model_dir: Path) -> None:
    """Decode steps of 1-3 sequences through graphs of sizes 2 and 4 (Triton kernels, in the
    interpreter on a CPU): padded rows write no K/V and change no real row's tokens."""
    from trio_llm.engine.attention import triton_available

    if not triton_available():
        pytest.skip("Triton is not installed")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]]
    # Staggered lengths: the batch shrinks from 3 to 1 as requests finish.
    reqs = [request(str(i), p, max_tokens=3 + 2 * i) for i, p in enumerate(prompts)]
    eager = run(make_core(tiny_model_dir, attention_backend="triton"), reqs)
    core = make_core(tiny_model_dir, attention_backend="triton")
    runner = core.runner
    runner.graphs = _ReplayedEagerly([2, 4], runner.input_batch.max_blocks, runner.device)
    runner.graphs.capture(runner._logits_of_decodes)
    replayed = run(core, reqs)
    assert runner.graphs.replays > 0
    for i in range(len(prompts)):
        assert replayed[str(i)].token_ids == eager[str(i)].token_ids
