from hypothesis import given
from hypothesis import strategies as st

from redrive import gate
from redrive import headers as h

dues = st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=10_000)), max_size=40)


@given(dues, st.integers(min_value=0, max_value=10_000))
def test_gate_never_admits_a_record_before_its_due_time(due_times: list[int | None],
                                                        now: int) -> None:
    admission = gate.admit(due_times, now)
    admitted = due_times[:admission.count]
    assert all(d is None or d <= now for d in admitted)
    if admission.count < len(due_times):
        head = due_times[admission.count]
        assert head is not None and head > now
        assert admission.next_due_ms == head
    else:
        assert admission.next_due_ms is None and not admission.held


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=40),
       st.integers(min_value=0, max_value=10_000))
def test_gate_admits_every_due_record_of_a_sorted_run(due_times: list[int], now: int) -> None:
    ordered = sorted(due_times)
    admission = gate.admit(ordered, now)
    assert admission.count == sum(1 for d in ordered if d <= now)


@given(dues, st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=30))
def test_replaying_the_clock_processes_everything_never_early(due_times: list[int | None],
                                                              steps: list[int]) -> None:
    # a consumer that keeps polling: each tick admits a prefix, the rest waits for a later tick
    now, position, processed_at = 0, 0, {}
    for step in [*steps, 20_000]:
        now += step
        admission = gate.admit(due_times[position:], now)
        for index in range(position, position + admission.count):
            processed_at[index] = now
        position += admission.count
    assert position == len(due_times)
    for index, at in processed_at.items():
        due = due_times[index]
        assert due is None or at >= due


def test_due_of_reads_header_and_treats_malformed_as_due() -> None:
    assert gate.due_of([(h.DUE, b"1234")]) == 1234
    assert gate.due_of([("other", b"x")]) is None
    assert gate.due_of([(h.DUE, b"soon")]) is None
    assert gate.is_due(None, 0) and gate.is_due(5, 5) and not gate.is_due(6, 5)
