"""What Ollama's clients ask of the models: /api/tags, /api/show, /api/ps, /api/version, and
the model management routes this server refuses.

Owns how a served model is described in Ollama's terms, from what is really served: its name
as served (`--served-model-name`, or the model's), `details` read off its files where they
tell (`family` from config.json's model_type, `parameter_size` counted from the safetensors
headers, `format`, `quantization_level` from --quantization or the engine's dtype), the
context length, and `capabilities` (completion and tools for a generating model, thinking
when the server reads a thinking format from its template, embedding for an embedding model).
`show` answers the model's Jinja chat template as `template` (the one in use), a modelfile
and parameters that say what the server was started with. Pull, push, create, copy, delete
and blobs are refused with a 400 that says why: models are chosen when the server starts.
A pull of a model already served succeeds at once (what a client that pulls before use needs).
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from quart import Response

from trio_llm import __version__
from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.ollama.build import rfc3339
from trio_llm.http.ollama.protocol import (
    Details,
    ListedModel,
    ModelRequest,
    Running,
    RunningModel,
    ShowResponse,
    Status,
    Tags,
    Version,
)
from trio_llm.http.ollama.served import read_any_body, served_name
from trio_llm.http.reasoning import pick_reasoning_format
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.state import current_state
from trio_llm.model_files import resolve_model

if TYPE_CHECKING:
    from trio_llm.http.model_specs import ModelSpec
    from trio_llm.http.runtime.state import AppState, ModelInfo

OLLAMA_API_VERSION = "0.12.0"
"""The Ollama release whose API this one follows (think, tools, format schemas, /api/embed's
dimensions): what /api/version says, since clients gate features on it."""

NEVER = "2318-01-01T00:00:00Z"
"""/api/ps's `expires_at` of a model that stays loaded (Ollama's keep_alive -1 looks alike)."""


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """What a model's files say of it (empty where they do not tell)."""

    format: str = ""
    family: str = ""
    parameters: int = 0
    size: int = 0
    path: str = ""


def _safetensors_parameters(path: Path) -> int:
    """The number of weights in one .safetensors file, from its JSON header only."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    count = 0
    for name, tensor in header.items():
        if name != "__metadata__":
            count += functools.reduce(lambda a, b: a * b, tensor["shape"], 1)
    return count


@functools.lru_cache(maxsize=32)
def model_files(model: str) -> ModelFiles:
    """Read once per model (a worker thread: resolving may touch many files)."""
    try:
        source = resolve_model(model)
        directory = source.path
        config = json.loads((directory / "config.json").read_text())
        weights = sorted(directory.glob("*.safetensors"))
        parameters = sum(_safetensors_parameters(w) for w in weights)
        size = sum(w.stat().st_size for w in weights)
    except Exception:  # a description is best effort: a model served is never refused for it
        return ModelFiles()
    origin = "gguf" if source.origin.lower().endswith(".gguf") else "safetensors"
    return ModelFiles(
        origin, str(config.get("model_type", "")), parameters, size, str(source.origin)
    )


def parameter_size(count: int) -> str:
    """Ollama's `parameter_size`: 135M, 1.2B."""
    if count <= 0:
        return ""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            value = count / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(count)


