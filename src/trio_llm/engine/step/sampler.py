"""The sampler: from one step's logits to the next token of every sampled sequence.

What it owns: turning per-request sampling parameters into per-row tensors
(`SamplingTensors.build`), and the batched pipeline over a [B, V] logits tensor:
logprobs of the raw logits, then logit_bias, penalties, the banned tokens (allowed_token_ids
and bad words, each request's built once in `TokenBans`; EOS and stop tokens before min_tokens),
then greedy argmax or temperature, min-p, top-k, top-p and a draw. Work a batch does not ask
for is skipped, so a batch of plain greedy requests costs one argmax.

The draw inverts each row's cumulative distribution at one uniform number per row (`draw`),
rather than racing every token against exponential noise (argmax(p / E)): the race needs V
random numbers a row, which torch's CPU generator makes one at a time; measured on the AMD EPYC
(2 threads, beside the test suite), 32 rows of the default model's 49,152 tokens took 47 ms a
step that way against 3.7 ms for the float64 cumulative sum and search.

Invariant: a seeded request's draw for its output position p is a function of its seed and p
alone (counter-based: its uniform is `noise_seed(seed, p)`'s top 53 bits), so its tokens
depend neither on what else is in the batch, nor on how many draft rows its step samples
(jump-forward), nor on a preemption that recomputes it. The client gives every sampled
request a seed (`sampling_params.with_seed`); only rows submitted to the engine without one
(in-process users) share the engine's generator. A row whose every logit is -inf after the
masks (nothing may be sampled) gets `DEAD_END` instead of a token: never the argmax of nothing,
token 0.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from trio_llm.engine.step.input_batch import PenaltyTokens, SamplingColumns
from trio_llm.engine.step.sequence import DEAD_END, Sequence
from trio_llm.ipc.messages import TokenLogprobs
from trio_llm.sampling_params import SamplingParams

_NEG_INF = float("-inf")
_MASK64 = (1 << 64) - 1


def noise_seed(seed: int, position: int) -> int:
    """The seed of the draw for output `position` of a request seeded with `seed`: the two
    mixed by splitmix64's finalizer, so that neighbouring seeds and positions get unrelated
    streams."""
    z = ((seed & _MASK64) ^ ((position + 1) * 0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


@dataclass(slots=True)
class SamplingTensors:
    """Per-row parameters of one step's batch; None where no row needs that stage."""

    all_greedy: bool
    greedy: torch.Tensor | None = None
    """[B] bool: rows that take the argmax."""
    temperature: torch.Tensor | None = None
    """[B, 1] (1.0 on greedy rows)."""
    top_k: torch.Tensor | None = None
    """[B] int64, 0 where disabled."""
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    noise_seeds: dict[int, int] | None = None
    """Seeded rows -> the seed of this draw (`noise_seed` of the request's seed and the
    output position the row samples)."""
    bias_rows: torch.Tensor | None = None
    bias_cols: torch.Tensor | None = None
    bias_values: torch.Tensor | None = None
    banned_rows: torch.Tensor | None = None
    """(row, token) pairs masked this step: EOS and stop tokens before min_tokens, the last
    token of a bad word whose prefix ends the output."""
    banned_cols: torch.Tensor | None = None
    mask_rows: torch.Tensor | None = None
    """Rows with a request's own ban row (`TokenBans.row`)."""
    masks: torch.Tensor | None = None
    """[M, V] bool, True where row `mask_rows[m]` may not sample."""
    penalty_rows: torch.Tensor | None = None
    """Rows with any penalty; the penalty tensors below are indexed like this list."""
    presence: torch.Tensor | None = None
    frequency: torch.Tensor | None = None
    repetition: torch.Tensor | None = None
    output_ids: torch.Tensor | None = None
    """[P, max_out] output tokens of the penalized rows, padded with V."""
    context_ids: torch.Tensor | None = None
    """[P, max_len] prompt and output tokens of the penalized rows, padded with V."""
    num_logprobs: list[int | None] | None = None

    @classmethod
    def build(
        cls,
        seqs: Seq[Sequence],
        eos_token_ids: frozenset[int],
        vocab_size: int,
        device: torch.device,
        columns: SamplingColumns | None = None,
        draft_offsets: np.ndarray | None = None,
    ) -> SamplingTensors:
        """`columns`: the rows' sampling parameters as the persistent input batch holds them
        (the same values `seqs` would give, without a Python pass over them).
        `draft_offsets`: per row, how many rows of its sequence come before it (its draft
        rows'), so that row samples output position `num_output_tokens + offset`; zeros when
        None."""
        params = [s.params for s in seqs]
        if columns is None:
            columns = SamplingColumns.of(seqs)
        st = cls(all_greedy=bool(columns.greedy.all()))
        if not st.all_greedy:
            st._set_sampling(seqs, columns, device, draft_offsets)
        if any(p.logit_bias for p in params):
            st._set_logit_bias(params, device)
        if any(s.num_output_tokens < s.params.min_tokens or s.bans is not None for s in seqs):
            st._set_banned(seqs, eos_token_ids, device)
        if any(_penalized(p) for p in params):
            st._set_penalties(seqs, vocab_size, device, columns.tokens)
        if any(p.logprobs is not None for p in params):
            st.num_logprobs = [p.logprobs for p in params]
        return st

    def _set_sampling(
        self,
        seqs: Seq[Sequence],
        columns: SamplingColumns,
        device: torch.device,
        draft_offsets: np.ndarray | None,
    ) -> None:
        """The sampled rows' temperature, top-k, top-p and min-p tensors (only those some row
        uses), and the seeds of the seeded rows' draws."""
        greedy = columns.greedy
        self.greedy = torch.from_numpy(greedy).to(device)
        self.temperature = torch.from_numpy(columns.temperature).to(device).unsqueeze(1)
        sampled = ~greedy
        if (columns.top_k[sampled] > 0).any():
            self.top_k = torch.from_numpy(columns.top_k).to(device)
        if (columns.top_p[sampled] < 1.0).any():
            self.top_p = torch.from_numpy(columns.top_p).to(device)
        if (columns.min_p[sampled] > 0.0).any():
            self.min_p = torch.from_numpy(columns.min_p).to(device)
        seeds = {
            i: noise_seed(
                s.params.seed,
                s.num_output_tokens + (0 if draft_offsets is None else int(draft_offsets[i])),
            )
            for i, s in enumerate(seqs)
            if s.params.seed is not None and not greedy[i]
        }
        self.noise_seeds = seeds or None

    def _set_logit_bias(self, params: list[SamplingParams], device: torch.device) -> None:
        pairs = [(i, t, b) for i, p in enumerate(params) for t, b in (p.logit_bias or {}).items()]
        rows, cols, values = zip(*pairs)
        self.bias_rows = torch.tensor(rows, device=device)
        self.bias_cols = torch.tensor(cols, device=device)
        self.bias_values = torch.tensor(values, dtype=torch.float32, device=device)

    def _set_banned(
        self, seqs: Seq[Sequence], eos_token_ids: frozenset[int], device: torch.device
    ) -> None:
        """EOS and stop tokens are masked until min_tokens are out (EOS not with ignore_eos);
        bad words by their `TokenBans`."""
        rows: list[int] = []
        cols: list[int] = []
        mask_rows: list[int] = []
        masks: list[torch.Tensor] = []
        for i, s in enumerate(seqs):
            banned: set[int] = set()
            if s.num_output_tokens < s.params.min_tokens:
                banned.update(s.params.stop_token_ids)
                if not s.params.ignore_eos:
                    banned |= eos_token_ids
            if s.bans is not None:
                banned.update(s.bans.banned_now(s.token_ids, s.num_output_tokens))
                if s.bans.row is not None:
                    mask_rows.append(i)
                    masks.append(s.bans.row)
            rows.extend([i] * len(banned))
            cols.extend(banned)
        if rows:
            self.banned_rows = torch.tensor(rows, dtype=torch.long, device=device)
            self.banned_cols = torch.tensor(cols, dtype=torch.long, device=device)
        if masks:
            self.mask_rows = torch.tensor(mask_rows, dtype=torch.long, device=device)
            self.masks = torch.stack(masks)

    def _set_penalties(
        self,
        seqs: Seq[Sequence],
        vocab_size: int,
        device: torch.device,
        tokens: PenaltyTokens | None,
    ) -> None:
        rows = [i for i, s in enumerate(seqs) if _penalized(s.params)]
        chosen = [seqs[i] for i in rows]

        def column(name: str) -> torch.Tensor:
            return torch.tensor([getattr(s.params, name) for s in chosen], device=device)[:, None]

        self.penalty_rows = torch.tensor(rows, device=device)
        self.presence = column("presence_penalty")
        self.frequency = column("frequency_penalty")
        self.repetition = column("repetition_penalty")
        if tokens is not None:
            context, output = tokens.padded(np.asarray(rows), vocab_size)
            self.output_ids = torch.from_numpy(output).to(device)
            self.context_ids = torch.from_numpy(context).to(device)
        else:
            self.output_ids = _padded([s.output_token_ids for s in chosen], vocab_size).to(device)
            self.context_ids = _padded([s.token_ids for s in chosen], vocab_size).to(device)


