"""multi-sample-factory: asynchronous PPO (APPO) with a data-parallel learner."""

import signal as _signal
import sys as _sys

__version__ = "0.1.0"

STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)
"""The signals that stop ``msf-train``: cleanly (a final checkpoint) once training runs, with
:data:`INTERRUPTED_BEFORE_TRAINING` before. SIGTERM: ``kill``, Slurm's ``scancel``; SIGHUP: a closed terminal, a
dropped ssh session."""

CHECKPOINT_SIGNAL = _signal.SIGUSR1
"""The signal that asks ``msf-train`` for a checkpoint now, the run going on (Slurm's ``--signal=USR1@60``: a
checkpoint a minute before the time limit, or before a preemption). Every process msf starts ignores it, so it
may be sent to every process of a job; before training begins there is nothing to save and it is ignored."""

LOG_DATEFMT = "%H:%M:%S"
"""The clock of every log line, the main process's and the workers'."""

INTERRUPTED_BEFORE_TRAINING = "msf-train: interrupted before training began: nothing was trained or saved"
"""The one line ``msf-train`` prints when one of :data:`STOP_SIGNALS` ends it before training began (exit code 130)."""


def _is_msf_train() -> bool:
    """True in the process of ``msf-train`` or ``python -m msf.train`` while this package is first imported; False in
    the worker processes (``python -c ...``) and in a program that imports msf."""
    import os

    if _sys.argv and os.path.basename(_sys.argv[0]) == "msf-train":
        return True
    if _sys.argv[:1] != ["-m"]:  # runpy names the module in argv[0] only after importing its package
        return False
    args = getattr(_sys, "orig_argv", [])
    for i, a in enumerate(args[1:], 1):
        if a.startswith("-m"):
            return (a[2:] or (args[i + 1] if i + 1 < len(args) else "")) == "msf.train"
    return False


def _end_early_interrupts_with_130() -> None:
    """From msf's first line, a SIGINT (also where the parent left it ignored, as a script's background job
    inherits it), a SIGTERM or a SIGHUP ends ``msf-train`` with :data:`INTERRUPTED_BEFORE_TRAINING` and exit code 130.
    (A SIGTERM in the start-up ended it by the signal, exit code 143 without a word, and left the experiment
    folder with its ``config.json``: a ``scancel`` while a job starts, or a ``kill`` of a run that is slow to
    start.)

    ``msf.train.main`` catches a Ctrl-C itself, but the imports of ``msf.train`` come before it runs: a
    Ctrl-C there (0.6-0.8 s after the start on a loaded machine) escaped as ``KeyboardInterrupt``, and Python
    printed a traceback and ended the process by SIGINT (exit code -2). A SIGINT earlier still, while the
    interpreter itself starts, is Python's alone to handle.
    """
    import atexit
    import os
    import signal

    for s in STOP_SIGNALS:
        signal.signal(s, interrupt_before_training)
    signal.signal(CHECKPOINT_SIGNAL, signal.SIG_IGN)  # its default action ends the process: nothing to save yet
    atexit.register(_exit_130_if_interrupted)  # registered first, so it runs last (multiprocessing's runs before)
    previous = _sys.excepthook

    def hook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            print(INTERRUPTED_BEFORE_TRAINING, file=_sys.stderr, flush=True)
            os._exit(130)
        previous(kind, value, tb)

    _sys.excepthook = hook


_interrupted: list[bool] = []


_made_before_training: list[str] = []


def made_before_training(path: str) -> None:
    """``path``, a folder this ``msf-train`` created before training began, is removed if a SIGINT ends the
    start-up (:func:`remove_made_before_training`), so that "nothing was trained or saved" holds: an experiment
    folder left with its ``config.json`` made the next run of the same ``--experiment`` resume with the aborted
    attempt's flags."""
    _made_before_training.append(path)


def remove_made_before_training() -> None:
    """Remove the folders of :func:`made_before_training` (a SIGINT ended the start-up)."""
    import shutil

    while _made_before_training:
        shutil.rmtree(_made_before_training.pop(), ignore_errors=True)


def keep_made_before_training() -> None:
    """The run went past its start-up (it trained, stopped cleanly or failed): its folders stay."""
    _made_before_training.clear()


def _importing() -> bool:
    """True while a module is being imported (its code runs; importlib marks its spec ``_initializing``)."""
    for module in list(_sys.modules.values()):
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            return True
    return False


def interrupt_before_training(signum: int, frame: object) -> None:
    """The handler of :data:`STOP_SIGNALS` in ``msf-train`` until a device group runs: ``KeyboardInterrupt``, as
    Python's own for SIGINT, except while a module is being imported: then :data:`INTERRUPTED_BEFORE_TRAINING`
    and exit code 130 at once.

    An import leaves nothing to clean up, and an exception raised in it can reach C++: torch's import calls
    Python from C++ (pybind11) and a ``KeyboardInterrupt`` raised there ended the process with "terminate
    called after throwing an instance of 'pybind11::error_already_set'" and SIGABRT (exit code -6), one Ctrl-C
    0.5 s into a run of two device groups in a clean clone's test run.
    """
    if _importing():
        import os

        remove_made_before_training()
        print(INTERRUPTED_BEFORE_TRAINING, file=_sys.stderr, flush=True)
        os._exit(130)
    raise KeyboardInterrupt


def end_as_interrupted() -> None:
    """``msf.train.main`` returns 130: a SIGINT ended the start-up. Then :func:`_exit_130_if_interrupted` makes
    sure that the process's exit code is 130."""
    _interrupted.append(True)


def _exit_130_if_interrupted() -> None:
    """At exit (the last handler), end with 130 where a SIGINT ended the start-up.

    CPython (3.11) marks a ``KeyboardInterrupt`` as unhandled whenever one leaves code that ``exec`` ran from a
    string, even if it is caught further up; dataclasses and named tuples build their methods that way, and
    torch's import builds hundreds. Under ``python -m`` the interpreter then ends itself by SIGINT after its
    finalization (exit code -2) instead of with the 130 that ``main`` returned: 2 of 14 Ctrl-Cs during the
    import of torch did.
    """
    if _interrupted:
        import os

        for stream in (_sys.stdout, _sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed
                pass
        os._exit(130)


if _is_msf_train():
    _end_early_interrupts_with_130()
