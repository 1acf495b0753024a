"""Packed documents across ranks (`ring_varlen_forward`) and decoding against a sharded KV cache
(`sharded_decode`), on CPU with gloo at world sizes 1-4 (and NCCL on GPUs, marker `gpu`): every rank's
result against the fp64 reference of the whole batch or cache, ranks that disagree raising together; plus
shard_varlen / unshard_varlen.
"""

from __future__ import annotations

import numpy as np
import pytest

import distributed_harness as harness

torch, dist = harness.torch_distributed()

import cutlassfa  # noqa: E402
from cutlassfa.check import bound_for  # noqa: E402
from cutlassfa.distributed import shard_varlen, shard_varlen_rows, unshard_varlen  # noqa: E402
from cutlassfa.reference import attention_reference, rel_l2  # noqa: E402

WORLD, NCCL_WORLD = harness.GLOO_PROCESSES, harness.NCCL_PROCESSES

# --------------------------------------------------------------------------------------------------
# Packed documents
# --------------------------------------------------------------------------------------------------

# name -> spec: heads, d, dtype, q and k document lengths, causal, window, softcap, sinks, alibi, expect.
VARLEN = {
    "causal_gqa_uneven_docs": dict(heads=(4, 2), d=32, dtype="float32", docs=[37, 1, 0, 64, 19], causal=True),
    "dense_bf16": dict(heads=(2, 2), d=64, dtype="bfloat16", docs=[23, 40, 9], causal=False),
    "causal_nq_ne_nk": dict(heads=(2, 1), d=32, dtype="float32", docs=[12, 30, 5], k_docs=[20, 30, 2], causal=True),
    "window_softcap_sinks": dict(heads=(4, 1), d=32, dtype="float32", docs=[50, 17, 33], causal=True, window=(6, 0),
                                 softcap=4.0, sinks=True),
    "sinks_alibi_heads_in_two_groups": dict(heads=(6, 3), d=32, dtype="float32", docs=[21, 40, 3], causal=True,
                                            sinks=True, alibi="per_entry", gather_head_groups=2),
    "alibi_per_document_fp16": dict(heads=(4, 2), d=32, dtype="float16", docs=[29, 44, 8], causal=True,
                                    alibi="per_entry"),
    "alibi_heads_window_right_zero": dict(heads=(2, 2), d=32, dtype="float32", docs=[26, 15], causal=False,
                                          window=(-1, 0), alibi=True),
    "two_sided_window": dict(heads=(2, 2), d=32, dtype="float32", docs=[20, 20], causal=False, window=(3, 2),
                             expect="NotImplementedError"),
    "alibi_dense": dict(heads=(2, 2), d=32, dtype="float32", docs=[20, 12], causal=False, alibi=True,
                        expect="NotImplementedError"),
    "ranks_disagree_on_documents": dict(heads=(2, 2), d=32, dtype="float32", docs=[20, 12], causal=True,
                                        rank0_docs=[12, 20], expect="ValueError"),
}


def _reference_varlen(q, k, v, cu_q, cu_k, spec, sinks, slopes):
    """fp64 attention of each document alone: (out (total_q, Hq, d), lse (Hq, total_q))."""
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qb, kb, vb = (x[None, lo:hi].transpose(0, 2, 1, 3) for x, lo, hi in
                      ((q, cu_q[b], cu_q[b + 1]), (k, cu_k[b], cu_k[b + 1]), (v, cu_k[b], cu_k[b + 1])))
        alibi = None if slopes is None else (slopes[b] if slopes.ndim == 2 else slopes)
        out, lse = attention_reference(qb, kb, vb, causal=spec["causal"], window=spec.get("window"),
                                       softcap=spec.get("softcap", 0.0), sinks=sinks, alibi_slopes=alibi)
        outs.append(out[0].transpose(1, 0, 2))
        lses.append(lse[0])
    return np.concatenate(outs, axis=0), np.concatenate(lses, axis=1)


