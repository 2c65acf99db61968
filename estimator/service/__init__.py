"""The estimator's gRPC side: request handlers over the library (handlers), the asyncio servicer
(server), traced-mode estimates in a child process under a budget (traced_child), the SQLite state
of what was learned (state) and the daemon (main, `tessera-estimator`).

Nothing here is imported by the pure library above it; `tessctl estimate` without `--estimator`
imports `handlers` only (no grpc server, no asyncio).
"""
