"""The answers of a text completion, from `RequestOutput`s: the complete text_completion and
the chunks of a stream, over one or more prompts (choice `i * n + j` is choice j of prompt i).

Owns the legacy completions' side of the answer: echo (the prompt's text first, and with
logprobs its tokens' logprobs first), the text offsets of the logprobs across chunks, and
prompt_logprobs per choice. Invariant: nothing here awaits anything or touches Quart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trio_llm.http.choices import ChoiceStream, Shape, ids_to_send, returned_ids
from trio_llm.http.completions.protocol import CompletionChoice, CompletionResponse
from trio_llm.http.logprobs import completion_logprobs, prompt_logprobs
from trio_llm.http.usage import UsageCounter
from trio_llm.outputs import PositionLogprobs, RequestOutput


def completion_response(
    shape: Shape,
    outputs: list[RequestOutput],
    *,
    echo_texts: list[str] | None = None,
    first_tokens: list[str] | None = None,
) -> CompletionResponse:
    """`outputs[i]` is prompt i's finished request; choice index is `i * n + output.index`.
    With echo, `echo_texts[i]` starts prompt i's choices and `first_tokens[i]` is the text of
    its first token (listed in the logprobs)."""
    usage = UsageCounter()
    choices = []
    for i, output in enumerate(outputs):
        usage.add(i, output)
        for o in sorted(output.outputs, key=lambda o: o.index):
            prefix = echo_texts[i] if echo_texts is not None else ""
            lp = None
            if shape.logprobs is not None:
                prompt = output.prompt_logprobs if echo_texts is not None else None
                first = first_tokens[i] if first_tokens is not None and prompt else None
                lp = completion_logprobs(
                    prompt or (), o.logprobs or (), shape.logprobs, len(prefix), first
                )
            choice = CompletionChoice(
                index=i * shape.n + o.index,
                text=prefix + o.text,
                logprobs=lp,
                finish_reason=o.finish_reason,
                stop_reason=o.stop_reason,
                prompt_token_ids=returned_ids(shape, output.prompt_token_ids),
                token_ids=returned_ids(shape, o.token_ids),
            )
            if shape.prompt_logprobs is not None:
                choice.prompt_logprobs = prompt_logprobs(
                    output.prompt_logprobs or (), shape.prompt_logprobs
                )
            choices.append(choice)
    return CompletionResponse(**shape.head(), choices=choices, usage=usage.usage())


@dataclass
class CompletionStream(ChoiceStream[CompletionResponse]):
    """Chunks of one streamed text completion over one or more prompts."""

    _chunk_type = CompletionResponse
    echo_texts: list[str] | None = None
    first_tokens: list[str] | None = None
    """With echo: the text of each prompt's first token (listed in the logprobs)."""
    _offsets: dict[int, int] = field(default_factory=dict, init=False)
    """Characters sent so far per choice: where the next token's text_offset starts."""

    def feed(self, prompt_index: int, output: RequestOutput) -> list[CompletionResponse]:
        self._usage.add(prompt_index, output)
        shape = self.shape
        chunks = []
        for o in output.outputs:
            choice = prompt_index * shape.n + o.index
            first = choice not in self._offsets
            offset = self._offsets.get(choice, 0)
            echo = ""
            prompt: list[PositionLogprobs | None] = []
            first_token = None
            if first and self.echo_texts is not None:
                echo = self.echo_texts[prompt_index]
                prompt = list(output.prompt_logprobs or ())
                if prompt and self.first_tokens is not None:
                    first_token = self.first_tokens[prompt_index]
            text = echo + o.text
            if not text and not o.finished and not o.logprobs and not ids_to_send(shape, o):
                continue
            lp = None
            if shape.logprobs is not None:
                lp = completion_logprobs(
                    prompt, o.logprobs or (), shape.logprobs, offset + len(echo), first_token
                )
            self._offsets[choice] = offset + len(text)
            out = CompletionChoice(
                index=choice,
                text=text,
                logprobs=lp,
                finish_reason=o.finish_reason,
                stop_reason=o.stop_reason,
                token_ids=returned_ids(shape, o.token_ids),
            )
            if first and shape.return_token_ids:
                out.prompt_token_ids = list(output.prompt_token_ids)
            chunks.append(self._chunk([out]))
        return chunks
