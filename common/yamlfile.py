"""The one hardened YAML reader of Tessera's input files, and their one error type.

Every file format (job files, declared inventories, `pools:` and `node_groups:` cluster files) is
read here and parsed by its own pure function that raises `InputFileError(field, reason)` naming the
offending field as a dotted path (`pools[1].gpu`). `parse_with_lines` then adds the file and the
line of that field, so every message reads `FILE line N: field F: why`, without each parser having
to carry line numbers around: the reader keeps them on every mapping and sequence it builds.

Input is hostile: besides what SafeLoader refuses (arbitrary tags), the reader refuses duplicate
keys (plain YAML keeps the last one silently), nesting deeper than MAX_DEPTH (the composer recurses,
so a deep document would crash it), documents of more than MAX_NODES values (counted as they are
composed, so a long flow list is refused before it is built), recursive aliases and aliases that
expand past MAX_NODES (a "billion laughs" would be cheap to parse but not to walk or print), NaN
and infinity (no field of these formats wants one, and NaN slips through range checks), control
characters (the same one-line error as bytes that are not UTF-8), and files over MAX_BYTES.
JSON is read as YAML (flow style), so the JSON cluster files get the same checks and line numbers.

Numbers are read as YAML 1.2 and JSON read them, not as PyYAML's YAML 1.1 resolver does: an integer
is decimal digits (base 60 `4:16`, octal, hex, binary and `1_000` are strings); a number
with an exponent and no dot or no exponent sign (`1e6`, `2.5e3`, `1E-4`) is a float, not the string
"1e6" (a YamlFloat, which prints as written; quoted, `"1e6"` stays a string); and a timestamp
without a time zone (`2030-01-01T00:00:00`, `2030-01-01`) is the string as written, not a naive
datetime or date: it names no instant, and the field that wants one says so with the text as the
user wrote it.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import yaml

from tessera.common.errors import InvalidInput
from tessera.common.plainfile import read_plain

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 100_000
MAX_REASON = 500  # characters of a reason kept: `got {value!r}` of a huge value stays one readable line

_T = TypeVar("_T")


class InputFileError(InvalidInput, ValueError):
    """An input file (or a document built in code) that cannot be used.

    `field`: the offending key as a dotted path (`model.hidden_size`, `gpus[0].count`), or "" for a
    problem of the file as a whole (unreadable, not YAML); `file` and `line` are set once known.
    The message is `FILE line N: field F: why`; parts not known are left out, and a document that
    never was a file reads `F: why` as before the files had line numbers.
    """

    def __init__(self, field: str, reason: str, *, file: str = "", line: int | None = None) -> None:
        if len(reason) > MAX_REASON:
            reason = reason[: MAX_REASON - 1] + "…"
        self.field = field
        self.reason = reason
        self.file = file
        self.line = line
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.file + (f" line {self.line}" if self.file and self.line is not None else "")
        if not where:
            return f"{self.field}: {self.reason}" if self.field else self.reason
        return f"{where}: field {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy (pickle, a process pool) rebuilds from (field, reason) and keeps where it was.
        return type(self), (self.field, self.reason), {"file": self.file, "line": self.line}

    def __setstate__(self, state: dict[str, Any] | None) -> None:
        self.__dict__.update(state or {})
        self.message = self._render()

    def at(self, file: str, line: int | None) -> Self:
        """The same error, located (its class kept, so `except JobFileError` still catches it)."""
        return type(self)(self.field, self.reason, file=file, line=line)


class YamlMap(dict[Any, Any]):
    """A mapping as read: `line` of its first key, `key_lines` of every key (1-based)."""

    line: int = 1
    key_lines: dict[Any, int]


class YamlFloat(float):
    """A number YAML 1.1 would have left a string (`1e6`, `2.5e3`): a float that prints as written,
    so a message's `got {value!r}` and an env value (str) show the text the user wrote."""

    text: str

    def __new__(cls, value: float, text: str) -> Self:
        self = super().__new__(cls, value)
        self.text = text
        return self

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (float(self), self.text)


class YamlSeq(list[Any]):
    """A sequence as read: `line` where it starts, `item_lines` of every item (1-based)."""

    line: int = 1
    item_lines: list[int]


def read_yaml(path: str | Path, error: type[InputFileError] = InputFileError) -> Any:
    """Read one YAML (or JSON) document from a file; `error` (with the file, no field) if it cannot be
    read or is not a safe, single document."""
    file = str(path)
    try:
        raw, _ = read_plain(path, MAX_BYTES)
    except OSError as exc:  # a FIFO or device (NotPlainFile) too: it is not read
        raise error("", f"cannot read: {exc.strerror or exc}", file=file) from None
    return load_yaml(raw, file, error)


