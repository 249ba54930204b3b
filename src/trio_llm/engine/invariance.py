"""Batch invariance: every row of a step computed one way, whatever else the step holds.

A request must get the same tokens alone, batched with 31 others, chunked differently, after a
preemption or from a prefix-cache hit. The libraries under torch do not give that by default:
they pick a kernel, and with it the order in which a row's products are summed, by the shape
of the call. Measured with torch 2.13 (bench/results/step_profile.md):

- MKL's fp32 sgemm computes a lone row, 2-3 rows and the tails of 4-row blocks each its own
  way; oneDNN's matmul on plain weights computes 1 and 7 rows differently from the rest.
- oneDNN (bf16 on an AVX512-BF16 EPYC, fp32 on weights it reordered itself) is row-exact for
  any number of rows while the inner dimension is at most 1024; above it a lone row (and, in
  fp32, 7 rows) blocks the inner dimension differently. On an AMX Xeon, bf16 switches to the
  AMX kernels above 32 rows.
- The fp32 flash attention kernel runs MKL's sgemm on per-thread buffers, and MKL's results
  depend on their alignment: half the decode rows of a batch came out different from the same
  rows alone. MKL's conditional numerical reproducibility mode (CNR) removes that.
- Elementwise functions (silu, gelu) are vectorized in blocks, the block's remainder in scalar
  code that rounds differently; which elements fall in a remainder depends on how a call's
  elements are split between threads, that is on how many rows share the call.

So the engine shapes its calls itself, by construction the same for a row wherever it is:

- Matmuls (`Matmul`, following the CPU class's `MatmulPlan`): fp32 through oneDNN's inner
  product on weights reordered once at start-up, the inner dimension split into equal chunks of
  at most `K_CHUNK` that are summed left to right in fp32; bf16 through oneDNN with a lone row
  padded to two where the inner dimension is long, or in calls of at most 32 rows on AMX.
- Attention (attention/torch_backend.py, `StepLayout.key_bucket`): every query, decode or
  prefill, attends the way a decode does: alone in its own batch entry, over its context
  rounded up to `KEY_BUCKET` positions (the rest masked), so a token's row does not depend on
  the path that computes it (a decode, a prefill chunk, a recompute after preemption).
- fp32 attention runs with MKL's CNR on (`enable_reproducible_mkl`, set before MKL's first
  call: the engine process does it first thing).
- Activations run single-threaded (`rowwise`): each row then goes through the vectorized code
  alike.
- Norms, rotary embeddings and residual adds are exact elementwise operations or reductions
  along one row; the LM head is a matmul like the others; the sampler's noise is keyed by the
  request's seed and output position (engine/sampler.py).

What rests on the libraries is that a fixed call shape is computed one fixed way: `check`
verifies that on the model's own shapes at start-up (calls of many row counts, at offsets into
a larger batch, against each row alone). It is a check, not a search: a plan that fails it
means this machine lacks invariance, which `--batch-invariant on` then refuses to start
without, and `auto` turns off, saying why.

Why over 400 lines: the plans, the matmul that follows them, the start-up check and the
refusals are one argument about one property; split, each half would have to restate the
other's reasoning to be read.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

KEY_BUCKET = 64
"""With invariance on, each query attends over its context rounded up to a multiple of this,
so its attention has the same shape in any batch and on any path (StepLayout.key_bucket)."""
K_CHUNK = 1024
"""The longest inner dimension oneDNN computes one way for every number of rows."""
CHECK_ROWS = 40
"""Rows the start-up check computes alone and in calls of `CHECK_CALLS` rows."""
CHECK_CALLS = (2, 3, 5, 7, 8, 13, 32, 33, CHECK_ROWS)


class InvarianceUnavailable(Exception):
    """Batch invariance was asked for (`on`) where the engine cannot keep it; says why."""


@dataclass(frozen=True, slots=True)
class MatmulPlan:
    """How the engine shapes each matmul call so that a row's result depends on the row alone.

    Which plan a CPU class gets is knowledge of its libraries (`plan_for`); `check` verifies it
    on the machine at hand."""

    name: str
    packed: bool = False
    """oneDNN's inner product on weights reordered once, rather than `F.linear`."""
    k_chunk: int | None = None
    """Inner dimensions longer than this are split into equal chunks (multiples of 64), each
    its own call, summed left to right."""
    min_rows: int = 1
    """Calls of fewer rows are padded with zero rows to this many."""
    min_rows_k: int = 0
    """`min_rows` applies only to weights whose inner dimension is longer than this."""
    row_tile: int | None = None
    """Calls of more rows are split into calls of at most this many."""


