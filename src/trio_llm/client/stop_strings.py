"""Stop strings, checked in the frontend on detokenized text (the engine sees only token ids).

Invariant kept with the output processor: text that might be the start of a stop string is held
back, never streamed, so a consumer never sees a stop string (or a piece of one) that is later cut
off. Only the part that can still grow into a stop string is held back: the longest suffix of the
text that is a proper prefix of some stop string.
"""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, new_from: int, stops: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string in `text` that ends after `new_from`, as (start, stop).

    `text[:new_from]` was checked before and holds no whole stop string, so only occurrences
    reaching into the new text are possible; each search starts just early enough to find them.
    """
    best: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop, max(0, new_from - len(stop) + 1))
        if at != -1 and (best is None or at < best[0]):
            best = (at, stop)
    return best


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of `text` could still be the start of a stop string.

    Runs once per token: only prefixes ending in the text's last character are compared, so
    the cost does not grow with the square of a stop string's length.
    """
    if not text:
        return 0
    last, longest = text[-1], 0
    for stop in stops:
        # Candidate prefixes stop[: at + 1] are proper prefixes no longer than the text.
        at = stop.rfind(last, 0, min(len(stop) - 1, len(text)))
        while at + 1 > longest:
            if text.endswith(stop[: at + 1]):
                longest = at + 1
                break
            at = stop.rfind(last, 0, at)
    return longest
