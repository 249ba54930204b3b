"""A batch's lines: reading and checking its input file, and running one line.

A line runs through the very handler of its online endpoint (`chat_completions`,
`completions`, `embeddings`: plan, prepare, route, generate, build), called in a request
context of its own with the line's body, not through an HTTP round trip: its answer is the
online answer, its errors the online errors, and it is admitted, leased and counted like any
request. The context carries the per-request cleanup stack
(`cleanup_scope`), so what the handler holds (its admission ticket, its lease) is released
when the line ends, however it ends; a line cancelled (batch cancelled, server stopping) is
aborted in the engine by the same cancellation that aborts an online request.

Invariant: validation needs no engine but the model check; `check_input` reports every bad
line (1-based, as OpenAI counts), so a failed batch names them all at once.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from trio_llm.client.background import background_work
from trio_llm.http.batch.protocol import BatchError, InputLine, LineResponse, OutputLine
from trio_llm.http.chat.endpoint import chat_completions
from trio_llm.http.completions.endpoint import completions
from trio_llm.http.embeddings.endpoint import embeddings
from trio_llm.http.errors import ProtocolError, translate_error
from trio_llm.http.runtime.middleware import cleanup_scope

HANDLERS: dict[str, Callable[[bytes], Awaitable[Response]]] = {
    "/v1/chat/completions": chat_completions,
    "/v1/completions": completions,
    "/v1/embeddings": embeddings,
}
TASKS = {
    "/v1/chat/completions": "generate",
    "/v1/completions": "generate",
    "/v1/embeddings": "embed",
}
"""The use (trio_llm.tasks) a line's model must serve."""

RETRY_LATER = 503
"""A line answered this (engine restarting, model at capacity) is not finished: it runs again."""

CheckModel = Callable[[str | None, str], str | None]
"""(the line's model, the use) -> why it is not served, or None."""


def check_input(
    content: bytes, endpoint: str | None, check_model: CheckModel
) -> tuple[list[InputLine], list[BatchError]]:
    """The input file's lines, and every reason one is refused (none: the batch may run).
    `endpoint`: what every line's url must be (None: any batch endpoint, run-batch's)."""
    lines: list[InputLine] = []
    errors: list[BatchError] = []
    seen: set[str] = set()
    for number, text in enumerate(content.splitlines(), 1):
        if not text.strip():
            continue
        try:
            raw = json.loads(text)
        except (UnicodeDecodeError, ValueError) as error:
            errors.append(BatchError(code="invalid_json_line", message=str(error), line=number))
            continue
        if not isinstance(raw, dict) or not isinstance(raw.get("custom_id"), str):
            errors.append(
                BatchError(
                    code="missing_required_parameter",
                    message="each line needs a custom_id (a string)",
                    param="custom_id",
                    line=number,
                )
            )
            continue
        try:
            line = msgspec.convert(raw, InputLine)
        except msgspec.ValidationError as error:
            errors.append(
                BatchError(code="invalid_request", message=str(error), param=None, line=number)
            )
            continue
        error = _line_error(line, endpoint, seen, check_model)
        if error is not None:
            error.line = number
            errors.append(error)
            continue
        seen.add(line.custom_id)
        lines.append(line)
    if not lines and not errors:
        errors.append(BatchError(code="empty_file", message="the input file holds no requests"))
    return lines, errors


def _line_error(
    line: InputLine, endpoint: str | None, seen: set[str], check_model: CheckModel
) -> BatchError | None:
    if line.custom_id in seen:
        return BatchError(
            code="duplicate_custom_id",
            message=f"custom_id {line.custom_id!r} is used by an earlier line",
            param="custom_id",
        )
    if line.method != "POST":
        return BatchError(code="invalid_method", message="method must be POST", param="method")
    if line.url != (endpoint or line.url) or line.url not in HANDLERS:
        wanted = endpoint or ", ".join(HANDLERS)
        return BatchError(
            code="mismatched_url",
            message=f"url {line.url!r} does not match the batch's endpoint ({wanted})",
            param="url",
        )
    model = line.body.get("model")
    why = check_model(model if isinstance(model, str) else None, TASKS[line.url])
    if why is not None:
        return BatchError(code="model_not_found", message=why, param="body.model")
    return None


def check_model_on(app_state: Any) -> CheckModel:
    """The model check against what an app's state serves (the online 404 / 400's message)."""

    def check(model: str | None, use: str) -> str | None:
        try:
            app_state.model_for(model, task=use)
        except ProtocolError as error:
            if error.status == RETRY_LATER:  # not up yet: its lines will wait for it
                return None
            return error.message
        return None

    return check


async def run_line(app: QuartTrio, line: InputLine, *, background: bool = False) -> OutputLine:
    """`line` answered by its endpoint's handler in `app`; a 503 (engine restarting, model at
    capacity) is not an answer: the line waits a second and runs again. `background`: its
    engine requests are background work, served after interactive ones (a server's batch; not
    `run-batch`, which has nothing to yield to)."""
    body = dict(line.body)
    if line.url != "/v1/embeddings":
        body.pop("stream", None)  # a batch answers whole objects
        body.pop("stream_options", None)
    raw = json.dumps(body).encode()
    line_id = uuid.uuid4().hex
    with background_work() if background else contextlib.nullcontext():
        while (answer := await _answer(app, line.url, raw))[0] == RETRY_LATER:  # noqa: ASYNC110
            await trio.sleep(1.0)
    status, payload = answer
    return OutputLine(
        id=f"batch_req_{line_id}",
        custom_id=line.custom_id,
        response=LineResponse(status_code=status, request_id=line_id, body=payload),
    )


async def _answer(app: QuartTrio, url: str, raw: bytes) -> tuple[int, Any]:
    """The status and JSON body of `url`'s handler on `raw`, in a request context of its own
    whose cleanups (admission ticket, lease) run as it ends."""
    with ExitStack() as stack:
        async with app.test_request_context(
            url,
            method="POST",
            data=raw,
            headers={"Content-Type": "application/json"},
            scope_base=cleanup_scope(stack),
        ):
            try:
                response = await HANDLERS[url](raw)
                return response.status_code, json.loads(await response.get_data())
            except Exception as error:  # the online edge's one translation
                translated = translate_error(error)
                return translated.status, translated.to_dict()
