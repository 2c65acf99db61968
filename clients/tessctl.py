"""tessctl: the admin CLI of a Tessera controller, in the habits of kubectl (docs/cli.md).

Exit status: 0 on success (also when the reader of stdout stops early, `| head`), 1 on any error
(one line on stderr, "tessctl: error: ..."), 2 on a usage error, 130 when interrupted (Ctrl-C ends a
--watch or a logs --follow). `wait`, `submit --wait` and `get jobs ID --watch` exit with the job's
end: 0 succeeded, 1 failed (or not seen to end), 4 cancelled, 124 timed out (tessera.clients.waiting).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

# gRPC's C core logs a failed TLS handshake at INFO on stderr, before tessctl's own one line: only
# its errors are wanted. Read once, when grpc is first imported (below).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from tessera.clients import (
    admin,
    argtypes,
    completion,
    ctlconfig,
    formats,
    gpuhints,
    named,
    output,
    plancost,
    terminal,
    versioncmd,
    waiting,
)
from tessera.clients.argtypes import jobfile_argument, jobfile_path
from tessera.clients.config import Settings
from tessera.clients.estimate import EstimatorUnreachable
from tessera.clients.jobfile import load_job_file, parse_job_yaml
from tessera.clients.sdk import (
    RETRY_SUBMIT,
    TERMINAL_STATES,
    Client,
    ControllerUnreachable,
    RpcError,
    state_value,
)
from tessera.clients.submit_args import add_priority_arguments, apply_priority_arguments
from tessera.clients.tenants_output import tenants_json, tenants_table
from tessera.common.durations import MAX_SECONDS
from tessera.common.errors import TesseraError
from tessera.common.yamlfile import InputFileError
from tessera.v1 import common_pb2, controller_pb2

SIMULATOR = "tessera.controller.sim.cli"  # run as a process by `tessctl simulate`, never imported
SIMULATE_HELP = "replay a trace under scheduling policies, locally (tessera-sim)"
SIMULATE_ONE_FORM = ("`tessctl simulate` prints the simulator's own table; its results as JSON are files "
                     "in its --out DIR (metrics.json)")


CliUsageError = argtypes.UsageError  # a usage problem found after parsing: exit 2


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line: "tessctl: error: ... (see 'tessctl get --help')";
    no abbreviated flags (`--stat` is not `--state`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tessctl: error: {message} (see '{self.prog} --help')\n")


def _common_options() -> argparse.ArgumentParser:
    # SUPPRESS: an option given before the subcommand is not reset by the subcommand's parser.
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ctlconfig.common_options(common)
    common.add_argument("-o", "--output", type=formats.output_format, default=argparse.SUPPRESS, metavar="FORMAT",
                        help=f"output format: {formats.CHOICES} (default: table)")
    common.add_argument("--timeout", type=argtypes.seconds, metavar="SECONDS", default=argparse.SUPPRESS,
                        help="deadline of each call to the controller (default: 10); for wait: how long to wait "
                             "(10m, 90s, 1h30m; default: until the job ends); > 0 and at most "
                             f"{MAX_SECONDS:,} s")
    common.add_argument("--insecure", action="store_true", default=argparse.SUPPRESS,
                        help="plaintext gRPC, for a controller started with --insecure")
    return common






def _states(text: str) -> list[int]:
    try:
        return [state_value(s) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = _Parser(
        prog="tessctl", parents=[common],
        description="Submit and inspect training jobs and nodes of a Tessera controller.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(parent: Any, name: str, func: Callable[..., int], help: str, **kw: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, parents=[common], help=help, description=help, **kw)
        p.set_defaults(func=func)
        return p

    p = command(sub, "submit", cmd_submit, "submit a job file")
    jobfile_argument(p)
    p.add_argument("--request-id", default=None, help="idempotency key (default: a fresh uuid4)")
    p.add_argument("--allow-env", action="append", default=[], metavar="NAME",
                   help="do not refuse this hook variable locally (LD_LIBRARY_PATH, ...): the controller's "
                        "--allow-env decides; repeatable")
    p.add_argument("--wait", action="store_true",
                   help="then wait for the job to end, showing its progress (exit status as tessctl wait)")
    add_priority_arguments(p)

    get = command(sub, "get", _needs_resource, "list jobs or nodes")
    get_sub = get.add_subparsers(dest="resource", metavar="RESOURCE", required=True)
    p = command(get_sub, "jobs", cmd_get_jobs, "list jobs", aliases=["job"])
    p.add_argument("ids", nargs="*", metavar="ID", help="only these jobs")
    p.add_argument("--state", type=_states, action="append", default=[], metavar="STATE[,STATE]",
                   help="only jobs in these states (pending, running, ...); repeatable")
    p.add_argument("--tenant", default="", help="only jobs of this tenant")
    p.add_argument("--limit", type=argtypes.non_negative_int, default=0, metavar="N",
                   help="at most N jobs, the oldest first (default 0: all, every page)")
    p.add_argument("-w", "--watch", action="store_true", help="print again on every change")
    command(get_sub, "tenants", cmd_get_tenants, "tenants: GPU quotas, guaranteed and borrowed GPUs, jobs",
            aliases=["tenant"])
    p = command(get_sub, "nodes", cmd_get_nodes, "list nodes", aliases=["node"])
    p.add_argument("ids", nargs="*", metavar="ID", help="only these nodes")
    p.add_argument("-w", "--watch", action="store_true", help="print again on every change")

    desc = command(sub, "describe", _needs_resource, "show one job or node in detail, with events")
    desc_sub = desc.add_subparsers(dest="resource", metavar="RESOURCE", required=True)
    p = command(desc_sub, "job", cmd_describe_job, "a job with its plan, placement, progress and events",
                aliases=["jobs"])
    p.add_argument("id", metavar="ID")
    p = command(desc_sub, "node", cmd_describe_node, "a node with its GPUs and the jobs placed on it",
                aliases=["nodes"])
    p.add_argument("id", metavar="ID")

    p = command(sub, "cancel", cmd_cancel, "cancel a job")
    p.add_argument("id", metavar="ID")
    p.add_argument("--request-id", default=None, help="idempotency key (default: a fresh uuid4)")
    p.add_argument("--allow-env", action="append", default=[], metavar="NAME",
                   help="do not refuse this hook variable locally (LD_LIBRARY_PATH, ...): the controller's "
                        "--allow-env decides; repeatable")

    p = command(sub, "drain", cmd_drain, "stop placing work on a node and move its jobs away")
    p.add_argument("node", metavar="NODE")
    p.add_argument("--reason", default="", help="why (shown in the node's REASON)")
    p.add_argument("--request-id", default=None, help="idempotency key (default: a fresh uuid4)")
    p.add_argument("--allow-env", action="append", default=[], metavar="NAME",
                   help="do not refuse this hook variable locally (LD_LIBRARY_PATH, ...): the controller's "
                        "--allow-env decides; repeatable")

    p = command(sub, "undrain", cmd_undrain, "make a drained node schedulable again")
    p.add_argument("node", metavar="NODE")
    p.add_argument("--request-id", default=None, help="idempotency key (default: a fresh uuid4)")
    p.add_argument("--allow-env", action="append", default=[], metavar="NAME",
                   help="do not refuse this hook variable locally (LD_LIBRARY_PATH, ...): the controller's "
                        "--allow-env decides; repeatable")

    delete = command(sub, "delete", _needs_resource, "remove a node from the controller (admin)")
    delete_sub = delete.add_subparsers(dest="resource", metavar="RESOURCE", required=True)
    p = command(delete_sub, "node", cmd_delete_node, "forget a node: refused while it runs work unless --force",
                aliases=["nodes"])
    p.add_argument("node", metavar="NODE")
    p.add_argument("--force", action="store_true", help="remove it even while it runs work (its jobs are requeued)")
    p.add_argument("--request-id", default=None, help="idempotency key (default: a fresh uuid4)")

    p = command(sub, "logs", waiting.cmd_logs, "print the workers' logs, whole lines")
    p.add_argument("id", metavar="ID")
    ranks = p.add_mutually_exclusive_group()
    ranks.add_argument("--rank", type=argtypes.non_negative_int, default=0, help="rank (default 0)")
    ranks.add_argument("--all-ranks", action="store_true", help="every rank's log, each line prefixed [rank N]")
    p.add_argument("--attempt", type=argtypes.non_negative_int, default=0, help="attempt (default: the current or last)")
    p.add_argument("--tail", type=argtypes.non_negative_int, default=0, metavar="LINES",
                   help="the last LINES lines of each log (default 0: all the controller reads, up to 4 MiB)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="then stream new lines as they are written, until the job ends")
    p.add_argument("--raw", action="store_true",
                   help="write the log's bytes as they are even to a terminal (default there: control "
                        "sequences other than colours shown as \\xNN)")

    # Every argument after `simulate`, --help included, goes to the simulator's own parser (see
    # cmd_simulate); no common options here: `--out` must not abbreviate `--output`.
    p = sub.add_parser("simulate", add_help=False, help=SIMULATE_HELP, description=SIMULATE_HELP)
    p.set_defaults(func=cmd_simulate, one_form=SIMULATE_ONE_FORM)

    est = command(sub, "estimate", _needs_resource,
                  "ask the estimator about a job: memory per GPU, Cells, stage placement, the time of a plan")
    from tessera.clients.estimate import add_arguments as _estimate_arguments
    from tessera.clients.estimate_time import add_time_command

    add_time_command(_estimate_arguments(est, command), command)

    command(sub, "whoami", cmd_whoami, "who the controller takes you for: principal, tenant, role")
    ctlconfig.add_arguments(sub, command)
    admin.add_arguments(sub, command)
    plancost.add_arguments(sub, command)  # tessctl plan-cost (clients/plancost.py)
    versioncmd.add_arguments(sub, command)
    completion.add_arguments(sub, command, parser)
    waiting.add_arguments(sub, command)
    return parser


def _needs_resource(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    raise CliUsageError("a resource is required")  # argparse makes it required: not reached


# -- commands ---------------------------------------------------------------------------------------


def cmd_submit(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    args.filename = jobfile_path(args)
    if args.filename == "-":
        spec = parse_job_yaml(sys.stdin.read(), "<stdin>", args.allow_env)
    else:
        spec = load_job_file(args.filename, args.allow_env)
    apply_priority_arguments(spec, args)
    result = client.submit_ex(spec, request_id=args.request_id)
    gpuhints.warn_missing_types(client, spec)
    if args.output == "json":
        terminal.println(out, output.dumps({**output.to_dict(result.job), "created": result.created}))
    else:
        terminal.println(out, output.jobs_table([result.job], time.time(), wide=args.output == "wide"))
    # -o json says it with "created": false (its stderr stays empty for scripts); yaml, name and
    # jsonpath run as json behind a StructuredOut (formats.wrap), and a person reads those.
    if not result.created and not (args.output == "json" and not isinstance(out, formats.StructuredOut)):
        print(f"tessctl: request id seen before: job {output.safe(result.job.id)} was not created again",
              file=sys.stderr)
    if args.wait:
        return waiting.follow_job(client, result.job.id, out, quiet=args.output == "json")
    return 0


def cmd_get_jobs(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    states = [s for group in args.state for s in group]

    def table(jobs: Sequence[controller_pb2.Job], now: float, wide: bool) -> str:
        return output.jobs_table(jobs, now, wide, _gpu_models(client, jobs))

    render = terminal.renderer(out, args.output, output.jobs_json, table, "jobs")
    if not args.watch and args.ids:
        jobs, missing = named.fetch_named(args.ids, client.get)
        if jobs:  # none found: the error lines say it all
            render(jobs, first=True)
        return named.report_missing(missing)
    if not args.watch:
        render(client.list(states=states, tenant=args.tenant, limit=args.limit or None), first=True)
        return 0
    if len(args.ids) == 1:
        return waiting.watch_one(client, args.ids[0], render)
    if args.ids:
        raise CliUsageError("--watch takes one job id, or none (the list)")
    return waiting.watch_list(client, states, args.tenant, render)


def cmd_get_nodes(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    def fetch() -> tuple[list[controller_pb2.Node], list[RpcError]]:
        nodes = client.nodes()
        return named.fetch_named(args.ids, named.lookup(nodes, "node")) if args.ids else (nodes, [])

    def key(nodes: list[controller_pb2.Node]) -> list[bytes]:
        # A heartbeat alone is no change worth printing.
        stripped = []
        for n in nodes:
            c = controller_pb2.Node()
            c.CopyFrom(n)
            c.last_heartbeat = 0
            stripped.append(c.SerializeToString(deterministic=True))
        return stripped

    render = terminal.renderer(out, args.output, output.nodes_json, output.nodes_table, "nodes")
    if not args.watch:
        nodes, missing = fetch()
        if nodes or not args.ids:  # none of the names found: the error lines say it all
            render(nodes, first=True)
        return named.report_missing(missing)
    if args.ids:  # the names not found are said once; the watch goes on with the others
        nodes, missing = fetch()
        if named.report_missing(missing) and not nodes:
            return 1
    return terminal.poll(lambda: fetch()[0], render, key=key)


def cmd_get_tenants(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    resp = client.tenants()
    if args.output == "json":
        terminal.println(out, output.dumps(tenants_json(resp)))
        return 0
    if not resp.tenants:
        print("No tenants found.", file=sys.stderr)
    text = tenants_table(resp)
    if text:
        terminal.println(out, text)
    return 0


def cmd_describe_job(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    job = client.get(args.id, with_events=True)
    if args.output == "json":
        terminal.println(out, output.dumps(output.to_dict(job)))
    else:
        terminal.println(out, output.describe_job(job, time.time()))
    return 0


def cmd_describe_node(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    node = client.node(args.id)
    if args.output == "json":
        terminal.println(out, output.dumps(output.to_dict(node)))
        return 0
    active = [s for s in common_pb2.JobState.values() if s and s not in TERMINAL_STATES]
    jobs = client.list(states=active)
    terminal.println(out, output.describe_node(node, time.time(), jobs))
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    job = client.cancel(args.id, request_id=args.request_id)
    _print_job(out, args.output, job, client)
    # The controller returns an ended job as it is: a cancel makes a job CANCELLED at once, so any
    # other end was there before it. Still exit 0: what was asked (the job no longer runs) holds.
    if job.state in (common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED):
        print(f"tessctl: job {output.safe(job.id)} had already ended ({output.job_state(job.state)}): "
              "not cancelled", file=sys.stderr)
    return 0


# The controller did what was asked (it places nothing more there, or again) but the node's agent did
# not confirm: distinct from 1 (nothing done) so scripts can tell the two apart.
EXIT_UNCONFIRMED = 3


def _unconfirmed(node: controller_pb2.Node, what: str) -> int:
    if not node.agent_unconfirmed:
        return 0
    print(f"tessctl: warning: node {node.id} {what} in the controller, but not confirmed by its agent: "
          f"{output.one_line(node.agent_unconfirmed)}", file=sys.stderr)  # the agent's own words
    return EXIT_UNCONFIRMED


def cmd_drain(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    node = client.drain(args.node, reason=args.reason, request_id=args.request_id)
    _print_node(out, args.output, node)
    return _unconfirmed(node, "drained")


def cmd_undrain(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    node = client.undrain(args.node, request_id=args.request_id)
    _print_node(out, args.output, node)
    return _unconfirmed(node, "undrained")


def cmd_delete_node(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    removed = client.remove_node(args.node, force=args.force, request_id=args.request_id)
    if args.output == "json":
        terminal.println(out, output.dumps({"node_id": args.node, "removed": removed}))
    else:
        terminal.println(out, f"node/{output.safe(args.node)} removed")
    return 0


def cmd_simulate(client: Client | None, args: argparse.Namespace, out: TextIO) -> int:
    """`tessctl simulate ARGS`: tessera-sim ARGS in a child process, with its output and exit status.

    A process, not an import: the clients never import the controller's packages (the simulator
    brings every policy with it), and the simulator parses and checks its own arguments.
    """
    code = f"import sys; from {SIMULATOR} import main; sys.exit(main(sys.argv[1:], prog='tessctl simulate'))"
    proc = subprocess.run([sys.executable, "-c", code, *args.sim_args], check=False,
                          stdout=terminal.fd_or_pipe(out), stderr=terminal.fd_or_pipe(sys.stderr))
    for stream, data in ((out, proc.stdout), (sys.stderr, proc.stderr)):
        if data:  # the child wrote into a pipe: `stream` has no file descriptor of its own
            stream.write(data.decode(errors="replace"))
            stream.flush()
    return proc.returncode


def cmd_whoami(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    me = client.whoami()
    if args.output == "json":
        terminal.println(out, output.dumps(output.to_dict(me)))
    else:
        terminal.println(out, output.table(("PRINCIPAL", "TENANT", "ROLE"), [(me.principal, me.tenant or "-", me.role)]))
    return 0


# -- helpers ----------------------------------------------------------------------------------------


def _print_job(out: TextIO, fmt: str, job: controller_pb2.Job, client: Client | None = None) -> int:
    if fmt == "json":
        terminal.println(out, output.dumps(output.to_dict(job)))
    else:
        models = _gpu_models(client, [job]) if client else None
        terminal.println(out, output.jobs_table([job], time.time(), wide=fmt == "wide", models=models))
    return 0


def _gpu_models(client: Client, jobs: Sequence[controller_pb2.Job]) -> output.GpuModels | None:
    """GPU models of the nodes the jobs are placed on, for the GPUS column; None if unavailable."""
    if not any(j.placement.slices for j in jobs):
        return None
    try:
        return output.gpu_models(client.nodes())
    except RpcError:
        return None  # the plan's GPU model is shown instead


def _print_node(out: TextIO, fmt: str, node: controller_pb2.Node) -> int:
    if fmt == "json":
        terminal.println(out, output.dumps(output.to_dict(node)))
    else:
        terminal.println(out, output.nodes_table([node], time.time(), wide=fmt == "wide"))
    return 0


def _one_line(text: str) -> str:
    """An error message on one line; what the controller sent back (a field it echoes) made safe."""
    return output.one_line(str(text))


def _unreachable_message(exc: ControllerUnreachable, insecure: bool = False) -> str:
    if any(w in exc.message.lower() for w in ("handshake", "certificate", "ssl")):
        return (f"cannot reach controller at {exc.target} (TLS handshake failed: is --ca, or $TESSERA_CA, the CA "
                "that signed its certificate, and does it name this host? --insecure for a plaintext controller)")
    cause = exc.message.rsplit(":", 1)[-1].strip(" []")
    message = f"cannot reach controller at {exc.target}" + (f" ({cause})" if cause else "")
    if insecure and cause.lower() in ("socket closed", "connection reset by peer"):
        # A TLS server closes a plaintext connection; gRPC says no more than that.
        message += "; with --insecure tessctl speaks plaintext: a TLS controller closes the connection (drop --insecure)"
    return message


def _estimator_unreachable_message(exc: EstimatorUnreachable, args: argparse.Namespace) -> str:
    """Without --tls-dir tessctl presents no certificate, and a TLS estimator (which requires one)
    closes the connection: gRPC says only "Socket closed" (or, without --ca, that the estimator's
    certificate could not be verified), so say what is missing."""
    message = f"cannot reach estimator at {exc.target} ({exc.message})"
    if not getattr(args, "tls_dir", None) and not getattr(args, "insecure", False):
        message += "; a TLS estimator needs --tls-dir DIR (a certificate of its CA), an --insecure one --insecure"
    return message


def _retry_hint(exc: RpcError) -> str:
    """A submit that timed out may have been stored: the same request id finds it, a new one
    would make a second job. A call the controller does not know: an older controller."""
    if exc.request_id and exc.code in RETRY_SUBMIT:
        return f" (the job may have been stored: retry with --request-id {exc.request_id})"
    if exc.code == "UNIMPLEMENTED":  # gRPC's bare "Method not found!" (an upgrade audit)
        return " (the controller does not serve this call: it is older than this tessctl; `tessctl version` shows both)"
    return ""


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run tessctl with `argv` (default sys.argv[1:]); returns the exit status."""
    out = out or sys.stdout
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "simulate":
        args.sim_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    given = getattr(args, "output", None)  # before the default: an -o given
    args.output = getattr(args, "output", "table")
    out, args.output = formats.wrap(out, args.output)
    # For wait, --timeout is how long to wait (tessera.clients.waiting); its calls keep the default.
    timeout = getattr(args, "timeout", 10.0) if args.command != "wait" else 10.0
    client: Client | None = None
    try:
        _refuse_other_forms(args, given)
        argtypes.strip_kind_prefixes(args)
        if args.command == "simulate":  # runs here, needs no controller
            return cmd_simulate(None, args, out)
        if args.command in ("estimate", "config", "admin"):  # local files or the estimator: no controller
            return int(args.func(None, args, out))
        if getattr(args, "local", False):  # files only (tessctl admin pki ...)
            return int(args.func(None, args, out))
        client = connect(ctlconfig.settings(args), timeout, insecure=getattr(args, "insecure", False))
        return int(args.func(client, args, out))
    except EstimatorUnreachable as exc:
        return _fail(_estimator_unreachable_message(exc, args))
    except ControllerUnreachable as exc:
        return _fail(_unreachable_message(exc, getattr(args, "insecure", False)))
    except RpcError as exc:
        return _fail(str(exc) + _retry_hint(exc))
    except InputFileError as exc:  # a job, cluster or inventory file: the message names file, line and field
        return _fail(str(exc))
    except CliUsageError as exc:
        print(f"tessctl: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except TesseraError as exc:  # any other error raised on purpose says what is wrong in its message
        return _fail(str(exc))
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # e.g. `tessctl logs ID | head`
            _silence_stdout()
            # The reader took what it wanted: a success, as for output small enough to fit the pipe;
            # not where the exit status is the job's end, which was not seen.
            return 1 if _reports_job_end(args) else 0
        where = f" {exc.filename}" if exc.filename else ""
        return _fail(f"cannot read{where}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a CLI prints one line, never a traceback
        if os.environ.get("TESSCTL_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc}")
    finally:
        if client is not None:
            with contextlib.suppress(Exception):  # closing must not mask the result
                client.close()


def _refuse_other_forms(args: argparse.Namespace, given: str | None) -> None:
    """A command whose output has one form (`one_form`: a shell script, the simulator's table) refuses
    any other -o (exit 2, saying why), rather than printing text where a script waits for JSON."""
    why = getattr(args, "one_form", None)
    shown = None if given in (None, "table") else f"-o {given}"
    # `tessctl simulate ARGS`: an -o after `simulate` is among the simulator's arguments.
    sim = list(getattr(args, "sim_args", ()))
    at = next((i for i, a in enumerate(sim) if a.startswith(("-o", "--output"))), None)
    if shown is None and at is not None:
        shown = " ".join(sim[at:at + 2]) if sim[at] in ("-o", "--output") else sim[at]
    if why is not None and shown is not None:
        raise CliUsageError(f"argument -o/--output: {shown}: {why}")


def connect(settings: Settings, timeout: float, insecure: bool = False) -> Client:
    """The client of this command line's controller(s), calling with its token: with several (a
    context's list, or a comma-separated --controller), the SDK follows the leader (docs/ha.md).
    The CA (settings.ca: flag, $TESSERA_CA, the context's) verifies the controller; `insecure`:
    plaintext, for a controller started with --insecure.
    """
    return Client(settings.controllers, timeout, token=settings.token, ca=settings.ca, insecure=insecure)


def _fail(message: str) -> int:
    print(f"tessctl: error: {_one_line(message)}", file=sys.stderr)
    return 1


def _reports_job_end(args: argparse.Namespace) -> bool:
    """Whether the command's exit status is its job's end (wait, submit --wait, get jobs ID --watch)."""
    if args.command == "submit":
        return bool(args.wait)
    if getattr(args, "func", None) is cmd_get_jobs:
        return bool(args.watch) and len(args.ids) == 1
    return bool(args.command == "wait")


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
