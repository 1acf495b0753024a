"""HW4: the FlashAttention assignment (Homework 4) of the CS542200 Parallel Programming course, whose
test cases this package runs: its binary file format, its input range and its correctness rule.

Input file: three little-endian int32 ``B, N, d``, then for each batch ``Q``, ``K``, ``V``, each
``N x d`` float32 in row-major order (so the payload is a (B, 3, N, d) float32 array).
Output file: ``B * N * d`` float32, the (B, N, d) attention output, no header.

Inputs are read as zero-copy views of a read-only memory map, so even the largest case
(B·N·d < 56e6: a 672 MB file) is never duplicated in host memory. Outputs are written atomically:
a temporary file in the target's directory, fsync, then ``os.replace``; a failure leaves no
partial file and an existing file untouched.

The rule of HW4: inputs uniform in [-3, 3] (INPUT_RANGE), every output within 5e-3 of the exact answer
(MAX_ABS_ERROR). FULL_SHAPES are four HW4 test cases (t11, t22, t29, t30) of 4 to 66 million outputs
each: the maximum over that many outputs is where an imprecise kernel shows.

NaN in a payload is not rejected: it is read as is and, like every backend, attention propagates
it to the output rows that read it (all rows for a NaN in K or V at a visible key; the one row for
a NaN in Q).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

__all__ = [
    "FULL_SHAPES",
    "HW4FormatError",
    "INPUT_RANGE",
    "MAX_ABS_ERROR",
    "SUPPORTED_HEAD_DIMS",
    "read_hw4_header",
    "read_hw4",
    "read_hw4_output",
    "write_hw4_input",
    "write_hw4_output",
    "atomic_write",
    "check_writable",
]

# The HW4 rule: float32 inputs uniform in [-INPUT_RANGE, INPUT_RANGE], max |out - exact| <= MAX_ABS_ERROR.
INPUT_RANGE = 3.0
MAX_ABS_ERROR = 5e-3
# (B, N, d) of the HW4 test cases t11, t22, t29, t30.
FULL_SHAPES = ((13600, 128, 32), (500, 2048, 64), (4, 32768, 32), (2, 32768, 64))

HEADER_BYTES = 12
SUPPORTED_HEAD_DIMS = (32, 64, 128)  # cutlassfa's head dims; HW4 itself uses only 32 and 64
_F32 = np.dtype("<f4")
_I32 = np.dtype("<i4")
# Rows written per chunk so that writing never builds a second full copy of a large array.
_WRITE_CHUNK_BYTES = 64 << 20


class HW4FormatError(ValueError):
    """A file does not follow the HW4 format (bad header, wrong size, unsupported head dim)."""


def read_hw4_header(path: str | os.PathLike) -> tuple[int, int, int]:
    """Read and validate the header of an HW4 input file; return (B, N, d) as Python ints.

    Raises HW4FormatError if B, N or d is not positive, d is not one of SUPPORTED_HEAD_DIMS, or the
    file size is not exactly 12 + B·N·d·3·4 bytes (sizes use Python ints, so a header whose
    product would overflow 32- or 64-bit arithmetic cannot match a small file by wrap-around).
    """
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
        size = os.fstat(f.fileno()).st_size
    if len(raw) < HEADER_BYTES:
        raise HW4FormatError(f"{os.fspath(path)}: {size} bytes is too short for the 12-byte header")
    b, n, d = (int(x) for x in np.frombuffer(raw, dtype=_I32))
    if b <= 0 or n <= 0 or d <= 0:
        raise HW4FormatError(f"{os.fspath(path)}: header B={b}, N={n}, d={d} must all be positive")
    if d not in SUPPORTED_HEAD_DIMS:
        raise HW4FormatError(
            f"{os.fspath(path)}: head dim d={d} is not supported (supported: {SUPPORTED_HEAD_DIMS})"
        )
    expected = HEADER_BYTES + 3 * b * n * d * _F32.itemsize
    if size != expected:
        what = "truncated" if size < expected else "has trailing bytes"
        raise HW4FormatError(
            f"{os.fspath(path)}: file {what}: header B={b}, N={n}, d={d} needs {expected} bytes, "
            f"file has {size}"
        )
    return b, n, d


def read_hw4(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Map an HW4 input file; return (q, k, v), each a read-only (B, N, d) float32 view.

    The views share one ``np.memmap`` of shape (B, 3, N, d) (no copy): strides are
    (3·N·d·4, d·4, 4) bytes, so the last dim is contiguous as cutlassfa.forward requires.
    """
    b, n, d = read_hw4_header(path)
    mm = np.memmap(path, dtype=_F32, mode="r", offset=HEADER_BYTES, shape=(b, 3, n, d))
    return mm[:, 0], mm[:, 1], mm[:, 2]


