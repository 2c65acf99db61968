"""Generated requests for every method of every service (Controller, AgentRegistry, NodeAgent,
Estimator), sent over real gRPC on loopback to real server processes: random field values (huge,
negative, NaN and infinities, unknown enum numbers, unicode and control characters, long strings,
nested messages), and random bytes that are not a valid message at all. No answer may be INTERNAL or
UNKNOWN (an unhandled exception: bad input must get a status naming the field), no unary call may
hang, and every server still answers, and is still running, afterwards.

The agent under test registers with no controller (its address is closed): a fuzzed Launch must not
have a real controller place work on it, and a fuzzed Launch's program is always a path that does not
exist, so nothing random is ever executed. The controller has no real agents either: nodes that
fuzzed Registers invent get launches that fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as D
from google.protobuf import message_factory
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from tessera.common import identity
from tessera.common.localcluster import ca_only, start_estimator, tls_config
from tessera.common.rpc import sync_channel
from tessera.v1 import agent_pb2, common_pb2, controller_pb2, estimator_pb2
from tests.e2e.cluster import INVENTORIES
from tests.procs import Daemon, start_agent, start_controller
from tests.property import profile

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 20.0
NO_PROGRAM = "/nonexistent/tessera-fuzz/program"
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}

# ------------------------------------------------------------------ values

INT32 = st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 7]), st.integers(-(2**31), 2**31 - 1))
INT64 = st.one_of(st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**62, 10**12]), st.integers(-(2**63), 2**63 - 1))
UINT32 = st.integers(0, 2**32 - 1)
UINT64 = st.one_of(st.sampled_from([0, 2**64 - 1]), st.integers(0, 2**64 - 1))
DOUBLE = st.one_of(st.sampled_from([0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e308, -1e-308]),
                   st.floats(allow_nan=True, allow_infinity=True))
FLOAT = st.floats(width=32, allow_nan=True, allow_infinity=True)
TEXT = st.one_of(
    st.text(max_size=40),  # every unicode category but surrogates: controls, RTL overrides, NUL
    st.sampled_from(["", " ", "../../etc/passwd", "$(id)", "; rm -rf /", "\x00", "\u202e", "a" * 5000,
                     "j-000000000000", "default", "A10-24GB", "gpt2-small", "127.0.0.1:1"]),
    # Long: a random piece repeated to 2,500..20,000 characters.
    st.builds(lambda piece, n: (piece or "a\u202e") * n, st.text(max_size=4), st.integers(2_500, 5_000)),
)
BYTES = st.binary(max_size=200)

SCALARS: dict[int, st.SearchStrategy[Any]] = {
    D.FieldDescriptor.TYPE_INT32: INT32, D.FieldDescriptor.TYPE_SINT32: INT32, D.FieldDescriptor.TYPE_SFIXED32: INT32,
    D.FieldDescriptor.TYPE_INT64: INT64, D.FieldDescriptor.TYPE_SINT64: INT64, D.FieldDescriptor.TYPE_SFIXED64: INT64,
    D.FieldDescriptor.TYPE_UINT32: UINT32, D.FieldDescriptor.TYPE_FIXED32: UINT32,
    D.FieldDescriptor.TYPE_UINT64: UINT64, D.FieldDescriptor.TYPE_FIXED64: UINT64,
    D.FieldDescriptor.TYPE_DOUBLE: DOUBLE, D.FieldDescriptor.TYPE_FLOAT: FLOAT,
    D.FieldDescriptor.TYPE_BOOL: st.booleans(), D.FieldDescriptor.TYPE_STRING: TEXT,
    D.FieldDescriptor.TYPE_BYTES: BYTES,
}


def _value(draw: st.DrawFn, f: D.FieldDescriptor, depth: int) -> Any:
    if f.type == D.FieldDescriptor.TYPE_ENUM:
        # Known numbers, and numbers the enum does not have (proto3 keeps them).
        return draw(st.one_of(st.sampled_from([v.number for v in f.enum_type.values]), INT32))
    if f.type == D.FieldDescriptor.TYPE_MESSAGE:
        return draw(messages(f.message_type, depth + 1))
    return draw(SCALARS[f.type])


@st.composite
def messages(draw: st.DrawFn, desc: D.Descriptor, depth: int = 0) -> Message:
    """A message of type `desc` with a random subset of its fields set to random values."""
    msg = message_factory.GetMessageClass(desc)()
    if depth > 3:
        return msg
    for f in desc.fields:
        if not draw(st.booleans()):
            continue
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, val_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            n = draw(st.sampled_from([0, 1, 3, 2000]))
            target = getattr(msg, f.name)
            for _ in range(n if n < 100 else 1):
                k = _value(draw, key_f, depth)
                if val_f.type == D.FieldDescriptor.TYPE_MESSAGE:
                    target[k].CopyFrom(_value(draw, val_f, depth))
                else:
                    target[k] = _value(draw, val_f, depth)
            if n >= 100:  # many entries, cheaply
                for i in range(n):
                    if key_f.type == D.FieldDescriptor.TYPE_STRING and val_f.type == D.FieldDescriptor.TYPE_STRING:
                        target[f"K{i}"] = "v"
        elif f.is_repeated:
            values = [_value(draw, f, depth) for _ in range(draw(st.integers(0, 4)))]
            if f.type == D.FieldDescriptor.TYPE_MESSAGE:
                getattr(msg, f.name).extend(values)
            else:
                getattr(msg, f.name).extend(values * draw(st.sampled_from([1, 1, 1, 5000])))
        elif f.type == D.FieldDescriptor.TYPE_MESSAGE:
            getattr(msg, f.name).CopyFrom(_value(draw, f, depth))
        else:
            setattr(msg, f.name, _value(draw, f, depth))
    return msg


def _seeds() -> dict[str, Message]:
    """A valid request per method where one is easy to write: mutating a valid request reaches the
    handlers' deeper paths, where a fully random one stops at the first field check."""
    model = common_pb2.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64)
    spec = common_pb2.JobSpec(name="fz", model=model, global_batch_size=16, iterations=10, checkpoint_every=5)
    inv = common_pb2.NodeInventory(source=common_pb2.INVENTORY_SOURCE_DECLARED, hostname="fz", gpus=[
        common_pb2.Gpu(index=i, uuid=f"FZ-{i}", model="A10-24GB", memory_bytes=24 << 30) for i in range(2)])
    status = agent_pb2.NodeStatus(node_id="fz-node", address="127.0.0.1:1", inventory=inv)
    plan = common_pb2.ExecutionPlan(dp=1, tp=1, pp=1, micro_batch=4, grad_accum=4)
    return {
        "SubmitJob": controller_pb2.SubmitJobRequest(request_id="fz-1", spec=spec),
        "Register": agent_pb2.RegisterRequest(request_id="fz-r", status=status),
        "Heartbeat": agent_pb2.HeartbeatRequest(status=status, controller_epoch=1),
        "Launch": agent_pb2.LaunchRequest(
            request_id="j-fz/1/n", controller_epoch=1, job_id="j-fz", attempt=1, world_size=1,
            ranks=[agent_pb2.RankAssignment(rank=0, local_rank=0, gpu_indices=[0])], rendezvous="127.0.0.1:29999",
            argv=[NO_PROGRAM], iterations=10, global_batch_size=16, model=model, checkpoint_every=5),
        "EstimateMemory": estimator_pb2.EstimateMemoryRequest(model=model, plan=plan, gpu="A10-24GB",
                                                              global_batch_size=16),
        "GetCells": estimator_pb2.GetCellsRequest(model=model, global_batch_size=16),
    }


