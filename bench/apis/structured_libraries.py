"""llguidance against xgrammar on the default model's vocabulary: the measurements the choice of
grammar engine rests on (bench/apis/structured.py's `libraries` section).

- compile: one grammar per test schema (tests/structured_cases.py), from the schema to its first
  mask filled (llguidance builds its lexer lazily, xgrammar its token masks at compile time: the
  first mask is where the two meet), compact JSON, no cache;
- mask: a seeded random walk through each schema (each step fills the mask of the allowed next
  tokens, then takes one of them at random), one row at a time, and 32 rows at a time with each
  library's parallel filler (llguidance's LLExecutor, xgrammar's BatchGrammarMatcher);
- footprint: the installed size and the declared dependencies of each package (the wheel sizes
  come from `pip download`, given with --wheels).

Rounds alternate between the two libraries, so that a change in the machine's load hits both.
"""

from __future__ import annotations

import importlib.metadata
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

VOCAB_ROWS = 32


@dataclass
class Timings:
    compile_s: list[float] = field(default_factory=list)
    mask1_s: list[float] = field(default_factory=list)
    """One row: seconds per mask."""
    mask32_s: list[float] = field(default_factory=list)
    """32 rows: seconds per batch fill."""
    walk_tokens: list[int] = field(default_factory=list)
    setup_s: float = 0.0
    """The one-time tokenizer preparation."""


