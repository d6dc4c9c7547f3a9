"""devsched.scheduler: the control plane's NATS service, JetStream streams, outbox relay and assignment loop."""
