"""devsched.core: the domain, kept pure (no I/O, no clock: `now` is always a parameter)."""
