"""Test access to the local-cluster helpers (real processes, event-based waits)."""

from tessera.common.localcluster import (  # noqa: F401
    BIN,
    CREDENTIALS,
    REPO,
    Daemon,
    env,
    kill_strays,
    local_tokens,
    node_channel,
    start_agent,
    start_controller,
    tessctl,
    tessctl_json,
    user_channel,
    wait_for,
)
