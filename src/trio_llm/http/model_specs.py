"""What `trio-llm serve MODEL [MODEL ...]` serves: one `ModelSpec` per model, each with its
engine arguments and its number of replicas.

A model on the command line (or in TRIO_LLM_MODEL, whitespace-separated) may carry its own
options after a colon, comma-separated: `all-MiniLM-L6-v2:dtype=float32,dp=2`,
`/models/qwen:name=qwen,kv=2GiB`. They override the server-wide flags for that model only:

    name     the served name (--served-model-name)     task     auto, generate, embed, score,
                                                                classify
    dtype    auto, float32, bfloat16, float16          device   auto, cpu, cuda, cuda:N
    kv       KV cache size (--kv-cache-memory)         max-len  context length
    seqs     sequences at once (--max-num-seqs)        threads  torch (or CTranslate2) threads
    compute  a speech model's CTranslate2 compute      dp       replicas (--data-parallel-size)
             type (int8, float32, ...)                 lora     NAME=PATH, a LoRA adapter served
    max-loras      adapters at once (--max-loras)               from the start (repeatable)
    max-lora-rank  their largest rank (--max-lora-rank)
    tools          its tool-call format (--tool-call-parser's values)
    reasoning      its reasoning format (--reasoning-parser's values)
    chat-template  a Jinja chat template file used instead of the model's (vLLM's
                   --chat-template)

So models that write different formats share one server:
`/models/mistral:tools=mistral /models/qwen:tools=qwen3_coder,reasoning=qwen3`.

Any lora option turns LoRA on for that model (`lora=sql=/adapters/sql,lora=chat=/adapters/chat`).
Only a tail that reads as `key=value` pairs is taken for options, so a path with a colon in it
still names a model. Invariant: every spec is checked here (keys, values, unique names where
they are known), so a bad one stops the start with a message, before any engine starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from trio_llm.config import EngineArgs, parse_size
from trio_llm.http.reasoning.formats import PARSER_NAMES as REASONING_PARSERS
from trio_llm.http.tools.formats import PARSER_NAMES as TOOL_PARSERS
from trio_llm.tasks import TASKS

DTYPES = ("auto", "float32", "bfloat16", "float16")

_OPTIONS = {
    "name": "served_model_name",
    "task": "task",
    "dtype": "dtype",
    "device": "device",
    "kv": "kv_cache_memory",
    "max_len": "max_model_len",
    "seqs": "max_num_seqs",
    "threads": "num_threads",
    "compute": "compute_type",
    "dp": "replicas",
    "lora": "lora_modules",
    "max_loras": "max_loras",
    "max_lora_rank": "max_lora_rank",
    "tools": "tool_call_parser",
    "reasoning": "reasoning_parser",
    "chat_template": "chat_template",
}
_INT_OPTIONS = frozenset(
    {"max_model_len", "max_num_seqs", "num_threads", "replicas", "max_loras", "max_lora_rank"}
)
_LORA_OPTIONS = frozenset({"lora_modules", "max_loras", "max_lora_rank"})
_TAIL = re.compile(r"[A-Za-z_-]+=[^,]*(?:,[A-Za-z_-]+=[^,]*)*")


class ModelSpecError(ValueError):
    """A model entry that cannot be served as written; the message names it."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One served model: how to start its engine, and how many copies."""

    args: EngineArgs
    replicas: int = 1

    @property
    def label(self) -> str:
        """The served name when it is given, else the model as typed."""
        return self.args.served_model_name or self.args.model


@dataclass(frozen=True, slots=True)
class LoraModule:
    """A LoRA adapter served from the start (--lora-modules)."""

    name: str
    path: str
    base_model_name: str | None = None
    """The served model it is for (None: the first)."""


