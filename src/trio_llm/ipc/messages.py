"""The engine protocol: every message that crosses the frontend/engine boundary.

Each message is a msgspec Struct, array_like with defaults omitted, tagged so that one decoder
reads a union. The request ring carries `EngineCoreRequest`, `AbortRequests`, `LoadLora`,
`UnloadLora` and `Shutdown`, and for a speech engine `TranscriptionRequest` followed by its
`AudioChunk`s; the output ring carries `EngineReady`, `EngineCoreOutputs`, `EngineFailure` and
`LoraUpdated`. Before either ring is read, the engine process reads one `EngineLaunch` on its
stdin.

Token ids travel as lists of ints: msgpack packs small ints in one to three bytes, and the
frontend needs them as Python ints anyway. Embeddings travel as raw little-endian float32 bytes
(msgpack bin): what the HTTP edge sends on as base64 as it is. Audio travels as raw
little-endian int16 samples at 16 kHz, cut into chunks that each fit the ring whatever the
file's length.
"""

from __future__ import annotations

import msgspec

from trio_llm.config import EngineArgs
from trio_llm.ipc.shm_ring import RingSpec
from trio_llm.sampling_params import SamplingParams

# -- frontend -> engine, on its stdin ---------------------------------------------------------


class EngineLaunch(msgspec.Struct, kw_only=True):
    """What the frontend hands the engine process on its stdin: the engine arguments and the
    two rings' specs (the ring fds themselves arrive through `pass_fds`). Importable without
    torch: the frontend builds it without loading the engine."""

    args: EngineArgs
    request_ring: RingSpec
    """Frontend -> engine: EngineCoreRequest, AbortRequests, LoadLora, UnloadLora, Shutdown."""
    output_ring: RingSpec
    """Engine -> frontend: EngineReady or EngineFailure first, then EngineCoreOutputs."""


class _Msg(msgspec.Struct, array_like=True, omit_defaults=True, tag=True, kw_only=True):
    pass


# -- frontend -> engine -------------------------------------------------------------------


class ImageInput(msgspec.Struct, array_like=True, kw_only=True):
    """One image of a prompt, as its model's processor made it: the pixel values its vision
    tower reads, and the span of the prompt holding the placeholder tokens its features
    replace (one run for LLaVA; for Idefics3 a run per tile, row and column tokens between).

    The pixels travel inline, as raw little-endian float32 bytes (msgpack bin): a LLaVA image
    at 336 px is 1.3 MB, well within the request ring (8 MiB by default; a request that does not
    fit is refused before it is sent)."""

    offset: int
    """The first placeholder token's position in the prompt."""
    length: int
    """The span's length, to the last placeholder included; the image token's positions in it
    are the placeholders, as many as the rows the tower and projector give."""
    shape: list[int]
    """Of the pixel values: [channels, height, width], or [tiles, channels, height, width]."""
    pixels: bytes
    digest: bytes
    """sha256 of the pixel values: what the prefix cache keys the placeholder tokens' blocks by,
    so that two images behind the same placeholders never share K/V."""


class EngineCoreRequest(_Msg, tag="add"):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    """time.time() when the frontend accepted the request (for metrics)."""
    priority: int = 0
    """Lower runs first; FCFS among equals."""
    background: bool = False
    """Background work (a batch's line): served after every interactive request, under any
    scheduling policy, with only the capacity they leave (engine/step/scheduler.py)."""
    pooling: bool = False
    """A pooling request (embeddings, scores, classes): the engine pools the prompt's hidden
    states instead of generating (only a pooling engine serves it; `sampling_params` is then
    unused)."""
    token_type_start: int = 0
    """A pooling request that is a pair of texts (a cross-encoder's input): the index of the
    second text's first token, from which a model with token types gives type 1; 0: one
    text."""
    lora: str | None = None
    """The LoRA adapter to generate with, by its loaded name (None: the base model)."""
    images: list[ImageInput] | None = None
    """The prompt's images, in prompt order (a vision-language model's request)."""


class LoadLora(_Msg, tag="load_lora"):
    """Load the PEFT adapter at `path` and serve it as `name`; answered by `LoraUpdated`."""

    update_id: int
    name: str
    path: str


class UnloadLora(_Msg, tag="unload_lora"):
    """Stop serving adapter `name` (its requests in flight finish); answered by
    `LoraUpdated`."""

    update_id: int
    name: str


class TranscriptionRequest(_Msg, tag="transcribe"):
    """A speech engine's request. Its audio follows in `AudioChunk`s, `num_samples` in all; the
    engine starts on it once the last chunk has arrived, and sends its segments window by
    window."""

    request_id: str
    num_samples: int
    task: str = "transcribe"
    """transcribe | translate (into English)."""
    language: str | None = None
    """The spoken language's code; None: detected from the first window."""
    prompt: str | None = None
    """Text the first window is conditioned on (OpenAI's `prompt`)."""
    temperature: float = 0.0
    """The first temperature tried; a window that fails the thresholds is decoded again at
    hotter ones, up to 1.0 (Whisper's fallback)."""
    word_timestamps: bool = False
    arrival_time: float = 0.0
    priority: int = 0
    """Lower runs first; FCFS among equals."""


