"""What a live audit of the dashboard found (docs/dashboard.md): /api/nodes was not ListNodes's answer
(no `busy_cpus`, and a user's GPUs of another tenant's job not `hidden_gpus`, so /nodes coloured
them "held by a job" while listing none); an admin's malformed `?tenant=` answered an empty 200;
the timeline drew cancelled jobs red, as failed ones; a standby's 503 did not say where the
leader is, while the gRPC gate does."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tessera.clients import nodejobs
from tessera.common.tokens import Principal, TokenEntry, hash_token, write_tokens_file
from tessera.controller.auth import CallContext, InsecureAuthenticator, TokenAuthenticator
from tessera.controller.dashboard import pages
from tessera.controller.dashboard.data import message_json
from tessera.controller.dashboard.server import STATIC, Dashboard
from tessera.controller.service import ControllerService
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2
from tests.unit.test_dashboard import TOKENS, cluster, get
from tests.unit.test_engine import Harness
from tests.unit.test_engine_tenants import guaranteed, harness

WHO = {name: Principal(name, tenant, role) for name, (_tok, tenant, role) in TOKENS.items()}


async def guaranteed_cluster(tmp_path: Path) -> tuple[Harness, Dashboard, str]:
    """Nodes a and b (4 x A10, 32 CPUs each); team-a's guaranteed job holds 2 GPUs and 12 CPUs."""
    h = harness(tmp_path)
    await h.register("a", "b")
    jid = await h.submit(guaranteed("g", 2, cpus=12))
    await h.round()
    assert h.state(jid) == "STARTING"
    tokens = tmp_path / "tokens.yaml"
    write_tokens_file(tokens, [TokenEntry(n, t, r, hash_token(tok)) for n, (tok, t, r) in TOKENS.items()])
    d = Dashboard(TokenAuthenticator(tokens))
    d.engine = h.engine
    return h, d, jid


async def test_api_nodes_is_list_nodes_answer_to_the_same_caller(tmp_path: Path) -> None:
    h, d, jid = await guaranteed_cluster(tmp_path)
    svc = ControllerService(h.engine)
    (node,) = h.nodes_of(jid)
    gpus = sorted(g for s in h.engine.view.get(jid).placement.slices for g in s.gpu_indices)
    for name, (token, _tenant, _role) in TOKENS.items():
        answer = await svc.ListNodes(controller_pb2.ListNodesRequest(), CallContext(object(), WHO[name]))
        api = json.loads((await d.handle(get("/api/nodes", token=token))).body)
        assert api == {"nodes": [message_json(n) for n in answer.nodes]}, name
        mine = next(n for n in api["nodes"] if n["id"] == node)
        assert mine["busy_cpus"] == 12 and mine["busy_gpus"] == gpus
        # Bob's tenant (team-b) may not list team-a's job: its GPUs are hidden from him, as describe says.
        assert mine.get("hidden_gpus", []) == (gpus if name == "bob" else []), name


async def test_the_nodes_page_says_a_users_hidden_gpus_as_describe_node_does(tmp_path: Path) -> None:
    h, d, jid = await guaranteed_cluster(tmp_path)
    (node,) = h.nodes_of(jid)
    gpus = sorted(g for s in h.engine.view.get(jid).placement.slices for g in s.gpu_indices)

    def row(body: bytes) -> str:
        return body.decode().partition(f'id="node-{node}"')[2].partition("</tr>")[0]

    bob = row((await d.handle(get("/nodes", token="bob-token"))).body)
    assert jid not in bob and 'class="gpu busy"' not in bob
    assert [int(g) for g in re.findall(r'<span class="gpu hidden" title="[^"]*">(\d+):', bob)] == gpus
    assert f"{pages.e(nodejobs.HIDDEN)} GPUs {', '.join(map(str, gpus))}" in bob
    assert "32 (12 promised to guaranteed jobs)" in bob
    alice = row((await d.handle(get("/nodes", token="alice-token"))).body)
    assert f'href="/jobs/{jid}"' in alice and "hidden" not in alice
    assert len(re.findall(r'<span class="gpu busy"', alice)) == len(gpus)
    # The page's header names the colours it shows.
    page = (await d.handle(get("/nodes", token="bob-token"))).body.decode()
    assert f"GPUs ({pages.e('blue: held by a job listed; purple: another tenant')}" in page


def test_the_pages_words_are_describe_nodes() -> None:
    assert (pages.HIDDEN, pages.NO_JOB) == (nodejobs.HIDDEN, nodejobs.NO_JOB)


