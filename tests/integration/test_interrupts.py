"""The SIGINT handler of msf-train before a device group runs (msf.runtime.signals.StartUp)."""

import subprocess
import sys
import textwrap

from msf import INTERRUPTED_BEFORE_TRAINING

PROGRAM = textwrap.dedent(
    """
    import os, signal, sys, time
    from msf.runtime.signals import StartUp

    sys.path.insert(0, sys.argv[1])
    StartUp().install()
    if sys.argv[2] == "import":
        import interrupts_itself  # its body sends the SIGINT
        print("after the import", flush=True)
    else:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            print("caught", flush=True)
    """
)

MODULE = "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\nfor _ in range(50):\n    time.sleep(0.1)\n"


def _run(tmp_path, where):
    (tmp_path / "interrupts_itself.py").write_text(MODULE)
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path), where], capture_output=True, text=True, timeout=60
    )


def test_a_sigint_during_an_import_ends_the_process_at_once_with_130_and_the_one_line(tmp_path):
    """No exception is raised into the import (torch's calls Python from C++, where one aborted the process)."""
    p = _run(tmp_path, "import")
    assert (p.returncode, p.stdout, p.stderr) == (130, "", INTERRUPTED_BEFORE_TRAINING + "\n")


def test_a_sigint_outside_an_import_is_a_keyboard_interrupt_as_python_raises_it(tmp_path):
    p = _run(tmp_path, "other")
    assert (p.returncode, p.stdout, p.stderr) == (0, "caught\n", "")


def test_signals_count_the_stops_and_pass_a_checkpoint_only_before_the_first():
    """One stage's handlers: the first stop signal calls on_stop, later ones on_again; a checkpoint signal before
    any stop calls on_checkpoint; restore() gives back what the process had."""
    import os
    import signal

    from msf import CHECKPOINT_SIGNAL, STOP_SIGNALS
    from msf.runtime.signals import Signals

    before = {s: signal.getsignal(s) for s in (*STOP_SIGNALS, CHECKPOINT_SIGNAL)}
    calls = []
    sig = Signals(lambda s: calls.append(("stop", s)), lambda: calls.append("checkpoint"), lambda s: calls.append(s))
    sig.install()
    try:
        for s in (CHECKPOINT_SIGNAL, signal.SIGTERM, CHECKPOINT_SIGNAL, signal.SIGHUP, signal.SIGINT):
            os.kill(os.getpid(), s)
    finally:
        sig.restore()
    assert calls == ["checkpoint", ("stop", signal.SIGTERM), signal.SIGHUP, signal.SIGINT]
    assert sig.count == 3
    assert {s: signal.getsignal(s) for s in before} == before


def test_nothing_is_installed_at_import():
    """``import msf`` and ``import msf.train`` only define: the signal handlers, the excepthook and the atexit
    handlers are those of a bare interpreter."""
    code = (
        "import atexit, logging, signal, sys\n"  # (logging registers an atexit handler of its own)
        "def state():\n"
        "    return [signal.getsignal(s) for s in signal.valid_signals()], sys.excepthook, atexit._ncallbacks()\n"
        "bare = state()\n"
        "import msf, msf.train, msf.runtime.signals\n"
        "print(state() == bare)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "True", p.stderr


def test_only_one_module_of_msf_sets_signal_handlers():
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "msf"
    setters = sorted(str(p.relative_to(src)) for p in src.rglob("*.py") if "signal.signal(" in p.read_text())
    assert setters == ["runtime/signals.py"]
