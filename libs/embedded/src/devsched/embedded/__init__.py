"""devsched.embedded."""
