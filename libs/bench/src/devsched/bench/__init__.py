"""`devsched bench`: the end-to-end benchmark of the real services on durable embedded servers (devsched-bench).

Every figure is printed beside a floor or a peer measured in the same run (a bare NATS echo, a one-row
UPDATE, an UPDATE-per-request responder, Procrastinate), so that what counts is a ratio, not a number
that depends on the machine. Modules: `runner` (the run), `servers` (the durable system), the phases
(`lifecycle` with `peer`, `latency`, `renewals`, `sweep`, `memory`), `report` and `plot` (the output),
`profiling` (py-spy and pg_stat_statements), and what they share (`context`, `probes`, `pgstats`, `load`,
`hosts`, `responders`, `seeding`, `figures`, `options`, `conditions`), and `command`, which adds `bench` to
`devsched` through the `devsched.cli_plugins` entry point. It runs the dev stack's servers and services
(devsched-devstack); the dev stack never imports it.
"""