def load_yaml(text: str | bytes, file: str = "<string>", error: type[InputFileError] = InputFileError) -> Any:
    """Parse one document; mappings come back as YamlMap, sequences as YamlSeq."""
    if len(text) > MAX_BYTES:
        raise error("", f"larger than {MAX_BYTES // (1024 * 1024)} MiB", file=file)
    if isinstance(text, bytes):
        raw = text
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise error("", f"not UTF-8 text (byte {exc.start})", file=file, line=line) from None
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # refuses a control character (ReaderError) here, before any parsing
        node = loader.get_single_node()
        if node is None:
            return None
        _Checker().walk(node)
        loader.paths = _paths(node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = ", ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise error("", f"not valid YAML or JSON: {what}", file=file,
                    line=mark.line + 1 if mark else None) from None
    except yaml.reader.ReaderError as exc:
        raise error("", f"not valid YAML or JSON: {_unacceptable(str(text), exc)}", file=file,
                    line=_line_at(str(text), exc.position)) from None
    except yaml.YAMLError as exc:
        raise error("", f"not valid YAML or JSON: {' '.join(str(exc).split())}", file=file) from None
    except _Refused as exc:
        raise error(exc.field, exc.reason, file=file, line=exc.line) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise error("", f"not valid YAML or JSON: {exc}", file=file) from None
    finally:
        if loader is not None:
            loader.dispose()


def _unacceptable(text: str, exc: yaml.reader.ReaderError) -> str:
    """What ReaderError says, without its `in "<unicode string>", position N` (the line says where)."""
    ch = exc.character
    code = ord(ch) if isinstance(ch, str) and len(ch) == 1 else ch if isinstance(ch, int) else None
    if code is None:
        return " ".join(str(exc).split())
    column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
    kind = "a control character" if code < 0x20 or 0x7F <= code < 0xA0 else "not a printable character"
    return f"character U+{code:04X} at column {column} is not allowed ({kind})"


def _line_at(text: str, position: int) -> int:
    return text.count("\n", 0, max(0, position)) + 1


def refuse_unknown_keys(doc: Mapping[Any, Any], known: Sequence[str], field: str,
                        error: type[InputFileError], note: str = "") -> None:
    """`error` naming the first (sorted) key of `doc` not in `known`, as `field.key` (`key` at the top,
    field ""); the reason lists the known keys, or says `note` instead."""
    extra = sorted(str(k) for k in doc if k not in known)
    if extra:
        raise error(f"{field}.{extra[0]}" if field else extra[0],
                    f"unknown key ({note or 'known: ' + ', '.join(known)})")


def parse_with_lines(doc: Any, file: str, parse: Callable[[Any], _T]) -> _T:
    """`parse(doc)`, its InputFileError located: the file, and the line of the field it names."""
    try:
        return parse(doc)
    except InputFileError as exc:
        if exc.file:
            raise
        raise exc.at(file, line_of(doc, exc.field)) from None


def require_name_keys(doc: Any, path: str, error: type[InputFileError]) -> None:
    """Every key of a {GPU type: ...} mapping a name, or `error` at the key's line: YAML reads `~:`
    as null and `1.5:` as a number, which str() made GPU models 'None' and '1.5'."""
    if not isinstance(doc, YamlMap):
        return
    for key in doc:
        if not isinstance(key, str):
            got = "null" if key is None else repr(key)
            raise error("", f"a GPU type name must be a string, got {got}", file=path, line=doc.key_lines.get(key))


def read_and_parse(path: str | Path, parse: Callable[[Any], _T], error: type[InputFileError]) -> _T:
    """read_yaml, then parse_with_lines: the usual way a command reads a file of one format."""
    return parse_with_lines(read_yaml(path, error), str(path), parse)


_INDEX = re.compile(r"\[(\d+)\]")


def line_of(doc: Any, field: str) -> int | None:
    """The line of the deepest part of `field` present in `doc`: the offending key's own line when
    it is there, its parent's when it is missing; None when the document has no lines."""
    node, rest = doc, field
    line = getattr(doc, "line", None)
    while rest:
        m = _INDEX.match(rest)
        if m and isinstance(node, YamlSeq):
            i = int(m.group(1))
            if i >= len(node):
                break
            line, node, rest = node.item_lines[i], node[i], rest[m.end():]
        elif isinstance(node, YamlMap):
            # The longest key that the path starts with: keys may hold dots themselves.
            keys = [k for k in node if _starts_with_key(rest, str(k))]
            if not keys:
                break
            key = max(keys, key=lambda k: len(str(k)))
            line, node, rest = node.key_lines[key], node[key], rest[len(str(key)):]
        else:
            break
        rest = rest.removeprefix(".")
    return line


def _starts_with_key(path: str, key: str) -> bool:
    return path == key or (path.startswith(key) and path[len(key)] in ".[")


# -- reading ------------------------------------------------------------------------------------------


