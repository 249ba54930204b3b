"""The grammar module on the default model's vocabulary: what the frontend's check refuses and
why, and the vocabulary's lossless view of the bytes a grammar forces (no model needed, only
its tokenizer)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from llguidance import LLMatcher

from trio_llm.constraint import MAX_SCHEMA_DEPTH, Constraint
from trio_llm.grammar import (
    ConstraintError,
    Grammar,
    GrammarVocabulary,
    check,
    clean_error,
    dead_end,
    grammar_text,
    grammar_vocabulary,
    is_checked,
    lark_expression,
    limits,
)
from trio_llm.model_files import ModelSource, load_tokenizer

ASTRAL = "\U000bff35"
"""A character whose UTF-8 (F2 BF BC B5) starts with a byte the default model has no token for."""


@pytest.fixture(scope="module")
def vocabulary(default_model: ModelSource) -> GrammarVocabulary:
    tokenizer = load_tokenizer(default_model)
    return grammar_vocabulary(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def allowed(matcher: LLMatcher) -> np.ndarray:
    mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(mask, bitorder="little"))


def matcher(constraint: Constraint, vocabulary: GrammarVocabulary) -> LLMatcher:
    return LLMatcher(vocabulary.tokenizer, grammar_text(constraint), log_level=0, limits=limits())


def test_every_byte_tokenizes_losslessly(vocabulary: GrammarVocabulary) -> None:
    tokenizer = vocabulary.tokenizer
    assert 0xF2 in vocabulary.unproducible
    utf8 = [bytes([b]) for b in range(0xF5) if b not in (0xC0, 0xC1)]
    for data in [*utf8, ASTRAL.encode(), b"a\xf2\xbf\xbc\xb5b"]:
        assert tokenizer.decode_bytes(tokenizer.tokenize_bytes(data)) == data


def test_a_forced_byte_the_model_cannot_produce_allows_no_model_token(
    vocabulary: GrammarVocabulary,
) -> None:
    """The bug this vocabulary fixes: the grammar forced F2 BF BC B5, the tokenizer dropped the
    F2 it has no token for, and the mask allowed the token for the lone byte BF."""
    m = matcher(Constraint.regex(ASTRAL), vocabulary)
    assert not (allowed(m) < vocabulary.vocab_size).any()
    assert "F2" in dead_end(m, vocabulary.unproducible)
    # After a byte the model can produce, the forced tokens stop before the placeholder.
    grammar = Grammar(matcher(Constraint.regex("a" + ASTRAL), vocabulary), vocabulary)
    assert vocabulary.tokenizer.decode_bytes(grammar.forced_tokens()) == b"a"


def test_an_astral_character_the_model_can_spell_is_allowed(
    vocabulary: GrammarVocabulary,
) -> None:
    m = matcher(Constraint.regex("(\U0001f600|x)"), vocabulary)
    spelled = {vocabulary.tokenizer.decode_bytes([int(t)]) for t in allowed(m)}
    assert b"x" in spelled and any(b.startswith(b"\xf0") for b in spelled)
    check(Constraint.choice(["\U0001f600", "x"]), vocabulary.unproducible)


@pytest.mark.parametrize(
    ("constraint", "words"),
    [
        (Constraint.regex(ASTRAL), "no token of this model's vocabulary produces the byte F2"),
        (Constraint.choice([ASTRAL, "z" + ASTRAL]), "produces the byte F2"),
        (
            Constraint.json_schema(
                {"anyOf": [{"type": "object", "required": [f"k{i}"]} for i in range(2100)]}
            ),
            "too complex for the grammar engine",
        ),
        (
            Constraint.grammar(
                "start: "
                + " | ".join(f'"x" r{i}' for i in range(2100))
                + "\n"
                + "\n".join(f'r{i}: "y{i}"' for i in range(2100))
            ),
            "too complex for the grammar engine",
        ),
        (Constraint.regex(r"(a)\1"), "backreferences are not supported"),
        (Constraint.regex(r"(?=a)a"), "look-around"),
        (Constraint.grammar("start: " + "(" * 200 + '"a"' + ")" * 200), "too deeply nested"),
        (
            Constraint.json_schema('{"type":"array","items":' * 100 + "{}" + "}" * 100),
            f"at most {MAX_SCHEMA_DEPTH}",
        ),
        (
            Constraint.json_schema('{"items":' * 100_000 + "{}" + "}" * 100_000),
            "nested 100001 levels deep",
        ),
        (
            Constraint.json_schema({"type": "integer", "minimum": -(10**20), "maximum": -(10**20)}),
            "outside the range the grammar engine reads bounds in",
        ),
        (
            Constraint.json_schema({"items": {"exclusiveMaximum": 1e19}}),
            "exclusiveMaximum 1e+19 is outside",
        ),
    ],
    ids=[
        "astral",
        "astral-choice",
        "wide-anyof",
        "wide-lark",
        "backref",
        "lookaround",
        "deep-lark",
        "deep-schema",
        "very-deep-schema",
        "saturated-bounds",  # llguidance recursed until the stack overflowed (SIGSEGV)
        "bound-past-64-bits",
    ],
)
def test_check_refuses_what_cannot_be_served(
    constraint: Constraint, words: str, vocabulary: GrammarVocabulary
) -> None:
    with pytest.raises(ConstraintError) as caught:
        check(constraint, vocabulary.unproducible)
    message = str(caught.value)
    assert words in message
    assert "<state>" not in message and "<grammar>" not in message and len(message) <= 600


def test_a_schema_given_as_an_object_too_deep_to_encode_is_refused() -> None:
    schema: dict[str, object] = {}
    for _ in range(5000):
        schema = {"items": schema}
    with pytest.raises(ValueError, match=f"at most {MAX_SCHEMA_DEPTH}"):
        Constraint.json_schema(schema)


def test_a_choice_of_thousands_is_served(vocabulary: GrammarVocabulary) -> None:
    choices = [f"choice number {i} here" for i in range(5000)] + ['a "quoted"\n/choice']
    constraint = Constraint.choice(choices)
    check(constraint, vocabulary.unproducible)
    for choice in (choices[4321], choices[-1]):
        m = matcher(constraint, vocabulary)
        tokens = vocabulary.tokenizer.tokenize_str(choice)
        assert m.consume_tokens(tokens), m.get_error()
        assert m.is_stopped()


def test_errors_lose_the_parser_state() -> None:
    raw = 'Parser Error: token "x" is wrong\n<state>\nTokens: ...\n</state><grammar>{}</grammar>'
    assert clean_error(raw) == 'token "x" is wrong'
    assert clean_error("Parser Error: Current row has 2101 items; max is 2000; consider...") == (
        "the constraint is too complex for the grammar engine: 2101 alternatives are open at "
        "one point, and at most 2000 may be"
    )
    assert len(clean_error("x" * 10_000)) == 600


def test_a_valid_constraint_checks_from_memory_the_second_time(
    vocabulary: GrammarVocabulary,
) -> None:
    constraint = Constraint.json_schema(json.dumps({"type": "object", "title": "memo"}))
    check(constraint, vocabulary.unproducible)
    assert is_checked(constraint, vocabulary.unproducible) and not is_checked(constraint)


def accepts(constraint: Constraint, text: str, vocabulary: GrammarVocabulary) -> bool:
    """Whether `text` is a whole answer the constraint allows."""
    m = matcher(constraint, vocabulary)
    tokens = vocabulary.tokenizer.tokenize_str(text)
    return m.validate_tokens(tokens) == len(tokens) and (
        m.consume_tokens(tokens) and m.is_accepting()
    )


def test_a_schema_admits_only_the_keys_it_lists_unless_it_says_otherwise(
    vocabulary: GrammarVocabulary,
) -> None:
    """A pydantic model's schema says nothing of other keys; the default model, given one with
    a Responses `text.format`, wrote key after key until max_output_tokens. Closed as vLLM's
    default engine closes it: nested objects and definitions too, and an explicit
    `additionalProperties: true` still honoured."""
    city = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "where": {"$ref": "#/$defs/Place"}},
        "required": ["name"],
        "$defs": {"Place": {"type": "object", "properties": {"country": {"type": "string"}}}},
    }
    schema = Constraint.json_schema(city)
    assert accepts(schema, '{"name":"Paris","where":{"country":"France"}}', vocabulary)
    assert not accepts(schema, '{"name":"Paris","population":2}', vocabulary)
    assert not accepts(schema, '{"name":"Paris","where":{"country":"France","x":1}}', vocabulary)
    open_city = Constraint.json_schema({**city, "additionalProperties": True})
    assert accepts(open_city, '{"name":"Paris","population":2}', vocabulary)
    # Offered beside tool calls, the same schema is closed the same way.
    offered = json.loads(lark_expression(schema).removeprefix("%json "))
    assert offered["additionalProperties"] is False
    assert offered["$defs"]["Place"]["additionalProperties"] is False
