"""EngineCore in this process on the default model: what the grammar costs a step, and what
jump-forward saves (bench/apis/structured.py's `engine` section).

Step time: 32 sequences decode together, each constrained to a list of 8 records of one of the
test schemas (cycled: the states the schema set visits, over enough tokens that all 32 are
still running for the timed steps), against the same 32 prompts unconstrained (ignore_eos).
Only steps that compute exactly 32 tokens with 32 running (no prefill) are timed. Jump-forward
is off for this part, so that every constrained step is a 32-row decode too. The two workloads
alternate in rounds, so a change in the machine's load hits both. Beside the step time: how
long the mask fill took (it runs in a thread, overlapping the decoder) and how long applying the
bitmask to the logits took (on the critical path).

Steps per output token: the 20 schemas, greedy, sent together, with jump-forward and without;
for each request, the engine steps that gave it tokens over the tokens it got.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from structured_cases import SCHEMAS  # tests/structured_cases.py
from trio_llm import model_files
from trio_llm.config import EngineArgs
from trio_llm.constraint import Constraint
from trio_llm.engine.step import model_runner
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

ROWS = 32


@dataclass
class StepTimes:
    steps: list[float] = field(default_factory=list)
    fills: list[float] = field(default_factory=list)
    applies: list[float] = field(default_factory=list)


class Probe:
    """Times each mask fill and each bitmask application, and records each step's batch."""

    def __init__(self, core: EngineCore) -> None:
        self.fills: list[float] = []
        self.applies: list[float] = []
        self.last_tokens = 0
        manager = core.structured
        fill, apply = manager._fill, model_runner.apply_bitmask
        schedule = core.scheduler.schedule

        def timed_fill(*args: Any) -> None:
            t0 = time.perf_counter()
            fill(*args)
            self.fills.append(time.perf_counter() - t0)

        def timed_apply(*args: Any) -> None:
            t0 = time.perf_counter()
            apply(*args)
            self.applies.append(time.perf_counter() - t0)

        def recorded_schedule() -> Any:
            batch = schedule()
            self.last_tokens = batch.total_tokens
            return batch

        manager._fill = timed_fill  # type: ignore[method-assign]
        model_runner.apply_bitmask = timed_apply  # type: ignore[assignment]
        core.scheduler.schedule = recorded_schedule  # type: ignore[method-assign]


def chat_prompts(tokenizer: Any) -> list[list[int]]:
    out = []
    for case in SCHEMAS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": case.prompt}], tokenize=False, add_generation_prompt=True
        )
        out.append(list(tokenizer.encode(text, add_special_tokens=False)))
    return out


RECORDS = 8


def _params(i: int, constrained: bool) -> SamplingParams:
    if constrained:
        record = dict(SCHEMAS[i % len(SCHEMAS)].schema)
        defs = record.pop("$defs", {})  # "#/$defs/..." refers to the root
        schema = {"type": "array", "items": record, "minItems": RECORDS, "maxItems": RECORDS}
        if defs:
            schema["$defs"] = defs
        constraint = Constraint.json_schema(schema)
        return SamplingParams(temperature=0.0, max_tokens=400, constraint=constraint)
    return SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)


def decode_round(
    core: EngineCore,
    probe: Probe,
    prompts: list[list[int]],
    constrained: bool,
    steps: int,
    out: StepTimes,
    tag: str,
) -> None:
    """Up to `steps` timed 32-row decode steps of one workload (fewer if a request ends)."""
    ids = [f"{tag}-{i}" for i in range(ROWS)]
    for i, rid in enumerate(ids):
        prompt = prompts[i % len(prompts)]
        core.add_request(EngineCoreRequest(rid, prompt, _params(i, constrained)))
    timed = 0
    while timed < steps:
        if not core.has_work():
            time.sleep(core.idle_timeout() or 0.001)
            continue
        fills, applies = len(probe.fills), len(probe.applies)
        t0 = time.perf_counter()
        result = core.step()
        dt = time.perf_counter() - t0
        if ended := [o for o in result.outputs if o.finish_reason is not None]:
            assert ended[0].finish_reason != "error", ended[0].error
            break
        if probe.last_tokens == ROWS and result.stats.num_running == ROWS:
            out.steps.append(dt)
            out.fills += probe.fills[fills:]
            out.applies += probe.applies[applies:]
            timed += 1
    core.abort_requests(ids)
    while core.has_work():
        core.step()


