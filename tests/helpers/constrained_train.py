"""``msf-train`` on a machine with less room than this one: a small /dev/shm, or a disk that fills up.

Usage: ``python tests/helpers/constrained_train.py [msf-train flags]`` with, in the environment,

* ``MSF_TEST_SHM_FREE=BYTES``: /dev/shm has only that much free space (:func:`msf.train.shm_free_bytes`);
* ``MSF_TEST_DISK_FULL_AFTER=N``: the first N checkpoint files of this process are written, every one after
  that fails as on a full disk: its temporary file is opened on ``/dev/full``, where every write fails with
  ENOSPC, so torch.save meets a real full-disk error.

One device group runs in this process, so the patches reach it (a spawned rank process would re-import this
file as ``__mp_main__`` and get them too).
"""

from __future__ import annotations

import itertools
import os
import sys

import msf.persistence.checkpoint
import msf.train


def _small_shm(free: int) -> None:
    msf.train.shm_free_bytes = lambda path=msf.train.SHM_DIR: free


def _disk_full_after(n: int) -> None:
    temp_file, count = msf.persistence.checkpoint._temp_file, itertools.count()

    def full_after_n(path: str) -> tuple[int, str]:
        if next(count) < n:
            return temp_file(path)
        # a temporary path that is never created: the cleanup finds nothing to remove, as after a real failure
        return os.open("/dev/full", os.O_WRONLY), os.path.join(os.path.dirname(path), ".tmp-never-created.pth")

    msf.persistence.checkpoint._temp_file = full_after_n


if os.environ.get("MSF_TEST_SHM_FREE"):
    _small_shm(int(os.environ["MSF_TEST_SHM_FREE"]))
if os.environ.get("MSF_TEST_DISK_FULL_AFTER"):
    _disk_full_after(int(os.environ["MSF_TEST_DISK_FULL_AFTER"]))

if __name__ == "__main__":
    sys.exit(msf.train.main())
