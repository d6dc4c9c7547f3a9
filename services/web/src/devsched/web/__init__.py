"""devsched-web: the dashboard, an operator client over NATS (never the database).

It reads what the `devsched` CLI reads (`devsched.client`), keeps a small in-memory picture of the lab
refreshed every few seconds (`sampler`), renders it server-side (Jinja2, autoescaped) and pushes live
fragments with server-sent events. It is read-only unless `DEVSCHED_WEB_ACTIONS` is on.
"""