class _Refused(Exception):
    def __init__(self, field: str, reason: str, line: int) -> None:
        super().__init__(reason)
        self.field, self.reason, self.line = field, reason, line


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader with a depth limit while composing and line-keeping containers."""

    paths: dict[int, str]

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = self._nodes = 0
        self.paths = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1  # counted as they are made: a flow list of 2 million items took 47 s and 1.3 GB
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Refused("", f"nested deeper than {MAX_DEPTH} levels", mark.line + 1)
            if self._nodes > MAX_NODES:
                raise _Refused("", f"more than {MAX_NODES:,} values", self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> Any:
    data = YamlMap()
    data.line = node.start_mark.line + 1
    data.key_lines = {}
    yield data
    path = loader.paths.get(id(node), "")
    explicit = {id(k) for k, _ in node.value}
    loader.flatten_mapping(node)  # `<<` merges come first: an explicit key may override a merged one
    seen: dict[Any, int] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=False)
        line = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError:
            raise _Refused(path, "a mapping key must be a plain value", line) from None
        if id(key_node) in explicit:
            if key in seen:
                raise _Refused(_join(path, key), f"duplicate key (first at line {seen[key]})", line)
            seen[key] = line
        data[key] = loader.construct_object(value_node, deep=False)
        data.key_lines[key] = line


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> Any:
    data = YamlSeq()
    data.line = node.start_mark.line + 1
    data.item_lines = [item.start_mark.line + 1 for item in node.value]
    yield data
    data.extend(loader.construct_object(item, deep=False) for item in node.value)


# YAML 1.2's (and JSON's) floats that YAML 1.1's resolver leaves strings: an exponent without a dot
# or without its sign. Added to _Loader alone (add_implicit_resolver copies the class's table).
_EXP_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$")
_FLOAT_TAG = "tag:yaml.org,2002:float"


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> Any:
    value = loader.construct_yaml_float(node)
    if _EXP_FLOAT.match(node.value) and not _YAML11_FLOAT.match(node.value):
        return YamlFloat(value, node.value)
    return value


def _construct_timestamp(loader: _Loader, node: yaml.ScalarNode) -> Any:
    value = loader.construct_yaml_timestamp(node)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value
    return loader.construct_scalar(node)  # no time zone: the text as written (module docstring)


# Those YAML 1.1 reads as floats already (a dot, a signed exponent): plain floats, as before.
_YAML11_FLOAT = re.compile(r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)[eE][-+][0-9]+$")
_Loader.add_implicit_resolver(_FLOAT_TAG, _EXP_FLOAT, list("-+0123456789."))
_Loader.add_constructor(_FLOAT_TAG, _construct_float)

# Numbers as YAML 1.2 and JSON read them: an integer is decimal digits, a float has a dot or an
# exponent (or is .inf or .nan, which the checker refuses). YAML 1.1's base 60 (`4:16` was 256,
# `1:30.5` 90.5), octal (`0755` was 493), binary, hex and `1_000` are strings, which a field wanting
# a number refuses.
_INT_TAG = "tag:yaml.org,2002:int"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in _Loader.yaml_implicit_resolvers.items()}
_DECIMAL = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                    r"|\.(?:nan|NaN|NAN))$")
for _first in "-+0123456789.":
    _Loader.yaml_implicit_resolvers.setdefault(_first, [])[:0] = [(_INT_TAG, _DECIMAL), (_FLOAT_TAG, _FLOAT)]
_Loader.add_constructor(_INT_TAG, lambda loader, node: int(loader.construct_scalar(node), 10))
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


class _Checker:
    """One walk over the composed nodes, aliases expanded: counts them, finds cycles and NaN/inf."""

    def __init__(self) -> None:
        self.count = 0
        self.on_path: set[int] = set()

    def walk(self, node: yaml.Node, path: str = "", depth: int = 1) -> None:
        self.count += 1
        line = node.start_mark.line + 1
        if self.count > MAX_NODES:
            raise _Refused(path, f"more than {MAX_NODES:,} values once aliases are expanded", line)
        if depth > MAX_DEPTH:  # aliases can nest what the composer saw as shallow
            raise _Refused(path, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded", line)
        if isinstance(node, yaml.ScalarNode):
            if node.tag == "tag:yaml.org,2002:float" and not math.isfinite(_float(node.value)):
                raise _Refused(path, f"must be a finite number, got {node.value!r}", line)
            return
        if id(node) in self.on_path:
            raise _Refused(path, "an alias refers to a node that contains it", line)
        self.on_path.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.walk(item, f"{path}[{i}]", depth + 1)
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                self.walk(key_node, path, depth + 1)
                self.walk(value_node, _join(path, key), depth + 1)
        self.on_path.discard(id(node))


def _float(text: str) -> float:
    t = text.lower().replace("_", "")
    if t == ".nan":
        return math.nan
    if t.lstrip("+-") == ".inf":
        return math.inf
    try:
        return float(t)  # 1.0e+999 is infinity too
    except ValueError:
        return 0.0  # a sexagesimal 1:30.5: finite


def _paths(root: yaml.Node) -> dict[int, str]:
    """The dotted path of every container node (the first one, for a node reached through aliases)."""
    out: dict[int, str] = {}
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in out or isinstance(node, yaml.ScalarNode):
            continue
        out[id(node)] = path
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            stack.extend((v, _join(path, k.value if isinstance(k, yaml.ScalarNode) else "?")) for k, v in node.value)
    return out
