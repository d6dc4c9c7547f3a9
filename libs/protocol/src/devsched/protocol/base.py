"""Base models and field types shared by every message.

Strict by default: JSON numbers are never coerced (`"3"`, `3.0` and `true` are not the integer 3),
timestamps must carry an offset, ids are UUIDs, and floats must be finite. Unknown fields are an error
when a model is built in Python (a typo fails loudly) and when a request is decoded (the protocol's
error table says so); replies and stream messages are decoded ignoring them at any depth, because the
contract lets a newer server ADD fields and an older client must keep working.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Self, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    Strict,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from devsched.core.ids import TOKEN_PATTERN

__all__ = [
    "Id",
    "JsonObject",
    "Name",
    "ReplyModel",
    "RequestModel",
    "Seconds",
    "Timestamp",
    "Token",
    "WireModel",
    "format_timestamp",
]

#: RFC 3339 date-time with a mandatory offset. pydantic alone would also take `"1735787045"` (unix time).
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d{1,9})?([Zz]|[+-]\d\d:\d\d)")


def _parse_rfc3339(value: Any) -> Any:
    # Parsing here (not in pydantic) also keeps strict mode happy: after a before-validator pydantic
    # treats the value as Python input, where a strict datetime must already be a datetime.
    if not isinstance(value, str):
        return value
    if _RFC3339.fullmatch(value):
        try:
            return datetime.fromisoformat(value.upper())
        except ValueError:
            pass  # well-formed but impossible, such as month 13
    raise PydanticCustomError(
        "rfc3339", "Input should be an RFC 3339 timestamp with an offset, like 2025-01-02T03:04:05.000000Z"
    )


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise PydanticCustomError("timestamp_range", "Timestamp is out of range in UTC") from None


def format_timestamp(value: datetime) -> str:
    """RFC 3339 in UTC with microseconds and a `Z`: `2025-01-02T03:04:05.000006Z`.

    One fixed width and suffix, so timestamps sort as strings and compare byte for byte in tests.
    """
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _finite(value: Any) -> Any:
    # JSON has no NaN or Infinity; a model built in Python must not smuggle them onto the wire.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("NaN and Infinity are not JSON")
    if isinstance(value, dict):
        for item in value.values():
            _finite(item)
    elif isinstance(value, list):
        for item in value:
            _finite(item)
    return value


#: A single subject token (prefix, host id, device id): 1 to 64 of `A-Z a-z 0-9 _ -`.
Token = Annotated[str, StringConstraints(pattern=TOKEN_PATTERN)]

#: An aware datetime, normalised to UTC, written as RFC 3339 with microseconds and `Z`.
Timestamp = Annotated[
    AwareDatetime,
    BeforeValidator(_parse_rfc3339),
    AfterValidator(_to_utc),
    PlainSerializer(format_timestamp, return_type=str, when_used="json"),
]

#: A task or lease id.
Id = uuid.UUID

#: A duration in seconds: fractional allowed, finite, above zero.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]

#: A free-form JSON object (step args, task metadata) without NaN or Infinity.
JsonObject = Annotated[dict[str, JsonValue], AfterValidator(_finite)]

_E = TypeVar("_E", bound=StrEnum)

#: A status enum that also accepts its string value when a model is built in Python (JSON is the same
#: either way), so the scheduler can pass values read from the database without converting them.
Lax = Annotated[_E, Strict(False)]

#: A string that is not empty (names, actions).
Name = Annotated[str, StringConstraints(min_length=1)]

# Bounds of what a request may carry. Each is well below what the store indexes or keeps: the one
# indexed free string, the idempotency key, is a btree key, and a btree entry holds at most 2704 bytes
# (a third of an 8 KiB page), which 200 characters of up to 4 UTF-8 bytes each (800) stay far below.

#: Longest name a request gives (task, step, action, progress step, idempotency key, cursor), in characters.
MAX_NAME_CHARS = 200
#: Longest reason a request gives (report, release, cancel, drain), in characters.
MAX_REASON_CHARS = 1024
#: Longest label key, and label value, of a device or a selector, in characters.
MAX_LABEL_CHARS = 256
#: Most labels a device or a selector has.
MAX_LABELS = 100
#: Longest version a host gives for its agent, in characters.
MAX_VERSION_CHARS = 200
#: Longest opaque cursor a reply hands out and a request gives back (an artifact's holds its name), in characters.
MAX_CURSOR_CHARS = 4096
#: Longest free-form JSON object a request keeps with a task (`metadata`), in bytes of compact UTF-8 JSON.
MAX_METADATA_BYTES = 64 * 1024

#: The validation context of a value read back (a view built from the store, a reply decoded): the request
#: bounds below are not applied to it. They guard what a request may bring; a row stored before a bound
#: existed (or was tightened) must still be shown, or one old task would make every page that lists it fail.
STORED = {"stored": True}


def _requested(info: ValidationInfo) -> bool:
    return not (isinstance(info.context, dict) and info.context.get("stored"))


def _max_chars(limit: int) -> Callable[[str, ValidationInfo], str]:
    def check(value: str, info: ValidationInfo) -> str:
        if len(value) > limit and _requested(info):
            raise PydanticCustomError(
                "string_too_long", "String should have at most {max_length} characters", {"max_length": limit}
            )
        return value

    return check


def _max_items(limit: int) -> Callable[[dict[str, str], ValidationInfo], dict[str, str]]:
    def check(value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if len(value) > limit and _requested(info):
            raise PydanticCustomError(
                "too_long", "Object should have at most {max_length} items", {"max_length": limit}
            )
        return value

    return check


def text_schema(limit: int, min_length: int = 0) -> WithJsonSchema:
    """The JSON Schema of a string of at most `limit` characters (beside `bounded_text`)."""
    schema: dict[str, Any] = {"type": "string", "maxLength": limit}
    if min_length:
        schema["minLength"] = min_length
    return WithJsonSchema(schema)


#: A name a request gives: 1 to `MAX_NAME_CHARS` characters.
ShortName = Annotated[
    str,
    StringConstraints(min_length=1),
    AfterValidator(_max_chars(MAX_NAME_CHARS)),
    text_schema(MAX_NAME_CHARS, min_length=1),
]

#: An opaque cursor (`next` of a reply, `after` of the next request): 1 to `MAX_CURSOR_CHARS` characters.
Cursor = Annotated[
    str,
    StringConstraints(min_length=1),
    AfterValidator(_max_chars(MAX_CURSOR_CHARS)),
    text_schema(MAX_CURSOR_CHARS, min_length=1),
]


def bounded_text(limit: int) -> AfterValidator:
    """The check of a request's string of at most `limit` characters; a value read back is not bounded.

    Use as `Annotated[str, bounded_text(N), text_schema(N)]` where `Field(max_length=N)` would refuse a
    stored value too.
    """
    return AfterValidator(_max_chars(limit))


#: A reason a request gives: at most `MAX_REASON_CHARS` characters.
Reason = Annotated[str, AfterValidator(_max_chars(MAX_REASON_CHARS)), text_schema(MAX_REASON_CHARS)]

#: A label key or value: at most `MAX_LABEL_CHARS` characters.
LabelText = Annotated[str, AfterValidator(_max_chars(MAX_LABEL_CHARS)), text_schema(MAX_LABEL_CHARS)]

#: The labels of a device or selector: at most `MAX_LABELS` pairs of `LabelText`.
Labels = Annotated[
    dict[LabelText, LabelText],
    AfterValidator(_max_items(MAX_LABELS)),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_LABELS,
            "propertyNames": {"maxLength": MAX_LABEL_CHARS},
            "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_CHARS},
        }
    ),
]


def _json_bytes(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    if not _requested(info):
        return value
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    if size > MAX_METADATA_BYTES:
        raise PydanticCustomError(
            "json_too_large",
            "the object is {size} bytes of JSON, above the limit of {limit}",
            {"size": size, "limit": MAX_METADATA_BYTES},
        )
    return value


#: `JsonObject` of at most `MAX_METADATA_BYTES` bytes of compact JSON (task metadata).
BoundedJsonObject = Annotated[JsonObject, AfterValidator(_json_bytes)]


class WireModel(BaseModel):
    """Common configuration: strict types, immutable values, no unknown fields, field docstrings."""

    model_config = ConfigDict(
        strict=True,
        frozen=True,
        use_attribute_docstrings=True,
        allow_inf_nan=False,
        extra="forbid",
        defer_build=True,
    )

    @classmethod
    def from_value(cls, value: object) -> Self:
        """This model built from a value with the same field names (a core view, a store receipt).

        The one conversion from what the services compute to what goes on the wire. Fields are read by
        name, nested values the same way (a tuple of views becomes a list of models); attributes the model
        lacks are left out (`TaskSummary` takes a task view without its attempts), and everything is
        validated as if built by hand. Tests check that each model and its value name the same fields.
        """
        # Lax, because the value is typed Python (tuples and mappings where the model has lists and dicts),
        # not JSON from a peer: the strictness that guards decoding has nothing to guard here.
        return cls.model_validate(value, from_attributes=True, strict=False, context=STORED)

    @classmethod
    def encode_value(cls, value: object) -> bytes:
        """`codec.encode(cls.from_value(value))`, the same bytes, in one pass through pydantic-core.

        For the relay, which writes every event this way: the model's own validation and serializer, without
        the Python layers of `model_validate` and `model_dump_json`.

        Raises:
            pydantic.ValidationError: the value does not make a valid model.
            pydantic_core.PydanticSerializationError: a string JSON cannot carry (a lone surrogate).
        """
        model = cls.__pydantic_validator__.validate_python(value, from_attributes=True, strict=False, context=STORED)
        return cls.__pydantic_serializer__.to_json(model)


class RequestModel(WireModel):
    """A message a server receives: decoding rejects unknown fields (`invalid_request`)."""


class ReplyModel(WireModel):
    """A reply or a published message: `codec.decode` ignores unknown fields, at any depth."""
