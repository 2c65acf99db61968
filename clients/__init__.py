"""Tessera clients: the Python SDK, tessctl, the trainer SDK and the reference trainer."""
