"""EngineCore: the engine's synchronous heart, usable in-process (tests, benchmarks) and inside
the engine process.

What it owns: the request table (request id -> live sequence), request validation, and the step
loop body: schedule, run the model, update the sequences, and turn what happened into one
`EngineCoreOutputs`.

A request with a constraint waits until its grammar has compiled in the structured-output
worker thread (`engine/structured.py`); the others keep stepping, and the process loop sleeps
no longer than `idle_timeout()` while one compiles, so it sees the grammar soon after.

Invariants: nothing a request carries can raise out of `add_request` or `step`: a request the
engine cannot serve (bad parameters, a prompt too long for the context, a duplicate id, a
grammar that does not compile) finishes with an 'error' output at the next step, and the others
continue. Every request that
enters gets exactly one output with a finish reason; after that its id is forgotten and its
blocks are back in the pool.

Why over 400 lines: the engine's assembly (model load, dtype probe, KV sizing, the pooling
parts) still lives here beside the step loop; moving it to its own module waits until the work
on the model runner, weights and LoRA that changes it has landed.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import torch

from trio_llm import model_files
from trio_llm.config import EngineArgs
from trio_llm.engine import (
    dtype_policy,
    generic,
    invariance,
    loader,
    pooling,
    quant,
    speculative,
)
from trio_llm.engine.attention import resolve_backend
from trio_llm.engine.block_manager import BlockManager, salt_root
from trio_llm.engine.classifier import classifier_head
from trio_llm.engine.kv_events import KVEventPublisher
from trio_llm.engine.lora import LoraLoadError, LoraNotFoundError, LoraRegistry, adapter_root
from trio_llm.engine.model_runner import LoraSettings, ModelRunner, StepResult, kv_cache_spec
from trio_llm.engine.pooling_runner import PoolingRunner
from trio_llm.engine.quant import gguf_model
from trio_llm.engine.scheduler import Scheduler
from trio_llm.engine.sequence import ScheduledBatch, Sequence
from trio_llm.engine.structured import StructuredOutputs
from trio_llm.engine.token_bans import TokenBans
from trio_llm.grammar import Grammar
from trio_llm.ipc.messages import (
    AudioChunk,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineReady,
    LoadLora,
    LoraUpdated,
    SchedulerStats,
    TranscriptionRequest,
    UnloadLora,
)
from trio_llm.tasks import TASK_WORDS, is_pooling

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger(__name__)


class EngineConfigError(ValueError):
    """The engine arguments cannot work with this model (for example, a KV budget smaller than
    one block)."""


class RequestError(ValueError):
    """A request the engine cannot serve; it finishes with an 'error' output."""


GRAMMAR_POLL_SECONDS = 0.002
"""How long the idle loop sleeps on the request ring while a grammar compiles (a compile takes
about a millisecond; the ring's doorbell cannot tell the loop that one has finished)."""
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(slots=True)
class _Parts:
    """What differs between a generating and a pooling engine."""

    runner: ModelRunner | PoolingRunner
    dtype: torch.dtype
    num_blocks: int
    kv_cache_bytes: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    attention_backend: str
    embedding_size: int = 0
    normalized: bool = False
    matryoshka_dimensions: list[int] | None = None
    labels: list[str] | None = None


class EngineCore:
    def __init__(self, args: EngineArgs, on_stage: Callable[[str], None] | None = None) -> None:
        """`on_stage` hears the start-up stages as they begin (the process sends them on as
        EngineLoading progress)."""
        stage = on_stage or (lambda _: None)
        if args.batch_invariant != "off":
            # fp32 attention keeps invariance only in MKL's reproducibility mode, which MKL
            # takes before its first call alone (engine/invariance.py).
            invariance.enable_reproducible_mkl()
        if args.num_threads:
            torch.set_num_threads(args.num_threads)
        stage("resolving the model")
        source = model_files.resolve_model(args.model)
        device = loader.resolve_device(args.device)
        dtype = loader.resolve_dtype(args.dtype, device)
        config = loader.load_config(source)
        self.task = loader.resolve_task(args.task, source, config)
        self.pooling = is_pooling(self.task)
        self.args = args
        self.device = torch.device(device)
        self.vocab_size = int(config.vocab_size)
        self.eos_token_ids = frozenset(loader.eos_token_ids(source, config))
        if args.lora:
            _check_lora_args(args, self.task)
        stage("loading the weights")
        if self.pooling:
            parts = self._pooling_parts(source, config, dtype, device)
        else:
            parts = self._generation_parts(source, config, dtype, device, stage)
        self.max_model_len = parts.max_model_len
        if args.scheduling_policy not in SCHEDULING_POLICIES:
            raise EngineConfigError(
                f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                f"got {args.scheduling_policy!r}"
            )
        prefix_caching = args.enable_prefix_caching and not self.pooling
        self.kv_events: KVEventPublisher | None = None
        if args.kv_events_endpoint is not None and prefix_caching:
            self.kv_events = KVEventPublisher(
                args.kv_events_endpoint,
                topic=args.kv_events_topic,
                block_size=args.block_size,
                medium="GPU" if device.startswith("cuda") else None,
                rank=args.data_parallel_rank,
            )
        self.block_manager = BlockManager(
            parts.num_blocks, args.block_size, prefix_caching, self.kv_events
        )
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=parts.max_num_seqs,
            max_num_batched_tokens=parts.max_num_batched_tokens,
            eos_token_ids=self.eos_token_ids,
            max_model_len=parts.max_model_len,
            chunked_prefill=not self.pooling,
        )
        self.runner = parts.runner
        self.loras = self._load_loras(parts.runner)
        """The adapters served (None: LoRA off)."""
        self._ngram = speculative.resolve_mode(
            args.ngram_speculation,
            quantized=isinstance(self.runner, ModelRunner)
            and self.runner.own is not None
            and self.runner.own.quantized,
        )
        self.structured = StructuredOutputs(
            lambda: model_files.load_tokenizer(source),
            self.vocab_size,
            self.eos_token_ids,
            jump_forward=args.jump_forward,
        )
        self._compiling: dict[str, tuple[Sequence, Future[Grammar]]] = {}
        """Requests whose grammar is compiling."""
        self.requests: dict[str, Sequence] = {}
        self._arrivals = itertools.count()
        self._pending: list[EngineCoreOutput] = []
        """Outputs decided outside a step (errors at add, aborts), sent with the next step."""
        self.ready = EngineReady(
            model=args.served_model_name or source.name,
            max_model_len=parts.max_model_len,
            vocab_size=self.vocab_size,
            eos_token_ids=sorted(self.eos_token_ids),
            dtype=str(parts.dtype).removeprefix("torch."),
            device=device,
            block_size=args.block_size,
            num_blocks=parts.num_blocks,
            kv_capacity_tokens=parts.num_blocks * args.block_size,
            kv_cache_bytes=parts.kv_cache_bytes,
            attention_backend=parts.attention_backend,
            pid=os.getpid(),
            task=self.task,
            embedding_size=parts.embedding_size,
            normalized=parts.normalized,
            matryoshka_dimensions=parts.matryoshka_dimensions,
            labels=parts.labels,
            priority_scheduling=args.scheduling_policy == "priority",
        )

    def _generation_parts(
        self,
        source: model_files.ModelSource,
        config: PretrainedConfig,
        dtype: torch.dtype,
        device: str,
        stage: Callable[[str], None],
    ) -> _Parts:
        args = self.args
        backend = resolve_backend(args.attention_backend, device)
        how, gguf = quant.plan(args.quantization, source, config, device, args.model_impl)
        weights = None
        if how != "none":
            dtype = quant.activation_dtype(args.dtype)
        # Where the CPU could run bf16 fast, auto measures which dtype this model is faster in.
        measure = (
            how == "none" and args.dtype == "auto" and device == "cpu" and dtype is torch.bfloat16
        )
        generic.check_class(config, source.name)
        if gguf is not None:
            model = quant.meta_model(source, dtype)
            weights = gguf_model.load_weights(gguf, model.config, dtype)
        else:
            model = loader.load_model(source, torch.float32 if measure else dtype, device)
        if measure:
            dtype = dtype_policy.choose_cpu_dtype(_probe_weights(model), loader.cpu_flags())
            if dtype is not torch.float32:
                model.to(dtype)
        layers = generic.inspect(model, source.name)
        spec = kv_cache_spec(layers, args.block_size, dtype)
        kv_bytes = args.kv_cache_bytes(device, loader.free_device_memory(device))
        num_blocks = kv_bytes // spec.bytes_per_block
        if num_blocks < 1:
            raise EngineConfigError(
                f"kv_cache_memory {args.kv_cache_memory} ({kv_bytes} bytes) holds no block of "
                f"{spec.bytes_per_block} bytes; give at least that"
            )
        budget = args.step_token_budget(device)
        # More running sequences than tokens per step would leave some never decoding.
        max_num_seqs = min(args.max_num_seqs, budget)
        max_model_len = _max_model_len(args, config, num_blocks * args.block_size)
        backend, why = generic.attention_backend(
            layers, backend, args.attention_backend, max_model_len
        )
        if why:
            stage(f"attention: {why}")
        stage("allocating the KV cache")
        try:
            runner = ModelRunner(
                model,
                spec,
                num_blocks,
                layers=layers,
                device=self.device,
                backend=backend,
                seed=args.seed,
                max_model_len=max_model_len,
                model_impl=args.model_impl,
                batch_invariant=args.batch_invariant,
                single_token_dtype=(
                    None
                    if args.single_token_dtype == "none"
                    else loader.resolve_dtype(args.single_token_dtype, device)
                ),
                cuda_graphs=not args.enforce_eager,
                max_num_seqs=max_num_seqs,
                cpu_flags=loader.cpu_flags(),
                lora=LoraSettings(args.max_loras, args.max_lora_rank) if args.lora else None,
                weights=weights,
                quantization=how,
            )
        except invariance.InvarianceUnavailable as exc:
            raise EngineConfigError(str(exc)) from None
        stage(f"forward: {runner.choice.describe()}")
        stage(f"batch invariance {runner.invariance.describe()}")
        return _Parts(
            runner=runner,
            dtype=dtype,
            num_blocks=num_blocks,
            kv_cache_bytes=num_blocks * spec.bytes_per_block,
            max_model_len=max_model_len,
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            attention_backend=backend,
        )

    def _pooling_parts(
        self,
        source: model_files.ModelSource,
        config: PretrainedConfig,
        dtype: torch.dtype,
        device: str,
    ) -> _Parts:
        """No KV cache: the block manager only does the scheduler's bookkeeping, with blocks
        for one step's tokens; a step holds whole prompts, so it holds at least the longest,
        and as many inputs as its tokens allow (each finishes within its step). A
        classifier's sentence-transformers files say nothing the engine uses but the length
        (its head pools by itself)."""
        args = self.args
        classifies = self.task in ("score", "classify")
        if classifies:
            pooling_config = pooling.PoolingConfig(
                "cls", normalize=False, max_seq_length=pooling.max_seq_length(source.path)
            )
        else:
            pooling_config = pooling.pooling_config(
                source.path, is_encoder=loader.is_encoder(config)
            )
        model = loader.load_model(source, dtype, device, task=self.task)
        head = classifier_head(model) if classifies else None
        offset = loader.position_offset(config)
        positions = int(config.max_position_embeddings) - offset
        limit = min(args.max_model_len or pooling_config.max_seq_length or positions, positions)
        max_model_len = _max_model_len(
            msgspec.structs.replace(args, max_model_len=limit), config, positions
        )
        budget = max(args.max_num_pooled_tokens, max_model_len)
        num_blocks = -(-budget // args.block_size) + budget  # a partial block per input
        runner = PoolingRunner(
            model, pooling_config, self.device, head=head, position_offset=offset
        )
        return _Parts(
            runner=runner,
            dtype=dtype,
            num_blocks=num_blocks,
            kv_cache_bytes=0,
            max_model_len=max_model_len,
            max_num_batched_tokens=budget,
            max_num_seqs=budget,
            attention_backend="packed",
            embedding_size=runner.output_size,
            normalized=pooling_config.normalize and head is None,
            matryoshka_dimensions=None if classifies else _matryoshka(config),
            labels=head.labels if head is not None else None,
        )

    def _load_loras(self, runner: ModelRunner | PoolingRunner) -> LoraRegistry | None:
        """The registry of adapters, with those of `lora_modules` loaded (a start error names
        the one that cannot be)."""
        args = self.args
        if not args.lora or self.pooling:
            return None
        assert isinstance(runner, ModelRunner) and runner.lora is not None
        registry = LoraRegistry(runner.lora)
        for name, path in args.lora_modules.items():
            try:
                registry.load(name, path)
            except LoraLoadError as error:
                raise EngineConfigError(f"LoRA adapter {name!r}: {error}") from None
        log.info(
            "LoRA: %d slots of rank %d (%.0f MiB)%s",
            args.max_loras,
            args.max_lora_rank,
            runner.lora.nbytes / 2**20,
            f", serving {', '.join(registry.names())}" if args.lora_modules else "",
        )
        return registry

    def update_lora(self, message: LoadLora | UnloadLora) -> LoraUpdated:
        """Load or unload an adapter; the answer says why not, when not. An unloaded adapter's
        requests in flight finish on it."""
        done = LoraUpdated(update_id=message.update_id)
        if self.loras is None:
            done.error = "LoRA adapters are not enabled on this engine (enable_lora)"
            return done
        try:
            if isinstance(message, LoadLora):
                in_use = (seq.lora_slot for seq in self.requests.values())
                self.loras.load(message.name, message.path, in_use)
            else:
                self.loras.unload(message.name)
        except LoraNotFoundError as error:
            done.error, done.not_found = str(error), True
        except LoraLoadError as error:
            done.error = str(error)
        return done

    # -- requests -------------------------------------------------------------------------

    def add_request(self, req: EngineCoreRequest | TranscriptionRequest | AudioChunk) -> None:
        if isinstance(req, AudioChunk):
            return  # its TranscriptionRequest was refused below
        if isinstance(req, TranscriptionRequest):
            self.reject(req.request_id, "this engine serves text models: it does not transcribe")
            return
        try:
            seq = self._new_sequence(req)
        except Exception as exc:  # whatever is wrong with it, it fails alone
            self._pending.append(
                EngineCoreOutput(
                    request_id=req.request_id,
                    finish_reason="error",
                    error=str(exc) or type(exc).__name__,
                )
            )
            return
        self.requests[req.request_id] = seq
        self.scheduler.add(seq)
        constraint = req.sampling_params.constraint
        if constraint is not None:
            seq.awaiting_grammar = True
            self._compiling[req.request_id] = (seq, self.structured.compile(constraint))

    def _new_sequence(self, req: EngineCoreRequest) -> Sequence:
        params = req.sampling_params
        if req.pooling != self.pooling:
            raise RequestError(
                f"this engine serves {TASK_WORDS[self.task]}, not generation"
                if self.pooling
                else "this engine serves generation, not pooled outputs"
            )
        if not self.pooling:
            params.validate()
            params.validate_vocab(self.vocab_size)
        prompt = req.prompt_token_ids
        if req.request_id in self.requests:
            raise RequestError(f"request id {req.request_id!r} is already running")
        if not prompt:
            raise RequestError("the prompt is empty")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise RequestError(f"the prompt has token ids outside [0, {self.vocab_size})")
        if self.pooling and len(prompt) > self.max_model_len:
            raise RequestError(
                f"the input has {len(prompt)} tokens, but this model takes at most "
                f"{self.max_model_len}"
            )
        if not 0 <= req.token_type_start < len(prompt):
            raise RequestError(
                f"token_type_start {req.token_type_start} is outside the prompt's "
                f"{len(prompt)} tokens"
            )
        if not self.pooling and len(prompt) >= self.max_model_len:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens, but this model's context holds "
                f"{self.max_model_len} (prompt and at least one output token)"
            )
        room = self.max_model_len - len(prompt)
        seq = Sequence(
            request_id=req.request_id,
            token_ids=list(prompt),
            params=params,
            max_tokens=room if params.max_tokens is None else min(params.max_tokens, room),
            priority=req.priority,
            arrival=next(self._arrivals),
            cache_root=salt_root(params.cache_salt),
        )
        if req.priority and self.args.scheduling_policy != "priority":
            raise RequestError(
                "priority is honoured only with scheduling_policy 'priority' "
                "(--scheduling-policy priority); this engine schedules fcfs"
            )
        if req.lora is not None:
            if self.loras is None:
                raise RequestError("LoRA adapters are not enabled on this engine")
            try:
                adapter = self.loras.lookup(req.lora)
            except LoraNotFoundError as error:
                raise RequestError(str(error)) from None
            seq.lora_slot = adapter.slot
            seq.cache_root = adapter_root(adapter.load_id, seq.cache_root)
        if self.pooling:
            seq.token_type_start = req.token_type_start
            return seq
        if params.prompt_logprobs is not None:
            seq.prompt_logprobs = [None]
        seq.bans = TokenBans.build(params, self.vocab_size, self.device)
        return seq

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            seq = self.requests.pop(request_id, None)
            if seq is None:
                continue  # finished already (its final output is on its way) or unknown
            self._forget_compile(request_id)
            self.scheduler.finish(seq, "abort")
            self._pending.append(EngineCoreOutput(request_id=request_id, finish_reason="abort"))

    def reject(self, request_id: str, message: str, *, param: str | None = None) -> None:
        """Finish a request with an 'error' output at the next step, whether it is running,
        waiting, finished or was never read; `param`: the request's parameter at fault."""
        seq = self.requests.pop(request_id, None)
        if seq is not None:
            self._forget_compile(request_id)
            self.scheduler.finish(seq, "error")
        self._pending.append(
            EngineCoreOutput(
                request_id=request_id, finish_reason="error", error=message, error_param=param
            )
        )

    # -- the loop body --------------------------------------------------------------------

    def has_work(self) -> bool:
        """Something to step now (a request whose grammar compiles is not, until it has)."""
        if self._compiling:
            self._collect_grammars()
        return self.scheduler.has_work() or bool(self._pending)

    def idle_timeout(self) -> float | None:
        """How long the process loop may sleep waiting for a message: for ever, unless a
        grammar is compiling."""
        return GRAMMAR_POLL_SECONDS if self._compiling else None

    def _collect_grammars(self) -> None:
        """Hand each compiled grammar to its request; fail those that did not compile."""
        for request_id, (seq, future) in list(self._compiling.items()):
            if not future.done():
                continue
            del self._compiling[request_id]
            try:
                seq.grammar = future.result()
            except Exception as exc:
                message = f"the constraint does not compile: {exc}"
                self.reject(request_id, message, param="constraint")
                continue
            seq.awaiting_grammar = False

    def _forget_compile(self, request_id: str) -> None:
        entry = self._compiling.pop(request_id, None)
        if entry is not None:
            entry[1].cancel()  # a compile already running finishes, and nothing reads it

    def step(self) -> EngineCoreOutputs:
        if self._compiling:
            self._collect_grammars()
        outputs, self._pending = self._pending, []
        if self.scheduler.has_work():
            batch = self.scheduler.schedule()
            if batch.seqs:
                outputs.extend(self._run(batch))
        if self.kv_events is not None:
            self.kv_events.flush()
        return EngineCoreOutputs(outputs=outputs, timestamp=time.time(), stats=self.stats())

    def _run(self, batch: ScheduledBatch) -> list[EngineCoreOutput]:
        if isinstance(self.runner, PoolingRunner):
            return self._pool(batch, self.runner)
        masks = self.structured.start_masks(batch)
        try:
            result = self.runner.execute(batch, self.eos_token_ids, masks)
        except Exception as exc:
            # A failure inside the model fails the requests of this batch, not the engine.
            log.exception("model step failed; failing its %d requests", len(batch.seqs))
            return [self._fail(seq, f"model step failed: {exc!r}") for seq in batch.seqs]
        finally:
            if masks is not None:
                masks.done.exception()  # the mask thread is done with the matchers
        for i, lps in result.prompt_logprobs.items():
            prompt_logprobs = batch.seqs[i].prompt_logprobs
            assert prompt_logprobs is not None
            prompt_logprobs.extend(lps)
        advanced = self.scheduler.update(batch, result.token_ids, result.draft_token_ids)
        alone = len(self.scheduler.running) + len(self.scheduler.waiting)
        for seq, _ in advanced:
            if seq.grammar is not None and not seq.is_finished:
                self.structured.propose_drafts(seq, self.max_model_len)
            elif speculative.wants_drafts(self._ngram, seq, alone):
                speculative.propose_drafts(seq, self.max_model_len)
        return self._outputs(batch, result, advanced)

    def _pool(self, batch: ScheduledBatch, runner: PoolingRunner) -> list[EngineCoreOutput]:
        """A pooling step: every sequence of the batch is a whole prompt, done after it."""
        try:
            embeddings = runner.execute(batch)
        except Exception as exc:
            log.exception("pooling step failed; failing its %d requests", len(batch.seqs))
            return [self._fail(seq, f"model step failed: {exc!r}") for seq in batch.seqs]
        self.scheduler.update(batch, [None] * len(batch.seqs))
        outputs = []
        for seq, embedding in zip(batch.seqs, embeddings, strict=True):
            self.scheduler.finish(seq, "stop")
            del self.requests[seq.request_id]
            outputs.append(
                EngineCoreOutput(request_id=seq.request_id, finish_reason="stop", pooled=embedding)
            )
        return outputs

    def _outputs(
        self, batch: ScheduledBatch, result: StepResult, advanced: list[tuple[Sequence, int]]
    ) -> list[EngineCoreOutput]:
        index = {id(seq): i for i, seq in enumerate(batch.seqs)} if result.logprobs else {}
        outputs = []
        for seq, num_new in advanced:
            out = EngineCoreOutput(
                request_id=seq.request_id,
                new_token_ids=seq.token_ids[len(seq.token_ids) - num_new :],
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
                error=seq.error,
                error_param=seq.error_param,
            )
            if result.logprobs is not None:
                i = index[id(seq)]
                lp = result.logprobs[i]
                if lp is not None:
                    out.new_logprobs = [*result.draft_logprobs.get(i, []), lp][:num_new]
            if not seq.sent_first_output:
                seq.sent_first_output = True
                out.num_cached_tokens = max(seq.num_cached_tokens, 0)
                out.prompt_logprobs = seq.prompt_logprobs
            if seq.finish_reason is not None:
                del self.requests[seq.request_id]
            outputs.append(out)
        return outputs

    def _fail(self, seq: Sequence, message: str) -> EngineCoreOutput:
        self.scheduler.finish(seq, "error")
        self.requests.pop(seq.request_id, None)
        return EngineCoreOutput(request_id=seq.request_id, finish_reason="error", error=message)

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()