FP32_ONEDNN = MatmulPlan(
    "fp32: oneDNN on reordered weights, inner chunks <= 1024", packed=True, k_chunk=K_CHUNK
)
BF16_AVX512 = MatmulPlan(
    "bf16: oneDNN, lone rows padded to 2 where K > 1024", min_rows=2, min_rows_k=K_CHUNK
)
BF16_AMX = MatmulPlan("bf16: oneDNN in calls of at most 32 rows", row_tile=32)
BF16_PLAIN = MatmulPlan("bf16: torch's own kernel (no oneDNN bf16 here)")
PADDED = MatmulPlan("padded calls of exactly 8 rows", min_rows=8, row_tile=8)
"""The fallback of `on` where a class's plan fails the check: one call shape for every row,
paid for in a lone stream (2-3x slower)."""


def plan_for(dtype: torch.dtype, flags: frozenset[str]) -> MatmulPlan | None:
    """The plan this CPU class's libraries make row-exact, or None where there is none."""
    if not torch.backends.mkldnn.is_available():
        return None
    if dtype is torch.float32:
        return FP32_ONEDNN
    if dtype is torch.bfloat16:
        if "amx_bf16" in flags:
            return BF16_AMX
        if "avx512_bf16" in flags:
            return BF16_AVX512
        return BF16_PLAIN
    return None


@dataclass(slots=True)
class PackedWeight:
    """A weight as oneDNN's reordered chunks of its inner dimension."""

    parts: tuple[Tensor, ...]
    spans: tuple[tuple[int, int], ...]
    """Each part's [start, end) of the inner dimension."""
    shape: torch.Size

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype


Weight = Tensor | PackedWeight


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Matmul:
    """`linear(x, weight, bias)` as the engine calls it, on weights `prepare` made once.

    Without a plan (invariance off) it is `F.linear` on the loaded weights."""

    def __init__(self, plan: MatmulPlan | None = None) -> None:
        self.plan = plan

    def __repr__(self) -> str:
        return f"Matmul({self.plan.name if self.plan else 'F.linear'})"

    def prepare(self, weight: Tensor) -> Weight:
        """The form of `weight` its calls take: reordered (and split) for a packed plan."""
        plan = self.plan
        weight = weight.detach()
        if plan is None or not plan.packed:
            return weight
        in_features = weight.shape[1]
        size = in_features
        if plan.k_chunk and in_features > plan.k_chunk:
            parts = _ceil_div(in_features, plan.k_chunk)
            size = _ceil_div(_ceil_div(in_features, parts), 64) * 64
        spans = tuple(
            (start, min(start + size, in_features)) for start in range(0, in_features, size)
        )
        reorder = torch.ops.mkldnn._reorder_linear_weight
        return PackedWeight(
            parts=tuple(reorder(weight[:, a:b].contiguous(), 32) for a, b in spans),
            spans=spans,
            shape=weight.shape,
        )

    def __call__(self, x: Tensor, weight: Weight, bias: Tensor | None = None) -> Tensor:
        plan = self.plan
        if plan is None:
            assert isinstance(weight, Tensor)
            return F.linear(x, weight, bias)
        rows = x.shape[0]
        min_rows = plan.min_rows if weight.shape[1] > plan.min_rows_k else 1
        if plan.row_tile is not None and rows > plan.row_tile:
            out = x.new_empty(rows, weight.shape[0])
            for start in range(0, rows, plan.row_tile):
                tile = x[start : start + plan.row_tile]
                out[start : start + tile.shape[0]] = self._padded(tile, weight, bias, min_rows)
            return out
        return self._padded(x, weight, bias, min_rows)

    def _padded(self, x: Tensor, weight: Weight, bias: Tensor | None, min_rows: int) -> Tensor:
        rows = x.shape[0]
        if rows >= min_rows:
            return self._call(x, weight, bias)
        padded = x.new_zeros(min_rows, x.shape[1])
        padded[:rows] = x
        return self._call(padded, weight, bias)[:rows]

    @staticmethod
    def _call(x: Tensor, weight: Weight, bias: Tensor | None) -> Tensor:
        if isinstance(weight, Tensor):
            return F.linear(x, weight, bias)
        linear = torch.ops.mkldnn._linear_pointwise
        out: Tensor | None = None
        for (start, end), part in zip(weight.spans, weight.parts):
            chunk = x if len(weight.parts) == 1 else x[:, start:end]
            y = linear(chunk, part, bias if out is None else None, "none", [], "")
            out = y if out is None else out.add_(y)
        assert out is not None
        return out


