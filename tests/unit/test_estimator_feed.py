"""What the controller relays to a tessera-estimator (controller/estimator_feed.py)."""

from __future__ import annotations

from tessera.controller.core.step_times import Learned, StepSample
from tessera.controller.estimator_feed import step_times_request
from tessera.controller.store import JobRecord
from tessera.estimator.models import REGISTERED
from tessera.v1 import common_pb2 as P


def test_a_tenants_step_times_refit_its_own_model_key_and_name_no_shared_cell() -> None:
    """The service keys its measured Cells by model, not tenant: with the job's model in the
    request, one tenant's reported time became every caller's Cell (an audit moved another
    caller's 8 x A100 Cell from 0.082 s to 8.1 s per iteration). The refit keeps the model key,
    which carries the tenant."""
    spec = P.JobSpec(name="j", tenant="acme", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8,
                     iterations=10, plan=P.ExecutionPlan(flash_attention=False))
    job = JobRecord(id="j-1", request_id="r", spec=spec, state=P.JOB_STATE_RUNNING, reason="", submit_time=0.0,
                    attempt=1, plan=P.Plan(dp=2, tp=1, pp=1, micro_batch=4, grad_accum=1, gpu_model="A100-80GB"))
    learned = Learned("j-1", 1, 0.5, 3, (StepSample(4, 0.5, 10.0),), True)
    req = step_times_request(job, REGISTERED["gpt2-small"], "A100-80GB", [2], learned, "gpt2-small@acme")
    assert req.model_key == "gpt2-small@acme" and [s.seconds for s in req.steps] == [0.5]
    assert not req.HasField("model") and not req.global_batch_size and not req.HasField("recipe")
