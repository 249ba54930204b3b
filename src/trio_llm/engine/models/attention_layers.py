"""What each attention layer of a transformers model asks of attention, found at start-up, and
the refusal of what the engine's paged attention cannot honour.

The generic path (generic.py) runs any causal LM that transformers implements with every
attention layer calling the engine's `paged_attention`. What a model's layers ask of attention
must reach that call, or the model must be refused: the engine never runs a model wrong.
`inspect` finds out by running the decoder once on a few tokens with recording functions in
place of the attention and of the mask builder, and reads what each layer passed: its
key/value heads and head dim (the layer's cache shape, which may differ between layers), its
sliding window and score soft-cap (which the backends honour), and the mask the model built for
it, evaluated on a grid of positions, which must be causal (with the layer's window).
Everything else is refused with the reason: layers that keep recurrent or convolutional state
instead of attending, attention sinks, position biases, chunked or bidirectional masks, keys and
values of different widths. `attention_backend` then picks the backend that honours what the
layers ask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from trio_llm.engine.attention import ATTN_IMPLEMENTATION
from trio_llm.engine.hf import decoder_of, language_model_of, text_config
from trio_llm.model_files import UnsupportedModelError

INSPECT_IMPLEMENTATION = "trio_inspect"
"""The attention and mask implementation `inspect` switches the model to while it records."""

_HONOURED = frozenset({"sliding_window", "softcap"})
"""Keyword arguments of the attention call that change its result and that the engine honours."""
_INERT = frozenset(
    {
        "dropout",
        "position_ids",
        "cache_position",
        "use_cache",
        "output_attentions",
        "layer_idx",
        "is_causal",
        "trio_attn",
        "position_embeddings",
    }
)
"""Keyword arguments that do not change an inference-time attention result (or are checked
apart, like `is_causal`)."""
_NAMED = {
    "s_aux": "attention sinks",
    "sinks": "attention sinks",
    "position_bias": "a relative position bias added to the attention scores",
    "head_mask": "a per-head mask",
}
"""How a refusal names what a known argument means."""
_RUNNABLE_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "sparse", "dense"})
"""`config.layer_types` entries the paged attention runs (attention kinds, and MLP kinds)."""


@dataclass(frozen=True, slots=True)
class AttentionLayer:
    """One attention layer as the model's forward showed it."""

    module: torch.nn.Module
    """The module transformers hands the attention function; its cache hangs on it."""
    num_kv_heads: int
    head_dim: int
    window: int | None
    """Its sliding window: a query at position p sees the positions (p - window, p]."""
    softcap: float | None
    """Its attention scores are soft-capped at `softcap * tanh(score / softcap)`."""


@dataclass(slots=True)
class _Call:
    module: torch.nn.Module
    key_shape: tuple[int, ...]
    value_shape: tuple[int, ...]
    mask: object
    kwargs: dict[str, object]


@dataclass(slots=True)
class _Recording:
    calls: list[_Call] = field(default_factory=list)
    masks: dict[int, _MaskPattern] = field(default_factory=dict)
    """id of each mask tensor the builders handed the model -> its pattern."""


@dataclass(frozen=True, slots=True)
class _MaskPattern:
    """The mask the model built, as a [grid, grid] bool table of (query, key) positions."""

    visible: Tensor


_GRID = 64
"""Positions the recorded masks are evaluated on (widened to cover twice the largest window)."""
_recording: _Recording | None = None
_grid = _GRID


def _record_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: object,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[Tensor, None]:
    assert _recording is not None
    mask = _recording.masks.get(id(attention_mask), attention_mask)
    _recording.calls.append(_Call(module, tuple(key.shape), tuple(value.shape), mask, dict(kwargs)))
    batch, heads, tokens, _ = query.shape
    return query.new_zeros(batch, tokens, heads, value.shape[-1]), None


