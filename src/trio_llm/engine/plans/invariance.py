"""Batch invariance: every row of a step computed one way, whatever else the step holds.

A request must get the same tokens alone, batched with 31 others, chunked differently, after a
preemption or from a prefix-cache hit. The libraries under torch do not give that by default:
they pick a kernel, and with it the order in which a row's products are summed, by the shape
of the call. Measured with torch 2.13 (bench/results/step_profile.md):

- MKL's fp32 sgemm computes a lone row, 2-3 rows and the tails of 4-row blocks each its own
  way; oneDNN's matmul on plain weights computes 1 and 7 rows differently from the rest.
- oneDNN's inner product on weights it reordered itself (bf16 on an AVX512-BF16 EPYC, fp32)
  is row-exact for any number of rows from two up; a lone row takes another kernel, and in
  fp32 7 rows block the inner dimension differently above 1024. Its matmul on plain bf16
  weights was not row-exact on an EPYC even from two rows up (K=64, N=32: 2-row calls against
  16-row ones), which only a check of many distinct rows saw. On an AMX Xeon,
  bf16 switches to the AMX kernels above 32 rows.
- The fp32 flash attention kernel runs MKL's sgemm on per-thread buffers, and MKL's results
  depend on their alignment: half the decode rows of a batch came out different from the same
  rows alone. MKL's conditional numerical reproducibility mode (CNR) removes that.
- Elementwise functions (silu, gelu) are vectorized in blocks, the block's remainder in scalar
  code that rounds differently; which elements fall in a remainder depends on how a call's
  elements are split between threads, that is on how many rows share the call.

So the engine shapes its calls itself, by construction the same for a row wherever it is:

- Matmuls (`Matmul`, following the CPU class's `MatmulPlan`): fp32 on our own strip kernel
  (ops/f32_rows.py), each output one chain of FMAs over the inputs in order at any row count,
  or where it is not built through oneDNN's inner product on weights reordered once at
  start-up, the inner dimension split into equal chunks of at most `K_CHUNK` that are summed
  left to right in fp32; bf16 on our own strip kernel (ops/bf16_rows.py: one `vdpbf16ps` chain
  an output, or with AMX every call on the tiles), or where it is not built through oneDNN's
  inner product on reordered weights with a lone row padded to two, or in calls of at most 32
  rows on AMX.
- Attention (attention/torch_backend.py, `StepLayout.key_bucket`): every query, decode or
  prefill, attends the way a decode does, so a token's row does not depend on the path that
  computes it (a decode, a prefill chunk, a recompute after preemption): where the in-place
  decode kernel is built (ops/paged_decode.py), as one of its decodes, which it computes from
  the query's own context alone; elsewhere on SDPA, alone in its own batch entry, over its
  context rounded up to `KEY_BUCKET` positions (the rest masked).
- fp32 attention runs with MKL's CNR on (`enable_reproducible_mkl`, set before MKL's first
  call: the engine process does it first thing).
- Activations run single-threaded (`rowwise`): each row then goes through the vectorized code
  alike.
- Norms, rotary embeddings and residual adds are exact elementwise operations or reductions
  along one row; the LM head is a matmul like the others; the sampler's noise is keyed by the
  request's seed and output position (engine/step/sampler.py).

What rests on the libraries is that a fixed call shape is computed one fixed way: `check`
verifies that on the model's own shapes at start-up (calls of many row counts, at offsets into
a larger batch, against each row alone). It is a check, not a search: a plan that fails it
means this machine lacks invariance, which `--batch-invariant on` then refuses to start
without, and `auto` turns off, saying why.

Where each part lives: the plans and the matmul that follows them in ops/matmul.py, `rowwise`
and MKL's mode in ops/threads.py (attention and the own forwards call them), transformers'
modules rewritten for it in plans/invariant_modules.py; here, the start-up checks and the
decision.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from trio_llm.engine.attention.torch_backend import sdpa
from trio_llm.engine.hf import text_config
from trio_llm.engine.ops.matmul import PADDED, Matmul, fastest, plan_for
from trio_llm.engine.ops.threads import mkl_reproducible

log = logging.getLogger(__name__)

KEY_BUCKET = 64
"""With invariance on, each query attends over its context rounded up to a multiple of this,
so its attention has the same shape in any batch and on any path (StepLayout.key_bucket)."""
QUANTIZED_PRICE = (
    "; quantized weights on the row-exact kernel, the fastest here with invariance or without, "
    "every query read from the cache in place: decode steps as fast as without invariance, a "
    "1,000- or 2,000-token prompt's prefill up to 1.07x (measured on an AMD "
    "EPYC, and with every library held to AVX2)"
)
"""What `auto`'s invariance with quantized weights costs (`quantized_free`), said at start-up:
on an AMD EPYC with the integer kernel, decode steps of 1-32 rows 0.94-1.01x and a 1,000- or
2,000-token prefill 0.99-1.0x the time without invariance in bf16 (bench/results/
step_profile_int_rows_epyc.md), 0.97-1.02x in float32 (step_profile_fp32_epyc.md); with every
library held to AVX2, float32, decode steps 0.95-0.99x, prefill 1.03x and 1.07x
(step_profile_avx2.md)."""
CHECK_ROWS = 40
"""Distinct rows the start-up check computes alone; calls of more rows repeat them. Few rows
can miss a kernel that sums a row another way, since the bf16 bits often agree: 40 and 128
missed oneDNN's plain bf16 matmul on an EPYC, 256 caught it (its plan's test checks 256,
tests/engine/test_batch_invariance.py); 256 at start-up is unmeasured on the AMX class."""
CHECK_CALLS = (2, 3, 5, 7, 8, 13, 32, 33, CHECK_ROWS)
STEP_ROWS = 512
"""The rows of the largest call the check tries unless told (the CPU's step budget)."""


def call_sizes(max_rows: int) -> list[int]:
    """The call sizes the check tries: the small ones where libraries switch kernels (a lone
    row, 7 rows, 32 on AMX), then each power of two from 64 and the size one past it (a full
    last block, and a tail of one row), up to the largest call the engine makes, itself
    included: a step's matmuls take up to its token budget of rows, and a library may block
    large calls another way. Each new size costs oneDNN a kernel compiled for it, so no more."""
    sizes = set(CHECK_CALLS)
    power = 64
    while power <= max_rows:
        sizes |= {power, power + 1}
        power *= 2
    sizes.add(max_rows)
    return sorted(size for size in sizes if size <= max_rows)


class InvarianceUnavailable(Exception):
    """Batch invariance was asked for (`on`) where the engine cannot keep it; says why."""


# -- the checks --------------------------------------------------------------------------------


def check_matmul(
    matmul: Matmul,
    shapes: Iterable[tuple[int, int]],
    dtype: torch.dtype,
    device: torch.device,
    max_rows: int = STEP_ROWS,
) -> str | None:
    """None if every row of `shapes`' weights ((out_features, in_features)) comes out of calls
    of every `call_sizes(max_rows)` size as it does alone; else which shape and call size
    differ. The calls are views at offsets into one batch (alignment counts, as in a step),
    whose rows cycle through CHECK_ROWS distinct ones: a call of 512 rows is checked against 40
    single-row calls, and the check costs about as much as one pass over the sizes' rows."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    sizes = call_sizes(max_rows)
    for out_features, in_features in dict.fromkeys(shapes):
        weight = torch.randn(out_features, in_features, generator=generator) * 0.05
        prepared = matmul.prepare(weight.to(device=device, dtype=dtype))
        x = torch.randn(CHECK_ROWS, in_features, generator=generator).to(device=device, dtype=dtype)
        alone = torch.cat([matmul(row, prepared) for row in x.split(1)])
        source = torch.arange(2 * sizes[-1]) % CHECK_ROWS
        batch = x[source]
        for rows in sizes:
            start = rows % CHECK_ROWS  # a different offset for each size
            together = matmul(batch[start : start + rows], prepared)
            if not torch.equal(together, alone[source[start : start + rows]]):
                return (
                    f"{matmul.plan.name if matmul.plan else 'F.linear'}: the "
                    f"{out_features}x{in_features} matmul computes rows differently in calls "
                    f"of {rows} rows than alone"
                )
    return None


AttentionShape = tuple[int, int, int, float | None]
"""(query heads, KV heads, head dim, soft-cap) of an attention layer."""


def attention_shapes(config: object, layers: Iterable[object]) -> list[AttentionShape]:
    """The distinct attention shapes of a model's layers (`attention_layers.AttentionLayer`s:
    per-layer head dims and soft-caps), its query heads from `config`."""
    text = text_config(config)
    heads = int(text.num_attention_heads)  # type: ignore[attr-defined]
    return list(
        dict.fromkeys(
            (heads, int(layer.num_kv_heads), int(layer.head_dim), layer.softcap)  # type: ignore[attr-defined]
            for layer in layers
        )
    )


def check_attention(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    softcap: float | None,
    dtype: torch.dtype,
    device: torch.device,
    max_rows: int = STEP_ROWS,
) -> str | None:
    """None if a decode-shaped attention (one query per batch entry, over a bucketed context,
    soft-capped where the layer is) gives each entry what it gives alone, in batches of every
    `call_sizes(max_rows)` size (with invariance on a prefill's queries are entries too, so a
    step attends up to its token budget of them); else what differs."""
    generator = torch.Generator(device="cpu").manual_seed(1)
    group = num_heads // num_kv_heads
    entries = 12
    length = 2 * KEY_BUCKET

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    q = randn(entries, num_kv_heads, group, head_dim)
    k = randn(entries, num_kv_heads, length, head_dim)
    v = randn(entries, num_kv_heads, length, head_dim)
    lens = torch.randint(KEY_BUCKET + 1, length + 1, (entries,), generator=generator)
    mask = (torch.arange(length)[None, :] < lens[:, None])[:, None, None, :].to(device)

    def attend(idx: Tensor) -> Tensor:
        return sdpa(  # the backend's own call
            q[idx], k[idx], v[idx], mask[idx], scale=head_dim**-0.5, softcap=softcap,
            entrywise=True,
        )  # fmt: skip

    alone = torch.cat([attend(torch.tensor([i])) for i in range(entries)])
    for size in [2, 5, entries, *(n for n in call_sizes(max_rows) if n > entries)]:
        idx = (torch.arange(size) + size) % entries
        if not torch.equal(attend(idx), alone[idx]):
            capped = f" soft-capped at {softcap}" if softcap else ""
            return (
                f"{str(dtype).removeprefix('torch.')} attention{capped} (head dim {head_dim}) "
                f"computes a query differently in a batch of {size} than alone"
            )
    return None


# -- the decision at start-up -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    matmul: Matmul
    on: bool
    reason: str
    """Why it is on or off, for the log."""

    def describe(self) -> str:
        return f"{'on' if self.on else 'off'}: {self.reason}"


def unavailable_reason(
    dtype: torch.dtype,
    device: torch.device,
    *,
    backend: str,
    single_token: bool,
    model_path: str | None,
) -> str | None:
    """Why this engine's configuration cannot keep batch invariance, or None if it can."""
    if device.type != "cpu":
        return f"it is built for the CPU path, and this engine runs on {device.type}"
    if backend != "torch":
        return f"the {backend} attention backend does not keep it (use the torch backend)"
    if single_token:
        return "--single-token-dtype computes a lone stream on other weights than a batch"
    if model_path is not None:
        return model_path
    if dtype is torch.float32 and not mkl_reproducible():
        return (
            "float32 attention needs MKL's reproducibility mode, which MKL only takes before "
            "its first call, and MKL had already run (set MKL_CBWR=AUTO,STRICT)"
        )
    return None


