"""Estimator: pure models of memory, speed and Cells (the modules here), the service that answers
them (`service/`: handlers, gRPC server, SQLite state, the daemon) and the torch code (`torch/`:
traced memory, profilers). The library imports neither subpackage (pyproject.toml's import contracts).
"""