def _record_mask(
    *,
    mask_function: Callable[..., Tensor],
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    **kwargs: object,
) -> Tensor:
    """Stands in for transformers' mask builders: evaluates the model's mask function on a grid
    of positions (mask functions are index arithmetic, so broadcast index tensors serve), and
    hands the model the boolean mask of its input, as SDPA's builder would."""
    assert _recording is not None

    def evaluate(queries: Tensor, keys: Tensor) -> Tensor:
        zero = torch.zeros(1, 1, 1, 1, dtype=torch.long)
        visible = mask_function(zero, zero, queries.view(1, 1, -1, 1), keys.view(1, 1, 1, -1))
        return torch.as_tensor(visible).expand(1, 1, len(queries), len(keys))

    grid = torch.arange(_grid)
    mask = evaluate(
        torch.arange(q_offset, q_offset + q_length), torch.arange(kv_offset, kv_offset + kv_length)
    ).clone()
    _recording.masks[id(mask)] = _MaskPattern(evaluate(grid, grid)[0, 0].clone())
    return mask


def register_inspection() -> None:
    """Make `trio_inspect` a loadable attention and mask implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(INSPECT_IMPLEMENTATION, _record_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(INSPECT_IMPLEMENTATION, _record_mask)


def check_class(config: object, name: str) -> None:
    """Refuse, before any weight is read, a causal LM whose transformers class computes its
    attention itself instead of through the attention interface (ALiBi models such as Bloom,
    MPT and Falcon among them): the paged attention could not take its place."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    text = text_config(config)
    _refuse_layer_types(name, text)
    cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if cls is not None and not getattr(cls, "_supports_attention_backend", False):
        raise UnsupportedModelError(
            f"{name}: {cls.__name__} computes its attention itself rather than through "
            "transformers' attention interface, which the engine's paged attention plugs into"
        )


@contextlib.contextmanager
def _implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    # The language model's only: a vision-language model's tower keeps its own attention.
    language = language_model_of(model)
    if language is decoder_of(model):  # a text model: set on the whole, as transformers does
        language = model
    language.set_attn_implementation(name)  # type: ignore[operator]
    try:
        yield
    finally:
        language.set_attn_implementation(ATTN_IMPLEMENTATION)  # type: ignore[operator]


def inspect(model: torch.nn.Module, name: str) -> list[AttentionLayer]:
    """The model's attention layers in the order its forward calls them, each with what it
    asks of attention; raises UnsupportedModelError (naming the model `name`) with the reason
    when a layer asks for something the paged attention cannot honour."""
    global _recording, _grid
    config = model.config
    check_class(config, name)
    text = text_config(config)
    windows = [
        w for w in (getattr(text, "sliding_window", None), getattr(text, "window_size", None)) if w
    ]
    register_inspection()
    _recording = _Recording()
    _grid = max([_GRID] + [2 * int(w) + 2 for w in windows if isinstance(w, int)])
    device = next(model.parameters()).device
    ids = torch.tensor([[1, 2, 3]], device=device)
    # A model on the meta device (a GGUF's quantized weights live outside it) runs shapes only,
    # and without a cache transformers would read its position ids to find packed sequences.
    cache = device.type == "meta"
    try:
        with _implementation(model, INSPECT_IMPLEMENTATION), torch.inference_mode():
            decoder_of(model)(input_ids=ids, position_ids=ids - 1, use_cache=cache, trio_attn=None)
        recording = _recording
    finally:
        _recording = None
    return _layers(name, text, recording)


