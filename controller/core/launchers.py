"""Launchers as data: how a job's workers are started, as argv templates with the plan substituted.

A job names a built-in template or brings its own (`JobSpec.launcher`). Templates and the job's
entrypoint are expanded by the controller per node; the agent only replaces `{python}` (its own
interpreter). See docs/launchers.md.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass

from tessera.common import jobspec
from tessera.v1 import common_pb2

# The placeholders and built-in names are shared with the job-file parser (tessera.common.jobspec).
PYTHON = jobspec.PYTHON
ENTRYPOINT = jobspec.ENTRYPOINT
FIELDS = jobspec.LAUNCHER_FIELDS


# The reference trainer's module (tessera.clients.trainer.reference.ENTRYPOINT_MODULE): a name, not an
# import, since the controller never imports the clients.
REFERENCE_TRAINER = "tessera.clients.trainer.reference"
DEFAULT_ENTRYPOINT = (PYTHON, "-m", REFERENCE_TRAINER)


@dataclass(frozen=True)
class Template:
    argv: tuple[str, ...]
    per_node: bool = False
    head_argv: tuple[str, ...] = ()
    # What {entrypoint} becomes when the job gives none: the reference trainer, as this launcher
    # wants a program named.
    default_entrypoint: tuple[str, ...] = DEFAULT_ENTRYPOINT


BUILTIN: dict[str, Template] = {
    # One process per rank running the entrypoint; the agent sets RANK, WORLD_SIZE, MASTER_* (default).
    "direct": Template((ENTRYPOINT,)),
    # torch's elastic launcher, one per node, static rendezvous on rank 0's node.
    "torchrun": Template((PYTHON, "-m", "torch.distributed.run", "--nnodes={nnodes}", "--node-rank={node_rank}",
                          "--nproc-per-node={nproc_per_node}", "--master-addr={master_addr}",
                          "--master-port={master_port}", ENTRYPOINT), per_node=True,
                         default_entrypoint=("-m", REFERENCE_TRAINER)),
    # DeepSpeed's per-node launcher (what its runner starts on each host), given the world as
    # base64 JSON {node: [gpu indices]}: no ssh/pdsh between nodes.
    "deepspeed": Template((PYTHON, "-m", "deepspeed.launcher.launch", "--world_info={world_info}",
                           "--node_rank={node_rank}", "--master_addr={master_addr}",
                           "--master_port={master_port}", ENTRYPOINT), per_node=True,
                          default_entrypoint=("--module", REFERENCE_TRAINER)),
}


def template_of(launcher: common_pb2.Launcher) -> Template:
    """The template a job's launcher field selects (unset = "direct")."""
    if launcher.argv:
        return Template(tuple(launcher.argv), launcher.per_node, tuple(launcher.head_argv))
    return BUILTIN[launcher.name or "direct"]


def check(launcher: common_pb2.Launcher) -> list[tuple[str, str]]:
    """Problems of a launcher field as (field, reason) (tessera.common.jobspec.launcher_errors)."""
    return jobspec.launcher_errors(launcher)


def world_info(nodes: list[tuple[str, list[int]]]) -> str:
    return base64.urlsafe_b64encode(json.dumps(dict(nodes)).encode()).decode()


# Linux's limit on one argument (MAX_ARG_STRLEN, 32 pages), and a bound on the whole argv well
# under the usual ARG_MAX (2 MiB with the environment): past them exec fails on every node.
MAX_ARG_BYTES = 128 * 1024 - 1
MAX_ARGV_BYTES = 1024 * 1024


class LaunchTooLarge(ValueError):
    """A template that expands past what exec takes (many {world_info} of a large placement)."""


def expand(tpl: Template, entrypoint: list[str], values: dict[str, object], head: bool) -> list[str]:
    """The argv of one process: {entrypoint} spliced in, each `{field}` of FIELDS replaced by its
    value, in the template and in the entrypoint alike, and nothing else: other braces are literal
    (`--config={"lr": 1}`, an entrypoint's `{epoch}`), and so is {python} inside a longer argument
    (the agent replaces every argument that is exactly {python}). Templates are the user's: no
    format mini-language (`{dp:>9999999}`, `{dp.__class__}`) is evaluated. LaunchTooLarge past
    exec's limits, entrypoint included."""
    argv = tpl.head_argv if head and tpl.head_argv else tpl.argv
    out: list[str] = []
    for arg in argv:
        if arg == ENTRYPOINT:
            # An opaque script learns where its checkpoints outlive the attempt only from its argv
            # ({checkpoint_dir}): left literal, each attempt saved under its own folder and resumed nothing.
            out.extend(_substitute(a, values) for a in entrypoint)
        elif arg == PYTHON:
            out.append(arg)
        else:
            out.append(_substitute(arg, values))
    total = sum(len(a.encode()) + 1 for a in out)
    longest = max((len(a.encode()) for a in out), default=0)
    if longest > MAX_ARG_BYTES or total > MAX_ARGV_BYTES:
        raise LaunchTooLarge(f"the launcher's argv expands to {total:,} bytes, its longest argument {longest:,}: "
                             f"over what exec takes ({MAX_ARG_BYTES + 1:,} an argument, {MAX_ARGV_BYTES:,} in all)")
    return out


def _substitute(arg: str, values: dict[str, object]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        return str(values[name]) if name in values else m.group(0)
    return jobspec.PLACEHOLDER.sub(one, arg)
