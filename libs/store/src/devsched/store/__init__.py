"""devsched.store."""
