"""The JSON shape of each domain event: one layout for the outbox's rows, the SQL that fills them, and the wire.

An event's JSON is its fields by name, in their order: ids and enums as their strings, nested values as
objects, mappings as they are, and times as the writer formats them (the outbox keeps the offset, the wire
writes UTC with a `Z`). The store writes and reads its outbox rows with `Shape`, its statements fill in
fields by the names and time flags a shape gives, and the protocol's models carry the same field names, so
a new field is one field here and one in the protocol.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Generic, TypeVar

E = TypeVar("E")

#: Writes a time as JSON text (`datetime.isoformat` for the outbox, the protocol's timestamp for the wire).
TimeFormat = Callable[[datetime], str]


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One field of a shape: its name in core, its key in the JSON, and whether it is a time."""

    name: str
    key: str
    #: Written by the writer's `TimeFormat` (a datetime), read with `datetime.fromisoformat`.
    time: bool


@dataclasses.dataclass(frozen=True, slots=True)
class _Code:
    """How one field's value is converted: `write` is an expression over `{x}`, `read` a callable (or None)."""

    time: bool
    nullable: bool
    write: str
    read: Callable[[Any], Any] | None


def _code(hint: Any, helper: str, namespace: dict[str, Any]) -> _Code:
    """The conversions of a field annotated `hint`; `helper` names what it puts in `namespace`."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return dataclasses.replace(_code(inner, helper, namespace), nullable=True)
    if hint is datetime:
        return _Code(True, False, "time({x})", datetime.fromisoformat)
    if hint is uuid.UUID:
        return _Code(False, False, "str({x})", uuid.UUID)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _Code(False, False, "{x}.value", hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        nested = shape(hint)
        namespace[helper] = nested.write
        return _Code(False, False, f"{helper}({{x}}, time)", nested.read)
    if typing.get_origin(hint) is Mapping:
        return _Code(False, False, "dict({x})", None)
    if hint in (int, str, bool, float):
        return _Code(False, False, "{x}", None)
    raise TypeError(f"no JSON shape for a field of type {hint!r}")


class Shape(Generic[E]):
    """How values of the dataclass `cls` are written as JSON objects (`write`) and read back (`read`).

    `keys` renames fields in the JSON (a layout that predates a field's name); every other key is the
    field's name. Reading ignores keys the shape does not know (written by a newer release), and a field
    with a default that is absent reads as its default (written before the field existed).

    Both functions are generated once from the fields, as `dataclasses` generates `__init__`: the relay
    writes and reads every event with them, and a loop over the fields cost it 30 to 50% more.
    """

    #: `value` as a JSON object, its times formatted by the `TimeFormat` given.
    write: Callable[[E, TimeFormat], dict[str, Any]]
    #: The value of a JSON object (`write` reversed, times with any offset); KeyError for a missing field
    #: without a default, ValueError for a value not of its field's kind.
    read: Callable[[Mapping[str, Any]], E]

    def __init__(self, cls: type[E], keys: Mapping[str, str] | None = None) -> None:
        renamed = dict(keys or {})
        hints = typing.get_type_hints(cls)
        namespace: dict[str, Any] = {"_cls": cls}
        fields: list[Field] = []
        written: list[str] = []
        read: list[str] = []
        for n, f in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
            code = _code(hints[f.name], f"_w{n}", namespace)
            key = renamed.pop(f.name, f.name)
            fields.append(Field(f.name, key, code.time))
            if code.read is not None:
                namespace[f"_r{n}"] = code.read
            x = f"x{n}"
            got = x if code.read is None else f"_r{n}({x})"
            if code.nullable and (code.write != "{x}" or code.read is not None):  # None stays None
                written.append(f"{key!r}: (None if ({x} := v.{f.name}) is None else {code.write.format(x=x)})")
                value = f"(None if ({x} := d[{key!r}]) is None else {got})"
            else:
                written.append(f"{key!r}: {code.write.format(x=f'v.{f.name}')}")
                value = f"d[{key!r}]" if code.read is None else f"_r{n}(d[{key!r}])"
            if f.default is not dataclasses.MISSING:  # absent: the default, as it is
                namespace[f"_d{n}"] = f.default
                value = f"({value} if {key!r} in d else _d{n})"
            read.append(f"{f.name}={value}")
        if renamed:
            raise ValueError(f"{cls.__name__} has no fields {sorted(renamed)}")
        source = (
            f"def write(v, time):\n    return {{{', '.join(written)}}}\n"
            f"def read(d):\n    return _cls({', '.join(read)})\n"
        )
        exec(source, namespace)  # our own source, made of the dataclass's field names
        self.cls = cls
        self.fields = tuple(fields)
        self._by_name = {f.name: f for f in fields}
        self.write = namespace["write"]
        self.read = namespace["read"]

    def renamed(self, **keys: str) -> Shape[E]:
        """This shape with the JSON keys of some fields renamed (`event="kind"`)."""
        return Shape(self.cls, keys)

    def field(self, name: str) -> Field:
        """The field `name` (core's name).

        Raises:
            ValueError: `cls` has no such field.
        """
        try:
            return self._by_name[name]
        except KeyError:
            raise ValueError(f"{self.cls.__name__} has no field {name!r}") from None


_SHAPES: dict[type[Any], Shape[Any]] = {}


def shape(cls: type[E]) -> Shape[E]:
    """The shape of the dataclass `cls` (a domain event, or a value one holds), built once."""
    found = _SHAPES.get(cls)
    if found is None:
        found = _SHAPES[cls] = Shape(cls)
    return found
