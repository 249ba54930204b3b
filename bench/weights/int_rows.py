"""The integer row-exact kernel (engine/ops/int_rows.py) by rows per call, beside the kernels a
quantized weight otherwise takes: torch's int4 kernel, oneDNN's bf16 matmul on a dense copy,
and the float row-exact kernel (engine/ops/int4_rows.py, its fastest path here).

Same 4-bit weights (groups of 32) for the default model's matmul shapes; bf16 activations;
the median of --repeats calls after a warm-up; the variants take turns per call so that drift
on a shared VM falls on each alike.

Usage: python bench/weights/int_rows.py [--threads 2] [--repeats 30]
       [--out bench/results/int_rows.md]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from trio_llm.engine.ops import int4_rows, int_rows
from trio_llm.engine.ops.int_rows import IntRows
from trio_llm.engine.quant import quantize_int4

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402
from weights.int4_rows import ROWS, medians_us  # noqa: E402
from weights.quant_kernels import SHAPES  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", type=Path, default=BENCH / "results" / "int_rows.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if int_rows.path() is None:
        raise SystemExit("the kernel is not built here (no C++ compiler)")
    names = ["oneDNN bf16", "torch int4", "float row-exact", "int"]
    lines = [
        *hostinfo.heading(
            "The integer row-exact kernel by rows per call",
            f"Threads {args.threads}; integer kernel's path here: {int_rows.path()}; float "
            f"row-exact kernel's: {int4_rows.path()}; load "
            f"average at the start {' '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        ),
        "",
        f"Microseconds per call, median of {args.repeats}. Last columns: the integer kernel "
        "against the faster of torch's int4 kernel and oneDNN bf16, and against the float "
        "row-exact kernel (below 1: faster).",
        "",
        "| shape | rows | "
        + " | ".join(names)
        + " | int / best of torch | int / float row-exact |",
        "|---|---|" + "---|" * (len(names) + 2),
    ]
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k) * 0.05
        int4 = quantize_int4(w, torch.bfloat16)
        dense = int4.dequantize()
        int4.keep_exact()
        exact = int4.exact
        assert exact is not None
        q, scale, zero = int4.values()
        integer = IntRows.pack(q[:n], scale[:n], zero[:n])
        for rows in ROWS:
            x = torch.randn(rows, k).to(torch.bfloat16)
            fns: dict[str, Callable[[], object]] = {
                "oneDNN bf16": partial(F.linear, x, dense),
                "torch int4": partial(
                    torch.ops.aten._weight_int4pack_mm_for_cpu,
                    x,
                    int4.packed,
                    int4.group,
                    int4.scales_zeros,
                ),
                "float row-exact": partial(exact.matmul, x),
                "int": partial(integer.matmul, x),
            }
            t = medians_us(fns, args.repeats)
            best = min(t["oneDNN bf16"], t["torch int4"])
            lines.append(
                f"| {name} | {rows} | "
                + " | ".join(f"{t[c]:.0f}" for c in names)
                + f" | {t['int'] / best:.2f} | {t['int'] / t['float row-exact']:.2f} |"
            )
            print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
