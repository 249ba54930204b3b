"""A sequence classifier's head, applied by the pooling engine after its packed forward.

What it owns: taking a loaded `*ForSequenceClassification` apart into its base model (which
the pooling runner calls on the packed row, like an embedding model) and the head that turns
one pooled row per sequence into the model's outputs, plus the activation those outputs get.

Why the head is taken apart rather than called: transformers' classifiers pool inside their
forward (BERT's pooler and RoBERTa's head read token 0 of each row, a decoder's head reads
the last token that is not padding), which on a packed row would see only its first or last
sequence. Here each sequence's token is picked first (`cls` for an encoder, `last` for a
decoder), then the head's own modules run on those rows, so the numbers are the model's.

The activation is what a user gets: a cross-encoder (one label) the activation its
sentence-transformers config names (`sentence_transformers.activation_fn`, or the older
`sbert_ce_default_activation_function`), sigmoid when it names none (what
sentence-transformers' `CrossEncoder` and vLLM apply); a classifier with several labels the
softmax over its labels (vLLM's probabilities).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from trio_llm.engine.models.pooling import PoolingConfigError, PoolingMode

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "Sigmoid": torch.sigmoid,
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
}


@dataclass(frozen=True, slots=True)
class ClassifierHead:
    base: torch.nn.Module
    """The classifier's base model: called on the packed row, it returns the hidden states."""
    mode: PoolingMode
    """Which token of a sequence the head reads."""
    project: Callable[[Tensor], Tensor]
    """[B, H] pooled rows -> [B, labels] logits: the head's own modules."""
    labels: list[str]
    """`id2label` in label order."""
    activation: str
    """Applied to the logits: sigmoid, identity, tanh, or softmax (over several labels)."""

    def outputs(self, pooled: Tensor) -> Tensor:
        """[B, H] -> [B, labels] float32: the logits with the activation applied."""
        logits = self.project(pooled).float()
        if self.activation == "softmax":
            return torch.softmax(logits, dim=-1)
        return _ACTIVATIONS[self.activation.capitalize()](logits)


def classifier_head(model: torch.nn.Module) -> ClassifierHead:
    """The head of a loaded `*ForSequenceClassification` (one of
    `loader.CLASSIFIER_ARCHITECTURES`)."""
    config = model.config
    labels = [str(config.id2label.get(i, f"LABEL_{i}")) for i in range(int(config.num_labels))]
    activation = _activation(config, len(labels))
    name = type(model).__name__
    if name == "BertForSequenceClassification":
        pooler = model.bert.pooler  # type: ignore[union-attr]
        return ClassifierHead(
            model.bert,  # type: ignore[arg-type]
            "cls",
            lambda rows: model.classifier(pooler(rows.unsqueeze(1))),  # type: ignore[operator]
            labels,
            activation,
        )
    if name in ("RobertaForSequenceClassification", "XLMRobertaForSequenceClassification"):
        return ClassifierHead(
            model.roberta,  # type: ignore[arg-type]
            "cls",
            lambda rows: model.classifier(rows.unsqueeze(1)),  # type: ignore[operator]
            labels,
            activation,
        )
    base = getattr(model, "base_model_prefix", "model")
    if hasattr(model, "score") and hasattr(model, base):
        # transformers' GenericForSequenceClassification: a decoder and a linear `score`.
        return ClassifierHead(getattr(model, base), "last", model.score, labels, activation)  # type: ignore[arg-type]
    raise PoolingConfigError(f"{name}: the engine does not know where this classifier's head is")


def _activation(config: object, num_labels: int) -> str:
    if num_labels > 1:
        return "softmax"
    settings = getattr(config, "sentence_transformers", None)
    path = settings.get("activation_fn") if isinstance(settings, dict) else None
    path = path or getattr(config, "sbert_ce_default_activation_function", None)
    if path is None:
        return "sigmoid"
    name = str(path).rsplit(".", 1)[-1]
    if not str(path).startswith("torch.") or name not in _ACTIVATIONS:
        raise PoolingConfigError(
            f"the model's activation {path!r} is not one the engine applies; it applies "
            + ", ".join(f"torch.nn.{a}" for a in _ACTIVATIONS)
        )
    return name.lower()
