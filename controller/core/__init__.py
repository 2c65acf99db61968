"""Pure scheduling core: plain functions over frozen dataclasses (no I/O, no clocks, no randomness)."""
