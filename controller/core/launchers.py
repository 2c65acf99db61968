"""Launchers as data: how a job's workers are started, as argv templates with the plan substituted.

A job names a built-in template or brings its own (`JobSpec.launcher`). Templates are expanded by
the controller per node; the agent only replaces `{python}` (its own interpreter). See
docs/launchers.md.
"""

from __future__ import annotations

import base64
import json
import re
import string
from dataclasses import dataclass

from tessera.v1 import common_pb2

PYTHON = "{python}"
ENTRYPOINT = "{entrypoint}"
FIELDS = ("nnodes", "node_rank", "nproc_per_node", "master_addr", "master_port", "world_size", "dp", "tp",
          "pp", "micro_batch", "grad_accum", "global_batch_size", "iterations", "checkpoint_dir", "world_info")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


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
    """Problems of a launcher field as (field, reason)."""
    errs: list[tuple[str, str]] = []
    if launcher.name and launcher.argv:
        errs.append(("launcher", "give a built-in name or an argv template, not both"))
    elif launcher.name and launcher.name not in BUILTIN:
        errs.append(("launcher.name", f"unknown launcher {launcher.name!r}; built-in: {', '.join(sorted(BUILTIN))}"))
    for field, argv in (("launcher.argv", launcher.argv), ("launcher.head_argv", launcher.head_argv)):
        for i, arg in enumerate(argv):
            for name in _PLACEHOLDER.findall(arg):
                if name not in FIELDS and f"{{{name}}}" not in (PYTHON, ENTRYPOINT):
                    errs.append((f"{field}[{i}]", (f"unknown placeholder {{{name}}}; known: "
                                                  f"{{python}}, {{entrypoint}}, {', '.join('{' + f + '}' for f in FIELDS)}")))
            if "{entrypoint}" in arg and arg != ENTRYPOINT:
                errs.append((f"{field}[{i}]", "{entrypoint} must be an argument of its own"))
    if launcher.head_argv and not launcher.per_node:
        errs.append(("launcher.head_argv", "only for per-node launchers"))
    return errs


def world_info(nodes: list[tuple[str, list[int]]]) -> str:
    return base64.urlsafe_b64encode(json.dumps(dict(nodes)).encode()).decode()


def expand(tpl: Template, entrypoint: list[str], values: dict[str, object], head: bool) -> list[str]:
    """The argv of one process: {entrypoint} spliced in, every field substituted, {python} kept."""
    argv = tpl.head_argv if head and tpl.head_argv else tpl.argv
    formatter = string.Formatter()
    out: list[str] = []
    for arg in argv:
        if arg == ENTRYPOINT:
            out.extend(entrypoint)
        elif arg == PYTHON:
            out.append(arg)
        else:
            out.append(formatter.vformat(arg, (), _Keep(values)))
    return out


class _Keep(dict):  # type: ignore[type-arg]
    """Leaves {python} as is for the agent."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"
