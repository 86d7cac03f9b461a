"""JSON as a type: what a run's JSON files, a server's replies and the browser's props hold.

On the ground floor beside :mod:`perfscope.errors` and :mod:`perfscope.units`: every stage may
import it. ``JsonValue`` is the recursive union JSON can spell, so a value typed with it must be
narrowed (``isinstance``) before it is used, and a literal built as a ``JsonObject`` is checked
key by key; this is what a dict of ``Any`` does not give (docs/architecture.md, "Typed records").

Use it at the edges only: a document read from disk or the wire before it becomes a record, a
record's ``to_dict`` form, a Dash prop. Between stages, pass records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

__all__ = [
    "JsonArray",
    "JsonObject",
    "JsonScalar",
    "JsonValue",
    "ReadOnlyJson",
    "json_at",
    "json_float",
    "json_int",
    "json_number",
    "json_object",
    "json_str",
]

JsonScalar: TypeAlias = "str | int | float | bool | None"
JsonValue: TypeAlias = "JsonScalar | list[JsonValue] | dict[str, JsonValue]"
#: A JSON object as built or parsed (mutable).
JsonObject: TypeAlias = "dict[str, JsonValue]"
JsonArray: TypeAlias = "list[JsonValue]"
#: A JSON object as read: what a function that only reads one accepts (any mapping whose values
#: are JSON, including a ``JsonObject`` or a ``dict[str, float]``).
ReadOnlyJson: TypeAlias = "Mapping[str, JsonValue | Sequence[JsonValue] | Mapping[str, JsonValue]]"


def json_object(value: object) -> JsonObject | None:
    """``value`` if it is a JSON object (a ``dict`` with string keys), else ``None``."""
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return value
    return None


def json_float(value: object) -> float | None:
    """``value`` as a float if it is a JSON number (not a bool), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def json_number(value: object) -> float | None:
    """``value`` as read if it is a JSON number (an ``int`` stays an ``int``, so what is copied
    on is what was stored), else ``None`` (a bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def json_at(document: ReadOnlyJson, *path: str) -> JsonObject:
    """The JSON object at ``path`` in ``document`` (``{}`` where a step of it is missing or
    not an object)."""
    out = json_object(document.get(path[0])) or {}
    for key in path[1:]:
        out = json_object(out.get(key)) or {}
    return out


def json_int(value: object) -> int | None:
    """``value`` if it is a JSON integer (not a bool, not a float), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def json_str(value: object) -> str | None:
    """``value`` if it is a string, else ``None``."""
    return value if isinstance(value, str) else None
