"""Simulator inputs: cluster files, traces and the artifact's oracle rules; bad files name line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.controller.core.snapshot import JobView
from tessera.controller.sim.clusters import ClusterError, load_cluster
from tessera.controller.sim.oracles import ArenaOracle
from tessera.controller.sim.traces import (
    PhillyOptions,
    TraceError,
    generate_philly,
    load_arena,
    load_morphling,
)
from tessera.estimator.models import ModelDims

ARENA_HEADER = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"


def test_builtin_clusters() -> None:
    c = load_cluster("crius-1280")
    assert c.total_gpus() == 1280 and len(c.nodes()) == 420
    assert c.per_node("V100-32GB") == 16 and c.nodes()[0].gpus[0].island == 0
    assert load_cluster("crius-testbed").total_gpus() == 64
    assert load_cluster("morphling-64").total_gpus() == 64


def test_bad_cluster_files_name_line_and_field(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text('{"node_groups": [\n {"prefix": "a-", "count": 2, "gpus": 4, "gpu_type": "X", "memory_gb": 40},\n'
                 ' {"prefix": "b-", "count": 0, "gpus": 4, "gpu_type": "X", "memory_gb": 40}\n]}\n')
    with pytest.raises(ClusterError, match=r"line 3: field node_groups\[1\]\.count: must be > 0"):
        load_cluster(str(p))
    p.write_text('{"node_groups": [\n {"prefix": "a-", "count": 2, "gpus": "4", "gpu_type": "X", "memory_gb": 40}]}')
    with pytest.raises(ClusterError, match=r"line 2: field node_groups\[0\]\.gpus: expected an integer"):
        load_cluster(str(p))
    p.write_text('{"node_groups": [\n {"prefix": "a-", "count": 2, \n "gpus": 4 "gpu_type": "X"}]}')
    with pytest.raises(ClusterError, match="line 3: not valid YAML or JSON"):
        load_cluster(str(p))
    with pytest.raises(ClusterError, match="unknown cluster"):
        load_cluster("nope")
    p.write_text('[{"a100": {"node_num": 2},\n "tpu": {"node_num": 1}}]')
    with pytest.raises(ClusterError, match=r"line 2: field \[0\]\.tpu: GPU type 'tpu'"):
        load_cluster(str(p))


def test_bad_trace_rows_name_line_and_field(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text(ARENA_HEADER + "a,10,100,bert__1.3B,20,128,4,a40\nb,11,lots,bert__1.3B,20,128,4,a40\n")
    with pytest.raises(TraceError, match="line 3: field num_iteration: not a number: 'lots'"):
        load_arena(p, {})
    p.write_text(ARENA_HEADER + "a,10,100,bert__1.3B,20,128,3,a40\n")
    with pytest.raises(TraceError, match="line 2: field num_gpu: must be a power of two"):
        load_arena(p, {})
    p.write_text(ARENA_HEADER + "a,10,100,bert__1.3B,20,128,4,h100\n")
    with pytest.raises(TraceError, match="line 2: field gpu_type: 'h100' is not in the cluster"):
        load_arena(p, {}, known_types=["a40"])
    p.write_text("job_id,submission_time\n")
    with pytest.raises(TraceError, match="line 1: header lacks field"):
        load_arena(p, {})
    p.write_text("name,submission_time,duration,application,num_gpus,exec_plan,steps,is_sla\nx,0,1,tpu,1,ga,5,0\n")
    with pytest.raises(TraceError, match="line 2: field application: unknown 'tpu'"):
        load_morphling(p)


def test_arena_trace_keeps_file_order_and_keys(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text(ARENA_HEADER + "b,10,100,moe__1.3B,20,256,2,a10\na,10,50,bert__1.3B,20,128,4,a40\n")
    jobs = load_arena(p, {"bert": {"1.3B": {"hidden_size": 2048, "num_layers": 24}}})
    assert [j.id for j in jobs] == ["b", "a"]
    assert jobs[1].model_key == "bert_1.3B_128" and jobs[1].model.hidden_size == 2048


def test_arena_trace_may_carry_the_cost_objective(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    head = ARENA_HEADER.strip() + ",objective,slo_seconds\n"
    p.write_text(head + "a,10,50,bert__1.3B,20,128,4,a40,cost,3600\nb,10,50,bert__1.3B,20,128,4,a40,,\n")
    jobs = load_arena(p, {"bert": {"1.3B": {"hidden_size": 2048, "num_layers": 24}}})
    assert [(j.objective, j.slo_s) for j in jobs] == [("cost", 3600.0), ("", 0.0)]
    for row, why in (("cost,0", "slo_seconds: must be > 0"), ("cost,", "slo_seconds: not a number"),
                     ("cheap,10", "objective: must be empty or cost")):
        p.write_text(head + f"a,10,50,bert__1.3B,20,128,4,a40,{row}\n")
        with pytest.raises(TraceError, match=f"line 2: field {why}"):
            load_arena(p, {"bert": {"1.3B": {"hidden_size": 2048, "num_layers": 24}}})


def test_philly_generator_is_seeded(tmp_path: Path) -> None:
    p = tmp_path / "philly.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-10-0{1 + i // 10} 0{i % 10}:00:00,{600 * (i + 1)},1,1,c\n" for i in range(30)))
    feas = lambda key, t, n: 2.0 if n <= 8 else 0.0
    types = ["A100-40GB", "V100-32GB", "A40-48GB", "A10-24GB"]
    a = generate_philly(p, feas, types, {}, PhillyOptions(seed=7, hours=24))
    b = generate_philly(p, feas, types, {}, PhillyOptions(seed=7, hours=24))
    c = generate_philly(p, feas, types, {}, PhillyOptions(seed=8, hours=24))
    assert a == b and a != c
    assert len(a) == 10 and all(j.gpus <= 8 for j in a)
    assert a[0].iterations == 600 // 2  # duration / iteration time at the request
    half = generate_philly(p, feas, types, {}, PhillyOptions(seed=7, hours=24, load=2.0))
    assert half[-1].submit_time == a[-1].submit_time / 2


def _arena_dir(tmp_path: Path) -> Path:
    d = tmp_path / "arena"
    d.mkdir()
    (d / "iter_time_optimal.json").write_text(json.dumps({
        "bert_760M_128": {"1_a100_1_n_4_d": 2.0, "1_a40_1_n_2_d": 400.0},
        "bert_1.3B_128": {"2_a100_2_n_2_d": 4.0, "1_a40_1_n_1_d": -1},
    }))
    (d / "dp_mem.json").write_text(json.dumps([{"bert_760M_128": [30.0, 20.0, 0, -1, 10.0]}]))
    (d / "models.json").write_text("{}")
    return d


def test_arena_oracle_follows_the_artifact_query_rules(tmp_path: Path) -> None:
    o = ArenaOracle(_arena_dir(tmp_path))
    assert o.throughput("bert_760M_128", "A100-40GB", 4, 1) == 64.0
    # relaxed locality: the best-locality entry times 0.9 per halving of the per-node share
    assert o.throughput("bert_760M_128", "A100-40GB", 4, 2) == pytest.approx(64.0 * 0.9)
    assert o.throughput("bert_760M_128", "A100-40GB", 4, 4) == pytest.approx(64.0 * 0.81)
    # missing entry: the next larger size at the same resources, times 1.8
    assert o.throughput("bert_760M_128", "A100-40GB", 4, 2) != 0
    assert o.throughput("bert_760M_128", "A100-40GB", 8, 2) == 0.0
    # over 300 s per iteration, or -1: infeasible
    assert o.throughput("bert_760M_128", "A40-48GB", 2, 1) == 0.0
    assert o.throughput("bert_1.3B_128", "A40-48GB", 1, 1) == 0.0
    assert o.iteration_time("bert_760M_128", "A100-40GB", 4, 1) == 2.0
    j = JobView("j", 0.0, ModelDims(1, 1, 1, 1, 1), 128, estimate_key="bert_760M_128")
    # dp_mem: GB x 1.2 <= 0.8 x memory; 0 = not measured (allowed); -1 = OOM
    assert not o.dp_fits(j, "A100-40GB", 1) and o.dp_fits(j, "A100-40GB", 2)
    assert o.dp_fits(j, "A10-24GB", 4) and not o.dp_fits(j, "A100-40GB", 8)
    assert o.dp_fits(j, "A10-24GB", 16)


def test_morphling_oracle_uses_the_nearest_measured_placement(tmp_path: Path) -> None:
    from tessera.controller.sim.oracles import MorphlingOracle

    for m in ("vit", "roberta", "bert", "t5", "gpt2", "llama7", "llama30"):
        d = tmp_path / "placements" / m
        d.mkdir(parents=True)
        (d / "placements.csv").write_text("exec_plan,placement,iter_time,forward,overlap_sync,optimize\n"
                                          "ga,44,2.0,0,0,0\n142,8,1.0,0,0,0\n118,8,1.5,0,0,0\n")
    o = MorphlingOracle(tmp_path)
    assert o.iteration_time("bert", "8") == 1.0  # best plan measured on one server
    assert o.iteration_time("bert", "44") == 2.0
    # 4 servers unmeasured: the closest measured (2 servers), 0.9x per extra server
    assert abs(o.iteration_time("bert", "2222") - 2.0 / 0.81) < 1e-9
    assert o.iteration_time("bert", "17") == 2.0  # same servers, another split
    j = JobView("j", 0.0, ModelDims(1, 1, 1, 1, 1), 1, estimate_key="gpt2")
    assert o.gpu_counts(j, "A800-80GB") == [8]
    assert o.cells(j, "A800-80GB", 8, 1)[0].iteration_s == 1.0
