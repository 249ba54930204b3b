"""Admission control: how many sequences may be in the server at once before new work gets 503.

One admission per served model. Its capacity is, per live replica, --max-num-seqs (running)
plus --max-queued-requests (waiting, by default as many), so it shrinks while a replica is
down and one model's overload never refuses another's requests. Counting happens
at the HTTP edge, before any tokenizing, so a refused request costs almost nothing and memory
stays bounded under overload. Invariant: every admitted ticket is released exactly once, when
its request's ASGI call ends (however it ends), so the count never leaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from trio_llm.http.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class AdmissionStatistics:
    admitted: int
    """Sequences admitted and not yet released."""
    capacity: int | None
    rejected: int
    """Requests refused since start."""


class Ticket:
    __slots__ = ("_admission", "_sequences")

    def __init__(self, admission: Admission, sequences: int) -> None:
        self._admission: Admission | None = admission
        self._sequences = sequences

    def release(self) -> None:
        """Idempotent, so the safety net and the normal path may both call it."""
        if self._admission is not None:
            self._admission._admitted -= self._sequences
            self._admission = None


class Admission:
    def __init__(self, capacity: int | None, *, retry_after_s: int = 1) -> None:
        self.capacity = capacity
        """None: no limit. The app sets it before each admission (it follows live replicas)."""
        self._retry_after = str(retry_after_s)
        self._admitted = 0
        self._rejected = 0

    def admit_nowait(self, sequences: int) -> Ticket:
        """Admit `sequences` or raise a 503. A request bigger than the whole capacity is still
        admitted when nothing else is in, so no valid request is refused forever."""
        if (
            self.capacity is not None
            and self._admitted + sequences > self.capacity
            and self._admitted > 0
        ):
            self._rejected += 1
            raise ProtocolError(
                503,
                f"The model is at capacity ({self.capacity} sequences running or queued); "
                "retry later",
                code="server_overloaded",
                headers={"Retry-After": self._retry_after},
            )
        self._admitted += sequences
        return Ticket(self, sequences)

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(self._admitted, self.capacity, self._rejected)
