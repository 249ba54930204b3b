"""What one request may never sample: vLLM's `allowed_token_ids` and `bad_words`.

Built once per request, when it arrives (`TokenBans.build`). What never changes over the
request's life, every token outside `allowed_token_ids` and every one-token bad word, is one
bool row over the vocabulary; the sampler stacks the rows of a step's banned requests and masks
the batch's logits in one op. A bad word of several tokens bans its last token only while the
output ends with the tokens before it (vLLM's rule: the output's own tokens, not the prompt's);
those words are indexed by the token before the banned one, so a step costs one dict lookup per
such request, whatever the number of words.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trio_llm.sampling_params import SamplingParams


@dataclass(slots=True)
class TokenBans:
    row: torch.Tensor | None = None
    """[V] bool on the engine's device: True for a token the request never samples."""
    tails: dict[int, list[tuple[tuple[int, ...], int]]] = field(default_factory=dict)
    """Multi-token bad words by the last token of their prefix: (prefix, banned last token)."""

    @classmethod
    def build(
        cls, params: SamplingParams, vocab_size: int, device: torch.device
    ) -> TokenBans | None:
        """The request's bans, or None when it has none (most requests)."""
        words = params.bad_words_token_ids or ()
        if params.allowed_token_ids is None and not words:
            return None
        bans = cls()
        always = [word[0] for word in words if len(word) == 1]
        if params.allowed_token_ids is not None or always:
            row = torch.zeros(vocab_size, dtype=torch.bool)
            if params.allowed_token_ids is not None:
                row.fill_(True)
                row[torch.tensor(params.allowed_token_ids, dtype=torch.long)] = False
            if always:
                row[torch.tensor(always, dtype=torch.long)] = True
            bans.row = row.to(device)
        for word in words:
            if len(word) > 1:
                prefix = tuple(word[:-1])
                bans.tails.setdefault(prefix[-1], []).append((prefix, word[-1]))
        return bans

    def banned_now(self, token_ids: list[int], num_output_tokens: int) -> list[int]:
        """The last tokens of the multi-token bad words whose prefix ends the output."""
        if not self.tails or not num_output_tokens:
            return []
        candidates = self.tails.get(token_ids[-1])
        if not candidates:
            return []
        return [
            banned
            for prefix, banned in candidates
            if len(prefix) <= num_output_tokens and tuple(token_ids[-len(prefix) :]) == prefix
        ]
