"""tessctl's and the daemons' command-line habits (docs/cli.md): -o yaml|name|jsonpath, RFC 3339
times in structured output, no abbreviated flags, defaults in --help, `submit FILE`, address checks,
shell completion."""

from __future__ import annotations

import argparse
import contextlib
import io
import json

import pytest
import yaml

from tessera.clients import completion, formats, output, tessctl
from tessera.clients.config import Config, resolve
from tessera.clients.gpuhints import missing_types
from tessera.common.clihelp import DefaultsHelpFormatter
from tessera.common.errors import InvalidArgument
from tessera.common.rpc import check_address
from tessera.v1 import common_pb2, controller_pb2

JOBS = {"jobs": [{"id": "j-1", "spec": {"name": "a"}, "state": "JOB_STATE_RUNNING"},
                 {"id": "j-2", "spec": {"name": "b"}, "state": "JOB_STATE_PENDING"}]}


def test_yaml_name_and_jsonpath_render_a_json_document() -> None:
    assert yaml.safe_load(formats.render(JOBS, "yaml")) == JOBS
    assert formats.render(JOBS, "yaml", first=False).startswith("---\n")
    assert formats.render(JOBS, "name") == "job/j-1\njob/j-2\n"
    assert formats.render({"nodes": [{"id": "gpu-1"}]}, "name") == "node/gpu-1\n"
    assert formats.render({"id": "j-9", "spec": {}}, "name") == "job/j-9\n"
    assert formats.render(JOBS, "jsonpath={.jobs[*].id}") == "j-1 j-2\n"
    assert formats.render(JOBS, "jsonpath=.jobs[1].spec.name") == "b\n"
    assert formats.render(JOBS, "jsonpath={.jobs[-1].state}") == "JOB_STATE_PENDING\n"
    assert formats.render(JOBS, r"jsonpath=id={.jobs[0].id}\n") == "id=j-1\n"
    assert formats.render(JOBS, "jsonpath={.jobs[0].spec}") == '{"name":"a"}\n'
    assert formats.render(JOBS, 'jsonpath={.jobs[0].id}{"\\t"}{.jobs[1].id}') == "j-1\tj-2\n"


@pytest.mark.parametrize("template, why", [
    ("{.jobs[0].nope}", "no field 'nope'"),
    ("{.jobs[7]}", "index 7 out of range"),
    ("{.jobs.id}", "not an object"),
])
def test_a_jsonpath_that_selects_nothing_says_why(template: str, why: str) -> None:
    with pytest.raises(formats.FormatError, match=why):
        formats.render(JOBS, "jsonpath=" + template)


