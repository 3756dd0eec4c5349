"""Resolving one file group's key in a work unit: from the stored group plan against listing the whole corpus.

    PYTHONPATH=$PWD .venv/bin/python bench/group_resolve.py [--files 20000] [--buckets 64] [--repeats 9] [--json]

A local corpus of ``--files`` tiny JSON Lines files in ``--buckets`` buckets; every figure from the same process,
the median of ``--repeats`` (the file system's cache warm for all of them):

1. baseline: ``files_for_keys([one bucket key])`` with no plan directory (what a unit did before plans: one
   listing of the whole corpus, grouped);
2. without a plan: the same call with a plan directory that holds no plan (the fallback: the listing, plus the
   plans it stores for the next unit);
3. with a plan: the same call after a listing stored the plans (the pointer and the plan read, one stat per
   member of the bucket);
4. what storing costs the lister: ``list_files()`` writing every bucket's plan and pointer, and once the plans
   are stored (a later tick: the pointers only), against the same listing with no plan directory.

Ratios are against the baseline of the same run, measured interleaved with each case (repeat by repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def _seconds(fn, before=None) -> float:
    if before is not None:
        before()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _medians(repeats: int, *cases) -> list[float]:
    """The median seconds of each case (``fn`` or ``(fn, before)``), the cases interleaved repeat by repeat so
    that a change of the host's load falls on all of them alike."""
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(repeats):
        for i, case in enumerate(cases):
            fn, before = case if isinstance(case, tuple) else (case, None)
            times[i].append(_seconds(fn, before))
    return [statistics.median(t) for t in times]


def main() -> None:
    from dagster_gpu import CorpusSource
    from dagster_gpu.corpus.group_plan_store import forget_group_plans

    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--buckets", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.environ.pop("DAGSTER_HOME", None)  # no default plan directory: the baseline has none
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus_dir = root / "corpus"
        corpus_dir.mkdir()
        for i in range(a.files):
            (corpus_dir / f"doc-{i:06d}.json").write_text(json.dumps({"text": f"document {i}"}) + "\n")
        plans = root / "plans"
        bare = CorpusSource(url=str(corpus_dir), group_buckets=a.buckets)
        planned = CorpusSource(url=str(corpus_dir), group_buckets=a.buckets, group_plan_url=str(plans))
        groups = bare.list_files()
        key = groups[len(groups) // 2].key
        members = len(groups[len(groups) // 2].members)

        def no_plans() -> None:
            shutil.rmtree(plans, ignore_errors=True)
            forget_group_plans()

        baseline, without, list_plain, list_storing = _medians(
            a.repeats, lambda: bare.files_for_keys([key]), (lambda: planned.files_for_keys([key]), no_plans),
            bare.list_files, (planned.list_files, no_plans))
        planned.list_files()
        assert planned.files_for_keys([key]) == bare.files_for_keys([key])
        # plans stored: resolving from them, and a later listing (its pointers compared, none rewritten)
        with_plan, baseline_again, list_steady, list_plain_again = _medians(
            a.repeats, lambda: planned.files_for_keys([key]), lambda: bare.files_for_keys([key]), planned.list_files,
            bare.list_files)
        out = {"files": a.files, "buckets": len(groups), "bucket_members": members, "repeats": a.repeats,
               "baseline_listing_s": round(baseline, 4), "without_plan_s": round(without, 4),
               "without_plan_ratio": round(without / baseline, 4),
               "baseline_again_s": round(baseline_again, 4), "with_plan_s": round(with_plan, 4),
               "with_plan_ratio": round(with_plan / baseline_again, 4),
               "list_files_s": round(list_plain, 4), "list_files_storing_plans_s": round(list_storing, 4),
               "storing_ratio": round(list_storing / list_plain, 4),
               "list_files_again_s": round(list_plain_again, 4), "list_files_plans_stored_s": round(list_steady, 4),
               "plans_stored_ratio": round(list_steady / list_plain_again, 4)}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{a.files} files, {out['buckets']} buckets, one bucket of {members} files; "
          f"median of {a.repeats}, interleaved")
    print(f"{'resolving one bucket key':<46} {'seconds':>8} {'baseline (s)':>13} {'ratio':>7}")
    rows = (("without a plan (listing + storing the plans)", "without_plan_s", "baseline_listing_s", "without_plan_ratio"),
            ("with a plan (pointer, plan, one stat/member)", "with_plan_s", "baseline_again_s", "with_plan_ratio"),
            ("list_files storing every plan and pointer", "list_files_storing_plans_s", "list_files_s",
             "storing_ratio"),
            ("list_files, plans stored (pointers read)", "list_files_plans_stored_s", "list_files_again_s",
             "plans_stored_ratio"))
    for label, k, b, r in rows:
        print(f"{label:<46} {out[k]:>8.4f} {out[b]:>13.4f} {out[r]:>7.4f}")
    print("baseline: the same call with no plan directory (a whole-corpus listing, as before plans), "
          "resp. list_files with none")


if __name__ == "__main__":
    main()
