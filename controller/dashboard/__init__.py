"""The controller's read-only web dashboard (docs/dashboard.md)."""
