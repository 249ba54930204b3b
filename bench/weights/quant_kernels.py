"""Which kernel multiplies a quantized weight fastest, by rows per call: the evidence behind
engine/quant's choices (torch's own int4 and int8 weight-only kernels for small calls, a
dequantized float matmul for large ones).

For the default model's matmul shapes (fused QKV, output, gate-up, down, LM head) and row
counts from a lone decode (1) through a draft-verifying step (4), a batch (16, 64) to a prefill
chunk (512): oneDNN's bf16 matmul on a bf16 copy; `_weight_int4pack_mm_for_cpu` (int4, groups
of 32, what Q4_0/Q4_1/Q4_K become); `_weight_int8pack_mm` (int8 per row, what Q8_0/Q6_K
become); each quantized weight dequantized to bf16 and then multiplied (the dense path of
large calls); and, for reference, `torch._int_mm` on int8 activations and weights (oneDNN
with VNNI; it needs the activations quantized per call, which the engine does not do).

Usage: python bench/weights/quant_kernels.py [--threads 1]
       [--out bench/results/quant_kernels.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from trio_llm.engine.quant import quantize_int4, quantize_int8

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

SHAPES = {
    "qkv 960x576": (960, 576),
    "o 576x576": (576, 576),
    "gate_up 3072x576": (3072, 576),
    "down 576x1536": (576, 1536),
    "LM head 49152x576": (49152, 576),
}
ROWS = (1, 4, 16, 64, 512)


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls after one warm-up (min: a shared VM only adds)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=BENCH / "results" / "quant_kernels.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines = [
        *hostinfo.heading(
            "Quantized matmul kernels by rows per call",
            f"Load average at the start {' '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        ),
        "",
        "Milliseconds per call, the best of "
        f"{args.repeats}; bf16 activations. `deq+bf16`: dequantize the int4 (int8) weight, then "
        "the bf16 matmul. `int_mm`: int8 x int8 (activations already quantized).",
        "",
        "| shape | rows | bf16 | int4 kernel | int8 kernel | int4 deq+bf16 | int8 deq+bf16 "
        "| int_mm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k) * 0.05
        bf16 = w.to(torch.bfloat16)
        int4 = quantize_int4(w, torch.bfloat16)
        int8 = quantize_int8(w, torch.bfloat16)
        for rows in ROWS:
            x = torch.randn(rows, k).to(torch.bfloat16)
            x8 = torch.randint(-127, 128, (rows, k), dtype=torch.int8)
            cells = [
                best_ms(lambda: F.linear(x, bf16), args.repeats),  # noqa: B023
                best_ms(lambda: int4.matmul(x, None), args.repeats),  # noqa: B023
                best_ms(lambda: int8.matmul(x, None), args.repeats),  # noqa: B023
                best_ms(lambda: F.linear(x, int4.dequantize()), args.repeats),  # noqa: B023
                best_ms(lambda: F.linear(x, int8.dequantize()), args.repeats),  # noqa: B023
                best_ms(lambda: torch._int_mm(x8, int8.q.t()), args.repeats)  # noqa: B023
                if rows > 16
                else float("nan"),
            ]
            lines.append(
                f"| {name} | {rows} | "
                + " | ".join("-" if c != c else f"{c:.2f}" for c in cells)
                + " |"
            )
            print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