def _penalized(p: SamplingParams) -> bool:
    return bool(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0)


def _padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None = None


class Sampler:
    def __init__(
        self,
        seed: int,
        device: torch.device,
        to_host: Callable[[torch.Tensor], list[int]] | None = None,
    ) -> None:
        """`to_host`: how the sampled tokens come back to the host (the runner's one
        non-blocking copy into pinned memory); `tolist` without it."""
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.to_host = to_host or torch.Tensor.tolist

    def __call__(
        self, logits: torch.Tensor, st: SamplingTensors, *, masked: bool = False
    ) -> SamplerOutput:
        """`masked`: a grammar's bitmask has set some of `logits` to -inf already."""
        logits = logits.float()
        raw = logits
        banned = st.banned_rows is not None or st.masks is not None
        if banned or st.bias_rows is not None or st.penalty_rows is not None:
            logits = logits.clone()
            apply_logit_bias(logits, st)
            apply_penalties(logits, st)
            apply_bans(logits, st)
        top, greedy = row_max(logits)
        tokens = greedy if st.all_greedy else self._sample(logits, st, greedy)
        if masked or banned:
            # The maximum of an all -inf row is -inf: nothing may be sampled there.
            tokens = torch.where(top == _NEG_INF, DEAD_END, tokens)
        token_list = self.to_host(tokens)
        logprobs = None
        if st.num_logprobs is not None:
            logprobs = compute_logprobs(raw, tokens.clamp(min=0), st.num_logprobs)
        return SamplerOutput(token_list, logprobs)

    def _sample(
        self, logits: torch.Tensor, st: SamplingTensors, greedy_tokens: torch.Tensor
    ) -> torch.Tensor:
        assert st.greedy is not None and st.temperature is not None
        logits = logits / st.temperature
        if st.min_p is not None:
            apply_min_p(logits, st.min_p)
        if st.top_k is not None or st.top_p is not None:
            logits = apply_top_k_top_p(logits, st.top_k, st.top_p)
        probs = logits.softmax(dim=-1)
        sampled = self._draw(probs, st.noise_seeds)
        return torch.where(st.greedy, greedy_tokens, sampled)

    def _draw(self, probs: torch.Tensor, seeds: dict[int, int] | None) -> torch.Tensor:
        uniforms = torch.rand(
            probs.shape[0], dtype=torch.float64, generator=self.generator, device=probs.device
        )
        if seeds:
            rows = torch.tensor(list(seeds), device=probs.device)
            uniforms[rows] = torch.tensor(
                [uniform(s) for s in seeds.values()], dtype=torch.float64, device=probs.device
            )
        return draw(probs, uniforms)


