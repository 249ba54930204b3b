"""Reading a LoRA adapter in PEFT's format, and checking it against the model it is to serve on.

PEFT saves an adapter as a directory: `adapter_config.json` (the rank `r`, `lora_alpha`, the
target modules, per-module overrides in `rank_pattern` / `alpha_pattern`, `use_rslora`) and
`adapter_model.safetensors`, one pair of matrices per adapted Linear, named by the module's path
in the transformers model: `base_model.model.<path>.lora_A.weight` ([r, in]) and
`...lora_B.weight` ([out, r]). The update to that Linear's output is `x @ A.T @ B.T * scale`,
with `scale = alpha / r` (`alpha / sqrt(r)` with rsLoRA); `B` is read pre-scaled here, so
serving it is two matmuls.

Invariant: an adapter is refused with the reason, before any of it is used, when the model
cannot serve it as PEFT would compute it: a module the model's forward does not run as a plain
projection (embeddings, the LM head, modules saved whole), a shape that differs from the
model's (an adapter trained on another base), a rank over the bound, or a PEFT variant the
engine does not compute (DoRA, LoRA biases, aLoRA, ...).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<side>[AB])(?:\.[^.]+)?\.weight$")
"""`<module>.lora_A.weight`, or with an adapter name before `.weight` (older PEFT saves)."""
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "use_bdlora": "BD-LoRA (use_bdlora)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "lora_bias": "LoRA biases (lora_bias)",
    "fan_in_fan_out": "fan_in_fan_out weights (Conv1D modules)",
    "layer_replication": "layer replication (layer_replication)",
    "modules_to_save": "modules saved whole (modules_to_save)",
    "trainable_token_indices": "trained token embeddings (trainable_token_indices)",
    "target_parameters": "adapted parameters (target_parameters)",
    "arrow_config": "Arrow routing (arrow_config)",
}
"""adapter_config.json keys whose set value asks for a computation the engine does not do."""


class LoraLoadError(ValueError):
    """An adapter that cannot be served on this model; the message says why."""


@dataclass(frozen=True, slots=True)
class LoraPair:
    """One adapted Linear's update: `x @ a.T @ b.T`, the scale already in `b`."""

    a: torch.Tensor
    """[rank, in_features]"""
    b: torch.Tensor
    """[out_features, rank], times the scale."""

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(frozen=True, slots=True)
class Adapter:
    path: str
    pairs: dict[str, LoraPair]
    """Module path in the transformers model -> its update."""

    @property
    def rank(self) -> int:
        """The largest rank of its pairs."""
        return max(p.rank for p in self.pairs.values())


def read_adapter(
    path: str | Path,
    modules: Mapping[str, tuple[int, int]],
    *,
    max_rank: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> Adapter:
    """The adapter saved at `path`, checked against `modules` (each adaptable Linear's path ->
    (in_features, out_features)) and `max_rank`, its weights in `dtype` on `device`;
    `LoraLoadError` saying why when it cannot be served."""
    directory = Path(path)
    config = _read_config(directory)
    tensors = _read_weights(directory)
    alpha = float(config.get("lora_alpha", 8))
    alphas = config.get("alpha_pattern") or {}
    rslora = bool(config.get("use_rslora", False))
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key.removeprefix(_PREFIX))
        if match is None:
            raise LoraLoadError(
                f"{directory}: {key} is not a LoRA pair's weight (lora_A / lora_B): the engine "
                "serves LoRA on Linear projections only"
            )
        found.setdefault(match["module"], {})[match["side"]] = tensor
    if not found:
        raise LoraLoadError(f"{directory}: {WEIGHTS_FILE} holds no LoRA weights")
    pairs = {}
    for module, sides in sorted(found.items()):
        if module not in modules:
            raise LoraLoadError(
                f"{directory}: the adapter adapts {module}, which this model's forward does not "
                "run as an attention or MLP projection (is it an adapter for another base "
                "model, or for the embeddings / LM head?)"
            )
        if set(sides) != {"A", "B"}:
            raise LoraLoadError(f"{directory}: {module} has lora_{''.join(sides)} alone")
        a, b = sides["A"], sides["B"]
        in_features, out_features = modules[module]
        rank = int(a.shape[0])
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != rank:
            raise LoraLoadError(
                f"{directory}: {module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} "
                "are not a pair of [r, in] and [out, r] matrices"
            )
        if (a.shape[1], b.shape[0]) != (in_features, out_features):
            raise LoraLoadError(
                f"{directory}: {module} is {a.shape[1]} -> {b.shape[0]} in the adapter but "
                f"{in_features} -> {out_features} in this model: the adapter was trained on "
                "another base model"
            )
        if rank > max_rank:
            raise LoraLoadError(
                f"{directory}: {module} has rank {rank}, over the engine's bound of {max_rank} "
                "(--max-lora-rank)"
            )
        pattern = _pattern(alphas, module)
        module_alpha = alpha if pattern is None else float(alphas[pattern])
        scale = module_alpha / (math.sqrt(rank) if rslora else rank)
        pairs[module] = LoraPair(
            a=a.to(device=device, dtype=dtype).contiguous(),
            b=(b.float() * scale).to(device=device, dtype=dtype).contiguous(),
        )
    return Adapter(str(directory), pairs)


def _read_config(directory: Path) -> dict[str, object]:
    file = directory / CONFIG_FILE
    if not file.is_file():
        raise LoraLoadError(f"{directory}: no {CONFIG_FILE} (not a PEFT adapter directory)")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise LoraLoadError(f"{file}: cannot be read: {error}") from None
    if not isinstance(config, dict):
        raise LoraLoadError(f"{file}: not a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise LoraLoadError(f"{file}: peft_type {peft_type}: only LORA adapters are served")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise LoraLoadError(f"{file}: {what} is not supported")
    if config.get("bias", "none") != "none":
        raise LoraLoadError(f"{file}: bias {config['bias']!r}: only bias 'none' is supported")
    return config


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = directory / WEIGHTS_FILE
    if not file.is_file():
        also = (
            " (adapter_model.bin is a pickle; save with safetensors)"
            if (directory / "adapter_model.bin").is_file()
            else ""
        )
        raise LoraLoadError(f"{directory}: no {WEIGHTS_FILE}{also}")
    try:
        return load_file(file)
    except (OSError, SafetensorError) as error:
        raise LoraLoadError(f"{file}: cannot be read: {error}") from None


def _pattern(patterns: Mapping[str, object], module: str) -> str | None:
    """PEFT's `get_pattern_key`: the first pattern that matches the end of the module path."""
    for pattern in patterns:
        if re.match(rf"(.*\.)?({pattern})$", module):
            return pattern
    return None
