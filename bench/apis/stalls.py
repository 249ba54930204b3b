"""Does any one request stall the others? A canary (a greedy completion stream of the default
model, read by a process of its own, tests/reliability/stall_streamer.py) runs on a real server
(the default model, all-MiniLM-L6-v2 and whisper-tiny.en, one thread each) while each
case goes in, one at a time, on a fresh server per source tree: the first chat request with
tools and a tool-call history (arguments that are not JSON), a JSON schema enum of 10,000
values (the first grammar of its kind), a 2,048-input /pooling request, and a long audio file
(espeak-ng speech, minutes long) transcribed while a short clip is transcribed beside it and
then abandoned. Printed per case: the canary's largest gap between two chunks while the case
ran (its median gap before any case is the step), and for the audio file the short clip's
latency beside it and right after hanging up on it (while its features compute), against
alone.

`--sources NAME=PATH`: the source trees to serve (PYTHONPATH of the server), e.g. main's
before a change and this tree's after it, in one run. The target: no gap over 100 ms. On a
shared machine every figure carries the other processes' noise: compare the cases against
the baseline's largest gap.

    python bench/apis/stalls.py --sources before=/work/main/src after=src --audio-seconds 1790
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it
sys.path.insert(0, str(BENCH.parent / "tests"))  # the tests' models, speech and server process

import hostinfo  # noqa: E402
from http_server_process import ServerProcess, run_server  # noqa: E402

STREAMER = BENCH.parent / "tests" / "reliability" / "stall_streamer.py"
EMBED = "all-MiniLM-L6-v2"
WHISPER = "whisper-tiny.en"


def _schema(properties: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "maxLength": 5} for i in range(properties)},
    }


def tool_history_body() -> dict[str, Any]:
    """Tools, and calls in the history whose arguments are not JSON (a client may echo what a
    model wrote)."""
    tools = [
        {
            "type": "function",
            "function": {"name": f"tool_{i}", "description": "d" * 40, "parameters": _schema(6)},
        }
        for i in range(3)
    ]
    history: list[dict[str, Any]] = []
    for i in range(2):
        history += [
            {"role": "user", "content": "call it"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": f"c{i}", "type": "function",
                 "function": {"name": "tool_1", "arguments": "{p1: 'x" + "x" * 40}}]},
            {"role": "tool", "content": "ok " * 20, "tool_call_id": f"c{i}"},
        ]  # fmt: skip
    return {"model": "chat", "messages": history, "tools": tools, "max_tokens": 8}


def enum_body(count: int) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"pick": {"enum": [f"v{i}" for i in range(count)]}}}
    return {
        "model": "chat",
        "messages": [{"role": "user", "content": "pick one"}],
        "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }


def pooling_body(count: int) -> dict[str, Any]:
    return {"model": "embed", "input": [f"text number {i} " * 4 for i in range(count)]}


def gaps(path: Path) -> list[tuple[float, float]]:
    """(arrival, gap since the chunk before) of every chunk but a stream's first."""
    out, last = [], None
    for line in path.read_text().splitlines():
        if line == "restart":
            last = None
            continue
        now = float(line)
        if last is not None:
            out.append((now, now - last))
        last = now
    return out


def in_flight(server: ServerProcess, model: str) -> float:
    samples = server.labelled("trio_llm_replica_num_requests_in_flight")
    return sum(v for key, v in samples.items() if key and key[0] == model)


def transcribe(url: str, audio: bytes, name: str) -> float:
    start = time.monotonic()
    reply = httpx.post(
        url + "/v1/audio/transcriptions",
        files={"file": (name, audio, "audio/mpeg")},
        data={"model": "whisper", "language": "en"},
        timeout=600,
    )
    reply.raise_for_status()
    return time.monotonic() - start