def _check_lora_args(args: EngineArgs, task: str) -> None:
    """LoRA on a pooling engine is ignored when only enabled (a server-wide flag reaches every
    model) and refused when adapters are given for it."""
    if is_pooling(task) and args.lora_modules:
        raise EngineConfigError(
            f"LoRA adapters are served on generating models; this one serves {TASK_WORDS[task]}"
        )
    if args.max_loras < 1 or args.max_lora_rank < 1:
        raise EngineConfigError(
            f"max_loras and max_lora_rank must be at least 1, got {args.max_loras} and "
            f"{args.max_lora_rank}"
        )


def _matryoshka(config: PretrainedConfig) -> list[int] | None:
    """The sizes a Matryoshka model's embeddings may be cut to, as its config says (vLLM's
    keys); None for any other model."""
    dimensions = getattr(config, "matryoshka_dimensions", None)
    if dimensions:
        return sorted(int(d) for d in dimensions)
    return [] if getattr(config, "is_matryoshka", False) else None


def _max_model_len(args: EngineArgs, config: object, capacity: int) -> int:
    """The context limit: asked for, or the model's own, capped by what the engine can hold."""
    limit = args.max_model_len or int(config.max_position_embeddings)  # type: ignore[attr-defined]
    if limit > capacity:
        log.warning("max_model_len %d capped to %d: the KV cache holds no more", limit, capacity)
        limit = capacity
    return limit


def _probe_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The matmul weights of the model's first decoder layer and its LM head: what a decode
    step spends its time on, layer by layer."""
    from transformers.pytorch_utils import Conv1D

    decoder = generic.decoder_of(model)
    stacks = [m for m in decoder.children() if isinstance(m, torch.nn.ModuleList) and len(m)]
    weights = [
        m.weight if isinstance(m, torch.nn.Linear) else m.weight.T  # Conv1D: [in, out]
        for m in (stacks[0][0].modules() if stacks else ())
        if isinstance(m, torch.nn.Linear | Conv1D)
    ]
    return [*weights, model.get_output_embeddings().weight]