def _varlen_cases(rng, groups):
    cases = {}
    for world in groups:
        for name, spec in VARLEN.items():
            hq, hkv = spec["heads"]
            dtype = np.dtype(cutlassfa._arrays.numpy_dtype(spec["dtype"]))
            cu_q = np.concatenate([[0], np.cumsum(spec["docs"])]).astype(np.int64)
            cu_k = np.concatenate([[0], np.cumsum(spec.get("k_docs", spec["docs"]))]).astype(np.int64)
            q = rng.standard_normal((cu_q[-1], hq, spec["d"])).astype(dtype)
            k, v = (rng.standard_normal((cu_k[-1], hkv, spec["d"])).astype(dtype) for _ in range(2))
            sinks = np.concatenate([[-np.inf], rng.normal(0.5, 1.5, hq - 1)]).astype(np.float32) \
                if spec.get("sinks") else None
            slopes = None
            if spec.get("alibi"):
                shape = (len(spec["docs"]), hq) if spec["alibi"] == "per_entry" else (hq,)
                slopes = rng.uniform(0.01, 0.5, shape).astype(np.float32)
            ranks = []
            for r in range(world):
                cu_q_r = cu_q
                if spec.get("rank0_docs") and r == 0 and world > 1:
                    cu_q_r = np.concatenate([[0], np.cumsum(spec["rank0_docs"])])
                ranks.append(dict(q=shard_varlen(q, cu_q, r, world), k=shard_varlen(k, cu_k, r, world),
                                  v=shard_varlen(v, cu_k, r, world), cu_seqlens_q=cu_q_r.tolist(),
                                  cu_seqlens_k=cu_k.tolist(), causal=spec["causal"], window=spec.get("window"),
                                  softcap=spec.get("softcap", 0.0), sinks=sinks, alibi_slopes=slopes,
                                  gather_head_groups=spec.get("gather_head_groups", 1)))
            expect = spec.get("expect", "ok")
            if spec.get("rank0_docs") and world == 1:
                expect = "ok"
            cases[("varlen", world, name)] = dict(call="ring_varlen_forward", world=world, ranks=ranks, spec=spec,
                                                  full=(q, k, v, cu_q, cu_k), sinks=sinks, slopes=slopes,
                                                  expect=expect)
    return cases


# --------------------------------------------------------------------------------------------------
# Sharded decode
# --------------------------------------------------------------------------------------------------

# name -> spec: heads, d, dtype, Nq, cache lengths per entry (the queries' own keys included), causal,
# append (k_new on the owner), paged page size, owner, softcap, sinks, expect.
DECODE = {
    "one_token_gqa": dict(heads=(8, 2), d=64, dtype="float32", nq=1, lengths=[57, 3, 40], causal=True),
    "four_tokens_causal_owner0_bf16": dict(heads=(4, 1), d=64, dtype="bfloat16", nq=4, lengths=[30, 9, 64],
                                           causal=True, owner=0),
    "append_softcap_sinks": dict(heads=(4, 2), d=32, dtype="float32", nq=3, lengths=[26, 41], causal=True,
                                 append=True, softcap=6.0, sinks=True),
    "paged_append_mqa": dict(heads=(4, 1), d=32, dtype="float32", nq=2, lengths=[35, 18, 50], causal=True,
                             append=True, page=8),
    "dense_queries": dict(heads=(2, 2), d=32, dtype="float32", nq=3, lengths=[25, 12], causal=False),
    "unchecked_ranks_append": dict(heads=(4, 2), d=32, dtype="float32", nq=1, lengths=[19, 33], causal=True,
                                   append=True, check_ranks=False),
    "owner_out_of_range": dict(heads=(2, 2), d=32, dtype="float32", nq=1, lengths=[10], causal=True, owner=9,
                               expect="ValueError"),
    "rank0_cache_dtype": dict(heads=(2, 2), d=32, dtype="float32", nq=1, lengths=[10, 20], causal=True,
                              rank0_fp16_cache=True, expect="rank0 TypeError"),
}


def _paged(cache: np.ndarray, page: int, table: np.ndarray) -> np.ndarray:
    """A (B, Hkv, capacity, d) cache as a pool of pages: page p of entry b at pool[table[b, p]]."""
    b, h, capacity, d = cache.shape
    per_entry = table.shape[1]
    padded = np.zeros((b, h, per_entry * page, d), cache.dtype)
    padded[:, :, :capacity] = cache
    pages = padded.reshape(b, h, per_entry, page, d).transpose(0, 2, 1, 3, 4).reshape(b * per_entry, h, page, d)
    pool = np.empty_like(pages)
    pool[table.reshape(-1)] = pages
    return pool


