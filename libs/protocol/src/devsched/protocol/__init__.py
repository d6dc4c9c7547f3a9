"""devsched.protocol."""
