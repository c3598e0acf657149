"""CPU pinning and niceness as the OS reports them, set in a child process (spawned) so the test process keeps
its own."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

from msf.runtime.affinity import pin_this_process, raise_niceness, set_learner_niceness, usable_cores


def _child(core: int, q) -> None:
    q.put(pin_this_process([core]))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity on this platform")
def test_pinning_restricts_the_process_as_the_os_reports_it():
    core = usable_cores()[-1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(core, q))
    p.start()
    assert q.get(timeout=60) == [core]
    p.join(30)
    assert pin_this_process(None) is None


def _niceness_child(q) -> None:
    start = os.getpriority(os.PRIO_PROCESS, 0)
    out = [start, raise_niceness(3), os.getpriority(os.PRIO_PROCESS, 0)]
    out.append(set_learner_niceness(start + 5))  # raising: always allowed
    out.append(os.getpriority(os.PRIO_PROCESS, 0))
    out.append(set_learner_niceness(start))  # lowering: needs CAP_SYS_NICE (root has it)
    out.append(os.getpriority(os.PRIO_PROCESS, 0))
    out.append(raise_niceness(100))  # the kernel caps it at 19
    q.put(out)


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no setpriority on this platform")
def test_niceness_is_raised_by_offsets_and_lowered_only_with_privileges():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_niceness_child, args=(q,))
    p.start()
    start, raised, seen, why_up, after_up, why_down, after_down, capped = q.get(timeout=60)
    p.join(30)
    if start > 14:
        pytest.skip(f"this test process already runs at niceness {start}")
    assert raised == seen == start + 3
    assert why_up is None and after_up == start + 5
    if why_down is None:  # privileged (root in CI containers)
        assert after_down == start
    else:
        assert after_down == start + 5 and "needs privileges (CAP_SYS_NICE)" in why_down
    assert capped == 19
