"""N-gram speculation on a lone stream: repetitive text against free text, drafts off and on.

Two EngineCores in this process on the default model in its own formats (one with
`ngram_speculation` off, one on), taking turns on the same greedy requests so drift in a shared
VM falls on both alike. Repetitive: the model is asked to repeat a passage it was given (what
prompt lookup exists for: quoting, editing code, filling a template); free: a story from a short
instruction. Reports ms per output token, the tokens per step, and whether the outputs were
equal.

Usage: python bench/engine_step/speculative.py [--rounds 3] [--tokens 96] [--threads 2]
       [--out bench/results/speculative.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from trio_llm.config import EngineArgs
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.model_files import load_tokenizer, resolve_model
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

PASSAGE = (
    "def moving_average(values, window):\n"
    "    if window <= 0:\n"
    "        raise ValueError('window must be positive')\n"
    "    total = sum(values[:window])\n"
    "    averages = [total / window]\n"
    "    for i in range(window, len(values)):\n"
    "        total += values[i] - values[i - window]\n"
    "        averages.append(total / window)\n"
    "    return averages\n"
)
WORKLOADS = {
    "repetitive": "Rename the function moving_average to rolling_mean in this code and give the "
    "whole code back, nothing else:\n\n" + PASSAGE,
    "free": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def run_one(core: EngineCore, prompt: list[int], tokens: int) -> tuple[float, int, list[int]]:
    """Seconds, steps and tokens of one greedy request decoded alone."""
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    core.add_request(EngineCoreRequest("r", prompt, params))
    core.step()  # the prefill (and first token): not what drafts change
    out: list[int] = []
    steps = 0
    t0 = time.perf_counter()
    while core.has_work():
        steps += 1
        for o in core.step().outputs:
            out += o.new_token_ids
    return time.perf_counter() - t0, steps, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=BENCH / "results" / "speculative.md")
    args = p.parse_args()
    tokenizer = load_tokenizer(resolve_model(None))
    cores = {
        mode: EngineCore(
            EngineArgs(
                num_threads=args.threads,
                ngram_speculation=mode,
                kv_cache_memory="64MiB",
                enable_prefix_caching=False,
            )
        )
        for mode in ("off", "on")
    }
    rows = []
    for name, text in WORKLOADS.items():
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(chat, add_special_tokens=False)["input_ids"]
        times: dict[str, list[float]] = {"off": [], "on": []}
        steps: dict[str, int] = {}
        outputs: dict[str, list[int]] = {}
        for round_ in range(args.rounds + 1):  # round 0 warms up
            for mode, core in cores.items():
                seconds, n_steps, out = run_one(core, prompt, args.tokens)
                if round_:
                    times[mode].append(seconds / (len(out) - 1))
                steps[mode], outputs[mode] = n_steps, out
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        rows.append((name, len(prompt), off, on, steps, outputs["off"] == outputs["on"]))
        print(rows[-1][:4], steps, rows[-1][5], flush=True)
    lines = [
        *hostinfo.heading("N-gram speculation on a lone stream"),
        "",
        "EngineCore in process, the default model in its own formats (Q4_1 as int4), one greedy "
        f"request alone, {args.tokens} output tokens (EOS ignored), decode time after the "
        f"prefill step; medians of {args.rounds} runs, the two cores taking turns. Drafts: up "
        "to 4 tokens by n-gram prompt lookup (engine/step/speculative.py). `repetitive`: rename a "
        "function in a 9-line snippet and give the code back; `free`: a short story.",
        "",
        "| workload | prompt tokens | drafts off (ms/token) | drafts on (ms/token) | on / off "
        "| decode steps off / on | same output |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, n_prompt, off, on, steps, same in rows:
        lines.append(
            f"| {name} | {n_prompt} | {off * 1e3:.1f} | {on * 1e3:.1f} | {on / off:.2f} | "
            f"{steps['off']} / {steps['on']} | {'yes' if same else 'no'} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
