"""A submit that timed out may have been stored: the SDK tries again with the same request id
(which finds the stored job), and a failure that remains carries the id. Before, a user's retry
after DEADLINE_EXCEEDED made a second job (the controller had stored the first after the
deadline). The controller's idempotency by request id is tested with it
(tests/integration/test_controller_api.py and the property tests)."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import grpc
import pytest

from tessera.clients import aio, sdk, tessctl
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "Deadline Exceeded" if self._code == grpc.StatusCode.DEADLINE_EXCEEDED else "no"


class Flaky:
    """SubmitJob failing with `fails` first; it records every request id it was sent."""

    def __init__(self, *fails: grpc.StatusCode, awaitable: bool = False) -> None:
        self.fails, self.ids, self.awaitable = list(fails), [], awaitable

    def SubmitJob(self, req: controller_pb2.SubmitJobRequest, **kw: Any) -> Any:
        self.ids.append(req.request_id)
        if self.fails:
            err = _Failed(self.fails.pop(0))
            if self.awaitable:
                async def fail() -> None:
                    raise err
                return fail()
            raise err
        resp = controller_pb2.SubmitJobResponse(job=controller_pb2.Job(id="j-1"), created=True)
        if self.awaitable:
            async def ok() -> controller_pb2.SubmitJobResponse:
                return resp
            return ok()
        return resp


SPEC = P.JobSpec(name="nightly")
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_timed_out_submit_is_sent_again_with_the_same_id() -> None:
    c = sdk.Client("127.0.0.1:1", insecure=True)
    c._stub = Flaky(DEADLINE, grpc.StatusCode.UNAVAILABLE)  # type: ignore[assignment]
    assert c.submit_ex(SPEC).job.id == "j-1"
    ids = c._stub.ids  # type: ignore[attr-defined]
    assert len(ids) == 3 and len(set(ids)) == 1


def test_a_submit_that_keeps_failing_says_its_request_id_and_tessctl_prints_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    c = sdk.Client("127.0.0.1:1", insecure=True)
    c._stub = Flaky(*[DEADLINE] * 3)  # type: ignore[assignment]
    with pytest.raises(sdk.RpcError) as err:
        c.submit_ex(SPEC, request_id="my-id")
    assert (err.value.code, err.value.request_id) == ("DEADLINE_EXCEEDED", "my-id")
    assert c._stub.ids == ["my-id"] * 3  # type: ignore[attr-defined]
    # Another failure is not retried: the same answer would come again.
    c._stub = Flaky(grpc.StatusCode.INVALID_ARGUMENT)  # type: ignore[assignment]
    with pytest.raises(sdk.RpcError):
        c.submit_ex(SPEC)
    assert len(c._stub.ids) == 1  # type: ignore[attr-defined]
    # tessctl says how to retry without a second job.
    job = tmp_path / "job.yaml"
    job.write_text("name: nightly\nmodel: gpt2-small\nglobal_batch_size: 8\niterations: 10\n")
    stub = Flaky(*[DEADLINE] * 3)
    real = tessctl.connect
    monkeypatch.setattr(tessctl, "connect", lambda *a, **k: _with_stub(real(*a, **k), stub))
    rc = tessctl.main(["--controller", "127.0.0.1:1", "--insecure", "submit", "-f", str(job)], out=io.StringIO())
    assert rc == 1
    err_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert err_line.endswith(f"(the job may have been stored: retry with --request-id {stub.ids[0]})"), err_line


def _with_stub(client: sdk.Client, stub: Flaky) -> sdk.Client:
    client._stub = stub  # type: ignore[assignment]
    return client


def test_the_async_client_retries_with_the_same_id_too() -> None:
    async def go() -> tuple[str, list[str]]:
        c = aio.AsyncClient("127.0.0.1:1", insecure=True)
        c._stub = Flaky(DEADLINE, awaitable=True)  # type: ignore[assignment]
        try:
            job = await c.submit(SPEC)
            return job.id, c._stub.ids  # type: ignore[attr-defined]
        finally:
            await c.close()

    job_id, ids = asyncio.run(go())
    assert job_id == "j-1" and len(ids) == 2 and ids[0] == ids[1]
