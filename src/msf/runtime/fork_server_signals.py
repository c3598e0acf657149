"""Imported first by the workers' fork server (its preload list, :data:`msf.runtime.supervision.CTX`), and acting
only there: the fork server ignores SIGTERM.

The fork server is in ``msf-train``'s process group. A SIGTERM to the whole group (Slurm's ``scancel`` of a batch
script that runs ``msf-train``, ``kill -TERM -- -PGID``, a container's stop) ended it at once, while ``msf-train``
made the clean stop that the same SIGTERM asked of it. Multiprocessing reads the exit code of every child the
server forked through the server, so each then read as "exited with code 255", and the stop became "a device
group failed: inference_worker_0 (pid N) exited with code 255 unexpectedly" (status ``failed``, exit code 1).
The server's life is its parent's: it exits when ``msf-train`` closes its end of the server's alive pipe, and
SIGKILL still ends it. Its children ignore SIGTERM too, for the same reason, each by its own choice
(:func:`msf.runtime.supervision._child_main`: a child started with ``spawn`` inherits nothing from here).
"""

from __future__ import annotations

import signal
import sys


def in_fork_server() -> bool:
    """True in multiprocessing's fork server (its command line is ``python -c "from multiprocessing.forkserver
    import main; main(...)"``), False anywhere else (a test or tool that imports this module)."""
    return any("multiprocessing.forkserver import main" in a for a in getattr(sys, "orig_argv", ()))


if in_fork_server():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