def _decode_cases(rng, groups):
    cases = {}
    for world in groups:
        for name, spec in DECODE.items():
            hq, hkv = spec["heads"]
            nq, d, lengths = spec["nq"], spec["d"], spec["lengths"]
            dtype = np.dtype(cutlassfa._arrays.numpy_dtype(spec["dtype"]))
            batch, longest = len(lengths), max(lengths)
            q = rng.standard_normal((batch, hq, nq, d)).astype(dtype)
            k, v = (rng.standard_normal((batch, hkv, longest, d)).astype(dtype) for _ in range(2))
            owner = spec.get("owner", world - 1)
            # Each entry's older keys go to random ranks, in a random order; its last nq keys (the queries'
            # own) to the owner, last, or as k_new when appended.
            held = [[[] for _ in range(batch)] for _ in range(world)]
            for b, n in enumerate(lengths):
                for j in rng.permutation(n - nq):
                    held[int(rng.integers(world))][b].append(int(j))
                if not spec.get("append") and 0 <= owner < world:
                    held[owner][b].extend(range(n - nq, n))
            capacity = max(len(h) for rank_held in held for h in rank_held) + nq + 3
            k_new = np.stack([k[b, :, n - nq:n] for b, n in enumerate(lengths)]) if spec.get("append") else None
            v_new = np.stack([v[b, :, n - nq:n] for b, n in enumerate(lengths)]) if spec.get("append") else None
            sinks = np.concatenate([[-np.inf], rng.normal(0.5, 1.5, hq - 1)]).astype(np.float32) \
                if spec.get("sinks") else None
            ranks = []
            for r in range(world):
                k_cache, v_cache = (np.zeros((batch, hkv, capacity, d), dtype) for _ in range(2))
                for b, rows in enumerate(held[r]):
                    k_cache[b, :, :len(rows)], v_cache[b, :, :len(rows)] = k[b][:, rows], v[b][:, rows]
                if spec.get("rank0_fp16_cache") and r == 0:
                    k_cache = k_cache.astype(np.float16)
                call = dict(q=q, cache_seqlens=np.array([len(rows) for rows in held[r]], np.int32),
                            causal=spec["causal"], owner=spec.get("owner"), softcap=spec.get("softcap", 0.0),
                            sinks=sinks, check_ranks=spec.get("check_ranks", True))
                if spec.get("page"):
                    per_entry = -(-capacity // spec["page"])
                    table = rng.permutation(batch * per_entry).reshape(batch, per_entry).astype(np.int32)
                    call.update(k_cache=_paged(k_cache, spec["page"], table),
                                v_cache=_paged(v_cache, spec["page"], table), block_table=table)
                else:
                    call.update(k_cache=k_cache, v_cache=v_cache)
                if k_new is not None:
                    call.update(k_new=k_new, v_new=v_new)
                ranks.append(call)
            cases[("decode", world, name)] = dict(call="sharded_decode", world=world, ranks=ranks, spec=spec,
                                                  full=(q, k, v, lengths), sinks=sinks,
                                                  expect=spec.get("expect", "ok"))
    return cases


# --------------------------------------------------------------------------------------------------
# The runs
# --------------------------------------------------------------------------------------------------

def _run(tmp_path_factory, processes: int, device: str) -> dict:
    seed = harness.session_seed()
    rng = np.random.default_rng(seed)
    groups = harness.groups_for(processes)
    cases = {**_varlen_cases(rng, groups), **_decode_cases(rng, groups)}
    results = harness.run(tmp_path_factory.mktemp(f"cp_{device}"), processes, device, cases)
    return dict(seed=seed, groups=groups, cases=cases, results=results, device=device)


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    return _run(tmp_path_factory, WORLD, "cpu")


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory):
    return _run(tmp_path_factory, harness.nccl_processes(NCCL_WORLD), "cuda")


def _results(run, key):
    world = key[1]
    if world not in run["groups"]:
        pytest.skip(f"machine: {world} ranks need {world} GPUs, {len(run['results'])} present")
    case = run["cases"][key]
    per_rank = harness.per_rank(run["results"], run["groups"], world, key)
    statuses = [result[0] for result in per_rank]
    expect = [case["expect"]] * world
    if case["expect"] == "rank0 TypeError":  # rank 0's own error; the others say which rank was invalid
        expect = ["TypeError"] + ["ValueError"] * (world - 1)
    assert statuses == expect, (run["seed"], [r[1:] if r[0] != "ok" else "ok" for r in per_rank])
    return case, per_rank


