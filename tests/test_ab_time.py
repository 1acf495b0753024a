"""scripts/ab_time.py, the same-timer comparison of two builds: which bench rows it takes as cases, and the
after / before ratios it reports (CPU: no timing)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "ab_time.py"


def _module():
    if str(SCRIPT.parent) not in sys.path:  # as when run as a script: its folder's cuda_graphs.py
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("ab_time", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cases_are_the_timed_tensorcore_rows_of_the_modes_it_builds(tmp_path):
    ab = _module()
    row = dict(backend="tensorcore", status="ok", dtype="bfloat16", B=1, H=8, Hk=2, Nq=1, Nk=64, d=64, causal=False,
               window=None, mode="paged", page_size=16)
    rows = [row, dict(row, backend="sdpa_flash"), dict(row, status="error"), dict(row, mode="ring")]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rows": rows}))
    assert ab._cases_from(str(path)) == [row]
    assert ab._dense_case("2,16,1024,64,causal,float16")["causal"] is True


def test_compare_reports_the_median_ratio_of_cases_both_tags_timed(tmp_path, capsys):
    ab = _module()
    lines = [("before1", "x", 1.0), ("after1", "x", 0.8), ("before2", "x", 1.2), ("after2", "x", 1.0),
             ("before1", "only-before", 1.0)]
    path = tmp_path / "ab.jsonl"
    path.write_text("".join(json.dumps({"tag": t, "case": c, "ms": ms}) + "\n" for t, c, ms in lines))
    ab._compare(str(path), "before", "after")
    out = capsys.readouterr().out
    assert out.startswith("1 cases, after / before speed geomean 1.2222")  # medians 1.1 / 0.9
    assert "only-before" not in out


def test_cache_cases_and_the_keys_their_read_twin_reads():
    ab = _module()
    case = ab._cache_case("8,32:8,4,32768,128,bfloat16,window=4096,leftpad=0.25")
    assert (case["mode"], case["page_size"], case["window"], case["softcap"]) == ("kvcache", None, (4096, 0), 0.0)
    assert ab._visible_keys(case) == (32768 - 4 - 4096, 32768)  # the window binds, not the padding
    assert ab._visible_keys(dict(case, window=None)) == (8192, 32768)
    paged = ab._cache_case("1,8:1,1,1000,64,float16,page=16,softcap=30")
    assert (paged["mode"], paged["page_size"], paged["softcap"], paged["leftpad"]) == ("paged", 16, 30.0, 0.0)
    assert ab._visible_keys(paged) == (0, 1000)
    assert ab._key(case) != ab._key(dict(case, read=True))
