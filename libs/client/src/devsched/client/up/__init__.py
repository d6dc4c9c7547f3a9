"""`devsched up`: NATS, Postgres, the services and simulated hosts on one machine, with a demo."""

from devsched.client.up.runner import UpOptions, run_up

__all__ = ["UpOptions", "run_up"]
