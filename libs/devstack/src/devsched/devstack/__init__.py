"""`devsched up`: NATS, Postgres, the services and simulated hosts on one machine, with a demo.

Modules: `cli` (the `up` and `migrate` commands, this package's `devsched.cli_plugins` entry point), `stack` (the
run: `UpOptions`, `run_up`), `processes`, `layout`, `demo` and `dashboard`. Nothing is imported here: `devsched`
loads `cli` to list or run a command, and `stack` (the store, SQLAlchemy) only once `up` runs.
"""
