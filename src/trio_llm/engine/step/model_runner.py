"""The model runner: one scheduled batch in, one sampled token per finished chunk out.

What it owns: the loaded transformers model, the paged KV cache tensors (one `k_cache` and
`v_cache` per attention layer, hung on the layer's attention module), and the step's input
tensors. A step packs every scheduled token of every sequence into one row, runs the model's
decoder for hidden states, takes only the rows that are sampled (and the prompt rows of requests
that asked for prompt logprobs) through the LM head, and samples. With a `single_token_dtype`,
each step first selects the model's weight set (`weight_sets`): the lower-precision one for a
step of one token. A constrained batch brings its `StepMasks` (filled in a thread while the
decoder runs), applied to the sampled rows' logits before the sampler sees them; a sequence
with drafts samples a row per draft too (`Sequence.num_sample_rows`). With LoRA on (`lora`),
each step's rows are grouped by their sequence's adapter slot once (`LoraBatch`), and the
forward adds the adapters' updates after its projections (engine/lora/).

Invariant: the input tensors are numpy gathers over the persistent input batch (`input_batch`):
no per-token Python, and per-sequence Python is limited to noticing what each sequence appended
since the last step (its sampled token, a new block).

Why over 400 lines: construction picks the forward once (own or generic, quantized or not,
invariant or not, with LoRA stacks, weight sets and graphs), and a step builds and consumes its
tensors in order (inputs, masks, LoRA grouping, sampling rows); each piece that stands alone
lives in its own module (input_batch, kv_cache, sampler, cuda_graphs, models/weight_sets,
lora), and what is left is their sequence.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from trio_llm.engine import quant
from trio_llm.engine.attention import AttentionMetadata, StepLayout, metadata_type
from trio_llm.engine.attention.triton_backend import TritonAttentionMetadata
from trio_llm.engine.hf import decoder_of, text_config
from trio_llm.engine.lora import LoraBatch, LoraHook, LoraStacks, fused_targets, wrap_linears
from trio_llm.engine.models import dense_copies, forwards, gguf_modules, llama, vision
from trio_llm.engine.models import quantized as quantization_plan
from trio_llm.engine.models.attention_layers import AttentionLayer
from trio_llm.engine.models.generic import GenericForward
from trio_llm.engine.models.llama import LlamaForward
from trio_llm.engine.models.weight_sets import WeightSets
from trio_llm.engine.ops import paged_amx, paged_decode, row_exact
from trio_llm.engine.ops.machine_record import MachineRecord
from trio_llm.engine.plans import invariance, invariant_modules
from trio_llm.engine.step.cuda_graphs import MAX_CAPTURE_SIZE, DecodeGraphs, capture_sizes
from trio_llm.engine.step.images import image_rows
from trio_llm.engine.step.input_batch import InputBatch, SamplingColumns, Staging
from trio_llm.engine.step.kv_cache import KVCacheSpec
from trio_llm.engine.step.sampler import Sampler, SamplingTensors, compute_logprobs
from trio_llm.engine.step.sequence import ScheduledBatch, Sequence
from trio_llm.engine.step.structured import StepMasks, apply_bitmask
from trio_llm.ipc.messages import TokenLogprobs
from trio_llm.model_files import UnsupportedModelError

log = logging.getLogger(__name__)


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
    sampling: SamplingColumns
    """The sampling parameters of the rows in `sample_index`."""
    lora: LoraBatch | None = None
    """The rows with a LoRA adapter, grouped by adapter (None: none has one)."""
    images: tuple[torch.Tensor, torch.Tensor] | None = None
    """(rows, features): the packed rows that are image placeholders and the tower's
    features that embed them (None: no image in this step)."""


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """Adapter slots and their rank bound (--max-loras, --max-lora-rank)."""

    max_loras: int
    max_rank: int


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        spec: KVCacheSpec,
        num_blocks: int,
        *,
        layers: list[AttentionLayer],
        device: torch.device,
        backend: str,
        seed: int,
        max_model_len: int,
        model_impl: str = "auto",
        batch_invariant: str = "auto",
        single_token_dtype: torch.dtype | None = None,
        cuda_graphs: bool = False,
        max_num_seqs: int = MAX_CAPTURE_SIZE,
        cpu_flags: frozenset[str] = frozenset(),
        lora: LoraSettings | None = None,
        weights: llama.Weights | None = None,
        quantization: str = "none",
        max_step_rows: int = invariance.STEP_ROWS,
    ) -> None:
        """`layers`: the model's attention layers as `attention_layers.inspect` found them
        (`spec` holds their cache shapes). `cuda_graphs`: capture decode-only steps (up to
        `max_num_seqs` sequences, at most MAX_CAPTURE_SIZE) where they can run from graphs: on
        CUDA, with the Triton kernels and the engine's own forward, without single-token weight
        sets. Elsewhere it is ignored (and steps with LoRA adapters run eagerly). `lora`: serve
        adapters (`self.lora`). `weights`: the own forward's weights when they do not come
        from `model` (a GGUF file's, `engine.quant`); `quantization` int8, int4 or w8a8
        quantizes the model's at start-up. Quantized weights run on the own forward only.

        `batch_invariant` (auto, on, off) with the CPU's flags decides the matmuls
        (engine/plans/invariance.py), checked on calls of up to `max_step_rows` rows (the step's
        token budget); `on` where it cannot be kept raises InvarianceUnavailable."""
        self.model = model
        self.spec = spec
        self.block_size = spec.block_size
        self.device = device
        self.choice = forwards.choose(
            model, model_impl, single_token_dtype=single_token_dtype is not None
        )
        """Which forward computes the steps, and why (`forwards`)."""
        quantized = weights is not None or quantization in quantization_plan.AT_LOAD
        modules = gguf_modules.quantized_linears(model)
        """Transformers' modules on a GGUF's quantized tensors (the generic path's)."""
        if quantized and not self.choice.own:
            raise UnsupportedModelError(
                f"quantized weights (--quantization {quantization}) run on the engine's own "
                f"forward only, and this model takes {self.choice.describe()}"
            )
        self._attention = metadata_type(backend)
        self.vocab_size = text_config(model.config).vocab_size  # type: ignore[attr-defined]
        self.staging = Staging(device)
        self.input_batch = InputBatch(spec.block_size, max_model_len)
        self.sampler = Sampler(seed, device, self._tokens_to_host)
        # Zeros, not empty: a masked-out position still multiplies its value by a zero weight,
        # and uninitialized memory may hold NaN. On CPU zeroed pages cost nothing until touched.
        shapes = [(num_blocks, spec.block_size, heads, dim) for heads, dim in spec.layers]
        self.k_caches = [torch.zeros(s, dtype=spec.dtype, device=device) for s in shapes]
        self.v_caches = [torch.zeros(s, dtype=spec.dtype, device=device) for s in shapes]
        if device.type == "cpu" and backend == "torch":
            paged_decode.prepare()  # its decodes' kernel, built now rather than in a request's step
            paged_amx.prepare()
        self._plain_attention = all(
            layer.window is None and layer.softcap is None for layer in layers
        )
        self.own: LlamaForward | None = None
        """The engine's own forward, when it computes this model (`choice`)."""
        self.forward: LlamaForward | GenericForward
        self.dense_copies: dense_copies.DenseCopies | None = None
        """Quantized weights' dense copies for calls of many rows (None: no quantized weights,
        or invariance keeps every row on the quantized kernels)."""
        if self.choice.own:
            windows = [layer.window for layer in layers]
            self.own = self.forward = LlamaForward(
                model, max_model_len, weights=weights, windows=windows
            )
            if quantization in quantization_plan.AT_LOAD:
                quantization_plan.quantize_forward(self.own, quantization)
        heads = invariance.attention_shapes(model.config, layers)
        self.invariance = invariance.decide(
            batch_invariant,
            dtype=spec.dtype,
            device=device,
            flags=cpu_flags,
            shapes=self.own.weight_shapes() if self.own else invariant_modules.linear_shapes(model),
            heads=heads,
            backend=backend,
            single_token=single_token_dtype is not None,
            model_path=None if self.own else invariant_modules.unsupported_modules(model),
            quantized=(self.own is not None and self.own.quantized) or bool(modules),
            # Where it was measured to cost little: bf16 or float32 activations, every
            # quantized matrix on the row-exact kernel (not W8A8's integer matmul), attention
            # in place.
            quantized_free=self.own is not None
            and spec.dtype in (torch.bfloat16, torch.float32)
            and not any(getattr(w, "int8_activations", False) for w in self.own.matrices())
            and device.type == "cpu"
            and row_exact.invariance_free(quant.kernel_dtype(spec.dtype))
            and backend == "torch"
            and paged_decode.serves(spec.dtype, [shape[2] for shape in heads]),
            lora=lora is not None,
            max_rows=max_step_rows,
        )
        """Whether every row is computed one way whatever shares its step, and how."""
        if self.own is not None:
            self.own.use(self.invariance.matmul)
            if self.own.quantized:
                # Quantized weights on their own kernels, row-exact for any rows; with
                # invariance off, calls of many rows (prefill chunks) dequantize instead.
                self.own.linear = quant.dispatching(self.own.linear, dense=not self.invariance.on)
                self._row_exact_kernel(self.own.matrices(), device, spec.dtype)
                if not self.invariance.on:
                    self.dense_copies = dense_copies.keep(
                        self.own.matrices(),
                        quant.kernel_dtype(spec.dtype),
                        available=dense_copies.available_memory(),
                        record=MachineRecord(),
                    )
                # The embedding and LM head live in the forward now (quantized).
                model.model.embed_tokens.to("meta")
                model.lm_head.to("meta")
        if modules:
            gguf_modules.use_dense(model, not self.invariance.on)
            self._row_exact_kernel(gguf_modules.quantized_weights(model), device, spec.dtype)
            if not self.invariance.on:
                self.dense_copies = dense_copies.keep(
                    gguf_modules.quantized_weights(model),
                    quant.kernel_dtype(spec.dtype),
                    available=dense_copies.available_memory(),
                    record=MachineRecord(),
                )
        self.lora: LoraStacks | None = None
        """Every adapter slot's weights (None: LoRA off)."""
        self._lora_hook: LoraHook | None = None
        """Where the transformers path's wrapped Linears read the step's adapter rows."""
        if lora is not None:
            if self.own is not None:
                # Read from the model's Linears (on the meta device for a GGUF file's weights:
                # shapes only). Adapters add after the base matmul, quantized or not.
                targets = fused_targets(model, self.own.lora_projections)
            else:  # before the weight sets: they swap the Linears inside the wrappers
                self._lora_hook = LoraHook()
                targets = wrap_linears(model, self._lora_hook)
            self.lora = LoraStacks(targets, lora.max_loras, lora.max_rank, spec.dtype, device)
        if self.own is not None:
            # Its fused weights replace the layers' own: free them rather than hold both.
            decoder_of(model).layers = torch.nn.ModuleList()
        else:
            if self.invariance.on:
                invariant_modules.replace_linears(model, self.invariance.matmul)
            self.forward = GenericForward(
                model, layers, self.k_caches, self.v_caches, self._lora_hook
            )
        self.vision = vision.encoder_of(model) if self.own is None else None
        """A vision-language model's tower and projector (None: a text model)."""
        self.weight_sets: WeightSets | None = None
        """The Linear layers in `single_token_dtype` too, selected for single-token steps."""
        if single_token_dtype is not None and single_token_dtype != spec.dtype:
            self.weight_sets = WeightSets(model, single_token_dtype)
        self.single_token_steps = 0
        """Steps run on the single-token weight copies."""
        self.graphs: DecodeGraphs | None = None
        if (
            cuda_graphs
            and device.type == "cuda"
            and backend == "triton"
            and self.own is not None
            and self.weight_sets is None
        ):
            self.graphs = DecodeGraphs(
                capture_sizes(max_num_seqs), self.input_batch.max_blocks, device
            )
            with torch.inference_mode():  # as every step runs
                self.graphs.capture(self._logits_of_decodes)

    def _row_exact_kernel(
        self, weights: Iterable[object], device: torch.device, dtype: torch.dtype
    ) -> None:
        """Give quantized `weights` a row-exact kernel's packing (ops/row_exact.py): for every
        row with invariance on; without invariance, for the calls below the dense copies'
        crossover, where the kernel beats torch's from one row on. Called before the copies'
        crossovers are timed, which then time this kernel."""
        packing = row_exact.kernel(self.invariance.on, quant.kernel_dtype(dtype))
        if packing is None or device.type != "cpu":
            return
        for weight in weights:
            if quant.is_quantized(weight):
                weight.keep_exact(packing)  # type: ignore[union-attr]
                if not self.invariance.on and isinstance(weight, quant.Int8Weight):
                    weight.keep_few_rows(packing)
        log.info("quantized weights on %s", packing.describe())

    def _logits_of_decodes(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata
    ) -> torch.Tensor:
        """What a decode graph captures: the own forward and the LM head over every row."""
        assert self.own is not None
        return self.own.logits(self.own(input_ids, positions, attn, self.k_caches, self.v_caches))

    def _tokens_to_host(self, tokens: torch.Tensor) -> list[int]:
        """The step's sampled tokens: one non-blocking copy into pinned memory, one sync."""
        return self.staging.to_host("sampled", tokens).tolist()

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of `hidden` rows, through the selected weight set's LM head (and whatever the
        model does to its logits after it)."""
        return self.forward.logits(hidden)

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
        rows = inputs.input_ids.shape[1]
        if (
            self.graphs is not None
            and inputs.lora is None
            and not inputs.prompt_rows
            and self.graphs.fits(rows, batch.num_decodes)
        ):
            assert isinstance(inputs.attn, TritonAttentionMetadata)
            logits = self.graphs.run(inputs.input_ids[0], inputs.positions[0], inputs.attn)
            return self.sample(batch.seqs, inputs, None, eos_token_ids, masks, logits)
        args = (inputs.input_ids[0], inputs.positions[0], inputs.attn, self.k_caches)
        if inputs.images is None:
            hidden = self.forward(*args, self.v_caches, inputs.lora)
        else:  # only the generic path embeds images (`vision`)
            assert isinstance(self.forward, GenericForward)
            hidden = self.forward(*args, self.v_caches, inputs.lora, inputs.images)
        return self.sample(batch.seqs, inputs, hidden, eos_token_ids, masks)

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        """The packed row's tensors, gathered from the persistent input batch."""
        seqs = batch.seqs
        ib = self.input_batch
        ib.remove(batch.removed)
        rows = ib.sync(seqs)
        num_tokens = np.asarray(batch.num_tokens, dtype=np.int64)
        starts = np.fromiter((s.num_computed_tokens for s in seqs), np.int64, len(seqs))
        ends = starts + num_tokens
        cu = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(num_tokens, out=cu[1:])

        if batch.num_decodes == len(seqs):  # one token each: no repeat, no offsets
            row_seq = np.arange(len(seqs))
            positions = starts
        else:
            row_seq = np.repeat(np.arange(len(seqs)), num_tokens)
            positions = np.arange(int(cu[-1]), dtype=np.int64) - cu[row_seq] + starts[row_seq]
        # The rows hold committed tokens only: the few chunks that compute drafts (past their
        # row's tokens) read those from their sequence.
        held = ib.num_tokens[rows]
        ids = ib.token_ids[rows[row_seq], np.minimum(positions, ib.token_ids.shape[1] - 1)]
        for i in np.flatnonzero(ends > held).tolist():
            first, end = max(int(starts[i]), int(held[i])), int(ends[i])
            offset = int(cu[i] - starts[i])
            ids[offset + first : offset + end] = seqs[i].tokens_between(first, end)
        tables = ib.tables(rows)
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
        for i in ib.prompt_logprobs[rows].nonzero()[0].tolist():
            s = seqs[i]
            assert s.prompt_logprobs is not None
            # Position p's row predicts token p + 1. Positions already scored (before a
            # preemption made this sequence recompute) are not scored again.
            first = max(int(starts[i]), len(s.prompt_logprobs) - 1)
            last = min(int(ends[i]), s.num_prompt_tokens - 1)
            if first < last:
                offset = cu[i] - starts[i]
                prompt_rows[i] = np.arange(offset + first, offset + last)

        stage = self.staging.to_device
        lora = None
        if self.lora is not None:
            adapters = np.fromiter((s.lora_slot for s in seqs), np.int64, len(seqs))
            if adapters.max(initial=-1) >= 0:
                lora = LoraBatch.build(adapters[row_seq], self.lora, stage)
        images = None
        if self.vision is not None and any(s.images for s in seqs):
            images = image_rows(
                [s.images for s in seqs], starts, ends, cu, self.vision.encode, self.device
            )
        return StepInputs(
            input_ids=stage("input_ids", ids).unsqueeze(0),
            positions=stage("positions", positions).unsqueeze(0),
            attn=self._attention.build(
                StepLayout(
                    num_decodes=batch.num_decodes,
                    block_tables=tables,
                    cu_seqlens_q=cu,
                    context_lens=ends,
                    slot_mapping=slots,
                    key_bucket=invariance.KEY_BUCKET if self.invariance.on else 0,
                    plain_attention=self._plain_attention,
                ),
                self.k_caches[0],
                stage,
            ),
            sample_index=sample_index,
            sample_rows=stage("sample_rows", sample_rows),
            prompt_rows=prompt_rows,
            sampling=ib.sampling(rows[sample_index]),
            lora=lora,
            images=images,
        )

    def sample(
        self,
        seqs: list[Sequence],
        inputs: StepInputs,
        hidden: torch.Tensor | None,
        eos_token_ids: frozenset[int],
        masks: StepMasks | None = None,
        logits: torch.Tensor | None = None,
    ) -> StepResult:
        """From `hidden` (every packed row), or from `logits` of the sampled rows already
        computed (a decode graph's; such a step scores no prompt rows)."""
        sampled: list[int | None] = [None] * len(seqs)
        logprobs: list[TokenLogprobs | None] | None = None
        drafts: dict[int, list[int]] = {}
        draft_lps: dict[int, list[TokenLogprobs | None]] = {}
        index = inputs.sample_index.tolist()
        if index:
            if logits is None:
                assert hidden is not None
                logits = self.lm_head(hidden.index_select(0, inputs.sample_rows))
            if masks is not None:
                logits = logits.float()
                apply_bitmask(logits, masks)
            sample_seqs = [seqs[i] for i in index]
            # Each row's place among its sequence's rows: its draft rows' samples come first.
            first = np.searchsorted(inputs.sample_index, inputs.sample_index)
            st = SamplingTensors.build(
                sample_seqs,
                eos_token_ids,
                self.vocab_size,
                self.device,
                inputs.sampling,
                draft_offsets=np.arange(len(index)) - first,
            )
            out = self.sampler(logits, st, masked=masks is not None)
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
        prompt_lps: dict[int, list[TokenLogprobs]] = {}
        if inputs.prompt_rows:
            assert hidden is not None
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
