"""``msf-train`` with one rank that starts its initialisation late, for the tests of concurrent start.

Usage: ``MSF_TEST_LATE_RANK=RANK:SECONDS python tests/helpers/late_rank_train.py [msf-train flags]``.

The delay wraps :func:`msf.runner.launch._run_rank`, the function every rank process calls to join the job
and train, so the late rank records its entry into initialisation only after the delay, as a rank
started late would. The wrapper is installed when this file is imported, not in ``main``: the rank
processes are spawned, and a spawned child re-imports the parent's main script (as ``__mp_main__``)
before it runs its rank, so it gets the wrapper too.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time

import msf.runner.launch


def _delay_one_rank(spec: str) -> None:
    late_rank, seconds = int(spec.split(":")[0]), float(spec.split(":")[1])
    run_rank = msf.runner.launch._run_rank

    @functools.wraps(run_rank)
    def late(rank, *args, **kwargs):
        if rank.rank == late_rank:
            logging.getLogger("msf").info("msf test: starting rank %d %.1f s late", late_rank, seconds)
            time.sleep(seconds)
        return run_rank(rank, *args, **kwargs)

    msf.runner.launch._run_rank = late


if os.environ.get("MSF_TEST_LATE_RANK"):
    _delay_one_rank(os.environ["MSF_TEST_LATE_RANK"])

if __name__ == "__main__":
    import msf.train

    sys.exit(msf.train.main())
