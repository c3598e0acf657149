"""The records of the named semaphores a run made, and the sweep of dead runs' ones (msf.runtime.semaphore_records)."""

from __future__ import annotations

import os

import pytest

from msf.runtime import semaphore_records as sr


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="process start times from /proc")
def test_the_sweep_removes_the_semaphores_of_dead_pids_and_of_reused_ones_only(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sr, "SHM", str(tmp_path))
    me, mine = os.getpid(), sr.start_time(os.getpid())
    assert mine is not None
    records = {me: [mine, "/mp-live"], me + 10**7: ["123", "/mp-dead"], 1: ["0", "/mp-reused", "/mp-gone"]}
    for pid, lines in records.items():  # 10**7 + pid: no such process; pid 1 did not start at tick 0
        (tmp_path / f"msf-semaphores.{pid}").write_text("".join(f"{line}\n" for line in lines))
    for name in ("live", "dead", "reused"):
        (tmp_path / f"sem.mp-{name}").write_text("")
    with caplog.at_level("INFO", logger="msf"):
        sr.remove_dead_runs_semaphores()
    assert sorted(os.listdir(tmp_path)) == [f"msf-semaphores.{me}", "sem.mp-live"]
    assert [r.getMessage() for r in caplog.records] == [
        f"removed 2 semaphores of dead msf runs (pids 1, {me + 10**7}) from {tmp_path}"
    ]
