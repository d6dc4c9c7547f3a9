"""Plan files and submit requests: read YAML or JSON, apply overrides, validate as the server would.

A plan file holds either a bare plan (`{"steps": [...]}`) or a whole submit request
(`{"plan": {...}, "selector": {...}, "priority": 5, ...}`). Validation goes through the protocol's own
decoder, so a mistake is reported locally with exactly the path and message the scheduler would send
(`plan.steps.0.action: Field required`), before anything reaches the network.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

from devsched.client.errors import PlanFileError, invalid
from devsched.protocol.codec import decode
from devsched.protocol.messages import Plan, Selector, SubmitRequest


class _StrictLoader(yaml.SafeLoader):
    """A safe YAML loader that rejects duplicate keys, as the protocol's JSON decoder does."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _parse(text: str, *, source: str, as_json: bool) -> Any:
    if as_json:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanFileError(
                f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                errors=[{"path": "", "message": f"{source}: not valid JSON: {exc.msg} at line {exc.lineno}"}],
            ) from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        message = f"{source}: not valid YAML: {problem}{where}"
        raise PlanFileError(message, errors=[{"path": "", "message": message}]) from None


def load_document(path: Path | str) -> dict[str, Any]:
    """Read a plan file (`.json` as JSON, anything else as YAML, which includes JSON) into a mapping.

    Raises:
        PlanFileError: the file cannot be read, does not parse, or is not a mapping.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        message = f"cannot read {path}: {exc.strerror or exc}"
        raise PlanFileError(message, errors=[{"path": "", "message": message}]) from None
    except UnicodeDecodeError:
        message = f"{path} is not UTF-8 text"
        raise PlanFileError(message, errors=[{"path": "", "message": message}]) from None
    document = _parse(text, source=str(path), as_json=path.suffix.lower() == ".json")
    if not isinstance(document, dict):
        message = f"{path} must hold a mapping (a plan with `steps`, or a submit request with `plan`)"
        raise PlanFileError(message, errors=[{"path": "", "message": message}])
    return document


def _jsonable(value: Any, path: str) -> Any:
    """Check that a parsed YAML value is plain JSON (YAML also has dates, sets, binary...)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise invalid(path, "NaN and Infinity are not JSON")
        return value
    if isinstance(value, list):
        return [_jsonable(item, f"{path}.{i}".lstrip(".")) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise invalid(path, f"keys must be strings, not {type(key).__name__} ({key!r}); quote it")
            out[key] = _jsonable(item, f"{path}.{key}".lstrip("."))
        return out
    raise invalid(path, f"a {type(value).__name__} is not JSON; quote it")


def _as_request_document(source: SubmitRequest | Plan | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(source, SubmitRequest):
        return source.model_dump(mode="json")
    if isinstance(source, Plan):
        return {"plan": source.model_dump(mode="json")}
    document = _jsonable(dict(source), "")
    if "plan" in document:
        return dict(document)
    if "steps" in document:
        return {"plan": document}
    raise invalid("", "expected a plan (a mapping with `steps`) or a submit request (a mapping with `plan`)")


def _deadline(value: str) -> str:
    """An RFC 3339 time as given, or `+SECONDS` from now on this machine's clock as one.

    Raises:
        InvalidRequest: `+SECONDS` that is not a number (path `deadline`).
    """
    if not value.startswith("+"):
        return value  # checked by the schema
    try:
        seconds = float(value[1:])
    except ValueError:
        raise invalid("deadline", f"expected an RFC 3339 time or +SECONDS, got {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise invalid("deadline", f"expected a finite number of seconds >= 0, got {value!r}")
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def build_request(
    source: SubmitRequest | Plan | Mapping[str, Any],
    *,
    name: str | None = None,
    selector: Selector | Mapping[str, str] | None = None,
    device_id: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    lease_ttl_s: int | None = None,
    idempotency_key: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    retry_on: Sequence[str] | None = None,
    queue_timeout_s: float | None = None,
    attempt_timeout_s: float | None = None,
    deadline: str | None = None,
) -> SubmitRequest:
    """A validated `SubmitRequest` from a request, a plan or a parsed document, with overrides.

    Args:
        source: A `SubmitRequest`, a `Plan`, or a mapping holding either (`{"steps": ...}` is a plan).
        name: Replaces the task name.
        selector: A `Selector` replaces the selector; a mapping of labels is merged into its labels
            (the given values win).
        device_id: Pins the task to one device.
        priority: Replaces the priority (-1000..1000).
        max_attempts: Replaces the attempt limit (1..100).
        lease_ttl_s: Replaces the lease ttl (1..3600 s).
        idempotency_key: Replaces the idempotency key.
        metadata: Merged into the metadata (the given values win).
        retry_on: The causes the retry policy retries (`infra`, `lease_expired`, `released`, `step_failed`,
            `attempt_timeout`); gives the task a policy (default backoff) if the source has none.
        queue_timeout_s: Replaces the queue timeout (seconds).
        attempt_timeout_s: Replaces the attempt timeout (seconds).
        deadline: Replaces the deadline: an RFC 3339 time, or `+SECONDS` from now (this machine's clock).

    Raises:
        InvalidRequest: the result fails the protocol's schema; `details["errors"]` has the paths.
    """
    document = _as_request_document(source)
    overrides: dict[str, Any] = {
        "name": name,
        "priority": priority,
        "max_attempts": max_attempts,
        "lease_ttl_s": lease_ttl_s,
        "idempotency_key": idempotency_key,
        "queue_timeout_s": queue_timeout_s,
        "attempt_timeout_s": attempt_timeout_s,
        "deadline": _deadline(deadline) if deadline is not None else None,
    }
    document.update({key: value for key, value in overrides.items() if value is not None})
    if retry_on is not None:
        current_retry = document.get("retry")
        document["retry"] = {**(current_retry if isinstance(current_retry, dict) else {}), "on": list(retry_on)}
    if isinstance(selector, Selector):
        document["selector"] = selector.model_dump(mode="json")
    if (selector is not None and not isinstance(selector, Selector)) or device_id is not None:
        current = document.get("selector")
        merged: dict[str, Any] = dict(current) if isinstance(current, dict) else {}
        if selector is not None and not isinstance(selector, Selector):
            labels = merged.get("labels")
            merged["labels"] = {**(labels if isinstance(labels, dict) else {}), **dict(selector)}
        if device_id is not None:
            merged["device_id"] = device_id
        document["selector"] = merged
    if metadata is not None:
        current_metadata = document.get("metadata")
        base = current_metadata if isinstance(current_metadata, dict) else {}
        document["metadata"] = {**base, **_jsonable(dict(metadata), "metadata")}
    try:
        data = json.dumps(document, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise invalid("", f"not JSON: {exc}") from None
    return decode(SubmitRequest, data)


def load_request(path: Path | str, **overrides: Any) -> SubmitRequest:
    """Read a plan file and build the submit request (see `build_request` for the overrides).

    Raises:
        PlanFileError: the file cannot be read or parsed.
        InvalidRequest: the content fails the schema (paths as the server gives them).
    """
    return build_request(load_document(path), **overrides)


def parse_labels(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`["platform=android", "model=pixel7"]` as a mapping.

    Raises:
        InvalidRequest: an item is not `key=value` with a non-empty key (path `selector.labels`).
    """
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise invalid("selector.labels", f"expected key=value, got {pair!r}")
        labels[key.strip()] = value
    return labels
