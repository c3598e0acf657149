"""Signals: the one module of msf that sets a signal's handler.

Only a run's main processes decide how to stop and when to checkpoint: ``msf-train`` (its start-up,
:class:`StartUp`; then its device group) and msf's node launcher, each through a :class:`Signals` installed for
one stage of its life. Every other process (workers, the fork server, a rank that is ending) ignores the stop
signals: :func:`ignore`.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable

from msf import CHECKPOINT_SIGNAL, INTERRUPTED_BEFORE_TRAINING, STOP_SIGNALS


def set_handlers(handlers: dict[int, Any]) -> dict[int, Any]:
    """Set the handler of each signal (a function, ``SIG_IGN``, ``SIG_DFL``); return those they replaced. A
    handler None (one not set from Python) is left as it is."""
    return {s: signal.signal(s, h) for s, h in handlers.items() if h is not None}


def ignore(*signums: int) -> None:
    """Ignore these signals in this process."""
    set_handlers(dict.fromkeys(signums, signal.SIG_IGN))


def exit_on_interrupt(signum: int) -> None:
    """What a stop signal after the first does by default: a second Ctrl-C (SIGINT) exits at once with code 130;
    a SIGTERM or SIGHUP changes nothing. The process's recorded semaphores go with it (``os._exit`` skips their
    clean-up)."""
    if signum == signal.SIGINT:
        from msf.runtime.semaphore_records import release_recorded_semaphores

        release_recorded_semaphores()
        os._exit(130)


class Signals:
    """The handlers of :data:`msf.STOP_SIGNALS` and :data:`msf.CHECKPOINT_SIGNAL` for one stage of a process,
    installed together over whatever it had (a script's background job inherits SIGINT ignored) and restored
    together; it counts the stop signals.

    Args:
        on_stop: called with the number of the first stop signal.
        on_checkpoint: called for a ``CHECKPOINT_SIGNAL`` that comes before any stop signal; None: it is ignored
            (its default action would end the process).
        on_again: called with the number of each later stop signal (None: nothing).
    """

    def __init__(
        self,
        on_stop: Callable[[int], None],
        on_checkpoint: Callable[[], None] | None = None,
        on_again: Callable[[int], None] | None = exit_on_interrupt,
    ) -> None:
        self.on_stop, self.on_checkpoint, self.on_again = on_stop, on_checkpoint, on_again
        self.count = 0
        self.old: dict[int, Any] = {}

    def install(self) -> Signals:
        handlers: dict[int, Any] = dict.fromkeys(STOP_SIGNALS, self._handle_stop)
        handlers[CHECKPOINT_SIGNAL] = self._handle_checkpoint if self.on_checkpoint else signal.SIG_IGN
        self.old = set_handlers(handlers)
        return self

    def restore(self) -> None:
        set_handlers(self.old)

    def _handle_stop(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            self.on_stop(signum)
        elif self.on_again is not None:
            self.on_again(signum)

    def _handle_checkpoint(self, signum: int, frame: Any) -> None:
        if not self.count and self.on_checkpoint is not None:
            self.on_checkpoint()


def _importing() -> bool:
    """True while a module is being imported (its code runs; importlib marks its spec ``_initializing``)."""
    for module in list(sys.modules.values()):
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            return True
    return False


class StartUp:
    """``msf-train``'s start-up, from its entry until a device group installs its own handlers: a stop signal
    ends it with :data:`msf.INTERRUPTED_BEFORE_TRAINING` and exit code 130, and the folders it made are removed,
    so that "nothing was trained or saved" holds (a new experiment's folder left with its ``config.json`` made
    the next run of the same ``--experiment`` resume with the aborted attempt's flags).

    ``whole_process``: this start-up is the process's entry (``msf-train``, ``python -m msf.train``), installed
    before the heavy imports: an uncaught ``KeyboardInterrupt`` and the exit code are its too
    (:meth:`_exit_130_if_interrupted`).
    """

    def __init__(self, whole_process: bool = False) -> None:
        self.whole_process = whole_process
        self.made: list[str] = []
        self.interrupted = False
        self.signals = Signals(self.interrupt, on_again=self.interrupt)

    def install(self) -> StartUp:
        if self.whole_process:
            import atexit

            atexit.register(self._exit_130_if_interrupted)  # registered first, so it runs last
            previous = sys.excepthook

            def hook(kind, value, tb) -> None:
                if issubclass(kind, KeyboardInterrupt):
                    self.exit()
                previous(kind, value, tb)

            sys.excepthook = hook
        self.signals.install()
        return self

    def restore(self) -> None:
        """The start-up is over. The entry's handlers stay until the process exits (a SIGUSR1 that comes in its
        last moments is still ignored; a late stop is still a ``KeyboardInterrupt``)."""
        if not self.whole_process:
            self.signals.restore()

    def made_before_training(self, path: str) -> None:
        """``path``, a folder this start-up created, is removed if a stop signal ends the start-up."""
        self.made.append(path)

    def keep(self) -> None:
        """The run went past its start-up (it trained, stopped cleanly or failed): its folders stay."""
        self.made.clear()

    def _remove(self) -> None:
        import shutil

        while self.made:
            shutil.rmtree(self.made.pop(), ignore_errors=True)

    def interrupt(self, signum: int) -> None:
        """A stop signal in the start-up: ``KeyboardInterrupt``, as Python's own for SIGINT, except while a module
        is being imported: then :meth:`exit` at once. An import leaves nothing to clean up, and an exception raised
        in it can reach C++: torch's import calls Python from C++ (pybind11), where a ``KeyboardInterrupt`` aborts
        the process (SIGABRT)."""
        if _importing():
            self.exit()
        raise KeyboardInterrupt

    def exit(self) -> None:
        """Remove the folders made, print the one line and exit with code 130 at once."""
        self._remove()
        print(INTERRUPTED_BEFORE_TRAINING, file=sys.stderr, flush=True)
        os._exit(130)

    def end_interrupted(self) -> int:
        """``msf-train`` caught the ``KeyboardInterrupt`` of a stop in the start-up: ignore the stop signals until
        the exit (another one, such as the Ctrl-C a terminal sends to the whole group, would break the line below
        or come out of a finalizer as a traceback), remove the folders made, print the line; return 130."""
        ignore(*STOP_SIGNALS)
        self._remove()
        print(INTERRUPTED_BEFORE_TRAINING, file=sys.stderr)
        self.interrupted = True
        return 130

    def _exit_130_if_interrupted(self) -> None:
        """At exit (the last handler), end with 130 where a stop ended the start-up: CPython marks a
        ``KeyboardInterrupt`` that left code run by ``exec`` of a string (the methods that dataclasses and named
        tuples build, hundreds in torch's import) as unhandled even once it is caught, and under ``python -m``
        would end itself by SIGINT after its finalization (exit code -2)."""
        if self.interrupted:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):  # closed
                    pass
            os._exit(130)
