"""Round 14 (helper 52): dashboard_latency says when and where it ran; the course's and ``make bench``'s
divergence rules go through one helper (``train.divergence_limit``) with their factors unchanged."""
from __future__ import annotations

import re

import pytest

from benchmarks import cli, dashboard_latency


def _no_timing(monkeypatch):
    """dashboard_latency.main without building or timing a dashboard: each measures as one with nothing to time."""
    monkeypatch.setattr(dashboard_latency, "measure", lambda build: {"build_ms": 0.0, "misses": {}, "hits": []})


def test_dashboard_latency_prints_the_date_and_machine_as_every_benchmark(capsys, monkeypatch):
    """It printed the load average and core count, no date: its timings could not be matched to a run."""
    _no_timing(monkeypatch)
    info = dict(cli.machine(), date="2031-02-03 04:05 UTC", processor="a-test-cpu")
    monkeypatch.setattr(dashboard_latency, "machine", lambda: info)
    dashboard_latency.main(["--only", "race"])
    out = capsys.readouterr().out
    assert cli.measured_line(info) in out.splitlines()[0]     # the shared helper's line, first, before any timing


def test_dashboard_latency_date_is_now_in_utc(capsys, monkeypatch):
    _no_timing(monkeypatch)
    before = cli.machine()["date"]
    dashboard_latency.main(["--only", "race"])
    after = cli.machine()["date"]
    head = capsys.readouterr().out.splitlines()[0]
    printed = re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", head).group(0)
    assert before <= printed <= after


def test_dashboard_latency_refusal_prints_no_header(capsys):
    with pytest.raises(SystemExit):
        dashboard_latency.main(["--only", "no-such-dashboard"])
    assert "UTC" not in capsys.readouterr().out
