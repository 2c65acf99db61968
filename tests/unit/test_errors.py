"""The error model (tessera.common.errors): codes, fields, messages, and the library errors' place in it."""

from __future__ import annotations

import pickle

import pytest

from tessera.clients.estimate import ClusterFileError
from tessera.clients.jobfile import JobFileError, parse_job_yaml
from tessera.clients.sdk import ControllerUnreachable, RpcError
from tessera.clients.tessctl import CliUsageError
from tessera.common.errors import (
    AlreadyExists,
    Code,
    FailedPrecondition,
    InvalidArgument,
    InvalidInput,
    NotFound,
    TesseraError,
    Unavailable,
)
from tessera.common.gpus import UnknownGpuError, lookup
from tessera.controller.core.policy import RoundPlanError
from tessera.estimator.cells import CellInputError, GpuPool
from tessera.estimator.comm import CommError, bus_factor
from tessera.estimator.partition import PartitionError
from tessera.estimator.perf_model import PerfModelInputError
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.service.handlers import TracedUnavailable
from tessera.nodeagent import errors as agent_errors
from tessera.nodeagent.main import AgentUsageError


@pytest.mark.parametrize(("error", "code"), [
    (TesseraError("boom"), Code.INTERNAL),
    (InvalidInput("jobs.yaml: not a mapping"), Code.INVALID_ARGUMENT),
    (InvalidArgument("plan.tp", "must be >= 1"), Code.INVALID_ARGUMENT),
    (NotFound("job j1 not found"), Code.NOT_FOUND),
    (AlreadyExists("request_id: r1 was already used"), Code.ALREADY_EXISTS),
    (FailedPrecondition("node is draining"), Code.FAILED_PRECONDITION),
    (Unavailable("node n1 is not reachable"), Code.UNAVAILABLE),
])
def test_each_kind_carries_its_code_and_its_message(error: TesseraError, code: Code) -> None:
    assert error.code is code
    assert str(error) == error.message == error.args[0]


def test_an_invalid_argument_carries_field_and_reason_as_data() -> None:
    err = InvalidArgument("samples[2].config.plan.dp", "must be >= 1, got 0")
    assert (err.field, err.reason) == ("samples[2].config.plan.dp", "must be >= 1, got 0")
    assert str(err) == "samples[2].config.plan.dp: must be >= 1, got 0"


def test_code_is_its_name_as_a_string() -> None:
    # The SDK's users compare err.code with a name; a Code must keep that working.
    assert Code.NOT_FOUND == "NOT_FOUND" and f"{Code.INVALID_ARGUMENT}" == "INVALID_ARGUMENT"
    assert RpcError("NOT_FOUND", "job x not found").code == "NOT_FOUND"


@pytest.mark.parametrize("cls", [PlanInputError, CellInputError, PerfModelInputError, PartitionError, CommError])
def test_library_input_errors_are_invalid_arguments_and_value_errors(cls: type[InvalidArgument]) -> None:
    err = cls("model.hidden_size", "must be > 0")
    assert isinstance(err, InvalidArgument) and isinstance(err, ValueError)
    assert (err.code, err.field, err.reason) == (Code.INVALID_ARGUMENT, "model.hidden_size", "must be > 0")
    copy = pickle.loads(pickle.dumps(err))  # a process pool hands errors back pickled
    assert type(copy) is cls and (copy.field, copy.reason) == (err.field, err.reason)


def test_the_libraries_raise_with_the_field_as_data_not_only_in_the_text() -> None:
    with pytest.raises(PlanInputError) as plan:
        ExecutionPlan(tp=0)
    assert plan.value.field == "plan.tp" and str(plan.value) == f"plan.tp: {plan.value.reason}"
    with pytest.raises(CommError) as comm:
        bus_factor("all_reduce", 0)
    assert (comm.value.field, comm.value.reason) == ("world", "must be >= 1, got 0")
    with pytest.raises(CellInputError) as cell:
        GpuPool("A100-80GB", 0, 8)
    assert (cell.value.field, cell.value.reason) == ("num_gpus", "must be >= 1, got 0")
    with pytest.raises(JobFileError) as job:
        parse_job_yaml("name: [")
    assert job.value.field == "" and "YAML" in job.value.reason  # the document as a whole


def test_file_errors_are_invalid_input_with_file_line_and_field() -> None:
    # An input file's error (tessera.common.yamlfile.InputFileError) names its file and line besides the
    # field, so it is an InvalidInput (code INVALID_ARGUMENT) rather than one request field's error.
    err = JobFileError("model.hidden_size", "must be > 0").at("job.yaml", 7)
    assert isinstance(err, InvalidInput) and isinstance(err, ValueError) and err.code is Code.INVALID_ARGUMENT
    assert str(err) == err.message == "job.yaml line 7: field model.hidden_size: must be > 0"
    copy = pickle.loads(pickle.dumps(err))  # a process pool hands errors back pickled
    assert type(copy) is JobFileError and str(copy) == str(err) and (copy.file, copy.line) == ("job.yaml", 7)


def test_errors_without_one_field_are_invalid_input() -> None:
    with pytest.raises(UnknownGpuError) as gpu:
        lookup("Z9000")
    assert isinstance(gpu.value, InvalidInput) and not isinstance(gpu.value, InvalidArgument)
    assert gpu.value.code is Code.INVALID_ARGUMENT and str(gpu.value).startswith("unknown GPU model 'Z9000'")
    for cls in (ClusterFileError, CliUsageError, AgentUsageError):
        assert issubclass(cls, InvalidInput)


def test_distinct_errors_have_distinct_names_and_codes() -> None:
    assert PlanInputError is not RoundPlanError and CliUsageError is not AgentUsageError
    # A policy's bad round plan is a bug in the policy, not bad input from a caller.
    assert RoundPlanError("policy p decided job j twice").code is Code.INTERNAL
    assert TracedUnavailable("mode: traced mode needs torch").code is Code.FAILED_PRECONDITION
    # The agent's core raises the common classes themselves: one name, one thing.
    assert agent_errors.InvalidArgument is InvalidArgument and agent_errors.NotFound is NotFound


def test_a_failed_call_is_a_tessera_error_on_one_line() -> None:
    err = RpcError("INVALID_ARGUMENT", "plan.tp:\n  must be >= 1")
    assert isinstance(err, TesseraError) and err.code is Code.INVALID_ARGUMENT
    assert (err.message, str(err)) == ("plan.tp: must be >= 1", "INVALID_ARGUMENT: plan.tp: must be >= 1")
    assert RpcError("NOT_A_CODE", "x").code is Code.UNKNOWN
    down = ControllerUnreachable("h:1", "connection refused")
    assert isinstance(down, RpcError) and down.code == "UNAVAILABLE" and down.target == "h:1"
