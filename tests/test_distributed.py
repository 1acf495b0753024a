"""Ring attention (`cutlassfa.distributed.ring_forward`) on CPU with gloo: the gathered result of every
world size 1-4, in both modes (ring, allgather), equals single-process `forward` and the fp64 reference
(causal and not, GQA, uneven and empty chunks, both layouts, Nq != Nk, windows, softcap, sinks, ALiBi,
lse), ranks that disagree raise together instead of hanging; plus the step planner against brute-force
masks, and shard / unshard.

One set of 4 processes runs every case (tests/distributed_harness.py): world sizes 1-3 use subgroups. With
CUDA GPUs (marker `gpu`), the same cases run over NCCL, one process per GPU (up to 8: world sizes past the
machine's GPUs skip as "machine:"), on the default backend.
"""

from __future__ import annotations

import numpy as np
import pytest

import distributed_harness as harness

torch, dist = harness.torch_distributed()

import cutlassfa  # noqa: E402
from cutlassfa import _ring_layout, _ring_plan  # noqa: E402
from cutlassfa.check import bound_for  # noqa: E402
from cutlassfa.distributed import shard, unshard  # noqa: E402
from cutlassfa.reference import attention_reference, rel_l2  # noqa: E402

WORLD, NCCL_WORLD = harness.GLOO_PROCESSES, harness.NCCL_PROCESSES
MODES = ("ring", "allgather")


# --------------------------------------------------------------------------------------------------
# Cases: the full inputs, cut into per-rank chunks here; run by the workers; compared here
# --------------------------------------------------------------------------------------------------

def _first(values: list[int], world: int) -> list[int]:
    """One length per rank: values in order, repeated past their end (world sizes over 4 on GPUs)."""
    return [values[i % len(values)] for i in range(world)]