def allowed_tokens(mask_row: np.ndarray, vocab: int) -> np.ndarray:
    bits = np.unpackbits(mask_row.view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


class Llg:
    name = "llguidance"

    def __init__(self, hf_tokenizer: Any, vocab: int, eos: list[int]) -> None:
        import llguidance
        import llguidance.numpy as lnp

        from trio_llm.grammar import grammar_vocabulary

        self.llg, self.lnp, self.vocab = llguidance, lnp, vocab
        t0 = time.perf_counter()
        vocabulary = grammar_vocabulary(hf_tokenizer, vocab, eos)
        self.tok, self.words = vocabulary.tokenizer, vocabulary.mask_words
        self.setup_s = time.perf_counter() - t0
        self.executor = llguidance.LLExecutor()

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        matcher = self.llg.LLMatcher(self.tok, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def fill(self, matcher: Any, mask: np.ndarray, row: int) -> None:
        self.lnp.fill_next_token_bitmask(matcher, mask, row)

    def fill_batch(self, matchers: list[Any], mask: np.ndarray) -> None:
        self.lnp.fill_next_token_bitmask_par(
            self.executor, [(m, i) for i, m in enumerate(matchers)], mask
        )

    def accept(self, matcher: Any, token: int) -> None:
        assert matcher.consume_token(token), matcher.get_error()

    def done(self, matcher: Any) -> bool:
        return matcher.is_stopped()


class Xgr:
    name = "xgrammar"

    def __init__(self, hf_tokenizer: Any, vocab: int, eos: list[int]) -> None:
        import xgrammar

        self.xgr, self.vocab = xgrammar, vocab
        self.words = (vocab + 31) // 32
        t0 = time.perf_counter()
        info = xgrammar.TokenizerInfo.from_huggingface(
            hf_tokenizer, vocab_size=vocab, stop_token_ids=eos
        )
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.setup_s = time.perf_counter() - t0
        self.batch = xgrammar.BatchGrammarMatcher()

    def compile(self, schema: dict[str, Any]) -> Any:
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, mask: np.ndarray, row: int) -> None:
        import torch

        matcher.fill_next_token_bitmask(torch.from_numpy(mask), row)

    def fill_batch(self, matchers: list[Any], mask: np.ndarray) -> None:
        import torch

        self.batch.batch_fill_next_token_bitmask(matchers, torch.from_numpy(mask))

    def accept(self, matcher: Any, token: int) -> None:
        assert matcher.accept_token(token)

    def done(self, matcher: Any) -> bool:
        return matcher.is_terminated()


Library = Llg | Xgr


def walk(lib: Library, schema: dict[str, Any], rng: random.Random, t: Timings) -> None:
    """One random walk under the schema, timing each mask after the first (which `compile`
    counts)."""
    matcher = lib.compile(schema)
    mask = np.zeros((1, lib.words), dtype=np.int32)
    steps = 0
    while not lib.done(matcher) and steps < 200:
        t0 = time.perf_counter()
        lib.fill(matcher, mask, 0)
        if steps:
            t.mask1_s.append(time.perf_counter() - t0)
        allowed = allowed_tokens(mask[0], lib.vocab)
        token = int(rng.choice(allowed.tolist()))
        lib.accept(matcher, token)
        steps += 1
    t.walk_tokens.append(steps)


def walk_batch(lib: Library, schemas: list[dict[str, Any]], rng: random.Random, t: Timings) -> None:
    """32 walks in step, one parallel fill per step; a finished walk starts over (a new matcher,
    its first mask filled apart)."""
    order = [schemas[i % len(schemas)] for i in range(VOCAB_ROWS)]
    mask = np.zeros((VOCAB_ROWS, lib.words), dtype=np.int32)

    def fresh(i: int) -> Any:
        matcher = lib.compile(order[i])
        lib.fill(matcher, mask, i)
        return matcher

    matchers = [fresh(i) for i in range(VOCAB_ROWS)]
    for _ in range(60):
        t0 = time.perf_counter()
        lib.fill_batch(matchers, mask)
        t.mask32_s.append(time.perf_counter() - t0)
        for i, m in enumerate(matchers):
            allowed = allowed_tokens(mask[i], lib.vocab)
            lib.accept(m, int(rng.choice(allowed.tolist())))
            if lib.done(m):
                matchers[i] = fresh(i)


def measure(
    hf_tokenizer: Any, vocab: int, eos: list[int], schemas: list[dict[str, Any]], rounds: int
) -> dict[str, Timings]:
    libs: list[Library] = [Llg(hf_tokenizer, vocab, eos), Xgr(hf_tokenizer, vocab, eos)]
    results = {lib.name: Timings(setup_s=lib.setup_s) for lib in libs}
    for r in range(rounds):
        for lib in libs if r % 2 == 0 else reversed(libs):
            t = results[lib.name]
            mask = np.zeros((1, lib.words), dtype=np.int32)
            for schema in schemas:
                t0 = time.perf_counter()
                lib.fill(lib.compile(schema), mask, 0)
                t.compile_s.append(time.perf_counter() - t0)
            rng = random.Random(r)
            for schema in schemas:
                walk(lib, schema, rng, t)
            walk_batch(lib, schemas, random.Random(r), t)
    return results


def footprint(dist: str, wheels: Path | None) -> tuple[str, str, str]:
    """Installed size (MB), wheel size (MB, when --wheels has it) and declared dependencies."""
    files = importlib.metadata.files(dist) or []
    size = sum(f.size or 0 for f in files if getattr(f, "size", None))
    requires = importlib.metadata.requires(dist) or []
    deps = sorted(
        {
            r.split(";")[0].split(" ")[0].split(">")[0].split("=")[0]
            for r in requires
            if "extra ==" not in r
        }
    )
    wheel = "?"
    if wheels is not None:
        stem = dist.replace("-", "_")
        found = sorted(wheels.glob(f"{stem}-*.whl"))
        if found:
            wheel = f"{found[0].stat().st_size / 1e6:.2f}"
    return f"{size / 1e6:.1f}", wheel, ", ".join(deps) or "none"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def report(results: dict[str, Timings], wheels: Path | None, uptime: Callable[[], str]) -> str:
    lines = [
        "| | llguidance | xgrammar |",
        "|---|---|---|",
    ]
    llg, xgr = results["llguidance"], results["xgrammar"]

    def row(label: str, fn: Callable[[Timings], str]) -> None:
        lines.append(f"| {label} | {fn(llg)} | {fn(xgr)} |")

    ms = 1e3
    us = 1e6
    row("tokenizer setup, once (s)", lambda t: f"{t.setup_s:.2f}")
    row(
        "compile to first mask, 20 schemas: p50 / max (ms)",
        lambda t: f"{statistics.median(t.compile_s) * ms:.2f} / {max(t.compile_s) * ms:.1f}",
    )
    row(
        "mask, 1 row: p50 / p90 / p99 (us)",
        lambda t: " / ".join(f"{pct(t.mask1_s, q) * us:.0f}" for q in (0.5, 0.9, 0.99)),
    )
    row(
        "mask, 32 rows in parallel: p50 / p90 / p99 per fill (us)",
        lambda t: " / ".join(f"{pct(t.mask32_s, q) * us:.0f}" for q in (0.5, 0.9, 0.99)),
    )
    row("  per row (us, p50)", lambda t: f"{pct(t.mask32_s, 0.5) * us / VOCAB_ROWS:.0f}")
    row(
        "random walk: tokens to finish (mean of 20 schemas)",
        lambda t: f"{statistics.mean(t.walk_tokens):.1f}",
    )
    fp = {d: footprint(d, wheels) for d in ("llguidance", "xgrammar")}
    lines.append(f"| installed size (MB) | {fp['llguidance'][0]} | {fp['xgrammar'][0]} |")
    lines.append(f"| wheel (MB) | {fp['llguidance'][1]} | {fp['xgrammar'][1]} |")
    lines.append(f"| dependencies | {fp['llguidance'][2]} | {fp['xgrammar'][2]} |")
    tvm = footprint("apache-tvm-ffi", wheels)
    lines.append(
        f"| apache-tvm-ffi (xgrammar's own) | | {tvm[0]} MB installed, {tvm[1]} MB wheel |"
    )
    lines.append("")
    lines.append(f"Load average when it ended: {uptime()}.")
    return "\n".join(lines)
