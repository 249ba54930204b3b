"""The frontend's tokenizer, confined to one thread per instance by construction.

A Hugging Face fast tokenizer wraps a Rust object behind a borrow flag: two threads inside one
instance at once can fail with "Already borrowed" (and a slow tokenization would hold the event
loop if it ran there). So the frontend keeps two instances and never lets one be used by two
threads:
- `loop`, used only on the event loop's thread: detokenizing every stream, the token texts of
  logprobs, and inputs small enough to handle inline;
- a private copy, used only inside `run()`, on a worker thread, by one call at a time (a
  capacity limiter of 1). Nobody else holds it: `run()` passes it to the function it runs.

Invariant: code that runs off the event loop reaches a tokenizer only as the argument `run()`
gives it, so no instance is ever shared across threads.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple

import anyio
import anyio.lowlevel
import anyio.to_thread

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

INLINE_MAX_COST = 8192
"""Work up to this size (characters to encode, or 4 per token id to decode) runs inline on the
event loop: about 0.5 ms on one core here, less than a thread hand-off costs in latency under
load. Anything larger runs on the worker thread."""


class ConfinedTokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.loop = tokenizer
        """The instance for the event loop's thread, and only for it."""
        self._worker = copy.deepcopy(tokenizer)
        self._limiter = anyio.CapacityLimiter(1)

    async def run(
        self, cost: int, fn: Callable[[PreTrainedTokenizerBase, *_Ts], _T], *args: *_Ts
    ) -> _T:
        """`fn(tokenizer, *args)`: inline with the loop's instance when `cost` is at most
        `INLINE_MAX_COST`, else on the worker thread with the worker's. Always a checkpoint."""
        if cost <= INLINE_MAX_COST:
            await anyio.lowlevel.checkpoint()
            return fn(self.loop, *args)
        return await anyio.to_thread.run_sync(fn, self._worker, *args, limiter=self._limiter)

    async def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return await self.run(4 * len(token_ids), _decode, token_ids, skip_special_tokens)

    async def vocab_tokens(self, token_ids: list[int]) -> list[str]:
        """Each id's vocabulary entry (as `/tokenize` returns them with `return_token_strs`)."""
        return await self.run(4 * len(token_ids), _vocab_tokens, token_ids)


def _decode(tokenizer: PreTrainedTokenizerBase, token_ids: list[int], skip: bool) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=skip)


def _vocab_tokens(tokenizer: PreTrainedTokenizerBase, token_ids: list[int]) -> list[str]:
    return list(tokenizer.convert_ids_to_tokens(token_ids))
