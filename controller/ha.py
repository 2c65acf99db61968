"""`tessera-controller --store etcd`: one of several controllers, of which the one holding the etcd
lease leads (docs/ha.md).

    refuse to start (exit 2) when etcd says this controller's settings cannot be the cluster's
    (another --checkpoint-root, another controller's --advertise: controller/ha_settings.py)
      -> serve gRPC as a standby (UNAVAILABLE "not the leader; leader at ADDR")
      -> campaign (controller/election.py) until this controller leads, with a new epoch
      -> check and record its settings (a checkpoint root not the cluster's: resign, exit 2)
      -> load the state from etcd (EtcdStore), build the engine, serve and run the loops
      -> on SIGTERM: stop, revoke the lease (a standby leads at once);
         on losing the lease: refuse every call at once, stop the loops, exit 1 (systemd restarts
         it as a standby: nothing of the deposed leader's memory survives into its next term).

Every agent call goes through `LeaderAgents`, which refuses once the local lease deadline has
passed, every store write carries the leader's fence, and every answer of the gRPC switch is sent
only while that deadline holds (controller/leader_gate.py), so a deposed leader acts on none of
them and acknowledges no heartbeat (docs/fencing.md, "Several controllers").

Like `serve()` for SQLite, the leader runs the retention sweep (controller/retention.py), and signs
ListJobs continue tokens with a key every controller of the cluster shares (`meta/page_key` in
etcd, made by the first leader), so a client's next page survives a failover.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import structlog

from tessera.common import daemon, logs, metrics, rpc, tls
from tessera.common.hooks import Hooks
from tessera.controller.agents import AgentClients
from tessera.controller.dashboard.server import Dashboard
from tessera.controller.election import Leadership, NotLeader
from tessera.controller.engine import Engine, EngineConfig
from tessera.controller.etcd import EtcdClient, EtcdConfig, parse_endpoints
from tessera.controller.etcdstore import EtcdStore
from tessera.controller.ha_settings import REFUSED_EXIT, check_at_start, settings_of, take_over
from tessera.controller.leader_gate import LeaderSwitch
from tessera.controller.loops import loops
from tessera.controller.registry import LivenessConfig, fence_seconds
from tessera.controller.retention import Retention, RetentionConfig
from tessera.controller.service import ControllerService, RegistryService
from tessera.controller.tenants import on_sighup
from tessera.v1 import agent_pb2, agent_pb2_grpc, controller_pb2, controller_pb2_grpc

log = structlog.get_logger("controller")
LOST_EXIT = 1
PAGE_KEY = "page_key"  # meta/page_key: the key of ListJobs continue tokens, shared by the controllers
RENDEZVOUS_KEY = "rendezvous_key"  # meta/rendezvous_key: the attempts' rendezvous keys derive from it
# The node agent's defaults (nodeagent/agent.py rpc_deadline, registration.py max_backoff).
AGENT_CALL_DEADLINE_S = 5.0
AGENT_MAX_BACKOFF_S = 2.0


def failover_gap(lv: LivenessConfig, ttl_s: int) -> float:
    """About the longest an agent goes without an acknowledged heartbeat across a failover
    (docs/ha.md, "Failover and the agents' fence"): its last acknowledged heartbeat came up to one
    interval before the leader died or stalled; the new leader leads within ttl + 0.5 s of that, and
    a heartbeat to a stalled leader hangs for the agent's call deadline; then one backoff."""
    return lv.heartbeat_interval_s + max(AGENT_CALL_DEADLINE_S, ttl_s + 0.5) + AGENT_MAX_BACKOFF_S


class LeaderAgents:
    """AgentCalls that go out only while this controller leads (its local lease deadline)."""

    def __init__(self, inner: AgentClients, lead: Leadership) -> None:
        self.inner, self.lead = inner, lead

    def _check(self) -> None:
        if not self.lead.is_leader():
            raise NotLeader(f"not the leader any more (epoch {self.lead.epoch}): no agent call")

    async def launch(self, node_id: str, address: str, req: agent_pb2.LaunchRequest) -> agent_pb2.LaunchResponse:
        self._check()
        return await self.inner.launch(node_id, address, req)

    async def stop(self, node_id: str, address: str, epoch: int, job_id: str, attempt: int, grace_s: float,
                   reason: str) -> None:
        if self.lead.is_leader():
            await self.inner.stop(node_id, address, epoch, job_id, attempt, grace_s, reason)

    async def drain(self, node_id: str, address: str, epoch: int, drain: bool) -> str:
        if not self.lead.is_leader():
            return f"not the leader any more (epoch {self.lead.epoch}): the agent was not called"
        return await self.inner.drain(node_id, address, epoch, drain)

    async def read_log(self, node_id: str, address: str, req: agent_pb2.ReadLogRequest) -> agent_pb2.ReadLogResponse:
        self._check()
        return await self.inner.read_log(node_id, address, req)

    async def close(self) -> None:
        await self.inner.close()


