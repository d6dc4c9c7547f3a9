"""Helpers for the test suite: server handles, per-test databases, bounded polling."""
