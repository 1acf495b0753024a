"""`cutlassfa bench`: the exact FLOP count, interleaved timing, median, skip rules, accuracy marking and
JSON schema on the CPU (cpu backend on tiny shapes, a fake timer where the numbers must be exact); the
paged and varlen grids (cases, inputs, the anchors' dense equivalent, twins); the per-call overhead
benchmark; tiny real runs on a GPU."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil

import numpy as np
import pytest

import cutlassfa
from cutlassfa.reference import rel_l2
from cutlassfa import bench
from cutlassfa._inputs import Case, Unsupported, Variant

ROW_KEYS = {"backend", "dtype", "B", "H", "Nq", "Nk", "d", "causal", "ms", "tflops", "rel_err", "note"}


class FakeTimer:
    """Runs every call in round-robin order (so outputs exist) but reports the given durations, cycled
    per contender; records the order of the calls."""

    name = "fake"

    def __init__(self, ms):
        self.ms, self.calls, self.order = list(ms), {}, []

    def time(self, calls, rounds):
        out = [[] for _ in calls]
        for r, c in bench.round_robin(len(calls), rounds):
            calls[c](r)
            self.order.append(c)
            n = self.calls.get(c, 0)
            out[c].append(self.ms[n % len(self.ms)])
            self.calls[c] = n + 1
        return out


def _args(argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def _run(argv, timer=None):
    """bench.run on the CPU with the numpy frame; `timer` replaces every timer."""
    return bench.run(_args(argv), frame=bench.Frame(), timer_for=(lambda r: timer) if timer else None)


# ---------------------------------------------------------------------------------------------------
# Pure pieces.
# ---------------------------------------------------------------------------------------------------
def _pairs_by_brute_force(nq, nk, causal, window=None):
    i = np.arange(nq)[:, None] + (nk - nq)
    j = np.arange(nk)[None, :]
    seen = np.ones((nq, nk), bool)
    if causal:
        seen &= j <= i
    if window is not None:
        left, right = window
        if left is not None:
            seen &= j >= i - left
        if right is not None:
            seen &= j <= i + right
    return int(seen.sum())


def test_flop_formula():
    assert bench.attention_flops(2, 16, 1024, 1024, 64, False) == 4 * 2 * 16 * 1024 * 1024 * 64
    assert bench.attention_flops(1, 1, 3, 5, 32, False) == 4 * 3 * 5 * 32
    # Causal with Nq = Nk: the lower triangle with its diagonal, N (N + 1) / 2 pairs (not N^2 / 2).
    assert bench.attention_flops(2, 16, 1024, 1024, 64, True) == 4 * 2 * 16 * 64 * (1024 * 1025 // 2)
    # Bottom-right causal, Nq < Nk: 100 x 300 sees 0.835 of the dense pairs, not 0.5.
    assert bench.visible_pairs(100, 300, causal=True) == 25050
    assert bench.visible_pairs(300, 100, causal=True) == 5050  # the first 200 queries see no key
    # TARGETS.md: cudnn fp16 (32, 16, 1024, 64) non-causal, 0.371 ms -> 370 TFLOP/s.
    assert bench.tflops(Case("float16", 32, 16, 16, 1024, 1024, 64, False), 0.371) == pytest.approx(370.4, abs=0.1)


@pytest.mark.parametrize("nq,nk", [(1, 1), (7, 7), (5, 13), (13, 5), (64, 200), (200, 64)])
@pytest.mark.parametrize("window", [None, (3, 0), (0, 2), (4, 4), (None, 1)])
def test_visible_pairs_match_the_mask(nq, nk, window):
    for causal in (False, True):
        assert bench.visible_pairs(nq, nk, causal=causal, window=window) == \
            _pairs_by_brute_force(nq, nk, causal, window)


def test_varlen_flops_sum_the_sequences():
    lengths = [(5, 13), (100, 100), (1, 40)]
    expected = sum(bench.attention_flops(1, 8, nq, nk, 64, True) for nq, nk in lengths)
    assert bench.varlen_flops(8, 64, lengths, causal=True) == expected


def test_round_robin_rotates_the_first_contender():
    assert bench.round_robin(3, 3) == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0), (2, 2), (2, 0), (2, 1)]
    times = bench.WallTimer().time([lambda i: None, lambda i: None], 4)
    assert [len(t) for t in times] == [4, 4] and all(x >= 0 for t in times for x in t)


def test_median():
    assert bench.median([3.0, 1.0, 2.0]) == 2.0
    assert bench.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert bench.median([1.0] * 19 + [1000.0]) == 1.0  # one slow outlier does not move it
    with pytest.raises(ValueError):
        bench.median([])


def test_skip_rules():
    tiny = Case("float32", 1, 1, 1, 64, 64, 32, False)
    big = Case("float16", 2, 16, 16, 16384, 16384, 128, False)
    gib = 2**30
    assert bench.skip_reason("cpu", tiny, free_bytes=None, max_call_s=2) is None
    assert "numpy backend" in bench.skip_reason("cpu", big, free_bytes=None, max_call_s=2)
    # naive holds B*H*Nq*Nk*4 bytes of scores: 32 GiB here, > 80 GiB / 4.
    assert "score matrix" in bench.skip_reason("naive", big, free_bytes=80 * gib, max_call_s=2)
    assert bench.skip_reason("naive", tiny, free_bytes=80 * gib, max_call_s=2) is None
    assert bench.skip_reason("tensorcore", big, free_bytes=80 * gib, max_call_s=2) is None
    # A rate measured earlier in the run predicts the time: 2.25 TFLOP at 1 TFLOP/s is 2.25 s.
    why = bench.skip_reason("small_tile", big, free_bytes=80 * gib, max_call_s=2, rate_tflops=1.0)
    assert why and "predicted" in why and "measured" in why
    assert bench.skip_reason("small_tile", big, free_bytes=80 * gib, max_call_s=2, rate_tflops=100.0) is None


def test_rotation_copies():
    l2 = 50 * 2**20
    assert bench.rotation_copies(200 * 2**20, l2, None) == 1  # already 4x L2
    assert bench.rotation_copies(10 * 2**20, l2, None) == 15  # 15 x 10 MB >= 3 x 50 MB
    assert bench.rotation_copies(1024, l2, None) == bench.MAX_COPIES
    assert bench.rotation_copies(10 * 2**20, l2, 80 * 2**20) == 2  # bounded by free memory / 4


def test_peak_mapping():
    assert bench.peak_of("sdpa_flash", "float16") == "fp16_gemm"
    assert bench.peak_of("tensorcore", "bfloat16") == "bf16_gemm"
    assert bench.peak_of("tensorcore", "float32") == "fp16_gemm"  # fp32 inputs run as fp16 MMA
    assert bench.peak_of("small_tile", "float32") == "fp32_gemm"
    assert bench.peak_of("cpu", "float32") is None
    assert {bench.peak_of(b, d) for b in bench.ALL_BACKENDS for d in bench.DTYPES} - {None} <= set(bench.PEAKS)


def test_parse_shape_and_grids():
    assert bench.parse_shape("2,16,1024,64") == (2, 16, 16, 1024, 1024, 64)
    assert bench.parse_shape("2,16:4,512,1024,128") == (2, 16, 4, 512, 1024, 128)
    for bad in ("2,16,64", "2,16:3,128,64", "a,b,c,d"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_shape(bad)
    grid = bench.default_grid()
    assert len(grid) == 4 + 2 * 2 * 3 * 2
    assert {(c.B, c.Nq, c.d) for c in grid if c.dtype == "float32"} == set(bench.HW4_SHAPES)
    assert all(c.H == 1 and not c.causal for c in grid if c.dtype == "float32")
    assert len(bench.quick_grid()) < len(grid)
    args = _args(["--shape", "2,4,128,64", "--shape", "1,8:2,64,256,32", "--dtypes", "float16,bfloat16",
                  "--causal", "both"])
    assert len(bench.select_cases(args)) == 2 * 2 * 2
    assert bench.select_backends(["tensorcore", "sdpa"]) == ["tensorcore"] + list(bench.SDPA_BACKENDS)


def test_head_dims_option_sets_the_grid_head_dims():
    cases = bench.select_cases(_args(["--head-dims", "96,192,256"]))
    assert {c.d for c in cases if c.dtype != "float32"} == {96, 192, 256}
    assert len(cases) == len(bench.HW4_SHAPES) + 2 * 3 * len(bench.LLM_SHAPES) * 2
    assert {c.d for c in bench.select_cases(_args(["--quick", "--head-dims", "128"])) if c.dtype != "float32"} == {128}
    assert {c.d for c in bench.select_cases(_args(["--decode", "--head-dims", "256"]))} == {256}
    for bad in ("a", "0", ""):
        with pytest.raises(SystemExit):
            _args(["--head-dims", bad])


def test_decode_grid_is_the_inference_grid():
    grid = bench.decode_grid()
    assert bench.select_cases(_args(["--decode"])) == grid
    assert bench.select_cases(_args(["--decode", "--quick"])) == bench.decode_quick_grid()
    assert bench.select_cases(_args(["--decode", "--dtypes", "float16", "--causal", "yes"])) == [
        c for c in grid if c.dtype == "float16" and c.causal]
    kv_bytes = [2 * c.B * c.Hk * c.Nk * c.d * 2 for c in grid]
    assert max(kv_bytes) <= bench.DECODE_MAX_KV_BYTES
    assert all(c.H == 32 and (c.Nq, c.causal) in {(1, False), (4, True)} for c in grid)
    every = {(dt, d, hk, b, nk, nq) for dt in ("bfloat16", "float16") for d in (128, 64) for hk in (32, 8, 4)
             for b in (1, 8, 64) for nk in (2048, 16384, 131072) for nq in (1, 4)}
    present = {(c.dtype, c.d, c.Hk, c.B, c.Nk, c.Nq) for c in grid}
    left_out = every - present
    # only caches over 32 GiB are left out (MHA at B = 64 with 128k keys)
    assert left_out and all(2 * b * hk * nk * d * 2 > bench.DECODE_MAX_KV_BYTES for _, d, hk, b, nk, _ in left_out)
    assert len(grid) == len(every) - len(left_out)


def test_window_option_marks_every_case_and_adds_the_flex_anchor():
    assert bench.parse_window("1024,0") == (1024, 0) and bench.parse_window("-1,7") == (-1, 7)
    for bad in ("5", "a,b", "-2,0", "3,-5"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_window(bad)
    cases = bench.select_cases(_args(["--shape", "1,2,256,64", "--window", "32,0", "--causal", "both"]))
    assert len(cases) == 2 and all(c.variant.window == (32, 0) for c in cases)
    assert bench.FLEX not in bench.select_backends(None)
    assert bench.FLEX in bench.select_backends(None, flex=True)
    assert bench.select_backends(["cpu"], flex=True) == ["cpu"]
    # the visible pairs of the window, not the dense count
    case = cases[1]
    assert case.causal and bench.tflops(case, 1.0) * 1e9 == bench.attention_flops(1, 2, 256, 256, 64, True, (32, 0))


def test_read_is_a_default_row_of_decode_runs_only(monkeypatch):
    assert bench.READ in bench.select_backends(None, decode=True)
    assert bench.READ not in bench.select_backends(None) and bench.READ not in bench.select_backends(None, flex=True)
    assert bench.select_backends(["tensorcore"], decode=True) == ["tensorcore"]
    assert bench.select_backends(["read", "cpu"]) == ["read", "cpu"]
    assert bench.peak_of(bench.READ, "bfloat16") is None  # no arithmetic to compare with a GEMM
    runners, unavailable = bench.make_runners([bench.READ], bench.Frame())
    assert runners == [] and unavailable == {bench.READ: "needs PyTorch with CUDA"}
    # The command asks for it by default with --decode only.
    asked = []
    monkeypatch.setattr(bench.cli, "make_runners", lambda names, frame: (asked.append(list(names)), ([], {}))[1])
    assert _run(["--decode", "--quick", "--no-progress"]) == 2 and _run(["--quick", "--no-progress"]) == 2
    assert bench.READ in asked[0] and bench.READ not in asked[1]


# ---------------------------------------------------------------------------------------------------
# Whole runs on the CPU (cpu backend, tiny shapes).
# ---------------------------------------------------------------------------------------------------
def test_json_schema_with_fake_timer(tmp_path, capsys):
    timer = FakeTimer([2.0, 1.0, 3.0])
    path = tmp_path / "bench.json"
    code = _run(["--shape", "2,2,64,32", "--shape", "1,4:2,33,70,64", "--dtypes", "float32", "--causal", "both",
                 "--backends", "cpu", "--repeats", "21", "--warmup", "2", "--no-progress", "--json", str(path)],
                timer)
    assert code == 0
    table = capsys.readouterr().out
    assert "| cpu" in table and "TFLOP/s" in table and "GB/s" in table

    doc = json.loads(path.read_text())
    assert {"gpu", "commit", "dirty", "commit_source", "created", "software", "peaks", "rows"} <= set(doc)
    assert doc["gpu"] is None or {"name", "compute_capability", "multiprocessors"} <= set(doc["gpu"])
    assert isinstance(doc["commit"], str) and doc["commit"]
    assert doc["created"][:2] == "20" and "T" in doc["created"]
    assert doc["settings"]["interleaved"] is True and doc["passed"] is True
    assert len(doc["rows"]) == 4
    for row in doc["rows"]:
        assert ROW_KEYS <= set(row)
        assert row["backend"] == "cpu" and row["dtype"] == "float32" and row["status"] == "ok"
        assert row["ms"] == 2.0 and row["repeats"] == 21  # median of 2, 1, 3 cycled
        flops = bench.attention_flops(row["B"], row["H"], row["Nq"], row["Nk"], row["d"], row["causal"])
        assert row["flops"] == flops and row["tflops"] == pytest.approx(flops / 2e-3 / 1e12)
        # q and o (B, H, Nq, d), k and v (B, Hk, Nk, d) in float32, once each
        moved = 4 * row["d"] * (2 * row["B"] * row["H"] * row["Nq"] + 2 * row["B"] * row["Hk"] * row["Nk"])
        assert row["bytes"] == moved and row["gbps"] == pytest.approx(moved / 2e-3 / 1e9)
        assert row["rel_err"] < 1e-5
        assert row["pct_peak"] is None and row["peak"] is None
    assert {(r["Nq"], r["Nk"], r["H"], r["Hk"]) for r in doc["rows"]} == {(64, 64, 2, 2), (33, 70, 4, 2)}


def test_real_timer_and_reference_on_cpu(tmp_path):
    path = tmp_path / "bench.json"
    code = _run(["--shape", "2,2,128,32", "--dtypes", "float16", "--backends", "cpu", "--repeats", "3",
                 "--no-progress", "--json", str(path)])
    assert code == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert row["status"] == "ok" and row["ms"] > 0 and row["tflops"] > 0
    assert 0 < row["rel_err"] < 3e-3


def test_skipped_rows_say_why(tmp_path, capsys):
    path = tmp_path / "bench.json"
    code = _run(["--shape", "4,16,4096,128", "--backends", "cpu", "--no-progress", "--json", str(path)],
                FakeTimer([1.0]))
    assert code == 0
    assert "skipped: " in capsys.readouterr().out
    (row,) = json.loads(path.read_text())["rows"]
    assert row["status"] == "skipped" and row["ms"] is None and row["tflops"] is None and row["rel_err"] is None
    assert "numpy backend" in row["note"]


def test_first_call_too_slow_is_skipped(tmp_path):
    path = tmp_path / "bench.json"
    assert _run(["--shape", "1,1,64,32", "--backends", "cpu", "--max-call-s", "1", "--no-progress",
                 "--json", str(path)], FakeTimer([5000.0])) == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert row["status"] == "skipped" and "first call took 5 s" in row["note"]


def test_a_slow_first_call_alone_does_not_skip_a_row():
    """A first call over --max-call-s may be one-time setup (cuDNN's plan per shape): a fast second call
    keeps the row; two slow ones skip it."""
    from cutlassfa.reference import attention_reference

    def exact(case):
        return lambda q, k, v: attention_reference(q, k, v, causal=case.causal)[0]

    case = Case("float32", 1, 2, 2, 8, 32, 16, False)
    (row,) = bench.bench_case(case, [bench.Runner("setup", exact, on_gpu=False)], bench.Frame(),
                              bench.Settings(repeats=3, warmup=1, max_call_s=1.0), rates={},
                              timer_for=lambda r: FakeTimer([5000.0, 1.0]))
    assert row.status == "ok" and row.rel_err < 1e-12
    (row,) = bench.bench_case(case, [bench.Runner("slow", exact, on_gpu=False)], bench.Frame(),
                              bench.Settings(repeats=3, warmup=1, max_call_s=1.0), rates={},
                              timer_for=lambda r: FakeTimer([5000.0, 3000.0]))
    assert row.status == "skipped" and "first call took 3 s" in row.note


def _raising(error):
    """A runner's prepare whose calls raise `error`."""
    def prepare(case):
        def call(q, k, v):
            raise error
        return call
    return prepare


def test_refusing_backend_is_unsupported_not_an_error():
    refuse = _raising(NotImplementedError("float32 is not supported"))
    crash = _raising(RuntimeError("illegal memory access"))

    case = Case("float32", 1, 2, 2, 64, 64, 32, False)
    runners = [bench.Runner("refuser", refuse, on_gpu=False), bench.Runner("crasher", crash, on_gpu=False)]
    rows = bench.bench_case(case, runners, bench.Frame(), bench.Settings(repeats=3, warmup=1), rates={},
                            timer_for=lambda r: FakeTimer([1.0]))
    assert [r.status for r in rows] == ["unsupported", "error"]
    assert "not supported" in rows[0].note and "illegal memory access" in rows[1].note


def test_measured_rate_predicts_the_next_skip():
    """After a slow measurement, a much larger shape of the same backend is skipped without a call."""
    calls = []

    def slow(case):
        def call(q, k, v):
            calls.append(case)
            return np.zeros(q.shape, q.dtype)
        return call

    runner = bench.Runner("slowpoke", slow, on_gpu=False)
    settings = bench.Settings(repeats=3, warmup=1, max_call_s=2.0, accuracy=False)
    rates: dict = {}
    small = Case("float32", 1, 1, 1, 64, 64, 32, False)
    bench.bench_case(small, [runner], bench.Frame(), settings, rates=rates, timer_for=lambda r: FakeTimer([100.0]))
    assert rates[("slowpoke", "float32")] == pytest.approx(bench.tflops(small, 100.0))
    n = len(calls)
    large = Case("float32", 1, 1, 1, 4096, 4096, 32, False)  # 4096x the FLOPs: ~400 s predicted
    (row,) = bench.bench_case(large, [runner], bench.Frame(), settings, rates=rates,
                              timer_for=lambda r: FakeTimer([100.0]))
    assert row.status == "skipped" and "predicted" in row.note and len(calls) == n


def _cpu_runner(name, noise=0.0, seen=None):
    """A runner over the cpu backend that adds `noise` (relative) to its output and logs its calls."""
    def prepare(case):
        def call(q, k, v):
            if seen is not None:
                seen.append(name)
            out = cutlassfa.forward(q, k, v, causal=case.causal, backend="cpu")
            return (out.astype(np.float64) * (1 + noise)).astype(out.dtype)
        return call
    return bench.Runner(name, prepare, on_gpu=False)


def test_contenders_are_timed_interleaved():
    """Round robin per repetition: every contender once per round, not one contender's block then the
    next; each row is the median of its own rounds."""
    seen: list = []
    timer = FakeTimer([1.0, 5.0, 3.0])
    case = Case("float32", 1, 2, 2, 40, 40, 32, False)
    runners = [_cpu_runner("a", seen=seen), _cpu_runner("b", seen=seen), _cpu_runner("c", seen=seen)]
    rows = bench.bench_case(case, runners, bench.Frame(), bench.Settings(repeats=6, warmup=2), rates={},
                            timer_for=lambda r: timer)
    assert [r.status for r in rows] == ["ok"] * 3 and all(r.repeats == 6 for r in rows)
    timed = seen[3:]  # after the three first calls: one warm-up round, then six timed rounds
    assert len(timed) == 7 * 3
    for r in range(7):
        assert sorted(timed[3 * r:3 * r + 3]) == ["a", "b", "c"]
    assert timed[3:6] != timed[6:9]  # the starting contender rotates from round to round
    assert all(row.ms == 3.0 for row in rows)  # median of 1, 5, 3 cycled over each contender's own calls


def test_a_failing_contender_drops_out_and_the_others_are_timed():
    def flaky(case):
        calls = []
        def call(q, k, v):
            calls.append(1)
            if len(calls) > 2:
                raise RuntimeError("illegal memory access")
            return cutlassfa.forward(q, k, v, backend="cpu")
        return call

    case = Case("float32", 1, 1, 1, 32, 32, 32, False)
    runners = [_cpu_runner("good"), bench.Runner("flaky", flaky, on_gpu=False)]
    timer = FakeTimer([1.0])
    rows = bench.bench_case(case, runners, bench.Frame(), bench.Settings(repeats=3, warmup=2), rates={},
                            timer_for=lambda r: timer)
    assert [r.status for r in rows] == ["ok", "error"] and "illegal memory access" in rows[1].note


def test_inaccurate_row_is_marked_and_fails_the_run(tmp_path, monkeypatch, capsys):
    """An output 1 % off (far beyond the cpu backend's 1e-5 fp32 bound) is timed, marked INACCURATE and
    makes the command exit 1."""
    real = cutlassfa.forward
    monkeypatch.setattr(cutlassfa, "forward", lambda *a, **kw: real(*a, **kw) * np.float32(1.01))
    path = tmp_path / "bench.json"
    code = _run(["--shape", "1,2,64,32", "--dtypes", "float32", "--backends", "cpu", "--repeats", "2",
                 "--no-progress", "--json", str(path)], FakeTimer([1.0]))
    assert code == 1
    captured = capsys.readouterr()
    assert "INACCURATE" in captured.out and "FAILED" in captured.err
    doc = json.loads(path.read_text())
    (row,) = doc["rows"]
    assert doc["passed"] is False and row["status"] == "inaccurate" and row["ms"] == 1.0
    assert row["rel_err"] > row["rel_bound"] == pytest.approx(1e-5)


def _sums(case):
    return lambda q, k, v: (k.sum(), v.sum())


def test_a_row_that_is_not_attention_is_timed_but_not_checked():
    """read's output is no attention: its row is timed, ok, with GB/s but no rel-L2, TFLOP/s or peak; an
    attention row of the same case, 1 % off, is checked and marked. The table and the JSON take the row as
    it is."""
    from cutlassfa.reference import attention_reference

    def wrong(case):
        return lambda q, k, v: attention_reference(q, k, v, causal=case.causal)[0] * 1.01

    case = Case("float32", 1, 4, 2, 1, 96, 32, False)
    runners = [bench.Runner(bench.READ, _sums, on_gpu=False, attention=False),
               bench.Runner("wrong", wrong, on_gpu=False)]
    read_row, wrong_row = bench.bench_case(case, runners, bench.Frame(), bench.Settings(repeats=3, warmup=1),
                                           rates={}, timer_for=lambda r: FakeTimer([2.0]))
    assert read_row.status == "ok" and read_row.ms == 2.0 and read_row.rel_err is None and read_row.rel_bound is None
    assert read_row.peak is None and read_row.tflops is None
    assert read_row.gbps == pytest.approx(bench.measure.case_bytes(case) / 2e-3 / 1e9)
    assert wrong_row.status == "inaccurate" and wrong_row.rel_err > wrong_row.rel_bound
    assert "| read" in bench.report.results_table([read_row])
    assert json.loads(json.dumps(read_row.to_json()))["rel_err"] is None


def test_rows_that_are_not_attention_need_no_reference(monkeypatch):
    def no_reference(*args):
        raise AssertionError("reference computed for rows that are not attention")

    monkeypatch.setattr(bench.measure, "reference_sample", no_reference)
    case = Case("float32", 1, 2, 2, 1, 64, 32, False)
    (row,) = bench.bench_case(case, [bench.Runner(bench.READ, _sums, on_gpu=False, attention=False)], bench.Frame(),
                              bench.Settings(repeats=2, warmup=1), rates={}, timer_for=lambda r: FakeTimer([1.0]))
    assert row.status == "ok" and row.rel_err is None


def test_a_failing_read_row_does_not_fail_the_run():
    """read is not ours: an error of it is reported, not a failure; PyTorch's refusal is `unsupported`, as
    for an anchor."""
    from cutlassfa.bench.cli import _verdict

    refuse = _raising(RuntimeError("int64 sum is not supported on this device"))
    crash = _raising(RuntimeError("illegal memory access"))

    case = Case("float32", 1, 2, 2, 1, 64, 32, False)
    rows = [bench.bench_case(case, [bench.Runner(bench.READ, prepare, on_gpu=False, attention=False)], bench.Frame(),
                             bench.Settings(repeats=2, warmup=1), rates={}, timer_for=lambda r: FakeTimer([1.0]))[0]
            for prepare in (refuse, crash)]
    assert [r.status for r in rows] == ["unsupported", "error"]
    assert _verdict(rows) == 0


def test_json_or_plot_into_a_missing_folder_fails_at_once(tmp_path, capsys):
    for option in ("--json", "--plot"):
        if option == "--plot" and importlib.util.find_spec("matplotlib") is None:
            continue
        code = _run(["--shape", "1,1,64,32", "--backends", "cpu", "--no-progress", option,
                     str(tmp_path / "missing" / "out")], FakeTimer([1.0]))
        captured = capsys.readouterr()
        assert code == 2 and str(tmp_path / "missing") in captured.err and "| cpu" not in captured.out


def test_overhead_on_the_cpu(tmp_path, capsys):
    """Without a GPU only the numpy path runs; the device paths and the HW4 synchronization rows say why
    not. The JSON carries the provenance like the bench's."""
    path = tmp_path / "overhead.json"
    assert _run(["--overhead", "--overhead-calls", "30", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "µs per call" in out and "ms synchronized" in out
    doc = json.loads(path.read_text())
    assert doc["schema"] == "cutlassfa-bench-overhead/1" and doc["commit"] and doc["settings"]["calls"] == 30
    (numpy_row,) = [r for r in doc["tiny"] if r["path"] == "numpy"]
    assert numpy_row["status"] == "ok" and numpy_row["calls"] == 30 and numpy_row["us_per_call"] > 0
    assert numpy_row["shape"] == [1, 1, 16, 64] and numpy_row["dtype"] == "float16"
    assert {tuple(r["shape"]) for r in doc["synchronized"]} == set(bench.HW4_SHAPES)
    if not cutlassfa.backends()["small_tile"].available:
        assert all(r["status"] == "unavailable" and r["note"] and r["sm_clock_mhz"] is None
                   for r in doc["synchronized"])


def test_sm_clock_is_read_from_nvidia_smi_or_none(monkeypatch):
    """The overhead rows' clock: nvidia-smi's clocks.sm as a number, None where nvidia-smi is missing or
    says [N/A]."""
    from cutlassfa import _provenance

    fields = {"name": "GPU", "driver_version": "1", "clocks.sm": "1695", "clocks.mem": "3201",
              "clocks.max.sm": "1980", "clocks.max.mem": "3201", "temperature.gpu": "50", "power.limit": "700"}

    class Done:
        returncode = 0
        stdout = ", ".join(fields[k] for k in _provenance._NVIDIA_SMI_FIELDS) + "\n"

    monkeypatch.setattr(_provenance.shutil, "which", lambda exe: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(_provenance.subprocess, "run", lambda *a, **k: Done())
    assert _provenance.sm_clock_mhz() == 1695.0
    fields["clocks.sm"] = "[N/A]"
    Done.stdout = ", ".join(fields[k] for k in _provenance._NVIDIA_SMI_FIELDS) + "\n"
    assert _provenance.sm_clock_mhz() is None
    monkeypatch.setattr(_provenance.shutil, "which", lambda exe: None)
    assert _provenance.sm_clock_mhz() is None


def test_wall_per_call_counts_every_call():
    from cutlassfa.bench.overhead import wall_per_call

    calls, syncs = [], []
    seconds = wall_per_call(lambda: calls.append(1), 50, lambda: syncs.append(1))
    assert len(calls) == 50 and len(syncs) == 1 and seconds > 0
    wall_per_call(lambda: calls.append(1), 10, lambda: syncs.append(1), sync_each=True)
    assert len(calls) == 60 and len(syncs) == 1 + 11


def test_no_backend_or_bad_options_exit_2(capsys):
    assert _run(["--quick", "--backends", "nope", "--no-progress"]) == 2
    assert _run(["--quick", "--dtypes", "float8", "--no-progress"]) == 2
    assert _run(["--quick", "--repeats", "0", "--no-progress"]) == 2
    # Without a GPU the GPU backends and SDPA are reported unavailable, not crashed on.
    status = cutlassfa.backends()
    if not status["tensorcore"].available:
        assert _run(["--quick", "--backends", "tensorcore,sdpa", "--no-progress"]) == 2
        assert "no backend can run here" in capsys.readouterr().err


def test_plot(tmp_path, capsys):
    path = tmp_path / "bench.png"
    argv = ["--shape", "1,1,64,32", "--backends", "cpu", "--repeats", "2", "--no-progress", "--plot", str(path)]
    if importlib.util.find_spec("matplotlib") is None:
        assert _run(argv, FakeTimer([1.0])) == 2
        assert "matplotlib" in capsys.readouterr().err
        return
    assert _run(argv, FakeTimer([1.0])) == 0
    assert path.read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------------------------------------
# A tiny real run on a GPU.
# ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_tiny_real_bench_on_gpu(tmp_path):
    if not any(s.available for n, s in cutlassfa.backends().items() if n != "cpu"):
        pytest.skip("no GPU backend available: " + cutlassfa.backends()["small_tile"].reason)
    path = tmp_path / "bench.json"
    code = bench.main(["--shape", "2,4,256,64", "--shape", "1,4:2,100,300,64", "--dtypes", "float16,float32",
                       "--causal", "both", "--repeats", "3", "--warmup", "1", "--no-peaks", "--no-progress",
                       "--json", str(path)])
    assert code == 0
    doc = json.loads(path.read_text())
    assert doc["gpu"] and doc["gpu"]["multiprocessors"] > 0 and doc["gpu"]["driver_version"]
    assert doc["gpu"]["nvidia_smi"] is None or doc["gpu"]["nvidia_smi"]["clocks_max_sm"]
    assert "cudnn" in doc["software"] and doc["passed"] is True
    ours = [r for r in doc["rows"] if r["backend"] in ("tensorcore", "large_tile", "small_tile", "naive")]
    assert ours and all(r["status"] == "ok" for r in ours), ours
    for r in ours:
        if r["status"] == "ok":
            assert r["ms"] > 0 and r["tflops"] > 0 and r["rel_err"] < 2e-2
    sdpa = [r for r in doc["rows"] if r["backend"].startswith("sdpa_")]
    assert all(r["status"] != "error" for r in sdpa), sdpa


@pytest.mark.gpu
def test_sink_rows_on_gpu(tmp_path):
    """tensorcore with and without sinks and ALiBi, interleaved, all accurate (and fa4's rows when it is
    installed)."""
    if not cutlassfa.backends()["tensorcore"].available:
        pytest.skip("tensorcore: " + cutlassfa.backends()["tensorcore"].reason)
    path = tmp_path / "bench.json"
    code = bench.main(["--shape", "2,8:2,300,64", "--shape", "1,32:8,1,4096,128", "--dtypes", "bfloat16",
                       "--causal", "both", "--backends", "tensorcore,tensorcore_sinks,tensorcore_alibi,fa4,fa4_sinks",
                       "--repeats", "3",
                       "--warmup", "1", "--no-peaks", "--no-progress", "--json", str(path)])
    assert code == 0
    doc = json.loads(path.read_text())
    ours = [r for r in doc["rows"] if r["backend"].startswith("tensorcore")]
    assert len(ours) == 12 and all(r["status"] == "ok" and r["rel_err"] < 2e-2 for r in ours), ours
    fa4 = [r for r in doc["rows"] if r["backend"].startswith("fa4")]
    assert all(r["status"] in ("ok", "unsupported") for r in fa4), fa4


def test_score_term_rows_are_checked_against_their_reference(tmp_path):
    """A `<backend>_sinks` / `<backend>_alibi` row calls with term_values(case, ...) and is held to the
    reference with those values (a row that dropped them would be far off: they move every row); these rows
    run only when asked for, and fa4 reports itself unavailable without PyTorch on a GPU."""
    path = tmp_path / "bench.json"
    code = _run(["--shape", "1,4,96,32", "--shape", "2,4:2,40,130,32", "--causal", "both",
                 "--backends", "cpu,cpu_sinks,cpu_alibi,fa4_sinks", "--repeats", "3", "--warmup", "1", "--no-progress",
                 "--json", str(path)])
    assert code == 0
    doc = json.loads(path.read_text())
    rows = {(r["backend"], r["B"], r["causal"]): r for r in doc["rows"]}
    assert {b for b, *_ in rows} == {"cpu", "cpu_sinks", "cpu_alibi"}
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-3 for r in rows.values()), rows
    case = bench.select_cases(_args(["--shape", "1,4,96,32"]))[0]
    sinks = bench.sink_values(case)
    assert sinks[0] == -np.inf and np.isfinite(sinks[1:]).all()
    q, k, v = (np.random.default_rng(i).standard_normal((1, 4, 96, 32)).astype(np.float16) for i in range(3))
    with_sinks = bench.reference_sample(case, q, k, v, sinks=sinks)
    assert rel_l2(with_sinks, bench.reference_sample(case, q, k, v)) > 1e-2
    with_alibi = bench.reference_sample(case, q, k, v, alibi_slopes=bench.term_values(case, "alibi_slopes"))
    assert rel_l2(with_alibi, bench.reference_sample(case, q, k, v)) > 1e-2
    assert bench.split_term("tensorcore_alibi") == ("tensorcore", "alibi_slopes")
    assert not any(name.endswith("_sinks") for name in bench.select_backends(None))
    _, unavailable = bench.make_runners(["fa4", "fa4_sinks"], bench.Frame())
    assert set(unavailable) == {"fa4", "fa4_sinks"}
    assert bench.peak_of("tensorcore_sinks", "float32") == bench.peak_of("tensorcore", "float32")


def test_graph_timing_needs_torch_on_a_gpu(capsys):
    """--graph captures torch.cuda graphs: with the numpy frame it is a usage error, before any case runs."""
    assert _run(["--shape", "1,1,64,32", "--backends", "cpu", "--graph", "--no-progress"]) == 2
    assert "--graph needs a GPU and PyTorch" in capsys.readouterr().err


def test_graph_timer_refuses_empty_graphs():
    with pytest.raises(ValueError, match="calls_per_graph"):
        bench.TorchGraphTimer(calls_per_graph=0)


@pytest.mark.gpu
def test_graph_timer_replays_the_captured_calls():
    """Every replay runs the captured calls again (a counter kernel says how often), each call taking the
    copy its capture took, and a long kernel times alike replayed from a graph and called eagerly."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("optional package: PyTorch with CUDA")
    count = torch.zeros((), device="cuda")
    copies = [torch.tensor([i], device="cuda") for i in range(3)]  # input copy i: index i
    seen = torch.zeros(3, device="cuda")
    one = torch.ones(1, device="cuda")
    taken = iter(range(10**6))

    def call(_):
        count.add_(1)
        seen.index_add_(0, copies[next(taken) % 3], one)

    timer = bench.TorchGraphTimer(calls_per_graph=3)
    times = timer.time([call], 4)
    torch.cuda.synchronize()
    # One eager warm-up call before the capture, then 4 replays of 3 calls; the capture itself runs nothing.
    assert count.item() == 1 + 4 * 3 and len(times) == 1 and len(times[0]) == 4
    assert seen.tolist() == [1 + 4, 4, 4]  # the warm-up took copy 0, the captured calls copies 1, 2, 0
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    gemm = lambda _: a @ a  # noqa: E731
    graph_ms = bench.median(bench.TorchGraphTimer(calls_per_graph=4).time([gemm], 5)[0])
    eager_ms = bench.median(bench.TorchEventTimer().time([gemm], 5)[0])
    assert 0.7 < graph_ms / eager_ms < 1.3, (graph_ms, eager_ms)


@pytest.mark.gpu
def test_graph_bench_of_a_decode_case(tmp_path):
    """`bench --graph` on a decode-shaped case, cuDNN alongside: the JSON names the graph timer, and our row
    ran and is accurate."""
    pytest.importorskip("torch")
    if not cutlassfa.backends()["tensorcore"].available:
        pytest.skip(cutlassfa.backends()["tensorcore"].reason)
    path = tmp_path / "bench.json"
    code = bench.main(["--shape", "2,8:2,1,4096,128", "--dtypes", "bfloat16", "--graph", "--repeats", "3",
                       "--warmup", "1", "--no-peaks", "--no-progress", "--backends", "tensorcore,sdpa_cudnn",
                       "--json", str(path)])
    assert code == 0
    doc = json.loads(path.read_text())
    assert doc["settings"]["timer"] == bench.TorchGraphTimer.name
    (ours,) = [r for r in doc["rows"] if r["backend"] == "tensorcore"]
    assert ours["status"] == "ok" and ours["ms"] > 0 and ours["rel_err"] < 2e-2


@pytest.mark.gpu
def test_overhead_on_gpu(tmp_path):
    if not cutlassfa.backends()["small_tile"].available:
        pytest.skip(cutlassfa.backends()["small_tile"].reason)
    pytest.importorskip("torch")
    path = tmp_path / "overhead.json"
    assert bench.main(["--overhead", "--overhead-calls", "300", "--sync-calls", "3", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    paths = {r["what"]: r for r in doc["tiny"]}
    assert any(r["path"] == "torch" and r["status"] == "ok" and r["us_per_call"] > 0 for r in doc["tiny"])
    assert paths["torch sdpa_flash"]["status"] in ("ok", "unavailable")
    options = [r for what, r in paths.items() if what.endswith("window+softcap+cache_seqlens")]
    assert len(options) == 1 and options[0]["status"] == "ok" and options[0]["us_per_call"] > 0
    assert all(r["status"] == "ok" and r["ms_synchronized"] > 0 for r in doc["synchronized"]), doc["synchronized"]
    if shutil.which("nvidia-smi"):
        assert all(r["sm_clock_mhz"] > 0 for r in doc["synchronized"]), doc["synchronized"]


@pytest.mark.gpu
def test_peaks_on_gpu():
    frame = bench.pick_frame(gpu=True)
    if not frame.on_gpu:
        pytest.skip("optional package: PyTorch or CuPy with CUDA is needed for the GEMM peaks")
    peaks = bench.measure_peaks(frame, ["float16"], frame.timer(), n=2048, repeats=3, warmup=1)
    assert peaks["fp16_gemm"]["tflops"] > 1 and "2048" in peaks["fp16_gemm"]["how"]
    assert math.isfinite(peaks["fp16_gemm"]["tflops"])


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_read_row_on_gpu(tmp_path, graph):
    """The decode grid's ceiling row on a GPU, eager and captured in CUDA graphs: timed, not checked, and
    reading a 512 MiB K + V cache well above 100 GB/s (an H100 streams ~3 TB/s)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("optional package: PyTorch with CUDA")
    path = tmp_path / "bench.json"
    code = bench.main(["--decode", "--quick", "--backends", "read", "--repeats", "3", "--warmup", "1", "--no-peaks",
                       "--no-progress", "--json", str(path)] + (["--graph"] if graph else []))
    assert code == 0
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == 3 and all(r["backend"] == "read" and r["status"] == "ok" for r in rows), rows
    assert all(r["rel_err"] is None and r["peak"] is None and r["gbps"] > 0 for r in rows)
    (longest,) = [r for r in rows if r["Nk"] == 131072]
    assert longest["gbps"] > 100, longest


def test_commit_given_by_environment_wins_over_an_ambient_checkout(monkeypatch):
    """A copy of a checkout run elsewhere may carry a .git of another commit: the commit its runner
    states (CUTLASSFA_COMMIT / CUTLASSFA_DIRTY) is the one recorded."""
    from cutlassfa import _provenance

    monkeypatch.setenv("CUTLASSFA_COMMIT", "0123abc")
    monkeypatch.setenv("CUTLASSFA_DIRTY", "0")
    assert _provenance.git_state() == {"commit": "0123abc", "dirty": False, "commit_source": "CUTLASSFA_COMMIT"}
    monkeypatch.delenv("CUTLASSFA_COMMIT")
    assert _provenance.git_state()["commit"] != "0123abc"


def test_window_with_a_right_bound_on_causal_cases_is_a_usage_error(capsys):
    assert _run(["--shape", "1,2,64,32", "--window", "8,4", "--causal", "yes", "--backends", "cpu",
                 "--no-progress"]) == 2
    assert "right bound" in capsys.readouterr().err


def test_windowed_run_counts_and_checks_the_window(tmp_path):
    path = tmp_path / "bench.json"
    code = _run(["--shape", "1,2,300,64", "--window", "40,0", "--causal", "yes", "--dtypes", "float32",
                 "--backends", "cpu", "--repeats", "2", "--no-progress", "--json", str(path)])
    assert code == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert row["status"] == "ok" and row["window"] == [40, 0]
    assert row["flops"] == bench.attention_flops(1, 2, 300, 300, 64, True, (40, 0))
    assert row["rel_err"] < 1e-5  # against the windowed reference: the dense one differs by far more


def test_softcap_option_marks_every_case_checks_it_and_adds_the_flex_anchor(tmp_path, capsys):
    cases = bench.select_cases(_args(["--shape", "1,2,256,64", "--softcap", "50", "--window", "32,0",
                                      "--causal", "yes"]))
    assert [(c.variant.window, c.softcap, c.variant.name) for c in cases] == [((32, 0), 50.0, "window 32,0 softcap 50")]
    path = tmp_path / "bench.json"
    code = _run(["--shape", "1,2,200,64", "--softcap", "2", "--causal", "yes", "--dtypes", "float32",
                 "--backends", "cpu", "--repeats", "2", "--no-progress", "--json", str(path)])
    assert code == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert row["status"] == "ok" and row["softcap"] == 2.0 and row["window"] is None
    assert row["rel_err"] < 1e-5  # against the capped reference: a cap of 2 changes the scores of ~N(0, 8) far more
    for bad in (["--softcap", "0"], ["--softcap", "30", "--varlen"]):
        assert _run(["--backends", "cpu", "--no-progress"] + bad) == 2
    assert "--softcap" in capsys.readouterr().err


def _torch_cpu():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    return torch


@pytest.mark.parametrize("causal, window", [(False, (17, 5)), (True, (60, 0))])
def test_flex_anchor_applies_the_bottom_right_window(causal, window):
    """FlexAttention with the runner's block mask equals the windowed fp64 reference (CPU PyTorch, the
    eager form: the compiled one is the GPU's)."""
    torch = _torch_cpu()
    from cutlassfa.reference import attention_reference, rel_l2

    case = Case("float32", 1, 4, 2, 96, 200, 32, causal, variant=Variant("window", window=window))
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(*shape, generator=gen) for shape in case.shapes())
    out = bench.flex(compiled=False).prepare(case)(q, k, v)
    ref, _ = attention_reference(q.numpy(), k.numpy(), v.numpy(), causal=causal, window=window)
    assert rel_l2(out.numpy(), ref) < 1e-5


def test_flex_anchor_applies_softcap():
    """FlexAttention with the runner's softcap score_mod equals the capped fp64 reference (eager, CPU)."""
    torch = _torch_cpu()
    from cutlassfa.reference import attention_reference, rel_l2

    case = Case("float32", 1, 4, 2, 96, 200, 32, True, variant=Variant("softcap", softcap=3.0))
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(*shape, generator=gen) * 3 for shape in case.shapes())
    out = bench.flex(compiled=False).prepare(case)(q, k, v)
    ref, _ = attention_reference(q.numpy(), k.numpy(), v.numpy(), causal=True, softcap=3.0)
    assert rel_l2(out.numpy(), ref) < 1e-5
    uncapped, _ = attention_reference(q.numpy(), k.numpy(), v.numpy(), causal=True)
    assert rel_l2(uncapped, ref) > 1e-2  # the cap matters on these inputs


def test_sdpa_anchor_refuses_a_window():
    _torch_cpu()
    case = Case("float32", 1, 2, 2, 64, 64, 32, False, variant=Variant("window", window=(8, 8)))
    with pytest.raises(Unsupported, match="sliding-window"):
        bench.sdpa("sdpa_math").prepare(case)
    with pytest.raises(Unsupported, match="softcap"):
        bench.sdpa("sdpa_math").prepare(Case("float32", 1, 2, 2, 64, 64, 32, False,
                                             variant=Variant("softcap", softcap=30.0)))


@pytest.mark.parametrize("dtype, shape", [("bfloat16", (2, 4, 37, 64)), ("float16", (1, 1, 3, 5)),
                                          ("float32", (1, 1, 7, 3)), ("bfloat16", (1, 1, 2, 3))])
def test_read_row_sums_every_byte_of_k_and_v(dtype, shape):
    """The read runner's call (CPU PyTorch here; the bench runs it on the GPU) returns the integer sums of
    K's and V's bytes, as numpy sums the same bytes: it reads every element, without a copy, in the widest
    words the byte count allows (random bit patterns, NaNs among them, sum as integers all the same)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    itemsize = 4 if dtype == "float32" else 2
    raw = [rng.integers(0, 256, size=int(np.prod(shape)) * itemsize, dtype=np.uint8) for _ in range(2)]
    k, v = (torch.from_numpy(r.copy()).view(getattr(torch, dtype)).reshape(shape) for r in raw)
    case = Case(dtype, shape[0], shape[1], shape[1], 1, shape[2], shape[3], False)
    q = torch.zeros(case.shapes()[0], dtype=k.dtype)
    sums = bench.read().prepare(case)(q, k, v)
    nbytes = raw[0].size
    word = next(w for w in (np.int64, np.int32, np.int16, np.uint8) if nbytes % np.dtype(w).itemsize == 0)
    expected = [int(r.view(word).sum(dtype=np.int64)) for r in raw]
    assert [s.dtype for s in sums] == [torch.int64] * 2 and [s.item() for s in sums] == expected
    assert bench.runners.as_words(k).data_ptr() == k.data_ptr()
    if nbytes % 8 == 0:
        assert bench.runners.as_words(k).dtype == torch.int64


# ---------------------------------------------------------------------------------------------------
# The paged and varlen grids (--paged, --varlen): cases, inputs, twins, the command.
# ---------------------------------------------------------------------------------------------------
def test_cases_option_takes_a_part_of_the_grid():
    assert bench.parse_cases("0:40") == slice(0, 40) and bench.parse_cases("40:") == slice(40, None)
    assert bench.parse_cases(":7") == slice(None, 7)
    for bad in ("5", "a:b", "1:2:3", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_cases(bad)
    grid = bench.paged_grid()
    assert bench.select_cases(_args(["--paged", "--cases", "4:12"])) == grid[4:12]
    assert bench.select_cases(_args(["--paged", "--cases", "170:"])) == grid[170:]
    assert bench.select_cases(_args(["--decode", "--cases", ":3"])) == bench.decode_grid()[:3]
    shapes = ["--shape", "1,2,64,32", "--shape", "1,2,96,32"]
    assert bench.select_cases(_args(shapes + ["--cases", "1:"])) == bench.select_cases(_args(shapes))[1:]


def test_json_is_written_after_every_case(tmp_path, monkeypatch):
    """A run stopped after its first case leaves that case's rows in --json, marked incomplete; a whole run
    marks its document complete."""
    path = tmp_path / "bench.json"
    argv = ["--shape", "1,2,64,32", "--shape", "1,2,96,32", "--dtypes", "float32", "--backends", "cpu",
            "--repeats", "3", "--no-progress", "--json", str(path)]
    assert _run(argv, FakeTimer([1.0])) == 0
    doc = json.loads(path.read_text())
    assert doc["complete"] is True and len(doc["rows"]) == 2
    measured = []
    real_bench_case = bench.cli.bench_case

    def stop_after_one(case, *args, **kwargs):
        if measured:
            raise KeyboardInterrupt
        measured.append(case)
        return real_bench_case(case, *args, **kwargs)

    monkeypatch.setattr(bench.cli, "bench_case", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        _run(argv, FakeTimer([1.0]))
    doc = json.loads(path.read_text())
    assert doc["complete"] is False
    assert [(r["Nq"], r["status"]) for r in doc["rows"]] == [(64, "ok")]


def test_paged_grid_pairs_every_shape_with_a_contiguous_twin():
    grid = bench.paged_grid()
    assert bench.select_cases(_args(["--paged"])) == grid
    assert {c.variant.page_size for c in grid} == {0, 16, 64, 256}
    assert all(c.dtype == "bfloat16" and c.H == 32 and c.Hk in (8, 32) and c.d in (128, 64) for c in grid)
    assert all((c.Nq, c.causal) in {(1, False), (4, True)} and c.variant.cache_seqlens == (c.Nk,) * c.B
               for c in grid)
    # each shape: its contiguous cache, then one case per page size, the twin first
    for i in range(0, len(grid), 4):
        contiguous, *paged = grid[i:i + 4]
        assert contiguous.variant.page_size == 0 and bench.twin_of(contiguous) is None
        assert [c.variant.page_size for c in paged] == [16, 64, 256]
        assert all(bench.twin_of(c) == contiguous for c in paged)
    shapes = {(c.d, c.Hk, c.B, c.Nk, c.Nq) for c in grid}
    every = {(d, hk, b, nk, nq) for d in (128, 64) for hk in (8, 32) for b in (1, 8, 64) for nk in (16384, 131072)
             for nq in (1, 4)}
    left_out = every - shapes
    # only K + V over 32 GiB is left out: 8 K/V heads at B 64 and 128k keys (exactly 32 GiB at d 128) stays
    assert left_out == {(d, 32, 64, 131072, nq) for d in (128, 64) for nq in (1, 4)}
    assert max(2 * c.B * c.Hk * c.Nk * c.d * 2 for c in grid) == bench.DECODE_MAX_KV_BYTES
    assert len(grid) == 4 * len(shapes) == 176

    quick = bench.select_cases(_args(["--paged", "--quick"]))
    assert quick == bench.paged_quick_grid() and len(quick) == 12 and set(quick) <= set(grid)
    sized = bench.select_cases(_args(["--paged", "--quick", "--page-sizes", "32"]))
    assert {c.variant.page_size for c in sized} == {0, 32}
    assert all(c.causal for c in bench.select_cases(_args(["--paged", "--causal", "yes"])))
    assert {c.dtype for c in bench.select_cases(_args(["--paged", "--quick", "--dtypes", "float16"]))} == {"float16"}
    shaped = bench.select_cases(_args(["--paged", "--shape", "2,8:2,1,100,64", "--page-sizes", "16,7"]))
    assert [(c.B, c.H, c.Hk, c.Nq, c.Nk, c.d, c.variant.page_size, c.dtype) for c in shaped] == [
        (2, 8, 2, 1, 100, 64, p, "bfloat16") for p in (0, 16, 7)]


def test_varlen_grid_follows_each_batch_with_its_dense_twin():
    grid = bench.varlen_grid()
    assert bench.select_cases(_args(["--varlen"])) == grid
    assert bench.select_cases(_args(["--varlen", "--quick"])) == grid[:2]
    varlen, dense = grid[0::2], grid[1::2]
    assert [c.variant.kind for c in varlen] == ["varlen"] * 3 and all(c.variant.kind == "dense" for c in dense)
    for v, twin in zip(varlen, dense):
        lengths = v.variant.seqlens_q
        assert v.variant.seqlens_k == lengths and bench.twin_of(v) == twin and bench.twin_of(twin) is None
        assert (v.dtype, v.H, v.Hk, v.d, v.causal) == ("bfloat16", 32, 8, 128, True)
        assert v.B == twin.B == len(lengths) and v.Nq == v.Nk == max(lengths)
        assert twin.Nq == twin.Nk == round(sum(lengths) / len(lengths))
    first = varlen[0].variant.seqlens_q
    assert len(first) == 16 and 64 <= min(first) and max(first) <= 8192
    assert first == tuple(int(n) for n in np.random.default_rng(0).integers(64, 8193, 16))  # a fixed draw
    assert dense[0].Nq == 4164
    assert len(varlen[1].variant.seqlens_q) == 64 and max(varlen[1].variant.seqlens_q) <= 1024
    assert max(varlen[2].variant.seqlens_q) == 16384
    mine = bench.select_cases(_args(["--varlen", "--lengths", "5,40,17", "--lengths", "33", "--dtypes",
                                     "float16,bfloat16", "--head-dims", "64", "--causal", "both"]))
    assert len(mine) == 2 * 2 * 2 * 2 and {c.d for c in mine} == {64}
    assert {c.variant.seqlens_q for c in mine if c.variant.kind == "varlen"} == {(5, 40, 17), (33,)}
    assert {(c.dtype, c.causal) for c in mine} == {(dt, ca) for dt in ("float16", "bfloat16") for ca in (False, True)}


def test_block_table_is_a_shuffled_permutation_of_the_pool():
    case = bench.kvcache_case("float32", 4, 2, 2, 1, 100, 8, False, page_size=16)
    table = bench.feeds.block_table(case, seed=3)
    assert table.dtype == np.int32 and table.shape == (4, 7)  # ceil(100 / 16) pages an entry
    assert sorted(table.ravel().tolist()) == list(range(28))  # every page of the pool, once
    assert not all(np.all(np.diff(row) == 1) for row in table)  # not in order
    assert np.array_equal(table, bench.feeds.block_table(case, seed=3))
    feed = bench.make_feed(case, bench.Frame(), seed=3)
    q, k, v, seqlens, table = feed.own
    assert q.shape == (4, 2, 1, 8) and k.shape == v.shape == (28, 2, 16, 8)
    assert seqlens.tolist() == [100] * 4 and np.array_equal(table, feed.index["block_table"])


class _TorchCpuFrame(bench.Frame):
    """The numpy frame's values as PyTorch CPU tensors (index arrays stay numpy): the torch code paths of
    the feeds without a GPU."""

    def randn(self, shape, dtype, seed):
        import torch

        return torch.from_numpy(super().randn(shape, dtype, seed))

    def empty_like(self, x, shape):
        import torch

        return torch.empty(shape, dtype=x.dtype)


@pytest.mark.parametrize("frame_name", ["numpy", "torch"])
@pytest.mark.parametrize("nk, page_size", [(64, 16), (37, 16), (5, 8), (48, 1)])
def test_gathered_dense_cache_holds_what_the_pages_hold(frame_name, nk, page_size):
    """The anchors' contiguous cache, gathered with numpy indexing or PyTorch's, equals a lookup of each
    key position through the block table, one at a time."""
    if frame_name == "torch":
        pytest.importorskip("torch")
    frame = bench.Frame() if frame_name == "numpy" else _TorchCpuFrame()
    case = bench.kvcache_case("float32", 3, 4, 2, 1, nk, 8, False, page_size=page_size)
    feed = bench.with_dense(case, frame, bench.make_feed(case, frame, seed=5))
    q, pool = feed.own[:2]
    table = feed.index["block_table"]
    dense_q, dense_k, dense_v = feed.dense
    assert dense_q is q and tuple(dense_k.shape) == (3, 2, nk, 8)
    dense_k, pool = np.asarray(dense_k), np.asarray(pool)
    for b in range(3):
        for p in range(nk):
            assert np.array_equal(dense_k[b, :, p], pool[table[b, p // page_size], :, p % page_size])
    assert np.array_equal(np.asarray(dense_v), np.asarray(bench.gather_pages(bench.Frame(), np.asarray(feed.own[2]),
                                                                                table, nk)))


def test_contiguous_and_plain_cases_feed_the_anchors_our_own_arrays():
    frame = bench.Frame()
    for case in (bench.kvcache_case("float32", 2, 4, 2, 1, 40, 8, False), Case("float32", 2, 4, 2, 3, 40, 8, True)):
        feed = bench.with_dense(case, frame, bench.make_feed(case, frame, seed=1))
        assert all(a is b for a, b in zip(feed.dense, feed.own[:3]))


def test_varlen_packing_and_pair_counts():
    lengths = (5, 40, 17, 1)
    case = bench.varlen_case("float32", 4, 2, 8, True, lengths)
    feed = bench.with_dense(case, bench.Frame(), bench.make_feed(case, bench.Frame(), seed=2))
    q, k, v, cu_q, cu_k = feed.own
    assert cu_q.tolist() == cu_k.tolist() == [0, 5, 45, 62, 63] and cu_q.dtype == np.int32
    assert q.shape == (63, 4, 8) and k.shape == v.shape == (63, 2, 8)
    qs, ks, vs = feed.dense
    for i, n in enumerate(lengths):
        assert qs[i].shape == (1, 4, n, 8) and ks[i].shape == vs[i].shape == (1, 2, n, 8)
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        assert np.array_equal(qs[i][0], q[rows].swapaxes(0, 1)) and np.shares_memory(qs[i], q)  # views
        assert np.array_equal(vs[i][0], v[rows].swapaxes(0, 1))
    # visible pairs: causal n (n + 1) / 2 a sequence and head; not causal n^2
    assert bench.case_flops(case) == 4 * 4 * 8 * sum(n * (n + 1) // 2 for n in lengths)
    open_case = bench.varlen_case("float32", 4, 2, 8, False, lengths)
    assert bench.case_flops(open_case) == 4 * 4 * 8 * sum(n * n for n in lengths)
    twin = bench.dense_at_mean(case)
    assert (twin.B, twin.Nq, twin.Nk) == (4, 16, 16)  # mean 15.75
    assert bench.case_flops(twin) == bench.attention_flops(4, 4, 16, 16, 8, True)
    # q and o of 63 rows x 4 heads, k and v of 63 rows x 2 heads, float32
    assert bench.case_bytes(case) == 4 * 8 * (2 * 4 * 63 + 2 * 2 * 63)
    paged = bench.kvcache_case("bfloat16", 8, 32, 8, 4, 16384, 128, True, page_size=16)
    contiguous = bench.twin_of(paged)
    assert bench.case_flops(paged) == bench.case_flops(contiguous) == bench.attention_flops(8, 32, 4, 16384, 128, True)
    assert bench.case_bytes(paged) == bench.attention_bytes(8, 32, 8, 4, 16384, 128, 2)


def _ratio_row(backend, case, ms, rate_of=bench.tflops):
    row = bench.Row(backend, case, ms=ms)
    if backend == bench.READ:
        row.gbps = bench.case_bytes(case) / (ms * 1e-3) / 1e9
    else:
        row.tflops = rate_of(case, ms)
    return row


def test_twin_ratios_and_their_summary_on_synthetic_rows():
    contiguous = bench.kvcache_case("bfloat16", 8, 32, 8, 1, 16384, 128, False)
    paged = [bench.kvcache_case("bfloat16", 8, 32, 8, 1, 16384, 128, False, page_size=p) for p in (16, 64, 256)]
    varlen = bench.varlen_case("bfloat16", 32, 8, 128, True, (100, 300, 800))
    dense = bench.dense_at_mean(varlen)
    rows = [_ratio_row("tensorcore", contiguous, 0.100), _ratio_row(bench.READ, contiguous, 0.080)]
    rows += [_ratio_row("tensorcore", c, ms) for c, ms in zip(paged, (0.125, 0.110, 0.100))]
    rows += [_ratio_row(bench.READ, paged[0], 0.100), _ratio_row("sdpa_cudnn", paged[1], 0.2)]  # no sdpa twin
    rows += [_ratio_row("tensorcore", varlen, 2.0), _ratio_row("tensorcore", dense, 1.0)]
    bench.apply_twins(rows)
    by = {(r.backend, r.case): r for r in rows}
    # paged: the same FLOPs, so the rate ratio is the time ratio
    assert [by[("tensorcore", c)].vs_twin for c in paged] == pytest.approx([0.8, 100 / 110, 1.0])
    assert by[("tensorcore", paged[0])].twin == contiguous.label
    assert by[(bench.READ, paged[0])].vs_twin == pytest.approx(0.8)  # read: GB/s
    assert by[("sdpa_cudnn", paged[1])].vs_twin is None and by[("tensorcore", contiguous)].vs_twin is None
    # varlen: TFLOP/s over each case's own visible pairs
    expected = (bench.case_flops(varlen) / 2.0) / (bench.case_flops(dense) / 1.0)
    assert by[("tensorcore", varlen)].vs_twin == pytest.approx(expected) and by[("tensorcore", dense)].vs_twin is None

    table = bench.report.results_table(rows)
    assert "| vs twin" in table and "| variant" in table and "paged 16" in table and "0.800" in table
    assert "vs twin" not in bench.report.results_table([bench.Row("cpu", Case("float32", 1, 1, 1, 8, 8, 8, False))])
    summary = bench.report.twin_summary(rows).splitlines()
    paged_ratios = [0.8, 100 / 110, 1.0]
    geomean = float(np.exp(np.mean(np.log(paged_ratios))))
    assert summary[1] == (f"  paged / contiguous cache, tensorcore: min 0.800, geomean {geomean:.3f}, max 1.000 "
                          f"over 3 cases (1 below 0.9)")
    assert summary[2].startswith("  varlen / dense at the mean length, tensorcore: min") and len(summary) == 3
    doc = json.loads(json.dumps(by[("tensorcore", paged[0])].to_json()))
    assert doc["mode"] == "paged" and doc["page_size"] == 16 and doc["variant"] == "paged 16"
    assert doc["seqlens_k"] == [16384] * 8 and doc["seqlens_q"] is None
    assert doc["twin"] == contiguous.label and doc["vs_twin"] == pytest.approx(0.8)
    doc = by[("tensorcore", varlen)].to_json()
    assert doc["mode"] == "varlen" and doc["seqlens_q"] == doc["seqlens_k"] == [100, 300, 800]
    assert doc["page_size"] is None and doc["flops"] == bench.case_flops(varlen)


def test_new_flags_and_their_refusals(monkeypatch, capsys):
    for argv in (["--paged", "--varlen"], ["--decode", "--paged"], ["--decode", "--varlen"], ["--page-sizes", "0"],
                 ["--lengths", "3,-1"]):
        with pytest.raises(SystemExit):
            _args(argv)
    for argv, why in ((["--quick", "--page-sizes", "16"], "--page-sizes goes with --paged"),
                      (["--paged", "--lengths", "16"], "--lengths goes with --varlen"),
                      (["--paged", "--window", "8,0"], "--window is for dense cases"),
                      (["--varlen", "--window", "8,0"], "--window is for dense cases"),
                      (["--varlen", "--shape", "1,2,64,32"], "--varlen takes --lengths")):
        assert _run(argv + ["--backends", "cpu", "--no-progress"]) == 2
        assert why in capsys.readouterr().err
    # read is a default row of --paged (a decode grid), not of --varlen (prefill)
    asked = []
    monkeypatch.setattr(bench.cli, "make_runners", lambda names, frame: (asked.append(list(names)), ([], {}))[1])
    assert _run(["--paged", "--quick", "--no-progress"]) == 2 and _run(["--varlen", "--quick", "--no-progress"]) == 2
    assert bench.READ in asked[0] and bench.READ not in asked[1]
    assert set(bench.SDPA_BACKENDS) <= set(asked[0]) & set(asked[1])


def test_paged_run_on_the_cpu_backend(tmp_path, capsys):
    """--paged end to end on the cpu backend (KV-cache calls take host arrays without the extension): every
    row checked against the reference, the paged rows held against their contiguous twin, the JSON
    self-describing."""
    path = tmp_path / "paged.json"
    code = _run(["--paged", "--shape", "2,4:2,1,100,32", "--shape", "1,4:2,3,64,32", "--causal", "both",
                 "--page-sizes", "16,7", "--dtypes", "float32", "--backends", "cpu", "--repeats", "3", "--warmup", "1",
                 "--no-progress", "--json", str(path)], FakeTimer([2.0]))
    assert code == 0
    out = capsys.readouterr().out
    assert "paged / contiguous cache, cpu: min 1.000, geomean 1.000, max 1.000 over 8 cases" in out
    doc = json.loads(path.read_text())
    assert doc["schema"] == "cutlassfa-bench/3" and "vs_twin" in doc["settings"]
    rows = doc["rows"]
    assert len(rows) == 2 * 2 * 3 and all(r["status"] == "ok" and r["rel_err"] < 1e-5 for r in rows), rows
    assert [r["page_size"] for r in rows[:3]] == [None, 16, 7] and [r["mode"] for r in rows[:3]] == [
        "kvcache", "paged", "paged"]
    for r in rows:
        assert r["seqlens_k"] == [r["Nk"]] * r["B"] and r["seqlens_q"] is None
        assert r["flops"] == bench.attention_flops(r["B"], r["H"], r["Nq"], r["Nk"], r["d"], r["causal"])
        if r["mode"] == "paged":
            assert r["vs_twin"] == 1.0 and r["twin"].endswith("contiguous cache") and "block_table" in r["fed"]
        else:
            assert r["vs_twin"] is None and r["twin"] is None and "contiguous" in r["fed"]


def test_a_paged_row_reading_the_wrong_pages_is_inaccurate():
    """The reference follows the case's block table: a call that reads another entry's pages is caught."""
    import cutlassfa

    def wrong_pages(case):
        return lambda q, k, v, seqlens, table: cutlassfa.forward(
            q, k, v, cache_seqlens=seqlens, block_table=np.ascontiguousarray(table[::-1]), backend="cpu")

    case = bench.kvcache_case("float32", 2, 4, 2, 1, 64, 32, False, page_size=16)
    right, wrong = bench.bench_case(case, [bench.ours("cpu"), bench.Runner("wrong_pages", wrong_pages, on_gpu=False)],
                                    bench.Frame(), bench.Settings(repeats=2, warmup=1), rates={},
                                    timer_for=lambda r: FakeTimer([1.0]))
    assert right.status == "ok" and right.rel_err < 1e-5
    assert wrong.status == "inaccurate" and wrong.rel_err > 0.1


def test_varlen_run_on_the_cpu_backend(tmp_path, monkeypatch):
    """--varlen end to end on the cpu backend: the varlen row checked against varlen_reference on its
    sampled sequences, the dense twin at the mean length, and the ratio of their TFLOP/s (each over its own
    visible pairs). The twin is a plain call, which needs the extension; without it, the numpy backend's
    own function stands in for the plain path."""
    import cutlassfa
    from cutlassfa import _api
    from cutlassfa.cpu import forward_cpu

    if _api._C is None:
        real = cutlassfa.forward

        def forward(q, k, v, *, causal=False, backend="auto", **variant):
            if variant:
                return real(q, k, v, causal=causal, backend=backend, **variant)
            return forward_cpu(q, k, v, causal=causal, softmax_scale=None, return_lse=False)

        monkeypatch.setattr(cutlassfa, "forward", forward)
    path = tmp_path / "varlen.json"
    code = _run(["--varlen", "--lengths", "5,40,17", "--head-dims", "32", "--dtypes", "float32", "--backends", "cpu",
                 "--repeats", "3", "--warmup", "1", "--no-progress", "--json", str(path)], FakeTimer([2.0]))
    assert code == 0
    varlen, dense = json.loads(path.read_text())["rows"]
    assert varlen["mode"] == "varlen" and varlen["seqlens_q"] == varlen["seqlens_k"] == [5, 40, 17]
    assert [varlen[key] for key in ("B", "H", "Hk", "Nq", "d", "causal")] == [3, 32, 8, 40, 32, True]
    assert varlen["flops"] == 4 * 32 * 32 * (15 + 820 + 153) and "cu_seqlens" in varlen["fed"]
    assert dense["mode"] == "dense" and (dense["B"], dense["Nq"], dense["Nk"]) == (3, 21, 21)
    assert varlen["status"] == dense["status"] == "ok" and varlen["rel_err"] < 1e-5 and dense["rel_err"] < 1e-5
    assert varlen["vs_twin"] == pytest.approx(varlen["flops"] / dense["flops"])  # the same 2 ms each
    assert varlen["twin"] == "float32 B3 H32/8 21x21 d32 causal " + dense["variant"]


def test_sdpa_rows_on_the_dense_equivalent_match_the_references():
    """SDPA (the math backend, CPU PyTorch) on what the anchors are fed: the gathered cache of a paged
    case equals kvcache_reference on the pages, the per-sequence calls of a varlen batch equal
    varlen_reference on the packed arrays."""
    _torch_cpu()
    from cutlassfa.reference import kvcache_reference, rel_l2, varlen_reference

    frame = _TorchCpuFrame()
    runner = bench.sdpa("sdpa_math")
    assert runner.feed == bench.DENSE and bench.ours("cpu").feed == bench.read().feed == bench.OWN
    paged = bench.kvcache_case("float32", 3, 4, 2, 4, 50, 16, True, page_size=16)
    feed = bench.with_dense(paged, frame, bench.make_feed(paged, frame, seed=4))
    with runner.context():
        out = runner.prepare(paged)(*feed.dense)
    q, k, v = (x.numpy() for x in feed.own[:3])
    ref, _ = kvcache_reference(q, k, v, causal=True, **feed.index)
    assert rel_l2(out.numpy(), ref) < 1e-5

    varlen = bench.varlen_case("float32", 4, 2, 16, True, (7, 30, 1, 12))
    feed = bench.with_dense(varlen, frame, bench.make_feed(varlen, frame, seed=4))
    with runner.context():
        outs = runner.prepare(varlen)(*feed.dense)
    q, k, v = (x.numpy() for x in feed.own[:3])
    ref, _ = varlen_reference(q, k, v, feed.index["cu_seqlens_q"], feed.index["cu_seqlens_k"], causal=True)
    packed = np.concatenate([o[0].numpy().swapaxes(0, 1) for o in outs])
    assert rel_l2(packed, ref) < 1e-5
    # the samples the bench compares: SDPA's per-sequence outputs against the same slices of the reference
    sample = bench.reference_sample(varlen, q, k, v, feed.index)
    assert rel_l2(bench.output_sample(varlen, outs), sample) < 1e-5
    assert np.array_equal(bench.output_sample(varlen, packed, feed.index), bench.output_sample(varlen, outs))


# ---------------------------------------------------------------------------------------------------
# The paged and varlen quick grids on a GPU.
# ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_paged_quick_grid_on_gpu(tmp_path, torch, need_backend, graph):
    """`bench --paged --quick`: ours (tensorcore) on shuffled pages and on the contiguous twin, accurate;
    cuDNN and FlashAttention SDPA on the gathered cache; read on the page pools; every paged row of ours
    with its ratio to the contiguous cache."""
    need_backend("tensorcore")
    path = tmp_path / "paged.json"
    code = bench.main(["--paged", "--quick", "--backends", "tensorcore,sdpa_cudnn,sdpa_flash,read", "--repeats", "3",
                       "--warmup", "1", "--no-peaks", "--no-progress", "--json", str(path)]
                      + (["--graph"] if graph else []))
    assert code == 0
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == 12 * 4
    ours = [r for r in rows if r["backend"] == "tensorcore"]
    assert all(r["status"] == "ok" and r["rel_err"] < 2e-2 and r["gbps"] > 0 for r in ours), ours
    assert all(r["vs_twin"] > 0 for r in ours if r["mode"] == "paged")
    reads = [r for r in rows if r["backend"] == "read"]
    assert all(r["status"] == "ok" and r["gbps"] > 0 for r in reads), reads
    sdpa = [r for r in rows if r["backend"].startswith("sdpa_")]
    assert all(r["status"] != "error" for r in sdpa), sdpa
    assert any(r["status"] == "ok" and r["mode"] == "paged" and "gathered" in r["fed"] for r in sdpa), sdpa


@pytest.mark.gpu
def test_varlen_quick_grid_on_gpu(tmp_path, torch, need_backend):
    """`bench --varlen --quick`: ours through varlen_forward and its dense twin, accurate, with their ratio;
    SDPA one call per sequence; read on the packed arrays."""
    need_backend("tensorcore")
    path = tmp_path / "varlen.json"
    code = bench.main(["--varlen", "--quick", "--backends", "tensorcore,sdpa_flash,sdpa_cudnn,read", "--repeats", "3",
                       "--warmup", "1", "--no-peaks", "--no-progress", "--json", str(path)])
    assert code == 0
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == 2 * 4
    ours = {r["mode"]: r for r in rows if r["backend"] == "tensorcore"}
    assert all(r["status"] == "ok" and r["rel_err"] < 2e-2 and r["tflops"] > 0 for r in ours.values()), ours
    assert ours["varlen"]["vs_twin"] > 0 and ours["varlen"]["twin"].endswith(ours["dense"]["variant"])
    sdpa = [r for r in rows if r["backend"].startswith("sdpa_")]
    assert all(r["status"] != "error" for r in sdpa), sdpa
    assert any(r["status"] == "ok" and r["mode"] == "varlen" for r in sdpa), sdpa
    assert all(r["status"] == "ok" for r in rows if r["backend"] == "read")


def test_fp8_cache_rows_are_checked_against_the_dequantized_cache(tmp_path):
    """A `<backend>_fp8` row runs K and V as an e4m3 cache (dense cases as full caches) and is held to the
    reference of the dequantized values, which differs from the plain one by the quantization."""
    path = tmp_path / "bench.json"
    code = _run(["--shape", "2,4:2,4,130,64", "--shape", "1,4,3,96,32", "--causal", "both", "--backends",
                 "cpu,cpu_fp8", "--repeats", "3", "--warmup", "1", "--no-progress", "--json", str(path)])
    assert code == 0
    rows = json.loads(path.read_text())["rows"]
    assert {r["backend"] for r in rows} == {"cpu", "cpu_fp8"}
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-3 for r in rows), rows
    case = bench.select_cases(_args(["--shape", "2,4:2,4,130,64"]))[0]
    q, k, v = (np.random.default_rng(i).standard_normal(shape).astype(np.float16)
               for i, shape in enumerate([(2, 4, 4, 64), (2, 2, 130, 64), (2, 2, 130, 64)]))
    fp8 = bench.reference_sample(case, q, k, v, kv_values=bench.runners.fp8_roundtrip)
    assert 1e-3 < rel_l2(fp8, bench.reference_sample(case, q, k, v)) < 5e-2
    assert bench.split_term("tensorcore_fp8") == ("tensorcore", "fp8_cache")


def test_fp8_attention_rows_are_checked_against_the_dequantized_inputs(tmp_path):
    """A `<backend>_fp8attn` row runs fp8 attention on e4m3 copies of q, K and V (dense, a KV cache, a varlen
    batch), its output in the case's dtype, and is held to the reference of the dequantized values."""
    path = tmp_path / "bench.json"
    code = _run(["--shape", "2,4:2,4,130,64", "--shape", "1,4,3,96,32", "--causal", "both", "--backends",
                 "cpu,cpu_fp8attn", "--repeats", "3", "--warmup", "1", "--no-progress", "--json", str(path)])
    assert code == 0
    rows = json.loads(path.read_text())["rows"]
    assert {r["backend"] for r in rows} == {"cpu", "cpu_fp8attn"} and len(rows) == 8
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-3 for r in rows), rows
    case = bench.select_cases(_args(["--shape", "2,4:2,4,130,64"]))[0]
    q, k, v = (np.random.default_rng(i).standard_normal(shape).astype(np.float16)
               for i, shape in enumerate([(2, 4, 4, 64), (2, 2, 130, 64), (2, 2, 130, 64)]))
    rounded = bench.runners.fp8_roundtrip
    both = bench.reference_sample(case, q, k, v, kv_values=rounded, q_values=rounded)
    assert 1e-3 < rel_l2(both, bench.reference_sample(case, q, k, v, kv_values=rounded)) < 5e-2  # q's rounding shows
    assert bench.split_term("tensorcore_fp8attn") == ("tensorcore", "fp8_attention")


