"""Runs every available GPU backend over a small version of the GPU test matrix (ragged N, Nq != Nk,
causal, GQA, each dtype and head dim) and checks each result against the fp64 reference under the
gate's bounds. Meant to run under compute-sanitizer (scripts/sanitize.sh), so shapes stay small.
With PyTorch's CUDA tensors it also runs the variants (windows, softcap, zero-padded head dims, KV
caches contiguous and paged with appended keys and left padding, split keys, varlen).

Host (numpy) arrays are compacted before the launch, so they test compact layouts only; the strided
cases run the kernels on CUDA tensors in the transposed and padded layouts of cutlassfa._inputs with a
strided `out=` (needs PyTorch with CUDA; --no-strided leaves them out, and says so).

    python scripts/sanitize_cases.py [--no-strided] [--no-variants | --variants-only] [backend ...]
"""

import sys

import numpy as np

import cutlassfa
from cutlassfa._inputs import Case, as_layout, case_values, numpy_dtype, to_numpy64
from cutlassfa.check import bound_for
from cutlassfa.reference import attention_reference, kvcache_reference, rel_l2, varlen_reference

SHAPES = [(1, 2, 2, 1, 1), (1, 2, 1, 77, 77), (1, 2, 2, 130, 65), (1, 2, 2, 65, 190)]  # B, Hq, Hkv, Nq, Nk
STRIDED_LAYOUTS = ("bnhd", "padded")
DTYPES = ("float32", "float16", "bfloat16")


def _run(backend, case, values, layout):
    """One forward; returns its rel-L2 error. layout None: numpy host arrays."""
    ref, _ = attention_reference(*values, causal=case.causal)
    if layout is None:
        q, k, v = (x.astype(numpy_dtype(case.dtype)) for x in values)
        out, _ = cutlassfa.forward(q, k, v, causal=case.causal, backend=backend, return_lse=True)
    else:
        q, k, v = (as_layout(x, case.dtype, "torch", layout)[0] for x in values)
        out, _ = as_layout(np.zeros(ref.shape, np.float32), case.dtype, "torch", layout)
        cutlassfa.forward(q, k, v, causal=case.causal, backend=backend, out=out, return_lse=True)
    return rel_l2(to_numpy64(out), ref)