SEEDS = _seeds()


@st.composite
def requests(draw: st.DrawFn, m: Method) -> Message:
    """A random request, or (for methods with a seed) the seed with one to three of its top-level
    fields replaced or merged with random values."""
    random_msg = draw(messages(m.desc.input_type))
    seed = SEEDS.get(m.name)
    if seed is None or draw(st.booleans()):
        return random_msg
    keep = draw(st.integers(1, 3))
    for f, _ in random_msg.ListFields()[keep:]:
        random_msg.ClearField(f.name)
    out = type(seed)()
    out.CopyFrom(seed)
    out.MergeFrom(random_msg)  # scalars replaced, sub-messages merged field by field, lists extended
    return out


# ------------------------------------------------------------------ servers and methods


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    desc: D.MethodDescriptor

    @property
    def path(self) -> str:
        return f"/{self.desc.containing_service.full_name}/{self.name}"

    def __str__(self) -> str:
        return f"{self.service}.{self.name}"


def methods_of(module: Any, service: str) -> list[Method]:
    svc = module.DESCRIPTOR.services_by_name[service]
    return [Method(service, m.name, m) for m in svc.methods]


METHODS = (methods_of(controller_pb2, "Controller") + methods_of(agent_pb2, "AgentRegistry")
           + methods_of(agent_pb2, "NodeAgent") + methods_of(estimator_pb2, "Estimator"))


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Daemon]]:
    root = tmp_path_factory.mktemp("fuzz")
    global _metadata
    ctl = start_controller(root / "state")
    _metadata = (("authorization", f"Bearer {ctl.token}"),)
    # No controller behind this address: the agent serves, keeps retrying its registration, and no
    # fuzzed job is ever placed on it.
    agent = start_agent("127.0.0.1:1", "fuzz-node", INVENTORIES / "a10-node.yaml", root / "agent")
    est = start_estimator(root / "estimator.log")
    daemons = {"Controller": ctl, "AgentRegistry": ctl, "NodeAgent": agent, "Estimator": est}
    yield daemons
    for d in (ctl, agent, est):
        d.stop()


def harmless(m: Method, msg: Message) -> Message:
    """A Launch runs its argv: make sure whatever was generated names no program that exists."""
    if isinstance(msg, agent_pb2.LaunchRequest):
        if msg.argv:
            msg.argv[0] = NO_PROGRAM
        else:
            msg.argv.append(NO_PROGRAM)
    return msg


# Who calls each service, so that fuzzed requests get past authentication to the handlers: the
# controller's users' port with the admin token, its agent port with the seeds' node certificate,
# the agent as the controller, the estimator as the controller.
CALLERS = {"Controller": None, "AgentRegistry": identity.node("fz-node"), "NodeAgent": identity.CONTROLLER,
           "Estimator": identity.CONTROLLER}
