"""The strip kernel for plain float32 weights (engine/ops/f32_rows.py): every row of a call is
the bits it has alone, whatever the call's rows and threads, the values are the matmul's, and
the AVX2 class's build sums every output in the same order as this machine's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trio_llm.engine.ops import f32_rows, matmul
from trio_llm.engine.ops.f32_rows import F32BlockWeight, F32StripWeight
from trio_llm.engine.ops.matmul import FP32_ONEDNN, FP32_STRIPS, FP32_STRIPS_FAST, Matmul

pytestmark = pytest.mark.skipif(
    not f32_rows.available(), reason="the strip kernel needs a C++ compiler and FMA"
)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(96, 64), (45, 576), (200, 2100), (33, 1)])
def test_each_row_is_the_same_bits_alone_and_in_any_call(n: int, k: int, threads: int) -> None:
    """Calls of 1 to 200 rows at several offsets into a batch: the kernel passes 12 rows at a
    time (3 with AVX2) in blocks of 96, so rows land in every position of a pass, of a block and
    in short last ones."""
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(40, k, generator=gen)
    batch = x[torch.arange(240) % 40]
    weight = F32StripWeight.pack(w)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = torch.cat([weight.matmul(x[i : i + 1]) for i in range(40)])
        for rows in (2, 5, 12, 13, 40, 97, 200):
            for start in (0, 40 - rows % 40, 7):
                got = weight.matmul(batch[start : start + rows])
                want = alone[(torch.arange(start, start + rows)) % 40]
                assert torch.equal(got, want), (rows, start)
    finally:
        torch.set_num_threads(before)


def test_values_are_the_matmul_with_bias_and_unpadded_outputs() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(45, 576, generator=gen)  # 45 outputs: a strip and a padded one
    x = torch.randn(7, 576, generator=gen)
    bias = torch.randn(45, generator=gen)
    weight = F32StripWeight.pack(w)
    assert weight.shape == w.shape and weight.dtype == torch.float32
    assert weight.nbytes == 64 * 576 * 4  # outputs padded to whole strips of 32
    got = weight.matmul(x.t().contiguous().t(), bias)  # a non-contiguous input too
    want = F.linear(x.double(), w.double(), bias.double())
    assert got.shape == (7, 45) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_an_output_is_one_fma_chain_over_the_inputs_in_order() -> None:
    """Inputs chosen so that the order of the sum shows: 1e8, then 1, 1, ..., then -1e8. In
    order, each 1 is lost against 1e8 (float32 holds 8 in 1e8's last place) and the total is
    0; a sum split into blocks or across lanes keeps the ones of every block that starts
    after the cancellation, or before the large term."""
    k = 1000
    x = torch.ones(3, k)
    w = torch.ones(1, k)
    w[0, 0], w[0, -1] = 1e8, -1e8
    assert F32StripWeight.pack(w).matmul(x).tolist() == [[0.0]] * 3


def test_the_avx2_class_build_gives_the_same_bits(tmp_path: Path) -> None:
    """The pool's AVX2-only CPUs run the kernel built for x86-64-v3 (FMA3, 8 lanes, 3 rows a
    pass): the same chain an output, so the same bits as this machine's build, for plain
    weights and for a GGUF's blocks dequantized as they are multiplied."""
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(70, 320, generator=gen), torch.randn(17, 320, generator=gen)
    # A GGUF block weight (`F32BlockWeight`, Q4_1's form): 5 rows dequantize in registers, 17
    # through the buffer on AVX2.
    q = torch.randint(0, 16, (70, 320), generator=gen, dtype=torch.int8)
    d, m = torch.rand(70, 10, generator=gen), torch.randn(70, 10, generator=gen)
    torch.save({"w": w, "x": x, "q": q, "d": d, "m": m}, tmp_path / "inputs.pt")
    script = (
        "import sys, torch\n"
        "from trio_llm.engine.ops import f32_rows\n"
        "from trio_llm.engine.ops.f32_rows import F32BlockWeight, F32StripWeight\n"
        "t = torch.load(sys.argv[1])\n"
        "b = F32BlockWeight.pack_blocks(t['q'], t['d'], t['m'])\n"
        "torch.save({'path': f32_rows.path(), 'y': F32StripWeight.pack(t['w']).matmul(t['x']),"
        " 'blocks': [b.matmul(t['x'][:5]), b.matmul(t['x'])]}, sys.argv[2])\n"
    )
    env = {**os.environ, "TRIO_LLM_MARCH": "x86-64-v3"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    avx2 = torch.load(tmp_path / "out.pt")
    assert avx2["path"] == "avx2"
    assert torch.equal(avx2["y"], F32StripWeight.pack(w).matmul(x))
    dense = F32StripWeight.pack(F32BlockWeight.pack_blocks(q, d, m).dequantize())
    assert torch.equal(avx2["blocks"][0], dense.matmul(x[:5]))
    assert torch.equal(avx2["blocks"][1], dense.matmul(x))


def test_turned_off_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f32_rows.ENV, "0")
    assert not f32_rows.available()
    assert matmul.plan_for(torch.float32, frozenset()) is FP32_ONEDNN


def test_float32_plans_pack_every_float32_matrix_for_the_kernel() -> None:
    """With invariance (`FP32_STRIPS`) and without (`FP32_STRIPS_FAST`, what `fastest` gives
    float32 here); a bf16 weight under the float32 plan stays with oneDNN."""
    cpu = torch.device("cpu")
    assert matmul.plan_for(torch.float32, frozenset()) is FP32_STRIPS
    assert matmul.fastest(torch.float32, cpu, frozenset()).plan is FP32_STRIPS_FAST
    for plan in (FP32_STRIPS, FP32_STRIPS_FAST):
        mm = Matmul(plan)
        w = torch.randn(40, 63)
        prepared = mm.prepare(w)
        assert isinstance(prepared, F32StripWeight)
        x = torch.randn(3, 63)
        torch.testing.assert_close(mm(x, prepared), F.linear(x, w), rtol=1e-5, atol=1e-5)
        assert not isinstance(mm.prepare(w.to(torch.bfloat16)), F32StripWeight)
