"""The frontend's side of an engine's LoRA adapters: which are loaded, and the loads and unloads
on their way to the engine.

A load or unload is a message to the engine (`LoadLora`, `UnloadLora`) answered by one
`LoraUpdated` with the same update id; the engine answers in the order it was asked. The
client's table gains an adapter when the answer is read (by the output handler, in the
engine's order, whatever the order in which the callers wake up), and loses one as soon as its
unload is sent, so the table never names an adapter the engine would refuse a request for.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from trio_llm.client.errors import LoraError, LoraNotFoundError
from trio_llm.ipc.messages import LoadLora, LoraUpdated, UnloadLora


@dataclass(frozen=True, slots=True)
class LoraRequest:
    """An adapter to generate with, by name and PEFT directory (vLLM's `LoRARequest`): loaded
    on first use when no adapter of that name is."""

    name: str
    path: str


def routing_salt(cache_salt: str | None, lora: str | LoraRequest | None) -> str | None:
    """The salt a request's prompt blocks are keyed by for cache-aware routing
    (`prefix_index.block_keys`): an adapter's blocks are its own in the engine's prefix cache,
    so a replica that holds the base's (or another adapter's) blocks of the prompt holds none
    of them."""
    if lora is None:
        return cache_salt
    name = lora.name if isinstance(lora, LoraRequest) else lora
    return f"{cache_salt or ''}\x00lora:{name}"


class _Update:
    __slots__ = ("_done", "error", "message")

    def __init__(self, message: LoadLora | UnloadLora) -> None:
        self.message = message
        self.error: BaseException | None = None
        self._done = anyio.Event()

    def finish(self, error: BaseException | None) -> None:
        self.error = error
        self._done.set()

    async def wait(self) -> None:
        await self._done.wait()
        if self.error is not None:
            raise self.error


class LoraTable:
    """The adapters an engine serves (name -> directory), and its updates in flight."""

    def __init__(self, enabled: bool, loaded: dict[str, str]) -> None:
        self.enabled = enabled
        self.loaded = dict(loaded)
        self._pending: dict[int, _Update] = {}
        self._ids = itertools.count(1)

    def check(self, name: str) -> None:
        """`LoraNotFoundError` unless `name` is loaded."""
        if name not in self.loaded:
            raise LoraNotFoundError(self.not_found(name))

    def not_found(self, name: str) -> str:
        if not self.enabled:
            return f"the LoRA adapter {name!r} is not loaded: LoRA is not enabled (enable_lora)"
        loaded = ", ".join(repr(n) for n in self.loaded) or "none"
        return f"the LoRA adapter {name!r} is not loaded (loaded: {loaded})"

    def load(self, name: str, path: str) -> tuple[LoadLora | UnloadLora, _Update]:
        """The message to send and what to wait on (`LoraError` with the engine's reason)."""
        if not self.enabled:
            raise LoraError("LoRA is not enabled on this engine (enable_lora)")
        if name in self.loaded:
            raise LoraError(f"a LoRA adapter named {name!r} is loaded already")
        return self._add(LoadLora(update_id=next(self._ids), name=name, path=path))

    def pending_load(self, name: str) -> _Update | None:
        """A load of `name` on its way (to wait on rather than load it twice)."""
        for update in self._pending.values():
            if isinstance(update.message, LoadLora) and update.message.name == name:
                return update
        return None

    def unload(self, name: str) -> tuple[LoadLora | UnloadLora, _Update]:
        """The name leaves the table at once: a request sent after the unload would reach the
        engine after it, and be refused there."""
        self.check(name)
        del self.loaded[name]
        return self._add(UnloadLora(update_id=next(self._ids), name=name))

    def _add(self, message: LoadLora | UnloadLora) -> tuple[LoadLora | UnloadLora, _Update]:
        update = self._pending[message.update_id] = _Update(message)
        return message, update

    def answered(self, answer: LoraUpdated) -> None:
        """The engine's answer: update the table and wake the caller."""
        update = self._pending.pop(answer.update_id, None)
        if update is None:
            return
        message = update.message
        if answer.error is not None:
            kind = LoraNotFoundError if answer.not_found else LoraError
            update.finish(kind(answer.error))
            return
        if isinstance(message, LoadLora):
            self.loaded[message.name] = message.path
        else:
            self.loaded.pop(message.name, None)
        update.finish(None)

    def fail_all(self, make_error: Callable[[], BaseException]) -> None:
        for update in self._pending.values():
            update.finish(make_error())
        self._pending.clear()
