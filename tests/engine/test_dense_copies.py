"""Dense copies of quantized weights (engine/models/dense_copies.py): calls of many rows take the
copy from a crossover measured per matrix shape, calls of few rows the quantized kernel; no copy
where memory does not allow it, every call on the copy with float32 activations, and none where
batch invariance keeps every row on the row-exact kernels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import make_core

from trio_llm.engine.models import dense_copies
from trio_llm.engine.ops import bf16_rows, int4_rows, int_rows
from trio_llm.engine.ops.bf16_rows import StripWeight
from trio_llm.engine.ops.int4_rows import RowsExact
from trio_llm.engine.ops.int_rows import IntRows
from trio_llm.engine.ops.machine_record import MachineRecord
from trio_llm.engine.ops.matmul import BAND_ROWS, BandedWeight, multiply
from trio_llm.engine.quant import (
    NEVER_DENSE,
    Int4Weight,
    dispatching,
    quantize_int4,
    quantize_int8,
)
from trio_llm.engine.quant import weights as weights_module
from trio_llm.engine.quant.weights import DENSE_ROWS
from trio_llm.engine.step import model_runner

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def one_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies in oneDNN's form alone, as on a CPU without AMX, whatever this one has
    (`test_with_amx_tiles_a_copy_is_banded` fakes the tiles)."""
    monkeypatch.setattr(bf16_rows, "tiles", lambda: False)


def weights(count: int = 3, shape: tuple[int, int] = (64, 128)) -> list[Int4Weight]:
    gen = torch.Generator().manual_seed(0)
    return [quantize_int4(torch.randn(*shape, generator=gen), BF16) for _ in range(count)]


def timer_with_crossover(
    rows_from: int, monkeypatch: pytest.MonkeyPatch
) -> Callable[[Callable[[], object]], float]:
    """A fake timer: the dense matmuls win from `rows_from` rows on. It tells the two probes
    apart by whether the dense one's `multiply` runs, and reads the rows off its call."""
    calls: list[int] = []
    real = dense_copies.multiply

    def multiply(x: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(dense_copies, "multiply", multiply)

    def timer(fn: Callable[[], object]) -> float:
        calls.clear()
        fn()
        if calls:  # the dense probe
            return 1.0 if calls[0] >= rows_from else 3.0
        return 2.0

    return timer


def test_calls_of_many_rows_take_the_copy_from_the_measured_crossover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws = weights()
    timer = timer_with_crossover(8, monkeypatch)
    kept = dense_copies.keep(ws, BF16, available=None, timer=timer)
    assert kept.kept and kept.crossovers == {(64, 128): 8}
    assert kept.nbytes == 3 * 64 * 128 * 2
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(2)).to(BF16)
    for w in ws:
        assert w.dense is not None and w.dense_rows == 8
        # The copy (packed for oneDNN where it is there) multiplies as the dequantized matrix.
        assert torch.equal(multiply(x, w.dense), F.linear(x, w.dequantize().to(BF16)))
    taken: list[int] = []
    real = weights_module.multiply

    def counted(x: torch.Tensor, *args: object) -> torch.Tensor:
        taken.append(x.shape[0])
        return real(x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(weights_module, "multiply", counted)
    linear = dispatching(lambda x, w, b: pytest.fail("a quantized weight went to `inner`"))
    for rows in (1, 7, 8, 64):
        linear(torch.randn(rows, 128).to(BF16), ws[0], None)  # type: ignore[arg-type]
    assert taken == [8, 64]  # 1 and 7 rows on the int4 kernel
    # The copy computes what the kernel does, up to the order of a row's sums and the bf16
    # rounding of outputs of about 10 (an ulp of 0.06).
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(1)).to(BF16)
    torch.testing.assert_close(
        linear(x, ws[0], None).float(),  # type: ignore[arg-type]
        ws[0].matmul(x, None).float(),
        atol=0.25,
        rtol=0.02,
    )


