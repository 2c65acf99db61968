"""Reading a DCP checkpoint as data, not code.

torch 2.13's DCP unpickles a checkpoint's `.metadata` with plain `pickle.load`
(`FileSystemReader.read_metadata`) and its non-tensor entries with `torch.load(weights_only=False)`
(`DefaultLoadPlanner.load_bytes`): a checkpoint someone else could write would run their code as the
worker's user on resume. `SafeReader` unpickles `.metadata` through an allowlist of the classes DCP
itself writes there; `SafePlanner` loads the non-tensor entries (the optimizer's hyperparameters:
numbers, tuples, None) with torch's own weights-only unpickler. Anything else is `UnsafeCheckpoint`,
which resume treats like any unreadable checkpoint: it is set aside and an older one is tried.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

# Larger than any `.metadata` DCP writes for the models Tessera's jobs may declare (it holds one
# entry per tensor chunk: a few hundred bytes each), and small enough to bound what unpickling a
# planted file may allocate.
MAX_METADATA_BYTES = 256 * 1024 * 1024

# What DCP writes into `.metadata` besides the classes of torch.distributed.checkpoint.metadata,
# found by recording every global a real checkpoint's `.metadata` asks for (and `builtins.getattr`,
# narrowed to `_enum_member`).
_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib._local", "PosixPath"),  # Python 3.13 moved the classes there
    ("pathlib._local", "PurePosixPath"),
    ("collections", "OrderedDict"),
})


class UnsafeCheckpoint(Exception):
    """The checkpoint's `.metadata` asks for something DCP never writes there."""


def _dcp_metadata_class(name: str) -> bool:
    value = getattr(dcp_metadata, name, None)
    return isinstance(value, type) and (dataclasses.is_dataclass(value) or issubclass(value, enum.Enum))


def _enum_member(cls: Any, name: Any) -> Any:
    """What `builtins.getattr` may do here: Python 3.12+ pickles an enum member as
    getattr(EnumClass, "NAME") (DCP's _MEM_FORMAT_ENCODING). Any other getattr is a way to reach a
    method (PosixPath(...).write_text) and call it."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and cls.__module__ == dcp_metadata.__name__ \
            and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise UnsafeCheckpoint(".metadata asks for an attribute that is not a member of one of DCP's enums")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == dcp_metadata.__name__ and _dcp_metadata_class(name):
            return getattr(dcp_metadata, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise UnsafeCheckpoint(f".metadata asks for {module[:80]}.{name[:80]}, which DCP never writes there")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpoint(".metadata holds a persistent reference, which DCP never writes there")


def read_metadata(data: bytes) -> Metadata:
    """The `Metadata` a `.metadata` file's bytes hold; UnsafeCheckpoint for anything else."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpoint:
        raise
    except Exception as e:  # a torn or garbled file: unreadable, not a crash
        raise UnsafeCheckpoint(f".metadata is not a DCP metadata record: {type(e).__name__}: {e}") from e
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f".metadata holds a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


class SafeReader(FileSystemReader):
    """A FileSystemReader whose `.metadata` goes through `read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            data = f.read(MAX_METADATA_BYTES + 1)
        if len(data) > MAX_METADATA_BYTES:
            raise UnsafeCheckpoint(f".metadata is over {MAX_METADATA_BYTES} bytes")
        metadata = read_metadata(data)
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's default planner, but non-tensor entries load with `weights_only=True`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            # torch's message is a page of advice; the line naming the global is the reason.
            lines = [ln for ln in str(e).splitlines() if "GLOBAL" in ln or "global" in ln] or [str(e)]
            raise UnsafeCheckpoint(f"entry {read_item.dest_index.fqn[:200]} is not plain data: "
                                   f"{lines[0][:300]}") from e
        # Handed on re-saved, so the parent's placement of the value (flattened or not) is used
        # as it is, not copied from torch's private helpers; the bytes now hold only what the
        # weights-only load accepted.
        value = io.BytesIO()
        torch.save(loaded, value)
        value.seek(0)
        super().load_bytes(read_item, value)
