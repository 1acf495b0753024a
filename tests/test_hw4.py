"""The HW4 file format: round trips, header validation and atomic output."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutlassfa import hw4
from cutlassfa.hw4 import HW4FormatError, read_hw4, read_hw4_header, read_hw4_output, write_hw4_input, write_hw4_output


def write_raw(path, header, payload_floats=0, extra=b""):
    """A file with the int32 `header` followed by `payload_floats` float32 values and `extra` bytes."""
    with open(path, "wb") as f:
        f.write(struct.pack("<" + "i" * len(header), *header))
        f.write(np.arange(payload_floats, dtype="<f4").tobytes())
        f.write(extra)
    return path


def leftovers(directory, keep):
    return sorted(set(os.listdir(directory)) - set(keep))


# ---- round trips ------------------------------------------------------------------------------------


def test_input_round_trip_and_layout(tmp_path, rng):
    q, k, v = (rng.uniform(-3, 3, (3, 5, 32)).astype(np.float32) for _ in range(3))
    path = tmp_path / "case.in"
    write_hw4_input(path, q, k, v)
    assert path.stat().st_size == 12 + 3 * 3 * 5 * 32 * 4
    # Independent decoding of the layout: header, then per batch Q, K, V.
    raw = path.read_bytes()
    assert struct.unpack("<3i", raw[:12]) == (3, 5, 32)
    payload = np.frombuffer(raw[12:], dtype="<f4").reshape(3, 3, 5, 32)
    np.testing.assert_array_equal(payload[:, 0], q)
    np.testing.assert_array_equal(payload[:, 1], k)
    np.testing.assert_array_equal(payload[:, 2], v)

    rq, rk, rv = read_hw4(path)
    np.testing.assert_array_equal(rq, q)
    np.testing.assert_array_equal(rk, k)
    np.testing.assert_array_equal(rv, v)


def test_read_is_zero_copy_memmap(tmp_path, rng):
    q, k, v = (rng.standard_normal((4, 8, 64)).astype(np.float32) for _ in range(3))
    path = tmp_path / "case.in"
    write_hw4_input(path, q, k, v)
    rq, rk, rv = read_hw4(path)
    for x in (rq, rk, rv):
        assert isinstance(x.base, np.memmap)
        assert x.shape == (4, 8, 64) and x.dtype == np.float32
        assert x.strides == (3 * 8 * 64 * 4, 64 * 4, 4)  # last dim contiguous, batch stride 3·N·d
        assert not x.flags.writeable
    assert rq.base is rk.base is rv.base  # views of one mapping, not three copies
    assert rq.base.shape == (4, 3, 8, 64)


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 4), n=st.integers(1, 9), d=st.sampled_from(hw4.SUPPORTED_HEAD_DIMS), seed=st.integers(0, 2**32 - 1))
def test_round_trip_property(tmp_path_factory, b, n, d, seed):
    g = np.random.default_rng(seed)
    q, k, v = (g.standard_normal((b, n, d)).astype(np.float32) for _ in range(3))
    path = tmp_path_factory.mktemp("rt") / "x.in"
    write_hw4_input(path, q, k, v)
    assert read_hw4_header(path) == (b, n, d)
    for got, want in zip(read_hw4(path), (q, k, v)):
        np.testing.assert_array_equal(got, want)
    write_hw4_output(path.with_suffix(".out"), q)
    np.testing.assert_array_equal(read_hw4_output(path.with_suffix(".out"), (b, n, d)), q)


def test_write_input_in_chunks(tmp_path, rng, monkeypatch):
    # Chunks smaller than one batch entry: the file must not depend on the chunk size.
    monkeypatch.setattr(hw4, "_WRITE_CHUNK_BYTES", 100)
    q, k, v = (rng.standard_normal((5, 3, 32)).astype(np.float32) for _ in range(3))
    write_hw4_input(tmp_path / "a.in", q, k, v)
    write_hw4_output(tmp_path / "a.out", q)
    for got, want in zip(read_hw4(tmp_path / "a.in"), (q, k, v)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(read_hw4_output(tmp_path / "a.out", q.shape), q)


def test_output_round_trip_casts_to_float32(tmp_path, rng):
    o = rng.standard_normal((2, 7, 64))  # float64 in, float32 on disk
    write_hw4_output(tmp_path / "o", o)
    assert (tmp_path / "o").stat().st_size == o.size * 4
    np.testing.assert_array_equal(read_hw4_output(tmp_path / "o", o.shape), o.astype(np.float32))
    np.testing.assert_array_equal(np.fromfile(tmp_path / "o", dtype="<f4"), o.astype(np.float32).ravel())


def test_strided_output_is_written_in_c_order(tmp_path, rng):
    o = rng.standard_normal((3, 64, 5)).astype(np.float32).transpose(0, 2, 1)  # (3, 5, 64), not contiguous
    write_hw4_output(tmp_path / "o", o)
    np.testing.assert_array_equal(read_hw4_output(tmp_path / "o", (3, 5, 64)), o)


def test_output_size_mismatch(tmp_path):
    write_hw4_output(tmp_path / "o", np.zeros((2, 3, 32), dtype=np.float32))
    with pytest.raises(HW4FormatError, match="768"):
        read_hw4_output(tmp_path / "o", (2, 4, 32))


def test_nan_payload_is_read_as_is(tmp_path, rng):
    q, k, v = (rng.standard_normal((2, 4, 32)).astype(np.float32) for _ in range(3))
    q[1, 2, 5] = np.nan
    write_hw4_input(tmp_path / "nan.in", q, k, v)
    rq, _, _ = read_hw4(tmp_path / "nan.in")
    assert np.isnan(rq[1, 2, 5]) and np.isnan(rq).sum() == 1


# ---- header and size validation -----------------------------------------------------------------


def test_truncated_file(tmp_path):
    path = write_raw(tmp_path / "t.in", (2, 4, 32), payload_floats=2 * 3 * 4 * 32 - 1)
    expected = 12 + 2 * 3 * 4 * 32 * 4
    with pytest.raises(HW4FormatError, match="truncated") as info:
        read_hw4(path)
    assert str(expected) in str(info.value) and str(expected - 4) in str(info.value)


def test_trailing_bytes(tmp_path):
    path = write_raw(tmp_path / "t.in", (1, 2, 32), payload_floats=3 * 2 * 32, extra=b"\0")
    with pytest.raises(HW4FormatError, match="trailing"):
        read_hw4(path)


@pytest.mark.parametrize("size", [0, 5, 11])
def test_shorter_than_header(tmp_path, size):
    path = tmp_path / "short.in"
    path.write_bytes(b"\1" * size)
    with pytest.raises(HW4FormatError, match="header"):
        read_hw4(path)


@pytest.mark.parametrize("header", [(0, 4, 32), (2, 0, 32), (2, 4, 0), (-1, 4, 32), (2, -4, 32), (2, 4, -32)])
def test_non_positive_header(tmp_path, header):
    path = write_raw(tmp_path / "h.in", header, payload_floats=8)
    with pytest.raises(HW4FormatError, match="positive"):
        read_hw4(path)


@pytest.mark.parametrize("d", [1, 16, 48, 96, 256])
def test_unsupported_head_dim(tmp_path, d):
    path = write_raw(tmp_path / "d.in", (1, 2, d), payload_floats=3 * 2 * d)  # size itself consistent
    with pytest.raises(HW4FormatError, match="head dim"):
        read_hw4(path)


def test_header_whose_product_wraps_32_bits(tmp_path):
    # B·N = 24929·673 = 2^24 + 1, so B·N·d·3·4 = 768·(2^24 + 1) ≡ 768 (mod 2^32): with 32-bit
    # arithmetic this header would "match" a 780-byte file holding one (N=1, d=64) case.
    b, n, d = 24929, 673, 64
    assert (b * n * d * 12) % 2**32 == 768
    path = write_raw(tmp_path / "wrap.in", (b, n, d), payload_floats=3 * 64)
    with pytest.raises(HW4FormatError, match=str(12 + b * n * d * 12)):
        read_hw4(path)


def test_header_with_huge_values(tmp_path):
    big = 2**31 - 1
    path = write_raw(tmp_path / "huge.in", (big, big, 128), payload_floats=3 * 128)
    with pytest.raises(HW4FormatError, match="needs"):
        read_hw4(path)


def test_format_error_is_a_value_error():
    assert issubclass(HW4FormatError, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_hw4(tmp_path / "nope.in")


def test_write_input_rejects_bad_shapes(tmp_path):
    a = np.zeros((1, 2, 32), dtype=np.float32)
    with pytest.raises(ValueError):
        write_hw4_input(tmp_path / "x", a, a, np.zeros((1, 3, 32), dtype=np.float32))
    with pytest.raises(ValueError):
        write_hw4_input(tmp_path / "x", a[0], a[0], a[0])
    assert not (tmp_path / "x").exists()


# ---- atomic output ----------------------------------------------------------------------------------


def test_failure_mid_write_leaves_nothing(tmp_path, monkeypatch, rng):
    monkeypatch.setattr(hw4, "_WRITE_CHUNK_BYTES", 64)
    calls = {"n": 0}

    def fail_after_some_data(f, arr):
        # Write real data, then die part-way, like a full disk or a killed conversion.
        f.write(np.ascontiguousarray(arr[:1], dtype="<f4").data)
        calls["n"] += 1
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hw4, "_write_rows", fail_after_some_data)
    with pytest.raises(OSError, match="No space"):
        write_hw4_output(tmp_path / "o.out", rng.standard_normal((4, 8, 32)))
    assert calls["n"] == 1
    assert leftovers(tmp_path, []) == []  # neither the output nor the temporary


def test_failure_in_fsync_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "o.out"
    write_hw4_output(target, np.ones((1, 2, 32), dtype=np.float32))
    before = target.read_bytes()

    def broken_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(hw4.os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        write_hw4_output(target, np.zeros((1, 2, 32), dtype=np.float32))
    assert target.read_bytes() == before
    assert leftovers(tmp_path, ["o.out"]) == []


def test_interrupt_during_input_write(tmp_path, monkeypatch, rng):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hw4.np, "stack", interrupted)
    q = rng.standard_normal((2, 3, 32)).astype(np.float32)
    with pytest.raises(KeyboardInterrupt):
        write_hw4_input(tmp_path / "i.in", q, q, q)
    assert leftovers(tmp_path, []) == []


def test_output_permissions_follow_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_hw4_output(tmp_path / "o.out", np.zeros((1, 1, 32), dtype=np.float32))
    finally:
        os.umask(old)
    assert (tmp_path / "o.out").stat().st_mode & 0o777 == 0o644  # not the 0600 of a mkstemp file


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        write_hw4_output(tmp_path / "no" / "o.out", np.zeros((1, 1, 32), dtype=np.float32))
    assert info.value.filename == str(tmp_path / "no") and ".tmp" not in str(info.value)


def test_writing_over_a_directory_names_it(tmp_path):
    (tmp_path / "adir").mkdir()
    for target in (str(tmp_path / "adir"), str(tmp_path / "adir") + os.sep):
        with pytest.raises(IsADirectoryError) as info:
            write_hw4_output(target, np.zeros((1, 1, 32), dtype=np.float32))
        assert info.value.filename == target
    assert os.listdir(tmp_path / "adir") == [] and leftovers(tmp_path, ["adir"]) == []


def test_temporary_that_cannot_be_created_is_reported_under_the_users_name(tmp_path, monkeypatch):
    real_open = os.open

    def refuse(path, *args, **kwargs):
        if str(path).endswith(".tmp"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(hw4.os, "open", refuse)
    with pytest.raises(PermissionError) as info:
        write_hw4_output(tmp_path / "o.out", np.zeros((1, 1, 32), dtype=np.float32))
    assert info.value.filename == os.fspath(tmp_path / "o.out")


def test_hw4_rule_constants():
    assert hw4.MAX_ABS_ERROR == 5e-3 and hw4.INPUT_RANGE == 3.0
    assert hw4.FULL_SHAPES == ((13600, 128, 32), (500, 2048, 64), (4, 32768, 32), (2, 32768, 64))
