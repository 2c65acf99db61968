"""The agent's version, reported to the controller in every NodeStatus."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("tessera")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"