def _check_varlen(run, world, name):
    case, per_rank = _results(run, ("varlen", world, name))
    if case["expect"] != "ok":
        return
    q, k, v, cu_q, cu_k = case["full"]
    out = unshard_varlen([r[1] for r in per_rank], cu_q)
    lse = unshard_varlen([r[2] for r in per_rank], cu_q, dim=1)
    ref, ref_lse = _reference_varlen(q, k, v, cu_q, cu_k, case["spec"], case["sinks"], case["slopes"])
    bound = bound_for("cpu" if run["device"] == "cpu" else "tensorcore", case["spec"]["dtype"])
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (q.shape[1], q.shape[0])
    assert rel_l2(out.astype(np.float64), ref) <= bound.rel_l2, (run["seed"], rel_l2(out.astype(np.float64), ref))
    seen = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[seen], ref_lse[seen], atol=bound.lse, rtol=0, err_msg=f"seed {run['seed']}")
    assert np.all(lse[~seen] == ref_lse[~seen]) and np.all(out.transpose(1, 0, 2)[~seen] == 0), run["seed"]


def _check_decode(run, world, name):
    case, per_rank = _results(run, ("decode", world, name))
    if case["expect"] != "ok":
        return
    q, k, v, lengths = case["full"]
    spec = case["spec"]
    bound = bound_for("cpu" if run["device"] == "cpu" else "tensorcore", spec["dtype"])
    for b, n in enumerate(lengths):
        ref, ref_lse = attention_reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=spec["causal"],
                                           softcap=spec.get("softcap", 0.0), sinks=case["sinks"])
        for rank, (_, out, lse) in enumerate(per_rank):
            assert rel_l2(out[b:b + 1].astype(np.float64), ref) <= bound.rel_l2, (run["seed"], rank, b)
            np.testing.assert_allclose(lse[b:b + 1], ref_lse, atol=bound.lse, rtol=0,
                                       err_msg=f"seed {run['seed']} rank {rank} entry {b}")
    for _, out, lse in per_rank[1:]:  # every rank holds the same merged result
        np.testing.assert_array_equal(out, per_rank[0][1])
        np.testing.assert_array_equal(lse, per_rank[0][2])


# (the check of a case, its name) for every case: packed documents and sharded decode.
CASES = [(_check_varlen, name) for name in sorted(VARLEN)] + [(_check_decode, name) for name in sorted(DECODE)]
CASE_IDS = [f"{'varlen' if check is _check_varlen else 'decode'}-{name}" for check, name in CASES]


@pytest.mark.parametrize("world", range(1, WORLD + 1))
@pytest.mark.parametrize("check, name", CASES, ids=CASE_IDS)
def test_matches_reference(gloo_run, world, check, name):
    check(gloo_run, world, name)


@pytest.mark.gpu
@pytest.mark.parametrize("world", range(1, NCCL_WORLD + 1))
@pytest.mark.parametrize("check, name", CASES, ids=CASE_IDS)
def test_nccl_matches_reference(nccl_run, world, check, name):
    check(nccl_run, world, name)


# --------------------------------------------------------------------------------------------------
# The layout
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("docs", [[0], [7], [16, 3, 0, 25], [1, 1, 1]])
def test_shard_varlen_round_trip_and_balance(docs):
    cu = np.concatenate([[0], np.cumsum(docs)])
    x = np.arange(cu[-1] * 6).reshape(cu[-1], 2, 3)
    for world in (1, 2, 3, 4):
        chunks = [shard_varlen(x, cu, r, world) for r in range(world)]
        np.testing.assert_array_equal(unshard_varlen(chunks, cu), x)
        t_chunks = [shard_varlen(torch.from_numpy(x), cu, r, world) for r in range(world)]
        np.testing.assert_array_equal(unshard_varlen(t_chunks, cu).numpy(), x)
        rows = [shard_varlen_rows(cu, r, world) for r in range(world)]
        assert sorted(np.concatenate(rows).tolist()) == list(range(cu[-1]))
        for b, n in enumerate(docs):  # chunks r and 2W-1-r of every document, each within one of n / 2W
            start = cu[b]
            for r in range(world):
                mine = [row - start for row in rows[r] if start <= row < start + n]
                assert abs(len(mine) - 2 * n / (2 * world)) <= 2


