"""A choice's output text, grown one decoded piece at a time in time linear in its length.

`text += piece` on a string that lives in an object copies the whole text every time, which is
quadratic in the output's length (a 16k-token answer copies its text 16k times). Here the text
is a list of pieces: appending is O(len(piece)), and everything the output processor reads per
token (the tail that stop strings are matched against, the part not yet streamed) is a slice of
its end, whose cost depends on that slice, not on the length of the text. The whole text is
joined only when asked for (a final or cumulative output), once per ask.
"""

from __future__ import annotations


class OutputText:
    __slots__ = ("_length", "_parts")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def append(self, piece: str) -> None:
        if piece:
            self._parts.append(piece)
            self._length += len(piece)

    def slice(self, start: int, end: int | None = None) -> str:
        """`str(self)[start:end]`, in time proportional to what lies from `start` to the end."""
        if end is None:
            end = self._length
        elif end < 0:
            end = max(self._length + end, 0)
        else:
            end = min(end, self._length)
        if start >= end:
            return ""
        if start <= 0 and end == self._length:
            return str(self)
        taken: list[str] = []
        position = self._length  # where the part being looked at ends
        for part in reversed(self._parts):
            begin = position - len(part)
            if begin < end:
                taken.append(part[max(start - begin, 0) : end - begin])
            position = begin
            if position <= start:
                break
        return "".join(reversed(taken))

    def tail(self, count: int) -> str:
        """The last `count` characters (all of them, if fewer)."""
        return self.slice(max(self._length - count, 0))

    def truncate(self, end: int) -> None:
        """Drop everything from `end` on (a stop string's cut, always near the end)."""
        while self._length > end:
            part = self._parts.pop()
            self._length -= len(part)
            if self._length < end:
                self._parts.append(part[: end - self._length])
                self._length = end
