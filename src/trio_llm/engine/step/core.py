"""EngineCore: the engine's synchronous heart, usable in-process (tests, benchmarks) and inside
the engine process.

What it owns: the request table (request id -> live sequence) and the step loop body: schedule,
run the model, update the sequences, and turn what happened into one `EngineCoreOutputs`. Which
requests may enter, and the sequence each becomes, is admission.py's; the engine's assembly at
start-up (weights, dtype, KV cache size, the runner) is build.py's.

A request with a constraint waits until its grammar has compiled in the structured-output
worker thread (`step/structured.py`); the others keep stepping, and the process loop sleeps no
longer than `idle_timeout()` while one compiles, so it sees the grammar soon after.

Invariants: nothing a request carries can raise out of `add_request` or `step`: a request the
engine cannot serve (bad parameters, a prompt too long for the context, a duplicate id, a
grammar that does not compile) finishes with an 'error' output at the next step, and the others
continue. Every request that enters gets exactly one output with a finish reason; after that its
id is forgotten and its blocks are back in the pool.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future

import torch

from trio_llm import model_files
from trio_llm.config import EngineArgs
from trio_llm.engine.hf import text_config
from trio_llm.engine.lora import LoraLoadError, LoraNotFoundError
from trio_llm.engine.models import loader
from trio_llm.engine.ops import threads
from trio_llm.engine.step import build, speculative
from trio_llm.engine.step.admission import Admission
from trio_llm.engine.step.block_manager import BlockManager
from trio_llm.engine.step.build import EngineConfigError
from trio_llm.engine.step.kv_events import KVEventPublisher
from trio_llm.engine.step.model_runner import ModelRunner, StepResult
from trio_llm.engine.step.pacing import PrefillPace
from trio_llm.engine.step.pooling_runner import PoolingRunner
from trio_llm.engine.step.scheduler import Scheduler
from trio_llm.engine.step.sequence import ScheduledBatch, Sequence
from trio_llm.engine.step.structured import StructuredOutputs
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
from trio_llm.tasks import is_pooling

log = logging.getLogger(__name__)


GRAMMAR_POLL_SECONDS = 0.002
"""How long the idle loop sleeps on the request ring while a grammar compiles (a compile takes
about a millisecond; the ring's doorbell cannot tell the loop that one has finished)."""
SCHEDULING_POLICIES = ("fcfs", "priority")


class EngineCore:
    def __init__(self, args: EngineArgs, on_stage: Callable[[str], None] | None = None) -> None:
        """`on_stage` hears the start-up stages as they begin (the process sends them on as
        EngineLoading progress)."""
        stage = on_stage or (lambda _: None)
        if args.batch_invariant != "off":
            # fp32 attention keeps invariance only in MKL's reproducibility mode, which MKL
            # takes before its first call alone (engine/plans/invariance.py).
            threads.enable_reproducible_mkl()
        if args.num_threads:
            torch.set_num_threads(args.num_threads)
        stage("resolving the model")
        source = model_files.resolve_model(args.model)
        device = loader.resolve_device(args.device)
        dtype = loader.resolve_dtype(args.dtype, device)
        if device == "cpu" and (why := loader.check_cpu_dtype(dtype, loader.cpu_flags())):
            raise EngineConfigError(why)
        config = loader.load_config(source)
        self.task = loader.resolve_task(args.task, source, config)
        self.pooling = is_pooling(self.task)
        self.args = args
        self.device = torch.device(device)
        self.vocab_size = int(text_config(config).vocab_size)  # type: ignore[attr-defined]
        self.eos_token_ids = frozenset(loader.eos_token_ids(source, config))
        if args.lora:
            build.check_lora_args(args, self.task)
        stage("loading the weights")
        if self.pooling:
            parts = build.pooling_parts(args, self.task, source, config, dtype, device)
        else:
            parts = build.generation_parts(args, source, config, dtype, device, stage)
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
            preempt_for_priority=args.scheduling_policy == "priority",
        )
        self.pace = (
            None
            if self.pooling or (args.prefill_pace_ms <= 0 and args.long_prefill_ms <= 0)
            else PrefillPace(
                parts.max_num_batched_tokens,
                args.prefill_pace_ms / 1000 if args.prefill_pace_ms > 0 else None,
                args.long_prefill_ms / 1000 if args.long_prefill_ms > 0 else None,
            )
        )
        """How many prompt tokens a step with decodes may carry (pacing.py)."""
        self.runner = parts.runner
        self.loras = build.load_loras(args, parts.runner)
        """The adapters served (None: LoRA off)."""
        self.admission = Admission(
            task=self.task,
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            device=self.device,
            priority_scheduling=args.scheduling_policy == "priority",
            loras=self.loras,
            vision=self.runner.vision if isinstance(self.runner, ModelRunner) else None,
        )
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
            seq = self.admission.sequence(req, self.requests)
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
            if self.pace is not None:
                self.scheduler.prefill_cap = self.pace.cap()
                self.scheduler.chunk_cap = self.pace.chunk_cap()
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
        started = time.perf_counter()
        try:
            result = self.runner.execute(batch, self.eos_token_ids, masks)
        except Exception as exc:
            # A failure inside the model fails the requests of this batch, not the engine.
            log.exception("model step failed; failing its %d requests", len(batch.seqs))
            return [self._fail(seq, f"model step failed: {exc!r}") for seq in batch.seqs]
        finally:
            if masks is not None:
                masks.done.exception()  # the mask thread is done with the matchers
        if self.pace is not None:
            prefill = sum(batch.num_tokens) - batch.num_decodes
            self.pace.record(time.perf_counter() - started, batch.num_decodes, prefill)
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
        stats = self.scheduler.stats()
        if self.loras is not None:  # names by slot: vLLM's lora_requests_info labels
            stats.running_loras = self.loras.names_of(s.lora_slot for s in self.scheduler.running)
            stats.waiting_loras = self.loras.names_of(s.lora_slot for s in self.scheduler.waiting)
        return stats
