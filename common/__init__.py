"""Runtime pieces every Tessera daemon and client shares: gRPC construction, logging, notify, metrics."""
