"""The ranges and defaults of what a submit may set, and of a listing's page size (PROTOCOL.md).

The protocol checks requests against them and the store's values default to them, so each number of
the contract is written once.
"""

#: Range and default of `priority` (higher runs first).
PRIORITY_MIN, PRIORITY_MAX, PRIORITY_DEFAULT = -1000, 1000, 0
#: Range and default of `max_attempts`.
MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX, MAX_ATTEMPTS_DEFAULT = 1, 100, 3
#: Range and default of `lease_ttl_s`.
LEASE_TTL_MIN_S, LEASE_TTL_MAX_S, LEASE_TTL_DEFAULT_S = 1, 3600, 30
#: Range and default of a list page's `limit`.
LIST_LIMIT_MIN, LIST_LIMIT_MAX, LIST_LIMIT_DEFAULT = 1, 1000, 100
#: Default of how many times a task may be released (given back by its host) and requeued; the release
#: after that fails it (`released_too_often`), so a task that makes every agent stop cannot loop forever.
MAX_RELEASES_DEFAULT = 10
#: Longest `queue_timeout_s`, `attempt_timeout_s` and retry backoff a task may set (about 115 days): beyond
#: it, the database's interval arithmetic would overflow long before anyone waited that long.
TIMEOUT_MAX_S = 10_000_000
#: Most leases one `renewals` request may name (a host with more sends several).
MAX_RENEWALS_PER_REQUEST = 256
#: Most reports one `reports` request may carry (a host with more ready at once sends several); its bytes
#: are bounded too, by the request payload limit.
MAX_REPORTS_PER_REQUEST = 64
