"""tessctl's pure parts: table cells, golden tables, JSON shapes, argument parsing, log overlap."""

from __future__ import annotations

import io

import pytest

from tessera.clients import output
from tessera.clients.terminal import overlap as _overlap
from tessera.clients.tessctl import build_parser, main
from tessera.v1 import common_pb2 as S
from tessera.v1 import controller_pb2

NOW = 1_700_000_000.0


def _job() -> controller_pb2.Job:
    return controller_pb2.Job(
        id="j-000001",
        spec=S.JobSpec(name="tiny", tenant="default", iterations=40,
                       model=S.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64)),
        state=S.JOB_STATE_RUNNING, attempt=2, submit_time=NOW - 400,
        reason="moved to A100-80GB: 1.8x the throughput of the A40 Cell it ran in",
        plan=S.Plan(dp=2, tp=1, pp=1, micro_batch=4, grad_accum=2, gpu_model="A100-80GB"),
        placement=S.Placement(slices=[S.NodeSlice(node_id="node-a", gpu_indices=[0, 1]),
                                      S.NodeSlice(node_id="node-b", gpu_indices=[3])]),
        progress=S.Progress(iteration=12, loss=3.14159),
    )


def _pending() -> controller_pb2.Job:
    return controller_pb2.Job(id="j-000002", spec=S.JobSpec(name="huge", tenant="t", iterations=100000),
                              state=S.JOB_STATE_PENDING, submit_time=NOW - 3 * 86400,
                              reason="fits on no GPU type of the cluster")


def _node() -> controller_pb2.Node:
    gpus = [S.Gpu(index=i, model="A100-80GB", memory_bytes=80 * 10**9) for i in range(4)]
    return controller_pb2.Node(
        id="node-a", address="10.0.0.1:50052", state=S.NODE_STATE_DRAINING, reason="maintenance",
        last_heartbeat=NOW - 3, busy_gpus=[1],
        inventory=S.NodeInventory(source=S.INVENTORY_SOURCE_NVML, gpus=gpus, hostname="gpu-a", cpu_count=64,
                                  host_memory_bytes=512 * 1024**3),
    )


@pytest.mark.parametrize(
    ("since", "text"),
    [(0.0, "-"), (NOW, "0s"), (NOW + 5, "0s"), (NOW - 45, "45s"), (NOW - 119, "119s"), (NOW - 125, "2m"),
     (NOW - 7199, "119m"), (NOW - 7200, "2h"), (NOW - 47 * 3600, "47h"), (NOW - 3 * 86400, "3d")],
)
def test_age(since: float, text: str) -> None:
    assert output.age(since, NOW) == text


def test_cells() -> None:
    assert output.gpu_summary([]) == "-"
    assert output.gpu_summary(["A100-80GB"] * 4) == "4xA100-80GB"
    assert output.gpu_summary(["A100-80GB", "A40-48GB", "A100-80GB"]) == "2xA100-80GB,1xA40-48GB"
    assert output.truncate("a  b\nc") == "a b c"
    assert output.truncate("x" * 50, 10) == "xxxxxxx..."
    job = _job()
    assert output.job_gpus(job) == "3xA100-80GB"
    assert output.job_plan(job) == "2/1/1/4/2"
    assert output.job_nodes(job) == "node-a,node-b"
    assert output.job_iter(job) == "12/40"
    assert output.job_loss(job) == "3.142"
    pending = _pending()
    assert (output.job_gpus(pending), output.job_plan(pending), output.job_loss(pending)) == ("-", "-", "-")
    assert output.node_free(_node()) == 3
    assert output.job_state(0) == "UNKNOWN" and output.node_state(S.NODE_STATE_DOWN) == "DOWN"


def test_jobs_table_golden() -> None:
    assert output.jobs_table([_job(), _pending()], NOW) == (
        "ID         NAME   TENANT    STATE     GPUS          ITER       AGE   REASON\n"
        "j-000001   tiny   default   RUNNING   3xA100-80GB   12/40      6m    moved to A100-80GB: 1.8x the throughp...\n"
        "j-000002   huge   t         PENDING   -             0/100000   3d    fits on no GPU type of the cluster"
    )


def test_jobs_wide_golden() -> None:
    lines = output.jobs_table([_job()], NOW, wide=True).splitlines()
    assert lines[0].split() == ["ID", "NAME", "TENANT", "STATE", "GPUS", "ITER", "AGE", "PLAN(dp/tp/pp/mb/ga)",
                                "NODES", "ATTEMPT", "LOSS", "START~", "END~", "REASON"]
    assert lines[1].endswith("2/1/1/4/2              node-a,node-b   2         3.142   -        -      "
                             "moved to A100-80GB: 1.8x the throughput of the A40 Cell it ran in")


