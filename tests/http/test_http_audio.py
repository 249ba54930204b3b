"""POST /v1/audio/transcriptions and /translations on one real server (a chat model, tiny.en
and the multilingual base model, each its own engine process), driven with httpx, a raw socket
and the OpenAI SDK as clients drive it, on espeak-ng speech. The pure pieces (plan, formats,
stream events) are tested with plain values in test_http_audio_protocol.py."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import trio

from http_server_process import ServerProcess, run_server
from speech_audio import (
    SENTENCES,
    encode,
    long_speech,
    requires_espeak,
    samples,
    speak,
    word_error_rate,
)

MAX_AUDIO_SECONDS = 600
SRT_CUE = re.compile(r"^\d+\n\d\d:\d\d:\d\d,\d\d\d --> \d\d:\d\d:\d\d,\d\d\d\n.+$")
VTT_CUE = re.compile(r"^\d\d:\d\d:\d\d\.\d\d\d --> \d\d:\d\d:\d\d\.\d\d\d\n.+$")


pytestmark = requires_espeak


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with run_server(
        "SmolLM2-135M-Instruct",
        "whisper-tiny.en",
        "whisper-base",
        "--kv-cache-memory", "64MiB",
        "--max-model-len", "2048",
        "--max-audio-size", "4MiB",
        "--max-audio-seconds", str(MAX_AUDIO_SECONDS),
    ) as running:  # fmt: skip
        yield running


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def said() -> bytes:
    """Two sentences as an MP3: what most clients upload."""
    return encode(samples(speak(f"{SENTENCES[0]} {SENTENCES[1]}")), "mp3", "libmp3lame")


def _post(server: ServerProcess, path: str, file: bytes, **fields: object) -> httpx.Response:
    data = {k: v for k, v in fields.items() if not isinstance(v, list)}
    lists = [(f"{k}[]", x) for k, v in fields.items() if isinstance(v, list) for x in v]
    return httpx.post(
        server.url + path,
        files=[("file", ("said.mp3", file, "audio/mpeg")), *[(k, (None, x)) for k, x in lists]],
        data=data,
        timeout=120,
    )


def test_every_response_format_parses(server: ServerProcess, said: bytes) -> None:
    text = " ".join(SENTENCES[:2])
    plain = _post(server, "/v1/audio/transcriptions", said, model="whisper-tiny.en")
    assert plain.status_code == 200, plain.text
    got = plain.json()
    assert word_error_rate(text, got["text"]) <= 0.25, got
    assert got["usage"]["type"] == "duration" and 8 < got["usage"]["seconds"] < 12

    as_text = _post(server, "/v1/audio/transcriptions", said, response_format="text")
    assert as_text.headers["content-type"].startswith("text/plain")
    assert as_text.text == got["text"] + "\n"

    for fmt, cue, first in (("srt", SRT_CUE, ""), ("vtt", VTT_CUE, "WEBVTT")):
        body = _post(server, "/v1/audio/transcriptions", said, response_format=fmt).text
        blocks = body.strip("\n").split("\n\n")
        if first:
            assert blocks.pop(0) == first
        assert blocks and all(cue.match(b) for b in blocks), body
        ends = [b.split(" --> ")[1][:12] for b in blocks]
        assert ends == sorted(ends)

    verbose = _post(
        server,
        "/v1/audio/transcriptions",
        said,
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    ).json()
    assert (verbose["task"], verbose["language"]) == ("transcribe", "english")
    starts = [s["start"] for s in verbose["segments"]]
    assert starts == sorted(starts) and verbose["segments"][-1]["end"] <= verbose["duration"] + 1
    words = verbose["words"]
    assert len(words) >= len(text.split()) * 0.75
    assert all(0 <= w["start"] <= w["end"] for w in words)


def test_streamed_deltas_concatenate_to_the_final_text(server: ServerProcess) -> None:
    pcm = long_speech(40)  # two windows
    file = encode(pcm, "mp3", "libmp3lame")
    events = []
    with httpx.stream(
        "POST",
        server.url + "/v1/audio/transcriptions",
        files={"file": ("long.mp3", file, "audio/mpeg")},
        data={"stream": "true"},
        timeout=120,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
    [done] = [e for e in events if e["type"] == "transcript.text.done"]
    assert events[-1] is done and len(deltas) >= 2
    assert "".join(deltas) == done["text"]
    whole = _post(server, "/v1/audio/transcriptions", file).json()["text"]
    assert done["text"] == whole


def test_the_openai_sdk_works_unchanged(sdk: openai.OpenAI, said: bytes) -> None:
    text = " ".join(SENTENCES[:2])
    plain = sdk.audio.transcriptions.create(model="whisper-tiny.en", file=("said.mp3", said))
    assert word_error_rate(text, plain.text) <= 0.25
    verbose = sdk.audio.transcriptions.create(
        model="whisper-tiny.en",
        file=("said.mp3", said),
        response_format="verbose_json",
        timestamp_granularities=["word"],
        language="en",
        prompt="A meeting and a garden.",
        temperature=0.0,
    )
    assert verbose.language == "english" and verbose.words and verbose.duration > 8
    for fmt in ("text", "srt", "vtt"):
        body = sdk.audio.transcriptions.create(
            model="whisper-tiny.en", file=("said.mp3", said), response_format=fmt
        )
        assert isinstance(body, str) and "garden" in body.lower()
    events = list(
        sdk.audio.transcriptions.create(
            model="whisper-tiny.en", file=("said.mp3", said), stream=True
        )
    )
    assert [e.type for e in events][-1] == "transcript.text.done"
    assert "".join(e.delta for e in events[:-1]) == events[-1].text

    french = encode(
        samples(
            speak("Bonjour, je voudrais un café et un croissant, s'il vous plaît.", voice="fr")
        ),
        "mp3",
        "libmp3lame",
    )
    translated = sdk.audio.translations.create(model="whisper-base", file=("fr.mp3", french))
    assert translated.text.strip()
    verbose = sdk.audio.translations.create(
        model="whisper-base", file=("fr.mp3", french), response_format="verbose_json"
    )
    assert (verbose.task, verbose.language) == ("translate", "english") and verbose.text
    detected = sdk.audio.transcriptions.create(
        model="whisper-base", file=("fr.mp3", french), response_format="verbose_json"
    )
    assert detected.language == "french"


@pytest.mark.parametrize(
    ("path", "upload", "fields", "status", "param"),
    [
        ("/v1/audio/transcriptions", b"this is text, not sound " * 50, {}, 400, "file"),
        ("/v1/audio/transcriptions", b"", {}, 400, "file"),
        ("/v1/audio/transcriptions", None, {"language": "fr"}, 400, "language"),
        ("/v1/audio/transcriptions", None, {"language": "klingon"}, 400, "language"),
        ("/v1/audio/transcriptions", None, {"temperature": "1.5"}, 400, "temperature"),
        ("/v1/audio/transcriptions", None, {"model": "whisper-1"}, 404, "model"),
        ("/v1/audio/transcriptions", None, {"model": "SmolLM2-135M-Instruct"}, 400, "model"),
        ("/v1/audio/translations", None, {"model": "whisper-tiny.en"}, 400, "model"),
        ("/v1/audio/transcriptions", None, {"include": ["logprobs"]}, 400, "include"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_field(
    server: ServerProcess,
    said: bytes,
    path: str,
    upload: bytes | None,
    fields: dict[str, object],
    status: int,
    param: str,
) -> None:
    response = _post(server, path, said if upload is None else upload, **fields)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_a_corrupt_file_never_reaches_the_engine(server: ServerProcess, said: bytes) -> None:
    before = httpx.get(server.url + "/health").json()["engines"]
    noise = np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    half = len(said) // 2
    for corrupt in (said[:half] + noise + said[half + 4000 :], said[:100] + noise, noise):
        response = _post(server, "/v1/audio/transcriptions", corrupt)
        assert response.status_code in (200, 400), response.text
        if response.status_code == 400:
            assert response.json()["error"]["param"] == "file"
    assert httpx.get(server.url + "/health").json()["engines"] == before  # same pids, no restart


def test_a_file_over_the_limits_gets_413_naming_the_file(server: ServerProcess) -> None:
    too_big = _post(server, "/v1/audio/transcriptions", b"\0" * (5 << 20))
    assert too_big.status_code == 413 and too_big.json()["error"]["param"] == "file"
    not_a_form = httpx.post(server.url + "/v1/audio/transcriptions", json={"file": "x"})
    assert not_a_form.status_code == 415
    missing = httpx.post(
        server.url + "/v1/audio/transcriptions", files={"model": (None, "whisper-tiny.en")}
    )
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "file"


@pytest.fixture(scope="module")
def twelve_minutes() -> bytes:
    """Longer than --max-audio-seconds: the server decodes ten minutes of it, then says 413."""
    minute = long_speech(60)[: 60 * 16_000]
    return encode(np.tile(minute, 12), "mp3", "libmp3lame")


def test_a_long_file_gets_413_once_decoding_passes_the_duration_limit(
    server: ServerProcess, twelve_minutes: bytes
) -> None:
    response = _post(server, "/v1/audio/transcriptions", twelve_minutes)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["param"] == "file"
    assert f"{MAX_AUDIO_SECONDS} seconds" in response.json()["error"]["message"]


def test_a_disconnect_mid_file_leaves_the_engine_idle_within_one_window(
    server: ServerProcess,
) -> None:
    file = encode(long_speech(180), "mp3", "libmp3lame")  # six windows
    host, port = server.url.removeprefix("http://").split(":")
    boundary = "trio-llm-test"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="stream"\r\n\r\ntrue\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.mp3"\r\n'
            "Content-Type: audio/mpeg\r\n\r\n"
        ).encode()
        + file
        + f"\r\n--{boundary}--\r\n".encode()
    )
    head = (
        "POST /v1/audio/transcriptions HTTP/1.1\r\n"
        f"Host: {host}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=120) as conn:
        conn.sendall(head + body)
        received = b""
        while b"transcript.text.delta" not in received:  # the first window is back
            chunk = conn.recv(65536)
            assert chunk, received
            received += chunk
        steps_then = _replica(server, "trio_llm_replica_num_steps")
    # Closed: the server sees EOF, cancels the handler, and the engine drops the request.
    deadline = time.monotonic() + 120
    while _replica(server, "trio_llm_replica_num_requests_running") > 0:
        assert time.monotonic() < deadline, "the engine kept transcribing"
        time.sleep(0.05)
    assert _replica(server, "trio_llm_replica_num_steps") <= steps_then + 1
    assert _replica(server, "trio_llm_replica_num_requests_in_flight") == 0


def test_a_disconnect_while_a_long_files_features_compute_aborts_it(
    server: ServerProcess,
) -> None:
    """Nine and a half minutes of speech: the engine computes its features in slices over
    several steps before the first window, so a client that hangs up meanwhile is dropped
    between two of them and the engine goes idle."""
    file = encode(long_speech(570)[: 570 * 16_000], "mp3", "libmp3lame")
    steps_before = _replica(server, "trio_llm_replica_num_steps")
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST",
            server.url + "/v1/audio/transcriptions",
            files={"file": ("long.mp3", file, "audio/mpeg")},
            data={"model": "whisper-tiny.en", "stream": "true"},
        ) as response,
    ):
        assert response.status_code == 200
        deadline = time.monotonic() + 120
        while _replica(server, "trio_llm_replica_num_steps") == steps_before:
            assert time.monotonic() < deadline, "the engine never started the file"
            time.sleep(0.01)
        steps_then = _replica(server, "trio_llm_replica_num_steps")
    # Closed before any event was read: the handler is cancelled, the engine drops the file
    # at its next step.
    deadline = time.monotonic() + 120
    while _replica(server, "trio_llm_replica_num_requests_running") > 0:
        assert time.monotonic() < deadline, "the engine kept the file"
        time.sleep(0.05)
    assert _replica(server, "trio_llm_replica_num_steps") <= steps_then + 2
    assert _replica(server, "trio_llm_replica_num_requests_in_flight") == 0


def _replica(server: ServerProcess, name: str) -> float:
    return server.labelled(name)[("whisper-tiny.en", "0")]


async def test_chat_streams_keep_their_pace_while_audio_decodes(
    server: ServerProcess, twelve_minutes: bytes
) -> None:
    """Three twelve-minute MP3s are decoded (each until the duration limit refuses it) while a
    chat stream runs: were decoding on the event loop, a gap between two chat tokens would
    last as long as a whole decode."""
    from trio_llm.speech.audio import AudioError, decode_audio

    started = time.perf_counter()
    with pytest.raises(AudioError):
        decode_audio(twelve_minutes, max_seconds=MAX_AUDIO_SECONDS)
    decode_seconds = time.perf_counter() - started

    gaps: list[float] = []
    decoding = trio.Event()
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:

        async def chat() -> None:
            body = {
                "model": "SmolLM2-135M-Instruct",
                "messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 400,
                "ignore_eos": True,
                "stream": True,
            }
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                last = None
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    now = time.perf_counter()
                    if last is not None and decoding.is_set():
                        gaps.append(now - last)
                    last = now

        async def upload() -> None:
            files = {"file": ("long.mp3", twelve_minutes, "audio/mpeg")}
            response = await client.post("/v1/audio/transcriptions", files=files)
            assert response.status_code == 413

        async with trio.open_nursery() as nursery:
            nursery.start_soon(chat)
            await trio.sleep(1.0)  # the stream is going
            decoding.set()
            async with trio.open_nursery() as uploads:
                for _ in range(3):
                    uploads.start_soon(upload)
            nursery.cancel_scope.cancel()
    assert gaps, "the chat stream ended before the uploads began"
    assert max(gaps) < decode_seconds / 2, (max(gaps), decode_seconds, sorted(gaps)[-5:])
