"""The help and parsing habits every Tessera command line shares (docs/cli.md): no abbreviated
flags (`--stat` must not run as `--state`), and each option's default shown in --help.

    p = argparse.ArgumentParser(prog="tessera-controller", **clihelp.PARSER)
"""

from __future__ import annotations

import argparse
from typing import Any


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help, as ArgumentDefaultsHelpFormatter does, except
    where the help already says its default or there is none worth saying (None, "", False, [])."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text.lower() or default is argparse.SUPPRESS
                or default in (None, "", False) or default == []):
            return text
        return f"{text} (default: %(default)s)"


# The keyword arguments of every daemon's parser.
PARSER: dict[str, Any] = {"allow_abbrev": False, "formatter_class": DefaultsHelpFormatter}
