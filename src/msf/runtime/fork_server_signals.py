"""Imported first by the workers' fork server (its preload list, :data:`msf.runtime.spawning._PRELOAD`), and
acting only there: the fork server ignores SIGTERM.

The fork server is in ``msf-train``'s process group, and a SIGTERM to the whole group (Slurm's ``scancel`` of a
batch script, ``kill -TERM -- -PGID``, a container's stop) asks ``msf-train`` for a clean stop. Had it ended the
server, multiprocessing, which reads the exit code of every child the server forked through the server, would
report each worker as "exited with code 255" and the stop as a failure. The server's life is its parent's: it
exits when ``msf-train`` closes its end of the server's alive pipe, and SIGKILL still ends it. Its children ignore
SIGTERM too, each by its own choice (a child started with ``spawn`` inherits nothing from here).
"""

from __future__ import annotations

import signal
import sys

from msf.runtime.signals import ignore


def in_fork_server() -> bool:
    """True in multiprocessing's fork server (its command line is ``python -c "from multiprocessing.forkserver
    import main; main(...)"``), False anywhere else (a test or tool that imports this module)."""
    return any("multiprocessing.forkserver import main" in a for a in getattr(sys, "orig_argv", ()))


if in_fork_server():
    ignore(signal.SIGTERM)