def _refuse_layer_types(name: str, config: object) -> None:
    kinds = set(getattr(config, "layer_types", None) or ()) - _RUNNABLE_LAYER_TYPES
    if kinds:
        raise UnsupportedModelError(
            f"{name}: its layers of type {', '.join(sorted(kinds))} keep state or attend in a "
            "way the paged attention cannot (it runs full and sliding-window attention)"
        )
    chunk = getattr(config, "attention_chunk_size", None)
    if chunk:
        raise UnsupportedModelError(
            f"{name}: chunked attention (attention_chunk_size {chunk}) is not supported by the "
            "paged attention"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError(
            f"{name}: bidirectional attention (use_bidirectional_attention) cannot generate"
        )


def _layers(name: str, config: object, recording: _Recording) -> list[AttentionLayer]:
    calls = recording.calls
    if not calls:
        raise UnsupportedModelError(
            f"{name}: its layers do not attend through transformers' attention interface, "
            "which the engine's paged attention plugs into"
        )
    seen: set[int] = set()
    layers = []
    for index, call in enumerate(calls):
        where = f"{name}: attention layer {index} ({type(call.module).__name__})"
        if id(call.module) in seen:
            raise UnsupportedModelError(f"{where} attends more than once per forward")
        seen.add(id(call.module))
        layers.append(_layer(where, call))
    expected = getattr(config, "num_hidden_layers", None)
    if isinstance(expected, int) and len(layers) < expected:
        raise UnsupportedModelError(
            f"{name}: only {len(layers)} of its {expected} layers attend; the others keep "
            "recurrent or convolutional state, which the paged KV cache does not hold"
        )
    return layers


def _layer(where: str, call: _Call) -> AttentionLayer:
    kwargs = call.kwargs
    if kwargs.get("is_causal") is False or getattr(call.module, "is_causal", True) is False:
        raise UnsupportedModelError(f"{where} is not causal")
    for key, value in kwargs.items():
        if key in _HONOURED or key in _INERT or value is None:
            continue
        meaning = _NAMED.get(key, f"the attention argument {key!r}")
        raise UnsupportedModelError(f"{where} needs {meaning}, which the paged attention lacks")
    _, kv_heads, _, head_dim = call.key_shape
    if call.value_shape[-1] != head_dim:
        raise UnsupportedModelError(
            f"{where} has keys of width {head_dim} and values of width {call.value_shape[-1]}; "
            "the paged cache holds keys and values of one width"
        )
    window = kwargs.get("sliding_window")
    softcap = kwargs.get("softcap")
    window = int(window) if isinstance(window, (int, float)) and window else None
    _check_mask(where, call.mask, window)
    return AttentionLayer(
        module=call.module,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        window=window,
        softcap=float(softcap) if isinstance(softcap, (int, float)) and softcap else None,
    )


def _check_mask(where: str, mask: object, window: int | None) -> None:
    """The model's mask for this layer must be what the paged attention computes: causal, and
    within the layer's window. A mask the model made without transformers' mask builders
    (a tensor: ALiBi, a prefix-LM pattern) is refused."""
    if mask is None:
        return
    if not isinstance(mask, _MaskPattern):
        raise UnsupportedModelError(
            f"{where} gets an attention mask the model builds itself ({type(mask).__name__}); "
            "the paged attention computes causal masks only"
        )
    grid = mask.visible.shape[0]
    q = torch.arange(grid).view(-1, 1)
    kv = torch.arange(grid).view(1, -1)
    expected = kv <= q
    if window:
        expected &= kv > q - window
    if not torch.equal(mask.visible.bool(), expected):
        shape = f"causal within a window of {window}" if window else "causal"
        raise UnsupportedModelError(
            f"{where} masks its attention in a way that is not {shape} (chunked, bidirectional "
            "or token-type attention), which the paged attention cannot compute"
        )


def attention_backend(
    layers: Sequence[AttentionLayer], backend: str, requested: str, max_model_len: int
) -> tuple[str, str | None]:
    """The attention backend that honours what `layers` ask, and why it differs from `backend`
    (None when it does not). The Triton kernels have no soft-capping and no sliding windows: a
    model that needs either runs on the torch backend when the backend was `auto`, and is
    refused when `triton` was asked for. A window no context can outgrow needs nothing."""
    from trio_llm.engine.attention.triton_backend import UNSUPPORTED

    if backend != "triton":
        return backend, None
    needs = []
    if any(layer.softcap for layer in layers):
        needs.append(UNSUPPORTED["softcap"])
    windows = [layer.window for layer in layers if layer.window and layer.window < max_model_len]
    if windows:
        needs.append(
            f"{UNSUPPORTED['sliding_window']} (a window of {min(windows)} tokens, contexts of "
            f"up to {max_model_len})"
        )
    if not needs:
        return backend, None
    if requested == "triton":
        raise UnsupportedModelError(f"attention_backend triton: {'; '.join(needs)}")
    return "torch", f"the torch attention backend, as {'; '.join(needs)}"
