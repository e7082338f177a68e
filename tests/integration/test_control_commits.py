"""Commit policy and checkpoint compare-and-set over real gRPC, on SQLite, PostgreSQL and memory.

DESIGN guarantee 4: `required` — every required sink acknowledged; `all` — every sink;
`quorum: N` — at least N acknowledged. Only then do the acknowledged sinks' checkpoints
advance, together; when the policy is unmet nothing advances.
"""

from __future__ import annotations

import itertools
import threading
import uuid

import pytest

from tailrace.config import QuorumPolicy
from tailrace.control_client import ControlClient, ControlRefused, SinkOutcome, to_commit_policy
from tailrace.proto import control_pb2 as pb
from tailrace_services.control.server import serve
from tailrace_services.control.storage import MemoryStorage, SqliteStorage
from tests.fix_control import published

pytestmark = pytest.mark.integration

SINKS = {"r1": True, "r2": True, "o1": False, "o2": False}  # id -> required
_ids = itertools.count()


@pytest.fixture(scope="module", params=["memory", "sqlite", "postgres"])
def backend(request, tmp_path_factory):
    """(address, storage kind) of a control server on loopback for this module."""
    db = None
    if request.param == "memory":
        storage = MemoryStorage()
    elif request.param == "sqlite":
        storage = SqliteStorage(str(tmp_path_factory.mktemp("control") / "state.db"))
    else:
        from tailrace_services.control.storage._postgres import PostgresStorage

        pg = request.getfixturevalue("pg_server")
        db = f"commits_{uuid.uuid4().hex[:8]}"
        storage = PostgresStorage(pg.create_database(db))
    server = serve(storage, "127.0.0.1:0")
    yield f"127.0.0.1:{server.port}"
    server.stop()
    if db is not None:
        pg.drop_database(db)


@pytest.fixture
def client(backend):
    with ControlClient(backend, retry_for=5) as c:
        yield c


def cp(seq: int) -> pb.Checkpoint:
    c = pb.Checkpoint()
    c.position.tx_seq = seq
    c.bus_offsets[0] = seq * 10
    return c


def report(client: ControlClient, source: str, policy: object, seq: int, failed: set[str],
           versions: dict[str, int]) -> pb.ReportBatchResponse:
    published(client, source)
    return client.report_batch("orders", source, policy, [
        SinkOutcome(sink_id=s, required=req, acknowledged=s not in failed, checkpoint=cp(seq),
                    expected_version=versions.get(s, 0), error="boom" if s in failed else "")
        for s, req in SINKS.items()])


def positions(client: ControlClient, source: str) -> dict[str, tuple[int, int]]:
    out = {}
    for s in SINKS:
        c = client.get_checkpoint(source, s)
        out[s] = (c.position.tx_seq, c.version) if c else (0, 0)
    return out


NONE, R1, O1, R1O1, O1O2, R1R2, ALL4 = (set(), {"r1"}, {"o1"}, {"r1", "o1"}, {"o1", "o2"},
                                        {"r1", "r2"}, set(SINKS))
# (policy, failed sinks, satisfied): written out, not computed
MATRIX = [
    ("required", NONE, True), ("required", R1, False), ("required", O1, True),
    ("required", R1O1, False), ("required", O1O2, True), ("required", R1R2, False),
    ("required", ALL4, False),
    ("all", NONE, True), ("all", R1, False), ("all", O1, False), ("all", R1O1, False),
    ("all", O1O2, False), ("all", R1R2, False), ("all", ALL4, False),
    ({"quorum": 2}, NONE, True), ({"quorum": 2}, R1, True), ({"quorum": 2}, O1, True),
    ({"quorum": 2}, R1O1, True), ({"quorum": 2}, O1O2, True), ({"quorum": 2}, R1R2, True),
    ({"quorum": 2}, ALL4, False),
    (QuorumPolicy(quorum=3), NONE, True), (QuorumPolicy(quorum=3), R1, True),
    (QuorumPolicy(quorum=3), O1, True), (QuorumPolicy(quorum=3), R1O1, False),
    (QuorumPolicy(quorum=3), O1O2, False), (QuorumPolicy(quorum=3), R1R2, False),
    (QuorumPolicy(quorum=3), ALL4, False),
]


def _case(policy: object, failed: set[str]) -> str:
    name = policy if isinstance(policy, str) else "quorum{}".format(
        policy["quorum"] if isinstance(policy, dict) else policy.quorum)  # type: ignore[attr-defined]
    return f"{name}-{'+'.join(sorted(failed)) or 'none'}-failed"


@pytest.mark.parametrize(("policy", "failed", "satisfied"), MATRIX,
                         ids=[_case(p, f) for p, f, _ in MATRIX])