# -- the checks --------------------------------------------------------------------------------


def check_matmul(
    matmul: Matmul, shapes: Iterable[tuple[int, int]], dtype: torch.dtype, device: torch.device
) -> str | None:
    """None if every row of `shapes`' weights ((out_features, in_features)) comes out of calls
    of every size in CHECK_CALLS (views at offsets into the rows) as it does alone; else which
    shape and call size differ."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    for out_features, in_features in dict.fromkeys(shapes):
        weight = torch.randn(out_features, in_features, generator=generator) * 0.05
        prepared = matmul.prepare(weight.to(device=device, dtype=dtype))
        x = torch.randn(CHECK_ROWS, in_features, generator=generator).to(device=device, dtype=dtype)
        alone = torch.cat([matmul(row, prepared) for row in x.split(1)])
        for rows in CHECK_CALLS:
            together = torch.cat([matmul(part, prepared) for part in x.split(rows)])
            if not torch.equal(together, alone):
                return (
                    f"{matmul.plan.name if matmul.plan else 'F.linear'}: the "
                    f"{out_features}x{in_features} matmul computes rows differently in calls "
                    f"of {rows} rows than alone"
                )
    return None


AttentionShape = tuple[int, int, int, float | None]
"""(query heads, KV heads, head dim, soft-cap) of an attention layer."""


def attention_shapes(config: object, layers: Iterable[object]) -> list[AttentionShape]:
    """The distinct attention shapes of a model's layers (`generic.AttentionLayer`s: per-layer
    head dims and soft-caps), its query heads from `config`."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config  # type: ignore[attr-defined]
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
) -> str | None:
    """None if a decode-shaped attention (one query per batch entry, over a bucketed context,
    soft-capped where the layer is) gives each entry what it gives alone, whatever the batch;
    else what differs."""
    # The backend's own call (SDPA, or the soft-capped attention written out).
    from trio_llm.engine.attention.torch_backend import _sdpa

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

    def attend(sl: slice) -> Tensor:
        return _sdpa(
            q[sl], k[sl], v[sl], mask[sl], scale=head_dim**-0.5, softcap=softcap, entrywise=True
        )

    alone = torch.cat([attend(slice(i, i + 1)) for i in range(entries)])
    for size in (2, 5, entries):
        together = torch.cat([attend(slice(i, i + size)) for i in range(0, entries, size)])
        if not torch.equal(together, alone):
            capped = f" soft-capped at {softcap}" if softcap else ""
            return (
                f"{str(dtype).removeprefix('torch.')} attention{capped} (head dim {head_dim}) "
                f"computes a query differently in a batch of {size} than alone"
            )
    return None


# -- MKL's reproducibility mode ---------------------------------------------------------------

