"""SpeechCore: the speech engine kind, a Whisper model (CTranslate2, through faster-whisper)
behind the same loop, rings and messages as a text engine.

What it owns: the transcriptions of one engine process, from their `TranscriptionRequest` and
`AudioChunk`s to one `EngineCoreOutput` per window they advance. The process loop
(engine/process.py) drives it exactly as it drives `EngineCore`: `add_request`,
`abort_requests`, `reject`, `has_work`, `step`, `stats`, `ready`, so the frontend's supervisor,
router, health and metrics see one more engine and nothing else.

Scheduling: requests run in priority order, FCFS among equals; each step advances the first
`max_batch` runnable transcriptions by one 30-second window each, in one batch (windows.py).
A request's audio arrives in chunks; it becomes runnable once the last one is in.

Invariants: an abort takes effect between two steps, so a cancelled request costs at most the
window being decoded; a transcription that fails (bad audio, a library error) fails alone, with
an 'error' output, and the engine goes on; every request gets exactly one finishing output.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trio_llm.config import EngineArgs
from trio_llm.engine.speech.windows import Transcription, WindowDecoder, temperatures
from trio_llm.ipc.messages import (
    AudioChunk,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineReady,
    LoadLora,
    LoraUpdated,
    SchedulerStats,
    SpeechOutput,
    TranscriptionRequest,
    UnloadLora,
)

log = logging.getLogger(__name__)

MAX_BATCH = 8
"""Windows decoded together at most (and `max_num_seqs` when lower): a CPU gains little past a
few (measured: two windows of tiny.en take 1.7x one), and a step's length is how long an abort
or a new request waits."""


class SpeechModelError(ValueError):
    """The directory or the options cannot be served as a speech model."""


@dataclass(eq=False)
class _Incoming:
    request: TranscriptionRequest
    chunks: list[bytes] = field(default_factory=list)
    received: int = 0
    """Samples received so far."""


class SpeechCore:
    def __init__(
        self, args: EngineArgs, path: Path, name: str, on_stage: Callable[[str], None]
    ) -> None:
        on_stage("loading the speech model")
        if args.task not in ("auto", "transcribe"):
            raise SpeechModelError(
                f"{name} is a speech-to-text model: it serves task transcribe, not {args.task}"
            )
        if args.lora:
            raise SpeechModelError(f"{name} is a speech-to-text model: it takes no LoRA adapters")
        # CTranslate2's OpenMP threads spin between parallel regions by default. Measured on a
        # loaded 2-core VM: 16-34 CPU s per 30 s clip spinning, 1.0-1.5 s passive, the same
        # text; and an engine shares its cores with the frontend and the other engines. Set
        # before the library loads libgomp; an operator's own setting wins.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import ctranslate2
        from faster_whisper import WhisperModel

        device, index = _device(args.device, ctranslate2.get_cuda_device_count())
        compute_type = args.compute_type
        supported = ctranslate2.get_supported_compute_types(device)
        if compute_type not in ("default", "auto", *supported):
            raise SpeechModelError(
                f"compute type {compute_type!r} is not available on {device}; use default, "
                f"auto or one of {', '.join(sorted(supported))}"
            )
        threads = args.num_threads or os.cpu_count() or 1
        self.model = WhisperModel(
            str(path),
            device=device,
            device_index=index,
            compute_type=compute_type,
            cpu_threads=threads,
            num_workers=1,
        )
        self.decoder = WindowDecoder(self.model)
        self.max_batch = max(1, min(MAX_BATCH, args.max_num_seqs))
        self.ready = EngineReady(
            model=name,
            max_model_len=self.model.max_length,
            vocab_size=self.model.hf_tokenizer.get_vocab_size(),
            eos_token_ids=[self.decoder.eot],
            dtype=self.model.model.compute_type,
            device=device if device == "cpu" else f"{device}:{index}",
            block_size=0,
            num_blocks=0,
            kv_capacity_tokens=0,
            kv_cache_bytes=0,
            attention_backend="ctranslate2",
            pid=os.getpid(),
            task="transcribe",
            languages=self.decoder.languages,
        )
        log.info(
            "speech engine: %s on %s, compute type %s, %d threads",
            name,
            self.ready.device,
            self.ready.dtype,
            threads,
        )
        self._incoming: dict[str, _Incoming] = {}
        self._runnable: list[Transcription] = []
        self._pending: list[EngineCoreOutput] = []
        self._steps = 0

    # -- what the process loop calls -----------------------------------------------------

    def add_request(self, msg: EngineCoreRequest | TranscriptionRequest | AudioChunk) -> None:
        if isinstance(msg, TranscriptionRequest):
            self._add_transcription(msg)
        elif isinstance(msg, AudioChunk):
            self._add_audio(msg)
        else:
            self.reject(
                msg.request_id,
                f"{self.ready.model} is a speech-to-text model: it does not generate text or "
                "embeddings",
            )

    def update_lora(self, message: LoadLora | UnloadLora) -> LoraUpdated:
        return LoraUpdated(
            update_id=message.update_id, error="a speech engine serves no LoRA adapters"
        )

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            known = self._incoming.pop(request_id, None) is not None
            for t in self._runnable:
                if t.request_id == request_id:
                    self._runnable.remove(t)
                    known = True
                    break
            if known:
                self._pending.append(EngineCoreOutput(request_id=request_id, finish_reason="abort"))

    def reject(self, request_id: str, message: str) -> None:
        self._incoming.pop(request_id, None)
        self._runnable = [t for t in self._runnable if t.request_id != request_id]
        self._pending.append(
            EngineCoreOutput(request_id=request_id, finish_reason="error", error=message)
        )

    def has_work(self) -> bool:
        return bool(self._runnable) or bool(self._pending)

    def idle_timeout(self) -> float | None:
        """Nothing finishes on its own while the loop sleeps: wait for a message."""
        return None

    def step(self) -> EngineCoreOutputs:
        outputs, self._pending = self._pending, []
        batch = self._runnable[: self.max_batch]
        if batch:
            self._steps += 1
            outputs.extend(self._advance(batch))
        return EngineCoreOutputs(outputs=outputs, timestamp=time.time(), stats=self.stats())

    def stats(self) -> SchedulerStats:
        running = min(len(self._runnable), self.max_batch)
        return SchedulerStats(
            num_running=running,
            num_waiting=len(self._runnable) - running + len(self._incoming),
            num_steps=self._steps,
        )

    # -- inside -------------------------------------------------------------------------

    def _add_transcription(self, request: TranscriptionRequest) -> None:
        rid = request.request_id
        if rid in self._incoming or any(t.request_id == rid for t in self._runnable):
            self.reject(rid, f"request id {rid!r} is already in flight")
            return
        if request.task == "translate" and not self.decoder.multilingual:
            self.reject(rid, f"{self.ready.model} knows only English: it cannot translate")
            return
        if request.language is not None and request.language not in self.decoder.languages:
            self.reject(rid, f"{self.ready.model} does not know the language {request.language!r}")
            return
        self._incoming[rid] = _Incoming(request)
        if request.num_samples <= 0:
            self._ready_to_run(rid)

    def _add_audio(self, chunk: AudioChunk) -> None:
        incoming = self._incoming.get(chunk.request_id)
        if incoming is None:
            return  # aborted or rejected already
        incoming.chunks.append(chunk.samples)
        incoming.received += len(chunk.samples) // 2
        if incoming.received > incoming.request.num_samples:
            self.reject(chunk.request_id, "the request sent more audio than it announced")
        elif incoming.received == incoming.request.num_samples:
            self._ready_to_run(chunk.request_id)

    def _ready_to_run(self, request_id: str) -> None:
        incoming = self._incoming.pop(request_id)
        r = incoming.request
        pcm = np.frombuffer(b"".join(incoming.chunks), dtype="<i2")
        transcription = Transcription(
            request_id=r.request_id,
            audio=pcm.astype(np.float32) / 32768.0,
            task=r.task,
            language=r.language,
            prompt=r.prompt,
            temperatures=temperatures(r.temperature),
            word_timestamps=r.word_timestamps,
            priority=r.priority,
            arrival_time=r.arrival_time,
        )
        # Stable: FCFS among equal priorities.
        at = len(self._runnable)
        while at > 0 and self._runnable[at - 1].priority > r.priority:
            at -= 1
        self._runnable.insert(at, transcription)

    def _advance(self, batch: list[Transcription]) -> list[EngineCoreOutput]:
        """One window of each; a batch that fails is tried again one by one, so a failure
        fails only the transcription it belongs to."""
        try:
            results = self.decoder.step(batch)
        except Exception:
            if len(batch) == 1:
                t = batch[0]
                log.exception("transcription %s failed", t.request_id)
                self._runnable.remove(t)
                return [
                    EngineCoreOutput(
                        request_id=t.request_id,
                        finish_reason="error",
                        error="the speech engine could not transcribe this audio",
                    )
                ]
            return [out for t in batch for out in self._advance([t])]
        outputs = []
        for result in results:
            t = result.transcription
            finished = t.finished
            if finished:
                self._runnable.remove(t)
            outputs.append(
                EngineCoreOutput(
                    request_id=t.request_id,
                    finish_reason="stop" if finished else None,
                    speech=SpeechOutput(
                        segments=result.segments,
                        language=t.language or "",
                        language_probability=t.language_probability,
                        position=result.position,
                    ),
                )
            )
        for t in batch:  # finished before its first window (no audio frames at all)
            if t.finished and t in self._runnable:
                self._runnable.remove(t)
                outputs.append(
                    EngineCoreOutput(
                        request_id=t.request_id,
                        finish_reason="stop",
                        speech=SpeechOutput(language=t.language or ""),
                    )
                )
        return outputs


def _device(device: str, cuda_devices: int) -> tuple[str, int]:
    """EngineArgs' device as CTranslate2 names it: (cpu|cuda, index)."""
    if device == "auto":
        return ("cuda", 0) if cuda_devices > 0 else ("cpu", 0)
    if device == "cpu":
        return "cpu", 0
    if device == "cuda" or device.startswith("cuda:"):
        index = int(device.partition(":")[2] or 0)
        if index >= cuda_devices:
            raise SpeechModelError(f"device {device}: CTranslate2 sees {cuda_devices} GPUs")
        return "cuda", index
    raise SpeechModelError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N")
