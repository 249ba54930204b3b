"""Which linear-layer kernel is fastest on this CPU, by batch rows: the evidence for serving fp32.

SmolLM2-135M's decoder linears (30 layers of q, k, v, o, gate, up, down; distinct weights, so
they stream from memory as in a real step, not from cache) run back to back at M rows for
every weight format torch offers on a CPU:

- fp32 `F.linear` (MKL sgemm), the engine's path;
- fp32 through oneDNN (`torch.utils.mkldnn.to_mkldnn` modules);
- bf16 and fp16 `F.linear` (half the bytes to stream, but compute without native support on
  CPUs lacking AVX-512 BF16/FP16);
- int8 weight-only (`torch._weight_int8pack_mm`, per-channel scales);
- int4 weight-only, group 32 (`_weight_int4pack_mm_for_cpu`: the layout of GGUF Q4_1).

Each is timed over the same rows, interleaved (every format takes a turn per round), and the
table gives the median time per format relative to fp32.

Usage: python bench/weights/linear_kernels.py [--rows 1 8 32 64] [--threads 2]
       [--out bench/results/linear_kernels.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import mkldnn

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

HIDDEN, INTERMEDIATE, KV = 576, 1536, 192
SHAPES = [
    (HIDDEN, HIDDEN),
    (KV, HIDDEN),
    (KV, HIDDEN),
    (HIDDEN, HIDDEN),
    (INTERMEDIATE, HIDDEN),
    (INTERMEDIATE, HIDDEN),
    (HIDDEN, INTERMEDIATE),
]
"""(out, in) of one SmolLM2-135M decoder layer's linears."""
LAYERS = 30
ROUNDS = 5


def int4_pack(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit groups (scale and minimum per 32 inputs, as GGUF Q4_1) in torch's
    int4pack layout, whose zero point sits at code 8."""
    out, inp = w.shape
    g = w.reshape(out, inp // group, group)
    low, high = g.amin(-1), g.amax(-1)
    scale = ((high - low) / 15).clamp_min(1e-8)
    q = ((g - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(out, inp), 1)
    scales_zeros = torch.stack([scale.t(), (low + 8 * scale).t()], -1).contiguous()
    return packed, scales_zeros


def formats(weights: list[torch.Tensor]) -> dict[str, Callable[[dict[int, torch.Tensor]], None]]:
    """Format name -> one pass over every layer's linears given the inputs by in-features."""
    half = {dt: [w.to(dt) for w in weights] for dt in (torch.bfloat16, torch.float16)}
    modules = []
    for w in weights:
        linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        linear.weight.data = w
        modules.append((mkldnn.to_mkldnn(linear), w.shape[1]))
    int8 = []
    for w in weights:
        scale = w.abs().amax(1) / 127
        int8.append(((w / scale[:, None]).round().to(torch.int8), scale, w.shape[1]))
    int4 = [(*int4_pack(w), w.shape[1]) for w in weights]

    def fp32(x: dict[int, torch.Tensor]) -> None:
        for w in weights:
            F.linear(x[w.shape[1]], w)

    def onednn(x: dict[int, torch.Tensor]) -> None:
        for module, k in modules:
            module(x[k])

    def halves(dt: torch.dtype) -> Callable[[dict[int, torch.Tensor]], None]:
        def run(x: dict[int, torch.Tensor]) -> None:
            for w in half[dt]:
                F.linear(x[w.shape[1]].to(dt), w)

        return run

    def int8_run(x: dict[int, torch.Tensor]) -> None:
        for q, scale, k in int8:
            torch._weight_int8pack_mm(x[k], q, scale)

    def int4_run(x: dict[int, torch.Tensor]) -> None:
        for packed, scales_zeros, k in int4:
            torch.ops.aten._weight_int4pack_mm_for_cpu(x[k], packed, 32, scales_zeros)

    return {
        "fp32 (MKL)": fp32,
        "fp32 (oneDNN)": onednn,
        "bf16": halves(torch.bfloat16),
        "fp16": halves(torch.float16),
        "int8 weight-only": int8_run,
        "int4 weight-only (g32)": int4_run,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=BENCH / "results" / "linear_kernels.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(*shape, generator=g) * 0.02 for _ in range(LAYERS) for shape in SHAPES]
    runs = formats(weights)
    table: dict[int, dict[str, float]] = {}
    for m in args.rows:
        x = {k: torch.randn(m, k, generator=g) for k in (HIDDEN, INTERMEDIATE)}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for round_ in range(ROUNDS + 1):
            for name, run in runs.items():
                t0 = time.perf_counter()
                run(x)
                if round_:  # round 0 warms every kernel up
                    times[name].append(time.perf_counter() - t0)
        table[m] = {name: statistics.median(t) for name, t in times.items()}
        print(
            f"M={m}: " + ", ".join(f"{name} {t * 1e3:.1f} ms" for name, t in table[m].items()),
            flush=True,
        )

    names = list(runs)
    lines = [
        *hostinfo.heading(
            "Linear kernels on this CPU: fp32 against every other weight format torch offers",
            f"Threads: {args.threads}.",
        ),
        "",
        f"SmolLM2-135M's {LAYERS} decoder layers of linears (distinct weights), M rows, median "
        f"of {ROUNDS} interleaved rounds; each cell is ms and, in brackets, the time relative "
        "to fp32 MKL (below 1: faster). Written by bench/weights/linear_kernels.py.",
        "",
        "| M | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for m, row in table.items():
        base = row[names[0]]
        cells = [f"{row[n] * 1e3:.1f} ({row[n] / base:.2f})" for n in names]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