_MKL_CBWR_BRANCH = 1
_MKL_CBWR_AUTO = 2
_MKL_CBWR_STRICT = 0x10000


def _mkl_cbwr() -> tuple[Callable[[int], int], Callable[[int], int]] | None:
    """MKL's CNR get and set, from the MKL linked into torch; None without MKL."""
    if not torch.backends.mkl.is_available():
        return None
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        lib = ctypes.CDLL(path)
        get, set_ = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
    except (OSError, AttributeError):
        return None
    for fn in (get, set_):
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
    return get, set_


def enable_reproducible_mkl() -> bool:
    """Turn MKL's conditional numerical reproducibility on (AUTO, STRICT), which MKL allows only
    before its first call; True if it is on (or there is no MKL to need it)."""
    cbwr = _mkl_cbwr()
    if cbwr is None:
        return True
    get, set_ = cbwr
    if get(_MKL_CBWR_BRANCH) != _MKL_CBWR_BRANCH:  # on already (MKL_CBWR, or an earlier call)
        return True
    return set_(_MKL_CBWR_AUTO | _MKL_CBWR_STRICT) == 0


def mkl_reproducible() -> bool:
    """Whether MKL's CNR mode is on (True without MKL)."""
    cbwr = _mkl_cbwr()
    return cbwr is None or cbwr[0](_MKL_CBWR_BRANCH) != _MKL_CBWR_BRANCH


# -- elementwise functions --------------------------------------------------------------------


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """torch's intra-op threads set to one for the block (4 us a switch here)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


GRAIN_SIZE = 32768
"""ATen's `at::internal::GRAIN_SIZE`: an elementwise op over fewer elements runs on one thread."""


def rowwise(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """`fn(x)` for an elementwise `fn` with vectorized and scalar code paths, each row of `x`
    through the same path whatever rows share the call: one thread walks the rows in order
    (as ATen does by itself below GRAIN_SIZE elements, where the switch is skipped)."""
    if x.numel() < GRAIN_SIZE:
        return fn(x)
    with single_threaded():
        return fn(x)


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
    lora: bool = False,
) -> Decision:
    """The matmul an engine runs and whether invariance is on, for `--batch-invariant mode`.

    `off`: plain matmuls. `auto`: this CPU class's plan where the checks pass (each plan costs
    within 10% of a step; bench/results/step_profile.md), off otherwise, and off with quantized
    weights. `on`: the class's plan, or padded calls where only those pass; raises
    InvarianceUnavailable where neither does or the configuration cannot keep it. `heads`:
    the model's `attention_shapes`. `quantized`: some matmuls run on quantized kernels
    (engine/quant), which are row-exact but make prefill chunks 3x slower than the dequantized
    dense path a prefill takes without invariance: past the bound `auto` keeps. `lora`: the
    engine serves LoRA adapters, whose updates are grouped calls shaped by how many rows share
    an adapter: `on` is refused; `auto` keeps invariance for the requests without one."""
    if mode == "off":
        return Decision(Matmul(), False, "--batch-invariant off")
    if mode == "on" and lora:
        raise InvarianceUnavailable(
            "--batch-invariant on cannot be kept: LoRA adapters' updates are computed in grouped "
            "calls shaped by how many rows share an adapter (requests without one keep it "
            "under auto)"
        )
    if mode == "auto" and quantized:
        return Decision(
            Matmul(),
            False,
            "quantized weights would keep every prefill chunk on the quantized kernels (3x "
            "slower than dequantized at 512 rows); --batch-invariant on does that",
        )
    reason = unavailable_reason(
        dtype, device, backend=backend, single_token=single_token, model_path=model_path
    )
    plan = plan_for(dtype, flags) if reason is None else None
    if reason is None and plan is None:
        reason = f"no row-exact matmul for {str(dtype).removeprefix('torch.')} on this CPU"
    for shape in heads if reason is None else ():
        reason = reason or check_attention(*shape, dtype, device)
    if reason is None:
        assert plan is not None
        matmul = Matmul(plan)
        failed = check_matmul(matmul, shapes, dtype, device)
        if failed is None:
            return Decision(
                matmul, True, plan.name + ("; not for requests with a LoRA adapter" if lora else "")
            )
        reason = failed
        if mode == "on" and check_matmul(Matmul(PADDED), shapes, dtype, device) is None:
            return Decision(Matmul(PADDED), True, f"{PADDED.name} ({failed})")
    if mode == "on":
        raise InvarianceUnavailable(f"--batch-invariant on cannot be kept: {reason}")
    return Decision(Matmul(), False, reason)


