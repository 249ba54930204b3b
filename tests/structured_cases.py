"""The structured-output cases the tests and bench/apis/structured.py share: 20 JSON schemas of the
kinds people send (nested objects, arrays with min/max items, enums, integer ranges, required and
optional fields, string patterns and lengths, anyOf, $ref, const, nullable types, formats), and
regex, choice and grammar constraints, each with a prompt that suits it.

Strings are mostly bounded (`maxLength`): a 135M-parameter model may otherwise keep writing one
string until max_tokens, which says nothing about the grammar engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SchemaCase:
    name: str
    prompt: str
    schema: dict[str, Any]

    def chat_body(self, model: str, max_tokens: int) -> dict[str, Any]:
        """A greedy chat completion of the prompt, the schema as OpenAI's response_format."""
        return {
            "model": model,
            "messages": [{"role": "user", "content": self.prompt}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": self.name, "schema": self.schema, "strict": True},
            },
            "max_tokens": max_tokens,
            "temperature": 0,
        }


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


_NAME = {"type": "string", "minLength": 1, "maxLength": 20}

SCHEMAS: list[SchemaCase] = [
    SchemaCase(
        "person",
        "Describe a person called Alice who is 30 years old, as JSON.",
        _object({"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    ),
    SchemaCase(
        "nested_address",
        "Give a user with a name and an address (city and 5-digit zip) as JSON.",
        _object(
            {
                "name": _NAME,
                "address": _object(
                    {
                        "city": {"type": "string", "maxLength": 20},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    }
                ),
            }
        ),
    ),
    SchemaCase(
        "tags",
        "List one to three tags for a blog post about cooking, as JSON.",
        _object(
            {
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 12},
                    "minItems": 1,
                    "maxItems": 3,
                }
            }
        ),
    ),
    SchemaCase(
        "color_enum",
        "What color is the sky? Answer as JSON.",
        _object({"color": {"enum": ["red", "green", "blue", "yellow"]}}),
    ),
    SchemaCase(
        "score_range",
        "Rate the movie Titanic from 1 to 10, as JSON.",
        _object({"score": {"type": "integer", "minimum": 1, "maximum": 10}}),
    ),
    SchemaCase(
        "optional_fields",
        "Give a book title as JSON; a subtitle is optional.",
        _object(
            {"title": _NAME, "subtitle": {"type": "string", "maxLength": 20}},
            required=["title"],
        ),
    ),
    SchemaCase(
        "code_pattern",
        "Make up a product code of three capital letters, a dash and three digits, as JSON.",
        _object({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}}),
    ),
    SchemaCase(
        "word_length",
        "Give one English word of 3 to 8 letters, as JSON.",
        _object({"word": {"type": "string", "minLength": 3, "maxLength": 8}}),
    ),
    SchemaCase(
        "any_of",
        "Give a value that is a number or a short word, as JSON.",
        _object({"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 10}]}}),
    ),
    SchemaCase(
        "bool_number",
        "Is water wet, and how sure are you from 0 to 1? Answer as JSON.",
        _object(
            {"ok": {"type": "boolean"}, "ratio": {"type": "number", "minimum": 0, "maximum": 1}}
        ),
    ),
    SchemaCase(
        "todo_items",
        "List up to three to-do items with an id and whether each is done, as JSON.",
        _object(
            {
                "items": {
                    "type": "array",
                    "items": _object(
                        {
                            "id": {"type": "integer", "minimum": 0, "maximum": 99},
                            "done": {"type": "boolean"},
                        }
                    ),
                    "maxItems": 3,
                }
            }
        ),
    ),
    SchemaCase(
        "weekdays",
        "Name one or two weekdays, as JSON.",
        _object(
            {
                "days": {
                    "type": "array",
                    "items": {"enum": ["Mon", "Tue", "Wed", "Thu", "Fri"]},
                    "minItems": 1,
                    "maxItems": 2,
                }
            }
        ),
    ),
    SchemaCase(
        "matrix",
        "Give a 2 by 2 matrix of small integers, as JSON.",
        _object(
            {
                "matrix": {
                    "type": "array",
                    "items": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": -9, "maximum": 9},
                        "minItems": 2,
                        "maxItems": 2,
                    },
                    "minItems": 2,
                    "maxItems": 2,
                }
            }
        ),
    ),
    SchemaCase(
        "const_kind",
        "Count the events of today, as JSON.",
        _object(
            {
                "kind": {"const": "event"},
                "count": {"type": "integer", "minimum": 0, "maximum": 1000},
            }
        ),
    ),
    SchemaCase(
        "ref_points",
        "Give two points with x and y coordinates, as JSON.",
        {
            "$defs": {
                "point": _object(
                    {
                        "x": {"type": "integer", "minimum": -100, "maximum": 100},
                        "y": {"type": "integer", "minimum": -100, "maximum": 100},
                    }
                )
            },
            **_object({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}),
        },
    ),
    SchemaCase(
        "nullable",
        "Give a person's first name and middle name (or null), as JSON.",
        _object({"first": _NAME, "middle": {"type": ["string", "null"], "maxLength": 12}}),
    ),
    SchemaCase(
        "top_array",
        "List two to four prime numbers as a JSON array.",
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 100},
            "minItems": 2,
            "maxItems": 4,
        },
    ),
    SchemaCase(
        "product",
        "Describe a product with a name, a price and whether it is in stock, as JSON.",
        {
            "title": "Product",
            "description": "A product in the catalogue",
            **_object(
                {
                    "name": {"title": "Name", **_NAME},
                    "price": {"title": "Price", "type": "number", "minimum": 0, "maximum": 10000},
                    "in_stock": {"title": "In Stock", "type": "boolean"},
                }
            ),
        },
    ),
    SchemaCase(
        "shape_any_of",
        "Describe a circle or a square with its size, as JSON.",
        {
            "anyOf": [
                _object(
                    {
                        "shape": {"const": "circle"},
                        "radius": {"type": "integer", "minimum": 1, "maximum": 50},
                    }
                ),
                _object(
                    {
                        "shape": {"const": "square"},
                        "side": {"type": "integer", "minimum": 1, "maximum": 50},
                    }
                ),
            ]
        },
    ),
    SchemaCase(
        "date_format",
        "When is New Year's Day 2025? Answer as JSON with an ISO date.",
        _object(
            {
                "event": {"type": "string", "maxLength": 20},
                "date": {"type": "string", "format": "date"},
            }
        ),
    ),
]


