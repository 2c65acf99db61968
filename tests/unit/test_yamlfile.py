"""The shared hardened YAML reader (tessera.common.yamlfile): lines kept, hostile input refused with
`FILE line N: field F: why`, never a crash."""

from __future__ import annotations

import datetime as dt
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from tessera.common.yamlfile import (
    InputFileError,
    YamlFloat,
    YamlMap,
    YamlSeq,
    line_of,
    load_yaml,
    parse_with_lines,
    read_yaml,
)

DOC = """\
name: x
model:
  hidden_size: 64
  a.b: dotted
items:
  - first
  - {k: v}
"""


def test_containers_keep_their_lines() -> None:
    doc = load_yaml(DOC, "f.yaml")
    assert doc == {"name": "x", "model": {"hidden_size": 64, "a.b": "dotted"}, "items": ["first", {"k": "v"}]}
    assert isinstance(doc, YamlMap) and isinstance(doc["items"], YamlSeq)
    assert doc.key_lines == {"name": 1, "model": 2, "items": 5}
    assert doc["items"].item_lines == [6, 7]


@pytest.mark.parametrize(
    ("field", "line"),
    [("name", 1), ("model.hidden_size", 3), ("model.a.b", 4), ("model.missing", 2), ("items[1].k", 7),
     ("items[1].gone", 7), ("items[9]", 5), ("job", 1), ("", 1)],
)
def test_line_of_a_field(field: str, line: int) -> None:
    assert line_of(load_yaml(DOC), field) == line


def test_line_of_a_document_built_in_code_is_unknown() -> None:
    assert line_of({"a": {"b": 1}}, "a.b") is None


def test_errors_are_located_once() -> None:
    def parse(doc: Any) -> None:
        raise InputFileError("model.hidden_size", "must be >= 1, got 0")

    with pytest.raises(InputFileError) as err:
        parse_with_lines(load_yaml(DOC, "f.yaml"), "f.yaml", parse)
    assert str(err.value) == "f.yaml line 3: field model.hidden_size: must be >= 1, got 0"
    assert str(InputFileError("a", "why")) == "a: why"
    assert str(InputFileError("", "cannot read: gone", file="f.yaml")) == "f.yaml: cannot read: gone"
    assert len(InputFileError("a", "x" * 10_000).reason) == 500
    copied = pickle.loads(pickle.dumps(err.value))
    assert (type(copied), str(copied), copied.line) == (InputFileError, str(err.value), 3)


def test_merge_keys_may_be_overridden_but_keys_not_repeated() -> None:
    doc = load_yaml("base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  x: 3\n")
    assert doc["m"] == {"x": 3, "y": 2}
    with pytest.raises(InputFileError) as err:
        load_yaml("m:\n  x: 1\n  y: 2\n  x: 3\n", "f.yaml")
    assert str(err.value) == "f.yaml line 4: field m.x: duplicate key (first at line 2)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [1, -.Inf]\n", "f line 1: field a[1]: must be a finite number, got '-.Inf'"),
        ("a:\n  b: .NaN\n", "f line 2: field a.b: must be a finite number, got '.NaN'"),
        ("a: 1.0e+999\n", "f line 1: field a: must be a finite number, got '1.0e+999'"),
        ("a: " + "1" * 5000, ("f: not valid YAML or JSON: Exceeds the limit (4300 digits) for integer string "
                             "conversion: value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit")),
        ("[" * 65 + "]" * 65, "f line 1: nested deeper than 64 levels"),
        ("a: &x {b: *x}\n", "f line 1: field a.b: an alias refers to a node that contains it"),
        ("? [1]\n: 2\n", "f line 1: a mapping key must be a plain value"),
        ("a: [\n", ("f line 2: not valid YAML or JSON: while parsing a flow node, expected the node content, "
                   "but found '<stream end>'")),
        ("a: 1\n---\nb: 2\n", ("f line 2: not valid YAML or JSON: expected a single document in the stream, "
                              "but found another document")),
        ("a: !!python/name:os.system x\n", ("f line 1: not valid YAML or JSON: could not determine a constructor "
                                            "for the tag 'tag:yaml.org,2002:python/name:os.system'")),
        ("name: x\x03\n", ("f line 1: not valid YAML or JSON: character U+0003 at column 8 is not allowed "
                          "(a control character)")),
        ("a: 1\nb: [x, \x1b]\n", ("f line 2: not valid YAML or JSON: character U+001B at column 8 is not allowed "
                                 "(a control character)")),
        ("a: \ufffe\n", ("f line 1: not valid YAML or JSON: character U+FFFE at column 4 is not allowed "
                        "(not a printable character)")),
        ("a: 1e999\n", "f line 1: field a: must be a finite number, got '1e999'"),
        ('{"a": -1E400}', "f line 1: field a: must be a finite number, got '-1E400'"),
    ],
)
def test_hostile_input_is_refused(text: str, message: str) -> None:
    with pytest.raises(InputFileError) as err:
        load_yaml(text, "f")
    assert str(err.value) == message


