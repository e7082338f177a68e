"""Which role each RPC needs: the one table the control service's access checks read.

Three levels, each including the one before it:

- `READ` — lists and gets. Any valid token (service or admin); with `--open-reads` also
  no token at all.
- `SERVICE` — what capture and delivery do: commit checkpoints, record epochs, claim
  delivery, report batches and health, register pipelines, schemas and identities,
  append dead letters. The service token or the admin token.
- `ADMIN` — what operators do: pause, resume, rewind, replay/ack/purge dead letters,
  read the audit log. The admin token only.

`OPEN` is for the standard gRPC health service alone (orchestrators' probes, which learn
nothing but "serving"). A method missing from the table is refused at run time, and
`check_methods` makes the server refuse to start while a registered method has no entry:
an RPC added to the proto cannot end up open by accident.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Access(enum.IntEnum):
    OPEN = 0
    READ = 1
    SERVICE = 2
    ADMIN = 3


class Role(enum.IntEnum):
    """What a token grants; compared with `Access` by level (admin includes service)."""

    SERVICE = 2
    ADMIN = 3


def _service(name: str, **methods: Access) -> dict[str, Access]:
    return {f"/{name}/{method}": access for method, access in methods.items()}


R, S, A = Access.READ, Access.SERVICE, Access.ADMIN

ACCESS: dict[str, Access] = {
    **_service("tailrace.v1.Checkpoints", Get=R, Commit=S, List=R, Minimum=R),
    **_service("tailrace.v1.Epochs", Record=S, Latest=R, Range=R),
    **_service("tailrace.v1.Commits", ReportBatch=S, ClaimDelivery=S),
    **_service("tailrace.v1.Schemas", Register=S, List=R, Get=R, At=R),
    # Compare stores the identity the first time it sees a source: a change of state.
    **_service("tailrace.v1.Identities", Compare=S, Store=S, AddReconcile=S, ListReconcile=R,
               ReportHealth=S, GetHealth=R, ListHealth=R),
    # Replay hands out the entries an operator is about to re-deliver and acknowledge.
    **_service("tailrace.v1.DeadLetters", Append=S, Count=R, List=R, Replay=A, Ack=A, Purge=A),
    **_service("tailrace.v1.Admin", RegisterPipeline=S, ListPipelines=R, GetPipeline=R,
               Pause=A, Resume=A, Checkpoints=R, Rewind=A, Attach=A),
    **_service("tailrace.v1.Audit", List=A),
    **_service("tailrace.v1.Leases", Acquire=S, Release=S),
    **_service("tailrace.v1.Snapshots", Get=R, Update=S, Request=A, Cancel=A, Resnapshot=A),
    # Apply with dry_run changes nothing, yet shows the spec's diff: the admin's as the rest.
    **_service("tailrace.v1.Specs", Apply=A, Get=R, List=R, History=R, Delete=A),
    **_service("grpc.health.v1.Health", Check=Access.OPEN, Watch=Access.OPEN),
    **_service("grpc.reflection.v1alpha.ServerReflection", ServerReflectionInfo=R),
    **_service("grpc.reflection.v1.ServerReflection", ServerReflectionInfo=R),
}


# Reads that need more than the read level; every other service or admin RPC changes state
# (or, as DLQ Replay, starts an operator's change) and is audited.
ADMIN_READS = frozenset({"/tailrace.v1.Audit/List"})


class RoleTableError(Exception):
    """A registered RPC has no entry in `ACCESS`."""


def access_of(method: str) -> Access | None:
    """The access `method` (`/package.Service/Method`) needs; None = not in the table."""
    return ACCESS.get(method)


def audited(method: str) -> bool:
    """Whether an accepted call of `method` goes to the audit log."""
    access = ACCESS.get(method)
    return access is not None and access >= Access.SERVICE and method not in ADMIN_READS


def check_methods(methods: Iterable[str]) -> None:
    """Raise `RoleTableError` naming every method without a role (called at server start)."""
    missing = sorted(m for m in methods if m not in ACCESS)
    if missing:
        raise RoleTableError(
            f"{len(missing)} RPC(s) have no role: {', '.join(missing)}; add each to ACCESS in "
            "services/control/roles.py (read, service or admin) before serving it")


def allows(role: Role | None, access: Access, open_reads: bool = False) -> bool:
    """Whether a caller with `role` (None = no valid token) may call a method of `access`."""
    if access == Access.OPEN or (access == Access.READ and open_reads):
        return True
    return role is not None and role >= access
