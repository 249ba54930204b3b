"""The wire types of OpenAI's Files and Batch APIs (/v1/files, /v1/batches) and of a batch's
input and output lines, as OpenAI documents them (the `openai` SDK reads these shapes).

Invariant: nothing here touches Quart, the disk or the engine; a `BatchObject` is also what the
batch store writes as its state file, so the state on disk and the answer are one value.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct, field

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""What a batch's lines may call: the endpoints whose handlers the runner reuses."""

COMPLETION_WINDOWS = {"24h": 24 * 3600}
"""OpenAI accepts only 24h; seconds by name."""

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
"""The statuses the runner still has work for (a restarted server resumes them)."""


class FileObject(Struct, kw_only=True, omit_defaults=False):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: Literal["file"] = "file"
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(Struct, kw_only=True):
    data: list[FileObject]
    object: Literal["list"] = "list"
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class FileDeleted(Struct, kw_only=True):
    id: str
    deleted: bool = True
    object: Literal["file"] = "file"


class BatchError(Struct, kw_only=True):
    """One reason a batch failed validation; `line` is 1-based, as OpenAI counts."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(Struct, kw_only=True):
    data: list[BatchError]
    object: Literal["list"] = "list"


class RequestCounts(Struct, kw_only=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchObject(Struct, kw_only=True, omit_defaults=False):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    object: Literal["batch"] = "batch"
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None


class BatchList(Struct, kw_only=True):
    data: list[BatchObject]
    object: Literal["list"] = "list"
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class CreateBatch(Struct, kw_only=True, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None
    """Accepted and not acted on: files here live until deleted."""


class InputLine(Struct, kw_only=True):
    """One request of a batch's input file (and of `trio-llm run-batch`'s, vLLM's format)."""

    custom_id: str
    url: str
    body: dict[str, Any]
    method: str = "POST"


class LineResponse(Struct, kw_only=True, omit_defaults=False):
    status_code: int
    request_id: str
    body: Any


class LineError(Struct, kw_only=True, omit_defaults=False):
    code: str
    message: str


class OutputLine(Struct, kw_only=True, omit_defaults=False):
    """One line of a batch's output or error file."""

    id: str
    custom_id: str
    response: LineResponse | None
    error: LineError | None = None

    @property
    def succeeded(self) -> bool:
        """Goes to the output file (else the error file, as OpenAI splits them)."""
        return self.error is None and self.response is not None and self.response.status_code < 400
