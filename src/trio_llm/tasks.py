"""What an engine serves: its task (chosen from the checkpoint or by `task=`), and which uses
of the model each task allows.

Shared by the engine (which resolves the task), the client (which refuses a call the engine
cannot serve before anything is sent) and the HTTP edge (whose 400 names the served models
that can). Pure values, no imports: every layer may read it.

- `generate`: a decoder with its LM head (chat, completions, responses).
- `embed`: a pooled embedding per input; scores two texts by the cosine of their embeddings.
- `score`: a cross-encoder, a `*ForSequenceClassification` with one label; scores a pair of
  texts by its logit of the pair (and classifies with that one label).
- `classify`: a sequence classifier with any number of labels (`id2label`).
- `transcribe`: a Whisper model in CTranslate2's format, on the speech engine
  (engine/speech/): speech to text, and to English text where the model is multilingual.
"""

from __future__ import annotations

from typing import Literal

Task = Literal["generate", "embed", "score", "classify", "transcribe"]
Use = Literal["generate", "embed", "score", "classify", "pooling", "transcribe"]

TASKS = ("auto", "generate", "embed", "classify", "score", "transcribe")
"""What `task=` may say; `auto` chooses from the checkpoint (`engine.loader.resolve_task`; a
Whisper directory: engine/process.py `build_core`)."""

USES: dict[str, tuple[Use, ...]] = {
    "generate": ("generate",),
    "embed": ("embed", "score", "pooling"),
    "score": ("score", "classify", "pooling"),
    "classify": ("classify", "pooling"),
    "transcribe": ("transcribe",),
}

TASK_WORDS = {
    "generate": "generation",
    "embed": "embeddings",
    "score": "scores of text pairs (a cross-encoder)",
    "classify": "classification",
    "transcribe": "speech to text",
}

USE_WORDS = {
    "generate": "generation",
    "embed": "embeddings",
    "score": "scoring and reranking",
    "classify": "classification",
    "pooling": "pooled outputs",
    "transcribe": "speech to text",
}


def serves(task: str, use: str) -> bool:
    """Whether an engine of `task` serves `use`."""
    return use in USES.get(task, ())


def is_pooling(task: str) -> bool:
    """Every task but generation and speech runs on the pooling engine (whole prompts, no KV
    cache)."""
    return task not in ("generate", "transcribe")