def _variant_runs(backend, dtype, rng):
    """(label, rel-L2) of each variant case on CUDA tensors; head dims that the kernels zero-pad."""
    import torch

    tdtype = getattr(torch, dtype)

    def cuda(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to("cuda", tdtype)

    def host(x):
        return x.astype(numpy_dtype(dtype)).astype(np.float64)  # the values the kernel sees

    def index(x):
        return torch.tensor(np.asarray(x, np.int32), device="cuda")

    def normal(*shape):
        return host(rng.standard_normal(shape))

    runs = []
    for d in (40, 96, 128, 200, 256):
        if not cutlassfa.supports(backend, dtype, d):
            continue
        # Window with and without softcap, GQA, Nq != Nk (d = 128: the warp-specialized kernel on sm_90).
        q, k, v = normal(1, 4, 77, d), normal(1, 2, 130, d), normal(1, 2, 130, d)
        sinks = np.array([-np.inf, 0.5, 2.0, -1.0], np.float32)
        slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
        for cap in (0.0, 20.0):  # with softcap, attention sinks and ALiBi too
            kept, bias = (sinks, slopes) if cap else (None, None)
            out = cutlassfa.forward(cuda(q), cuda(k), cuda(v), window=(7, 3), softcap=cap, backend=backend,
                                    sinks=None if kept is None else torch.from_numpy(kept).cuda(),
                                    alibi_slopes=None if bias is None else torch.from_numpy(bias).cuda())
            ref = attention_reference(q, k, v, window=(7, 3), softcap=cap, sinks=kept, alibi_slopes=bias)[0]
            runs.append((f"window softcap={cap} sinks, alibi={kept is not None} d={d}", rel_l2(to_numpy64(out), ref)))
        # A paged cache (page size 5, shuffled pages) with appended keys, left padding and split keys.
        b, hkv, pages_per_seq, page = 2, 2, 8, 5
        cap_rows = pages_per_seq * page
        kc, vc = normal(b, hkv, cap_rows, d), normal(b, hkv, cap_rows, d)
        kn, vn, qn = normal(b, hkv, 3, d), normal(b, hkv, 3, d), normal(b, 4, 3, d)
        lengths, leftpad = np.array([20, 34]), np.array([0, 6])
        table = rng.permutation(b * pages_per_seq).reshape(b, pages_per_seq)  # logical page -> physical

        def paged(cache):
            pages = np.empty((b * pages_per_seq, hkv, page, d))
            for seq in range(b):
                for j in range(pages_per_seq):
                    pages[table[seq, j]] = cache[seq, :, j * page:(j + 1) * page]
            return pages

        kp, vp = cuda(paged(kc)), cuda(paged(vc))
        bias = np.array([[0.5, 0.25, 0.125, 0.0625], [0.3, 0.2, 0.1, 0.05]], np.float32)  # ALiBi per entry
        out = cutlassfa.forward(cuda(qn), kp, vp, cache_seqlens=index(lengths), cache_leftpad=index(leftpad),
                                block_table=index(table), k_new=cuda(kn), v_new=cuda(vn), causal=True,
                                num_splits=3 if backend.startswith("tensorcore") else None, backend=backend,
                                alibi_slopes=torch.from_numpy(bias).cuda())
        ref, _ = kvcache_reference(qn, kc, vc, cache_seqlens=lengths, cache_leftpad=leftpad, k_new=kn, v_new=vn,
                                   causal=True, alibi_slopes=bias)
        runs.append((f"paged kv cache alibi d={d}", rel_l2(to_numpy64(out), ref)))
        # Decode (d = 128: the decode kernel of the tensor-core backends): 2 queries on each of 4 query
        # heads per K/V head, ragged cache lengths with an empty one, causal, split keys.
        q, kc, vc = normal(3, 8, 2, d), normal(3, 2, 700, d), normal(3, 2, 700, d)
        lengths = np.array([0, 650, 333])
        for kept in (None, np.linspace(-1, 2, 8).astype(np.float32)):  # with and without sinks
            out = cutlassfa.forward(cuda(q), cuda(kc), cuda(vc), cache_seqlens=index(lengths), causal=True,
                                    num_splits=3 if backend.startswith("tensorcore") else None, backend=backend,
                                    sinks=None if kept is None else torch.from_numpy(kept).cuda())
            ref, _ = kvcache_reference(q, kc, vc, cache_seqlens=lengths, causal=True, sinks=kept)
            runs.append((f"decode sinks={kept is not None} d={d}", rel_l2(to_numpy64(out), ref)))
        # More rows a K/V head than a CTA takes (9 queries x 8 heads: chunks of 32, 32 and 8 rows), the same
        # caches.
        q9 = normal(3, 16, 9, d)
        out = cutlassfa.forward(cuda(q9), cuda(kc), cuda(vc), cache_seqlens=index(lengths), causal=True,
                                num_splits=3 if backend.startswith("tensorcore") else None, backend=backend)
        ref, _ = kvcache_reference(q9, kc, vc, cache_seqlens=lengths, causal=True)
        runs.append((f"decode row chunks d={d}", rel_l2(to_numpy64(out), ref)))
        # A plain decode call whose last key step runs past the end of k and v (700 keys, the last head's
        # last rows at the end of each allocation): the rows past the keys are zero-filled, never read.
        q1, k1, v1 = normal(1, 8, 1, d), normal(1, 2, 700, d), normal(1, 2, 700, d)
        out = cutlassfa.forward(cuda(q1), cuda(k1), cuda(v1), backend=backend)
        runs.append((f"decode at the end of the cache d={d}", rel_l2(to_numpy64(out), attention_reference(q1, k1, v1)[0])))
        # The same caches paged (page size 16, shuffled pages) with two appended keys: the decode kernel's
        # page lookups at d = 128.
        b, page, pages_per_seq = 3, 16, 44
        table = rng.permutation(b * pages_per_seq).reshape(b, pages_per_seq)
        kc, vc = (np.concatenate([x, normal(b, 2, page * pages_per_seq - 700, d)], axis=2) for x in (kc, vc))
        kp, vp = (cuda(np.stack([x[seq, :, j * page:(j + 1) * page] for seq in range(b) for j in range(pages_per_seq)])
                       [np.argsort(table.ravel())]) for x in (kc, vc))
        kn, vn = normal(b, 2, 2, d), normal(b, 2, 2, d)
        out = cutlassfa.forward(cuda(q), kp, vp, cache_seqlens=index(lengths), block_table=index(table),
                                k_new=cuda(kn), v_new=cuda(vn), causal=True,
                                num_splits=3 if backend.startswith("tensorcore") else None, backend=backend)
        ref, _ = kvcache_reference(q, kc, vc, cache_seqlens=lengths, k_new=kn, v_new=vn, causal=True)
        runs.append((f"paged decode d={d}", rel_l2(to_numpy64(out), ref)))
        # Varlen: an empty query sequence and an empty key sequence among ragged ones, causal.
        cu_q, cu_k = np.array([0, 5, 5, 70, 71]), np.array([0, 9, 30, 95, 95])
        q, k, v = normal(71, 4, d), normal(95, 2, d), normal(95, 2, d)
        out = cutlassfa.varlen_forward(cuda(q), cuda(k), cuda(v), index(cu_q), index(cu_k), max_seqlen_q=65,
                                       max_seqlen_k=65, causal=True, backend=backend)
        runs.append((f"varlen d={d}", rel_l2(to_numpy64(out), varlen_reference(q, k, v, cu_q, cu_k, causal=True)[0])))
    return runs


def main(argv) -> int:
    strided = "--no-strided" not in argv
    variants = "--no-variants" not in argv
    plain = "--variants-only" not in argv
    names = [a for a in argv if not a.startswith("--")]
    backends = [name for name in ("tensorcore", "tensorcore_sm80", "large_tile", "small_tile", "naive")
                if cutlassfa.backends()[name].available and (not names or name in names)]
    if not backends:
        print("FAIL no GPU backend available: " + "; ".join(
            f"{n}: {s.reason}" for n, s in cutlassfa.backends().items() if not s.available))
        return 1
    layouts = [None]
    if strided:
        try:
            import torch

            if not torch.cuda.is_available():
                raise ImportError("torch has no CUDA")
        except ImportError as error:
            print(f"FAIL strided device cases need PyTorch with CUDA ({error}); --no-strided leaves them out")
            return 1
        layouts += list(STRIDED_LAYOUTS)
    else:
        print("strided device cases left out (--no-strided): only compact layouts are checked")
    rng = np.random.default_rng()
    failures = runs = 0
    for backend in backends if plain else ():
        for dtype in DTYPES:
            for d in (32, 64, 128):
                for causal in (False, True):
                    for b, hq, hk, nq, nk in SHAPES:
                        case = Case(dtype, b, hq, hk, nq, nk, d, causal)
                        values = case_values(case, rng)
                        for layout in layouts:
                            err = _run(backend, case, values, layout)
                            runs += 1
                            if not err <= bound_for(backend, dtype).rel_l2:
                                failures += 1
                                print(f"FAIL {backend} {case.label} {layout or 'host'} rel_err={err:.3g}")
    if strided and variants:  # the variants take CUDA arrays
        for backend in backends:
            for dtype in DTYPES:
                for label, err in _variant_runs(backend, dtype, rng):
                    runs += 1
                    if not err <= bound_for(backend, dtype).rel_l2:
                        failures += 1
                        print(f"FAIL {backend} {dtype} {label} rel_err={err:.3g}")
    print(f"{runs} runs over {backends} (layouts: {', '.join(l or 'host' for l in layouts)}; variants on CUDA "
          f"tensors: {'yes' if strided and variants else 'no'}), {failures} failures")
    if strided:
        # Give PyTorch's cached blocks back before exit: memcheck's leak check reported them (allocated by
        # Tensor.to in as_layout) although no tensor was alive any more.
        import gc

        import torch

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