PEERS = {"NodeAgent": identity.node("fuzz-node"), "Estimator": identity.ESTIMATOR}
_metadata: tuple[tuple[str, str], ...] = ()


def channel_to(servers: dict[str, Daemon], service: str) -> grpc.Channel:
    d = servers[service]
    who = CALLERS[service]
    creds = tls_config(who) if who is not None else ca_only()
    address = d.agent_address if service == "AgentRegistry" else d.address
    return sync_channel(address, tls=creds, peer=PEERS.get(service))


def call(channel: grpc.Channel, m: Method, payload: bytes) -> grpc.StatusCode:
    """Send raw bytes as the request; the status code (OK when answered)."""
    try:
        if m.desc.server_streaming:
            stream = channel.unary_stream(m.path)(payload, timeout=1.0, metadata=_metadata)
            for i, _ in enumerate(stream):
                if i >= 3:
                    stream.cancel()
                    break
        else:
            channel.unary_unary(m.path)(payload, timeout=CALL_TIMEOUT_S, metadata=_metadata)
    except grpc.RpcError as e:
        code = e.code()
        if m.desc.server_streaming and code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            return grpc.StatusCode.OK  # a watch that is still open after a second: it answered
        return code  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def assert_still_serving(d: Daemon, channel: grpc.Channel, service: str) -> None:
    """The server answers a plain call after the fuzzing (any status but a crash or silence)."""
    assert d.proc.poll() is None, f"{d.name} exited {d.proc.returncode}"
    probe = {
        "Controller": ("/tessera.v1.Controller/ListNodes", controller_pb2.ListNodesRequest()),
        "AgentRegistry": ("/tessera.v1.Controller/ListNodes", controller_pb2.ListNodesRequest()),
        "NodeAgent": ("/tessera.v1.NodeAgent/Drain", agent_pb2.DrainRequest(controller_epoch=0, drain=False)),
        "Estimator": ("/tessera.v1.Estimator/Health", estimator_pb2.HealthRequest()),
    }[service]
    try:
        channel.unary_unary(probe[0])(probe[1].SerializeToString(), timeout=CALL_TIMEOUT_S, metadata=_metadata)
    except grpc.RpcError as e:
        # Answering at all is the point: a stale-epoch refusal is an answer.
        assert e.code() not in FORBIDDEN | {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}, \
            f"{d.name} no longer answers: {e.code()} {e.details()}"


@pytest.mark.parametrize("m", METHODS, ids=str)
def test_generated_requests_never_crash_a_server(servers: dict[str, Daemon], m: Method) -> None:
    d = servers[m.service]
    with channel_to(servers, m.service) as channel:

        @profile(40)
        @given(msg=requests(m))
        def typed(msg: Message) -> None:
            code = call(channel, m, harmless(m, msg).SerializeToString())
            assert code not in FORBIDDEN and code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{m}: {code} for {msg!r:.2000}"

        @profile(15)
        @given(payload=st.binary(max_size=2000))
        def raw(payload: bytes) -> None:
            try:
                parsed = message_factory.GetMessageClass(m.desc.input_type).FromString(payload)
            except Exception:  # noqa: BLE001 - not a message: sent as it is, the server must refuse it
                parsed = None
            if isinstance(parsed, agent_pb2.LaunchRequest):
                payload = harmless(m, parsed).SerializeToString()
            code = call(channel, m, payload)
            assert code not in FORBIDDEN and code != grpc.StatusCode.DEADLINE_EXCEEDED, f"{m}: {code} for {payload!r:.500}"

        typed()
        raw()
        assert_still_serving(d, channel, m.service)


def test_every_service_is_fuzzed() -> None:
    services = {m.service for m in METHODS}
    assert services == {"Controller", "AgentRegistry", "NodeAgent", "Estimator"}
    assert len(METHODS) >= 20


def test_corrupt_bytes_and_unknown_enums_get_a_status_naming_the_field(servers: dict[str, Daemon]) -> None:
    """What the fuzzing found, as plain regression tests."""
    for service, path in (("Controller", "/tessera.v1.Controller/ListNodes"),
                          ("NodeAgent", "/tessera.v1.NodeAgent/Drain"),
                          ("Estimator", "/tessera.v1.Estimator/Health")):
        with channel_to(servers, service) as channel, pytest.raises(grpc.RpcError) as e:
            channel.unary_unary(path)(b"\x0a\x05abc", timeout=CALL_TIMEOUT_S, metadata=_metadata)  # cut short
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details().startswith("request:")
    req = SEEDS["Register"]
    bad = agent_pb2.RegisterRequest()
    bad.CopyFrom(req)
    bad.status.inventory.source = -1  # type: ignore[assignment]
    with channel_to(servers, "AgentRegistry") as channel, pytest.raises(grpc.RpcError) as e:
        channel.unary_unary("/tessera.v1.AgentRegistry/Register")(bad.SerializeToString(), timeout=CALL_TIMEOUT_S)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("status.inventory.source:")
