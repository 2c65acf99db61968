"""Machine identities: who a certificate says its holder is (docs/security.md).

An identity is a SPIFFE-style URI in a certificate's subject alternative names:
spiffe://tessera/controller, spiffe://tessera/estimator, spiffe://tessera/node/<node-id>. The same
identity is also written as a DNS name under the reserved suffix `.id.tessera`, because gRPC's
Python API can check a server's certificate only against a host name: a channel that means to reach
node gpu-a1 asks for the name gpu-a1.node.id.tessera, which only that node's certificate carries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TRUST_DOMAIN = "tessera"
SCHEME_PREFIX = f"spiffe://{TRUST_DOMAIN}/"
# Host names under this suffix name identities; `pki issue --host` refuses them.
ID_DNS_SUFFIX = ".id.tessera"
# The node-id rule of the controller's API and of tessera-agent --node-id.
NODE_ID_PATTERN = r"[a-z0-9][a-z0-9._-]{0,62}"
NODE_ID_RE = re.compile(NODE_ID_PATTERN)
KINDS = ("controller", "estimator", "node")


def valid_node_id(node_id: str) -> bool:
    return NODE_ID_RE.fullmatch(node_id) is not None


@dataclass(frozen=True)
class Identity:
    """`kind` is controller, estimator or node; `name` is the node id (empty for the others)."""

    kind: str
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown identity kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if self.kind == "node":
            if not valid_node_id(self.name):
                raise ValueError(f"node id {self.name!r} does not match {NODE_ID_PATTERN}")
        elif self.name:
            raise ValueError(f"a {self.kind} identity has no name")

    @property
    def uri(self) -> str:
        return SCHEME_PREFIX + str(self)

    @property
    def dns(self) -> str:
        """The reserved host name a channel verifies when it means to reach this identity."""
        return f"{self.name}.node{ID_DNS_SUFFIX}" if self.kind == "node" else f"{self.kind}{ID_DNS_SUFFIX}"

    def __str__(self) -> str:
        return f"node/{self.name}" if self.kind == "node" else self.kind

    @classmethod
    def parse(cls, uri: str) -> Identity | None:
        """The identity a URI names, None when it is not one of ours (another trust domain, a
        malformed path, an unknown kind)."""
        if not uri.startswith(SCHEME_PREFIX):
            return None
        parts = uri[len(SCHEME_PREFIX):].split("/")
        try:
            if len(parts) == 1 and parts[0] in ("controller", "estimator"):
                return cls(parts[0])
            if len(parts) == 2 and parts[0] == "node":
                return cls("node", parts[1])
        except ValueError:
            return None
        return None


CONTROLLER = Identity("controller")
ESTIMATOR = Identity("estimator")


def node(node_id: str) -> Identity:
    return Identity("node", node_id)


def reserved_host(host: str) -> bool:
    """Whether `host` lies in the identity names' namespace (never a --host of a certificate)."""
    h = host.lower().rstrip(".")
    return h == ID_DNS_SUFFIX[1:] or h.endswith(ID_DNS_SUFFIX)
