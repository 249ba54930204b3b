"""The pool's AVX2-only class, faked where the CPU has more (in a process of its own, as the
libraries read the fake when they start): oneDNN held to AVX2 (`ONEDNN_MAX_CPU_ISA`) refuses
bf16 weights as it does on a CPU without AVX512-BW/VL/DQ or AVX-NE-CONVERT, and ATen's kernels
built for AVX2 (`ATEN_CPU_CAPABILITY`) pack int4 weights in blocks of 32 rows, not 64. Before
this class was faked, an engine there died at start-up packing its dense copies (bf16, for a
float32 model's quantized matmuls) for oneDNN, and read every int4 weight and embedding row
as if packed for AVX-512: wrong values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from trio_llm.engine.ops import matmul

HERE = Path(__file__).resolve().parent
AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def run_as_avx2_only(script: str, *args: str) -> dict[str, object]:
    """`script`'s last line of output (JSON), run with the class faked."""
    env = {**os.environ, **AVX2_ONLY, "TRIO_LLM_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


VALUES = """
import json

import torch

from trio_llm.engine.ops.int_rows import IntRows
from trio_llm.engine.quant import quantize_int4, quantize_int8
from trio_llm.engine.quant.weights import block_rows, int8_matmul_exact

gen = torch.Generator().manual_seed(0)
w = torch.randn(200, 128, generator=gen)
q = quantize_int4(w, torch.bfloat16)
x = torch.randn(5, 128, generator=gen).to(torch.bfloat16)
dense = q.dequantize().float()
rows = torch.tensor([0, 31, 32, 63, 64, 199])
kernel = q.matmul(x, None).float()
q.keep_exact(IntRows)
w8a8 = quantize_int8(w, torch.bfloat16, int8_activations=True)
w8a8.keep_exact(IntRows)
print(json.dumps({
    "int8_matmul_exact": int8_matmul_exact(),
    "w8a8_error": (w8a8.matmul(x, None).float() - x.float() @ w8a8.dequantize().float().t())
    .abs().max().item(),
    "capability": torch.backends.cpu.get_cpu_capability(),
    "block_rows": block_rows(),
    "weight_error": (dense - w).abs().max().item(),
    "rows_error": (q.rows(rows).float() - dense[rows]).abs().max().item(),
    "kernel_error": (kernel - x.float() @ dense.t()).abs().max().item(),
    "exact_error": (q.matmul(x, None).float() - kernel).abs().max().item(),
    "scale": (x.float() @ dense.t()).abs().max().item(),
}))
"""

SCRIPT = """
import json, sys
from pathlib import Path

import torch

sys.path.insert(0, sys.argv[3])
from engine_helpers import make_core, random_prompts, request, run
from trio_llm.engine.ops.machine_record import MachineRecord
from trio_llm.engine.ops.matmul import PackedWeight
from trio_llm.engine.step import model_runner

# Crossovers timed under the fake go to a record of their own, not this machine's.
model_runner.MachineRecord = lambda: MachineRecord(Path(sys.argv[2]))
core = make_core(
    Path(sys.argv[1]), quantization="int4", dtype="float32", device="cpu", batch_invariant="off"
)
[prompt] = random_prompts([40], seed=1)
out = run(core, [request("a", prompt, max_tokens=6, ignore_eos=True)])["a"]
dense = [w.dense for w in core.runner.own.matrices() if getattr(w, "dense", None) is not None]
print(json.dumps({
    "bf16_reorders": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    "tokens": out.token_ids,
    "error": out.error,
    "packed_copies": sum(isinstance(d, PackedWeight) for d in dense),
}))
"""


def test_int4_weights_keep_their_values_in_an_avx2_packing() -> None:
    got = run_as_avx2_only(VALUES)
    assert got["capability"] == "AVX2" and got["block_rows"] == 32  # the fake holds
    # 4 bits in groups of 32 of a unit normal: within half a step of the value.
    assert got["weight_error"] < 0.25
    assert got["rows_error"] == 0  # embedding rows are the matrix's rows
    scale = float(got["scale"])  # type: ignore[arg-type]
    assert float(got["kernel_error"]) < 0.02 * scale  # type: ignore[arg-type]
    # The row-exact kernel repacked from the same values (its activations in 8 bits).
    assert float(got["exact_error"]) < 0.05 * scale  # type: ignore[arg-type]
    # W8A8: oneDNN's int8 sums saturate without VNNI; the integer kernel takes its calls.
    assert got["int8_matmul_exact"] is False
    assert float(got["w8a8_error"]) < 0.05 * scale  # type: ignore[arg-type]


def test_a_quantized_model_starts_and_serves_where_onednn_has_no_bf16(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    got = run_as_avx2_only(SCRIPT, str(tiny_model_dir), str(tmp_path / "m.json"), str(HERE))
    assert got["bf16_reorders"] is False  # the fake holds: oneDNN takes no bf16 here
    assert got["error"] is None and len(got["tokens"]) == 6
    assert got["packed_copies"] == 0  # bf16 copies, where kept, stay plain for F.linear


def test_onednn_reorders_float32_wherever_it_runs() -> None:
    assert matmul.reorders(torch.float32) == torch.backends.mkldnn.is_available()
    assert not matmul.reorders(torch.float16)


INVARIANT = """
import json, sys
from pathlib import Path

sys.path.insert(0, sys.argv[3])
from engine_helpers import make_core, random_prompts, request, run
from trio_llm.engine.ops.machine_record import MachineRecord
from trio_llm.engine.step import model_runner

model_runner.MachineRecord = lambda: MachineRecord(Path(sys.argv[2]))
# float32: the dtype this class's policy picks (no AVX512-BF16). `on`, not `auto`: `auto`'s
# choice reads this machine's own kernels (test_int_rows fakes it); the libraries are faked here.
core = make_core(
    Path(sys.argv[1]), quantization="int4", dtype="float32", device="cpu", batch_invariant="on"
)
prompts = random_prompts([7, 30, 90, 150], seed=4, vocab=200)
reqs = [
    request(f"{i}{kind}", p, max_tokens=8, ignore_eos=True, **params)
    for i, p in enumerate(prompts)
    for kind, params in (("g", {}), ("s", {"temperature": 1.0, "seed": 40 + i}))
]
together = run(core, reqs)
alone = {r.request_id: run(core, [r])[r.request_id] for r in reqs}
print(json.dumps({
    "on": core.runner.invariance.on,
    "reason": core.runner.invariance.reason,
    "errors": [o.error for o in together.values() if o.error],
    "together": {k: v.token_ids for k, v in together.items()},
    "alone": {k: v.token_ids for k, v in alone.items()},
}))
"""


def test_the_default_float32_engine_is_batch_invariant_on_the_class_s_libraries(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`auto` keeps quantized weights invariant on this class (its integer kernel's AVX2 path
    takes every row, a prompt's queries the in-place decode kernel; the choice is faked in
    test_int_rows.py and test_batch_invariance.py): with torch's and oneDNN's AVX2 code under
    the engine, the start-up check passes and each request's tokens, greedy or seeded, alone
    equal its tokens beside the others."""
    got = run_as_avx2_only(INVARIANT, str(tiny_model_dir), str(tmp_path / "m.json"), str(HERE))
    assert got["on"], got["reason"]
    assert got["errors"] == []
    assert got["together"] == got["alone"]
    assert all(len(tokens) == 8 for tokens in got["together"].values())  # type: ignore[union-attr]
