"""Loading a resolved model for the engine: its config (refusing what the engine cannot run),
the task it serves, its dtype and device, and its weights with the engine's attention.

A model's name became a `ModelSource` in trio_llm/model_files.py (shared with the frontend);
this is the half only the engine process needs. `auto` dtype depends on the machine (bf16 on
CUDA and on CPUs with AVX512-BF16 or AMX, float32 elsewhere), so it is chosen at run time from
the CPU's flags, which tests fake.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from trio_llm.engine.hf import text_config
from trio_llm.engine.models import vision
from trio_llm.engine.ops.cpu import cpu_flags
from trio_llm.model_files import ModelSource, UnsupportedModelError
from trio_llm.tasks import TASKS, is_pooling

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


ENCODER_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta"})
"""Encoders the pooling engine runs (BERT family): their self-attention goes through
transformers' AttentionInterface (RoBERTa's position ids start past its padding index:
`position_offset`)."""

CLASSIFIER_ARCHITECTURES = frozenset(
    {
        "BertForSequenceClassification",
        "RobertaForSequenceClassification",
        "XLMRobertaForSequenceClassification",
        "LlamaForSequenceClassification",
        "MistralForSequenceClassification",
        "Qwen2ForSequenceClassification",
        "Qwen3ForSequenceClassification",
    }
)
"""Sequence classifiers (cross-encoders with one label) whose head the pooling engine applies
(`engine/models/classifier.py`): an encoder's on its first token, a decoder's on its last."""


def load_config(source: ModelSource) -> PretrainedConfig:
    """Read the model's config and refuse what the engine cannot run: anything but a causal LM
    that transformers implements, a classifier the pooling engine applies, or an encoder (for
    embeddings). What a causal LM's layers ask of attention is checked once it is loaded
    (`attention_layers.inspect`)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(source.path)
    if is_encoder(config):
        return config
    if vision.is_vision(config):
        vision.check_config(config, source.name)
        return config
    archs = list(getattr(config, "architectures", None) or [])
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if not (
        set(archs) & (causal | CLASSIFIER_ARCHITECTURES)
        or (not archs and config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    ):
        raise UnsupportedModelError(
            f"{source.name}: architecture {', '.join(archs) or '(none given)'} is not supported; "
            "the engine runs the causal language models transformers implements (no remote "
            f"code), the classifiers {', '.join(sorted(CLASSIFIER_ARCHITECTURES))} and, for "
            f"embeddings, encoders of type {', '.join(sorted(ENCODER_MODEL_TYPES))}"
        )
    if getattr(config, "vocab_size", None) is None:
        raise UnsupportedModelError(
            f"{source.name}: {type(config).__name__} is a composite (multimodal) config without "
            "a vocabulary of its own; the engine serves text models"
        )
    return config


def is_encoder(config: PretrainedConfig) -> bool:
    return getattr(config, "model_type", None) in ENCODER_MODEL_TYPES and not getattr(
        config, "is_decoder", False
    )


def classifier_architecture(config: PretrainedConfig) -> str | None:
    """The checkpoint's sequence-classification architecture, when it has a head the engine
    applies; None for a model without one."""
    archs = getattr(config, "architectures", None) or []
    return next((a for a in archs if a in CLASSIFIER_ARCHITECTURES), None)


def resolve_task(task: str, source: ModelSource, config: PretrainedConfig) -> str:
    """`auto` chooses from the checkpoint: a `*ForSequenceClassification` is a cross-encoder
    (`score`) with one label and a classifier (`classify`) with several; another encoder
    serves embeddings, a decoder generation. A decoder may also serve embeddings (`embed`,
    last-token pooling) and a classifier embeddings of its base model; nothing else crosses
    over."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; use {', '.join(TASKS)}")
    encoder = is_encoder(config)
    head = classifier_architecture(config)
    labels = int(getattr(config, "num_labels", 0) or 0)
    if task == "auto":
        if head is not None:
            return "score" if labels == 1 else "classify"
        return "embed" if encoder else "generate"
    if task == "transcribe":
        raise UnsupportedModelError(
            f"{source.name} is not a Whisper model in CTranslate2's format: it cannot serve task "
            "transcribe"
        )
    if task == "generate" and (encoder or head is not None):
        what = f"a classifier ({head})" if head else f"an encoder ({config.model_type})"
        raise UnsupportedModelError(
            f"{source.name} is {what}: it does not generate; serve it with task "
            + ("score or classify" if head else "embed")
        )
    if task in ("score", "classify") and head is None:
        archs = ", ".join(getattr(config, "architectures", None) or []) or "(none given)"
        raise UnsupportedModelError(
            f"{source.name} has no sequence-classification head the engine runs "
            f"(architecture {archs}; it runs {', '.join(sorted(CLASSIFIER_ARCHITECTURES))}), "
            f"so it cannot serve task {task}"
            + ("; an embedding model scores by cosine with task embed" if task == "score" else "")
        )
    if task == "score" and labels != 1:
        raise UnsupportedModelError(
            f"{source.name} has {labels} labels: a cross-encoder (task score) has one; "
            "serve it with task classify"
        )
    return task


def position_offset(config: PretrainedConfig) -> int:
    """Where an encoder's position ids start: RoBERTa's (and XLM-R's) count from past its
    padding index, BERT's from 0."""
    if getattr(config, "model_type", None) in ("roberta", "xlm-roberta"):
        return int(config.pad_token_id) + 1
    return 0


def cpu_has_fast_bf16(flags: frozenset[str]) -> bool:
    """AVX512-BF16 or AMX: there bf16 matmuls beat fp32 (measured 40 ms vs 108 ms per step)."""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_has_fast_fp16(flags: frozenset[str]) -> bool:
    """AVX512-FP16 or AMX-FP16: float16 arithmetic in hardware. Elsewhere oneDNN emulates
    float16 matmuls: the default model served in float16 on the AMD EPYC (AVX512-BF16, no
    FP16) made 0.25-0.28x the default's tok/s at c=32 (bench/results/serving_matrix.md)."""
    return "avx512_fp16" in flags or "amx_fp16" in flags


def check_cpu_dtype(dtype: torch.dtype, flags: frozenset[str]) -> str | None:
    """Why this CPU cannot serve activations of `dtype` at a usable speed, or None."""
    import torch

    if dtype is torch.float16 and not cpu_has_fast_fp16(flags):
        return (
            "dtype float16: this CPU has no float16 arithmetic (AVX512-FP16 or AMX-FP16), so "
            "its float16 matmuls are emulated, about 4x slower than bfloat16 under load; use "
            "bfloat16 (the same memory)"
            + (" or float32" if not cpu_has_fast_bf16(flags) else "")
            + " (--single-token-dtype float16 is fine: one row is memory-bound)"
        )
    return None


def resolve_dtype(dtype: str, device: str, *, flags: frozenset[str] | None = None) -> torch.dtype:
    """`auto`: bfloat16 on CUDA and on CPUs with fast bf16, float32 elsewhere.

    `flags` are the CPU's feature flags (this machine's when None): the choice depends on the
    machine, so tests pass the flags of the machines they stand for."""
    import torch

    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16
        if cpu_has_fast_bf16(cpu_flags() if flags is None else flags):
            return torch.bfloat16
        return torch.float32
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
    }
    try:
        return table[dtype.lower()]
    except KeyError:
        raise ValueError(
            f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16"
        ) from None


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available here")
    return device


def free_device_memory(device: str) -> int | None:
    """Bytes free on a CUDA device now (what an auto KV cache takes its share of); None on a
    CPU, whose KV cache has a fixed default size."""
    if not device.startswith("cuda"):
        return None
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def load_model(
    source: ModelSource, dtype: torch.dtype, device: str, *, task: str = "generate"
) -> torch.nn.Module:
    """The model in eval mode on `device`: for generation with its LM head and the engine's
    paged attention; for embeddings its base model (no head), for scores and classes the
    whole `*ForSequenceClassification`, both with the cacheless packed attention."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    from trio_llm.engine import attention
    from trio_llm.engine.attention import packed

    config = load_config(source)
    implementation: str | dict[str, str]
    if vision.is_vision(config) and not is_pooling(task):
        # The paged attention is the decoder's only: the vision tower attends over one image's
        # patches at a time, with transformers' own attention.
        from transformers import AutoModelForImageTextToText

        attention.register()
        implementation = {"text_config": attention.ATTN_IMPLEMENTATION, "vision_config": "sdpa"}
        model = AutoModelForImageTextToText.from_pretrained(
            source.path, dtype=dtype, device_map=device, attn_implementation=implementation
        )
        return model.eval()
    if is_pooling(task):
        packed.register_packed()
        auto = AutoModelForSequenceClassification if task in ("score", "classify") else AutoModel
        implementation = packed.PACKED_IMPLEMENTATION
    else:
        attention.register()
        auto, implementation = AutoModelForCausalLM, attention.ATTN_IMPLEMENTATION
    model = auto.from_pretrained(
        source.path, dtype=dtype, device_map=device, attn_implementation=implementation
    )
    return model.eval()


def eos_token_ids(source: ModelSource, config: PretrainedConfig) -> list[int]:
    """EOS ids from the model config and, when present, its generation config."""
    from transformers import GenerationConfig

    ids: set[int] = set()
    configs: list[object] = [config, text_config(config)]
    with contextlib.suppress(OSError, ValueError):
        configs.append(GenerationConfig.from_pretrained(source.path))
    for cfg in configs:
        value = getattr(cfg, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return sorted(ids)
