"""Launcher templates: expansion per node and validation, with golden argv."""

from __future__ import annotations

import base64
import importlib.util
import json

import pytest

from tessera.controller.core import launchers
from tessera.controller.core.validate import validate_spec
from tessera.v1 import common_pb2 as P

VALUES: dict[str, object] = {"nnodes": 2, "world_size": 6, "master_addr": "10.0.0.1", "master_port": "29501",
                             "dp": 6, "tp": 1, "pp": 1, "micro_batch": 4, "grad_accum": 1,
                             "global_batch_size": 24, "iterations": 30, "checkpoint_dir": "/ckpt/j-1",
                             "world_info": "", "node_rank": 1, "nproc_per_node": 2}


def test_direct_is_the_entrypoint_itself() -> None:
    tpl = launchers.template_of(P.Launcher())
    assert not tpl.per_node
    assert launchers.expand(tpl, ["train", "--x"], VALUES, head=False) == ["train", "--x"]
    assert launchers.expand(tpl, list(tpl.default_entrypoint), VALUES, head=True) == \
        ["{python}", "-m", "tessera.clients.trainer.reference"]


def test_the_default_entrypoint_names_the_reference_trainer() -> None:
    # The controller names the module as a string (it never imports the clients): it must be the
    # package that runs as `python -m`, for every built-in launcher.
    from tessera.clients.trainer.reference import ENTRYPOINT_MODULE

    assert launchers.REFERENCE_TRAINER == ENTRYPOINT_MODULE
    assert importlib.util.find_spec(f"{ENTRYPOINT_MODULE}.__main__") is not None
    for name, tpl in launchers.BUILTIN.items():
        assert tpl.default_entrypoint[-1] == ENTRYPOINT_MODULE, name


def test_torchrun_golden() -> None:
    tpl = launchers.template_of(P.Launcher(name="torchrun"))
    assert tpl.per_node
    assert launchers.expand(tpl, list(tpl.default_entrypoint), VALUES, head=False) == [
        "{python}", "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=1", "--nproc-per-node=2",
        "--master-addr=10.0.0.1", "--master-port=29501", "-m", "tessera.clients.trainer.reference"]


def test_custom_template_with_head_and_plan_fields() -> None:
    lz = P.Launcher(argv=["ray", "start", "--address={master_addr}:{master_port}", "--block"], per_node=True,
                    head_argv=["{python}", "drive.py", "--dp={dp}", "--ckpt={checkpoint_dir}", "{entrypoint}"])
    assert launchers.check(lz) == []
    tpl = launchers.template_of(lz)
    assert launchers.expand(tpl, ["--steps", "3"], VALUES, head=True) == \
        ["{python}", "drive.py", "--dp=6", "--ckpt=/ckpt/j-1", "--steps", "3"]
    assert launchers.expand(tpl, [], VALUES, head=False) == ["ray", "start", "--address=10.0.0.1:29501", "--block"]


def test_world_info_is_base64_json() -> None:
    wi = launchers.world_info([("n1", [2, 3]), ("n2", [0])])
    assert json.loads(base64.urlsafe_b64decode(wi)) == {"n1": [2, 3], "n2": [0]}


def test_bad_launchers_name_the_field() -> None:
    assert launchers.check(P.Launcher(name="slurm"))[0][0] == "launcher.name"
    assert launchers.check(P.Launcher(name="torchrun", argv=["x"]))[0][0] == "launcher"
    assert launchers.check(P.Launcher(argv=["run", "--n={gpus}"]))[0] == (
        "launcher.argv[1]", launchers.check(P.Launcher(argv=["run", "--n={gpus}"]))[0][1])
    assert "unknown placeholder {gpus}" in launchers.check(P.Launcher(argv=["run", "--n={gpus}"]))[0][1]
    assert launchers.check(P.Launcher(argv=["run", "x{entrypoint}"]))[0][0] == "launcher.argv[1]"
    assert launchers.check(P.Launcher(argv=["a"], head_argv=["b"]))[0][0] == "launcher.head_argv"
    spec = P.JobSpec(name="j", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8, iterations=1,
                     launcher=P.Launcher(name="mpirun"))
    assert next(str(e) for e in validate_spec(spec)).startswith("launcher.name: unknown launcher 'mpirun'")


def test_only_known_placeholders_are_replaced_every_other_brace_is_literal() -> None:
    """A template is the user's: Python's format mini-language is never evaluated. A lone brace used
    to raise in the controller at every launch and inspection; a field width built a 160 MB argv
    from a 66-byte argument; an attribute lookup reached Python objects."""
    odd = ["--x={", "}", "{}", "{0}", "{dp:>17000000}", "{dp.__class__.__mro__}", "{dp!r}", "{{dp}}",
           '--config={"lr": 3e-4}', "x{python}"]
    tpl = launchers.Template(("run", "--dp={dp}", *odd, launchers.ENTRYPOINT))
    assert launchers.check(P.Launcher(argv=tpl.argv)) == []
    assert launchers.expand(tpl, ["train"], VALUES, head=False) == [
        "run", "--dp=6", "--x={", "}", "{}", "{0}", "{dp:>17000000}", "{dp.__class__.__mro__}", "{dp!r}", "{6}",
        '--config={"lr": 3e-4}', "x{python}", "train"]


def test_an_argv_past_what_exec_takes_is_refused() -> None:
    big = {**VALUES, "world_info": "w" * 10_000}
    one = launchers.Template(("run", "{world_info}" * 14))  # 140,000 bytes in one argument
    with pytest.raises(launchers.LaunchTooLarge, match="longest argument 140,000"):
        launchers.expand(one, [], big, head=False)
    many = launchers.Template(("run", *["{world_info}" * 10] * 11))  # 11 x 100,000 bytes
    with pytest.raises(launchers.LaunchTooLarge, match="expands to 1,100,015 bytes"):
        launchers.expand(many, [], big, head=False)
    assert len(launchers.expand(launchers.Template(("run", *["{world_info}" * 10] * 10)), [], big, head=False)) == 11


def _spec(**kw: object) -> P.JobSpec:
    return P.JobSpec(name="j", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8, iterations=1, **kw)


def _fields(spec: P.JobSpec) -> list[str]:
    return [e.field for e in validate_spec(spec)]


def test_raw_grpc_gets_the_bounds_a_job_file_has() -> None:
    # SubmitJob over raw gRPC may carry what no job file can: each is refused, naming its field.
    assert _fields(_spec()) == []
    assert _fields(_spec(progress_timeout_seconds=-5)) == ["progress_timeout_seconds"]
    assert _fields(_spec(progress_timeout_seconds=-1)) == []  # -1 = never (docs/job-file.md)
    assert _fields(_spec(checkpoint_every=2**62)) == ["checkpoint_every"]
    assert _fields(_spec(env={f"V{i}": "x" for i in range(20_000)})) == ["env"]
    assert _fields(_spec(launcher=P.Launcher(argv=["sh -c 'id'", "{entrypoint}"]))) == ["launcher.argv[0]"]
    assert _fields(_spec(launcher=P.Launcher(argv=["run;id"], per_node=True, head_argv=["$(id)"]))) == [
        "launcher.argv[0]", "launcher.head_argv[0]"]
    assert _fields(_spec(launcher=P.Launcher(argv=["x"] * 300))) == ["launcher.argv"]
    for ok in (["{python}", "-m", "torch.distributed.run", "{entrypoint}"], ["{entrypoint}"],
               ["/opt/bin/launch", "{entrypoint}"]):
        assert _fields(_spec(launcher=P.Launcher(argv=ok))) == [], ok
