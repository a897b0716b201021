"""Relevance models compared left out: which features and which training rows make one threshold hold everywhere.

The store's relevance (store/fusion.py `relevance`) is a model fitted by recipe/calibrate_fusion.py on the top 10
hits of every dev query (answerable ones, the same with their fact taken out, and another source's): a logistic
regression until gradient-boosted trees over two more features won this comparison (store/trees.py). A user
filters with one threshold (`min_relevance`), so what matters is the top hit: at the threshold, the share of right
top hits kept and of unanswerable questions' top hits dropped, on every source, manual and personal. This script
fits each variant with one source left out (the shipped rule's ranking weights, refitted without it too) and
reports, per variant, the AUC of the top hit and the threshold figures on the personal sources and the manuals.

    python benchmarks/relevance_study.py [--dev /work/data/dev] [--corpus /work/corpus] [--json out.json]
        [--variants NAME,...] [--extra-features names,cos_x_uncovered,...]

--extra-features adds a variant per named FEATURES entry: the shipped trees with that feature added.

Needs the candidate pools that recipe/calibrate_fusion.py caches (benchmarks/dev_pools.py); nothing is written to
the shipped model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "recipe"))

import numpy as np  # noqa: E402

import calibrate_fusion as cf  # noqa: E402
from evermind_memory.store.fusion import FEATURES, FusionParams  # noqa: E402

GRID = tuple(round(t, 3) for t in np.arange(0.03, 0.301, 0.01))

# variant -> (relevance features, weight of each query's top hit relative to its other rows, "logistic" | "trees")
VARIANTS: dict[str, tuple[tuple[str, ...], float, str]] = {
    "logistic": (cf.RELEVANCE_FEATURES, 1.0, "logistic"),
    "logistic, top x4": (cf.RELEVANCE_FEATURES, 4.0, "logistic"),
    "logistic +log_facts": (cf.RELEVANCE_FEATURES + ("log_facts",), 1.0, "logistic"),
    "logistic +cos_model": (cf.RELEVANCE_FEATURES + ("cos_model",), 1.0, "logistic"),
    "logistic +log_facts+cos_model": (cf.RELEVANCE_FEATURES + ("log_facts", "cos_model"), 1.0, "logistic"),
    "logistic +log_facts+cos_model, top x4": (cf.RELEVANCE_FEATURES + ("log_facts", "cos_model"), 4.0, "logistic"),
    "trees": (cf.RELEVANCE_FEATURES, 1.0, "trees"),
    "trees +log_facts+cos_model (shipped)": (cf.relevance_features("trees"), 1.0, "trees"),
}


def rows(rs: cf.RelevanceStacks, sources: Sequence[str], rule: cf.Rule, w: np.ndarray, top_weight: float) -> dict:
    r = cf.relevance_set(rs, sources, rule, w)
    r["w"] = r["w"] * np.where(r["top"], top_weight, 1.0)
    return r


def judge(rs: cf.RelevanceStacks, source: str, rule: cf.Rule, w: np.ndarray, model: cf.RelevanceModel) -> dict:
    """Top-hit AUC and, per threshold of GRID, (right top hits kept, unanswerable top hits dropped)."""
    rep = cf.relevance_report(rs, source, rule, w, model, GRID)
    at = {t: rep["thresholds"][f"{t:g}"] for t in GRID}
    return {"auc": rep["auc_top1"],
            "at": {t: (r["right_top1_kept"], r["unanswerable_top1_dropped"]) for t, r in at.items()}}


SIZE_AT = (0.15, 0.2, 0.25, 0.3)


def by_size(rs: cf.RelevanceStacks, d: dict, source: str, rule: cf.Rule, w: np.ndarray,
            model: cf.RelevanceModel) -> dict:
    """For a source of stores of several sizes (benchmarks/personal_sizes.py: its queries' and foreign pools'
    shapes say "<facts> scoped|all"): per store size, right top hits and unanswerable asks (near misses with their
    fact taken out, and the unanswerable questions) and what each SIZE_AT threshold keeps and drops of them."""
    tops = []
    for kind, stack in rs.get(source, rule.pool).items():
        X, y, top = cf.relevance_rows(stack, rule, w, rs.features)
        shapes = d["foreign_shapes"] if kind == "foreign" else d["source"].shapes
        if int(top.sum()) != len(shapes):
            raise RuntimeError(f"{source} {kind}: {int(top.sum())} top hits for {len(shapes)} asks")
        p = model.predict(X)[top]
        tops += [(str(sh).split()[0], kind == "answerable", bool(yy > 0), float(pp))
                 for sh, yy, pp in zip(shapes, y[top], p)]
    out = {}
    for size in sorted({t[0] for t in tops}, key=int):
        right = np.array([p for sz, ans, ok, p in tops if sz == size and ans and ok])
        none = np.array([p for sz, ans, ok, p in tops if sz == size and not ans])
        out[size] = {"right": len(right), "unanswerable": len(none),
                     "at": {t: (float((right >= t).mean()) if len(right) else float("nan"),
                                float((none < t).mean()) if len(none) else float("nan")) for t in SIZE_AT}}
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", default=os.environ.get("EVERMIND_DEV_DIR", "/work/data/dev"))
    ap.add_argument("--corpus", default="/work/corpus")
    ap.add_argument("--variants", default="", help="comma-separated subset of VARIANTS")
    ap.add_argument("--extra-features", default="",
                    help="comma-separated FEATURES: one variant each, the shipped trees with it added")
    ap.add_argument("--fit-without", default="", metavar="SOURCE,...",
                    help="sources judged left out but never fitted on (personal-sizes-a,personal-sizes-b: the "
                         "relevance model as fitted before those sources joined)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    shipped_feats, shipped_top, shipped_kind = VARIANTS["trees +log_facts+cos_model (shipped)"]
    extra: dict[str, tuple[tuple[str, ...], float, str]] = {}
    for feat in (f for f in args.extra_features.split(",") if f):
        if feat not in FEATURES:
            ap.error(f"--extra-features: {feat!r} is not one of {sorted(FEATURES)}")
        extra[f"shipped +{feat}"] = (shipped_feats + (feat,), shipped_top, shipped_kind)
    variants = {**VARIANTS, **extra}
    from recall_quality import load_embedder

    emb = load_embedder(None, None)
    params = FusionParams.from_dict(json.loads((REPO / "evermind_memory/models/fusion.json").read_text()))
    data = cf.load_data(emb, Path(args.dev), Path(args.corpus) if args.corpus else None,
                        log=lambda m: print(f"[relevance_study] {m}", file=sys.stderr, flush=True))
    rule = next(r for r in cf.RULES if r.features == params.features and r.pool == params.pool)
    fits = cf.build_fits(data, [rule])
    names = sorted(data)
    unfitted = {t for t in args.fit_without.split(",") if t}
    if unfitted - set(names):
        ap.error(f"--fit-without: no sources {sorted(unfitted - set(names))}; there are {names}")
    personal = [s for s in names if s.startswith("personal")]  # the personal-memory sources, as calibrate_fusion
    manual = [s for s in names if s not in personal]
    chosen = [v for v in args.variants.split(",") if v] or list(VARIANTS)
    chosen += [v for v in extra if v not in chosen]
    out: dict = {}
    for variant in chosen:
        feats, top_weight, kind = variants[variant]
        assert all(f in FEATURES or f in ("score", "margin") for f in feats)
        rs = cf.RelevanceStacks(data, [rule], feats)
        per = {}
        for s in names:
            rest = [t for t in names if t != s and t not in unfitted]
            w = fits[rule.name].weights([t for t in cf.ranking_sources(data) if t != s])
            model = cf.fit_relevance_rows(rows(rs, rest, rule, w, top_weight), kind)
            per[s] = judge(rs, s, rule, w, model)
            if "foreign_shapes" in data[s]:
                per[s]["by_size"] = by_size(rs, data[s], s, rule, w, model)
        out[variant] = per
        print(f"\n{variant}: top-hit AUC manual {np.mean([per[s]['auc'] for s in manual]):.3f}, "
              + ", ".join(f"{s} {per[s]['auc']:.3f}" for s in personal))
        print(f"  {'threshold':>9}  {'manual kept/dropped':>20}  " + "  ".join(f"{s:>16}" for s in personal))
        for t in GRID:
            mk = np.mean([per[s]["at"][t][0] for s in manual])
            md = np.mean([per[s]["at"][t][1] for s in manual])
            cells = "  ".join(f"{per[s]['at'][t][0]:>7.2f} / {per[s]['at'][t][1]:.2f}" for s in personal)
            print(f"  {t:>9.2f}  {mk:>11.2f} / {md:.2f}  {cells}")
        for s in (s for s in personal if "by_size" in per[s]):
            print(f"  {s} left out, by store size (the store's facts; kept / dropped at "
                  f"{', '.join(map(str, SIZE_AT))})")
            for size, r in per[s]["by_size"].items():
                print(f"    {size:>5} facts, {r['right']:>3} right top hits, {r['unanswerable']:>3} unanswerable: "
                      + ", ".join(f"{r['at'][t][0]:.2f} / {r['at'][t][1]:.2f}" for t in SIZE_AT))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
