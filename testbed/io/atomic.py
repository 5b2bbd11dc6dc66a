"""Atomic file and directory writes: results appear whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> Path:
    """Write data to path via a temporary file `.NAME.PID.XXXX.tmp` in the same directory
    and a rename.

    The file gets ordinary permissions (0644 less the umask: never writable by others,
    even under umask 000), not mkstemp's private 0600; pass mode=0o600 for a secret.
    """
    from testbed.io.trusted import make_dirs

    target = Path(path)
    make_dirs(target.parent)
    # The writer's PID in the name: a file left by a writer killed mid-write (even an empty
    # one) names its process, so a cleaner can tell a write still going on from debris.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp",
                               dir=target.parent)
    try:
        os.fchmod(fd, (0o644 & ~_umask()) if mode is None else mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int | None = None) -> Path:
    """Write text (UTF-8) to path atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_json(path: str | os.PathLike[str], data: Any, mode: int | None = None) -> Path:
    """Write data as indented JSON atomically (mode=0o600 for one holding a secret)."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n", mode)


def check_out_target(target: Path) -> None:
    """Refuse an --out that LightPipe did not write: an existing file, or a non-empty
    directory without a manifest.json (never replaced, never wiped)."""
    from testbed.errors import InputError

    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise InputError("--out", f"{target} exists and is not a directory; not replaced")
    if target.is_dir() and any(target.iterdir()) and not (target / "manifest.json").is_file():
        raise InputError("--out", f"{target} is a non-empty directory that is not a LightPipe "
                         "run (no manifest.json); not replaced")


def make_stage(target: Path) -> Path:
    """A new hidden sibling `.NAME.PID.XXXX.partial` of target, with ordinary permissions."""
    from testbed.io.trusted import make_dirs

    make_dirs(target.parent)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".partial",
                                  dir=target.parent))
    # mkdtemp makes the directory private (0700); a run directory is ordinary output,
    # readable by the umask's leave but never writable by others (not even umask 000:
    # another user could plant links for root's writes there).
    stage.chmod(0o755 & ~_umask())
    return stage


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a staging directory that replaces `out` only if the block succeeds.

    Files are written into a hidden sibling directory; on success it is swapped in for
    the old `out` (if any, which is then removed), so readers never see a half-written
    directory. On failure the staging directory is removed and `out` is left as it was.
    One writer per `out` (testbed.io.outdir.out_lock); the swap never leaves `out` missing
    where the kernel can exchange two directories (outdir.install_dir).
    """
    from testbed.io.outdir import install_dir, out_lock, remove_stale_siblings

    target = Path(out).resolve()
    with out_lock(target):
        check_out_target(target)
        remove_stale_siblings(target)  # what killed writers of `out` left beside it
        stage = make_stage(target)
        try:
            yield stage
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        old = install_dir(stage, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
