"""What the controllers of one etcd cluster must agree on, and the checks that refuse a controller
that does not (docs/ha.md, "Settings the controllers share").

Each leader records its settings in `<prefix>meta/settings` when it takes the lead:

- `checkpoint_root` must be the same for every controller: a requeued job is launched with
  `<checkpoint root>/<job id>` (controller/launches.py), so a leader with a root of its own restarts
  every job it requeues from iteration 0, and the checkpoint FENCE file (docs/fencing.md) fences
  nothing (a live audit: each controller had the default STATE_DIR/checkpoints of its own state
  dir). A controller whose root differs from the recorded one refuses: at start, before it stands by
  (exit 2), and when it takes the lead (it resigns at once, exit 2), which catches one started
  before the key named another root.
- `policy` (with its mode) and `tenants` (a digest of the tenants file) may differ for a moment, in
  a rolling change of the flags; a leader that takes over with other values than the last leader's
  logs `settings_differ` naming each, and leads (a standby with --policy fcfs took over from crius
  leaders without a word, before).

A controller given another's --advertise is refused at start too (`advertise_refusal`), once the
leader key naming it has outlived a TTL (controller/ha.py: the key of a process that died goes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import grpc.aio
import structlog
from aetcd import rpc as etcdrpc

from tessera.common.errors import Unavailable
from tessera.controller.core.policies import ALIASES
from tessera.controller.election import Leadership, NotLeader
from tessera.controller.engine_config import EngineConfig
from tessera.controller.etcd import EtcdClient, one_line

log = structlog.get_logger("tessera.controller.ha_settings")

SETTINGS_KEY = "meta/settings"
REFUSED_EXIT = 2  # as a bad flag: fixing the flag is what it takes


@dataclass(frozen=True)
class Settings:
    checkpoint_root: str
    policy: str = ""
    policy_mode: str = ""
    tenants: str = ""  # "sha256:<hex>" of the tenants file's bytes; "" without one

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def parse(cls, raw: bytes) -> Settings | None:
        """None for a value that is not a settings document (then it is written again)."""
        try:
            doc = json.loads(raw)
            return cls(**{f.name: str(doc.get(f.name, "")) for f in dataclasses.fields(cls)})
        except (ValueError, TypeError, AttributeError):
            return None


def checkpoint_root_problem(store: str, checkpoint_root: str) -> str:
    """Why the flags cannot run a controller of several ("" when they can): with --store etcd the
    default root, below each controller's own --state-dir, is a folder of its own."""
    if store == "etcd" and not checkpoint_root:
        return ("--store etcd needs --checkpoint-root DIR, the same shared folder (every node's workers and every "
                "controller reach it at that path) for every controller: a job requeued by another leader "
                "resumes from its checkpoint there (docs/ha.md)")
    return ""


def tenants_digest(path: str) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            return "sha256:" + hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        return f"unreadable ({e.strerror or e})"


def settings_of(cfg: EngineConfig) -> Settings:
    policy = cfg.policy.strip().lower()
    return Settings(checkpoint_root=cfg.checkpoint_root, policy=ALIASES.get(policy, policy),
                    policy_mode=cfg.policy_mode, tenants=tenants_digest(cfg.tenants_file))


def differences(recorded: Settings, mine: Settings) -> list[dict[str, str]]:
    return [{"setting": f.name, "last_leader": getattr(recorded, f.name), "this": getattr(mine, f.name)}
            for f in dataclasses.fields(Settings) if getattr(recorded, f.name) != getattr(mine, f.name)]


def root_refusal(recorded: Settings | None, mine: Settings, prefix: str) -> str:
    """The one line that refuses a controller whose checkpoint root is not the cluster's; ""."""
    if recorded is None or recorded.checkpoint_root == mine.checkpoint_root:
        return ""
    key = prefix + SETTINGS_KEY
    return (f"--checkpoint-root {mine.checkpoint_root} is not the cluster's checkpoint root, "
            f"{recorded.checkpoint_root} (etcd {key}, recorded by its leader): every controller needs the same "
            f"shared --checkpoint-root, or each job another leader requeues restarts from iteration 0; to move "
            f"the cluster's, stop every controller, run etcdctl del {key}, and start them all with the new root")


def advertise_refusal(lead: Leadership) -> str:
    """The one line that refuses a controller whose --advertise the leader key names, written by
    another controller; ""."""
    if not lead.address_taken():
        return ""
    epoch = lead.seen_leader[1] if lead.seen_leader else 0
    return (f"--advertise {lead.address} is the address of the leader (epoch {epoch}, {lead.seen_instance}), "
            f"another controller: clients and agents sent to it would reach only one of the two; each "
            f"controller needs its own --advertise, the address it is reached at")


async def _read(client: EtcdClient) -> Settings | None:
    key = (client.cfg.prefix + SETTINGS_KEY).encode()
    resp = await client.rpc(lambda: client.kv.Range(etcdrpc.RangeRequest(key=key), timeout=client.cfg.timeout_s))
    return Settings.parse(bytes(resp.kvs[0].value)) if resp.kvs else None


def read_settings(client: EtcdClient) -> Settings | None:
    return client.call(_read(client))


def record_settings(client: EtcdClient, lead: Leadership, mine: Settings) -> None:
    """Write `mine` as the leader's (fenced: NotLeader once this controller does not lead)."""
    key = (client.cfg.prefix + SETTINGS_KEY).encode()
    put = etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=mine.to_json()))
    txn = etcdrpc.TxnRequest(compare=[lead.fence()], success=[put])
    resp: Any = client.call(client.rpc(lambda: client.kv.Txn(txn, timeout=client.cfg.timeout_s)))
    if not resp.succeeded:
        raise NotLeader(f"not the leader any more (epoch {lead.epoch}): its settings were not recorded")


def check_at_start(client: EtcdClient, lead: Leadership, mine: Settings) -> str:
    """The refusal of a controller about to stand by ("" when none). An etcd that does not answer
    yet refuses nothing: the campaign waits for it, and the checks at takeover stand in."""
    try:
        recorded = read_settings(client)
        lead.current_leader()
    except (Unavailable, grpc.aio.AioRpcError) as exc:
        log.info("start_checks_skipped", reason=one_line(str(exc))[:200])
        return ""
    return root_refusal(recorded, mine, client.cfg.prefix) or advertise_refusal(lead)


def take_over(client: EtcdClient, lead: Leadership, mine: Settings) -> str:
    """At the start of a term: the refusal of a checkpoint root not the cluster's ("": lead), after
    which the caller resigns; otherwise `settings_differ` for any other difference, and `mine`
    recorded. etcd's errors are raised, as the store's first reads raise theirs."""
    recorded = read_settings(client)
    refusal = root_refusal(recorded, mine, client.cfg.prefix)
    if refusal:
        return refusal
    if recorded is not None and recorded != mine:
        log.warning("settings_differ", epoch=lead.epoch, differences=differences(recorded, mine),
                    detail="this leader's settings are not the last leader's: the controllers of a cluster "
                    "should run with the same --policy, --policy-mode and tenants file (docs/ha.md)")
    if recorded != mine:
        record_settings(client, lead, mine)
    return ""
