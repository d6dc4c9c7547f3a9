"""Each endpoint's request and reply JSON Schema, published in `$SRV.INFO` so `nats micro info` documents the API.

The schemas come from the pydantic models the endpoints decode and encode, so they cannot drift from what
the service accepts. They travel in the endpoint's `metadata` (micro's metadata is string to string):
`request_schema` (validation mode: what a request may carry) and `response_schema` (serialization mode:
what a success reply carries), each compact JSON. Error replies are described in docs/protocol.md.
"""

from __future__ import annotations

import json
from functools import cache

from pydantic import BaseModel

#: The metadata keys of an endpoint's schemas.
REQUEST_SCHEMA_KEY = "request_schema"
RESPONSE_SCHEMA_KEY = "response_schema"


@cache
def _schema(model: type[BaseModel], mode: str) -> str:
    schema = model.model_json_schema(mode="validation" if mode == "validation" else "serialization")
    return json.dumps(schema, separators=(",", ":"), sort_keys=True)


def endpoint_schemas(request_type: type[BaseModel], reply_type: type[BaseModel]) -> dict[str, str]:
    """The `metadata` entries that describe an endpoint taking `request_type` and replying `reply_type`."""
    return {
        REQUEST_SCHEMA_KEY: _schema(request_type, "validation"),
        RESPONSE_SCHEMA_KEY: _schema(reply_type, "serialization"),
    }