def test_commit_policy_matrix(client, policy, failed, satisfied):
    source = f"src-{next(_ids)}"
    first = report(client, source, "all", 10, set(), {})
    assert first.committed and positions(client, source) == {s: (10, 1) for s in SINKS}

    answer = report(client, source, policy, 20, failed, {s: 1 for s in SINKS})

    assert answer.satisfied is satisfied
    assert answer.committed is satisfied and not answer.conflict
    after = positions(client, source)
    if satisfied:
        assert {c.sink_id for c in answer.checkpoints} == set(SINKS) - failed
        assert after == {s: (10, 1) if s in failed else (20, 2) for s in SINKS}, \
            "exactly the acknowledged sinks advance; the failed ones keep their checkpoint"
    else:
        assert answer.reason and after == {s: (10, 1) for s in SINKS}, "unmet: nothing advances"


def test_lagging_optional_sink_catches_up_alone(client):
    source = f"src-{next(_ids)}"
    report(client, source, "required", 10, set(), {})
    report(client, source, "required", 20, {"o1"}, {s: 1 for s in SINKS})
    assert positions(client, source)["o1"] == (10, 1)
    # the next batch: o1 replays up to where the others are; they move on to 30
    outcomes = [SinkOutcome("o1", False, True, cp(20), 1)] + [
        SinkOutcome(s, SINKS[s], True, cp(30), 2) for s in ("r1", "r2", "o2")]
    assert client.report_batch("orders", source, "required", outcomes).committed
    assert positions(client, source) == {"r1": (30, 3), "r2": (30, 3), "o2": (30, 3),
                                         "o1": (20, 2)}


def test_one_stale_version_advances_none_and_is_a_conflict(client):
    source = f"src-{next(_ids)}"
    report(client, source, "all", 10, set(), {})
    stale = {s: 1 for s in SINKS} | {"o2": 7}  # another process moved o2 (or we read it wrong)
    answer = report(client, source, "required", 20, set(), stale)
    assert answer.satisfied and not answer.committed and answer.conflict
    assert "o2" in answer.reason and answer.checkpoints[0].sink_id == "o2"
    assert positions(client, source) == {s: (10, 1) for s in SINKS}, "all or nothing"


def test_a_checkpoint_never_moves_backwards(client):
    source = f"src-{next(_ids)}"
    report(client, source, "all", 10, set(), {})
    answer = report(client, source, "all", 5, set(), {s: 1 for s in SINKS})
    assert answer.conflict and "backwards" in answer.reason
    assert positions(client, source) == {s: (10, 1) for s in SINKS}


def test_quorum_that_can_never_be_met_is_refused(client):
    with pytest.raises(ControlRefused, match="quorum 5 can never be met by 4"):
        report(client, f"src-{next(_ids)}", {"quorum": 5}, 1, set(), {})


def test_policy_values_from_the_spec():
    assert to_commit_policy("required").kind == pb.POLICY_REQUIRED
    assert to_commit_policy("all").kind == pb.POLICY_ALL
    q = to_commit_policy(QuorumPolicy(quorum=2))
    assert (q.kind, q.quorum) == (pb.POLICY_QUORUM, 2)
    assert to_commit_policy({"quorum": 3}).quorum == 3