def row_max(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's maximum and its index, the first of equal maxima (a NaN counts as the
    maximum, its first index taken): what `logits.max(dim=-1)` gives.

    Why not that on a CPU: torch's reduction with indices runs at 2-3 G elements/s there,
    0.6 ms of a 32-stream step's 35 ms for [32, 49152] float32, where numpy's vectorized argmax
    took 0.23 ms (one row: 8 us against 40; an AMX Xeon, 2 threads for torch, 1 for numpy)."""
    if logits.device.type != "cpu" or logits.dim() != 2 or logits.shape[1] == 0:
        return logits.max(dim=-1)
    index = torch.from_numpy(logits.numpy().argmax(axis=1).astype(np.int64, copy=False))
    return logits.gather(1, index[:, None])[:, 0], index


def uniform(noise: int) -> float:
    """A uniform number in [0, 1) from a `noise_seed`: its top 53 bits, a double's mantissa."""
    return (noise >> 11) * 2.0**-53


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Each row's token where its cumulative distribution first exceeds its uniform (scaled
    by the row's total, so probabilities need not sum to exactly one). A token of probability
    zero (masked by top-k, top-p or a grammar) never leaves the running sum below and above
    the point at once, so it cannot be drawn. float64: a float32 sum over ~50k tokens drifts by
    about 1e-4 of the total, a bias the size of a rare token's probability. Row by row, so a
    row's draw does not depend on the rows beside it."""
    cdf = probs.double().cumsum(dim=-1)
    point = uniforms.unsqueeze(1) * cdf[:, -1:]
    token = torch.searchsorted(cdf, point, right=True).squeeze(1)
    return token.clamp_(max=probs.shape[1] - 1)  # a point that rounding put at the total