def _refuse(message: str) -> NoReturn:
    """One line on stderr and exit 2, as a bad flag's (the logs go to stderr too)."""
    print(f"tessera-controller: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(REFUSED_EXIT)


def etcd_config(args: argparse.Namespace) -> EtcdConfig:
    prefix = args.etcd_prefix if args.etcd_prefix.endswith("/") else args.etcd_prefix + "/"
    return EtcdConfig(parse_endpoints(args.etcd_endpoints), prefix=prefix, ca=args.etcd_ca, cert=args.etcd_cert,
                      key=args.etcd_key)


def advertised(listen: str, port: int, advertise: str) -> str:
    if advertise:
        return advertise
    host = listen.rpartition(":")[0]
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = socket.gethostname()
    return f"{host}:{port}"


# Builds the controller's server from its registrations and hooks: (server, users' port, agents' port).
ServerFactory = Callable[[list[tuple[Any, Any]], Hooks], tuple[rpc.ServerGroup, int, int]]
COMPONENT = "tessera-controller"
# What the controller serves (health statuses and reflection), in either mode.
SERVICES = (controller_pb2.DESCRIPTOR.services_by_name["Controller"].full_name,
            agent_pb2.DESCRIPTOR.services_by_name["AgentRegistry"].full_name)


async def serve_ha(args: argparse.Namespace, cfg: EngineConfig, state: Path, make_server: ServerFactory,
                   dashboard: Dashboard | None = None) -> None:
    """`dashboard` (--dashboard-addr) answers 503 until this controller leads, then shows its engine."""
    client = EtcdClient(etcd_config(args))
    services = [controller_pb2.DESCRIPTOR.services_by_name["Controller"],
                agent_pb2.DESCRIPTOR.services_by_name["AgentRegistry"]]
    lead: Leadership | None = None

    def leader_address() -> str:
        # As the campaign last read it: answering a standby's caller must not wait on etcd.
        return lead.leader_hint() if lead is not None else ""

    if dashboard is not None:
        dashboard.leader = leader_address  # its 503 names the leader, as the gRPC refusal does

    def leading() -> bool:
        return lead is not None and lead.is_leader()

    switch = LeaderSwitch(services, leader_address, leading)
    # NOT_SERVING until this controller leads with its state loaded (docs/observability.md).
    hooks = Hooks(COMPONENT, SERVICES, serving=False)
    server, port, agent_port = make_server([(lambda s, srv: srv.add_generic_rpc_handlers((s,)), switch)], hooks)
    address = advertised(args.listen, port, args.advertise)
    # Tells this controller's own earlier run (its lease not expired yet) from another controller
    # given the same --advertise.
    lead = Leadership(client, address, ttl_s=args.etcd_lease_ttl,
                      instance=f"{socket.gethostname()}:{state.resolve()}")
    mine = settings_of(cfg)
    refusal = check_at_start(client, lead, mine)
    if refusal and lead.address_taken():
        # The key of a process that died (its machine or pod replaced under a new host name) goes
        # within a TTL; a live leader's stays.
        log.warning("advertise_in_use_waiting", address=address, leader_instance=lead.seen_instance,
                    seconds=lead.ttl_s + 1)
        await asyncio.sleep(lead.ttl_s + 1)
        refusal = check_at_start(client, lead, mine)
    if refusal:
        client.close()
        _refuse(refusal)
    await server.start()
    gap, fence = failover_gap(cfg.liveness, lead.ttl_s), fence_seconds(cfg.liveness)
    if fence <= gap:
        log.warning("fence_below_failover_gap", fence=fence, failover_gap=gap,
                    detail="agents may stop their workers during a failover (every running job then restarts "
                    "from its checkpoint): raise --fence and --lease, or shorten --heartbeat-interval (docs/ha.md)")
    mport = metrics.serve(args.metrics_listen, args.metrics_token_file)
    # The transport and certificate, as a controller on SQLite says them (the insecure_transport
    # warning and gauge, the certificate's expiry): before, a controller on etcd said neither.
    tls.announce("tessera-controller", args.tls)
    host = args.listen.rpartition(":")[0]
    agent_host = args.agent_listen.rpartition(":")[0]
    log.info("controller_started", listen=f"{host}:{port}", agent_listen=f"{agent_host}:{agent_port}",
             role="standby", address=address, transport="insecure" if args.tls is None else "tls",
             etcd=",".join(client.cfg.endpoints), prefix=client.cfg.prefix, lease_ttl=lead.ttl_s,
             metrics_port=mport, pid=os.getpid())
    signals = asyncio.create_task(daemon.serve_until_signal(f"standby on {host}:{port}"))
    campaign: asyncio.Future[int] = asyncio.wrap_future(client.submit(lead.campaign()))
    first: list[asyncio.Future[object]] = [signals, campaign]  # type: ignore[list-item]
    await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
    engine: Engine | None = None
    agents = AgentClients(args.tls)
    tasks: list[asyncio.Task[None]] = []
    lost = asyncio.Event()
    if not signals.done():
        epoch = campaign.result()
        loop = asyncio.get_running_loop()

        def on_lost(why: str) -> None:
            loop.call_soon_threadsafe(hooks.set_serving, False)
            loop.call_soon_threadsafe(lost.set)

        lead.on_lost = on_lost
        logs.bind_process(epoch=epoch)  # also the lines of the server's tasks, started as a standby
        try:
            refusal = take_over(client, lead, mine)
            if refusal:
                _refuse(refusal)  # the lease is revoked below: a standby leads at once
            store = EtcdStore(client, lead, state / "controller.etcd.id")
            cfg = dataclasses.replace(cfg, rendezvous_key=store.shared_key(RENDEZVOUS_KEY))
            engine = Engine(store, LeaderAgents(agents, lead), cfg, epoch)  # it reads every job
        except BaseException:
            # Refused state (StateError: one line, exit 1), settings (exit 2), or the jobs could not
            # be read: let a standby try at once, not after a TTL.
            lead.resign()
            client.close()
            raise
        loop.add_signal_handler(signal.SIGHUP, on_sighup, engine.tenants, engine.kick)  # docs/tenants.md
        retention = Retention(engine.store, cfg.checkpoint_root,  # its deletions counted: controller/changes.py
                              RetentionConfig(args.job_ttl, args.checkpoint_ttl, args.retention_interval))
        switch.lead([(controller_pb2_grpc.add_ControllerServicer_to_server,
                      ControllerService(engine, page_key=store.shared_key(PAGE_KEY))),
                     (agent_pb2_grpc.add_AgentRegistryServicer_to_server,
                      RegistryService(engine, authenticate=args.tls is not None))])
        hooks.set_serving(True)
        if dashboard is not None:
            dashboard.attach(engine)
        log.info("controller_leading", epoch=epoch, address=address, jobs=len(store.list_jobs()),
                 nodes=len(store.list_nodes()))
        tasks = [asyncio.create_task(c) for c in (*loops(engine), retention.loop(engine.view.notify))]
        if not lead.is_leader():
            lost.set()
        lost_wait = asyncio.create_task(lost.wait())
        await asyncio.wait({signals, lost_wait}, return_when=asyncio.FIRST_COMPLETED)
        lost_wait.cancel()
    switch.standby()  # refuse every call from here on
    hooks.shutdown()
    campaign.cancel()
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
    if lost.is_set():
        log.error("controller_deposed", epoch=lead.epoch, exit_status=LOST_EXIT)
    else:
        log.info("controller_stopping")
        if engine is not None:
            with contextlib.suppress(Exception):
                lead.resign()
    await rpc.stop_server(server, grace=2.0)
    await agents.close()
    if engine is not None and engine.estimator_feed is not None:
        await engine.estimator_feed.close()
    client.close()
    if lost.is_set():
        raise SystemExit(LOST_EXIT)
