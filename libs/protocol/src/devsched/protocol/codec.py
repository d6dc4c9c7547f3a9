"""The one place where bytes become models and models become bytes, and errors become replies.

`decode` is stricter than a plain `json.loads`: the protocol rejects duplicate keys, NaN/Infinity and
non-objects, which Python's and pydantic's parsers would silently accept (last key wins, NaN is a float),
and text the store cannot keep (NUL, lone surrogates: `devsched.core.text`), which would otherwise fail
in Postgres, after the request was accepted, as an `internal` error.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Literal, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from devsched.core.errors import (
    BY_CODE,
    Conflict,
    DevschedError,
    Internal,
    InvalidRequest,
    NotFound,
    StorageFull,
    TooLarge,
    TooManyRequests,
    Unavailable,
)
from devsched.core.text import RULE as UNSTORABLE_RULE
from devsched.core.text import unstorable_paths
from devsched.protocol.base import STORED, ReplyModel
from devsched.protocol.events import ErrorBody, ErrorDetail

M = TypeVar("M", bound=BaseModel)

#: Reply header with the HTTP-like error number (set by nats-py micro's `respond_error`).
ERROR_CODE_HEADER = "Nats-Service-Error-Code"
#: Reply header with a short error text.
ERROR_HEADER = "Nats-Service-Error"

#: Most schema errors listed in `details.errors`; the rest are counted in `details.error_count`.
MAX_LISTED_ERRORS = 100
#: Longest `Nats-Service-Error` text; the full message is in the body.
MAX_ERROR_HEADER_CHARS = 200

#: When a reply has an error number but no readable body (a foreign or crashed responder).
_BY_STATUS: dict[int, type[DevschedError]] = {
    400: InvalidRequest,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    429: TooManyRequests,
    503: Unavailable,
    507: StorageFull,
}


class _Rejected(ValueError):
    """Raised from inside `json.loads` hooks to abort parsing with our own message."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dupes: set[str] = set()
        for key, _ in pairs:
            (dupes if key in seen else seen).add(key)
        raise _Rejected(f"duplicate key {', '.join(map(repr, sorted(dupes)))}")
    return obj


def _no_constant(literal: str) -> NoReturn:
    raise _Rejected(f"{literal} is not valid JSON")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e400 parses as inf
        raise _Rejected(f"number {literal} is out of range")
    return value


#: The JSON escapes that give text Postgres cannot keep: `\u0000` and a surrogate `\ud800`..`\udfff` (hex in
#: any case). Raw NUL is not JSON and raw UTF-8 holds no surrogate, so a body without one of these escapes is
#: storable and is not walked; with one (a proper surrogate pair too), the parsed body is.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")

#: The protocol's strict parser, made once: `json.loads` with hooks builds a decoder and its scanner on
#: every call, a good part of decoding a small request.
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite_float)


def _invalid(errors: list[dict[str, str]], total: int | None = None) -> InvalidRequest:
    total = len(errors) if total is None else total
    first = errors[0]
    where = f"{first['path']}: " if first["path"] else ""
    more = f" (and {total - 1} more)" if total > 1 else ""
    details: dict[str, Any] = {"errors": errors[:MAX_LISTED_ERRORS]}
    if total > MAX_LISTED_ERRORS:
        details["error_count"] = total
    return InvalidRequest(f"invalid request: {where}{first['message']}{more}", **details)


def _body_error(message: str) -> InvalidRequest:
    return _invalid([{"path": "", "message": message}])


