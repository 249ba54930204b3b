"""Structured-output request fields with plain values: which constraint each field makes, and
the 400s (naming the parameter) for what the grammar engine cannot enforce."""

from __future__ import annotations

import json

import pytest
import trio

from trio_llm.constraint import Constraint, ConstraintKind
from trio_llm.http.chat.plan import plan_chat
from trio_llm.http.chat.protocol import ChatCompletionRequest
from trio_llm.http.completions.plan import plan_completion
from trio_llm.http.completions.protocol import CompletionRequest
from trio_llm.http.errors import ProtocolError
from trio_llm.http.generate.endpoint import check_plan
from trio_llm.http.runtime.state import ModelInfo
from trio_llm.http.sampling import RequestLimits
from trio_llm.http.structured import constraint_of
from trio_llm.http.wire import decode_request

LIMITS = RequestLimits()
CARD = ModelInfo("m", 2048, 49152, 0, unproducible_bytes=frozenset({0xF2}))
"""A model whose vocabulary has no token for the byte F2 (as the default model's has not)."""
ASTRAL = "\U000bff35"
"""F2 BF BC B5 in UTF-8."""
DEEP = '{"type":"array","items":' * 100 + "{}" + "}" * 100
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
SO = "structured_outputs"
C = Constraint


def json_schema_format(**json_schema: object) -> dict[str, object]:
    return {"type": "json_schema", "json_schema": json_schema}


def chat(**fields: object) -> ChatCompletionRequest:
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    return decode_request(json.dumps(body).encode(), ChatCompletionRequest)


def completion(**fields: object) -> CompletionRequest:
    return decode_request(json.dumps({"prompt": "hi", **fields}).encode(), CompletionRequest)


@pytest.mark.parametrize(
    ("fields", "expected", "param"),
    [
        (
            {"response_format": json_schema_format(name="x", schema=SCHEMA)},
            Constraint.json_schema(SCHEMA),
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "json_object"}}, Constraint.json_object(), "response_format"),
        ({SO: {"json": SCHEMA}}, C.json_schema(SCHEMA), f"{SO}.json"),
        (
            {"structured_outputs": {"json": json.dumps(SCHEMA), "whitespace_pattern": " ?"}},
            Constraint.json_schema(json.dumps(SCHEMA), whitespace_pattern=" ?"),
            "structured_outputs.json",
        ),
        ({SO: {"regex": "a+"}}, C.regex("a+"), f"{SO}.regex"),
        ({SO: {"choice": ["x", "y"]}}, C.choice(["x", "y"]), f"{SO}.choice"),
        ({SO: {"grammar": 'start: "a"'}}, C.grammar('start: "a"'), f"{SO}.grammar"),
        ({SO: {"json_object": True}}, C.json_object(), f"{SO}.json_object"),
        ({"guided_json": SCHEMA}, Constraint.json_schema(SCHEMA), "guided_json"),
        ({"guided_regex": "[0-9]+"}, Constraint.regex("[0-9]+"), "guided_regex"),
        ({"guided_choice": ["a", "b"]}, Constraint.choice(["a", "b"]), "guided_choice"),
        ({"guided_grammar": 'root ::= "a"'}, Constraint.grammar('root ::= "a"'), "guided_grammar"),
    ],
)  # fmt: skip
def test_each_field_makes_its_constraint(fields: dict, expected: Constraint, param: str) -> None:
    assert constraint_of(chat(**fields)) == (expected, param)
    assert constraint_of(completion(**fields)) == (expected, param)
    assert plan_chat(chat(**fields), LIMITS).params.constraint == expected
    assert plan_completion(completion(**fields), LIMITS).params.constraint == expected


def test_no_constraint_and_text_format() -> None:
    assert constraint_of(chat()) is None
    assert constraint_of(chat(response_format={"type": "text"})) is None
    assert plan_chat(chat(response_format={"type": "text"}), LIMITS).params.constraint is None


def test_a_schema_less_json_schema_format_is_any_json() -> None:
    found = constraint_of(
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    )
    assert found is not None and found[0] == Constraint.json_schema({})


