"""devsched.sweeper: the periodic sweep of expired leases."""
