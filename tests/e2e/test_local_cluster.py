"""The whole path with real processes: tessctl -> controller -> agents -> torch workers on CPU."""

from __future__ import annotations

import re

import pytest

from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.procs import REPO, tessctl, tessctl_json

pytestmark = pytest.mark.slow
JOBS = REPO / "examples" / "jobs"
# The demo's cluster (scripts/demo.py): two A10 nodes, so that "wide" (8 GPUs) fits on one GPU model
# across nodes.
DEMO_NODES = [("node-a100", "a100-node.yaml"), ("node-a40", "a40-node.yaml"), ("node-a10", "a10-node.yaml"),
              ("node-a10b", "a10-node.yaml")]


def losses(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"^(?:\[rank \d+\] )?step iteration=\d+/\d+ loss=([0-9.]+)", text, re.MULTILINE)]


def test_heterogeneous_cluster_trains_jobs_of_different_sizes(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory(DEMO_NODES)
    addr = cl.controller.address
    nodes = tessctl_json(addr, "get", "nodes")["nodes"]
    assert {n["id"]: n["state"] for n in nodes} == {n: "NODE_STATE_READY" for n, _ in DEMO_NODES}
    assert all(n["inventory"]["source"] == "INVENTORY_SOURCE_DECLARED" for n in nodes)

    ids = {name: tessctl_json(addr, "submit", "-f", str(JOBS / f"{name}.yaml"))["id"]
           for name in ("tiny", "small", "medium", "wide", "huge")}
    with cl.client() as c:
        for name in ("tiny", "small", "medium", "wide"):
            job = c.wait(ids[name], {"SUCCEEDED", "FAILED"}, timeout=240)
            assert job.state == P.JOB_STATE_SUCCEEDED, (name, job.reason)
            assert job.progress.iteration == job.spec.iterations

    for name in ("tiny", "small", "medium", "wide"):
        d = tessctl_json(addr, "describe", "job", ids[name])
        placed = [e["message"] for e in d["events"] if e["kind"] == "PLACED"]
        assert len(placed) == 1 and "HAS: plan" in placed[0] and "(MARP)" in placed[0]
        assert int(d["plan"]["memory_per_gpu_bytes"]) > 0 and d["plan"]["memory_source"] == "formula:marp"
        # The placement is memory-feasible on the GPUs it names.
        gpus = {n["id"]: n["inventory"]["gpus"] for n in nodes}
        for s in d["placement"]["slices"]:
            for i in s["gpu_indices"]:
                assert int(gpus[s["node_id"]][i]["memory_bytes"]) > int(d["plan"]["memory_per_gpu_bytes"])
        log = tessctl(addr, "logs", ids[name], "--tail", "1000000").stdout
        ls = losses(log)
        assert len(ls) == int(d["spec"]["iterations"]) and ls[-1] < 0.7 * ls[0], (name, ls[:3], ls[-3:])

    wide = tessctl_json(addr, "describe", "job", ids["wide"])
    assert {s["node_id"] for s in wide["placement"]["slices"]} == {"node-a10", "node-a10b"}
    assert sum(len(s["gpu_indices"]) for s in wide["placement"]["slices"]) == 8
    assert "multi-node" in next(e["message"] for e in wide["events"] if e["kind"] == "PLACED")

    huge = tessctl_json(addr, "describe", "job", ids["huge"])
    assert huge["state"] == "JOB_STATE_PENDING"
    assert re.search(r"fits nowhere: needs at least [0-9.]+ GiB per GPU", huge["reason"])
    for gpu in ("A100-80GB", "A40-48GB", "A10-24GB"):
        assert gpu in huge["reason"]