@pytest.mark.skipif(not bf16_rows.available(), reason="the strip kernel needs a C++ compiler")
def test_with_amx_tiles_a_copy_is_banded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the strip kernel runs on AMX tiles, a copy is kept twice: as strips for calls of
    fewer than `BAND_ROWS` rows (decode batches), in oneDNN's form for more (prefill chunks),
    and its memory is counted twice."""
    monkeypatch.setattr(bf16_rows, "tiles", lambda: True)
    ws = weights()
    kept = dense_copies.keep(ws, BF16, available=None, timer=timer_with_crossover(8, monkeypatch))
    assert kept.kept and kept.nbytes == 2 * 3 * 64 * 128 * 2
    on_strips: list[int] = []
    real = StripWeight.linear

    def counted(self: StripWeight, x: torch.Tensor) -> torch.Tensor:
        on_strips.append(x.shape[0])
        return real(self, x)

    monkeypatch.setattr(StripWeight, "linear", counted)
    linear = dispatching(lambda x, w, b: pytest.fail("a quantized weight went to `inner`"))
    gen = torch.Generator().manual_seed(3)
    for rows in (4, 8, BAND_ROWS - 1, BAND_ROWS, 300):
        x = torch.randn(rows, 128, generator=gen).to(BF16)
        got = linear(x, ws[0], None)  # type: ignore[arg-type]
        assert isinstance(ws[0].dense, BandedWeight)
        want = F.linear(x.float(), ws[0].dequantize().float())
        torch.testing.assert_close(got.float(), want, atol=0.25, rtol=0.02)
    assert on_strips == [8, BAND_ROWS - 1]  # 4 rows on the kernel, 128 and 300 on oneDNN


def test_a_kernel_that_loses_only_at_a_chunk_keeps_its_copy_for_calls_past_the_probes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws = weights(1)
    timer = timer_with_crossover(dense_copies.CHUNK_ROWS, monkeypatch)
    kept = dense_copies.keep(ws, BF16, available=None, timer=timer)
    assert kept.crossovers == {(64, 128): 2 * dense_copies.PROBE_ROWS[-1]}
    assert kept.kept and ws[0].dense is not None


def test_a_kernel_that_never_loses_keeps_no_copy_and_is_never_dequantized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the row-exact kernel beats the copy at a prefill chunk's rows too (the integer
    kernel on an AMD EPYC), the copy is dropped, and a chunk is not dequantized per call either:
    every call stays on the kernel."""
    ws = weights(2)
    timer = timer_with_crossover(10**6, monkeypatch)
    kept = dense_copies.keep(ws, BF16, available=None, timer=timer)
    assert kept.crossovers == {(64, 128): NEVER_DENSE}
    assert not kept.kept and kept.nbytes == 0 and "every size" in kept.describe()
    assert all(w.dense is None and w.dense_rows == NEVER_DENSE for w in ws)
    linear = dispatching(lambda x, w, b: pytest.fail("a quantized weight went to `inner`"))
    x = torch.randn(2 * dense_copies.CHUNK_ROWS, 128).to(BF16)
    assert torch.equal(
        linear(x, ws[0], None),  # type: ignore[arg-type]
        ws[0].matmul(x, None),
    )


def test_no_copies_beyond_the_memory_share_and_prefill_chunks_dequantize_per_call() -> None:
    ws = weights()
    kept = dense_copies.keep(ws, BF16, available=1000, timer=pytest.fail)
    assert not kept.kept and "over 25%" in kept.describe()
    assert all(w.dense is None for w in ws)
    taken: list[int] = []

    def inner(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        taken.append(x.shape[0])
        return torch.nn.functional.linear(x, weight, bias)

    linear = dispatching(inner)
    for rows in (1, 64, DENSE_ROWS["int4"]):
        linear(torch.randn(rows, 128).to(BF16), ws[0], None)  # type: ignore[arg-type]
    assert taken == [DENSE_ROWS["int4"]]


def copies_win_from_8_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies kept whatever this machine's timings say (a kernel that beats them at every size
    keeps none), and no crossover recalled from an earlier run."""
    monkeypatch.setattr(dense_copies, "crossover", lambda pairs, timer: 8)
    fresh = MachineRecord(tmp_path / "measured.json")
    monkeypatch.setattr(model_runner, "MachineRecord", lambda: fresh)


def test_a_float32_model_multiplies_its_quantized_weights_in_bf16(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not on the kernels' float32 paths (15x slower): the matmul inputs are rounded to bf16,
    its outputs and everything between the matmuls stay float32."""
    copies_win_from_8_rows(tmp_path, monkeypatch)
    core = make_core(
        tiny_model_dir, quantization="int4", dtype="float32", device="cpu", batch_invariant="off"
    )
    assert core.ready.dtype == "float32"
    own = core.runner.own
    assert own is not None
    assert all(w.dtype == BF16 for w in own.matrices())  # type: ignore[union-attr]
    assert core.runner.dense_copies is not None and core.runner.dense_copies.kept
    assert all(w.dense.dtype == BF16 for w in own.matrices())  # type: ignore[union-attr]
    hidden = own.logits(torch.randn(3, own.norm.shape[0]))
    assert hidden.dtype == torch.float32


def test_w8a8_weights_get_no_copy() -> None:
    gen = torch.Generator().manual_seed(0)
    w = quantize_int8(torch.randn(64, 128, generator=gen), BF16, int8_activations=True)
    assert not dense_copies.keep([w], BF16, available=None, timer=pytest.fail).kept
    assert w.dense is None


