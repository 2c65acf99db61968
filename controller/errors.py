"""What the engine raises for an unknown job or node (service.py maps them to NOT_FOUND)."""

from __future__ import annotations


class JobNotFound(Exception):
    pass


class NodeNotFound(Exception):
    pass