def split_entry(entry: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """`MODEL[:key=value,...]` -> the model, its options (keys as `_OPTIONS` spells them), and
    its LoRA adapters (the repeatable `lora=NAME=PATH`)."""
    model, sep, tail = entry.rpartition(":")
    if not sep or not model or not _TAIL.fullmatch(tail):
        return entry, {}, {}
    options: dict[str, str] = {}
    loras: dict[str, str] = {}
    for pair in tail.split(","):
        key, _, value = pair.partition("=")
        key = key.strip().lower().replace("-", "_")
        if key not in _OPTIONS:
            known = ", ".join(o.replace("_", "-") for o in _OPTIONS)
            raise ModelSpecError(f"{entry!r}: unknown option {key!r}; use {known}")
        if key == "lora":
            name, sep, path = value.partition("=")
            if not sep or not name.strip() or not path.strip() or name.strip() in loras:
                raise ModelSpecError(f"{entry!r}: give each adapter as lora=NAME=PATH, once")
            loras[name.strip()] = path.strip()
            continue
        options[key] = value.strip()
    return model, options, loras


def model_specs(
    entries: Sequence[str], base: EngineArgs, *, replicas: int, cpu_count: int | None = None
) -> tuple[ModelSpec, ...]:
    """The specs of `entries` over the server-wide `base` arguments and replica count. When
    no thread count is set, the engines share the cores: each gets cores // engines (at
    least one)."""
    if not entries:
        raise ModelSpecError("give at least one model")
    specs = [_spec(entry, base, replicas) for entry in entries]
    if len(specs) > 1 and base.served_model_name is not None:
        raise ModelSpecError(
            "--served-model-name names one model; with several, give each its own as "
            "MODEL:name=NAME"
        )
    labels = [s.label for s in specs]
    for label in labels:
        if labels.count(label) > 1:
            raise ModelSpecError(f"{label!r} is served twice; give one another name (:name=...)")
    engines = sum(s.replicas for s in specs)
    if engines > 1:
        share = max(1, (cpu_count or os.cpu_count() or 1) // engines)
        specs = [
            s
            if s.args.num_threads is not None
            else ModelSpec(msgspec.structs.replace(s.args, num_threads=share), s.replicas)
            for s in specs
        ]
    return tuple(specs)


def with_lora_modules(
    specs: Sequence[ModelSpec], modules: Sequence[LoraModule]
) -> tuple[ModelSpec, ...]:
    """`specs` with the adapters of --lora-modules added (each to its base model, by served
    name, or to the first), which turns LoRA on for the models that get one; every adapter's
    name must differ from the others' and the models'."""
    added: list[dict[str, str]] = [{} for _ in specs]
    for module in modules:
        if module.base_model_name is None:
            group = 0
        else:
            labels = [s.label for s in specs]
            if module.base_model_name not in labels:
                raise ModelSpecError(
                    f"--lora-modules {module.name}: no model is served as "
                    f"{module.base_model_name!r} (served: {', '.join(labels)})"
                )
            group = labels.index(module.base_model_name)
        if module.name in added[group] or module.name in specs[group].args.lora_modules:
            raise ModelSpecError(f"--lora-modules: {module.name!r} is given twice")
        added[group][module.name] = module.path
    result = tuple(
        spec
        if not extra
        else ModelSpec(
            msgspec.structs.replace(spec.args, lora_modules={**spec.args.lora_modules, **extra}),
            spec.replicas,
        )
        for spec, extra in zip(specs, added, strict=True)
    )
    names = [s.label for s in result]
    for spec in result:
        for name in spec.args.lora_modules:
            if name in names:
                raise ModelSpecError(f"the LoRA adapter {name!r} is served twice, or as a model")
            names.append(name)
    return result


def _spec(entry: str, base: EngineArgs, replicas: int) -> ModelSpec:
    model, options, loras = split_entry(entry)
    fields: dict[str, Any] = {"model": model}
    if loras:
        fields["lora_modules"] = loras
    if loras or _LORA_OPTIONS & {_OPTIONS[key] for key in options}:
        fields["enable_lora"] = True
    for key, text in options.items():
        field = _OPTIONS[key]
        value: Any = text
        if field in _INT_OPTIONS:
            try:
                value = int(text)
            except ValueError:
                value = 0
            if value < 1:
                raise ModelSpecError(f"{entry!r}: {key} must be a whole number of at least 1")
        elif field == "dtype" and text not in DTYPES:
            raise ModelSpecError(f"{entry!r}: dtype must be one of {', '.join(DTYPES)}")
        elif field == "task" and text not in TASKS:
            raise ModelSpecError(f"{entry!r}: task must be one of {', '.join(TASKS)}")
        elif field == "tool_call_parser" and text not in TOOL_PARSERS:
            raise ModelSpecError(f"{entry!r}: tools must be one of {', '.join(TOOL_PARSERS)}")
        elif field == "reasoning_parser" and text not in REASONING_PARSERS:
            raise ModelSpecError(
                f"{entry!r}: reasoning must be one of {', '.join(REASONING_PARSERS)}"
            )
        elif field == "chat_template" and not os.path.isfile(text):
            raise ModelSpecError(f"{entry!r}: chat-template {text!r} is not a file")
        elif field == "kv_cache_memory":
            try:
                parse_size(text)
            except ValueError as error:
                raise ModelSpecError(f"{entry!r}: {error}") from None
        fields[field] = value
    count = fields.pop("replicas", replicas)
    return ModelSpec(msgspec.structs.replace(base, **fields), count)


def engine_args(spec: ModelSpec, replica: int, engine_index: int) -> EngineArgs:
    """One engine's arguments: its model's, with its replica's rank, and its own KV-event
    endpoint when events are on: the configured port plus `engine_index` (the engine's place
    among all of the server's engines, models in order, then replicas), as vLLM offsets the
    port by data-parallel rank."""
    args = spec.args
    updates: dict[str, Any] = {}
    if spec.replicas > 1:
        updates["data_parallel_rank"] = replica
    endpoint = args.kv_events_endpoint
    if endpoint is not None and engine_index:
        host, sep, port = endpoint.rpartition(":")
        if not (sep and port.isdigit()):
            raise ModelSpecError(
                f"KV events endpoint {endpoint!r} has no port to offset for engine "
                f"{engine_index}; give a tcp://HOST:PORT endpoint"
            )
        updates["kv_events_endpoint"] = f"{host}:{int(port) + engine_index}"
    return msgspec.structs.replace(args, **updates) if updates else args
