"""OpenAI's Files and Batch APIs (/v1/files, /v1/batches) through the real `openai` SDK on one
real server with --batch-dir (the tiny model), a server killed mid-batch and restarted on the
same directory, `trio-llm run-batch`, and the runner's expiry and store's torn line in-process.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
import trio
from http_fake_engine import FakeEngine
from quart_trio import QuartTrio

from http_server_process import ServerProcess, run_small_server
from trio_llm import cli
from trio_llm.http.app import build_app
from trio_llm.http.batch.files import FileStore
from trio_llm.http.batch.lines import run_line
from trio_llm.http.batch.protocol import BatchObject, InputLine, LineResponse, OutputLine
from trio_llm.http.batch.runner import BatchRunner
from trio_llm.http.batch.store import BatchStore
from trio_llm.http.serve_flags import parse_serve_args

CHAT = "/v1/chat/completions"
ENDS = ("completed", "failed", "expired", "cancelled")


def chat_line(custom_id: str, model: str | None = None, **body: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": f"Say {custom_id}"}], "max_tokens": 4, **body}
    if model is not None:
        body["model"] = model
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def jsonl(lines: list[Any]) -> bytes:
    return "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines).encode()


def wait_for(sdk: openai.OpenAI, batch_id: str, statuses: tuple[str, ...] = ENDS) -> Any:
    deadline = time.monotonic() + 60
    while (batch := sdk.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)
    return batch


def submit(sdk: openai.OpenAI, lines: list[Any], endpoint: str = CHAT) -> Any:
    file = sdk.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return sdk.batches.create(
        input_file_id=file.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )


def output_lines(sdk: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(ln) for ln in sdk.files.content(file_id).text.splitlines()]


@pytest.fixture(scope="module")
def batch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batches")


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, batch_dir: Path) -> Iterator[ServerProcess]:
    """Shared by the module's tests; the restart test, the last to use it, kills it."""
    with run_small_server(tiny_model_dir, "--batch-dir", str(batch_dir)) as s:
        yield s


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


