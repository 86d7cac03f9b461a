"""Frozen, typed records that read and write their JSON form.

A :class:`Record` subclass is a ``@dataclass(frozen=True, kw_only=True)`` whose fields carry
type hints. ``from_dict`` builds it from a JSON object, converting nested objects into the
record types the hints name (``Distribution``, ``dict[str, PhaseRoofline]``,
``tuple[Advice, ...]``); keys it does not know are kept in ``extra`` and written back by
``to_dict``, so a summary written by a newer perfscope (or with fields other components add)
loads and round-trips without losing anything. Missing keys take the field's default.

``extra`` is only for that round trip: attribute access reaches fields and nothing else, so a
misspelt name (``summary.rooflne``) is an AttributeError at run time and a mypy error before.
A field that consumers read belongs in the type (tests/test_architecture.py holds this).

A field a record gained after files were stored without it is named in ``_NEWER``: an object
read without the key leaves it out again when written, so those files keep their bytes, while
a record built in code always writes it (``None`` included).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Self, get_args, get_origin

from perfscope.jsontypes import JsonObject

__all__ = ["Record"]


#: The JSON aliases (:mod:`perfscope.jsontypes`) as the runtime reads a field's hint: they are
#: strings there (recursive aliases), so a field typed ``JsonObject | None`` would not resolve.
#: A JSON value is kept as read, so the alias's value type is ``object``.
_JSON_ALIASES: dict[str, object] = {
    "JsonValue": object,
    "JsonObject": dict[str, object],
    "JsonArray": list[object],
    "ReadOnlyJson": Mapping[str, object],
}


def _from_json(tp: Any, value: Any) -> Any:
    """``value`` (JSON) converted to the type ``tp`` names, as far as records go."""
    if value is None:
        return None
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arm in get_args(tp):
            if arm is type(None):
                continue
            if isinstance(arm, type) and issubclass(arm, Record):
                return arm.from_dict(value) if isinstance(value, Mapping) else value
            return _from_json(arm, value)
        return value
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp.from_dict(value) if isinstance(value, Mapping) else value
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        args = get_args(tp)
        inner = args[1] if len(args) == 2 else Any
        if not isinstance(value, Mapping):
            return value
        return {str(k): _from_json(inner, v) for k, v in value.items()}
    if origin is tuple or tp is tuple:
        args = get_args(tp)
        inner = args[0] if args else Any
        if not isinstance(value, list | tuple):
            return value
        return tuple(_from_json(inner, v) for v in value)
    return value


def _to_json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Record:
    """Base of the summary's records (see the module docstring).

    Attributes:
        extra: keys of the JSON object that this type has no field for, kept as read.
    """

    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    #: Fields of :attr:`_NEWER` the JSON object this record was read from did not have.
    _absent: frozenset[str] = dataclasses.field(default=frozenset(), repr=False, compare=False)

    #: Fields left out of the JSON when ``None`` (sections a run never had: the stored
    #: format has never carried a null there).
    _OMIT_WHEN_NONE: ClassVar[tuple[str, ...]] = ()
    #: Fields added after files were stored without them (see the module docstring).
    _NEWER: ClassVar[tuple[str, ...]] = ()

    #: Per class: field name → resolved type hint (filled on first use).
    _hints: ClassVar[dict[type, dict[str, object]]] = {}

    @classmethod
    def _field_types(cls) -> dict[str, object]:
        hints = Record._hints.get(cls)
        if hints is None:
            resolved = typing.get_type_hints(cls, localns=_JSON_ALIASES)
            hints = {
                f.name: resolved[f.name]
                for f in dataclasses.fields(cls)
                if f.name not in ("extra", "_absent")
            }
            Record._hints[cls] = hints
        return hints

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the JSON fields, in the order :meth:`to_dict` writes them."""
        return tuple(cls._field_types())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Self:
        """Build from a JSON object; unknown keys go to ``extra``, missing ones default."""
        data = data or {}
        hints = cls._field_types()
        kwargs = {name: _from_json(tp, data[name]) for name, tp in hints.items() if name in data}
        extra = {k: v for k, v in data.items() if k not in hints}
        absent = frozenset(k for k in cls._NEWER if k not in data)
        return cls(**kwargs, extra=extra, _absent=absent)

    def _omitted(self) -> frozenset[str]:
        """Fields :meth:`to_dict` leaves out: by default those of :attr:`_OMIT_WHEN_NONE`
        that are ``None``."""
        return frozenset(k for k in self._OMIT_WHEN_NONE if getattr(self, k) is None)

    def to_dict(self) -> JsonObject:
        """The JSON object (SI units), ``extra`` keys included."""
        skip = self._omitted() | self._absent
        out = {
            name: _to_json(getattr(self, name)) for name in self._field_types() if name not in skip
        }
        for k, v in self.extra.items():
            out.setdefault(k, _to_json(v))
        return out

    def __getitem__(self, name: str) -> Any:
        """``section["p99"]``: a field by name (KeyError naming the fields when absent)."""
        if name not in self._field_types():
            why = ""
            if getattr(self, "available", True) is False:
                reason = getattr(self, "reason", None)
                why = f" ({type(self).__name__.lower()} is not available: {reason})"
            raise KeyError(
                f"{type(self).__name__} has no {name!r}{why}; it has: "
                + ", ".join(sorted(self._field_types()))
            )
        return getattr(self, name)

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is a field of this type."""
        return isinstance(name, str) and name in self._field_types()