def test_shard_varlen_holds_chunk_r_then_its_mirror():
    # One document of 16 over 2 ranks: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
    assert shard_varlen_rows([0, 16], 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert shard_varlen_rows([0, 16], 1, 2).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    # Two documents: the first chunks of both, then the second chunks of both.
    assert shard_varlen_rows([0, 4, 8], 0, 2).tolist() == [0, 4, 3, 7]


def test_cp_bench_smoke_run_on_cpu(tmp_path):
    """scripts/cp_bench.py with one process on the CPU (in this process): it runs both cases, and its own
    checks find them right."""
    import json

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    result = tmp_path / "cp.json"
    assert harness.run_script("cp_bench", ["--device", "cpu", "--total", "1024", "--documents", "4", "--min-doc", "64",
                                           "--max-doc", "512", "--cache", "2048", "--heads", "4:2", "--head-dim", "32",
                                           "--dtype", "float32", "--batches", "2", "--page", "64", "--iters", "1",
                                           "--warmup", "0", "--json", str(result)]) == 0
    rows = json.loads(result.read_text())["rows"]
    assert [(row["case"], row.get("paged")) for row in rows] == [("packed", None), ("decode", False), ("decode", True)]
    packed = rows[0]
    assert sum(packed["documents"]) == 1024 and all(64 <= n <= 512 for n in packed["documents"])
    for row in rows:
        assert row["W"] == 1 and row["check_rel_l2"] <= 1e-5 and row["t_w_s"] > 0 and row["t_1_s"] > 0
        assert "timeline" not in row


def test_cp_bench_decode_timeline_on_cpu(tmp_path):
    """--timeline: a decode row carries the step's parts in order (on the CPU its top-level operations: the
    rank's forward, the send buffer's copies, the all_gather, the merge)."""
    import json

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    result = tmp_path / "cp.json"
    assert harness.run_script("cp_bench", ["--device", "cpu", "--cases", "decode", "--cache", "1024", "--heads", "4:2",
                                           "--head-dim", "32", "--dtype", "float32", "--batches", "1", "--page", "0",
                                           "--iters", "1", "--warmup", "0", "--timeline", "--json", str(result)]) == 0
    (row,) = json.loads(result.read_text())["rows"]
    steps = row["timeline"]
    assert steps and steps[0]["start_us"] == 0
    assert all(later["start_us"] >= earlier["start_us"] for earlier, later in zip(steps, steps[1:]))
    assert all(step["us"] >= 0 for step in steps)
    assert any("all_gather" in step["name"] for step in steps), [step["name"] for step in steps]


def test_cp_scaling_reads_the_committed_results():
    """scripts/cp_scaling.py turns the committed ring_bench and cp_bench results into its table: every row
    of every file, efficiencies as the files give them."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "bench" / "results").glob("nvidia-h200x4-*.json"))
    assert files, "the context-parallel results are committed"
    spec = importlib.util.spec_from_file_location("cp_scaling", root / "scripts" / "cp_scaling.py")
    scaling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scaling)
    rows = [row for path in files for row in scaling.rows_of(path)]
    assert len(rows) == sum(len(json.loads(path.read_text())["rows"]) for path in files)
    lines = scaling.table(rows).splitlines()
    assert len(lines) == len(rows) + 2
    for row, line in zip(rows, lines[2:]):
        if row["efficiency"] is not None:
            assert f"| {row['efficiency']:.3f} |" in line
            assert abs(row["efficiency"] - row["t_1"] / (row["W"] * row["t_w"])) < 1e-9


def test_cp_collective_probe_on_cpu(tmp_path):
    """scripts/cp_collective_probe.py with one process on the CPU: the gloo all_gather row is timed and exact
    (the -inf entries included), the symmetric-memory row says why it did not run there."""
    import json

    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    result = tmp_path / "probe.json"
    assert harness.run_script("cp_collective_probe", ["--device", "cpu", "--floats", "129", "4128", "--calls", "2",
                                                      "--replays", "2", "--iters", "1", "--warmup", "0",
                                                      "--json", str(result)]) == 0
    rows = json.loads(result.read_text())["rows"]
    assert [(row["variant"], row["floats"]) for row in rows] == [
        ("nccl", 129), ("symmetric_memory", 129), ("nccl", 4128), ("symmetric_memory", 4128)]
    for row in rows:
        if row["variant"] == "nccl":
            assert row["exact"] is True and row["s"] > 0 and row["bytes"] == 4 * row["floats"]
        else:
            assert "s" not in row and row["unavailable"]
