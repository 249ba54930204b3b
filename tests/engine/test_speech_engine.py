"""The speech engine (SpeechCore) driven in process, as the engine loop drives it: requests and
audio chunks in, one output per window out, on the real tiny.en model and espeak-ng speech."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from speech_audio import SENTENCES, long_speech, requires_espeak, samples, speak, word_error_rate
from trio_llm.config import EngineArgs
from trio_llm.engine.process import build_core
from trio_llm.engine.speech.core import SpeechCore
from trio_llm.engine.speech.windows import temperatures
from trio_llm.ipc.messages import (
    AudioChunk,
    EngineCoreOutput,
    EngineCoreRequest,
    TranscriptionRequest,
)
from trio_llm.sampling_params import SamplingParams

pytestmark = requires_espeak


@pytest.fixture(scope="module")
def core() -> Iterator[SpeechCore]:
    built = build_core(EngineArgs(model="whisper-tiny.en", num_threads=1), lambda _: None)
    assert isinstance(built, SpeechCore)
    yield built


def submit(core: SpeechCore, request_id: str, pcm: np.ndarray, **options: object) -> None:
    core.add_request(
        TranscriptionRequest(request_id=request_id, num_samples=pcm.size, **options)  # type: ignore[arg-type]
    )
    data, chunk = pcm.astype("<i2").tobytes(), 1 << 16
    for start in range(0, len(data), chunk):  # several chunks, as the client sends them
        core.add_request(AudioChunk(request_id=request_id, samples=data[start : start + chunk]))


def run(core: SpeechCore) -> dict[str, list[EngineCoreOutput]]:
    outputs: dict[str, list[EngineCoreOutput]] = {}
    while core.has_work():
        for out in core.step().outputs:
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def text(outputs: list[EngineCoreOutput]) -> str:
    return "".join(s.text for o in outputs if o.speech for s in o.speech.segments).strip()


def test_the_ready_message_describes_a_speech_engine(core: SpeechCore) -> None:
    ready = core.ready
    assert (ready.task, ready.model, ready.languages) == ("transcribe", "whisper-tiny.en", ["en"])
    assert ready.attention_backend == "ctranslate2"


def test_tiny_en_transcribes_espeak_speech_with_few_word_errors(core: SpeechCore) -> None:
    for i, sentence in enumerate(SENTENCES):
        submit(core, f"s{i}", samples(speak(sentence)))
    outputs = run(core)
    said = " ".join(SENTENCES)
    heard = " ".join(text(outputs[f"s{i}"]) for i in range(len(SENTENCES)))
    assert word_error_rate(said, heard) <= 0.25, heard
    for i in range(len(SENTENCES)):
        assert outputs[f"s{i}"][-1].finish_reason == "stop"


def test_a_transcription_reads_the_same_alone_and_batched(core: SpeechCore) -> None:
    pcm = [samples(speak(s)) for s in SENTENCES[:3]]
    alone = []
    for i, p in enumerate(pcm):
        submit(core, f"alone{i}", p)
        alone.append(text(run(core)[f"alone{i}"]))
    for i, p in enumerate(pcm):
        submit(core, f"batched{i}", p)
    batched = run(core)
    assert [text(batched[f"batched{i}"]) for i in range(3)] == alone


def test_long_audio_advances_one_window_per_step(core: SpeechCore) -> None:
    pcm = long_speech(75)
    submit(core, "long", pcm)
    positions = []
    while core.has_work():
        outputs = core.step().outputs  # none while a step computes a slice of the features
        for out in outputs:
            assert out.speech is not None
            positions.append(out.speech.position)
    assert len(positions) >= 3, positions
    steps = np.diff([0.0, *positions])
    assert all(0 < step <= 30.0 for step in steps), positions
    assert positions[-1] == pytest.approx(pcm.size / 16_000, abs=0.02)
    assert out.finish_reason == "stop"


def test_an_abort_stops_the_work_within_one_window(core: SpeechCore) -> None:
    submit(core, "long", long_speech(120))
    while not (outputs := core.step().outputs):
        pass  # the features, a slice per step
    [first] = outputs
    assert first.finish_reason is None
    core.abort_requests(["long"])
    [aborted] = core.step().outputs
    assert (aborted.request_id, aborted.finish_reason) == ("long", "abort")
    assert not core.has_work()
    assert core.stats().num_running == 0


def test_a_30_minute_file_takes_its_features_in_slices(core: SpeechCore) -> None:
    """A step computes some slices of a long file's features, not the whole file's (seconds of
    CPU that held every other transcription, and the file's own abort); its abort takes
    effect at the next step, features half done."""
    submit(core, "long", long_speech(1800))
    submit(core, "short", samples(speak(SENTENCES[2])))
    first = core.step().outputs  # the short clip's one window, and a slice of the long file
    [long] = [t for t in core._runnable if t.request_id == "long"]
    assert long.features is not None and 0 < long.features.done < long.features.frames
    core.abort_requests(["long"])
    outputs = run(core)
    for out in first:
        outputs.setdefault(out.request_id, []).insert(0, out)
    assert [o.finish_reason for o in outputs["long"]] == ["abort"]
    assert outputs["short"][-1].finish_reason == "stop"
    assert word_error_rate(SENTENCES[2], text(outputs["short"])) <= 0.25


def test_a_failing_transcription_fails_alone(
    core: SpeechCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = core.decoder.step

    def failing(batch: list) -> list:  # type: ignore[type-arg]
        if any(t.request_id == "bad" for t in batch):
            raise RuntimeError("the library failed on this audio")
        return step(batch)

    monkeypatch.setattr(core.decoder, "step", failing)
    submit(core, "bad", samples(speak(SENTENCES[0])))
    submit(core, "good", samples(speak(SENTENCES[1])))
    outputs = run(core)
    assert outputs["bad"][-1].finish_reason == "error"
    assert outputs["good"][-1].finish_reason == "stop"
    assert word_error_rate(SENTENCES[1], text(outputs["good"])) <= 0.25


def test_what_the_model_cannot_serve_fails_with_an_error_output(core: SpeechCore) -> None:
    pcm = samples(speak(SENTENCES[0]))
    submit(core, "translate", pcm, task="translate")
    submit(core, "french", pcm, language="fr")
    core.add_request(
        EngineCoreRequest(
            request_id="text", prompt_token_ids=[1, 2], sampling_params=SamplingParams()
        )
    )
    outputs = run(core)
    for request_id, says in (
        ("translate", "cannot translate"),
        ("french", "does not know the language"),
        ("text", "does not generate"),
    ):
        [out] = outputs[request_id]
        assert out.finish_reason == "error" and says in (out.error or ""), out


def test_more_audio_than_announced_fails_the_request(core: SpeechCore) -> None:
    core.add_request(TranscriptionRequest(request_id="over", num_samples=4))
    core.add_request(AudioChunk(request_id="over", samples=b"\0" * 16))
    [out] = run(core)["over"]
    assert out.finish_reason == "error" and "more audio" in (out.error or "")


def test_the_temperature_ladder_is_whispers() -> None:
    assert temperatures(0.0) == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert temperatures(0.3) == (0.3, 0.5, 0.7, 0.9)
    assert temperatures(1.0) == (1.0,)


def test_a_task_the_model_cannot_serve_stops_the_start() -> None:
    from transformers import LlamaConfig

    from trio_llm.engine.models.loader import resolve_task
    from trio_llm.engine.speech.core import SpeechModelError
    from trio_llm.model_files import ModelSource, UnsupportedModelError, resolve_model

    text_model = ModelSource("llama", resolve_model("whisper-tiny.en").path, "llama")
    with pytest.raises(UnsupportedModelError, match="not a Whisper model"):
        resolve_task("transcribe", text_model, LlamaConfig())
    with pytest.raises(SpeechModelError, match="serves task transcribe, not embed"):
        build_core(EngineArgs(model="whisper-tiny.en", task="embed"), lambda _: None)