def quantization(spec: ModelSpec, dtype: str) -> str:
    chosen = spec.args.quantization
    if chosen not in ("auto", "none"):
        return chosen.upper()
    return {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(dtype, dtype.upper())


async def describe(state: AppState, card: ModelInfo) -> tuple[Details, ModelFiles]:
    served = state.router.model(card.name)
    spec = state.config.model_specs[state.router.models.index(served)]
    files = await trio.to_thread.run_sync(model_files, spec.args.model)
    live = served.live()
    dtype = live[0].client.model_config.dtype if live and live[0].client is not None else ""
    family = files.family
    details = Details(
        format=files.format,
        family=family,
        families=[family] if family else None,
        parameter_size=parameter_size(files.parameters),
        quantization_level=quantization(spec, dtype),
    )
    return details, files


def digest(card: ModelInfo) -> str:
    """A stable id of what is served (the model and how: its fingerprint)."""
    return hashlib.sha256(f"{card.name}\0{card.fingerprint}".encode()).hexdigest()


async def listed(state: AppState) -> list[ListedModel]:
    out = []
    for card in state.cards():
        details, files = await describe(state, card)
        out.append(
            ListedModel(
                name=card.name,
                model=card.name,
                modified_at=rfc3339(card.created),
                size=files.size,
                digest=digest(card),
                details=details,
            )
        )
    return out


async def running(state: AppState) -> list[RunningModel]:
    out = []
    for card in state.cards():
        if not state.router.model(card.name).live():
            continue
        details, files = await describe(state, card)
        out.append(
            RunningModel(
                name=card.name,
                model=card.name,
                size=files.size,
                digest=digest(card),
                details=details,
                expires_at=NEVER,
                size_vram=0,
                context_length=card.max_model_len,
            )
        )
    return out


def capabilities(card: ModelInfo, template: str | None, reasoning_parser: str) -> list[str]:
    if card.task == "embed":
        return ["embedding"]
    if card.task != "generate":
        return []
    found = ["completion", "tools"]
    if pick_reasoning_format(reasoning_parser, template) is not None:
        found.append("thinking")
    return found


async def show(state: AppState, card: ModelInfo, template: str | None) -> ShowResponse:
    details, files = await describe(state, card)
    defaults = card.sampling_defaults
    parameters = "\n".join(
        f"{name:<15} {getattr(defaults, name)}"
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    )
    family = details.family or "model"
    info: dict[str, object] = {
        "general.architecture": family,
        "general.parameter_count": files.parameters,
        f"{family}.context_length": card.max_model_len,
        f"{family}.vocab_size": card.vocab_size,
    }
    if card.embedding_size:
        info[f"{family}.embedding_length"] = card.embedding_size
    modelfile = (
        f"# Served by trio-llm {__version__}: models are chosen when the server starts.\n"
        f"FROM {files.path or card.name}\n"
    )
    return ShowResponse(
        modelfile=modelfile,
        parameters=parameters,
        template=template or "",
        details=details,
        model_info=info,
        capabilities=capabilities(card, template, state.config.reasoning_parser),
        modified_at=rfc3339(card.created),
    )


def refuse_management(action: str, names: list[str]) -> ProtocolError:
    """The 400 of pull, push, create, copy, delete and blobs."""
    served = ", ".join(f'"{n}"' for n in names)
    return ProtocolError(
        400,
        f"{action} is not supported: this server serves the models it was started with "
        f"({served}); models are chosen on its command line (trio-llm serve MODEL ...)",
        code="unsupported",
    )


# ---------------------------------------------------------------------------------------------
# Models


async def api_tags() -> Response:
    return json_response(Tags(await listed(current_state())))


async def api_ps() -> Response:
    return json_response(Running(await running(current_state())))


async def api_show() -> Response:
    state = current_state()
    given = await decode_body(ModelRequest, await read_any_body())
    if not given.model_name:
        raise bad_request("model: this field is required", param="model")
    name, card = served_name(state, given.model_name, "any")
    template = None
    if card.task == "generate":
        template = state.engine_for(state.router.model(name)).chat_template
    return json_response(await show(state, card, template))


async def api_version() -> Response:
    return json_response(Version(OLLAMA_API_VERSION, __version__))


async def api_pull() -> Response:
    """A model already served is there: success at once; any other is refused."""
    state = current_state()
    given = await decode_body(ModelRequest, await read_any_body())
    names = state.router.names()
    wanted = given.model_name
    if wanted in names or wanted.removesuffix(":latest") in names:
        return json_response(Status("success"))
    raise refuse_management(f'pull of "{wanted}"', names)


def _refusal(action: str) -> Callable[..., Any]:
    async def refuse(**_: object) -> Response:
        raise refuse_management(action, current_state().router.names())

    refuse.__name__ = f"api_{action}"
    return refuse


api_push = _refusal("push")
api_create = _refusal("create")
api_copy = _refusal("copy")
api_delete = _refusal("delete")
api_blobs = _refusal("blobs")
