"""Watch which threads use which tokenizer instance, and catch two threads inside one instance
at once: what makes the `tokenizers` library raise "Already borrowed".

Each call of the watched methods holds its instance for a moment longer than the call itself
(a short sleep), so that overlapping uses, which a real tokenizer makes rare and
timing-dependent, are caught reliably.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

METHODS = ("encode", "decode", "apply_chat_template", "convert_ids_to_tokens")
HOLD = 0.002
"""Seconds each call keeps its instance after returning."""


@dataclass
class TokenizerUse:
    threads: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    """id(instance) -> the threads that called it."""
    overlaps: list[str] = field(default_factory=list)
    """One line per moment two threads were inside one instance."""
    _inside: dict[int, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, instance: object, method: str) -> None:
        key, me = id(instance), threading.get_ident()
        with self._lock:
            self.threads[key].add(me)
            inside = self._inside[key]
            if any(thread != me for thread in inside):
                self.overlaps.append(f"{method} on thread {me} while {sorted(inside)} inside")
            inside[me] = inside.get(me, 0) + 1

    def leave(self, instance: object) -> None:
        key, me = id(instance), threading.get_ident()
        time.sleep(HOLD)
        with self._lock:
            inside = self._inside[key]
            inside[me] -= 1
            if not inside[me]:
                del inside[me]


@contextmanager
def watch_tokenizer_use(monkeypatch: pytest.MonkeyPatch, cls: type) -> Iterator[TokenizerUse]:
    use = TokenizerUse()

    def watched(method: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(self: object, *args: Any, **kwargs: Any) -> Any:
            use.enter(self, method)
            try:
                return fn(self, *args, **kwargs)
            finally:
                use.leave(self)

        return call

    for method in METHODS:
        monkeypatch.setattr(cls, method, watched(method, getattr(cls, method)))
    yield use