def apply_logit_bias(logits: torch.Tensor, st: SamplingTensors) -> None:
    if st.bias_rows is not None:
        assert st.bias_cols is not None and st.bias_values is not None
        logits.index_put_((st.bias_rows, st.bias_cols), st.bias_values, accumulate=True)


def apply_bans(logits: torch.Tensor, st: SamplingTensors) -> None:
    """Each banned request's own row in one masked fill, then this step's (row, token) pairs
    in one indexed write."""
    if st.masks is not None:
        assert st.mask_rows is not None
        sub = logits.index_select(0, st.mask_rows).masked_fill_(st.masks, _NEG_INF)
        logits.index_copy_(0, st.mask_rows, sub)
    if st.banned_rows is not None:
        logits[st.banned_rows, st.banned_cols] = _NEG_INF


def apply_penalties(logits: torch.Tensor, st: SamplingTensors) -> None:
    """Presence and frequency penalties count output tokens (OpenAI); the repetition penalty
    (divide positive logits, multiply negative ones) covers prompt and output (HF/CTRL)."""
    if st.penalty_rows is None:
        return
    assert st.output_ids is not None and st.context_ids is not None
    assert st.presence is not None and st.frequency is not None and st.repetition is not None
    rows = st.penalty_rows
    vocab = logits.shape[1]
    sub = logits[rows]
    counts = torch.zeros(len(rows), vocab + 1, device=logits.device)
    counts.scatter_add_(1, st.output_ids, torch.ones_like(st.output_ids, dtype=counts.dtype))
    counts = counts[:, :vocab]
    seen = torch.zeros(len(rows), vocab + 1, dtype=torch.bool, device=logits.device)
    seen.scatter_(1, st.context_ids, True)
    seen = seen[:, :vocab]
    rep = torch.where(seen, st.repetition, torch.ones_like(st.repetition))
    sub = torch.where(sub > 0, sub / rep, sub * rep)
    sub -= st.frequency * counts + st.presence * (counts > 0)
    logits[rows] = sub


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    probs = logits.softmax(dim=-1)
    top = probs.max(dim=-1, keepdim=True).values
    logits.masked_fill_(probs < min_p.unsqueeze(1) * top, _NEG_INF)


