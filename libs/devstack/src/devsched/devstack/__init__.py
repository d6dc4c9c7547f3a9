"""`devsched up`: NATS, Postgres, the services and simulated hosts on one machine, with a demo."""

from devsched.devstack.stack import UpOptions, run_up

__all__ = ["UpOptions", "run_up"]
