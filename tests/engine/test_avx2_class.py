"""The pool's AVX2-only class, faked where the CPU has more: oneDNN held to AVX2
(`ONEDNN_MAX_CPU_ISA`) refuses bf16 weights as it does on a CPU without AVX512-BW/VL/DQ or
AVX-NE-CONVERT, and an engine must still start and serve a quantized model there. Before
`ops.matmul.reorders`, its dense copies (bf16, for a float32 model's quantized matmuls) were
packed for oneDNN at start-up and the engine died."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from trio_llm.engine.ops import matmul

HERE = Path(__file__).resolve().parent

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


def test_a_quantized_model_starts_and_serves_where_onednn_has_no_bf16(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "TRIO_LLM_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_model_dir), str(tmp_path / "m.json"), str(HERE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["bf16_reorders"] is False  # the fake holds: oneDNN takes no bf16 here
    assert got["error"] is None and len(got["tokens"]) == 6
    assert got["packed_copies"] == 0  # bf16 copies, where kept, stay plain for F.linear


def test_onednn_reorders_float32_wherever_it_runs() -> None:
    assert matmul.reorders(torch.float32) == torch.backends.mkldnn.is_available()
    assert not matmul.reorders(torch.float16)