def _upload(url: str, file: bytes) -> socket.socket:
    """A streamed transcription request of `file` on a raw connection (its body sent from a
    thread), so that closing the socket hangs up at once, whatever the server is doing."""
    host, port = url.removeprefix("http://").split(":")
    boundary = "stalls-bench"
    fields = "".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
        for k, v in {"model": "whisper", "language": "en", "stream": "true"}.items()
    )
    body = (
        (
            f"{fields}--{boundary}\r\n"
            'Content-Disposition: form-data; name="file"; filename="long.mp3"\r\n'
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
    conn = socket.create_connection((host, int(port)), timeout=600)

    def send() -> None:
        with contextlib.suppress(OSError):  # closed under it: the hang-up
            conn.sendall(head + body)

    threading.Thread(target=send, daemon=True).start()
    return conn


HANG_UP_AFTER = 1.0
"""Seconds from the request reaching the engine to the hang-up: its samples are all sent by
then (about 0.2 s for 30 minutes here), so the engine is computing its features."""


def _hang_up_when_in_flight(server: ServerProcess, file: bytes, then: Any) -> None:
    """Send the long file; `HANG_UP_AFTER` seconds after the engine has it, call `then()`;
    hang up and wait until the frontend is done with it."""
    conn = _upload(server.url, file)
    deadline = time.monotonic() + 300
    while in_flight(server, "whisper") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(HANG_UP_AFTER)
    then()
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    conn.close()
    while in_flight(server, "whisper") > 0:
        assert time.monotonic() < deadline + 600
        time.sleep(0.01)


def audio_case(server: ServerProcess, long_file: bytes, short_file: bytes) -> dict[str, float]:
    """The short clip alone; then beside the long file; then right after hanging up on the
    long file (the frontend forgets it at once, but the engine drops it only between two
    steps: were its features one step, the clip would wait for them)."""
    alone = transcribe(server.url, short_file, "short.mp3")
    beside: list[float] = []
    _hang_up_when_in_flight(
        server, long_file, lambda: beside.append(transcribe(server.url, short_file, "short.mp3"))
    )
    _hang_up_when_in_flight(server, long_file, lambda: None)
    after = transcribe(server.url, short_file, "short.mp3")
    return {"alone": alone, "beside": beside[0], "after": after}


def speech_files(seconds: float) -> tuple[bytes, bytes]:
    from speech_audio import RATE, encode, long_speech

    pcm = long_speech(seconds)[: int(seconds * RATE)]
    return encode(pcm, "mp3", "libmp3lame"), encode(pcm[: 6 * RATE], "mp3", "libmp3lame")


def run_source(
    name: str, src: str, model: str, files: tuple[bytes, bytes], args: argparse.Namespace
) -> dict[str, Any]:
    os.environ["PYTHONPATH"] = str(Path(src).resolve())
    cases: dict[str, Any] = {}
    with (
        run_server(
            model,
            f"{EMBED}:name=embed,dtype=float32",
            f"{WHISPER}:name=whisper,threads=1",
            "--kv-cache-memory", "64MiB",
            "--shutdown-timeout", "2",
        ) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):  # fmt: skip
        times = Path(tmp) / "times"
        canary = subprocess.Popen([sys.executable, str(STREAMER), server.url, str(times), "3600"])
        try:
            deadline = time.monotonic() + 120
            while not times.exists() or len(times.read_text().splitlines()) < 100:
                assert time.monotonic() < deadline and canary.poll() is None
                time.sleep(0.1)
            time.sleep(args.baseline)
            marks: list[tuple[str, float, float, str]] = [
                ("baseline (nothing beside)", 0.0, time.time(), "")
            ]
            posts = [
                ("first tool-history request", "/v1/chat/completions", tool_history_body()),
                (f"{args.choices:,}-value enum grammar", "/v1/chat/completions",
                 enum_body(args.choices)),
                (f"{args.inputs:,}-input /pooling", "/pooling", pooling_body(args.inputs)),
            ]  # fmt: skip
            with httpx.Client(base_url=server.url, timeout=600) as client:
                for label, route, body in posts:
                    start = time.time()
                    reply = client.post(route, content=json.dumps(body).encode(),
                                        headers={"Content-Type": "application/json"})  # fmt: skip
                    marks.append((label, start, time.time(), str(reply.status_code)))
                    time.sleep(0.5)
            start = time.time()
            cases["audio"] = audio_case(server, *files)
            marks.append(
                (f"{args.audio_seconds / 60:.1f}-minute audio file", start, time.time(), "")
            )
            time.sleep(0.5)
        finally:
            canary.terminate()
            canary.wait(10)
        all_gaps = gaps(times)
    before = [g for t, g in all_gaps if t < marks[0][2]]
    cases["step"] = statistics.median(before)
    rows = []
    for label, start, end, status in marks:
        during = [g for t, g in all_gaps if start <= t <= end + 0.3] if start else before
        largest = max(during, default=0.0)
        rows.append((label, status, end - start if start else 0.0, largest))
        print(f"{name}: {label}: {status} largest gap {largest * 1e3:.0f} ms", flush=True)
    cases["rows"] = rows
    print(f"{name}: audio {cases['audio']}", flush=True)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sources", nargs="+", default=["this=src"], help="NAME=PATH: source trees to serve"
    )
    parser.add_argument(
        "--model",
        choices=["default", "tiny"],
        default="default",
        help="the canary's model: the embedded default (a real prefill's cost) or the tests' "
        "tiny random Llama",
    )
    parser.add_argument("--audio-seconds", type=float, default=1790.0)
    parser.add_argument("--choices", type=int, default=10_000)
    parser.add_argument("--inputs", type=int, default=2048)
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds of canary alone")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "stalls.md")
    args = parser.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny_models import build_tiny_model
    from trio_llm.config import DEFAULT_MODEL
    from trio_llm.model_files import load_tokenizer, resolve_model

    print(f"# {hostinfo.describe()}", flush=True)
    files = speech_files(args.audio_seconds)
    with tempfile.TemporaryDirectory() as tmp:
        model = f"{DEFAULT_MODEL}:name=chat"
        if args.model == "tiny":
            tiny = build_tiny_model(
                Path(tmp) / "tiny", load_tokenizer(resolve_model(None)), LlamaConfig,
                LlamaForCausalLM, seed=0, intermediate_size=128,
            )  # fmt: skip
            model = f"{tiny}:name=chat,dtype=float32"
        results = {}
        for source in args.sources:
            name, _, path = source.partition("=")
            results[name] = run_source(name, path, model, files, args)
    names = list(results)
    lines = [
        *hostinfo.heading(
            "Does one request stall the others?",
            "A shared 2-core machine (other engineers' builds and tests ran beside): noisy.",
        ),
        "",
        "The canary's largest gap between two chunks while each case ran (its median gap, the "
        "step, in brackets on the baseline row). Target: no gap over 100 ms.",
        "",
        "| case | " + " | ".join(f"{n}: largest gap (status, s)" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for i, (label, *_rest) in enumerate(results[names[0]]["rows"]):
        cells = []
        for n in names:
            _, status, took, largest = results[n]["rows"][i]
            extra = (
                f" (step {results[n]['step'] * 1e3:.0f} ms)"
                if i == 0
                else (f" ({status or 'ok'}, {took:.1f} s)")
            )
            cells.append(f"{largest * 1e3:.0f} ms{extra}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"The audio file ({args.audio_seconds:.0f} s of espeak-ng speech, MP3): a 6-second clip "
        "transcribed alone, then beside it (sent a second after the file reached the engine), "
        "and right after hanging up on the file (a second after it reached the engine, its "
        "features being computed: the engine drops it between two steps).",
        "",
        "| source | clip alone s | clip beside the long file s | clip after hanging up s |",
        "|---|---|---|---|",
        *(
            f"| {n} | {r['audio']['alone']:.2f} | {r['audio']['beside']:.2f} | "
            f"{r['audio']['after']:.2f} |"
            for n, r in results.items()
        ),
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
