"""tessctl's `-o` formats beside table, wide and json, in kubectl's habits (docs/cli.md):

- `yaml`: the JSON document as YAML (one document per snapshot, `---` between them when watching);
- `name`: `job/ID` or `node/ID`, one per line;
- `jsonpath=TEMPLATE`: kubectl's JSONPath subset: `{.jobs[*].id}`, `{.state}`, `{.jobs[0].spec.name}`,
  text around the braces and quoted literals (`{"\\t"}`), `\\n` and `\\t` in them; several values
  are joined by a space. A template without braces is taken as one expression
  (`jsonpath=.jobs[*].id`).

Every command of tessctl writes its structured output as JSON documents through one `println`
each; `StructuredOut` stands between the command and stdout and rewrites each document into the
format asked for, so every command that has `-o json` has these too, watches included.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from typing import Any, TextIO, cast

import yaml

from tessera.clients.argtypes import UsageError
from tessera.common.errors import InvalidInput

BASIC = ("table", "wide", "json")
STRUCTURED = ("yaml", "name")
JSONPATH = "jsonpath="
CHOICES = "table, wide, json, yaml, name, jsonpath=TEMPLATE"


class FormatError(InvalidInput):
    """A document this format cannot show (`-o name` of a whoami), or a JSONPath that selects nothing."""


class NoNames(FormatError, UsageError):
    """`-o name` for a command whose output names no job or node: a bad option value, so a usage
    error (exit 2, docs/cli.md), as `completion` and `simulate` refuse an -o; a JSONPath that
    selects nothing in what came back stays exit 1."""


def output_format(text: str) -> str:
    """argparse type of -o: one of CHOICES; a jsonpath template is checked here."""
    if text in BASIC or text in STRUCTURED:
        return text
    if text.startswith(JSONPATH):
        try:
            parse_template(text[len(JSONPATH):])
        except FormatError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    raise argparse.ArgumentTypeError(f"invalid output format {text!r} (choose from {CHOICES})")


def wrap(out: TextIO, fmt: str) -> tuple[TextIO, str]:
    """(the stream a command writes to, the format the command is told): the structured formats
    run the command as `json` behind a StructuredOut."""
    if fmt in STRUCTURED or fmt.startswith(JSONPATH):
        return cast(TextIO, StructuredOut(out, fmt)), "json"
    return out, fmt


class StructuredOut:
    """A text stream that rewrites each JSON document written to it (one `write` each) into `fmt`;
    what is not JSON (a message) passes unchanged. Everything else is the wrapped stream's."""

    def __init__(self, out: TextIO, fmt: str) -> None:
        self._out = out
        self._fmt = fmt
        self._documents = 0

    def write(self, text: str) -> int:
        try:
            value = json.loads(text)
        except ValueError:
            return self._out.write(text)
        self._documents += 1
        return self._out.write(render(value, self._fmt, first=self._documents == 1))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._out, attr)


def render(value: Any, fmt: str, first: bool = True) -> str:
    """One JSON value in `fmt` (yaml, name, jsonpath=...), ending in a newline unless empty."""
    if fmt == "yaml":
        text = yaml.safe_dump(value, sort_keys=False, allow_unicode=True, default_flow_style=False)
        return text if first else "---\n" + text
    if fmt == "name":
        names = list(_names(value))
        return "".join(n + "\n" for n in names)
    if fmt.startswith(JSONPATH):
        text = jsonpath(value, fmt[len(JSONPATH):])
        return text + "\n" if text and not text.endswith("\n") else text
    raise FormatError(f"unknown output format {fmt!r}")


def _names(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, kind in (("jobs", "job"), ("nodes", "node")):
            if isinstance(value.get(key), list):
                yield from (f"{kind}/{item.get('id', '')}" for item in value[key])
                return
        if "id" in value and "spec" in value:
            yield f"job/{value['id']}"
            return
        if "id" in value and "inventory" in value:
            yield f"node/{value['id']}"
            return
        if "node_id" in value and "removed" in value:
            yield f"node/{value['node_id']}"
            return
    raise NoNames("-o name: this command's output names no job or node (use -o json or yaml)")


# -- JSONPath ---------------------------------------------------------------------------------------

# A field may hold a hyphen, as kubectl's do: `{.current-context}` of `config get-contexts`.
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[(\*|-?\d+)\]|\.\*")


def parse_template(template: str) -> list[tuple[bool, str]]:
    """[(is_expression, text)]: the literal text and the {expressions} of a template."""
    template = template.strip()
    if len(template) >= 2 and template[0] == template[-1] and template[0] in "'\"":
        template = template[1:-1]  # quoted for the shell twice
    if "{" not in template:
        template = "{" + template + "}"
    parts: list[tuple[bool, str]] = []
    pos = 0
    while pos < len(template):
        start = template.find("{", pos)
        if start < 0:
            parts.append((False, _unescape(template[pos:])))
            break
        if start > pos:
            parts.append((False, _unescape(template[pos:start])))
        end = template.find("}", start)
        if end < 0:
            raise FormatError(f"jsonpath: unclosed '{{' in {template!r}")
        expr = template[start + 1:end].strip()
        if len(expr) >= 2 and expr[0] == expr[-1] and expr[0] in "'\"":
            parts.append((False, _unescape(expr[1:-1])))  # a literal, as kubectl's {"\t"}
        else:
            _steps(expr)  # refuse a bad expression before any call is made
            parts.append((True, expr))
        pos = end + 1
    return parts


def _unescape(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\t", "\t")


def _steps(expr: str) -> list[str]:
    if expr in ("", ".", "$", "@"):
        return []
    body = expr[1:] if expr[0] in "$@" else expr
    if not body.startswith((".", "[")):
        body = "." + body
    steps: list[str] = []
    pos = 0
    while pos < len(body):
        m = _STEP.match(body, pos)
        if m is None:
            raise FormatError(f"jsonpath: cannot read {expr!r} at {body[pos:]!r} "
                              "(supported: .field, [N], [*], .*)")
        steps.append(m.group(1) if m.group(1) is not None else (m.group(2) or "*"))
        pos = m.end()
    return steps


def _select(values: list[Any], step: str, expr: str) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if step == "*":
            out.extend(v if isinstance(v, list) else v.values() if isinstance(v, dict) else [])
        elif re.fullmatch(r"-?\d+", step):
            if not isinstance(v, list):
                raise FormatError(f"jsonpath: {expr}: [{step}] of a value that is not a list")
            i = int(step)
            if -len(v) <= i < len(v):
                out.append(v[i])
            else:
                raise FormatError(f"jsonpath: {expr}: index {i} out of range ({len(v)} items)")
        elif isinstance(v, dict):
            if step not in v:
                raise FormatError(f"jsonpath: {expr}: no field {step!r} (fields: {', '.join(v) or 'none'})")
            out.append(v[step])
        else:
            raise FormatError(f"jsonpath: {expr}: .{step} of a value that is not an object")
    return out


def _show(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def jsonpath(value: Any, template: str) -> str:
    """The template filled from `value`."""
    out = []
    for is_expr, text in parse_template(template):
        if not is_expr:
            out.append(text)
            continue
        values = [value]
        for step in _steps(text):
            values = _select(values, step, text)
        out.append(" ".join(_show(v) for v in values))
    return "".join(out)
