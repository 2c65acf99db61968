"""Security tests: real controller processes over real gRPC (docs/auth.md)."""