def decide(
    mode: str,
    *,
    dtype: torch.dtype,
    device: torch.device,
    flags: frozenset[str],
    shapes: list[tuple[int, int]],
    heads: Iterable[AttentionShape],
    backend: str = "torch",
    single_token: bool = False,
    model_path: str | None = None,
    quantized: bool = False,
    quantized_free: bool = False,
    lora: bool = False,
    max_rows: int = STEP_ROWS,
) -> Decision:
    """The matmul an engine runs and whether invariance is on, for `--batch-invariant mode`.

    `off`: plain matmuls. `auto`: this CPU class's plan where the checks pass (each plan costs
    within 10% of a step; bench/results/step_profile.md), off otherwise, and off with quantized
    weights. `on`: the class's plan, or padded calls where only those pass; raises
    InvarianceUnavailable where neither does or the configuration cannot keep it. `heads`:
    the model's `attention_shapes`. `quantized`: some matmuls run on quantized kernels
    (engine/quant), which are row-exact but make prefill chunks 3x slower than the dequantized
    dense path a prefill takes without invariance: past the bound `auto` keeps, unless
    `quantized_free`: the quantized matrices run on the row-exact kernel that is the default's
    for every row anyway (ops/row_exact.py's `invariance_free`) and every query reads the cache
    in place (ops/paged_amx.py on AVX512-BF16, else ops/paged_decode.py), where invariance was
    measured to cost a decode step nothing and a prefill at most 1.07x (`QUANTIZED_PRICE`,
    said at start-up). `lora`: the engine serves LoRA adapters, whose updates are grouped calls
    shaped by how many rows share an adapter: `on` is refused; `auto` keeps invariance for the
    requests without one.
    `max_rows`: the most rows a matmul call takes (the step's token budget)."""
    if mode == "off":
        return Decision(fastest(dtype, device, flags), False, "--batch-invariant off")
    if mode == "on" and lora:
        raise InvarianceUnavailable(
            "--batch-invariant on cannot be kept: LoRA adapters' updates are computed in grouped "
            "calls shaped by how many rows share an adapter (requests without one keep it "
            "under auto)"
        )
    if mode == "auto" and quantized and not quantized_free:
        return Decision(
            fastest(dtype, device, flags),
            False,
            "quantized weights would keep every prefill chunk on the row-exact quantized "
            "kernels (a prompt 1.7-2.2x as long on an AMX Xeon, served tok/s 0.66-0.71x "
            "at 32 streams; decode steps cost nothing); --batch-invariant on does that",
        )
    reason = unavailable_reason(
        dtype, device, backend=backend, single_token=single_token, model_path=model_path
    )
    plan = plan_for(dtype, flags) if reason is None else None
    if reason is None and plan is None:
        reason = f"no row-exact matmul for {str(dtype).removeprefix('torch.')} on this CPU"
    for shape in heads if reason is None else ():
        reason = reason or check_attention(*shape, dtype, device, max_rows)
    if reason is None:
        assert plan is not None
        matmul = Matmul(plan)
        failed = check_matmul(matmul, shapes, dtype, device, max_rows)
        if failed is None:
            return Decision(
                matmul,
                True,
                plan.name
                + ("; not for requests with a LoRA adapter" if lora else "")
                + (QUANTIZED_PRICE if quantized and quantized_free and mode == "auto" else ""),
            )
        reason = failed
        if mode == "on" and check_matmul(Matmul(PADDED), shapes, dtype, device, max_rows) is None:
            return Decision(Matmul(PADDED), True, f"{PADDED.name} ({failed})")
    if mode == "on":
        raise InvarianceUnavailable(f"--batch-invariant on cannot be kept: {reason}")
    return Decision(fastest(dtype, device, flags), False, reason)
