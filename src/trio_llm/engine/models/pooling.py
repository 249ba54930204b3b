"""Pooling: how a model's per-token hidden states become one embedding per input.

What it owns: reading the model's sentence-transformers configuration (`modules.json`, the
Pooling module's `config.json`, a Normalize module, `sentence_bert_config.json`'s
`max_seq_length`) into a `PoolingConfig`, and `pool`, which applies it to a packed row.

Without a sentence-transformers configuration, an encoder pools by its CLS token and a decoder
by its last token, both normalised (vLLM's defaults for `--task embed`). Invariant: `pool`
works on the packed row as the model runner lays it out (sequence b's tokens are rows
`cu_seqlens[b]:cu_seqlens[b + 1]`), with no per-sequence Python.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

PoolingMode = Literal["mean", "cls", "last"]

_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
_MODE_FLAGS: tuple[tuple[str, PoolingMode], ...] = (
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_lasttoken", "last"),
)


class PoolingConfigError(ValueError):
    """The model's sentence-transformers configuration asks for a pooling this engine lacks."""


@dataclass(frozen=True, slots=True)
class PoolingConfig:
    mode: PoolingMode
    normalize: bool
    max_seq_length: int | None = None
    """sentence-transformers truncates inputs to this many tokens; the engine's context."""


def pooling_config(path: Path, *, is_encoder: bool) -> PoolingConfig:
    """The pooling a model directory's sentence-transformers files describe, or the default."""
    limit = max_seq_length(path)
    modules = _read_json(path / "modules.json")
    if not isinstance(modules, list):
        default: PoolingMode = "cls" if is_encoder else "last"
        return PoolingConfig(default, normalize=True, max_seq_length=limit)
    types = [m.get("type", "") for m in modules if isinstance(m, dict)]
    pooling = next(
        (m for m in modules if isinstance(m, dict) and m.get("type") == _ST_POOLING), None
    )
    if pooling is None:
        raise PoolingConfigError(f"{path}/modules.json has no {_ST_POOLING} module")
    settings = _read_json(path / pooling.get("path", "") / "config.json") or {}
    known = dict(_MODE_FLAGS)
    modes = [mode for flag, mode in _MODE_FLAGS if settings.get(flag)]
    others = [k for k, v in settings.items() if k.startswith("pooling_mode_") and v]
    others = [k.removeprefix("pooling_mode_") for k in others if k not in known]
    if others or len(modes) != 1:
        raise PoolingConfigError(
            f"{path}: pooling {', '.join(others + list(modes)) or '(none)'} is not supported; "
            "the engine pools by exactly one of mean, CLS token or last token"
        )
    return PoolingConfig(modes[0], normalize=_ST_NORMALIZE in types, max_seq_length=limit)


def max_seq_length(path: Path) -> int | None:
    """The input length a sentence-transformers model (embedding or cross-encoder) is cut to:
    `sentence_bert_config.json`'s `max_seq_length`; None without one."""
    settings = _read_json(path / "sentence_bert_config.json")
    value = settings.get("max_seq_length") if isinstance(settings, dict) else None
    return int(value) if isinstance(value, int) and value > 0 else None


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return None


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, config: PoolingConfig) -> torch.Tensor:
    """[T, H] hidden states of a packed row -> [B, H] float32 embeddings.

    Mean pooling sums each sequence's rows in float32 (`index_add_`), so a long input loses no
    precision to the model's dtype."""
    if config.mode != "mean":
        pooled = token_rows(hidden, cu_seqlens, config.mode).float()
    else:
        starts, ends = cu_seqlens[:-1], cu_seqlens[1:]
        lengths = ends - starts
        rows = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device), lengths)
        sums = torch.zeros(len(lengths), hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, rows, hidden.float())
        pooled = sums / lengths.unsqueeze(1).to(torch.float32)
    if config.normalize:
        pooled = F.normalize(pooled, p=2.0, dim=-1)
    return pooled


def token_rows(
    hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: Literal["cls", "last"]
) -> torch.Tensor:
    """[T, H] -> [B, H]: each sequence's first (`cls`) or last token, in the model's dtype."""
    index = cu_seqlens[:-1] if mode == "cls" else cu_seqlens[1:] - 1
    return hidden.index_select(0, index)
