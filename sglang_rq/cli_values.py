"""Checks of numeric command-line values that every ``sglang-rq`` command shares."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path


MAX_WAIT_S = 365 * 24 * 3600.0  # a year


def positive_error(flag: str, value: float | int | None) -> str | None:
    """The error for ``flag``'s ``value`` where it must be a finite number above zero, or None
    if it is one (or was not given). A plain ``value <= 0`` lets NaN through, since NaN compares
    false with everything: ``--rq-canary-interval-s nan`` made the canary loop without sleeping."""
    if value is None or 0 < value < math.inf:
        return None
    return f"{flag}={value} must be > 0 and finite (leave the flag out for its default)"


def wait_error(flag: str, value: float | None) -> str | None:
    """The error for ``flag``'s ``value`` where it is a wait in seconds (a timeout, an
    interval): `positive_error`'s, or past `MAX_WAIT_S`, or None. Python's timers take at most
    about 2^63 ns and a deadline is now plus the wait: a review's ``--timeout 1e10`` and
    ``--timeout-s 1e10`` raised OverflowError after the requests were built."""
    if (err := positive_error(flag, value)) is not None:
        return err
    if value is not None and value > MAX_WAIT_S:
        return f"{flag}={value} s is longer than a year ({MAX_WAIT_S:g} s)"
    return None


def seed_error(flag: str, value: int) -> str | None:
    """The error for ``flag``'s ``value`` outside torch's seeds (`torch.Generator.manual_seed`
    takes -2^63 .. 2^64 - 1; past them a traceback after the model loaded), or None."""
    if -2 ** 63 <= value < 2 ** 64:
        return None
    return f"{flag}={value} must be in -2^63 .. 2^64 - 1"


def out_file_error(flag: str, path: Path | None) -> str | None:
    """The error for ``flag``'s output file ``path`` that cannot be written, or None (also for
    None): a directory, or `_unwritable` (the writer makes missing parents). Checked before the
    work, which a review lost at its end (``calibrate --out`` a directory after the learning,
    ``tasks --out /proc/x/out.json`` after grading)."""
    if path is None:
        return None
    if path.is_dir():
        return f"{flag}={path} is a directory; give the file to write"
    return _unwritable(flag, path)


def out_dir_error(flag: str, path: Path) -> str | None:
    """The error for ``flag``'s output directory ``path`` that cannot be one, or None: a file, or
    `_unwritable`."""
    if path.exists() and not path.is_dir():
        return f"{flag}={path} is a file; give the directory to write to"
    return _unwritable(flag, path)


def _unwritable(flag: str, path: Path) -> str | None:
    """A parent of ``path`` that is a file, or a nearest existing parent this process cannot
    make a directory in (tried and removed: permission bits do not bind root, ``/proc`` does),
    as ``flag``'s error; else None. Creates nothing that stays."""
    if any(d.exists() and not d.is_dir() for d in path.parents):
        return f"{flag}={path}: a parent of it is a file"
    base = next(d for d in path.absolute().parents if d.exists())
    try:
        with tempfile.TemporaryDirectory(dir=base):
            pass
    except OSError as exc:
        return f"{flag}={path}: cannot write under {base} ({exc.strerror or exc})"
    return None