def test_nodes_table_golden() -> None:
    assert output.nodes_table([_node()], NOW) == (
        "NAME     STATE      GPUS          FREE   SOURCE   HEARTBEAT   ADDRESS\n"
        "node-a   DRAINING   4xA100-80GB   3      nvml     3s          10.0.0.1:50052"
    )
    wide = output.nodes_table([_node()], NOW, wide=True).splitlines()[1]
    assert wide.endswith("gpu-a      64     512Gi    -           -         maintenance")  # ISOLATION unknown


def test_json_shapes() -> None:
    jobs = output.jobs_json([_pending()])
    assert list(jobs) == ["jobs"]
    (job,) = jobs["jobs"]
    assert job["state"] == "JOB_STATE_PENDING"
    assert job["attempt"] == 0  # defaults are printed
    assert job["events"] == []
    assert job["spec"]["iterations"] == "100000"  # int64 as a string (proto3 JSON mapping)
    assert "plan" not in job  # unset message fields are absent
    nodes = output.nodes_json([_node()])
    assert nodes["nodes"][0]["inventory"]["source"] == "INVENTORY_SOURCE_NVML"
    assert nodes["nodes"][0]["busy_gpus"] == [1]
    assert output.jobs_json([]) == {"jobs": []} and output.nodes_json([]) == {"nodes": []}
    assert output.dumps({"a": [1]}, compact=True) == '{"a":[1]}'


def test_describe_texts() -> None:
    text = output.describe_job(_job(), NOW)
    assert "Reason:" in text and "1.8x" in text and "Events:\n  <none>" in text
    job = _job()
    job.events.add(seq=1, time=NOW - 10, kind="PLACED", message="on node-a")
    assert "1     10s   PLACED   on node-a" in output.describe_job(job, NOW)
    node = output.describe_node(_node(), NOW, [_job(), _pending()])
    assert "4xA100-80GB (3 free)" in node and "j-000001" in node and "j-000002" not in node
    # Memory in GB as GPUs are named, and in GiB as the reasons give it.
    job.plan.memory_per_gpu_bytes, job.plan.memory_source = 6_800_000_000, "formula:marp"
    assert "Memory/GPU:  6.8GB = 6.3 GiB (formula:marp)" in output.describe_job(job, NOW)
    assert "Memory/GPU:  - (unknown source)" in output.describe_job(_job(), NOW)
    # The sharding and checkpointing the memory figure assumes (a live audit read an FSDP plan's
    # 62.9 GiB on 80 GB GPUs as a plan that cannot fit: plain data parallelism needs 104.6).
    assert "Sharding:" not in output.describe_job(job, NOW)  # no options: nothing to say
    job.plan.options.sharding, job.plan.options.checkpointing = S.SHARDING_FSDP, S.CHECKPOINTING_FULL
    text = output.describe_job(job, NOW)
    assert "Sharding:      fsdp" in text and "Checkpointing: full" in text
    assert "GPU hint:         -" in text  # neither a count nor types: was "any of any type"
    job.spec.hint.gpus = 8
    assert "GPU hint:         8 of any type" in output.describe_job(job, NOW)


def test_describe_node_lists_gpus_left_out_with_why() -> None:
    node = _node()
    assert "Left out" not in output.describe_node(node, NOW)
    node.inventory.left_out.add(index=4, uuid="GPU-4", model="A100-80GB", reason="MIG mode is on: one slice")
    lines = output.describe_node(node, NOW).splitlines()
    at = lines.index("Left out (not scheduled):")
    assert [ln.split(None, 3) for ln in lines[at + 1:at + 3]] == [
        ["INDEX", "MODEL", "UUID", "WHY"], ["4", "A100-80GB", "GPU-4", "MIG mode is on: one slice"]]
    assert "4xA100-80GB (3 free)" in "\n".join(lines)  # offered GPUs only


