"""Run as a script by test_stall.py: stream greedy completions from the server at URL for
SECONDS, writing the arrival time of every chunk to OUT (a line `restart` between streams). It
runs in a process of its own, so that what the test does to send its hostile bodies (encoding a
17 MB body, say) never delays the reading it measures."""

from __future__ import annotations

import sys
import time

import httpx


def main(url: str, out: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    body = {"prompt": "Hello", "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=url, timeout=120) as client, open(out, "w") as times:
        while time.monotonic() < end:
            with client.stream("POST", "/v1/completions", json={**body, "temperature": 0}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        times.write(f"{time.time()}\n")
                        times.flush()
                    if time.monotonic() > end:
                        break
            times.write("restart\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