@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "required"),
        ({"response_format": json_schema_format()}, "response_format.json_schema", "name"),
        ({"response_format": {"type": "structural_tag"}}, "response_format.type", ""),
        ({SO: {"regex": "a", "choice": ["a"]}}, SO, "exactly one"),
        ({SO: {"whitespace_pattern": " "}}, SO, "got none"),
        ({"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex", "one structured-output"),
        ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice", ""),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"guided_choice": ["a", ""]}, "guided_choice", "non-empty"),
        ({"guided_regex": ""}, "guided_regex", "empty"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_json": "[1]"}, "guided_json", "must be an object"),
    ],
)  # fmt: skip
def test_malformed_constraints_are_400s_naming_the_param(
    fields: dict, param: str, fragment: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        plan_chat(chat(**fields), LIMITS)
    assert (info.value.status, info.value.param) == (400, param)
    assert fragment in info.value.message


@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        ({"guided_regex": "a(b"}, "guided_regex", "unclosed group"),
        ({"guided_regex": "(?=a)b"}, "guided_regex", "look-around"),
        ({"guided_json": {"type": "strin"}}, "guided_json", "strin"),
        ({"guided_json": {"type": "array", "uniqueItems": True}}, "guided_json", "uniqueItems"),
        ({SO: {"json": {"type": "string", "format": "nope"}}}, f"{SO}.json", "format"),
        (
            {"response_format": json_schema_format(name="x", schema={"$ref": "#/$defs/x"})},
            "response_format.json_schema.schema",
            "",
        ),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", "undefined_rule"),
        ({"guided_grammar": "root ::= (("}, "guided_grammar", ""),
        ({"guided_regex": ASTRAL}, "guided_regex", "produces the byte F2"),
        ({SO: {"choice": ["x" + ASTRAL, "y" + ASTRAL]}}, f"{SO}.choice", "byte F2"),
        ({"guided_json": {"enum": [ASTRAL]}}, "guided_json", "byte F2"),
        ({"guided_regex": r"(a)\1"}, "guided_regex", "backreferences"),
        ({"guided_json": json.loads(DEEP)}, "guided_json", "nested 101 levels deep"),
        (
            {"response_format": json_schema_format(name="x", schema=json.loads(DEEP))},
            "response_format.json_schema.schema",
            "at most 64",
        ),
        (
            {"guided_json": {"anyOf": [{"required": [f"k{i}"]} for i in range(2100)]}},
            "guided_json",
            "too complex for the grammar engine",
        ),
        ({SO: {"grammar": "start: " + "(" * 300 + '"a"' + ")" * 300}}, f"{SO}.grammar", "deeply"),
    ],
)  # fmt: skip
async def test_what_the_engine_cannot_enforce_is_a_400_before_the_engine(
    fields: dict, param: str, fragment: str
) -> None:
    request = chat(**fields)
    with pytest.raises(ProtocolError) as info:
        plan = plan_chat(request, LIMITS)  # a schema too deep to encode is refused here
        await check_plan(plan, CARD)  # the rest, by the grammar check
    assert (info.value.status, info.value.param) == (400, param)
    assert fragment in info.value.message
    # Asked again, the answer comes from memory, on the event loop.
    with pytest.raises(ProtocolError):
        with trio.fail_after(5):
            await check_plan(plan_chat(request, LIMITS), CARD)


async def test_valid_constraints_pass_the_check() -> None:
    for fields in (
        {"guided_json": SCHEMA},
        {"guided_regex": "[a-z]+"},
        {"guided_choice": ["a", "b"]},
        {"guided_grammar": 'root ::= "x" [0-9]'},
        {"guided_grammar": 'start: "x" /[0-9]/'},
        {"response_format": {"type": "json_object"}},
        {"guided_choice": [f"choice {i}" for i in range(5000)]},
        {"guided_regex": "a\U0001f600b"},  # astral, and the vocabulary spells it
    ):
        await check_plan(plan_chat(chat(**fields), LIMITS), CARD)


def test_constraint_kinds_round_trip_through_sampling_params() -> None:
    import msgspec

    from trio_llm.sampling_params import SamplingParams

    params = SamplingParams(constraint=Constraint.choice(["a", "b"]))
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams)
    assert back.constraint == params.constraint
    assert back.constraint is not None and back.constraint.kind is ConstraintKind.CHOICE


def test_openapi_shows_the_structured_output_fields() -> None:
    from trio_llm.http.ops.openapi import openapi_document

    schemas = openapi_document("x")["components"]["schemas"]
    for request in ("ChatCompletionRequest", "CompletionRequest"):
        fields = schemas[request]["properties"]
        assert {"response_format", "structured_outputs", "guided_json", "guided_regex"} <= set(
            fields
        )
        assert {"guided_choice", "guided_grammar", "guided_whitespace_pattern"} <= set(fields)
    assert set(schemas["StructuredOutputsParams"]["properties"]) == {
        "json",
        "regex",
        "choice",
        "grammar",
        "json_object",
        "whitespace_pattern",
    }
    assert schemas["JsonSchemaFormat"]["required"] == ["name"]