# name -> (spec), spec keys: heads (Hq, Hkv), d, dtype, causal, layout, lengths (q, k) per world size or
# an int N for shard's cut, window, scale, softcap, sinks, alibi, gather_head_groups (allgather), expect
# ("ok" or the exception every rank raises; a dict of mode -> expect where the modes differ).
SPECS = {
    "dense": dict(heads=(2, 2), d=32, dtype="float32", causal=False, layout="contiguous", n=40),
    "causal_gqa_uneven_strided": dict(heads=(4, 2), d=32, dtype="float32", causal=True, layout="contiguous",
                                      lengths=lambda w: (_first([13, 30, 0, 7], w),) * 2, strided=True),
    "zigzag_causal_mqa": dict(heads=(4, 1), d=64, dtype="float32", causal=True, layout="zigzag", n=50),
    "zigzag_dense_fp16": dict(heads=(2, 2), d=32, dtype="float16", causal=False, layout="zigzag", n=37),
    "zigzag_causal_bf16_scale": dict(heads=(4, 2), d=32, dtype="bfloat16", causal=True, layout="zigzag", n=45,
                                     scale=0.3),
    "nq_lt_nk_bf16": dict(heads=(4, 1), d=32, dtype="bfloat16", causal=True, layout="contiguous",
                          lengths=lambda w: (_first([3, 1, 4, 2], w), _first([20, 9, 0, 14], w))),
    "nq_gt_nk_unseen_rows": dict(heads=(2, 1), d=32, dtype="float32", causal=True, layout="contiguous",
                                 lengths=lambda w: (_first([12, 10, 8, 6], w), _first([4, 0, 5, 2], w))),
    "zigzag_nq_ne_nk": dict(heads=(2, 2), d=32, dtype="float32", causal=True, layout="zigzag", n=(19, 33)),
    "one_token_empty_ranks": dict(heads=(2, 2), d=32, dtype="float32", causal=True, layout="contiguous",
                                  lengths=lambda w: ([int(r == w // 2) for r in range(w)],) * 2),
    "window_not_binding": dict(heads=(2, 1), d=32, dtype="float32", causal=True, layout="zigzag", n=30,
                               window=(30, -1)),
    "sinks_zigzag_causal_gqa": dict(heads=(4, 2), d=32, dtype="float32", causal=True, layout="zigzag", n=40,
                                    sinks=True, gather_head_groups=2),
    "sinks_unseen_rows_bf16": dict(heads=(2, 1), d=32, dtype="bfloat16", causal=True, layout="contiguous",
                                   lengths=lambda w: (_first([12, 10, 8, 6], w), _first([4, 0, 5, 2], w)),
                                   sinks=True),
    "window_band": dict(heads=(2, 1), d=32, dtype="float32", causal=True, layout="contiguous", n=48,
                        window=(5, 0)),
    "window_two_sided_zigzag": dict(heads=(2, 2), d=32, dtype="float32", causal=False, layout="zigzag", n=44,
                                    window=(6, 3)),
    "softcap_zigzag_causal_gqa_fp16": dict(heads=(4, 2), d=64, dtype="float16", causal=True, layout="zigzag", n=42,
                                           softcap=5.0),
    "softcap_window_sinks": dict(heads=(4, 1), d=32, dtype="float32", causal=True, layout="contiguous", n=36,
                                 window=(7, 0), softcap=3.0, sinks=True),
    "alibi_zigzag_causal_gqa": dict(heads=(4, 2), d=32, dtype="float32", causal=True, layout="zigzag", n=46,
                                    alibi=True, expect=dict(ring="NotImplementedError", allgather="ok")),
    "alibi_per_entry_heads_in_three_groups": dict(heads=(6, 3), d=32, dtype="float32", causal=True,
                                                  layout="zigzag", n=38, alibi="per_entry", sinks=True,
                                                  gather_head_groups=3,
                                                  expect=dict(ring="NotImplementedError", allgather="ok")),
    "alibi_per_entry_window_nq_lt_nk": dict(heads=(2, 1), d=32, dtype="bfloat16", causal=True, layout="contiguous",
                                            lengths=lambda w: (_first([3, 1, 4, 2], w), _first([20, 9, 0, 14], w)),
                                            window=(9, 0), alibi="per_entry",
                                            expect=dict(ring="NotImplementedError", allgather="ok")),
    "alibi_non_causal": dict(heads=(2, 2), d=32, dtype="float32", causal=False, layout="contiguous", n=20,
                             alibi=True, expect="NotImplementedError"),
}
# Failure cases: all ranks must raise the same error (they would hang in the ring otherwise).
BAD_SPECS = {
    "ranks_disagree_on_causal": dict(heads=(2, 2), d=32, dtype="float32", causal="rank0", layout="contiguous",
                                     n=16, expect="ValueError"),
    "rank0_passes_3d_q": dict(heads=(2, 2), d=32, dtype="float32", causal=True, layout="contiguous", n=16,
                              rank0_3d=True, expect="ValueError"),
    "rank0_sinks_wrong_shape": dict(heads=(2, 2), d=32, dtype="float32", causal=True, layout="contiguous", n=16,
                                    sinks=True, rank0_bad_sinks=True, expect="ValueError"),
    "ranks_disagree_on_softcap": dict(heads=(2, 2), d=32, dtype="float32", causal=True, layout="contiguous", n=16,
                                      softcap="rank0", expect="ValueError"),
    "zigzag_wrong_lengths": dict(heads=(2, 2), d=32, dtype="float32", causal=True, layout="zigzag",
                                 lengths=lambda w: ([1] + [5] * (w - 1),) * 2, expect="ValueError"),
}


def _expect(spec: dict, mode: str) -> str:
    expect = spec.get("expect", "ok")
    return expect[mode] if isinstance(expect, dict) else expect


def _local_lengths(spec: dict, world: int) -> tuple[list[int], list[int], int, int]:
    """(q lengths, k lengths, Nq, Nk) per rank for this world size."""
    if "lengths" in spec:
        q_lengths, k_lengths = spec["lengths"](world)
        return list(q_lengths), list(k_lengths), sum(q_lengths), sum(k_lengths)
    nq, nk = spec["n"] if isinstance(spec["n"], tuple) else (spec["n"],) * 2
    return [], [], nq, nk


def _cut(x: np.ndarray, lengths: list[int], rank: int, world: int, layout: str) -> np.ndarray:
    if not lengths:
        return np.ascontiguousarray(shard(x, rank, world, layout))
    start = sum(lengths[:rank])
    return np.ascontiguousarray(x[:, :, start:start + lengths[rank]])


def _rank_call(spec: dict, chunks: tuple, rank: int, mode: str, sinks, slopes) -> dict:
    """The keyword arguments of one rank's ring_forward call."""
    q, k, v = chunks
    if spec.get("rank0_3d") and rank == 0:
        q = q[:, 0]
    if sinks is not None and spec.get("rank0_bad_sinks") and rank == 0:
        sinks = sinks[1:]
    causal = (rank == 0) if spec["causal"] == "rank0" else spec["causal"]
    softcap = float(rank == 0) if spec.get("softcap") == "rank0" else spec.get("softcap", 0.0)
    call = dict(q=q, k=k, v=v, causal=causal, layout=spec["layout"], softmax_scale=spec.get("scale"),
                window=spec.get("window"), softcap=softcap, mode=mode, sinks=sinks, alibi_slopes=slopes)
    if spec.get("strided"):
        call["strided"] = ("q", "k", "v")
    call["gather_head_groups"] = spec.get("gather_head_groups", 1)
    return call


def _make_cases(seed: int, groups: dict[int, list[int]]) -> dict:
    """(world, name, mode) -> case (harness format) plus the full inputs for the checks."""
    rng = np.random.default_rng(seed)
    cases = {}
    for world in groups:
        for name, spec in {**SPECS, **BAD_SPECS}.items():
            if name in BAD_SPECS and world == 1:
                continue  # one rank cannot disagree with itself, and zigzag takes any one length
            hq, hkv = spec["heads"]
            q_lengths, k_lengths, nq, nk = _local_lengths(spec, world)
            dtype = np.dtype(cutlassfa._arrays.numpy_dtype(spec["dtype"]))
            q = rng.standard_normal((2, hq, nq, spec["d"])).astype(dtype)
            k = rng.standard_normal((2, hkv, nk, spec["d"])).astype(dtype)
            v = rng.standard_normal((2, hkv, nk, spec["d"])).astype(dtype)
            chunks = [tuple(_cut(x, lengths, r, world, spec["layout"]) for x, lengths in
                            ((q, q_lengths), (k, k_lengths), (v, k_lengths))) for r in range(world)]
            # Sinks: one head without (-inf), the others around the scores' scale.
            sinks = np.concatenate([[-np.inf], rng.normal(0.5, 1.5, hq - 1)]).astype(np.float32)
            sinks = sinks if spec.get("sinks") else None
            slopes = None
            if spec.get("alibi"):
                shape = (2, hq) if spec["alibi"] == "per_entry" else (hq,)
                slopes = rng.uniform(0.01, 0.5, shape).astype(np.float32)
            for mode in (MODES if name in SPECS else ("auto",)):
                cases[(world, name, mode)] = dict(
                    call="ring_forward", world=world,
                    ranks=[_rank_call(spec, chunks[r], r, mode, sinks, slopes) for r in range(world)],
                    spec={key: val for key, val in spec.items() if key != "lengths"}, full=(q, k, v), sinks=sinks,
                    slopes=slopes)
    return cases


def _run(tmp_path_factory: pytest.TempPathFactory, processes: int, device: str) -> dict:
    seed = harness.session_seed()
    groups = harness.groups_for(processes)
    cases = _make_cases(seed, groups)
    results = harness.run(tmp_path_factory.mktemp(f"ring_{device}"), processes, device, cases)
    return dict(seed=seed, groups=groups, cases=cases, results=results, device=device)


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every case on CPU with gloo, 4 processes."""
    return _run(tmp_path_factory, WORLD, "cpu")


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every case on CUDA with NCCL, one process per GPU (up to NCCL_WORLD)."""
    return _run(tmp_path_factory, harness.nccl_processes(NCCL_WORLD), "cuda")


def _case_results(run: dict, world: int, name: str, mode: str) -> tuple[dict, list]:
    if world not in run["groups"]:
        pytest.skip(f"machine: {world} ranks need {world} GPUs, {len(run['results'])} present")
    key = (world, name, mode)
    return run["cases"][key], harness.per_rank(run["results"], run["groups"], world, key)


# --------------------------------------------------------------------------------------------------
# End-to-end
# --------------------------------------------------------------------------------------------------

def _check_case(run: dict, world: int, name: str, mode: str) -> None:
    case, per_rank = _case_results(run, world, name, mode)
    spec, seed = case["spec"], run["seed"]
    expect = _expect(spec, mode)
    statuses = [result[0] for result in per_rank]
    assert statuses == [expect] * world, (seed, [result[1:] if result[0] != "ok" else "ok" for result in per_rank])
    if expect != "ok":
        return
    layout = spec["layout"]
    out = unshard([result[1] for result in per_rank], layout)
    lse = unshard([result[2] for result in per_rank], layout)
    q, k, v = case["full"]
    assert out.shape == q.shape and out.dtype == q.dtype and lse.dtype == np.float32

    window = tuple(-1 if side is None else side for side in spec["window"]) if spec.get("window") else None
    options = dict(causal=spec["causal"], softmax_scale=spec.get("scale"), window=window,
                   softcap=spec.get("softcap", 0.0), sinks=case["sinks"], alibi_slopes=case["slopes"])
    ref, ref_lse = attention_reference(q, k, v, **options)
    # The single-process run: the cpu backend, or on the GPU the default one (numpy in, GPU compute).
    single, single_lse = cutlassfa.forward(q, k, v, backend="cpu" if run["device"] == "cpu" else "auto",
                                           return_lse=True, **{n: x for n, x in options.items() if x is not None})
    bound = bound_for("cpu" if run["device"] == "cpu" else "tensorcore", spec["dtype"])
    # Partial outputs come back in the input dtype before the fp32 merge: half precision rounds once
    # per partial, which stays within the backend's bound.
    assert rel_l2(out.astype(np.float64), ref) <= bound.rel_l2, (seed, rel_l2(out.astype(np.float64), ref))
    assert rel_l2(out.astype(np.float64), single.astype(np.float64)) <= bound.rel_l2, seed
    seen = np.isfinite(ref_lse)
    unseen_lse = -np.inf if case["sinks"] is None else np.broadcast_to(case["sinks"][None, :, None], lse.shape)
    assert np.all(lse[~seen] == np.broadcast_to(unseen_lse, lse.shape)[~seen]), seed
    assert np.all(out[~seen].astype(np.float64) == 0), seed
    np.testing.assert_allclose(lse[seen], ref_lse[seen], atol=bound.lse, rtol=0, err_msg=f"seed {seed}")
    np.testing.assert_allclose(lse[seen], single_lse[seen], atol=bound.lse, rtol=0, err_msg=f"seed {seed}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_ring_matches_single_process_and_reference(ring_run, world, name, mode):
    _check_case(ring_run, world, name, mode)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world", range(1, NCCL_WORLD + 1))
@pytest.mark.parametrize("name", sorted(SPECS))
def test_ring_nccl_matches_single_gpu_and_reference(nccl_run, world, name, mode):
    _check_case(nccl_run, world, name, mode)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("name", sorted(BAD_SPECS))
def test_ranks_raise_together(ring_run, world, name):
    case, per_rank = _case_results(ring_run, world, name, "auto")
    assert [result[0] for result in per_rank] == [case["spec"]["expect"]] * world, per_rank


@pytest.mark.gpu
@pytest.mark.parametrize("world", range(2, NCCL_WORLD + 1))
@pytest.mark.parametrize("name", sorted(BAD_SPECS))
def test_ranks_raise_together_nccl(nccl_run, world, name):
    case, per_rank = _case_results(nccl_run, world, name, "auto")
    assert [result[0] for result in per_rank] == [case["spec"]["expect"]] * world, per_rank


def test_ring_forward_needs_a_process_group():
    from cutlassfa.distributed import ring_forward

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    q = torch.zeros(1, 1, 4, 32)
    with pytest.raises(RuntimeError, match="process group"):
        ring_forward(q, q, q)


# --------------------------------------------------------------------------------------------------
# The planner (no processes): every step's pieces give each row exactly the keys the global mask allows
# --------------------------------------------------------------------------------------------------

def _piece_mask(piece: _ring_plan.Piece, nq: int, nk: int) -> np.ndarray:
    """The (nq, nk) mask one `forward` call of `piece` applies, written from forward's documented
    semantics: bottom-right causal j <= i + Nk - Nq; window [i + Nk - Nq - left, i + Nk - Nq + right]."""
    (r0, r1), (k0, k1) = piece.rows, piece.keys
    i, j = np.arange(r1 - r0)[:, None], np.arange(k1 - k0)[None, :]
    shift = (k1 - k0) - (r1 - r0)
    visible = np.ones((r1 - r0, k1 - k0), dtype=bool)
    if piece.causal:
        visible &= j <= i + shift
    if piece.window is not None:
        left, right = piece.window
        visible &= (j >= i + shift - left) & (j <= i + shift + right)
    mask = np.zeros((nq, nk), dtype=bool)
    mask[r0:r1, k0:k1] = visible
    return mask


def test_plan_covers_exactly_the_global_mask(rng):
    for _ in range(300):
        world = int(rng.integers(1, 5))
        layout = str(rng.choice(_ring_layout.LAYOUTS))
        nq = int(rng.integers(0, 40))
        nk = nq if rng.random() < 0.5 else int(rng.integers(0, 40))
        if layout == "contiguous":
            q_lengths = list(rng.multinomial(nq, np.ones(world) / world))
            k_lengths = list(rng.multinomial(nk, np.ones(world) / world))
        else:
            q_lengths = [shard(np.zeros((1, 1, nq)), r, world, layout).shape[2] for r in range(world)]
            k_lengths = [shard(np.zeros((1, 1, nk)), r, world, layout).shape[2] for r in range(world)]
        q_runs, k_runs = _ring_layout.segments(layout, q_lengths), _ring_layout.segments(layout, k_lengths)
        left = None if rng.random() < 0.4 else int(rng.integers(0, 12))
        right = None if rng.random() < 0.4 else int(rng.integers(0, 12))
        mask = _ring_plan.Mask(nk - nq, bool(rng.integers(2)), left, right)
        for r in range(world):
            for src in range(world):
                q_pos, k_pos = _ring_layout.positions(q_runs[r]), _ring_layout.positions(k_runs[src])
                i, j = q_pos[:, None], k_pos[None, :]
                wanted = (j <= i + mask.offset + mask.upper) & (j >= i + mask.offset - mask.lower)
                pieces = _ring_plan.plan(q_pos, k_pos, mask)
                covered = sum((_piece_mask(p, len(q_pos), len(k_pos)).astype(int) for p in pieces),
                              np.zeros(wanted.shape, dtype=int))
                case = (layout, q_lengths, k_lengths, mask, r, src, pieces)
                assert np.array_equal(covered, wanted), case  # every visible pair once, nothing else
                rows = np.zeros(len(q_pos), dtype=int)
                for p in pieces:
                    rows[p.rows[0]:p.rows[1]] += 1
                    assert _piece_mask(p, len(q_pos), len(k_pos))[p.rows[0]:p.rows[1]].any(axis=1).all(), case
                    assert p.window is None or min(p.window) >= 0, case
                    assert p.window is None or mask.left is not None, case  # bands only from a left bound
                assert rows.max(initial=0) <= 1, case  # pieces of one step never share a row
                assert _ring_plan.sees_any(q_runs[r], k_runs[src], mask) == wanted.any(), case


def test_plan_of_causal_zigzag_is_one_call_per_step():
    """The point of zigzag: under a causal mask each step is one call, half the rows or half the keys
    (own block: the causal diagonal)."""
    world, n = 4, 16
    runs = _ring_layout.segments("zigzag", [n] * world)
    for r in range(world):
        for step in range(world):
            src = (r - step) % world
            pieces = _ring_plan.plan(_ring_layout.positions(runs[r]), _ring_layout.positions(runs[src]),
                                     _ring_plan.Mask(0, True))
            if src == r:
                expected = [_ring_plan.Piece((0, n), (0, n), causal=True)]
            elif src < r:
                expected = [_ring_plan.Piece((0, n), (0, n // 2))]
            else:
                expected = [_ring_plan.Piece((n // 2, n), (0, n))]
            assert pieces == expected, (r, src, pieces)


def test_steps_needed_stops_the_ring_past_the_window():
    causal = _ring_plan.Mask(0, True)
    runs = _ring_layout.segments("contiguous", [8] * 4)
    assert _ring_plan.steps_needed(runs, runs, causal) == 4
    assert _ring_plan.steps_needed(runs, runs, _ring_plan.Mask(0, True, 3, None)) == 2  # previous block only
    assert _ring_plan.steps_needed(runs, runs, _ring_plan.Mask(0, True, 8, None)) == 2
    assert _ring_plan.steps_needed(runs, runs, _ring_plan.Mask(0, True, 9, None)) == 3
    assert _ring_plan.steps_needed(runs, runs, _ring_plan.Mask(0, False, 0, 0)) == 1  # the diagonal only
    # Nq > Nk, causal: the first 32 - 4 queries see nothing, the rest only rank 0's keys.
    assert _ring_plan.steps_needed(runs, _ring_layout.segments("contiguous", [4, 0, 0, 0]), causal) == 4
    assert _ring_plan.steps_needed(runs, _ring_layout.segments("contiguous", [0, 0, 0, 0]), causal) == 0


# --------------------------------------------------------------------------------------------------
# shard / unshard
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", _ring_layout.LAYOUTS)
@pytest.mark.parametrize("n", [0, 1, 7, 24, 29])
def test_shard_unshard_round_trip(layout, n):
    x = np.arange(2 * 3 * n * 4).reshape(2, 3, n, 4)
    for world in (1, 2, 3, 4):
        chunks = [shard(x, r, world, layout) for r in range(world)]
        assert sum(c.shape[2] for c in chunks) == n
        assert max(c.shape[2] for c in chunks) - min(c.shape[2] for c in chunks) <= 2
        np.testing.assert_array_equal(unshard(chunks, layout), x)
        t_chunks = [shard(torch.from_numpy(x), r, world, layout) for r in range(world)]
        assert all(isinstance(c, torch.Tensor) for c in t_chunks)
        np.testing.assert_array_equal(unshard(t_chunks, layout).numpy(), x)
        lse = x[..., 0]  # (B, H, N): the same dim 2
        np.testing.assert_array_equal(unshard([shard(lse, r, world, layout) for r in range(world)], layout), lse)


def test_zigzag_chunks_are_r_and_mirror():
    x = np.arange(16)[None, None, :]
    assert shard(x, 0, 4, "zigzag")[0, 0].tolist() == [0, 1, 14, 15]
    assert shard(x, 3, 4, "zigzag")[0, 0].tolist() == [6, 7, 8, 9]
    # 10 over 2 ranks: chunks of 3, 3, 2, 2; rank 0 holds chunks 0 and 3.
    assert shard(np.arange(10)[None, None, :], 0, 2, "zigzag")[0, 0].tolist() == [0, 1, 2, 8, 9]


def test_layout_errors():
    with pytest.raises(ValueError, match="layout"):
        shard(np.zeros((1, 1, 4, 32)), 0, 2, "striped")
    with pytest.raises(ValueError, match="rank"):
        shard(np.zeros((1, 1, 4, 32)), 2, 2)
    with pytest.raises(ValueError, match="zigzag"):
        unshard([np.zeros((1, 1, 1, 32)), np.zeros((1, 1, 5, 32))], "zigzag")


def test_ring_bench_smoke_run_on_cpu(tmp_path):
    """scripts/ring_bench.py with one process on the CPU (in this process: no second torch import):
    it runs, and its own check finds the ring right."""
    import json

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    result = tmp_path / "ring.json"
    assert harness.run_script("ring_bench", ["--device", "cpu", "--seqlens", "96", "--heads", "2:1", "--head-dim", "32",
                                             "--dtype", "float32", "--iters", "1", "--warmup", "0", "--json",
                                             str(result), "--modes", "ring", "allgather"]) == 0
    ring, gathered = json.loads(result.read_text())["rows"]
    assert ring["mode"] == ring["resolved_mode"] == "ring" and ring["steps"] == 1
    assert gathered["mode"] == gathered["resolved_mode"] == "allgather" and gathered["pieces"] == 2  # zigzag runs
    for row in (ring, gathered):
        assert row["N"] == 96 and row["W"] == 1
        assert row["check_rel_l2"] <= 1e-5 and row["check_lse_max_abs"] <= 1e-5
        assert row["ring_s"] > 0 and row["single_s"] > 0 and row["compute_s"] > 0 and row["exchange_s"] > 0
