"""The model runner: one scheduled batch in, one sampled token per finished chunk out.

What it owns: the loaded transformers model, the paged KV cache tensors (one `k_cache` and
`v_cache` per attention layer, hung on the layer's attention module), and the step's input
tensors. A step packs every scheduled token of every sequence into one row, runs the model's
decoder for hidden states, takes only the rows that are sampled (and the prompt rows of requests
that asked for prompt logprobs) through the LM head, and samples. With a `single_token_dtype`,
each step first selects the model's weight set (`weight_sets`): the lower-precision one for a
step of one token. A constrained batch brings its `StepMasks` (filled in a thread while the
decoder runs), applied to the sampled rows' logits before the sampler sees them; a sequence
with drafts samples a row per draft too (`Sequence.num_sample_rows`).

Invariant: the input tensors are built with numpy over the whole batch (no per-token Python);
per-sequence Python is limited to reading each sequence's new tokens and block table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from trio_llm.engine import llama, row_tiles
from trio_llm.engine.attention import AttentionMetadata, StepLayout, metadata_type
from trio_llm.engine.attention.interface import as_tensor
from trio_llm.engine.llama import LlamaForward
from trio_llm.engine.sampler import Sampler, SamplingTensors, compute_logprobs
from trio_llm.engine.scheduler import ScheduledBatch
from trio_llm.engine.sequence import Sequence
from trio_llm.engine.structured import StepMasks, apply_bitmask
from trio_llm.engine.weight_sets import WeightSets
from trio_llm.ipc.messages import TokenLogprobs

log = logging.getLogger(__name__)


@dataclass(slots=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem


@dataclass(slots=True)
class StepResult:
    token_ids: list[int | None]
    """The sampled token per scheduled sequence; None for a prefill chunk short of the end."""
    logprobs: list[TokenLogprobs | None] | None
    """Per scheduled sequence, when any asked."""
    prompt_logprobs: dict[int, list[TokenLogprobs]]
    """Batch index -> logprobs of the prompt positions this chunk predicted."""
    draft_token_ids: dict[int, list[int]] = field(default_factory=dict)
    """Batch index -> the samples of a sequence's draft rows, in order."""
    draft_logprobs: dict[int, list[TokenLogprobs | None]] = field(default_factory=dict)


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor
    """[1, T]: every scheduled token, decodes first."""
    positions: torch.Tensor
    attn: AttentionMetadata
    sample_index: np.ndarray
    """Batch index of each sample row (`Sequence.num_sample_rows`: a sequence's draft rows,
    then its last row)."""
    sample_rows: torch.Tensor
    """The sample rows' positions in the packed batch."""
    prompt_rows: dict[int, np.ndarray]
    """Batch index -> rows whose logits score prompt tokens (prompt logprobs)."""


