"""Pictures in chat at a real model's shapes (issue 41's targets), side by side in one run, on
one real server (`trio-llm serve DIR`, float32) and transformers in this process:

(a) the same picture asked about twice: the second request's TTFT against the first's (the
    prefix cache keys the picture's blocks by its digest, so the second skips the vision tower
    and the prefill; target <= 0.5x);
(b) mixed requests (every other one with its own picture, the rest text only), c=8 through the
    server, against transformers' `generate` on the same prompts one request at a time, with
    the same number of new tokens (`ignore_eos` / `min_new_tokens`; target >= 2x tok/s); then
    the same requests without their pictures, and the vision tower's time for one picture,
    which say what limits (b): the tower runs once per picture in both systems, and only the
    decoder's steps batch.

One torch thread each by default: on a shared 2-core machine a 2-thread matmul of 8 rows took
4-6x as long as a 1-thread one (a thread descheduled at each barrier), while one row (what
`generate` one at a time multiplies) did not, which would measure the neighbours, not the
engine.

The model is SmolVLM-256M's shapes with random weights, built from transformers' config classes
and saved to a temporary directory: a SigLIP tower (768 wide, 12 layers, 512x512 at patch 16),
the pixel-shuffle connector (scale 4: 64 placeholders a tile), the SmolLM2-135M decoder (576
wide, 30 layers); the tokenizer is the default model's (SmolLM2's, which SmolVLM's extends)
with SmolVLM's image tokens. The processor's `longest_edge` is 512 (SmolVLM's documented
`size={"longest_edge": N*512}` with N=1): one tile per picture. Its default, 2048, makes 17
tiles (54 MB of float32 pixels), past the request ring's bound (README, Images). Each round has
fresh pictures, the same for both systems, so (b) never hits the cache for them; the load
average before each part is printed.

    python bench/apis/images.py --pairs 3 --requests 8 --max-tokens 128 --rounds 2
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it
sys.path.insert(0, str(BENCH.parent / "tests"))  # the server process the tests use

import hostinfo  # noqa: E402
from http_server_process import run_server  # noqa: E402

RESULTS = BENCH / "results" / "images.md"
MODEL = "smolvlm-256m-random"
CONCURRENCY = 8
SPECIALS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
QUESTIONS = [
    "Describe this picture in detail.",
    "What colours do you see, and where?",
    "Write a short story about what is shown here.",
    "List every shape you can find in it.",
]
TEXTS = [
    "Explain how a bicycle stays upright.",
    "Write a haiku about the sea in winter.",
    "What is the capital of France, and why?",
    "Give three tips for learning to cook.",
]


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def build_model(path: Path) -> None:
    """SmolVLM-256M's shapes, random weights, with a processor that tiles nothing."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    from trio_llm.model_files import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model(None))
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    images = Idefics3ImageProcessor(
        size={"longest_edge": 512}, max_image_size={"longest_edge": 512}, do_image_splitting=True
    )
    processor = Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=64)
    text = LlamaConfig(
        vocab_size=49280,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = Idefics3VisionConfig(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        image_size=512,
        patch_size=16,
    )
    config = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=4,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(config).eval()
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    processor.save_pretrained(path)


def png(seed: int) -> bytes:
    """A 480x640 picture of coarse random blocks (PNG keeps it small, unlike noise)."""
    import numpy as np
    from PIL import Image

    blocks = np.random.default_rng(seed).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(blocks).resize((640, 480), Image.NEAREST).save(out, format="PNG")
    return out.getvalue()


def messages(question: str, picture: bytes | None) -> list[dict[str, Any]]:
    if picture is None:
        return [{"role": "user", "content": question}]
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]
    return [{"role": "user", "content": parts}]