def test_output_flag_accepts_the_formats_and_refuses_others() -> None:
    for good in ("table", "wide", "json", "yaml", "name", "jsonpath={.jobs[*].id}"):
        assert formats.output_format(good) == good
    for bad, why in (("xml", "choose from"), ("jsonpath={.a", "unclosed"), ("jsonpath={a b}", "cannot read")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            formats.output_format(bad)
    with pytest.raises(formats.FormatError, match="names no job or node"):
        formats.render({"principal": "alice"}, "name")


def test_structured_out_rewrites_each_json_document_and_passes_other_text() -> None:
    buf = io.StringIO()
    out, fmt = formats.wrap(buf, "name")
    assert fmt == "json"
    out.write(output.dumps(JOBS) + "\n")
    out.write("not json\n")
    assert buf.getvalue() == "job/j-1\njob/j-2\nnot json\n"
    plain, same = formats.wrap(buf, "wide")
    assert plain is buf and same == "wide"


def test_times_in_json_are_rfc3339_in_utc_and_null_when_unset() -> None:
    job = controller_pb2.Job(id="j-1", submit_time=1_700_000_000.25, start_time=1_700_000_060.0)
    job.events.add(seq=1, time=1_700_000_000.0, kind="SUBMITTED")
    job.progress.time = 1_700_000_100.5
    d = output.to_dict(job)
    assert d["submit_time"] == "2023-11-14T22:13:20.25Z" and d["start_time"] == "2023-11-14T22:14:20Z"
    assert d["end_time"] is None and d["next_launch_time"] is None
    assert d["events"][0]["time"] == "2023-11-14T22:13:20Z" and d["progress"]["time"] == "2023-11-14T22:15:00.5Z"
    node = output.to_dict(controller_pb2.Node(id="n", last_heartbeat=1_700_000_000.0))
    assert node["last_heartbeat"] == "2023-11-14T22:13:20Z" and node["unhealthy_until"] is None
    # A duration is not a point in time: only the listed messages' time fields are converted.
    assert output.to_dict(common_pb2.Progress(step_time_seconds=1.5))["step_time_seconds"] == 1.5
    assert json.loads(output.dumps(d))["submit_time"].endswith("Z")


@pytest.mark.parametrize("argv, why", [
    (["get", "jobs", "--stat", "running"], "unrecognized arguments: --stat"),  # once ran as --state
    (["get", "jobs", "--lim", "3"], "unrecognized arguments: --lim"),
    (["--cont", "127.0.0.1:1", "get", "jobs"], "invalid choice: '127.0.0.1:1'"),  # --cont is no --controller
    (["logs", "j-1", "--foll"], "unrecognized arguments: --foll"),
])
def test_tessctl_refuses_abbreviated_flags(argv: list[str], why: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        tessctl.main(argv)
    assert exit_.value.code == 2
    assert why in capsys.readouterr().err


def test_daemons_refuse_abbreviations_and_show_defaults() -> None:
    from tessera.controller import main as controller_main
    from tessera.controller.sim import cli as sim_cli
    from tessera.estimator.service import main as estimator_main
    from tessera.nodeagent import main as agent_main

    with pytest.raises(SystemExit):
        controller_main.parse_args(["--state-dir", "/tmp/x", "--round-int", "5"])
    with pytest.raises(SystemExit):
        estimator_main.parse_args(["--insecure", "--memory", "5"])
    with pytest.raises(agent_main.AgentUsageError):
        agent_main.build_parser().parse_args(["--controller", "a:1", "--node-id", "n", "--work", "/tmp"])
    assert sim_cli.build_parser().allow_abbrev is False
    help_text = " ".join(_help(controller_main.parse_args).split())
    assert "seconds between scheduling rounds (default: 300.0)" in help_text
    assert "--policy-mode {paper,artifact}" in help_text and "(default: paper)" in help_text
    assert "(default crius)" in help_text and "(default: crius)" not in help_text  # said once, by the help
    assert "(default: None)" not in help_text and "(default: )" not in help_text
    est_help = " ".join(_help(estimator_main.parse_args).split())
    assert "answers kept (LRU) (default: 4096)" in est_help


def _help(parse: object) -> str:
    buf = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stdout(buf):
        parse(["--help"])  # type: ignore[operator]
    return buf.getvalue()


def test_defaults_formatter_leaves_out_defaults_not_worth_saying() -> None:
    p = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    p.add_argument("--a", default=3, help="three")
    p.add_argument("--b", default=None, help="none")
    p.add_argument("--c", action="store_true", help="flag")
    p.add_argument("--d", default="x", help="its default is x")
    text = " ".join(p.format_help().split())
    assert "three (default: 3)" in text and "(default: None)" not in text
    assert "flag (default" not in text and "its default is x (default" not in text


def test_submit_takes_the_file_as_argument_or_flag_once() -> None:
    parser = tessctl.build_parser()
    assert parser.parse_args(["submit", "job.yaml"]).file == "job.yaml"
    assert parser.parse_args(["submit", "-f", "job.yaml"]).filename == "job.yaml"
    for argv, why in ((["submit"], "a job file is required"), (["submit", "a.yaml", "-f", "b.yaml"], "once")):
        args = parser.parse_args(argv)
        with pytest.raises(tessctl.CliUsageError, match=why):
            tessctl.jobfile_path(args)


@pytest.mark.parametrize("address, ok", [
    ("localhost:50051", True), ("10.0.0.7:1", True), ("[::1]:50051", True), ("unix:/run/t.sock", True),
    ("ctl-1.example.org:65535", True), ("localhost", False), ("[::1]", False), ("host:0", False),
    ("host:70000", False), ("host:port", False), ("", False),
])
def test_address_checks(address: str, ok: bool) -> None:
    if ok:
        assert check_address(address, "--controller") == address
        return
    with pytest.raises(InvalidArgument) as e:
        check_address(address, "--controller")
    assert e.value.field == "--controller" and "host:port" in e.value.reason


def test_controller_without_a_port_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidArgument, match="'localhost' has no port: expected host:port, e.g. localhost:50051"):
        resolve({"controller": "localhost"}, {}, Config(""))
    with pytest.raises(SystemExit) as exit_:  # a bad flag value: argparse's usage error
        tessctl.main(["--controller", "localhost", "get", "jobs"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == ("tessctl: error: argument --controller: 'localhost' has no port: expected host:port, "
                   "e.g. localhost:50051 (see 'tessctl --help')")


def test_completion_scripts_name_the_commands_and_flags() -> None:
    parser = tessctl.build_parser()
    bash = completion.script(parser, "bash")
    assert "submit" in bash and "describe" in bash and "--output" in bash and "complete" in bash
    zsh = completion.script(parser, "zsh")
    assert zsh.startswith("#compdef tessctl") and "--controller" in zsh
    buf = io.StringIO()
    assert tessctl.main(["completion", "bash"], out=buf) == 0 and buf.getvalue().strip() == bash.strip()


def test_nodes_show_their_agent_s_version() -> None:
    node = controller_pb2.Node(id="n", agent_version="0.1.0", agent_commit="0123456789abcdef0123")
    assert output.nodes_table([node], 0.0, wide=True).splitlines()[1].split()[-2:] == ["0.1.0+0123456", "-"]
    assert "\nAgent:           0.1.0 (commit 0123456789ab)\n" in output.describe_node(node, 0.0)
    assert "\nAgent:           -\n" in output.describe_node(controller_pb2.Node(id="m"), 0.0)


def test_describe_node_says_how_the_node_keeps_workers_off_other_gpus() -> None:
    def line(**kw: object) -> str:
        text = output.describe_node(controller_pb2.Node(id="n", **kw), 0.0)  # type: ignore[arg-type]
        return next(x for x in text.splitlines() if x.startswith("GPU isolation:")).split(":", 1)[1].strip()

    assert line(gpu_isolation=common_pb2.GPU_ISOLATION_DEVICE_CGROUPS) == (
        "device cgroups: a worker can open only its attempt's GPUs here")
    assert line(gpu_isolation=common_pb2.GPU_ISOLATION_DETECTION, gpu_isolation_note="the agent is not root") == (
        "NVML detection only: a job found on a GPU it was not given is evicted within a refresh "
        "(device cgroups off: the agent is not root)")
    assert line(gpu_isolation=common_pb2.GPU_ISOLATION_NONE).startswith("none: a declared inventory")
    assert line() == "unknown (the agent has not said)"
    wide = output.nodes_table([controller_pb2.Node(id="n", gpu_isolation=common_pb2.GPU_ISOLATION_DEVICE_CGROUPS),
                               controller_pb2.Node(id="m", gpu_isolation=common_pb2.GPU_ISOLATION_DETECTION)],
                              0.0, wide=True).splitlines()
    assert [r.split()[-3] for r in wide] == ["ISOLATION", "cgroups", "detection"]


def test_gpu_type_warning_suggests_the_cluster_s_close_names() -> None:
    spec = common_pb2.JobSpec()
    spec.hint.gpu_types.append("H100-80GB")
    node = controller_pb2.Node(id="n")
    node.inventory.gpus.add(index=0, model="A100-80GB")
    node.inventory.gpus.add(index=1, model="A40-48GB")
    text = missing_types(spec, [node])
    assert text == ("no node has GPU type H100-80GB (the cluster has A100-80GB, A40-48GB): the job waits until "
                    "such a node joins (did you mean A100-80GB?)")
    spec.hint.gpu_types.append("A40-48GB")
    assert missing_types(spec, [node]) == ""  # one of the types is there
    assert missing_types(common_pb2.JobSpec(), [node]) == ""  # no type asked


@pytest.mark.parametrize("argv, attr, value", [
    (["cancel", "job/j-1a2b"], "id", "j-1a2b"),
    (["describe", "job", "jobs/j-1a2b"], "id", "j-1a2b"),
    (["get", "jobs", "job/j-1", "j-2"], "ids", ["j-1", "j-2"]),
    (["drain", "node/gpu-1"], "node", "gpu-1"),
    (["delete", "node", "node/gpu-1"], "node", "gpu-1"),
    (["get", "nodes", "node/gpu-1"], "ids", ["gpu-1"]),
    (["logs", "j-9"], "id", "j-9"),
])
def test_ids_take_the_kind_prefix_that_dash_o_name_prints(argv: list[str], attr: str, value: object) -> None:
    args = tessctl.build_parser().parse_args(argv)
    tessctl.argtypes.strip_kind_prefixes(args)
    assert getattr(args, attr) == value


def test_an_id_of_the_other_kind_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert tessctl.main(["--controller", "127.0.0.1:1", "cancel", "node/gpu-1"]) == 2
    assert capsys.readouterr().err.strip() == "tessctl: error: 'node/gpu-1' names a node; this command takes a job"
    args = tessctl.build_parser().parse_args(["drain", "job/j-1"])
    with pytest.raises(tessctl.CliUsageError, match="names a job; this command takes a node"):
        tessctl.argtypes.strip_kind_prefixes(args)


def test_version_of_a_controller_without_the_info_service() -> None:
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    server = grpc.server(ThreadPoolExecutor(max_workers=1))  # serves no service at all
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        buf = io.StringIO()
        assert tessctl.main(["--insecure", "--controller", f"127.0.0.1:{port}", "version"], out=buf) == 0
        lines = buf.getvalue().splitlines()
        assert lines[0].startswith("Client: tessctl ")
        assert lines[1] == f"Server: tessera-controller unknown (no tessera.v1.Info) at 127.0.0.1:{port}"
    finally:
        server.stop(0)