def test_a_busy_gpu_no_job_holds_is_not_said_held_by_a_job() -> None:
    inv = P.NodeInventory(gpus=[P.Gpu(index=i, model="A10") for i in range(3)])
    node = controller_pb2.Node(id="n1", inventory=inv, busy_gpus=[0, 1, 2], hidden_gpus=[1])
    html = pages.nodes_page(WHO["bob"], [node], {"n1": [("j-1", "mine", (0,))]}, 2000.0)
    classes = re.findall(r'<span class="gpu (\w+)"', html)
    assert classes == ["busy", "hidden", "nojob"]
    assert f"{pages.e(nodejobs.HIDDEN)} GPU 1" in html and f"{pages.e(nodejobs.NO_JOB)} GPU 2" in html


async def test_an_admins_tenant_filter_must_be_a_tenant_name(tmp_path: Path) -> None:
    _, d, ids = await cluster(tmp_path)
    for path in ("/jobs?tenant=<script>x", "/api/jobs?tenant=<script>x", "/api/jobs?tenant=Team-A",
                 "/jobs?tenant=a/b", "/api/jobs?tenant=" + "a" * 64):
        resp = await d.handle(get(path, token="admin-token"))
        assert resp.status == 400, path
        assert b"<script>" not in resp.body
        if path.startswith("/api/"):
            doc = json.loads(resp.body)
            assert doc["code"] == "INVALID_ARGUMENT" and doc["error"].startswith("tenant: must be a tenant's name")
        else:
            assert pages.e("tenant: must be a tenant's name").encode() in resp.body
    # A user's malformed filter is as malformed.
    assert (await d.handle(get("/api/jobs?tenant=TEAM-A", token="alice-token"))).status == 400
    # A well-formed name of no tenant lists no job (as ListJobs); a tenant's name lists its jobs.
    nosuch = await d.handle(get("/api/jobs?tenant=nosuch", token="admin-token"))
    assert nosuch.status == 200 and json.loads(nosuch.body) == {}
    team_a = json.loads((await d.handle(get("/api/jobs?tenant=team-a", token="admin-token"))).body)
    assert [j["id"] for j in team_a["jobs"]] == [ids["a"]]
    page = await d.handle(get("/jobs?tenant=team-b", token="admin-token"))
    assert page.status == 200 and ids["b"].encode() in page.body and ids["a"].encode() not in page.body


def test_the_timeline_draws_cancelled_jobs_in_their_own_colour() -> None:
    jobs = [controller_pb2.Job(id=f"j-{s}", state=state, start_time=1000, end_time=1500, spec=P.JobSpec(name=s))
            for s, state in (("failed", P.JOB_STATE_FAILED), ("cancelled", P.JOB_STATE_CANCELLED))]
    html = pages.jobs_page(WHO["root"], jobs, "", 2000.0)
    gantt = html.partition('id="gantt"')[2]
    assert re.findall(r'<rect class="bar (\w+)"', gantt) == ["failed", "cancelled"]
    legend = html.partition('id="gantt-key"')[2].partition("</p>")[0]
    assert '<span class="key cancelled"></span>cancelled' in legend and '<span class="key failed"></span>failed' in legend
    css = (STATIC / "style.css").read_text()
    fills = dict(re.findall(r"\.bar\.(\w+) \{ fill: (#[0-9a-f]+); \}", css))
    assert fills["cancelled"] != fills["failed"]


async def test_a_standbys_503_says_where_the_leader_is() -> None:
    d = Dashboard(InsecureAuthenticator(), standby_reason="this controller is a standby",
                  leader=lambda: "10.0.0.2:50051")
    api = await d.handle(get("/api/jobs"))
    assert api.status == 503
    assert json.loads(api.body) == {"error": "no data here: this controller is a standby; leader at 10.0.0.2:50051",
                                    "code": "UNAVAILABLE", "leader": "10.0.0.2:50051"}
    page = await d.handle(get("/nodes"))
    assert page.status == 503 and b"leader at 10.0.0.2:50051" in page.body
    # Unknown (no leader elected yet): said as before, without an address.
    d.leader = lambda: ""
    api = await d.handle(get("/api/nodes"))
    assert api.status == 503 and json.loads(api.body) == {"error": "no data here: this controller is a standby",
                                                          "code": "UNAVAILABLE"}


async def test_drain_and_undrain_answer_the_node_as_list_nodes_does(tmp_path: Path) -> None:
    # They answered their Node without the CPUs promised to guaranteed jobs (a review after the audit).
    h, _d, jid = await guaranteed_cluster(tmp_path)
    svc = ControllerService(h.engine)
    (node,) = h.nodes_of(jid)
    admin = next(w for w in WHO.values() if w.sees_all)
    drained = await svc.DrainNode(controller_pb2.DrainNodeRequest(node_id=node, request_id="r-1"),
                                  CallContext(object(), admin))
    assert drained.busy_cpus == 12
    back = await svc.UndrainNode(controller_pb2.UndrainNodeRequest(node_id=node, request_id="r-2"),
                                 CallContext(object(), admin))
    assert back.busy_cpus == 12 and back.id == node
