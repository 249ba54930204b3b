"""How a `trio-llm serve` flag gets its value: from argv, else from the environment as
TRIO_LLM_<FLAG>, else its default; and the value types that check it.

Why its own module: the server's flags (serve_flags.py) and the engine's (engine_flags.py) are
added the same way; this is that way, once.

Invariant: a value from the environment goes through the same checks as one typed on the
command line (argparse runs a string default through the flag's `type`, and `choices` are
checked here, since argparse checks them only for values given in argv).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

from trio_llm.config import parse_size

ENV_PREFIX = "TRIO_LLM_"

AddFlag = Callable[..., None]
"""`add(flag, *, default=None, **argparse_keywords)`: one flag of `serve`."""


def env_value(name: str, environ: Mapping[str, str]) -> str | None:
    """The value TRIO_LLM_<NAME> gives flag `name` (dashes as underscores), if it is set."""
    return environ.get(ENV_PREFIX + name.upper().replace("-", "_"))


def flag_adder(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> AddFlag:
    """Adds a flag to `parser` whose default is read from `environ` when set there."""

    def add(flag: str, *, default: object = None, **kw: object) -> None:
        name = flag.removeprefix("--")
        raw = env_value(name, environ)
        if raw is not None:
            choices = kw.get("choices")
            if choices is not None and raw not in choices:  # type: ignore[operator]
                parser.error(
                    f"{ENV_PREFIX}{name.upper().replace('-', '_')}={raw!r}: not one of "
                    f"{', '.join(choices)}"
                )  # type: ignore[arg-type]
            default = raw  # argparse runs a string default through `type`, as if typed
        parser.add_argument(flag, default=default, **kw)  # type: ignore[arg-type]

    return add


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number of seconds, got {text}")
    return value


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value
