"""The role table, the tenant rules and the authenticators of the Controller API (docs/auth.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.common.errors import PermissionDenied, Unauthenticated, Unavailable
from tessera.common.tokens import ANONYMOUS, TokenEntry, hash_token, new_token, write_tokens_file
from tessera.common.tokens import Principal as Pr
from tessera.controller import access
from tessera.controller.auth import CallContext, TokenAuthenticator, bearer_token, principal_of
from tessera.v1 import controller_pb2

ALICE = Pr("alice", "team-a", "user")
ROOT = Pr("root", "ops", "admin")
NODE = Pr("spiffe://tessera/node/n1", "", "node")  # a certificate identity: no Controller API role


def test_every_controller_method_is_in_the_role_table_and_nothing_else() -> None:
    methods = {m.name for m in controller_pb2.DESCRIPTOR.services_by_name["Controller"].methods}
    assert set(access.METHOD_ROLES) == methods
    assert access.MUTATING <= methods
    assert {m for m, r in access.METHOD_ROLES.items() if r == "admin"} == {"DrainNode", "UndrainNode", "RemoveNode"}


@pytest.mark.parametrize("method", sorted(access.METHOD_ROLES))
def test_authorize_matrix(method: str) -> None:
    admin_only = access.METHOD_ROLES[method] == "admin"
    access.authorize(method, ROOT)
    access.authorize(method, ANONYMOUS)
    if admin_only:
        with pytest.raises(PermissionDenied, match=f"{method} needs role admin; alice has role user"):
            access.authorize(method, ALICE)
    else:
        access.authorize(method, ALICE)
    with pytest.raises(PermissionDenied):
        access.authorize(method, NODE)


def test_a_method_missing_from_the_table_is_refused() -> None:
    with pytest.raises(PermissionDenied, match="open to no role"):
        access.authorize("DeleteEverything", ROOT)


def test_tenant_rules() -> None:
    assert access.may_see(ALICE, "team-a") and not access.may_see(ALICE, "team-b") and not access.may_see(ALICE, "")
    assert access.may_see(ROOT, "team-b") and access.may_see(ANONYMOUS, "team-b")
    assert access.submit_tenant(ALICE, "") == access.submit_tenant(ALICE, "team-a") == "team-a"
    with pytest.raises(PermissionDenied, match="spec.tenant"):
        access.submit_tenant(ALICE, "team-b")
    assert access.submit_tenant(ROOT, "team-b") == "team-b" and access.submit_tenant(ROOT, "") == "ops"
    assert access.submit_tenant(ANONYMOUS, "") == ""  # the engine's default tenant
    assert access.list_tenant(ALICE, "") == access.list_tenant(ALICE, "team-a") == "team-a"
    with pytest.raises(PermissionDenied, match="tenant"):
        access.list_tenant(ALICE, "team-b")
    assert access.list_tenant(ROOT, "") == "" and access.list_tenant(ROOT, "team-b") == "team-b"
    with pytest.raises(PermissionDenied):  # a user without a tenant must never list "every tenant"
        access.list_tenant(Pr("x", "", "user"), "")


@pytest.mark.parametrize("metadata", [
    (), (("x-token", "Bearer abc"),), (("authorization", "abc"),), (("authorization", "Basic abc"),),
    (("authorization", "Bearer "),), (("authorization", "Bearer " + "a" * 300),),
    (("authorization", "Bearer tsr_é"),), (("authorization", b"Bearer abc"),),
    (("authorization", "Bearer a"), ("authorization", "Bearer b")),
])
def test_bearer_token_refuses_anything_but_one_bearer_entry(metadata: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(Unauthenticated):
        bearer_token(metadata)


def test_bearer_token_reads_the_scheme_in_any_case() -> None:
    assert bearer_token((("authorization", "Bearer tsr_x"),)) == "tsr_x"
    assert bearer_token((("user-agent", "grpc"), ("authorization", "bearer tsr_y"))) == "tsr_y"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def test_token_authenticator_rereads_on_change_and_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    a, b = new_token(), new_token()
    write_tokens_file(path, [TokenEntry("a", "team-a", "user", hash_token(a))])
    clock = Clock()
    auth = TokenAuthenticator(path, clock=clock)
    assert auth.authenticate(md(a)) == Pr("a", "team-a", "user")
    with pytest.raises(Unauthenticated, match="unknown token"):
        auth.authenticate(md(b))
    write_tokens_file(path, [TokenEntry("b", "team-b", "admin", hash_token(b))])
    assert auth.authenticate(md(a)).name == "a"  # not re-checked within RECHECK_S
    clock.t += 1.5
    assert auth.authenticate(md(b)).role == "admin"
    with pytest.raises(Unauthenticated):  # a's token was revoked by the rewrite
        auth.authenticate(md(a))
    good = path.read_text()
    path.write_text(good.replace('"admin"', '"root"'))
    clock.t += 1.5
    with pytest.raises(Unavailable):
        auth.authenticate(md(b))
    path.unlink()
    clock.t += 1.5
    with pytest.raises(Unavailable):
        auth.authenticate(md(b))
    write_tokens_file(path, [TokenEntry("b", "team-b", "admin", hash_token(b))])
    clock.t += 1.5
    assert auth.authenticate(md(b)).name == "b"
    with pytest.raises(Unauthenticated):  # no credentials are refused before the file is consulted
        auth.authenticate(())


def test_a_handler_reached_without_the_interceptor_fails_closed() -> None:
    with pytest.raises(Unauthenticated):
        principal_of(object())
    assert principal_of(CallContext(object(), ALICE)) is ALICE
