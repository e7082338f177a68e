from tailrace.events import ChangeEvent
from tailrace_services.capture.txbuffer import TransactionBuffer


def test_spills_past_the_bound_and_keeps_order():
    buf = TransactionBuffer(max_in_memory=10)
    for i in range(1000):
        buf.append(ChangeEvent(table=f"t{i}"))
    assert len(buf) == 1000 and buf.spilled_bytes > 0
    assert [e.table for e in buf] == [f"t{i}" for i in range(1000)]
    buf.clear()
    assert len(buf) == 0 and list(buf) == []
