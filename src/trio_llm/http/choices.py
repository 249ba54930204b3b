"""What chat completions and text completions share in their answers: the `Shape` one request
asks of its responses and chunks (beyond the text), and the frame of their streams.

Both answer with n choices per prompt, repeat the response's head (id, model, created,
fingerprint) on every chunk, carry vLLM's token ids on request, and count usage the same way.
Invariant: nothing here awaits anything or touches Quart, so a stream's whole lifecycle (role
chunk, deltas, usage chunk) is tested with plain values, without a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from msgspec import UNSET, UnsetType

from trio_llm.http.errors import ProtocolError
from trio_llm.http.ids import ResponseHead
from trio_llm.http.sse import SSE_DONE
from trio_llm.http.usage import Usage, UsageCounter
from trio_llm.outputs import CompletionOutput


class ChoicesRequest(Protocol):
    """What a chat or text completion request says about its answer's shape (its n, vLLM's
    prompt_logprobs and return_token_ids, and `stream_options`: `sampling.SamplingFields`)."""

    n: int
    prompt_logprobs: int | None
    return_token_ids: bool

    @property
    def include_usage(self) -> bool: ...
    @property
    def continuous_usage(self) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """What one request's responses and chunks carry beyond the generated text."""

    response_id: str
    model: str
    created: int
    system_fingerprint: str | None = None
    n: int = 1
    logprobs: int | None = None
    """Alternatives per generated token (chat top_logprobs, completions logprobs); None: none."""
    prompt_logprobs: int | None = None
    """vLLM's prompt_logprobs field: alternatives per prompt token; None: not returned."""
    return_token_ids: bool = False
    include_usage: bool = False
    continuous_usage: bool = False

    @classmethod
    def of(cls, head: ResponseHead, request: ChoicesRequest, *, logprobs: int | None) -> Shape:
        """`logprobs`: alternatives per generated token (None: no logprobs)."""
        return cls(
            response_id=head.response_id,
            model=head.model,
            created=head.created,
            system_fingerprint=head.system_fingerprint,
            n=request.n,
            logprobs=logprobs,
            prompt_logprobs=request.prompt_logprobs,
            return_token_ids=request.return_token_ids,
            include_usage=request.include_usage,
            continuous_usage=request.continuous_usage,
        )

    def head(self) -> dict[str, Any]:
        """The fields every response and chunk of the request repeats."""
        return {
            "id": self.response_id,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
        }


def returned_ids(shape: Shape, ids: list[int]) -> list[int] | UnsetType:
    return list(ids) if shape.return_token_ids else UNSET


def ids_to_send(shape: Shape, output: CompletionOutput) -> bool:
    return shape.return_token_ids and bool(output.token_ids)


Chunk = TypeVar("Chunk")


@dataclass
class ChoiceStream(Generic[Chunk]):
    """What both streams share: every chunk names the response (id, model, created,
    fingerprint); with include_usage each carries `usage: null` (with continuous_usage, the
    usage so far) and a last chunk with no choices carries the usage of the whole response.
    A failure after the 200 is one error object; `[DONE]` closes the stream either way."""

    _chunk_type: ClassVar[type[Any]]
    done: ClassVar[bytes] = SSE_DONE
    shape: Shape
    _usage: UsageCounter = field(default_factory=UsageCounter, init=False)

    def _chunk(self, choices: list[Any]) -> Chunk:
        shape = self.shape
        usage: Usage | UnsetType | None = UNSET
        if shape.include_usage:
            usage = self._usage.usage() if shape.continuous_usage else None
        return self._chunk_type(**shape.head(), choices=choices, usage=usage)

    def begin(self) -> list[Chunk]:
        return []

    def end(self) -> list[Chunk]:
        if not self.shape.include_usage:
            return []
        chunk = self._chunk([])
        chunk.usage = self._usage.usage()
        return [chunk]

    def fail(self, error: ProtocolError) -> list[dict[str, Any]]:
        return [error.to_dict()]