class AudioChunk(_Msg, tag="audio"):
    request_id: str
    samples: bytes
    """Little-endian int16 at 16 kHz mono."""


class AbortRequests(_Msg, tag="abort"):
    request_ids: list[str]


class Shutdown(_Msg, tag="shutdown"):
    pass


# -- engine -> frontend -------------------------------------------------------------------


class EngineReady(_Msg, tag="ready"):
    model: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    dtype: str
    device: str
    block_size: int
    num_blocks: int
    kv_capacity_tokens: int
    kv_cache_bytes: int
    attention_backend: str = "torch"
    pid: int = 0
    task: str = "generate"
    """generate | embed | score | classify: what the engine serves (trio_llm.tasks)."""
    embedding_size: int = 0
    """With task embed: the length of each embedding."""
    normalized: bool = False
    """With task embed: the embeddings have unit length."""
    matryoshka_dimensions: list[int] | None = None
    """With task embed, for a model trained to be cut shorter: the sizes it may be cut to
    ([]: any); None when it may not be."""
    languages: list[str] | None = None
    """With task transcribe: the language codes the model knows (["en"]: English only, so it
    cannot translate)."""
    labels: list[str] | None = None
    """With task score or classify: the label of each output, in order (the model's
    `id2label`); its outputs are the activated scores (probabilities over several labels)."""
    priority_scheduling: bool = False
    """Requests may carry a non-zero priority (scheduling_policy 'priority')."""


class EngineLoading(_Msg, tag="loading"):
    """Start-up progress, sent before EngineReady: the stage the engine is entering."""

    stage: str


class EngineFailure(_Msg, tag="failure"):
    """A fatal error: the engine sends this and exits non-zero."""

    message: str
    traceback: str = ""


class LoraUpdated(_Msg, tag="lora_updated"):
    """The answer to `LoadLora` or `UnloadLora` of the same `update_id`."""

    update_id: int
    error: str | None = None
    """Why it was refused (None: done)."""
    not_found: bool = False
    """Refused because no adapter of that name is loaded."""


class TokenLogprobs(msgspec.Struct, array_like=True, omit_defaults=True):
    """Logprobs at one position: the chosen token first, then the top-N alternatives."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int = 1
    """Rank of the chosen token among all (1 = most likely)."""


class SpeechWord(msgspec.Struct, array_like=True):
    word: str
    start: float
    end: float
    probability: float


class SpeechSegment(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    """One segment of a transcription, with Whisper's own figures (what OpenAI's verbose_json
    reports)."""

    id: int
    seek: int
    """The window's start, in mel frames (100 per second)."""
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[SpeechWord] | None = None
    """With word timestamps."""


class SpeechOutput(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    """What one window of a transcription produced."""

    segments: list[SpeechSegment] = msgspec.field(default_factory=list)
    language: str = ""
    """The spoken language's code (given or detected)."""
    language_probability: float = 0.0
    position: float = 0.0
    """Seconds of audio transcribed so far."""


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    request_id: str
    new_token_ids: list[int] = msgspec.field(default_factory=list)
    new_logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """Sent once, with the first output; entry 0 is None (the first token has no context)."""
    finish_reason: str | None = None
    """'stop', 'length', 'abort' or 'error'; None while running."""
    stop_reason: int | None = None
    """The stop token id that ended the request, when it was not EOS."""
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache (sent with the first output)."""
    error: str | None = None
    """With finish_reason 'error': what went wrong with this request."""
    pooled: bytes | None = None
    """A pooling request's output (raw float32: the embedding, or one score per label), with
    finish_reason 'stop'."""
    speech: SpeechOutput | None = None
    """A transcription's new segments (one output per window)."""
    error_param: str | None = None
    """With an error the request's own parameters caused ('constraint', 'allowed_token_ids',
    ...: nothing they allow could be generated): that parameter. None: the engine failed."""


class SchedulerStats(msgspec.Struct, array_like=True, kw_only=True):
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    kv_usage: float = 0.0
    prefix_cache_queries: int = 0
    """Prompt tokens looked up in the prefix cache (cumulative)."""
    prefix_cache_hits: int = 0
    """Prompt tokens found there (cumulative)."""
    num_preemptions: int = 0
    """Cumulative."""
    num_steps: int = 0
    """Model steps run (cumulative)."""
    running_loras: list[str] = []
    """The LoRA adapters the running sequences use, each once (vLLM's
    `running_lora_adapters`); empty without LoRA."""
    waiting_loras: list[str] = []
    """Likewise of the waiting sequences."""


class EngineCoreOutputs(_Msg, tag="outputs"):
    """Everything one engine iteration produced: sent once per step, and after aborts."""

    outputs: list[EngineCoreOutput]
    timestamp: float
    """time.time() when the step finished."""
    stats: SchedulerStats


FrontendMessage = (
    EngineCoreRequest
    | TranscriptionRequest
    | AudioChunk
    | AbortRequests
    | LoadLora
    | UnloadLora
    | Shutdown
)
EngineMessage = EngineReady | EngineLoading | EngineCoreOutputs | EngineFailure | LoraUpdated
