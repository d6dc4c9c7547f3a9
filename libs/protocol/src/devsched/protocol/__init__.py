"""devsched.protocol: the wire contract (docs/protocol.md) as code.

`messages` holds every message model, `codec` turns bytes into models and errors into replies,
`subjects` derives every name from the prefix, `tracing` carries W3C trace context in headers, and
`transport` wires typed handlers and requests onto nats-py. Only this package and the services import
`nats`.
"""