def kv_cache_spec(model: torch.nn.Module, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return KVCacheSpec(
        num_layers=config.num_hidden_layers,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        spec: KVCacheSpec,
        num_blocks: int,
        *,
        device: torch.device,
        backend: str,
        seed: int,
        max_model_len: int,
        model_impl: str = "auto",
        batch_invariant: str = "auto",
        single_token_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.decoder = model.model
        self.own: LlamaForward | None = None
        """The engine's own forward, when it covers this model (and was not turned off)."""
        self.spec = spec
        self.block_size = spec.block_size
        self.device = device
        self.row_tile = 0
        """Rows per matmul call when batch invariance is on (0: off)."""
        if model_impl == "auto" and single_token_dtype is None and llama.supports(model):
            self.own = LlamaForward(model, max_model_len, F.linear)
            self.own.linear = self._invariant_linear(batch_invariant, self.own.weight_shapes())
            # Its fused weights replace the layers' own: free them rather than hold both.
            self.decoder.layers = torch.nn.ModuleList()
        self._attention = metadata_type(backend)
        self.vocab_size = model.config.vocab_size
        self.sampler = Sampler(seed, device)
        shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        # Zeros, not empty: a masked-out position still multiplies its value by a zero weight,
        # and uninitialized memory may hold NaN. On CPU zeroed pages cost nothing until touched.
        self.k_caches = [
            torch.zeros(shape, dtype=spec.dtype, device=device) for _ in range(spec.num_layers)
        ]
        self.v_caches = [
            torch.zeros(shape, dtype=spec.dtype, device=device) for _ in range(spec.num_layers)
        ]
        for layer, k, v in zip(self.decoder.layers, self.k_caches, self.v_caches):
            layer.self_attn.k_cache = k
            layer.self_attn.v_cache = v
        self.weight_sets: WeightSets | None = None
        """The Linear layers in `single_token_dtype` too, selected for single-token steps."""
        if single_token_dtype is not None and single_token_dtype != spec.dtype:
            self.weight_sets = WeightSets(model, single_token_dtype)
        self.single_token_steps = 0
        """Steps run on the single-token weight copies."""

    def _invariant_linear(self, mode: str, shapes: list[tuple[int, int]]) -> row_tiles.Linear:
        """The matmul the own forward uses: in row-exact tiles unless `mode` is off (see
        row_tiles); `auto` turns invariance on only where it is free (an unpadded tile)."""
        if mode == "off":
            return F.linear
        tile = row_tiles.probe(shapes, self.spec.dtype, self.device)
        if tile:
            self.row_tile = tile
            log.info("batch invariance on: matmuls in tiles of %d rows", tile)
            return row_tiles.tiled(tile)
        if mode == "on":
            self.row_tile = row_tiles.PADDED_TILE
            log.info("batch invariance on: matmuls padded to %d rows", row_tiles.PADDED_TILE)
            return row_tiles.padded(row_tiles.PADDED_TILE)
        log.info(
            "batch invariance off: %s matmuls here are not row-exact in any unpadded tile, and "
            "padded tiles would slow a lone stream 2-3x (--batch-invariant on forces them)",
            str(self.spec.dtype).removeprefix("torch."),
        )
        return F.linear

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of `hidden` rows, through the selected weight set's LM head."""
        if self.own is not None:
            return self.own.logits(hidden)
        return self.model.lm_head(hidden)

    @torch.inference_mode()
    def execute(
        self,
        batch: ScheduledBatch,
        eos_token_ids: frozenset[int],
        masks: StepMasks | None = None,
    ) -> StepResult:
        inputs = self.prepare(batch)
        if self.weight_sets is not None:
            single_token = inputs.input_ids.shape[1] == 1
            self.weight_sets.select(low_precision=single_token)
            self.single_token_steps += single_token
        if self.own is not None:
            hidden = self.own(
                inputs.input_ids[0], inputs.positions[0], inputs.attn, self.k_caches, self.v_caches
            )
        else:
            hidden = self.decoder(
                input_ids=inputs.input_ids,
                position_ids=inputs.positions,
                use_cache=False,
                trio_attn=inputs.attn,
            ).last_hidden_state[0]
        return self.sample(batch.seqs, inputs, hidden, eos_token_ids, masks)

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        """The packed row's tensors, from numpy over the whole batch."""
        seqs = batch.seqs
        num_tokens = np.asarray(batch.num_tokens, dtype=np.int64)
        starts = np.fromiter((s.num_computed_tokens for s in seqs), np.int64, len(seqs))
        ends = starts + num_tokens
        cu = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(num_tokens, out=cu[1:])

        ids: list[int] = []
        for s, a, b in zip(seqs, starts.tolist(), ends.tolist()):
            ids.extend(s.tokens_between(a, b))
        row_seq = np.repeat(np.arange(len(seqs)), num_tokens)
        positions = np.arange(int(cu[-1]), dtype=np.int64) - cu[row_seq] + starts[row_seq]
        tables = self._block_tables(seqs)
        bs = self.block_size
        slots = tables[row_seq, positions // bs] * bs + positions % bs

        # Rows that go through the LM head: a sequence whose chunk reaches its last token
        # samples from its last row (and from one row per draft before it); prompt-logprob
        # requests also score their prompt rows.
        counts = np.fromiter(
            (s.num_sample_rows(n) for s, n in zip(seqs, batch.num_tokens)), np.int64, len(seqs)
        )
        sample_index = np.repeat(np.arange(len(seqs)), counts)
        # Each sampling sequence's rows end at its chunk's last row.
        row_ends = np.cumsum(counts)
        sample_rows = cu[1:][sample_index] - (row_ends[sample_index] - np.arange(len(sample_index)))
        prompt_rows: dict[int, np.ndarray] = {}
        for i, s in enumerate(seqs):
            if s.prompt_logprobs is None:
                continue
            # Position p's row predicts token p + 1. Positions already scored (before a
            # preemption made this sequence recompute) are not scored again.
            first = max(int(starts[i]), len(s.prompt_logprobs) - 1)
            last = min(int(ends[i]), s.num_prompt_tokens - 1)
            if first < last:
                offset = cu[i] - starts[i]
                prompt_rows[i] = np.arange(offset + first, offset + last)

        device = self.device
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.long, device=device).unsqueeze(0),
            positions=as_tensor(positions, device).unsqueeze(0),
            attn=self._attention.build(
                StepLayout(
                    num_decodes=batch.num_decodes,
                    block_tables=tables,
                    cu_seqlens_q=cu,
                    context_lens=ends,
                    slot_mapping=slots,
                    key_bucket=row_tiles.KEY_BUCKET if self.row_tile else 0,
                ),
                self.k_caches[0],
            ),
            sample_index=sample_index,
            sample_rows=as_tensor(sample_rows, device),
            prompt_rows=prompt_rows,
        )

    def sample(
        self,
        seqs: list[Sequence],
        inputs: StepInputs,
        hidden: torch.Tensor,
        eos_token_ids: frozenset[int],
        masks: StepMasks | None = None,
    ) -> StepResult:
        sampled: list[int | None] = [None] * len(seqs)
        logprobs: list[TokenLogprobs | None] | None = None
        drafts: dict[int, list[int]] = {}
        draft_lps: dict[int, list[TokenLogprobs | None]] = {}
        index = inputs.sample_index.tolist()
        if index:
            logits = self.lm_head(hidden.index_select(0, inputs.sample_rows))
            if masks is not None:
                logits = logits.float()
                apply_bitmask(logits, masks)
            sample_seqs = [seqs[i] for i in index]
            st = SamplingTensors.build(sample_seqs, eos_token_ids, self.vocab_size, self.device)
            out = self.sampler(logits, st)
            lps = out.logprobs
            if lps is not None:
                logprobs = [None] * len(seqs)
            # A sequence's rows are consecutive, its last row last: the rows before are drafts'.
            for r, (i, token) in enumerate(zip(index, out.token_ids)):
                last = r + 1 == len(index) or index[r + 1] != i
                if last:
                    sampled[i] = token
                    if logprobs is not None:
                        assert lps is not None
                        logprobs[i] = lps[r]
                else:
                    drafts.setdefault(i, []).append(token)
                    if lps is not None:
                        draft_lps.setdefault(i, []).append(lps[r])
        prompt_lps = {
            i: self._prompt_logprobs(hidden, rows, seqs[i])
            for i, rows in inputs.prompt_rows.items()
        }
        return StepResult(sampled, logprobs, prompt_lps, drafts, draft_lps)

    def _prompt_logprobs(
        self, hidden: torch.Tensor, rows: np.ndarray, seq: Sequence
    ) -> list[TokenLogprobs]:
        """Scores of the prompt tokens after the ones `seq.prompt_logprobs` already holds."""
        logits = self.lm_head(hidden.index_select(0, torch.from_numpy(rows).to(self.device)))
        assert seq.prompt_logprobs is not None
        first = len(seq.prompt_logprobs)
        targets = seq.token_ids[first : first + len(rows)]
        chosen = torch.tensor(targets, dtype=torch.long, device=self.device)
        k = seq.params.prompt_logprobs
        lps = compute_logprobs(logits, chosen, [k] * len(rows))
        return [lp for lp in lps if lp is not None]

    def _block_tables(self, seqs: list[Sequence]) -> np.ndarray:
        width = max(len(s.block_table) for s in seqs)
        tables = np.zeros((len(seqs), width), dtype=np.int64)
        for i, s in enumerate(seqs):
            tables[i, : len(s.block_table)] = s.block_table
        return tables