NUCLEUS_CANDIDATES = 1024
"""Top-p looks for its nucleus among each row's this many most likely tokens first, and sorts
only the rows whose nucleus reaches past them. Measured on one thread (the AMD EPYC, beside
other work) over the default model's 49,152 tokens at top_p 0.9: for peaked rows as a language
model's are (Gaussian logits of deviation 8, nuclei of 3-4 tokens) 8.3 -> 1.0 ms for one row
and 300 -> 38 ms for 32; for flat rows (deviation 3, nuclei of ~2,000) 1.35-1.5x slower than
sorting at once."""


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    vocab = logits.shape[1]
    if top_p is None:
        assert top_k is not None
        # Top-k alone: the k-th largest value is the threshold; no full sort needed.
        k = top_k.clamp(max=vocab)
        kmax = int(k.max())
        kth = logits.topk(kmax, dim=-1).values.gather(1, (k.clamp(min=1) - 1).unsqueeze(1))
        kth.masked_fill_((k == 0).unsqueeze(1), _NEG_INF)  # rows without top-k keep all
        return logits.masked_fill(logits < kth, _NEG_INF)
    k = torch.full_like(top_p, vocab, dtype=torch.long) if top_k is None else top_k
    k = torch.where(k > 0, k, vocab).clamp(max=vocab)
    cap = min(NUCLEUS_CANDIDATES, vocab)
    values, order = logits.topk(cap, dim=-1)  # descending
    values = values.masked_fill(torch.arange(cap, device=logits.device) >= k.unsqueeze(1), _NEG_INF)
    # Each candidate's probability within what top-k keeps (the whole row without top-k).
    whole = k >= vocab
    total = torch.where(
        (k <= cap).unsqueeze(1),
        values.logsumexp(dim=-1, keepdim=True),
        logits.logsumexp(dim=-1, keepdim=True),
    )
    probs = (values - total).exp()
    # A token stays while the more likely ones above it hold less than p (the sorted
    # version's "drop the smallest whose total stays within 1 - p"); the first always does.
    above = probs.cumsum(dim=-1) - probs
    nucleus = torch.where(top_p < 1.0, top_p, float("inf"))  # 1.0: top-p off for the row
    values = values.masked_fill(above >= nucleus.unsqueeze(1), _NEG_INF)
    # Rows the candidates settle: top-k within them, or a nucleus that closes inside them;
    # a row with neither top-k nor top-p keeps every token.
    untouched = whole & (top_p >= 1.0)
    settled = (k <= cap) | (whole & (probs.sum(dim=-1) >= nucleus))
    out = torch.full_like(logits, _NEG_INF).scatter_(1, order, values)
    out[untouched] = logits[untouched]
    rest = (~settled & ~untouched).nonzero().squeeze(1)
    if rest.numel():
        out[rest] = _sorted_top_k_top_p(logits[rest], k[rest], top_p[rest])
    return out


def _sorted_top_k_top_p(logits: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k and top-p over each row's whole sorted vocabulary: the rows whose nucleus is not
    among their NUCLEUS_CANDIDATES most likely tokens (nearly flat distributions)."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1)  # ascending
    kth = sorted_logits.gather(1, (vocab - k).unsqueeze(1))
    sorted_logits.masked_fill_(sorted_logits < kth, _NEG_INF)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    # Drop the smallest tokens whose total stays within 1 - p; the largest always survives.
    drop = cum <= (1.0 - top_p).unsqueeze(1)
    drop[:, -1] = False
    sorted_logits.masked_fill_(drop, _NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def compute_logprobs(
    logits: torch.Tensor, chosen: torch.Tensor, num_alternatives: Seq[int | None]
) -> list[TokenLogprobs | None]:
    """Logprob and rank of each row's chosen token, plus its top-N alternatives (raw model
    distribution, before any sampling parameter)."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen_lp = logprobs.gather(1, chosen.unsqueeze(1))
    ranks = (logprobs > chosen_lp).sum(dim=-1).add_(1).tolist()
    chosen_lp_list = chosen_lp.squeeze(1).tolist()
    chosen_list = chosen.tolist()
    k = max((n or 0) for n in num_alternatives)
    if k:
        top_lp, top_ids = logprobs.topk(k, dim=-1)
        top_lp_list, top_ids_list = top_lp.tolist(), top_ids.tolist()
    out: list[TokenLogprobs | None] = []
    for i, n in enumerate(num_alternatives):
        if n is None:
            out.append(None)
            continue
        ids = [chosen_list[i]] + (top_ids_list[i][:n] if n else [])
        lps = [chosen_lp_list[i]] + (top_lp_list[i][:n] if n else [])
        out.append(TokenLogprobs(token_ids=ids, logprobs=lps, rank=ranks[i]))
    return out