def test_aliases_within_the_limit_are_fine() -> None:
    text = "a: &a [1, 2, 3]\nb: [*a, *a, *a]\n"
    assert load_yaml(text)["b"] == [[1, 2, 3]] * 3
    bomb = "a: &a [" + ", ".join(["x"] * 100) + "]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 100)}]\n" for p, c in zip("abc", "bcd"))
    with pytest.raises(InputFileError, match="more than 100,000 values once aliases are expanded"):
        load_yaml(bomb)


class _FormatError(InputFileError):
    pass


def test_files(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    with pytest.raises(_FormatError) as err:
        read_yaml(path, _FormatError)
    assert str(err.value).startswith(f"{path}: cannot read: ")
    path.write_text("")
    assert read_yaml(path) is None
    path.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(_FormatError) as err:
        read_yaml(path, _FormatError)
    assert str(err.value) == f"{path} line 2: not UTF-8 text (byte 11)"
    path.write_text("#" * (4 * 1024 * 1024 + 1))
    with pytest.raises(_FormatError) as err:
        read_yaml(path, _FormatError)
    assert str(err.value) == f"{path}: larger than 4 MiB"
    fifo = tmp_path / "fifo.yaml"  # read, it waited for a writer for ever (common/plainfile.py)
    os.mkfifo(fifo)
    with pytest.raises(_FormatError) as err:
        read_yaml(fifo, _FormatError)
    assert str(err.value) == f"{fifo}: cannot read: not a plain file (a FIFO, socket or device)"
    with pytest.raises(_FormatError) as err:
        read_yaml(tmp_path, _FormatError)
    assert str(err.value) == f"{tmp_path}: cannot read: Is a directory"


def test_a_control_character_in_a_file_is_one_located_error(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"name: x\nmodel: y\x03\n")  # valid UTF-8: the YAML reader refuses it, not the decoder
    with pytest.raises(_FormatError) as err:
        read_yaml(path, _FormatError)
    assert str(err.value) == (f"{path} line 2: not valid YAML or JSON: character U+0003 at column 9 is not "
                              "allowed (a control character)")


def test_numbers_with_an_exponent_are_floats_as_in_yaml_12_and_json() -> None:
    doc = load_yaml('a: 1e6\nb: "1e6"\nc: 1.0e+6\nd: -2.5E3\ne: 1E-4\nf: .5e3\ng: 1.5e3\nh: v1e6\ni: 1e6x\n')
    assert doc == {"a": 1e6, "b": "1e6", "c": 1e6, "d": -2500.0, "e": 1e-4, "f": 500.0, "g": 1500.0,
                   "h": "v1e6", "i": "1e6x"}
    assert type(doc["c"]) is float  # what YAML 1.1 read as a float already stays a plain float
    a = doc["a"]
    assert isinstance(a, YamlFloat) and isinstance(a, float) and a == 1e6
    assert (repr(a), str(a), f"{a}", f"{a:g}") == ("1e6", "1e6", "1e6", "1e+06")  # as written
    assert pickle.loads(pickle.dumps(a)) == 1e6 and repr(pickle.loads(pickle.dumps(a))) == "1e6"
    assert load_yaml('{"A10-24GB": 1e6, "x": [2E-3]}') == {"A10-24GB": 1e6, "x": [0.002]}  # JSON
    assert load_yaml("a: 1e6")["a"] + 1 == 1000001.0
    import yaml

    assert yaml.safe_load("a: 1e6") == {"a": "1e6"}  # PyYAML itself is left as it is


def test_numbers_are_read_as_yaml_12_and_json_read_them() -> None:
    """YAML 1.1's other numbers are strings, so a field wanting a number refuses them by name:
    `global_batch_size: 4:16` was read as 256, `0755` as 493."""
    doc = load_yaml("a: 4:16\nb: 0755\nc: 1_000\nd: 0x1F\ne: 0b101\nf: 1:30.5\ng: +5\nh: -7\ni: .5\nj: 1.\n")
    assert doc == {"a": "4:16", "b": 755, "c": "1_000", "d": "0x1F", "e": "0b101", "f": "1:30.5", "g": 5, "h": -7,
                   "i": 0.5, "j": 1.0}


def test_a_huge_document_is_refused_while_it_is_read() -> None:
    """The node count was checked after the whole document was built: a 4 MiB flow list of 2 million
    items took 47 s and 1.3 GB, then was refused as an alias expansion it did not have."""
    with pytest.raises(InputFileError) as err:
        load_yaml("x: [" + "1, " * 1_000_000 + "]", "f")
    assert str(err.value) == "f line 1: more than 100,000 values"  # while composing: not "once aliases ..."


def test_timestamps_without_a_time_zone_stay_as_written() -> None:
    doc = load_yaml("a: 2030-01-01T00:00:00\nb: 2030-01-01\nc: 2030-01-01T00:00:00Z\nd: 2030-01-01 10:00:00 +2\n")
    assert (doc["a"], doc["b"]) == ("2030-01-01T00:00:00", "2030-01-01")
    assert doc["c"] == dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert doc["d"] == dt.datetime(2030, 1, 1, 8, tzinfo=dt.UTC)
