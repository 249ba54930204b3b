"""The CPU attention kernels of a decode step, per source tree, the trees taking turns: the AMX
kernel (engine/ops/paged_amx.py, where the CPU has AMX or AVX512-BF16) and the float one
(engine/ops/paged_decode.py), over every layer's cache of the default model's shape. A case
`Np` is one prompt of N tokens as batch invariance computes it (each query a decode of its own
position), beside SDPA's causal flash kernel on the same keys, as the engine computes a prompt
with invariance off: one layer, not thirty.

Why its own benchmark: a step's attention is a third of a c=32 decode step on the AMX Xeon and
bound by reading the KV cache, so a kernel change is worth a few percent of a step, which the
serving benchmarks' noise hides. Here each case calls a kernel once per layer on caches of
its own (30 layers, 3 KV heads of 64, 9 query heads, blocks of 16 scattered at random, as a
long-running server's are), so each layer reads its keys from memory, not from a cache the
previous call warmed. Each source tree (`--sources NAME=SRC`, its PYTHONPATH) runs in a
process of its own, the trees alternating round by round (this VM's speed drifts by a third
within an hour); a kernel is built per tree (its source's hash names the build).

Usage: python bench/engine_step/paged_attention.py [--sources before=/tmp/before/src after=src]
       [--cases 1x230 32x230 8x2100 1000p] [--dtype bfloat16] [--rounds 3] [--evict MB]
       [--out bench/results/paged_attention.md]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402
from timing import median_ms  # noqa: E402

LAYERS, KV_HEADS, HEADS, HEAD_SIZE, BLOCK = 30, 3, 9, 64, 16
"""SmolLM2-135M's attention, and the engine's block size."""


def measure(
    cases: list[str], repeats: int, dtype_name: str, evict_mb: int = 0
) -> dict[str, dict[str, float]]:
    """Milliseconds for one step's attention (every layer once; one layer for a prompt), median
    of `repeats`, per case and kernel, in this process (the tree on its PYTHONPATH).
    `evict_mb`: a decode step's attention is timed after reading that many MB of other memory
    (untimed), as a step's matmuls read their weights between two steps' attention."""
    import torch

    from trio_llm.engine.ops import paged_amx, paged_decode

    dtype = getattr(torch, dtype_name)
    kernels = {}
    if paged_amx.extension() is not None and dtype == torch.bfloat16:
        kernels["amx"] = paged_amx.paged_attention
    if paged_decode.extension() is not None:
        kernels["float"] = paged_decode.paged_decode
    g = torch.Generator().manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    for case in cases:
        if case.endswith("p"):
            out[case] = prompt(int(case[:-1]), kernels, dtype, repeats, g)
            continue
        batch, context = (int(n) for n in case.split("x"))
        per_seq = -(-context // BLOCK)
        blocks = 2 * batch * per_seq
        shape = (blocks, BLOCK, KV_HEADS, HEAD_SIZE)
        caches = [
            (torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype))
            for _ in range(LAYERS)
        ]
        tables = torch.randperm(blocks, generator=g)[: batch * per_seq].view(batch, per_seq)
        lens = torch.full((batch,), context, dtype=torch.long)
        q = torch.randn(batch, HEADS, HEAD_SIZE, generator=g).to(dtype)
        out[case] = {
            name: after_eviction(
                functools.partial(every_layer, kernel, q, caches, tables, lens),
                repeats,
                evict_mb,
            )
            for name, kernel in kernels.items()
        }
    return out


def after_eviction(call: Callable[[], object], repeats: int, evict_mb: int) -> float:
    """`median_ms` of `call`, each timed call after an untimed read of `evict_mb` MB.

    Why: a CPU's last-level cache may hold a whole step's KV reads (an AMX Xeon VM reports
    300 MB of L3), so that steps timed back to back read the cache from L3; in an engine's step
    the weights' reads come between, and the attention reads memory."""
    import torch

    before = torch.ones(evict_mb << 18).sum if evict_mb else None  # float32: 4 bytes each
    return median_ms(call, repeats, before=before)


def every_layer(
    kernel: Callable[..., torch.Tensor],
    q: torch.Tensor,
    caches: list[tuple[torch.Tensor, torch.Tensor]],
    tables: torch.Tensor,
    lens: torch.Tensor,
) -> None:
    """One decode step's attention: the kernel over each layer's cache in turn."""
    for k, v in caches:
        kernel(q, k, v, tables, lens, HEAD_SIZE**-0.5)


