"""Shared fixtures: the e2e and chaos suites start real clusters (tests/e2e/cluster.py)."""

pytest_plugins = ["tests.e2e.cluster"]
