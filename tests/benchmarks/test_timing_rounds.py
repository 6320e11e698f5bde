"""benchmarks.timing: the warm-up and the interleaved rounds, the statistics, the short error."""

from __future__ import annotations

from benchmarks import timing


def test_stats_and_short_error():
    assert timing.stats([3.0, 1.0, 2.0, 10.0]) == {"median_s": 2.5, "min_s": 1.0, "max_s": 10.0}
    assert timing.short_error(ValueError("first line\nsecond")) == "first line"
    assert timing.short_error(ValueError("x" * 30), limit=10) == "xxxxxxx..."
    assert timing.short_error(KeyboardInterrupt()) == "KeyboardInterrupt"


class _Case:
    def __init__(self, label: str, calls: list[str], fail: bool = False) -> None:
        self.label = label
        self.times: list[float] = []
        self.calls = calls
        self.fail = fail

    def run(self) -> float:
        self.calls.append(self.label)
        if self.fail:
            raise RuntimeError("no such program\nmore detail")
        return float(len(self.calls))


def test_interleave_warms_up_each_case_then_times_rounds(capsys):
    calls: list[str] = []
    a, bad, b = _Case("A", calls), _Case("B", calls, fail=True), _Case("C", calls)
    ok, failed = timing.interleave([a, bad, b], repeats=3)
    assert ok == [a, b]
    assert failed == {"B": "no such program"}
    # two warm-up calls each (the failing case stops at its first), then A C rounds
    assert calls == ["A", "A", "B", "C", "C", "A", "C", "A", "C", "A", "C"]
    assert a.times == [6.0, 8.0, 10.0] and b.times == [7.0, 9.0, 11.0]
    assert capsys.readouterr().err == "skipped B: no such program\n"
