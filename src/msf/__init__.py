"""multi-sample-factory: asynchronous PPO (APPO) with a data-parallel learner."""

import signal as _signal

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