# -- transformers' modules ----------------------------------------------------------------------


class InvariantLinear(torch.nn.Module):
    """An nn.Linear computed by a `Matmul`: how a model run on transformers' modules gets the
    engine's matmuls (`replace_linears`)."""

    def __init__(self, linear: torch.nn.Linear, matmul: Matmul) -> None:
        super().__init__()
        self.matmul = matmul
        self.weight = matmul.prepare(linear.weight)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return self.matmul(rows, self.weight, self.bias).view(*x.shape[:-1], self.out_features)


class RowwiseActivation(torch.nn.Module):
    """An activation module run through `rowwise`."""

    def __init__(self, act: torch.nn.Module) -> None:
        super().__init__()
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        return rowwise(self.act, x)


_ACTIVATIONS = (torch.nn.SiLU, torch.nn.GELU, torch.nn.Tanh, torch.nn.Sigmoid, torch.nn.Mish)


def _is_activation(module: torch.nn.Module) -> bool:
    return isinstance(module, _ACTIVATIONS) or type(module).__module__ == "transformers.activations"


def linear_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(out_features, in_features) of every nn.Linear in `model`."""
    return list(
        dict.fromkeys(
            (m.out_features, m.in_features)
            for m in model.modules()
            if isinstance(m, torch.nn.Linear)
        )
    )


def unsupported_modules(model: torch.nn.Module) -> str | None:
    """Why `replace_linears` cannot make `model` invariant, or None: matmuls outside nn.Linear
    (any weight of two or more dimensions in another module: GPT-2's Conv1D, the stacked
    expert weights a mixture of experts multiplies in grouped calls whose rows depend on the
    routing of the whole step), or a final logit soft-cap, whose tanh runs over the whole
    step's logits split between threads by their number of rows."""
    odd = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if not isinstance(m, torch.nn.Linear | torch.nn.Embedding)
            and any(p.dim() >= 2 for p in m.parameters(recurse=False))
        }
    )
    if odd:
        return (
            f"this model multiplies by weights in {', '.join(odd)} modules, outside the "
            "engine's row-exact matmuls"
        )
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "final_logit_softcapping", None) and torch.get_num_threads() > 1:
        return (
            "its final logit soft-cap (a tanh over the step's logits) is split between "
            "threads by the number of rows (run with --num-threads 1 to keep invariance)"
        )
    return None


def _one_thread(module: torch.nn.Module) -> None:
    """Run `module`'s forward on one thread (elementwise functions over many rows: the
    rotary embedding's cos and sin)."""
    saved: list[int] = []

    def before(*_: object) -> None:
        saved.append(torch.get_num_threads())
        torch.set_num_threads(1)

    def after(*_: object) -> None:
        torch.set_num_threads(saved.pop())

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)


def replace_linears(model: torch.nn.Module, matmul: Matmul) -> int:
    """Put an InvariantLinear in place of every nn.Linear of `model` and run its activation
    modules row by row, as engine/weight_sets.py swaps modules, and its rotary embeddings on
    one thread (their cos and sin over every row of the step); returns how many Linears."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                parent._modules[name] = InvariantLinear(child, matmul)
                count += 1
            elif _is_activation(child):
                parent._modules[name] = RowwiseActivation(child)
            elif type(child).__name__.endswith("RotaryEmbedding"):
                _one_thread(child)
    return count