def schema_errors(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic's errors as `{"path": "plan.steps.0.action", "message": ...}` (the protocol's shape).

    An error in an object's key is at `<object>.<key>` (pydantic's location repeats the refused key itself).
    """
    return [{"path": _path(e["loc"]), "message": e["msg"]} for e in exc.errors(include_url=False, include_input=False)]


def _path(loc: tuple[int | str, ...]) -> str:
    if len(loc) >= 2 and loc[-1] == "[key]":
        loc = (*loc[:-2], "<key>")
    return ".".join(str(part) for part in loc)


def _refuse_unstorable(parsed: dict[str, Any]) -> None:
    """Refuse a body holding text the store cannot keep, naming each place and the rule, never the value."""
    try:
        paths = [".".join(path) for path in unstorable_paths(parsed)]
    except RecursionError:  # nested deeper than the walk can go, though the parser took it
        raise _body_error("body is not acceptable JSON: RecursionError") from None
    if paths:
        raise _invalid([{"path": path, "message": UNSTORABLE_RULE} for path in paths])


def _extra(model_type: type[BaseModel]) -> Literal["ignore"] | None:
    # Forward compatibility: a newer server may add fields to what it sends; what it receives stays exact.
    return "ignore" if issubclass(model_type, ReplyModel) else None


def decode(model_type: type[M], data: bytes) -> M:
    """Parse and validate `data` as `model_type`.

    A `ReplyModel` (reply, stream message, error body) ignores unknown fields at any depth; anything
    else, requests in particular, rejects them, and text the store cannot keep (a log record's output may
    hold a NUL: it goes to a stream, never to the store).

    An empty body reads as `{}`, so endpoints without required fields work from the NATS CLI with `''`.

    Raises:
        InvalidRequest: not UTF-8, not JSON, not an object, a duplicate key, NaN/Infinity, text the store
            cannot keep (a NUL or a lone surrogate in any key or string, at any depth, of a request), or a
            schema error; `details["errors"]` lists `{"path", "message"}`, path `""` meaning the whole body.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _body_error(f"body is not valid UTF-8 (byte {exc.start})") from None
    if not text.strip():
        # `nats req P.api.hosts.list ''`: an empty body is the empty object, so the schema says what is missing
        text = "{}"
    try:
        if text.startswith("\ufeff"):  # as `json.loads` refuses it (a decoder's `decode` would not say why)
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        parsed = _DECODER.decode(text)
    except _Rejected as exc:
        raise _body_error(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise _body_error(f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer with too many digits, deep nesting
        raise _body_error(f"body is not acceptable JSON: {type(exc).__name__}") from None
    if not isinstance(parsed, dict):
        raise _body_error(f"body must be a JSON object, not {type(parsed).__name__}")
    if "\\u" in text and _SUSPECT_ESCAPE.search(text) is not None and not issubclass(model_type, ReplyModel):
        _refuse_unstorable(parsed)
    # Validate the original text in JSON mode: strict types then accept RFC 3339 strings for timestamps
    # and UUID strings for ids, which Python-mode strict validation of `parsed` would refuse.
    try:
        extra = _extra(model_type)
        # A reply shows what the server stored, which may predate a request bound: only requests are bounded.
        return model_type.model_validate_json(text, extra=extra, context=STORED if extra else None)
    except ValidationError as exc:
        errors = schema_errors(exc)
        raise _invalid(errors) from None


def from_jsonable(model_type: type[M], value: Mapping[str, Any]) -> M:
    """Rebuild a model from JSON that is already parsed and was validated on its way in.

    For a JSONB column or an outbox row: strict Python-mode validation would refuse the timestamp and
    UUID strings of parsed JSON, so this validates leniently. Never use it for input from the wire.
    """
    return model_type.model_validate(value, strict=False, extra=_extra(model_type), context=STORED)


def encode(model: BaseModel) -> bytes:
    """Compact JSON of `model`; null fields are written, as the protocol shows them."""
    return model.model_dump_json(exclude_none=False).encode()


#: Most field paths a refusal's log line names, and the longest of them (paths name submitted keys too).
MAX_LOGGED_PATHS = 10
MAX_LOGGED_PATH_CHARS = 120


def refusal_log_fields(err: DevschedError) -> dict[str, Any]:
    """What a log line may say of an error reply: its code, its status and the paths of the fields refused.

    `paths` is one string, the paths separated by spaces (`<body>` for the body as a whole).

    Never the message: messages may quote what was submitted (a schema error quotes the bad value, a
    plug-in's jsonschema message a mistyped argument, which may be a token), and a log is read by more
    people, kept longer and shipped further than the reply that went to the one who sent it.
    """
    fields: dict[str, Any] = {"error": err.code, "status": err.status}
    errors = err.details.get("errors")
    if isinstance(errors, list) and errors:
        fields["paths"] = " ".join(
            str(e.get("path", ""))[:MAX_LOGGED_PATH_CHARS] or "<body>"
            for e in errors[:MAX_LOGGED_PATHS]
            if isinstance(e, dict)
        )
    return fields


def _header_text(text: str) -> str:
    line = " ".join(text.split())  # header values cannot hold newlines
    return line[:MAX_ERROR_HEADER_CHARS]


def encode_error(err: DevschedError) -> tuple[dict[str, str], bytes]:
    """The headers and body of the error reply for `err`.

    Returns:
        `Nats-Service-Error-Code` (the number as a string) and `Nats-Service-Error` (the message,
        one line, shortened), and the body `{"error": {"code", "message", "details"}}`.
    """
    headers = {ERROR_CODE_HEADER: str(err.status), ERROR_HEADER: _header_text(err.message)}
    try:
        body = encode(ErrorBody(error=ErrorDetail(code=err.code, message=err.message, details=err.details)))
    except (PydanticSerializationError, ValidationError, TypeError, ValueError):
        # Details that are not JSON must not turn an answer into no answer.
        body = encode(ErrorBody(error=ErrorDetail(code=err.code, message=err.message)))
    return headers, body


def error_from_reply(headers: Mapping[str, str] | None, body: bytes) -> DevschedError | None:
    """The typed error an error reply carries, or None for a successful reply."""
    if not headers or ERROR_CODE_HEADER not in headers:
        return None
    status_text = headers[ERROR_CODE_HEADER]
    status = int(status_text) if status_text.strip().isdigit() else 500
    try:
        detail = decode(ErrorBody, body).error
    except InvalidRequest:
        # Not one of our bodies (nats-py micro's own 500 for an uncaught exception has an empty body).
        cls = _BY_STATUS.get(status, Internal)
        return cls(headers.get(ERROR_HEADER) or None)
    cls = BY_CODE.get(detail.code) or _BY_STATUS.get(status, Internal)
    err = cls(detail.message)
    err.details = dict(detail.details)
    return err


def raise_for_error(headers: Mapping[str, str] | None, body: bytes) -> None:
    """Raise the typed error of an error reply; return quietly for a successful one.

    nats-py raises nothing for error replies, so every client calls this on every reply. The class comes
    from core's `BY_CODE` by the body's `code`; a code this version does not know falls back to the class
    of the header's number (409 -> `Conflict`, ...), keeping message and details.
    """
    err = error_from_reply(headers, body)
    if err is not None:
        raise err
