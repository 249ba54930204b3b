"""Input processing: what a caller asks for becomes engine requests.

What it owns: chat template rendering, tokenization (of prompts and of bad words), prompt
validation against the model's context length and vocabulary, the fan-out of `n > 1` into n
engine requests, and the inputs of pooling requests (texts tokenized as one batch, pairs of
texts in the tokenizer's pair encoding; truncated when asked, checked).

Invariants:
- Every check runs before anything reaches the engine, and each error names what to fix
  (`PromptTooLongError` carries both the prompt's token count and `max_tokens`).
- A large input is tokenized (and its chat template rendered) on a worker thread, so one big
  prompt never stalls the event loop that streams everyone else's tokens. A structured-output
  constraint is validated with the grammar library on a worker thread too, unless it was
  validated lately. The tokenizer is
  reached only through `ConfinedTokenizer.run`, which hands each thread its own instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import jinja2
import msgspec

from trio_llm import grammar
from trio_llm.client.background import in_background
from trio_llm.client.confined_tokenizer import INLINE_MAX_COST, ConfinedTokenizer
from trio_llm.client.errors import ChatTemplateError, InvalidPromptError, PromptTooLongError
from trio_llm.constraint import Constraint
from trio_llm.ipc.messages import EngineCoreRequest, ImageInput
from trio_llm.sampling_params import SamplingParams, SamplingParamsError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class InputProcessor:
    def __init__(
        self,
        tokenizer: ConfinedTokenizer,
        *,
        max_model_len: int,
        vocab_size: int,
        unproducible_bytes: frozenset[int] = frozenset(),
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.unproducible_bytes = unproducible_bytes

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return await self.tokenizer.run(len(text), _encode, text, add_special_tokens)

    async def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_special_tokens: bool = False,
    ) -> list[int]:
        template = self.tokenizer.loop.chat_template
        return await self.tokenizer.run(
            rendered_size(messages, chat_template_kwargs) + len(str(template or "")),
            _render_and_encode,
            messages,
            add_generation_prompt,
            continue_final_message,
            chat_template_kwargs or {},
            add_special_tokens,
        )

    async def with_bad_words_tokenized(self, params: SamplingParams) -> SamplingParams:
        """`params` with its `bad_words` turned into `bad_words_token_ids` (a copy; the same
        params when it has no bad words)."""
        if not params.bad_words:
            return params
        words = params.bad_words
        ids = await self.tokenizer.run(sum(map(len, words)), _bad_words_token_ids, words)
        return msgspec.structs.replace(
            params, bad_words=None, bad_words_token_ids=[*(params.bad_words_token_ids or ()), *ids]
        )

    def check_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise `SamplingParamsError` or `InvalidPromptError` if the engine must not see this."""
        params.validate()
        params.validate_vocab(self.vocab_size)
        if not prompt_token_ids:
            raise InvalidPromptError("the prompt is empty: give at least one token")
        # The wording is OpenAI's ("This model's maximum context length is"), which clients
        # (LiteLLM among them) match to tell a context overflow from other 400s.
        prompt_tokens, max_tokens = len(prompt_token_ids), params.max_tokens
        limit = self.max_model_len
        if prompt_tokens >= limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens, but the prompt has "
                f"{prompt_tokens} tokens (it must leave room for at least one generated token)",
                param="prompt",
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                max_model_len=limit,
            )
        if max_tokens is not None and prompt_tokens + max_tokens > limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens, but "
                f"{prompt_tokens + max_tokens} were requested ({prompt_tokens} in the prompt, "
                f"{max_tokens} for the completion); shorten the prompt or ask for fewer tokens",
                param="max_tokens",
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                max_model_len=limit,
            )
        # Last: a prompt too long for the context (400,000 tokens of a 2 MB body) is refused
        # without a pass over its ids on the event loop.
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= self.vocab_size:
            raise InvalidPromptError(
                f"the prompt holds token ids outside the vocabulary (size {self.vocab_size})"
            )

    async def embedding_inputs(
        self,
        inputs: Sequence[str | list[int]],
        *,
        truncate_prompt_tokens: int | None = None,
        add_special_tokens: bool = True,
        params: Sequence[str] | None = None,
    ) -> list[list[int]]:
        """Each input's token ids, checked: texts are tokenized together (one call), and with
        `truncate_prompt_tokens` (-1: the model's length) cut to that many tokens the way the
        tokenizer truncates (sentence-transformers' way); without it, an input longer than the
        model's length raises `PromptTooLongError` naming it (`params[i]`; by default `input`,
        or `input[i]` among several)."""
        truncate = self._truncation(truncate_prompt_tokens)
        texts = [text for text in inputs if isinstance(text, str)]
        encoded = iter(
            await self.tokenizer.run(
                sum(map(len, texts)), _encode_batch, texts, add_special_tokens, truncate
            )
            if texts
            else ()
        )
        left = self.tokenizer.loop.truncation_side == "left"
        names = _input_params(len(inputs)) if params is None else params
        result = []
        for given, param in zip(inputs, names, strict=True):
            ids = next(encoded) if isinstance(given, str) else list(given)
            if truncate is not None and len(ids) > truncate:
                ids = ids[-truncate:] if left else ids[:truncate]
            self._check_pooling_input(ids, param)
            result.append(ids)
        return result

    async def pair_inputs(
        self,
        firsts: Sequence[str],
        seconds: Sequence[str],
        *,
        params: Sequence[str],
        truncate_prompt_tokens: int | None = None,
    ) -> list[tuple[list[int], int]]:
        """Each pair's token ids in the tokenizer's pair encoding (`[CLS] a [SEP] b [SEP]`,
        `<s> a </s></s> b </s>`), with where its second text starts (the first token of type
        1; 0 for a tokenizer without token types), checked like `embedding_inputs`; with
        `truncate_prompt_tokens` the longer text is cut first (sentence-transformers'
        `CrossEncoder`), without it a pair too long raises `PromptTooLongError` naming
        `params[i]`."""
        truncate = self._truncation(truncate_prompt_tokens)
        pairs = await self.tokenizer.run(
            sum(map(len, firsts)) + sum(map(len, seconds)),
            _encode_pairs,
            list(firsts),
            list(seconds),
            truncate,
        )
        for (ids, _), param in zip(pairs, params, strict=True):
            if truncate is not None and len(ids) > truncate:
                # The tokenizer leaves a pair whole when its special tokens alone need more.
                raise InvalidPromptError(
                    f"truncate_prompt_tokens {truncate} is too small for the pair of {param}: "
                    f"the tokenizer cannot cut it below {len(ids)} tokens",
                    param="truncate_prompt_tokens",
                )
            self._check_pooling_input(ids, param)
        return pairs

    async def cut_texts(self, texts: Sequence[str], max_tokens: int) -> list[str]:
        """Each text cut after its first `max_tokens` tokens (without special tokens), at the
        end of the last kept token: Cohere's `max_tokens_per_doc`, which cuts a document
        before it is paired with the query."""
        return await self.tokenizer.run(sum(map(len, texts)), _cut_texts, list(texts), max_tokens)

    def _truncation(self, truncate_prompt_tokens: int | None) -> int | None:
        limit = self.max_model_len
        if truncate_prompt_tokens == -1:
            return limit
        if truncate_prompt_tokens is not None and not 1 <= truncate_prompt_tokens <= limit:
            raise InvalidPromptError(
                f"truncate_prompt_tokens must be -1 or between 1 and {limit} (the model's "
                f"maximum input length), got {truncate_prompt_tokens}",
                param="truncate_prompt_tokens",
            )
        return truncate_prompt_tokens

    def _check_pooling_input(self, ids: list[int], param: str) -> None:
        limit = self.max_model_len
        if not ids:
            raise InvalidPromptError(f"{param} is empty: give at least one token", param=param)
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise InvalidPromptError(
                f"{param} holds token ids outside the vocabulary (size {self.vocab_size})",
                param=param,
            )
        if len(ids) > limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens, but {param} has "
                f"{len(ids)} tokens; shorten it, or set truncate_prompt_tokens to cut it",
                param=param,
                prompt_tokens=len(ids),
                max_tokens=None,
                max_model_len=limit,
            )

    async def check_constraint(self, constraint: Constraint) -> None:
        """Raise `SamplingParamsError` (param "constraint") unless the engine can enforce it
        for this model (`check_constraint`)."""
        await check_constraint(constraint, self.unproducible_bytes)

    @staticmethod
    def engine_requests(
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        arrival_time: float,
        priority: int = 0,
        lora: str | None = None,
        images: list[ImageInput] | None = None,
    ) -> list[EngineCoreRequest]:
        """One engine request per choice. With n > 1, choice i is its own request with n=1 and,
        when a seed is given, seed + i, so the choices differ yet the whole call reproduces.
        `lora`: the adapter every choice generates with."""
        if params.n == 1:
            children = [(request_id, params)]
        else:
            children = [
                (
                    f"{i}_{request_id}",
                    msgspec.structs.replace(
                        params, n=1, seed=None if params.seed is None else params.seed + i
                    ),
                )
                for i in range(params.n)
            ]
        return [
            EngineCoreRequest(
                request_id=child_id,
                prompt_token_ids=prompt_token_ids,
                sampling_params=child_params,
                arrival_time=arrival_time,
                priority=priority,
                background=in_background(),
                lora=lora,
                images=images,
            )
            for child_id, child_params in children
        ]