def steps_per_token(core: EngineCore, prompts: list[list[int]], tag: str) -> tuple[float, float]:
    """Per request, steps that gave it tokens over its tokens (mean), and the wall seconds."""
    outputs: dict[str, int] = {}
    tokens: dict[str, int] = {}
    t0 = time.perf_counter()
    for i, case in enumerate(SCHEMAS):
        rid = f"{tag}-{i}"
        outputs[rid] = tokens[rid] = 0
        params = SamplingParams(
            temperature=0.0, max_tokens=160, constraint=Constraint.json_schema(case.schema)
        )
        core.add_request(EngineCoreRequest(rid, prompts[i], params))
    done = 0
    while done < len(SCHEMAS):
        if not core.has_work():
            time.sleep(core.idle_timeout() or 0.001)
            continue
        for o in core.step().outputs:
            outputs[o.request_id] += 1
            tokens[o.request_id] += len(o.new_token_ids)
            done += o.finish_reason is not None
    wall = time.perf_counter() - t0
    return statistics.mean(outputs[r] / tokens[r] for r in outputs), wall


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def measure(model: str | None, dtype: str, rounds: int, steps: int, uptime: Any) -> str:
    source = model_files.resolve_model(model)
    tokenizer = model_files.load_tokenizer(source)
    prompts = chat_prompts(tokenizer)
    args = dict(
        model=model or source.origin, dtype=dtype, kv_cache_memory="512MiB", jump_forward=False
    )
    core = EngineCore(EngineArgs(**args))  # type: ignore[arg-type]
    probe = Probe(core)
    constrained, plain = StepTimes(), StepTimes()
    loads = [uptime()]
    decode_round(core, probe, prompts, True, 3, StepTimes(), "warm")  # tokenizer, compiles
    for r in range(rounds):
        first, second = (constrained, plain) if r % 2 == 0 else (plain, constrained)
        decode_round(core, probe, prompts, first is constrained, steps, first, f"a{r}")
        decode_round(core, probe, prompts, second is constrained, steps, second, f"b{r}")
        loads.append(uptime())
    ms = 1e3
    c50, p50 = pct(constrained.steps, 0.5), pct(plain.steps, 0.5)
    lines = [
        f"### Step time at {ROWS} running sequences (dtype {core.ready.dtype}, "
        f"{core.runner.device}, jump-forward off)",
        "",
        f"{rounds} rounds x {steps} timed steps per workload, alternating. Load average "
        f"before and after each round: {'; '.join(loads)}.",
        "",
        "| | p50 (ms) | p90 (ms) | mean (ms) |",
        "|---|---|---|---|",
        f"| step, none constrained | {p50 * ms:.1f} | {pct(plain.steps, 0.9) * ms:.1f} | "
        f"{statistics.mean(plain.steps) * ms:.1f} |",
        f"| step, all {ROWS} constrained | {c50 * ms:.1f} | {pct(constrained.steps, 0.9) * ms:.1f}"
        f" | {statistics.mean(constrained.steps) * ms:.1f} |",
        f"| mask fill, {ROWS} rows (in its thread, beside the decoder) | "
        f"{pct(constrained.fills, 0.5) * ms:.2f} | {pct(constrained.fills, 0.9) * ms:.2f} | "
        f"{statistics.mean(constrained.fills) * ms:.2f} |",
        f"| bitmask applied to the logits | {pct(constrained.applies, 0.5) * ms:.2f} | "
        f"{pct(constrained.applies, 0.9) * ms:.2f} | "
        f"{statistics.mean(constrained.applies) * ms:.2f} |",
        "",
        f"Constrained over unconstrained step, p50: {c50 / p50:.3f} "
        f"({(c50 / p50 - 1) * 100:+.1f}%).",
        "",
    ]
    del core
    jumped = EngineCore(EngineArgs(**{**args, "jump_forward": True}))  # type: ignore[arg-type]
    plain_core = EngineCore(EngineArgs(**args))  # type: ignore[arg-type]
    spt: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    before = uptime()
    steps_per_token(jumped, prompts, "warm-on")
    steps_per_token(plain_core, prompts, "warm-off")
    for r in range(rounds):
        spt["on"].append(steps_per_token(jumped, prompts, f"on{r}"))
        spt["off"].append(steps_per_token(plain_core, prompts, f"off{r}"))
    lines += [
        f"### Engine steps per output token, {len(SCHEMAS)} schemas sent together (greedy)",
        "",
        f"{rounds} interleaved rounds; load average {before} before, {uptime()} after.",
        "",
        "| jump-forward | steps per output token (mean over requests) | wall s for the set (p50) |",
        "|---|---|---|",
    ]
    for key, label in (("on", "on"), ("off", "off")):
        values = spt[key]
        lines.append(
            f"| {label} | {statistics.mean(v[0] for v in values):.3f} | "
            f"{statistics.median(v[1] for v in values):.2f} |"
        )
    return "\n".join(lines)