@pytest.mark.slow
def test_files_upload_list_retrieve_content_delete(sdk: openai.OpenAI) -> None:
    data = jsonl([chat_line("a")])
    file = sdk.files.create(file=("mine.jsonl", data), purpose="batch")
    assert file.object == "file" and file.id.startswith("file-")
    assert (file.bytes, file.filename, file.purpose, file.status) == (
        len(data),
        "mine.jsonl",
        "batch",
        "processed",
    )
    assert sdk.files.retrieve(file.id) == file
    assert file.id in [f.id for f in sdk.files.list(purpose="batch")]
    assert sdk.files.content(file.id).content == data
    deleted = sdk.files.delete(file.id)
    assert deleted.deleted and deleted.id == file.id
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(file.id)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.files.create(file=("x.jsonl", data), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"  # type: ignore[index]


@pytest.mark.slow
def test_a_batch_completes_with_openais_line_shapes(sdk: openai.OpenAI) -> None:
    lines = [chat_line(f"r{i}") for i in range(5)] + [chat_line("bad", max_tokens=-1)]
    batch = submit(sdk, lines)
    assert batch.status == "validating" and batch.object == "batch"
    assert batch.expires_at == batch.created_at + 24 * 3600
    batch = wait_for(sdk, batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 6, "completed": 5, "failed": 1}
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    outputs = output_lines(sdk, batch.output_file_id)
    assert [o["custom_id"] for o in outputs] == [f"r{i}" for i in range(5)]
    for out in outputs:
        assert out["id"].startswith("batch_req_") and out["error"] is None
        response = out["response"]
        assert response["status_code"] == 200 and response["request_id"]
        assert response["body"]["object"] == "chat.completion"
        assert response["body"]["usage"]["completion_tokens"] == 4
    [error] = output_lines(sdk, batch.error_file_id)
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "max_tokens"


@pytest.mark.slow
def test_an_invalid_input_fails_naming_every_line(sdk: openai.OpenAI) -> None:
    lines = [
        chat_line("ok"),
        "{not json",
        {"method": "POST", "url": CHAT, "body": {}},
        chat_line("ok"),
        {**chat_line("elsewhere"), "url": "/v1/completions"},
        chat_line("ghost", model="no-such-model"),
    ]
    batch = wait_for(sdk, submit(sdk, lines).id)
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None
    found = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert found == [
        (2, "invalid_json_line", None),
        (3, "missing_required_parameter", "custom_id"),
        (4, "duplicate_custom_id", "custom_id"),
        (5, "mismatched_url", "url"),
        (6, "model_not_found", "body.model"),
    ]
    assert batch.output_file_id is None


@pytest.mark.slow
def test_create_refuses_other_endpoints_and_windows(sdk: openai.OpenAI) -> None:
    file = sdk.files.create(file=("in.jsonl", jsonl([chat_line("a")])), purpose="batch")
    for field, value in (("endpoint", "/v1/responses"), ("completion_window", "1h")):
        args = {"input_file_id": file.id, "endpoint": CHAT, "completion_window": "24h"}
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.batches.create(**{**args, field: value})  # type: ignore[arg-type]
        assert refused.value.body["param"] == field  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        sdk.batches.create(input_file_id="file-none", endpoint=CHAT, completion_window="24h")


@pytest.mark.slow
def test_cancel_aborts_lines_in_flight_and_keeps_the_finished(
    sdk: openai.OpenAI, server: ServerProcess
) -> None:
    lines = [chat_line(f"c{i}", max_tokens=400, ignore_eos=True) for i in range(12)]
    batch = submit(sdk, lines)
    wait_for(sdk, batch.id, ("in_progress",))
    server.wait_running(1)
    with pytest.raises(openai.APIStatusError) as in_use:
        sdk.files.delete(batch.input_file_id)
    assert in_use.value.status_code == 409
    cancelling = sdk.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait_for(sdk, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    finished = output_lines(sdk, batch.output_file_id)
    assert batch.request_counts.completed == len(finished) < 12
    assert server.wait_idle(5)["trio_llm_num_requests_running"] == 0  # aborted in the engine
    with pytest.raises(openai.APIStatusError) as refused:
        sdk.batches.cancel(wait_for(sdk, submit(sdk, [chat_line("x")]).id).id)
    assert refused.value.status_code == 409


@pytest.mark.slow
def test_list_pages_newest_first(sdk: openai.OpenAI) -> None:
    ids = [submit(sdk, [chat_line("p")]).id for _ in range(3)]
    for batch_id in ids:
        wait_for(sdk, batch_id)
    page = sdk.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    after = sdk.batches.list(after=ids[2], limit=1)
    assert [b.id for b in after.data] == [ids[1]]


async def test_without_batch_dir_the_routes_say_how_to_serve_them() -> None:
    app: QuartTrio = build_app()
    client = app.test_client()
    for method, path in (("GET", "/v1/files"), ("POST", "/v1/batches"), ("GET", "/v1/batches/x")):
        response = await client.open(path, method=method, json={})
        body = await response.get_json()
        assert response.status_code == 400 and "--batch-dir" in body["error"]["message"]


async def test_a_line_runs_through_the_online_handler_as_background_work() -> None:
    engine = FakeEngine()
    app = build_app(engine)  # type: ignore[arg-type]
    line = InputLine(custom_id="x", url=CHAT, body=chat_line("x", stream=True)["body"])
    output = await run_line(app, line, background=True)
    assert output.response is not None and output.response.status_code == 200
    assert output.response.body["object"] == "chat.completion"  # not streamed
    assert list(engine.background_of.values()) == [True]
    assert list(engine.priority_of.values()) == [0]  # fcfs: no priority needed
    await run_line(app, msgspec.structs.replace(line, custom_id="y"))  # run-batch's way
    assert list(engine.background_of.values()) == [True, False]
    refused = await run_line(app, msgspec.structs.replace(line, body={"messages": []}))
    assert refused.response is not None and refused.response.status_code == 400
    assert not refused.succeeded


# -- a real server killed mid-batch, restarted on the same directory ------------------------


@pytest.mark.slow
def test_a_restarted_server_resumes_the_batch_running_no_line_twice(
    server: ServerProcess, sdk: openai.OpenAI, tiny_model_dir: Path, batch_dir: Path
) -> None:
    """Kills the module's server (so it runs after the other tests that share it)."""
    lines = [chat_line(f"k{i}", max_tokens=48, ignore_eos=True) for i in range(16)]
    batch = submit(sdk, lines)
    deadline = time.monotonic() + 60
    while sdk.batches.retrieve(batch.id).request_counts.completed < 3:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.process.send_signal(signal.SIGKILL)
    server.expected_exit = -signal.SIGKILL
    server.process.wait(30)
    done_before = (batch_dir / "batches" / f"{batch.id}.done.jsonl").read_text().splitlines()
    assert 3 <= len(done_before) < 16
    with (
        run_small_server(tiny_model_dir, "--batch-dir", str(batch_dir)) as second,
        openai.OpenAI(base_url=second.url + "/v1", api_key="x", max_retries=0) as again,
    ):
        resumed = wait_for(again, batch.id)
        assert resumed.status == "completed", resumed
        outputs = output_lines(again, resumed.output_file_id)
    assert sorted(o["custom_id"] for o in outputs) == sorted(f"k{i}" for i in range(16))
    done_after = (batch_dir / "batches" / f"{batch.id}.done.jsonl").read_text().splitlines()
    assert len(done_after) == 16 and done_after[: len(done_before)] == done_before


# -- trio-llm run-batch ----------------------------------------------------------------------


@pytest.mark.slow
def test_run_batch_answers_every_line_in_process(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [chat_line(f"q{i}") for i in range(3)]
    lines.append(
        {"custom_id": "t", "url": "/v1/completions", "body": {"prompt": "Hi", "max_tokens": 3}}
    )
    (tmp_path / "in.jsonl").write_bytes(jsonl(lines))
    code = cli.main([
        "run-batch",
        "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"),
        "--model", str(tiny_model_dir), "--kv-cache-memory", "32MiB", "--dtype", "float32",
        "--num-threads", "1",
    ])  # fmt: skip
    assert code == 0
    outputs = [json.loads(ln) for ln in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["custom_id"] for o in outputs] == ["q0", "q1", "q2", "t"]
    kinds = [o["response"]["body"]["object"] for o in outputs]
    assert kinds == ["chat.completion"] * 3 + ["text_completion"]
    assert "4/4" in capsys.readouterr().err  # the progress bar


# -- in-process: the window passing, a torn finished line -------------------------------------


async def test_lines_left_when_the_window_passes_expire_into_the_error_file(
    tmp_path: Path,
) -> None:
    files, store = FileStore(tmp_path), BatchStore(tmp_path)
    source = files.create("in.jsonl", "batch", jsonl([chat_line(f"e{i}") for i in range(3)]))
    ran: list[str] = []

    async def run_line(line: InputLine) -> OutputLine:
        ran.append(line.custom_id)
        await trio.sleep(3600)  # never finishes before the window
        raise AssertionError

    created = int(time.time())
    batch = BatchObject(
        id="batch_expiring", endpoint=CHAT, input_file_id=source.id, completion_window="24h",
        status="validating", created_at=created, expires_at=created + 1,
    )  # fmt: skip
    store.save(batch)
    runner = BatchRunner(files, store, run_line, lambda model, use: None)
    await runner.process(batch.id)
    batch = store.get(batch.id)  # type: ignore[assignment]
    assert batch.status == "expired" and batch.expired_at and batch.output_file_id is None
    assert ran == ["e0", "e1"]  # two in flight at once
    errors = [json.loads(ln) for ln in files.content(batch.error_file_id).splitlines()]  # type: ignore[arg-type, union-attr]
    assert [e["custom_id"] for e in errors] == ["e0", "e1", "e2"]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"} and errors[0][
        "response"
    ] is None


def test_a_torn_finished_line_is_cut_off_and_runs_again(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    ok = OutputLine(
        id="batch_req_1",
        custom_id="a",
        response=LineResponse(status_code=200, request_id="1", body={}),
    )
    store.append_done("batch_x", ok)
    path = tmp_path / "batches" / "batch_x.done.jsonl"
    with open(path, "ab") as f:
        f.write(msgspec.json.encode(ok)[:20])  # killed mid-append
    assert list(store.done("batch_x")) == ["a"]
    store.append_done("batch_x", msgspec.structs.replace(ok, custom_id="b"))
    assert list(store.done("batch_x")) == ["a", "b"]


def test_the_batch_dir_flag_and_its_environment_variable() -> None:
    assert parse_serve_args([], {}).batch_dir is None
    assert parse_serve_args(["--batch-dir", "/srv/b"], {}).batch_dir == Path("/srv/b")
    assert parse_serve_args([], {"TRIO_LLM_BATCH_DIR": "/srv/e"}).batch_dir == Path("/srv/e")
