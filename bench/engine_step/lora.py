"""What LoRA adapters cost a decode step: N sequences spread over 0, 1, 4 or 16 distinct adapters.

One EngineCore per rank lives in this process (the default model, LoRA on with `max_loras` 16
and `max_lora_rank` equal to the adapters' rank), with 16 random adapters of that rank on every
attention and MLP projection, written in PEFT's format (adapter_config.json and
adapter_model.safetensors, as PEFT saves them). For each case, N requests with random prompts
of C tokens are added, sequence i on adapter i mod k (k = 0: the base model alone), prefilled,
and then decode steps are timed; the cases take turns, round after round, so that drift in a
shared VM falls on every case alike, and each case's time is the median of its steps over all
rounds. The ratio is against the base alone on the same core, measured in the same rounds.

Usage: python bench/engine_step/lora.py [--ranks 8 16 64] [--adapters 0 1 4 16] [--n 32]
       [--context 100] [--rounds 5] [--steps 6] [--dtype float32] [--quantization none]
       [--threads 2] [--out bench/results/lora.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from trio_llm.config import EngineArgs
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

MAX_LORAS = 16
GOAL = (4, 16, 1.3)
"""4 adapters of rank 16 cost at most 1.3x the base step."""


def write_adapter(path: Path, modules: dict[str, tuple[int, int]], rank: int, seed: int) -> None:
    """A random adapter of `rank` on every module, saved as PEFT saves one."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (in_features, out_features) in modules.items():
        key = f"base_model.model.{module}"
        tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_features, generator=g) * 0.02
        tensors[f"{key}.lora_B.weight"] = torch.randn(out_features, rank, generator=g) * 0.02
    path.mkdir(parents=True)
    save_file(tensors, path / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": rank,
        "target_modules": sorted({m.rsplit(".", 1)[1] for m in modules}),
        "bias": "none",
    }
    (path / "adapter_config.json").write_text(json.dumps(config))


def adaptable_modules(core: EngineCore) -> dict[str, tuple[int, int]]:
    assert core.loras is not None
    return dict(core.loras.stacks.modules)


class Case:
    def __init__(self, core: EngineCore, adapters: int, n: int, prompts: list[list[int]]) -> None:
        self.core = core
        self.adapters = adapters
        self.n = n
        self.prompts = prompts
        self.steps: list[float] = []
        self._round = 0

    def run_round(self, steps: int) -> None:
        """Add the N requests, prefill them, time `steps` decode steps, abort them."""
        core = self.core
        self._round += 1
        ids = [f"k{self.adapters}-r{self._round}-{i}" for i in range(self.n)]
        for i, (request_id, prompt) in enumerate(zip(ids, self.prompts, strict=True)):
            core.add_request(
                EngineCoreRequest(
                    request_id=request_id,
                    prompt_token_ids=prompt,
                    sampling_params=SamplingParams(
                        temperature=0.0, max_tokens=10_000, ignore_eos=True
                    ),
                    lora=f"a{i % self.adapters}" if self.adapters else None,
                )
            )
        while core.scheduler.stats().num_waiting or self._prefilling():
            core.step()
        core.step()  # the first decode step of the batch: not timed
        for _ in range(steps):
            start = time.perf_counter()
            outputs = core.step()
            self.steps.append(time.perf_counter() - start)
            assert len(outputs.outputs) == self.n
        core.abort_requests(ids)
        core.step()

    def _prefilling(self) -> bool:
        return any(
            seq.num_computed_tokens < seq.num_prompt_tokens for seq in self.core.requests.values()
        )

    @property
    def median_ms(self) -> float:
        return statistics.median(self.steps) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64])
    parser.add_argument("--adapters", type=int, nargs="+", default=[0, 1, 4, 16])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--context", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--quantization",
        default="none",
        help="none: the float checkpoint; auto: the GGUF's Q4_1 in the int4 kernels, as served",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "lora.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, 49000, (args.context,), generator=g).tolist() for _ in range(args.n)
    ]
    results: dict[int, list[Case]] = {}
    memory: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rank in args.ranks:
            engine_args = EngineArgs(
                dtype=args.dtype,
                quantization=args.quantization,
                num_threads=args.threads,
                kv_cache_memory="1GiB",
                enable_prefix_caching=False,
                enable_lora=True,
                max_loras=MAX_LORAS,
                max_lora_rank=rank,
            )
            core = EngineCore(engine_args)
            assert core.loras is not None and core.runner.own is not None
            modules = adaptable_modules(core)
            for i in range(MAX_LORAS):
                path = Path(tmp) / f"r{rank}-a{i}"
                write_adapter(path, modules, rank, seed=rank * 100 + i)
                core.loras.load(f"a{i}", str(path))
            memory[rank] = core.loras.stacks.nbytes / 2**20
            cases = [Case(core, k, args.n, prompts) for k in args.adapters]
            for _ in range(args.rounds):
                for case in cases:
                    case.run_round(args.steps)
            results[rank] = cases
            print(
                f"rank {rank}: "
                + ", ".join(f"{c.adapters} adapters {c.median_ms:.1f} ms" for c in cases),
                flush=True,
            )
            del core
    write_report(args, results, memory)


def write_report(
    args: argparse.Namespace, results: dict[int, list[Case]], memory: dict[int, float]
) -> None:
    lines = [
        *hostinfo.heading(
            "LoRA adapters: the cost of a decode step",
            f"{args.threads} torch thread(s); load average at the end {os.getloadavg()[0]:.1f}.",
        ),
        "",
        f"EngineCore in process, the default model (SmolLM2-135M-Instruct) in {args.dtype}, "
        f"quantization {args.quantization}, its own forward; {args.n} sequences of "
        f"{args.context} prompt tokens decoding together, sequence i on adapter i mod k "
        "(k = 0: the base model alone); "
        f"{MAX_LORAS} random adapters loaded per rank, on every attention and MLP projection, "
        f"`max_lora_rank` = their rank. Medians of {args.rounds} rounds x {args.steps} steps, "
        "the cases taking turns round by round. Ratio: against the base alone on the same "
        "engine, in the same rounds.",
        "",
        "| rank | adapters | step (ms) | tok/s | vs base |",
        "|---|---|---|---|---|",
    ]
    for rank, cases in results.items():
        base = next(c for c in cases if c.adapters == 0).median_ms
        for case in cases:
            ms = case.median_ms
            lines.append(
                f"| {rank} | {case.adapters} | {ms:.1f} | {args.n / ms * 1e3:.0f} | "
                f"{ms / base:.2f}x |"
            )
    lines += ["", "Slot memory (all 16 slots, allocated at start): "]
    lines[-1] += ", ".join(f"rank {r}: {mib:.0f} MiB" for r, mib in memory.items()) + "."
    k, rank, bound = GOAL
    if rank in results:
        cases = {c.adapters: c for c in results[rank]}
        if k in cases and 0 in cases:
            ratio = cases[k].median_ms / cases[0].median_ms
            verdict = "met" if ratio <= bound else "NOT met"
            lines += [
                "",
                f"Goal: {k} adapters of rank {rank} at most {bound}x the base step: "
                f"{ratio:.2f}x, {verdict}.",
            ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
