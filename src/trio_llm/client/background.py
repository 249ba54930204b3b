"""Background work: requests made inside `background_work()` reach the engine marked
`background`, so its scheduler serves them only with what interactive requests leave
(engine/step/scheduler.py).

Why a context variable and not a parameter: a batch's line runs through its endpoint's own
handler (http/batch/lines.py), the same code an online request runs, down to the engine
client; a parameter would be threaded through every handler and every client call for the one
caller that sets it. The mark follows the task that makes the request, and the tasks it starts,
and nothing else: an interactive request handled meanwhile in another task is never marked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_BACKGROUND: ContextVar[bool] = ContextVar("trio_llm_background", default=False)


@contextmanager
def background_work() -> Iterator[None]:
    """Mark the engine requests made in this block (and in tasks started from it) background."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


def in_background() -> bool:
    """Whether a request made here is background work."""
    return _BACKGROUND.get()
