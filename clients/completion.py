"""`tessctl completion bash|zsh`: a shell completion script for every command and flag, as
`kubectl completion` prints one (docs/cli.md).

shtab writes a static script from tessctl's argparse tree, so a TAB costs the shell nothing: no
Python starts (argcomplete would start tessctl, grpc included, on every TAB). Job and node ids are
not completed: that would need a call to the controller.

    source <(tessctl completion bash)              # this shell
    tessctl completion bash > /etc/bash_completion.d/tessctl
    tessctl completion zsh > "${fpath[1]}/_tessctl"
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from tessera.clients import terminal

SHELLS = ("bash", "zsh")
HELP = "print a shell completion script (bash or zsh): source <(tessctl completion bash)"


def add_arguments(sub: Any, command: Any, root: argparse.ArgumentParser) -> None:
    p = command(sub, "completion", cmd_completion, HELP)
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    # Shell text by nature: JSON or YAML of it would be of use to nobody, so -o is refused (tessctl.py).
    p.set_defaults(local=True, completion_root=root,
                   one_form="`tessctl completion` prints a shell script to source, which has no other form")


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    import shtab  # only this command needs it

    return str(shtab.complete(parser, shell=shell))


def cmd_completion(client: Any, args: argparse.Namespace, out: TextIO) -> int:
    terminal.println(out, script(args.completion_root, args.shell).rstrip("\n"))
    return 0