def rendered_size(messages: list[dict[str, Any]], kwargs: dict[str, Any] | None) -> int:
    """How much a chat template renders: the messages and the template's other variables (the
    tools, earlier calls and their arguments) as JSON text, whatever holds the bulk of it.
    Measured in one C-speed pass; what cannot be measured counts as large."""
    try:
        return len(msgspec.json.encode(messages)) + len(msgspec.json.encode(kwargs or {}))
    except (TypeError, ValueError, OverflowError, RecursionError):
        return INLINE_MAX_COST + 1


async def check_constraint(
    constraint: Constraint, unproducible_bytes: frozenset[int] = frozenset()
) -> None:
    """Raise `SamplingParamsError` (param "constraint") unless the engine can enforce
    `constraint` for a model whose vocabulary writes none of `unproducible_bytes`; validated on
    a worker thread unless it was lately."""
    try:
        if grammar.is_checked(constraint, unproducible_bytes):
            grammar.check(constraint, unproducible_bytes)
        else:
            await anyio.to_thread.run_sync(
                grammar.check, constraint, unproducible_bytes, abandon_on_cancel=True
            )
    except grammar.ConstraintError as error:
        raise SamplingParamsError("constraint", str(error)) from None


def _encode(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def _encode_batch(
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    add_special_tokens: bool,
    truncate: int | None,
) -> list[list[int]]:
    encoded = tokenizer(
        texts,
        add_special_tokens=add_special_tokens,
        truncation=truncate is not None,
        max_length=truncate,
    )
    return [list(ids) for ids in encoded["input_ids"]]


def _encode_pairs(
    tokenizer: PreTrainedTokenizerBase,
    firsts: list[str],
    seconds: list[str],
    truncate: int | None,
) -> list[tuple[list[int], int]]:
    encoded = tokenizer(
        firsts,
        seconds,
        truncation="longest_first" if truncate is not None else False,
        max_length=truncate,
    )
    types = encoded.get("token_type_ids")
    pairs = []
    for i, ids in enumerate(encoded["input_ids"]):
        start = list(types[i]).index(1) if types is not None and 1 in types[i] else 0
        pairs.append((list(ids), start))
    return pairs


def _cut_texts(tokenizer: PreTrainedTokenizerBase, texts: list[str], max_tokens: int) -> list[str]:
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return [
        text if len(offsets) <= max_tokens else text[: offsets[max_tokens - 1][1]]
        for text, offsets in zip(texts, encoded["offset_mapping"], strict=True)
    ]


def _input_params(count: int) -> list[str]:
    return ["input"] if count == 1 else [f"input[{i}]" for i in range(count)]


def _bad_words_token_ids(tokenizer: PreTrainedTokenizerBase, words: list[str]) -> list[list[int]]:
    """vLLM's tokenization of bad words: each word as it would start a text and, when that
    spells it differently in as many tokens, as it would follow a space (byte-level and
    SentencePiece tokenizers give a word after a space its own tokens)."""
    out: list[list[int]] = []
    for word in words:
        bare = _encode(tokenizer, word.lstrip(), add_special_tokens=False)
        spaced = _encode(tokenizer, " " + word.lstrip(), add_special_tokens=False)
        if bare:
            out.append(bare)
        if spaced and (not bare or (spaced[0] != bare[0] and len(spaced) == len(bare))):
            out.append(spaced)
    return out


def _render_and_encode(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    continue_final_message: bool,
    chat_template_kwargs: dict[str, Any],
    add_special_tokens: bool,
) -> list[int]:
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **chat_template_kwargs,
        )
    except Exception as exc:  # whatever the template raises, the messages made it fail
        detail = str(exc) if isinstance(exc, ValueError | jinja2.TemplateError) else repr(exc)
        raise ChatTemplateError(f"cannot render the chat template: {detail}") from exc
    # The template already wrote the special tokens (BOS and the role markers) as text; more
    # only when asked for (vLLM's add_special_tokens).
    return _encode(tokenizer, str(text), add_special_tokens=add_special_tokens)
