"""The engine's assembly at start-up: from EngineArgs and a resolved model to the runner that
computes its steps, with the sizes the scheduler gets (KV blocks, context limit, token budget).

What it owns: the choices made once per engine, in order: the quantization plan and the
weights it loads, the dtype (measured on a CPU that could run bf16), the attention layers'
inspection and the backend that honours them, the KV cache's size, the model runner or pooling
runner, and the LoRA adapters named at start. A configuration that cannot work raises
EngineConfigError with the reason before any request arrives. EngineCore (core.py) runs what
this builds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trio_llm import model_files
from trio_llm.config import EngineArgs
from trio_llm.engine.attention import resolve_backend
from trio_llm.engine.hf import language_model_of, text_config
from trio_llm.engine.lora import LoraLoadError, LoraRegistry
from trio_llm.engine.models import (
    attention_layers,
    gguf_modules,
    gguf_weights,
    loader,
    pooling,
    quantized,
)
from trio_llm.engine.models.classifier import classifier_head
from trio_llm.engine.plans import dtype_policy, invariance
from trio_llm.engine.step.kv_cache import kv_cache_spec
from trio_llm.engine.step.model_runner import LoraSettings, ModelRunner
from trio_llm.engine.step.pooling_runner import PoolingRunner
from trio_llm.tasks import TASK_WORDS, is_pooling

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger(__name__)


class EngineConfigError(ValueError):
    """The engine arguments cannot work with this model (for example, a KV budget smaller than
    one block)."""


@dataclass(slots=True)
class EngineParts:
    """What differs between a generating and a pooling engine."""

    runner: ModelRunner | PoolingRunner
    dtype: torch.dtype
    num_blocks: int
    kv_cache_bytes: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    attention_backend: str
    embedding_size: int = 0
    normalized: bool = False
    matryoshka_dimensions: list[int] | None = None
    labels: list[str] | None = None


def generation_parts(
    args: EngineArgs,
    source: model_files.ModelSource,
    config: PretrainedConfig,
    dtype: torch.dtype,
    device: str,
    stage: Callable[[str], None],
) -> EngineParts:
    """A generating engine's parts: its weights as the quantization plan says, in the dtype
    this machine runs fastest (measured where the CPU could run bf16), the KV cache it holds,
    and the model runner over them."""
    backend = resolve_backend(args.attention_backend, device)
    how, gguf = quantized.plan(args.quantization, source, config, device, args.model_impl, dtype)
    weights = None
    if how not in ("none", "gguf-float32"):
        dtype = quantized.activation_dtype(args.dtype)
    # Where the CPU could run bf16 fast, auto measures which dtype this model is faster in.
    measure = how == "none" and args.dtype == "auto" and device == "cpu" and dtype is torch.bfloat16
    attention_layers.check_class(config, source.name)
    if gguf is not None and how in ("gguf", "gguf-float32"):
        model = quantized.meta_model(source, dtype)
        weights = gguf_weights.load_weights(
            gguf, model.config, dtype, float_blocks=how == "gguf-float32"
        )
    else:
        model = loader.load_model(source, torch.float32 if measure else dtype, device)
    if gguf is not None and how == "gguf-modules":
        formats = gguf_modules.quantize_modules(model, gguf, dtype)
        stage("quantized weights in transformers' modules: " + gguf_modules.describe(formats))
    if measure:
        dtype = dtype_policy.choose_cpu_dtype(_probe_weights(model), loader.cpu_flags())
        if dtype is not torch.float32:
            model.to(dtype)
    layers = attention_layers.inspect(model, source.name)
    spec = kv_cache_spec(layers, args.block_size, dtype)
    kv_bytes = args.kv_cache_bytes(device, loader.free_device_memory(device))
    num_blocks = kv_bytes // spec.bytes_per_block
    if num_blocks < 1:
        raise EngineConfigError(
            f"kv_cache_memory {args.kv_cache_memory} ({kv_bytes} bytes) holds no block of "
            f"{spec.bytes_per_block} bytes; give at least that"
        )
    budget = args.step_token_budget(device)
    # More running sequences than tokens per step would leave some never decoding.
    max_num_seqs = min(args.max_num_seqs, budget)
    max_model_len = _max_model_len(args, config, num_blocks, spec.bytes_per_block)
    backend, why = attention_layers.attention_backend(
        layers, backend, args.attention_backend, max_model_len
    )
    if why:
        stage(f"attention: {why}")
    stage("allocating the KV cache")
    try:
        runner = ModelRunner(
            model,
            spec,
            num_blocks,
            layers=layers,
            device=torch.device(device),
            backend=backend,
            seed=args.seed,
            max_model_len=max_model_len,
            model_impl=args.model_impl,
            batch_invariant=args.batch_invariant,
            single_token_dtype=(
                None
                if args.single_token_dtype == "none"
                else loader.resolve_dtype(args.single_token_dtype, device)
            ),
            cuda_graphs=not args.enforce_eager,
            max_num_seqs=max_num_seqs,
            cpu_flags=loader.cpu_flags(),
            lora=LoraSettings(args.max_loras, args.max_lora_rank) if args.lora else None,
            weights=weights,
            quantization=how,
            max_step_rows=budget,
        )
    except invariance.InvarianceUnavailable as exc:
        raise EngineConfigError(str(exc)) from None
    stage(f"forward: {runner.choice.describe()}")
    stage(f"batch invariance {runner.invariance.describe()}")
    if runner.dense_copies is not None:
        stage(f"quantized weights: {runner.dense_copies.describe()}")
    return EngineParts(
        runner=runner,
        dtype=dtype,
        num_blocks=num_blocks,
        kv_cache_bytes=num_blocks * spec.bytes_per_block,
        max_model_len=max_model_len,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        attention_backend=backend,
    )


def pooling_parts(
    args: EngineArgs,
    task: str,
    source: model_files.ModelSource,
    config: PretrainedConfig,
    dtype: torch.dtype,
    device: str,
) -> EngineParts:
    """No KV cache: the block manager only does the scheduler's bookkeeping, with blocks
    for one step's tokens; a step holds whole prompts, so it holds at least the longest,
    and as many inputs as its tokens allow (each finishes within its step). A
    classifier's sentence-transformers files say nothing the engine uses but the length
    (its head pools by itself)."""
    classifies = task in ("score", "classify")
    if classifies:
        pooling_config = pooling.PoolingConfig(
            "cls", normalize=False, max_seq_length=pooling.max_seq_length(source.path)
        )
    else:
        pooling_config = pooling.pooling_config(source.path, is_encoder=loader.is_encoder(config))
    model = loader.load_model(source, dtype, device, task=task)
    head = classifier_head(model) if classifies else None
    offset = loader.position_offset(config)
    positions = int(config.max_position_embeddings) - offset
    limit = min(args.max_model_len or pooling_config.max_seq_length or positions, positions)
    max_model_len = limit
    budget = max(args.max_num_pooled_tokens, max_model_len)
    num_blocks = -(-budget // args.block_size) + budget  # a partial block per input
    runner = PoolingRunner(
        model, pooling_config, torch.device(device), head=head, position_offset=offset
    )
    return EngineParts(
        runner=runner,
        dtype=dtype,
        num_blocks=num_blocks,
        kv_cache_bytes=0,
        max_model_len=max_model_len,
        max_num_batched_tokens=budget,
        max_num_seqs=budget,
        attention_backend="packed",
        embedding_size=runner.output_size,
        normalized=pooling_config.normalize and head is None,
        matryoshka_dimensions=None if classifies else _matryoshka(config),
        labels=head.labels if head is not None else None,
    )


def load_loras(args: EngineArgs, runner: ModelRunner | PoolingRunner) -> LoraRegistry | None:
    """The registry of adapters, with those of `lora_modules` loaded (a start error names
    the one that cannot be); None where LoRA is off or the engine pools."""
    if not args.lora or not isinstance(runner, ModelRunner):
        return None
    assert runner.lora is not None
    registry = LoraRegistry(runner.lora)
    for name, path in args.lora_modules.items():
        try:
            registry.load(name, path)
        except LoraLoadError as error:
            raise EngineConfigError(f"LoRA adapter {name!r}: {error}") from None
    log.info(
        "LoRA: %d slots of rank %d (%.0f MiB)%s",
        args.max_loras,
        args.max_lora_rank,
        runner.lora.nbytes / 2**20,
        f", serving {', '.join(registry.names())}" if args.lora_modules else "",
    )
    return registry


def check_lora_args(args: EngineArgs, task: str) -> None:
    """LoRA on a pooling engine is ignored when only enabled (a server-wide flag reaches every
    model) and refused when adapters are given for it."""
    if is_pooling(task) and args.lora_modules:
        raise EngineConfigError(
            f"LoRA adapters are served on generating models; this one serves {TASK_WORDS[task]}"
        )
    if args.max_loras < 1 or args.max_lora_rank < 1:
        raise EngineConfigError(
            f"max_loras and max_lora_rank must be at least 1, got {args.max_loras} and "
            f"{args.max_lora_rank}"
        )


def _matryoshka(config: PretrainedConfig) -> list[int] | None:
    """The sizes a Matryoshka model's embeddings may be cut to, as its config says (vLLM's
    keys); None for any other model."""
    dimensions = getattr(config, "matryoshka_dimensions", None)
    if dimensions:
        return sorted(int(d) for d in dimensions)
    return [] if getattr(config, "is_matryoshka", False) else None


def _max_model_len(
    args: EngineArgs,
    config: object,
    num_blocks: int,
    block_bytes: int,
) -> int:
    """The context limit: asked for, or the model's own. A limit asked for that the KV cache
    cannot hold is refused (serving less than asked for would be a silent change); the
    model's own is served shorter, said at start-up as a warning, which the server's log
    shows (and /v1/models reports the length)."""
    capacity = num_blocks * args.block_size
    native = int(text_config(config).max_position_embeddings)  # type: ignore[attr-defined]
    limit = args.max_model_len or native

    def memory_for(tokens: int) -> str:
        return f"{-(-(-(-tokens // args.block_size) * block_bytes) // 2**20)}MiB"

    if limit <= capacity:
        return limit
    held = (
        f"kv_cache_memory {args.kv_cache_memory} ({num_blocks * block_bytes} bytes in "
        f"{num_blocks} blocks) holds {capacity} tokens"
    )
    if args.max_model_len is not None:
        raise EngineConfigError(
            f"max_model_len {limit} does not fit the KV cache: {held}; pass --kv-cache-memory "
            f"{memory_for(limit)} (or more), or --max-model-len {capacity} (or less)"
        )
    log.warning(
        "max_model_len %d, not the model's %d: %s; --kv-cache-memory %s serves the model's own",
        capacity,
        native,
        held,
        memory_for(native),
    )
    return capacity


def _probe_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The matmul weights of the model's first decoder layer and its LM head: what a decode
    step spends its time on, layer by layer."""
    from transformers.pytorch_utils import Conv1D

    decoder = language_model_of(model)
    stacks = [m for m in decoder.children() if isinstance(m, torch.nn.ModuleList) and len(m)]
    weights = [
        m.weight if isinstance(m, torch.nn.Linear) else m.weight.T  # Conv1D: [in, out]
        for m in (stacks[0][0].modules() if stacks else ())
        if isinstance(m, torch.nn.Linear | Conv1D)
    ]
    return [*weights, model.get_output_embeddings().weight]