def test_cudnn_fp8_anchor_is_asked_for_by_name_and_bounded_for_its_fp8_output():
    from cutlassfa.bench import rules, runners

    assert runners.CUDNN_FP8 in bench.ALL_BACKENDS and runners.CUDNN_FP8 not in bench.select_backends(None)
    assert bench.split_term(runners.CUDNN_FP8) == (runners.CUDNN_FP8, None)  # not one of our term rows
    _, unavailable = bench.make_runners([runners.CUDNN_FP8], bench.Frame())  # the numpy frame: no GPU arrays
    assert unavailable == {runners.CUDNN_FP8: "needs PyTorch with CUDA"}
    # e4m3 out: 3 mantissa bits, ~3.6 % rms; the 2 % of the other anchors would fail every call of it
    assert rules.accuracy_bound(runners.CUDNN_FP8, "bfloat16") == 0.08 > rules.accuracy_bound("sdpa_cudnn", "bfloat16")


def test_speculative_grid_is_the_multi_token_decode_grid():
    grid = bench.speculative_grid()
    assert bench.select_cases(_args(["--speculative"])) == grid
    assert len(grid) == 2 * 2 * 4 * 2  # caches x heads x queries x (contiguous, paged 16)
    assert {(c.H, c.Hk) for c in grid} == {(32, 8), (64, 8)} and {c.Nq for c in grid} == {2, 4, 8, 16}
    assert all(c.B == 8 and c.d == 128 and c.causal and c.dtype == "bfloat16" and c.Nk in (8192, 32768) for c in grid)
    assert max(c.Nq * c.H // c.Hk for c in grid) == 128  # query rows a K/V head
    for contiguous, paged in zip(grid[::2], grid[1::2]):
        assert (contiguous.variant.page_size, paged.variant.page_size) == (0, 16)
        assert bench.twin_of(paged) == contiguous
    sized = bench.select_cases(_args(["--speculative", "--page-sizes", "64", "--dtypes", "float16"]))
    assert {c.variant.page_size for c in sized} == {0, 64} and {c.dtype for c in sized} == {"float16"}
    assert bench.FLEX in bench.select_backends(None, flex=True) and bench.READ in bench.select_backends(None, decode=True)
    assert _run(["--speculative", "--window", "8,0"]) == 2
    assert _run(["--speculative", "--shape", "1,8,1,64,64"]) == 2


def test_fa4_rows_take_our_dense_and_varlen_arrays(monkeypatch):
    """The fa4 row calls FlashAttention-4's dense entry on (B, N, H, d) views of the dense arrays and its varlen
    entry on the packed arrays with cu_seqlens and the longest lengths, the case's mask passed through (a
    stand-in module records the calls: FlashAttention-4 needs a GPU); paged caches are not its to take."""
    import sys
    import types

    from cutlassfa._inputs import Unsupported
    from cutlassfa.bench import runners
    from cutlassfa.bench.grid import kvcache_case, varlen_case

    calls = []

    def dense(q, k, v, **kw):
        calls.append(("dense", q.shape, kw))
        return q, None

    def varlen(q, k, v, **kw):
        calls.append(("varlen", q.shape, kw))
        return q

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func, cute.flash_attn_varlen_func = dense, varlen
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    torch = pytest.importorskip("torch")
    runner = runners.fa4()
    q = torch.zeros((2, 4, 8, 32), dtype=torch.float16)
    out = runner.prepare(bench.select_cases(_args(["--shape", "2,4,8,32", "--causal", "yes"]))[0])(q, q, q)
    assert out.shape == q.shape and calls[-1][:2] == ("dense", (2, 8, 4, 32))
    assert calls[-1][2]["causal"] and calls[-1][2]["window_size"] == (None, None)
    case = varlen_case("bfloat16", 4, 2, 32, True, [5, 17, 9])
    packed, cu = torch.zeros((31, 4, 32), dtype=torch.float16), torch.tensor([0, 5, 22, 31], dtype=torch.int32)
    runner.prepare(case)(packed, packed[:, :2], packed[:, :2], cu, cu)
    kind, shape, kw = calls[-1]
    assert (kind, shape) == ("varlen", (31, 4, 32)) and kw["cu_seqlens_q"] is cu and kw["cu_seqlens_k"] is cu
    assert (kw["max_seqlen_q"], kw["max_seqlen_k"], kw["causal"]) == (17, 17, True)
    with pytest.raises(Unsupported, match="dense and varlen"):
        runner.prepare(kvcache_case("bfloat16", 1, 4, 2, 1, 64, 32, False, page_size=16))