@dataclass(frozen=True)
class PatternCase:
    name: str
    prompt: str
    pattern: str


REGEXES: list[PatternCase] = [
    PatternCase("phone", "Write a phone number like 555-1234.", r"[0-9]{3}-[0-9]{4}"),
    PatternCase("yes_no", "Is the earth round? Answer yes or no.", r"(yes|no)"),
    PatternCase("email", "Write an email address.", r"[a-z]{3,8}@[a-z]{3,6}\.com"),
    PatternCase(
        "ipv4",
        "Write an IP address.",
        r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])",
    ),
]

CHOICES: list[tuple[str, list[str]]] = [
    ("The movie was wonderful. Sentiment:", ["positive", "negative", "neutral"]),
    ("What is the capital of France?", ["Paris", "London", "Berlin"]),
]

LARK_GRAMMAR = r"""
start: "SELECT " column " FROM " table
column: "name" | "age" | "*"
table: "users" | "orders"
"""
"""A Lark grammar (llguidance's own syntax)."""

GBNF_GRAMMAR = r"""
root ::= "The answer is " digit "."
digit ::= [0-9]
"""
"""The same idea in llama.cpp's GBNF, which the engine also accepts."""


def assert_valid(schema: dict[str, Any], instance: object) -> None:
    """`instance` satisfies `schema` (JSON Schema draft 2020-12), formats included."""
    try:
        import jsonschema
    except ImportError:  # the Rust implementation, which schemathesis brings
        import jsonschema_rs

        validator = jsonschema_rs.validator_for(schema, validate_formats=True)
        errors = [e.message for e in validator.iter_errors(instance)]
        assert not errors, f"{instance!r}: {errors}"
    else:
        jsonschema.validate(
            instance, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
