"""Which environment variables a job may set for its workers: loader and interpreter hooks are refused.

One list, used by the controller's SubmitJob validation (controller/core/validate.py), by the job-file
parser (clients/jobfile.py) and again by the agent on every Launch (defence in depth: a Launch that
did not come through SubmitJob meets the same rule). An operator may allow a refused name with
`--allow-env NAME` on the controller and on the agent (docs/job-file.md, docs/agent.md).

A job's own program runs with the job's uid anyway, so these names give it nothing it lacks; they are
refused because they change what *other* programs do when they start: a launcher (torchrun, a shell
wrapper), a helper the agent or the keeper runs, a setuid program, or anything started with a copied
environment. They are the variables the sources below document as "load this code" or "run this at
start-up":

- glibc's dynamic loader, ld.so(8): every LD_* variable (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...);
  glibc drops the same names, and the ones of `sysdeps/generic/unsecvars.h`, for setuid programs
  (GCONV_PATH, GETCONF_DIR, GLIBC_TUNABLES, HOSTALIASES, LOCALDOMAIN, LOCPATH, MALLOC_TRACE,
  NIS_PATH, NLSPATH, RESOLV_HOST_CONF, RES_OPTIONS, TZDIR).
- CPython, python(1) "Environment variables": PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHONINSPECT,
  PYTHONUSERBASE, PYTHONEXECUTABLE, PYTHONPLATLIBDIR, PYTHONBREAKPOINT (imports a callable).
- Shells, bash(1) INVOCATION and dash(1): BASH_ENV, ENV (a file sourced at start), SHELLOPTS,
  BASHOPTS, PS4 (expanded under xtrace), PROMPT_COMMAND, IFS.
- Other runtimes: perlrun(1) PERL5LIB, PERLLIB, PERL5OPT, PERL5DB; ruby(1) RUBYLIB, RUBYOPT;
  node(1) NODE_OPTIONS, NODE_PATH; the JVM's JAVA_TOOL_OPTIONS, _JAVA_OPTIONS, JDK_JAVA_OPTIONS.

Ordinary knobs (PATH, PYTHONUNBUFFERED, PYTHONWARNINGS, OMP_*, NCCL_*, CUDA_*) are the job's to set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# What a variable name may look like anywhere in Tessera (job files, SubmitJob, Launch, --allow-env).
NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
REFUSED_PREFIXES: tuple[str, ...] = ("LD_",)

REFUSED: dict[str, str] = {
    **dict.fromkeys(
        (
            "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
            "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR",
        ),
        "a C library hook (glibc ignores it in setuid programs)",
    ),
    **dict.fromkeys(
        (
            "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUSERBASE",
            "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR", "PYTHONBREAKPOINT",
        ),
        "a Python interpreter hook (python(1))",
    ),
    **dict.fromkeys(
        ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS"),
        "a shell start-up hook (bash(1))",
    ),
    **dict.fromkeys(
        (
            "PERL5LIB", "PERLLIB", "PERL5OPT", "PERL5DB", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS", "NODE_PATH",
            "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
        ),
        "an interpreter start-up hook",
    ),
}


def refusal(name: str, allowed: Iterable[str] = ()) -> str | None:
    """Why a job may not set `name` (None when it may): the reason names the flag that allows it."""
    if name in allowed:
        return None
    why = REFUSED.get(name)
    if why is None and name.startswith(REFUSED_PREFIXES):
        why = "a dynamic-loader hook (ld.so(8))"
    if why is None:
        return None
    return f"refused: {why}; an operator may allow it with --allow-env {name}"


def refused_names(env: Mapping[str, str] | Iterable[str], allowed: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(field, reason) for every refused name, in sorted order; field is `env.NAME`."""
    allow = frozenset(allowed)
    out = []
    for name in sorted(env):
        why = refusal(name, allow)
        if why is not None:
            out.append((f"env.{name}", why))
    return out
