"""Speech to text side by side, in one run: faster-whisper used directly (`WhisperModel.transcribe`
on each file in turn, and from 4 Python threads with `num_workers=4`, the library's own way to
run several at once), trio-llm offline (`LLM.transcribe`, every file in one call: the engine
batches their windows), and trio-llm over HTTP (`/v1/audio/transcriptions`, one file per
request, at concurrency 1 and 4), on the same model (whisper-tiny.en), CTranslate2 thread count
and compute type, on a few minutes of espeak-ng speech in MP3 files (each system decodes them
itself, with PyAV).

The systems run in rounds, in a rotated order each round, so that whatever else the machine does
falls on all of them alike; every run records the load average before it. The figure is the
real-time factor (wall seconds per second of audio: lower is faster) and its inverse, audio
seconds per wall second; "vs library" is throughput over the sequential library's. Beside the
wall clock, each run's CPU seconds: the library's are this process's, trio-llm's those of its
processes (engine, and the server's frontend for HTTP), which a loaded machine disturbs less
than the wall clock. The HTTP load generator runs in this process, on the same cores as the
server.

    python bench/apis/speech.py --threads 2 --rounds 2 --clips 8 --seconds 45
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import trio

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it
sys.path.insert(0, str(BENCH.parent / "tests"))  # the tests' speech and their server process

import hostinfo  # noqa: E402
from http_server_process import run_server  # noqa: E402
from speech_audio import SENTENCES, encode, long_speech, word_error_rate  # noqa: E402

MODEL = "whisper-tiny.en"
Run = Callable[[list[bytes]], list[str]]


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds of these processes (0 for this one: its own usage)."""
    total = 0.0
    for pid in pids:
        if pid == 0:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            total += usage.ru_utime + usage.ru_stime
            continue
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def clips(count: int, seconds: float) -> list[bytes]:
    """`count` MP3 files of about `seconds` each, each starting at a different sentence."""
    speech = long_speech(seconds * count + 60)
    step = int(seconds * 16_000)
    out = []
    for i in range(count):
        offset = i * step + (i % len(SENTENCES)) * 8_000
        out.append(encode(speech[offset : offset + step], "mp3", "libmp3lame"))
    return out


def library_run(threads: int, compute_type: str, workers: int) -> Run:
    from faster_whisper import WhisperModel

    from trio_llm.model_files import resolve_model

    model = WhisperModel(
        str(resolve_model(MODEL).path),
        device="cpu",
        compute_type=compute_type,
        cpu_threads=threads,
        num_workers=workers,
    )

    def one(file: bytes) -> str:
        segments, _ = model.transcribe(io.BytesIO(file), language="en")
        return "".join(s.text for s in segments).strip()

    if workers == 1:
        return lambda files: [one(f) for f in files]
    pool = ThreadPoolExecutor(workers)
    return lambda files: list(pool.map(one, files))


def offline_run(llm: object) -> Run:
    def run(files: list[bytes]) -> list[str]:
        return [o.text for o in llm.transcribe(files)]  # type: ignore[attr-defined]

    return run


def http_run(url: str, concurrency: int) -> Run:
    def run(files: list[bytes]) -> list[str]:
        return trio.run(_http, url, files, concurrency)

    return run


async def _http(url: str, files: list[bytes], concurrency: int) -> list[str]:
    texts = [""] * len(files)
    todo = iter(range(len(files)))
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def worker() -> None:
            for i in todo:
                response = await client.post(
                    "/v1/audio/transcriptions",
                    files={"file": (f"clip{i}.mp3", files[i], "audio/mpeg")},
                    data={"model": MODEL, "language": "en"},
                )
                response.raise_for_status()
                texts[i] = response.json()["text"]

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="CTranslate2 threads, every system")
    parser.add_argument("--compute-type", default="default", help="CTranslate2 compute type")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=45.0, help="length of each clip")
    args = parser.parse_args()

    import trio_llm
    from trio_llm.speech.audio import decode_audio

    files = clips(args.clips, args.seconds)
    audio = sum(decode_audio(f).size for f in files) / 16_000
    print(f"# {hostinfo.describe()}")
    print(
        f"# {len(files)} MP3 clips, {audio:.0f} s of espeak-ng speech in all; {MODEL}, compute "
        f"type {args.compute_type}, {args.threads} threads, {args.rounds} rounds"
    )
    spec = f"{MODEL}:threads={args.threads},compute={args.compute_type}"
    with (
        trio_llm.LLM(MODEL, num_threads=args.threads, compute_type=args.compute_type) as llm,
        run_server(spec) as server,
    ):
        systems: dict[str, Run] = {
            "faster-whisper transcribe, one file at a time": library_run(
                args.threads, args.compute_type, 1
            ),
            "faster-whisper transcribe, 4 threads (num_workers=4)": library_run(
                args.threads, args.compute_type, 4
            ),
            "trio-llm offline (LLM.transcribe, all files at once)": offline_run(llm),
            "trio-llm HTTP, c=1": http_run(server.url, 1),
            "trio-llm HTTP, c=4": http_run(server.url, 4),
        }
        engine = [llm._loop.client.pid]  # type: ignore[union-attr]
        served = [server.process.pid, server.engine_pid()]
        processes = dict(zip(systems, [[0], [0], engine, served, served], strict=True))
        names = list(systems)
        reference = systems[names[0]](files[:1])
        for name in names:  # warm-up, and the texts agree
            got = systems[name](files[:1])
            wer = max(word_error_rate(r, g) for r, g in zip(reference, got, strict=True))
            print(f"# warm-up {name}: largest WER against the library's text {wer:.3f}")
        times: dict[str, list[float]] = {name: [] for name in names}
        cpus: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                load = load_average()
                cpu = cpu_seconds(processes[name])
                start = time.perf_counter()
                systems[name](files)
                elapsed = time.perf_counter() - start
                cpus[name].append(cpu_seconds(processes[name]) - cpu)
                times[name].append(elapsed)
                print(
                    f"round {r + 1} {name}: {elapsed:.2f} s, {cpus[name][-1]:.1f} CPU s "
                    f"(load {load:.2f})",
                    flush=True,
                )
    base = statistics.median(times[names[0]])
    print()
    base_cpu = statistics.median(cpus[names[0]])
    print(
        "| system | median s | RTF | audio s per s | vs library (one at a time) | CPU s | "
        "CPU vs library | runs (s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        median = statistics.median(times[name])
        cpu = statistics.median(cpus[name])
        runs = ", ".join(f"{t:.1f}" for t in times[name])
        print(
            f"| {name} | {median:.2f} | {median / audio:.3f} | {audio / median:.1f} | "
            f"{base / median:.2f}x | {cpu:.1f} | {base_cpu / cpu:.2f}x | {runs} |"
        )


if __name__ == "__main__":
    main()
