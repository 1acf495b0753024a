"""`cutlassfa bench`: the exact FLOP count, interleaved timing, median, skip rules, accuracy marking and
JSON schema on the CPU (cpu backend on tiny shapes, a fake timer where the numbers must be exact); the
per-call overhead benchmark; a tiny real run on a GPU."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math

import numpy as np
import pytest

import cutlassfa
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
    assert bench.FLEX in bench.select_backends(None, window=True)
    assert bench.select_backends(["cpu"], window=True) == ["cpu"]
    # the visible pairs of the window, not the dense count
    case = cases[1]
    assert case.causal and bench.tflops(case, 1.0) * 1e9 == bench.attention_flops(1, 2, 256, 256, 64, True, (32, 0))


def test_read_is_a_default_row_of_decode_runs_only(monkeypatch):
    assert bench.READ in bench.select_backends(None, decode=True)
    assert bench.READ not in bench.select_backends(None) and bench.READ not in bench.select_backends(None, window=True)
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


def test_refusing_backend_is_unsupported_not_an_error():
    def refuse(case):
        def call(q, k, v):
            raise NotImplementedError("float32 is not supported")
        return call

    def crash(case):
        def call(q, k, v):
            raise RuntimeError("illegal memory access")
        return call

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

    def refuse(case):
        def call(q, k, v):
            raise RuntimeError("int64 sum is not supported on this device")
        return call

    def crash(case):
        def call(q, k, v):
            raise RuntimeError("illegal memory access")
        return call

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
        assert all(r["status"] == "unavailable" and r["note"] for r in doc["synchronized"])


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
    assert all(r["status"] == "ok" and r["ms_synchronized"] > 0 for r in doc["synchronized"]), doc["synchronized"]


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


def test_sdpa_anchor_refuses_a_window():
    _torch_cpu()
    case = Case("float32", 1, 2, 2, 64, 64, 32, False, variant=Variant("window", window=(8, 8)))
    with pytest.raises(Unsupported, match="sliding-window"):
        bench.sdpa("sdpa_math").prepare(case)


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
