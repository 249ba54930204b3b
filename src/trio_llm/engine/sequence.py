"""A sequence: one request's tokens and its progress through the engine.

What it owns: the token list (prompt then output), how many of those tokens have their K/V in
the cache (`num_computed_tokens`), the block table, and the request's finish state. The
scheduler moves sequences between its queues; the block manager fills `block_table`; the model
runner reads them. Nothing here touches tensors except the optional seeded generator.

Invariant: `num_computed_tokens <= num_tokens`, and `block_table` covers at least
`num_computed_tokens` positions. After a preemption (recompute) `num_computed_tokens` is 0 and
the table is empty, while the tokens (prompt and output so far) stay.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trio_llm.ipc.messages import TokenLogprobs
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from trio_llm.engine.token_bans import TokenBans


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


@dataclass(slots=True, eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    max_tokens: int
    """Output tokens allowed: the request's max_tokens, capped by the context limit."""
    priority: int = 0
    arrival: int = 0
    """Order of arrival (FCFS among equal priorities)."""
    num_prompt_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    """Chained hashes of the full blocks, in order (kept across preemption: tokens stay)."""
    block_chain: list[int] = field(default_factory=list)
    """For each of its full blocks published so far, the serial of the published block that
    holds that prefix (its own, or another sequence's with the same prefix); a 0 ends it."""
    num_cached_tokens: int = -1
    """Prompt tokens found in the prefix cache when first scheduled; -1 before that."""
    sent_first_output: bool = False
    finish_reason: str | None = None
    stop_reason: int | None = None
    generator: torch.Generator | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    bans: TokenBans | None = None
    """allowed_token_ids and bad_words, built once when the request arrived."""

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None

    def order(self) -> tuple[int, int]:
        """Scheduling order: lower priority value first, then earlier arrival."""
        return (self.priority, self.arrival)

    def __lt__(self, other: Sequence) -> bool:
        return self.order() < other.order()