def test_launch_failures_and_unhealthy_nodes_are_shown() -> None:
    job = _pending()
    assert "Launch failures:  0\n" in output.describe_job(job, NOW)
    job.launch_failures, job.next_launch_time = 4, NOW + 8
    assert "Launch failures:  4 (next try 2023-11-14T22:13:28Z, in 8s)" in output.describe_job(job, NOW)
    job.next_launch_time = NOW - 1
    assert "Launch failures:  4 (next try at the next round)" in output.describe_job(job, NOW)
    node = _node()
    node.state, node.launch_failures, node.unhealthy_until = S.NODE_STATE_READY, 3, NOW + 30
    assert output.nodes_table([node], NOW).splitlines()[1].split()[:2] == ["node-a", "READY,UNHEALTHY"]
    assert "Launch failures: 3 (unhealthy: no placements until 2023-11-14T22:13:50Z)" in \
        " ".join(output.describe_node(node, NOW).split())
    node.unhealthy_until = NOW - 1  # the hold ran out: healthy again, the count stays until a launch succeeds
    assert output.nodes_table([node], NOW).splitlines()[1].split()[1] == "READY"
    assert [ln.split() for ln in output.describe_node(node, NOW).splitlines() if "Launch" in ln] == [
        ["Launch", "failures:", "3"]]


@pytest.mark.parametrize(
    "argv",
    [
        ["-o", "json", "get", "jobs"],
        ["get", "-o", "json", "jobs"],
        ["get", "jobs", "-o", "json"],
        ["get", "jobs", "--output=json"],
    ],
)
def test_output_option_anywhere(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.output == "json"
    assert args.func.__name__ == "cmd_get_jobs"


def test_global_options_before_survive_subcommand() -> None:
    args = build_parser().parse_args(["--controller", "h:1", "-o", "wide", "describe", "job", "j-1"])
    assert (args.controller, args.output, args.id) == ("h:1", "wide", "j-1")
    args = build_parser().parse_args(["get", "jobs", "--state", "running,pending", "--state", "failed"])
    assert args.state == [[S.JOB_STATE_RUNNING, S.JOB_STATE_PENDING], [S.JOB_STATE_FAILED]]


def test_version_in_process() -> None:
    out = io.StringIO()
    assert main(["version", "--client"], out=out) == 0  # no controller needed
    assert out.getvalue().startswith("Client: tessctl ")


@pytest.mark.parametrize(
    ("prev", "new", "n"),
    [
        (b"", b"abc", 0),
        (b"abc", b"abcdef", 3),  # the file is shorter than the tail: it only grew
        (b"0123456789", b"3456789XY", 7),  # the tail window slid by 3
        (b"aaaa", b"aaaab", 4),
        (b"xyz", b"123", 0),  # no overlap (rotated or rewritten)
        (b"x" * 300 + b"END", b"x" * 200 + b"ENDnew", 203),  # overlap longer than the anchor
    ],
)
def test_log_overlap(prev: bytes, new: bytes, n: int) -> None:
    assert _overlap(prev, new) == n


def test_job_gpus_across_gpu_types() -> None:
    job = _job()  # node-a GPUs 0,1 and node-b GPU 3; the plan says A100-80GB
    models = output.gpu_models([
        _node(),
        controller_pb2.Node(id="node-b", inventory=S.NodeInventory(
            gpus=[S.Gpu(index=i, model="A40-48GB") for i in range(4)])),
    ])
    assert output.job_gpus(job, models) == "2xA100-80GB,1xA40-48GB"
    assert output.job_gpus(job, {}) == "3xA100-80GB"  # nodes unknown: the plan's model
    assert output.jobs_table([job], NOW, models=models).splitlines()[1].split()[4] == "2xA100-80GB,1xA40-48GB"
    assert output.gb(38 * 10**6) == "38MB" and output.gb(3_200_000_000) == "3.2GB" and output.gb(0) == "-"


def test_an_error_raised_on_purpose_prints_its_message_not_internal_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Any TesseraError that reaches tessctl's top (not only the kinds it names) is a one-line error
    # with its own message and exit 1; only an unexpected exception reads "internal error".
    from tessera.clients import tessctl, versioncmd
    from tessera.common.errors import FailedPrecondition

    def refuse(*_: object) -> int:
        raise FailedPrecondition("node n1 is draining")

    monkeypatch.setattr(versioncmd, "cmd_version", refuse)
    assert tessctl.main(["version", "--client"]) == 1
    assert capsys.readouterr().err == "tessctl: error: node n1 is draining\n"


def test_an_agents_unconfirmed_drain_reason_cannot_drive_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """A node's agent answers Drain with its own text, which the controller passes on: a compromised
    node's clipboard write (OSC 52), window title and screen clear reached an admin's stderr raw."""
    from tessera.clients.tessctl import EXIT_UNCONFIRMED, _unconfirmed

    evil = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;OWNED\x07\x1b[2J\x1b[HAll good\u202e"
    assert _unconfirmed(controller_pb2.Node(id="node-y", agent_unconfirmed=evil), "drained") == EXIT_UNCONFIRMED
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\u202e" not in err
    assert "\\x1b]52;c;cm0gLXJmIH4=" in err and "All good" in err
