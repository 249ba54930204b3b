"""What a 4-bit weight costs on the pool's AVX2-only class, by rows per call: the integer
row-exact kernel's AVX2 path (engine/ops/int_rows.py) against what that class served on before
it, torch's int4 kernel (bf16 activations: `kernel_dtype`) and a dense float32 or bf16 copy.

On an AVX2-only machine everything runs natively. On a CPU with AVX-512, `--emulate` (the
default there) makes each library take its AVX2 code: the kernel is built with
`-march=x86-64-v3` (`TRIO_LLM_MARCH`), ATen's kernels dispatch for AVX2
(`ATEN_CPU_CAPABILITY`), oneDNN and MKL cap their instruction sets (`ONEDNN_MAX_CPU_ISA`,
`MKL_ENABLE_INSTRUCTIONS`). The memory, caches and clock stay this machine's, so the ratios,
not the microseconds, carry over to the class.

The default model's matmul shapes, groups of 32; the median of --repeats calls after a
warm-up; the variants take turns per call, so that drift on a shared VM falls on each alike.

Usage: python bench/weights/int_rows_avx2.py [--threads 2] [--repeats 30] [--no-emulate]
       [--out bench/results/int_rows_avx2.md]
"""

from __future__ import annotations

import os
import sys

EMULATION = {
    "TRIO_LLM_MARCH": "x86-64-v3",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
"""Read when each library starts: set before torch is imported."""

if "--no-emulate" not in sys.argv:
    os.environ.update(EMULATION)

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from trio_llm.engine.ops import int_rows  # noqa: E402
from trio_llm.engine.ops.int_rows import IntRows  # noqa: E402
from trio_llm.engine.quant import quantize_int4  # noqa: E402

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402
from timing import medians_us  # noqa: E402
from weights.quant_kernels import SHAPES  # noqa: E402

ROWS = (1, 8, 32, 128, 512)
OTHERS = ("torch int4", "dense fp32", "dense bf16")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--no-emulate", action="store_true", help="time this CPU's own paths")
    p.add_argument("--out", type=Path, default=BENCH / "results" / "int_rows_avx2.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if int_rows.path() is None:
        raise SystemExit("the integer kernel is not built here (no C++ compiler)")
    if int_rows.path() != "avx2":
        raise SystemExit(f"the integer kernel's path here is {int_rows.path()}, not avx2")
    how = (
        "this CPU's own paths"
        if args.no_emulate
        else "emulated: " + ", ".join(f"{k}={v}" for k, v in EMULATION.items())
    )
    lines = [
        *hostinfo.heading(
            "4-bit weights on the AVX2-only class: the integer kernel against the class's others",
            f"Threads {args.threads}; {how}; ATen's CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}; load average at the start "
            f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        ),
        "",
        f"Microseconds per call, median of {args.repeats} (bf16 activations for the quantized "
        "kernels, as the engine casts a float32 model's; float32 for the dense fp32 copy). "
        "Last column: the integer kernel against the fastest other (below 1: faster).",
        "",
        "| shape | rows | int (avx2) | " + " | ".join(OTHERS) + " | int / best other |",
        "|---|---|---|" + "---|" * (len(OTHERS) + 1),
    ]
    for name, (n, k) in SHAPES.items():
        int4 = quantize_int4(torch.randn(n, k) * 0.05, torch.bfloat16)
        q, scale, zero = int4.values()
        packed = IntRows.pack(q[:n], scale[:n], zero[:n])
        dense = int4.dequantize()
        dense32 = dense.float()
        for rows in ROWS:
            x32 = torch.randn(rows, k)
            x = x32.to(torch.bfloat16)
            fns: dict[str, Callable[[], object]] = {
                "int (avx2)": partial(packed.matmul, x),
                "torch int4": partial(
                    torch.ops.aten._weight_int4pack_mm_for_cpu,
                    x,
                    int4.packed,
                    int4.group,
                    int4.scales_zeros,
                ),
                "dense fp32": partial(F.linear, x32, dense32),
                "dense bf16": partial(F.linear, x, dense),
            }
            t = medians_us(fns, args.repeats)
            ratio = t["int (avx2)"] / min(t[o] for o in OTHERS)
            lines.append(
                f"| {name} | {rows} | "
                + " | ".join(f"{t[c]:.0f}" for c in fns)
                + f" | {ratio:.2f} |"
            )
            print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
