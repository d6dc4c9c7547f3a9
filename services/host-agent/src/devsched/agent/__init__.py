"""devsched.agent: the host agent (registration, assignment consumer, plan runner, renewals, reports)."""
