"""The SQLite store's schema (controller/store.py, `SqliteStore`), and its migrations.

`SCHEMA` runs at every open (every statement IF NOT EXISTS): an index added here is made at the next
start, in the opening transaction. A new column needs a migration: `MIGRATIONS[v]` brings a database
at schema version v to v + 1 (store.SCHEMA_VERSION is the newest). `jobs_tenant_state` answers
`count_jobs` (SubmitJob's cap on a tenant's jobs not yet ended, controller/unended.py) and
`count_jobs_by_tenant` (ListTenants' pending counts) from the index alone, without reading a row.
"""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL, state INTEGER NOT NULL,
  reason TEXT NOT NULL, submit_time REAL NOT NULL, attempt INTEGER NOT NULL, spec BLOB NOT NULL,
  plan BLOB, placement BLOB, progress BLOB, start_time REAL NOT NULL, end_time REAL NOT NULL,
  restarts INTEGER NOT NULL, retries INTEGER NOT NULL, stop_requested INTEGER NOT NULL,
  launch_failures INTEGER NOT NULL DEFAULT 0, next_launch_time REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_page ON jobs(submit_time, id);
CREATE INDEX IF NOT EXISTS jobs_tenant_page ON jobs(tenant, submit_time, id);
CREATE INDEX IF NOT EXISTS jobs_tenant_state ON jobs(tenant, state);
CREATE TABLE IF NOT EXISTS node_removals (
  request_id TEXT PRIMARY KEY, node_id TEXT NOT NULL, time REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, time REAL NOT NULL,
  kind TEXT NOT NULL, message TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, seq);
CREATE TABLE IF NOT EXISTS nodes (
  id TEXT PRIMARY KEY, address TEXT NOT NULL, inventory BLOB NOT NULL, drained INTEGER NOT NULL,
  drain_reason TEXT NOT NULL, launch_failures INTEGER NOT NULL DEFAULT 0,
  unhealthy_until REAL NOT NULL DEFAULT 0);
"""

# Schema migrations: MIGRATIONS[v] brings a database at version v to v + 1, inside the opening
# transaction (a crash mid-way leaves the old version, whole).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE jobs ADD COLUMN launch_failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN next_launch_time REAL NOT NULL DEFAULT 0",
        "ALTER TABLE nodes ADD COLUMN launch_failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE nodes ADD COLUMN unhealthy_until REAL NOT NULL DEFAULT 0"),
}