def read_hw4_output(path: str | os.PathLike, shape: tuple[int, ...]) -> np.ndarray:
    """Read an HW4 output file (headerless float32) into an array of `shape`.

    Raises HW4FormatError if the file size is not exactly prod(shape)·4 bytes.
    """
    count = 1
    for s in shape:
        count *= int(s)
    size = os.path.getsize(path)
    if size != count * _F32.itemsize:
        raise HW4FormatError(
            f"{os.fspath(path)}: output of shape {tuple(shape)} needs {count * _F32.itemsize} bytes, "
            f"file has {size}"
        )
    return np.fromfile(path, dtype=_F32, count=count).reshape(shape)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Context manager yielding a binary file that replaces `path` only if the block succeeds.

    The data go to a hidden temporary in the same directory (so ``os.replace`` is an atomic rename
    on one filesystem), are fsync'ed, then renamed over `path`. On any exception the temporary is
    removed and `path` is left as it was. Errors name `path`, never the temporary.
    """
    path = os.fspath(path)
    check_writable(path)
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    # 0o666 filtered by the umask: the file gets the same permissions a plain open() would give.
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as error:
        raise type(error)(error.errno, error.strerror, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def check_writable(path: str | os.PathLike) -> None:
    """Raise the OSError that writing `path` would meet, naming `path`, without writing anything: its
    directory missing (FileNotFoundError), `path` a directory (IsADirectoryError), or no permission to
    create files beside it (PermissionError). Lets a command fail before a long computation."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    if path.endswith(os.sep) or os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, "No such directory", directory)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "Permission denied (cannot create files in this directory)", path)


def _fsync_dir(directory: str) -> None:
    """Make the rename durable; best effort (some filesystems refuse to fsync a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_rows(f: BinaryIO, arr: np.ndarray) -> None:
    """Write `arr` as little-endian float32 in C order, a bounded chunk of leading rows at a time."""
    if arr.ndim == 0 or arr.shape[0] == 0:
        f.write(np.ascontiguousarray(arr, dtype=_F32).tobytes())
        return
    row_bytes = max(1, arr[0].size * _F32.itemsize)
    step = max(1, _WRITE_CHUNK_BYTES // row_bytes)
    for r0 in range(0, arr.shape[0], step):
        f.write(np.ascontiguousarray(arr[r0 : r0 + step], dtype=_F32).data)


def write_hw4_input(path: str | os.PathLike, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """Write (B, N, d) arrays q, k, v as an HW4 input file, atomically (values cast to float32)."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if q.ndim != 3 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must be (B, N, d) of one shape, got {q.shape}, {k.shape}, {v.shape}")
    b, n, d = q.shape
    if min(b, n, d) <= 0 or max(b, n, d) > np.iinfo(np.int32).max:
        raise ValueError(f"B, N, d must be in [1, 2**31), got {q.shape}")
    with atomic_write(path) as f:
        f.write(np.array([b, n, d], dtype=_I32).tobytes())
        # Interleave per batch (Q, K, V) through a bounded chunk of batches at a time.
        step = max(1, _WRITE_CHUNK_BYTES // (3 * n * d * _F32.itemsize))
        for b0 in range(0, b, step):
            _write_rows(f, np.stack([q[b0 : b0 + step], k[b0 : b0 + step], v[b0 : b0 + step]], axis=1))


def write_hw4_output(path: str | os.PathLike, o: np.ndarray) -> None:
    """Write the attention output (any shape, normally (B, N, d)) as float32, atomically."""
    with atomic_write(path) as f:
        _write_rows(f, np.asarray(o))
