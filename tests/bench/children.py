"""Set-up shared by the benchmarks' child processes."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path

PR_SET_PDEATHSIG = 1


def child_setup(log_file: Path, cpu: int | None) -> None:
    """Pin to `cpu` (when there is more than one), die with the parent, send stdout and stderr
    (the logs) to `log_file`."""
    assert log_file.is_absolute(), log_file
    if cpu is not None:
        with contextlib.suppress(AttributeError, OSError):
            if len(os.sched_getaffinity(0)) > 1:
                os.sched_setaffinity(0, {cpu})
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