def test_an_engine_keeps_copies_only_without_batch_invariance(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies_win_from_8_rows(tmp_path, monkeypatch)
    off = make_core(
        tiny_model_dir, quantization="int4", dtype="auto", device="cpu", batch_invariant="off"
    )
    assert off.runner.dense_copies is not None and off.runner.dense_copies.kept
    assert "dense copies" in off.runner.dense_copies.describe()
    on = make_core(
        tiny_model_dir, quantization="int4", dtype="auto", device="cpu", batch_invariant="on"
    )
    assert on.runner.invariance.on and on.runner.dense_copies is None
    assert all(
        getattr(w, "dense", None) is None
        for w in on.runner.own.matrices()  # type: ignore[union-attr]
    )


@pytest.mark.parametrize(
    ("float_path", "int_path", "exact"),
    [
        ("avx512_bf16", "vnni", IntRows),  # VNNI: the integer kernel, with AMX or without
        ("avx512_bf16", None, RowsExact),  # AVX512-BF16 without VNNI's kernel: the float one
        ("amx", "vnni", IntRows),
        ("amx", None, None),  # AMX without the integer kernel: torch's
    ],
)
def test_the_default_multiplies_few_rows_on_the_row_exact_kernel_where_it_wins(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    float_path: str,
    int_path: str | None,
    exact: type | None,
) -> None:
    """Without invariance, the calls below the crossover take the row-exact kernel measured
    fastest on the CPU's class (ops/row_exact.py), and the crossover is timed against it: the
    integer kernel where it has VNNI (AMX or not), the float kernel's grouped sums on
    AVX512-BF16 without it; where neither wins (an AMX machine without the integer kernel)
    torch's. The classes are faked: any machine runs each kernel on a path of its own, with the
    same bits."""
    if int4_rows.KERNEL.extension() is None or int_rows.KERNEL.extension() is None:
        pytest.skip("the row-exact kernels need a C++ compiler")
    monkeypatch.setattr(int4_rows, "path", lambda allow_amx=True: float_path)
    monkeypatch.setattr(int_rows, "path", lambda best="vnni": int_path)
    timed: list[bool] = []
    real = dense_copies.crossover

    def crossover(pairs: list, timer: Callable) -> int:  # type: ignore[type-arg]
        timed.append(all(w.exact is not None for w, _ in pairs))
        return real(pairs, timer)

    monkeypatch.setattr(dense_copies, "crossover", crossover)
    fresh = MachineRecord(tmp_path / "measured.json")  # no crossover recalled: all timed here
    monkeypatch.setattr(model_runner, "MachineRecord", lambda: fresh)
    core = make_core(
        tiny_model_dir, quantization="int4", dtype="auto", device="cpu", batch_invariant="off"
    )
    assert not core.runner.invariance.on
    assert core.runner.dense_copies is not None  # kept or not, as this machine timed them
    own = core.runner.own
    assert own is not None
    matrices = [w for w in own.matrices() if isinstance(w, Int4Weight)]
    assert matrices and all(type(w.exact) is exact or w.exact is exact for w in matrices)
    assert timed and all(t == (exact is not None) for t in timed)
    x = torch.randn(3, matrices[0].in_features).to(BF16)
    torch.testing.assert_close(
        matrices[0].matmul(x, None).float(),
        F.linear(x.float(), matrices[0].dequantize().float()),
        atol=0.05,
        rtol=0.02,
    )


def test_a_restart_takes_the_crossovers_this_machine_measured_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Timed afresh at each start, the crossover (and with it a row's kernel and rounding)
    could change from one start to the next; recorded, a restart chooses as the first start."""
    record = MachineRecord(tmp_path / "measured.json")
    first = dense_copies.keep(
        weights(), BF16, available=None, timer=timer_with_crossover(8, monkeypatch), record=record
    )
    assert first.crossovers == {(64, 128): 8} and "recorded in" in first.reason

    def no_timing(fn: Callable[[], object]) -> float:
        raise AssertionError("a recorded crossover was timed again")

    again = weights()
    restarted = dense_copies.keep(again, BF16, available=None, timer=no_timing, record=record)
    assert restarted.crossovers == {(64, 128): 8} and "before" in restarted.reason
    assert all(w.dense_rows == 8 for w in again)
    # Another thread count, or another shape, is another measurement.
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    other = dense_copies.keep(
        weights(), BF16, available=None, timer=timer_with_crossover(4, monkeypatch), record=record
    )
    assert other.crossovers == {(64, 128): 4}
    wider = dense_copies.keep(
        weights(shape=(64, 256)), BF16, available=None, timer=timer_with_crossover(16, monkeypatch),
        record=record,
    )  # fmt: skip
    assert wider.crossovers == {(64, 256): 16}


def test_an_unwritable_record_still_measures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    record = MachineRecord(blocked / "measured.json")  # its folder cannot be made
    kept = dense_copies.keep(
        weights(), BF16, available=None, timer=timer_with_crossover(2, monkeypatch), record=record
    )
    assert kept.crossovers == {(64, 128): 2}