def workload(count: int, seed: int) -> list[tuple[str, bytes | None]]:
    """`count` requests: even ones a question about a fresh picture, odd ones text only (each
    numbered, so that no request finds another's answer in the prefix cache)."""
    return [
        (QUESTIONS[i // 2 % 4], png(seed + i))
        if i % 2 == 0
        else (f"{TEXTS[i // 2 % 4]} (question {seed + i})", None)
        for i in range(count)
    ]


def ttft(url: str, question: str, picture: bytes) -> float:
    body = {
        "model": MODEL,
        "messages": messages(question, picture),
        "max_tokens": 4,
        "stream": True,
    }
    start = time.perf_counter()
    first = None
    with (
        httpx.Client(base_url=url, timeout=600) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        response.raise_for_status()
        for line in response.iter_lines():  # all of it, as a client reads it
            if first is None and line.startswith("data: {"):
                # The first chunk carries the role and empty content before any token.
                choices = json.loads(line[6:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    first = time.perf_counter() - start
    assert first is not None, "no token came"
    return first


async def _served(url: str, requests: list[tuple[str, bytes | None]], max_tokens: int) -> int:
    """All requests, CONCURRENCY in flight; the completion tokens they got."""
    todo = iter(requests)
    got = [0]
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=1200, limits=limits) as client:

        async def worker() -> None:
            for question, picture in todo:
                body = {
                    "model": MODEL,
                    "messages": messages(question, picture),
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "temperature": 0,
                }
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                got[0] += response.json()["usage"]["completion_tokens"]

        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
    return got[0]


class Transformers:
    """transformers' own model and processor on the same directory, one request at a time."""

    def __init__(self, path: Path, threads: int) -> None:
        import torch
        from transformers import AutoProcessor, Idefics3ForConditionalGeneration

        torch.set_num_threads(threads)
        self.processor = AutoProcessor.from_pretrained(path, use_fast=False)
        self.model = Idefics3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
        self.model.eval()

    def run(self, requests: list[tuple[str, bytes | None]], max_tokens: int) -> tuple[int, int]:
        """Generated and prompt tokens over all requests."""
        import torch
        from PIL import Image

        new = prompt = 0
        for question, picture in requests:
            images = None
            if picture is not None:
                # As the server renders a picture: its image token where the part was.
                question = self.processor.image_token + question
                images = [[Image.open(io.BytesIO(picture)).convert("RGB")]]
            text = self.processor.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
            )
            inputs = self.processor(text=[text], images=images, return_tensors="pt")
            with torch.inference_mode():
                out = self.model.generate(
                    **inputs,
                    max_new_tokens=max_tokens,
                    min_new_tokens=max_tokens,
                    do_sample=False,
                    pad_token_id=0,
                )
            length = inputs["input_ids"].shape[1]
            prompt += length
            new += out.shape[1] - length
        return new, prompt


def tower_seconds(reference: Transformers, picture: bytes) -> float:
    """One picture through transformers' vision tower and connector: the work neither system
    can batch away (the engine runs it once per picture, as `generate` does)."""
    import torch
    from PIL import Image

    image = Image.open(io.BytesIO(picture)).convert("RGB")
    pixels = reference.processor.image_processor(image, return_tensors="pt")["pixel_values"]
    start = time.perf_counter()
    with torch.inference_mode():
        reference.model.model.get_image_features(pixel_values=pixels)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="(a): pictures asked about twice")
    parser.add_argument("--requests", type=int, default=8, help="(b): requests a round")
    parser.add_argument("--max-tokens", type=int, default=128, help="(b): new tokens a request")
    parser.add_argument("--rounds", type=int, default=2, help="(b): rounds, systems alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both systems")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    print(f"# {hostinfo.machine()}", flush=True)
    rates: dict[tuple[str, str], list[float]] = {}
    towers: list[float] = []
    with tempfile.TemporaryDirectory(prefix="smolvlm-") as tmp:
        path = Path(tmp) / MODEL
        build_model(path)
        reference = Transformers(path, args.threads)
        with run_server(
            str(path), "--dtype", "float32", "--num-threads", str(args.threads)
        ) as server:
            # A warm-up of both systems, on pictures used nowhere else.
            ttft(server.url, QUESTIONS[0], png(10_000))
            trio.run(_served, server.url, workload(2, 10_100), 4)
            reference.run(workload(2, 10_200), 4)

            firsts, seconds = [], []
            for pair in range(args.pairs):
                picture = png(20_000 + pair)
                load = load_average()
                firsts.append(ttft(server.url, QUESTIONS[pair % 4], picture))
                seconds.append(ttft(server.url, QUESTIONS[pair % 4], picture))
                print(
                    f"(a) pair {pair + 1}: first {firsts[-1]:.3f} s, second {seconds[-1]:.3f} s "
                    f"(load {load:.2f})",
                    flush=True,
                )

            prompts = 0
            for r in range(args.rounds):
                towers.append(tower_seconds(reference, png(25_000 + r)))
                print(f"(b) round {r + 1}: the tower takes {towers[-1]:.2f} s a picture")
                mixed = workload(args.requests, 30_000 + 1000 * r)
                text = [(f"{q} (no picture, round {r})", None) for q, _ in mixed]
                order = ["trio-llm", "transformers"]
                for kind, requests in [("mixed", mixed), ("text", text)]:
                    for name in order if r % 2 == 0 else order[::-1]:
                        load = load_average()
                        start = time.perf_counter()
                        if name == "trio-llm":
                            made = trio.run(_served, server.url, requests, args.max_tokens)
                        else:
                            made, prompt = reference.run(requests, args.max_tokens)
                            prompts = prompt if kind == "mixed" else prompts
                        elapsed = time.perf_counter() - start
                        assert made == args.requests * args.max_tokens, made
                        rates.setdefault((kind, name), []).append(made / elapsed)
                        print(
                            f"(b) round {r + 1} {kind} {name}: {made} tokens in {elapsed:.1f} s "
                            f"= {made / elapsed:.1f} tok/s (load {load:.2f})",
                            flush=True,
                        )
    write_report(args, firsts, seconds, rates, towers, prompts)


def write_report(
    args: argparse.Namespace,
    firsts: list[float],
    seconds: list[float],
    rates: dict[tuple[str, str], list[float]],
    towers: list[float],
    prompts: int,
) -> None:
    first, second = statistics.median(firsts), statistics.median(seconds)
    ttft_ratio = second / first
    rows = []
    for kind, what in [
        ("mixed", "every other request with a picture (the target)"),
        ("text", "the same requests without their pictures"),
    ]:
        ours = statistics.median(rates[kind, "trio-llm"])
        theirs = statistics.median(rates[kind, "transformers"])
        speedup = ours / theirs
        target = f">= 2x | {'yes' if speedup >= 2 else 'no'}" if kind == "mixed" else "- | -"
        rows.append(
            f"| (b) tok/s, {args.requests} requests x {args.max_tokens} tokens, {what} "
            f"(median of {len(rates[kind, 'trio-llm'])} rounds) | {ours:.1f} (c={CONCURRENCY}) "
            f"| {theirs:.1f} (generate, one at a time) | {speedup:.2f}x | {target} |"
        )
    runs = "; ".join(
        f"{kind} {name} {', '.join(f'{t:.1f}' for t in values)}"
        for (kind, name), values in rates.items()
    )
    lines = [
        *hostinfo.heading(
            "Images: the prefix cache on a repeated picture, and mixed traffic against "
            "transformers",
            f"float32, {args.threads} torch thread(s) each; SmolVLM-256M's shapes, random "
            "weights, one 512x512 tile a picture (64 placeholders).",
        ),
        "",
        "| measure | trio-llm | reference | ratio | target | met |",
        "|---|---|---|---|---|---|",
        f"| (a) TTFT, same picture again (median of {len(firsts)} pairs) | second "
        f"{second:.3f} s | first {first:.3f} s | {ttft_ratio:.2f}x | <= 0.5x | "
        f"{'yes' if ttft_ratio <= 0.5 else 'no'} |",
        *rows,
        "",
        "(a) runs (first / second, s): "
        + ", ".join(f"{a:.3f} / {b:.3f}" for a, b in zip(firsts, seconds, strict=True)),
        f"(b) runs (tok/s): {runs}. transformers' mixed prompts: {prompts} tokens a round. "
        f"The vision tower alone (transformers, {args.threads} thread(s)): "
        f"{', '.join(f'{t:.2f}' for t in towers)} s a picture.",
    ]
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
