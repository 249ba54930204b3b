"""A sequence: one request's tokens and its progress through the engine.

What it owns: the token list (prompt then output), how many of those tokens have their K/V in
the cache (`num_computed_tokens`), the block table, and the request's finish state. The
scheduler moves sequences between its queues; the block manager fills `block_table`; the model
runner reads them. Nothing here touches tensors.

Invariant: `num_computed_tokens <= num_tokens`, and `block_table` covers at least
`num_computed_tokens` positions. After a preemption (recompute) `num_computed_tokens` is 0 and
the table is empty, while the tokens (prompt and output so far) stay.

`token_ids` holds committed tokens only. A constrained sequence may also carry drafts
(`draft_token_ids`, the tokens its grammar forces next, see `engine/step/structured.py`): they are
computed with it in its next step and committed only as far as that step's samples agree, so
the uncomputed tokens and the sample rows count them, while the prefix cache, the finish checks
and the outputs never see them. A preemption drops them.

`ScheduledBatch` is one step's sequences as the scheduler hands them to the model runner (and
to the structured-output step); it lives here, beside what it holds, so that the modules that
read it need not import the scheduler.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trio_llm.ipc.messages import TokenLogprobs
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.engine.step.images import ImageSlot
    from trio_llm.engine.step.token_bans import TokenBans
    from trio_llm.grammar import Grammar


DEAD_END = -1
"""What the sampler returns, in place of a token, for a row where every token is masked (its
grammar, allowed_token_ids, bad words and min_tokens together leave none): the scheduler then
fails the request instead of committing a token nothing allowed."""


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
    decoding_since: int | None = None
    """The latest `arrival` the scheduler knew when this sequence first decoded: a prompt that
    arrived after that may not hold it for long (scheduler.py's `chunk_cap`)."""
    background: bool = False
    """Background work (a batch's line): scheduled after every interactive sequence and only
    with what they leave (scheduler.py, "Background work")."""
    num_prompt_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    cache_root: int = 0
    """Where its chain of block hashes starts: 0, or a salt's root (`block_manager.salt_root`)
    for a request with a `cache_salt`, so that its blocks match only requests with that salt."""
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
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    grammar: Grammar | None = None
    """The constraint's matcher, once compiled; it has consumed exactly the output tokens."""
    awaiting_grammar: bool = False
    """Its constraint is compiling: the scheduler leaves it waiting."""
    draft_token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    """With finish_reason 'error': why."""
    error_param: str | None = None
    """With an error the request's own parameters caused (a dead end): the one at fault."""
    bans: TokenBans | None = None
    """allowed_token_ids and bad_words, built once when the request arrived."""
    token_type_start: int = 0
    """A pooling request's pair of texts: where the second starts (0: one text)."""
    lora_slot: int = -1
    """The slot of its LoRA adapter's weights (engine/lora/); -1: the base model. Its
    `cache_root` is then the adapter's (`lora.adapter_root`)."""
    images: list[ImageSlot] = field(default_factory=list)
    """Its prompt's images (engine/step/images.py); empty for text."""
    adapter: tuple[int, str] | None = None
    """Its LoRA adapter's load id and name, which its KV events carry (vLLM's `lora_id` and
    `lora_name`): its blocks' hashes are the adapter's own."""

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
        """Tokens to compute, drafts included."""
        return len(self.token_ids) + len(self.draft_token_ids) - self.num_computed_tokens

    def block_key(self, index: int, block_size: int) -> tuple[object, ...]:
        """What the prefix cache keys full block `index` by: its tokens, and the content of
        any image whose placeholders it holds."""
        if not self.images:
            return tuple(self.token_ids[index * block_size : (index + 1) * block_size])
        from trio_llm.engine.step.images import block_key

        return block_key(self.token_ids, self.images, index, block_size)

    def tokens_between(self, start: int, end: int) -> list[int]:
        """Tokens `start:end` of the committed tokens followed by the drafts."""
        committed = len(self.token_ids)
        if end <= committed:
            return self.token_ids[start:end]
        return self.token_ids[start:] + self.draft_token_ids[: end - committed]

    def num_sample_rows(self, num_new_tokens: int) -> int:
        """Rows sampled when this step computes `num_new_tokens`: none for a chunk short of the
        end, else one per draft and one for the token after them. The sample rows of a step are
        each sampling sequence's, in batch order: its draft rows, then its last row."""
        if num_new_tokens != self.num_uncomputed_tokens:
            return 0
        return len(self.draft_token_ids) + 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None

    def order(self) -> tuple[bool, int, int]:
        """Scheduling order: interactive before background, then lower priority value first,
        then earlier arrival."""
        return (self.background, self.priority, self.arrival)

    def __lt__(self, other: Sequence) -> bool:
        return self.order() < other.order()


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence]
    """Decodes (one token) first, then prefill chunks."""
    num_tokens: list[int]
    """Tokens each sequence computes this step, starting at its `num_computed_tokens`."""
    num_decodes: int
    removed: list[Sequence] = field(default_factory=list)
    """Sequences that left the running set (finished, aborted, preempted) since the last
    batch: the model runner frees their rows of the persistent input batch."""

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)