def prompt(
    n: int,
    kernels: dict[str, Callable[..., torch.Tensor]],
    dtype: torch.dtype,
    repeats: int,
    g: torch.Generator,
) -> dict[str, float]:
    """One layer of an n-token prompt: each kernel with the prompt's queries laid out as decodes
    (one block table repeated, context lengths 1 to n), and SDPA's causal kernel over the same
    keys gathered in order."""
    import torch
    import torch.nn.functional as F

    blocks = -(-n // BLOCK)
    shape = (2 * blocks, BLOCK, KV_HEADS, HEAD_SIZE)
    k, v = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    table = torch.randperm(2 * blocks, generator=g)[:blocks]
    q = torch.randn(n, HEADS, HEAD_SIZE, generator=g).to(dtype)
    tables = table.expand(n, -1).contiguous()
    lens = torch.arange(1, n + 1, dtype=torch.long)
    slots = (table.view(-1, 1) * BLOCK + torch.arange(BLOCK)).view(-1)[:n]
    kd, vd = (c.view(-1, KV_HEADS, HEAD_SIZE)[slots].transpose(0, 1)[None] for c in (k, v))
    qd = q.transpose(0, 1)[None]
    calls = {
        name: (lambda f=f: f(q, k, v, tables, lens, HEAD_SIZE**-0.5)) for name, f in kernels.items()
    }
    calls["sdpa"] = lambda: F.scaled_dot_product_attention(
        qd, kd, vd, is_causal=True, scale=HEAD_SIZE**-0.5, enable_gqa=True
    )
    return {name: median_ms(call, repeats) for name, call in calls.items()}


def ratio(runs: list, base: list, case: str, kernel: str) -> float:  # type: ignore[type-arg]
    """The median over rounds of a tree's time against the first tree's in the same round."""
    pairs = zip(runs, base, strict=True)
    return statistics.median(a[case][kernel] / b[case][kernel] for a, b in pairs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sources", nargs="+", default=["this=src"], help="NAME=SRC trees to time")
    p.add_argument("--cases", nargs="+", default=["1x230", "32x230", "8x2100"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=7, help="steps timed per case and round")
    p.add_argument(
        "--evict", type=int, default=0, metavar="MB", help="MB read (untimed) before each step"
    )
    p.add_argument("--out", type=Path, default=BENCH / "results" / "paged_attention.md")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.cases, args.repeats, args.dtype, args.evict)))
        return
    sources = dict(s.split("=", 1) for s in args.sources)
    load = os.getloadavg()
    results: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in sources}
    for round_ in range(args.rounds):
        for name, src in sources.items():
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            child = [sys.executable, __file__, "--child", "--repeats", str(args.repeats)]
            child += ["--dtype", args.dtype, "--evict", str(args.evict)]
            done = subprocess.run(
                [*child, "--cases", *args.cases], env=env, capture_output=True, text=True
            )
            if done.returncode:
                sys.exit(f"{name}: {done.stderr[-2000:]}")
            results[name].append(json.loads(done.stdout.splitlines()[-1]))
            print(f"round {round_ + 1} {name}: {results[name][-1]}", flush=True)
    first = next(iter(sources))
    lines = [
        *hostinfo.heading(
            "The CPU attention kernels over a decode step's caches",
            f"Load average at the start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}.",
        ),
        "",
        f"Milliseconds for one decode step's attention ({LAYERS} layers, {HEADS} query heads "
        f"over {KV_HEADS} KV heads of {HEAD_SIZE}, blocks of {BLOCK} scattered at random; "
        f"a case `Np`: one layer of an N-token prompt), caches in {args.dtype}, "
        + (f"{args.evict} MB of other memory read before each decode step, " if args.evict else "")
        + f"median over {args.rounds} rounds of the median of {args.repeats} steps; the trees "
        f"took turns each round. Ratio: against {first} in the same round, then the median.",
        "",
        "| case (sequences x context, or prompt) | kernel | "
        + " | ".join(sources)
        + " | "
        + " | ".join(f"{n} / {first}" for n in list(sources)[1:])
        + " |",
        "|---|---|" + "---|" * (2 * len(sources) - 1),
    ]
    for case in args.cases:
        for kernel in results[first][0][case]:
            cells = [
                f"{statistics.median(r[case][kernel] for r in results[n]):.2f}" for n in sources
            ]
            ratios = [
                f"{ratio(results[n], results[first], case, kernel):.2f}" for n in list(sources)[1:]
            ]
            lines.append(f"| {case} | {kernel} | " + " | ".join(cells + ratios) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
