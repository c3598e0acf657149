"""The SIGINT handler of msf-train before a device group runs (msf.interrupt_before_training)."""

import subprocess
import sys
import textwrap

from msf import INTERRUPTED_BEFORE_TRAINING

PROGRAM = textwrap.dedent(
    """
    import os, signal, sys, time
    import msf

    sys.path.insert(0, sys.argv[1])
    signal.signal(signal.SIGINT, msf.interrupt_before_training)
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