def race(addresses: list[str], via: str, per_thread: int = 40) -> None:
    """One client (thread) per address races to advance one checkpoint by one from the value
    it read. Every accepted commit must start from the stored value: none lost, none back."""
    source = f"race-{next(_ids)}"
    accepted: list[tuple[int, int, int]] = []  # (seen version, seen seq, new seq)
    refused = [0]
    lock = threading.Lock()

    def racer(address: str) -> None:
        with ControlClient(address, retry_for=5) as c:
            published(c, source)
            wins = 0
            while wins < per_thread:
                seen = c.get_checkpoint(source, "s")
                version, seq = (seen.version, seen.position.tx_seq) if seen else (0, 0)
                new = pb.Checkpoint(source_id=source, sink_id="s")
                new.position.tx_seq = seq + 1
                if via == "commit_checkpoint":
                    ok = c.commit_checkpoint(new, version)[0]
                else:
                    r = c.report_batch("race", source, "required",
                                       [SinkOutcome("s", True, True, new, version)])
                    ok = r.committed
                    assert ok or r.conflict
                with lock:
                    if ok:
                        accepted.append((version, seq, seq + 1))
                        wins += 1
                    else:
                        refused[0] += 1

    threads = [threading.Thread(target=racer, args=(a,)) for a in addresses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = per_thread * len(addresses)
    with ControlClient(addresses[0]) as c:
        final = c.get_checkpoint(source, "s")
    assert final.position.tx_seq == total and final.version == total
    assert sorted(new for _, _, new in accepted) == list(range(1, total + 1)), \
        "no two commits were accepted from the same value"
    assert all(version == seq for version, seq, _ in accepted)
    print(f"\n{via}: {len(accepted)} accepted, {refused[0]} refused as stale")


@pytest.mark.parametrize("via", ["commit_checkpoint", "report_batch"])
def test_racing_committers_only_move_forward_from_what_each_saw(backend, via):
    race([backend, backend], via)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_replicas_sharing_storage_race_correctly(request, tmp_path, kind):
    """Two control replicas on one database (HA); each racer talks to its own replica."""
    servers = []
    for _ in range(2):
        if kind == "sqlite":
            storage = SqliteStorage(str(tmp_path / "shared.db"))
        else:
            from tailrace_services.control.storage._postgres import PostgresStorage

            storage = PostgresStorage(request.getfixturevalue("pg_db"))
        servers.append(serve(storage, "127.0.0.1:0"))
    try:
        race([f"127.0.0.1:{s.port}" for s in servers], "report_batch")
    finally:
        for s in servers:
            s.stop()


def test_a_newer_delivery_claim_fences_the_older_instance(client):
    """Newest claim wins: the older generation's reports are refused, nothing moves."""
    pipeline, source = f"own{next(_ids)}", f"own-src{next(_ids)}"
    client.register_pipeline(pipeline, source_id=source, sinks=[("k1", "kafka", True)])
    first = client.claim_delivery(pipeline, "host-a:1")
    assert (first.owner.generation, first.previous.generation) == (1, 0)
    published(client, source)

    def send(generation: int, seq: int, version: int) -> pb.ReportBatchResponse:
        return client.report_batch(pipeline, source, "required", [SinkOutcome(
            sink_id="k1", required=True, acknowledged=True, checkpoint=cp(seq),
            expected_version=version)], generation=generation)

    assert send(1, 1, 0).committed
    second = client.claim_delivery(pipeline, "host-b:2")
    assert (second.owner.generation, second.previous.instance) == (2, "host-a:1")
    refused = send(1, 2, 1)
    assert refused.fenced and not refused.committed
    assert "host-b:2 (generation 2) owns it now" in refused.reason
    assert client.get_checkpoint(source, "k1").position.tx_seq == 1, "nothing moved"
    assert send(2, 2, 1).committed
    owner = client.get_pipeline(pipeline).delivery_owner
    assert (owner.instance, owner.generation) == ("host-b:2", 2)


def test_a_claim_racing_a_commit_fences_it(backend):
    """The owner record is part of the checkpoints' compare-and-set: a guard read before a
    claim no longer matches, so the commit stores nothing."""
    from tailrace_services.control.checkpoints import CheckpointStore
    from tailrace_services.control.epochs import EpochStore
    from tailrace_services.control.owners import DeliveryOwners, owner_key
    from tailrace_services.control.storage import CasConflict

    storage = MemoryStorage()
    owners, store = DeliveryOwners(storage), CheckpointStore(storage)
    epoch = pb.Epoch(source_id="s", epoch_id=1)
    epoch.position.tx_seq, epoch.end_offsets[0] = 5, 50
    EpochStore(storage).record(epoch)
    owner, _ = owners.claim("p", "a:1")
    _, version = owners.get("p")
    owners.claim("p", "b:2")  # between the owner check and the compare-and-set
    c = cp(5)
    c.source_id, c.sink_id = "s", "k1"
    with pytest.raises(CasConflict):
        store.commit_many([(c, 0)], guard=(owner_key("p"), owner.SerializeToString(), version))
    assert store.get("s", "k1") is None


def test_a_forged_checkpoint_past_the_latest_epoch_is_refused(client):
    """Issue 12.3: `tx_seq + 1e9` once made capture confirm a slot past the server's WAL."""
    source = f"forged-{next(_ids)}"
    epoch = pb.Epoch(source_id=source, epoch_id=1)
    epoch.position.tx_seq, epoch.end_offsets[0] = 20, 200
    client.record_epoch(epoch)
    assert client.report_batch("orders", source, "required", [
        SinkOutcome("r1", True, True, cp(20), 0)]).committed
    for forged in (cp(20 + 10**9), cp(20)):
        if forged.position.tx_seq == 20:
            forged.bus_offsets[0] = 201  # the position is fine, the offset is not
        with pytest.raises(ControlRefused, match="FAILED_PRECONDITION: checkpoint of sink r1 .* "
                                                 "is beyond the latest epoch"):
            client.report_batch("orders", source, "required", [
                SinkOutcome("r1", True, True, forged, 1)])
        forged.source_id, forged.sink_id = source, "r1"
        with pytest.raises(ControlRefused, match="beyond the latest epoch"):
            client.commit_checkpoint(forged, 1)
    assert client.get_checkpoint(source, "r1").position.tx_seq == 20
