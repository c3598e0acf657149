"""A module that, as it is imported (``--env=interrupt_on_import:CartPole-v1``, in msf-train's start-up), sends its
own process a SIGINT from inside code run by ``exec`` of a string: where a Ctrl-C during torch's import lands
when it comes while dataclasses build their methods (CPython then marks the ``KeyboardInterrupt`` as unhandled,
even once it is caught)."""

import os
import signal

exec("os.kill(os.getpid(), signal.SIGINT)\nfor _ in range(100000):\n    pass", {"os": os, "signal": signal})
