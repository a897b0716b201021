"""Hand-written people in stores of every size a user has: the layout that relevance is judged and fitted on.

A store's size changes what a cosine means (the same one is decisive among 5 facts and weak among 2,000), and a
person's own near misses look answered when they are alone in a store. So relevance is judged, and fitted, on the
same hand-written people laid out in stores of every size (`layout`):
- 5 facts: each person's store holds five of their facts (seeded); the questions of the other five are unanswerable
  there (near misses: the person is in the store, the fact is not);
- 10 facts: each person alone;
- a group: `group` people together, each in their own scope (100 facts for ten people);
- the group beside other people's facts (personal_data's generated people) up to each of `large` facts.
In the last two, every question is asked in its person's scope and across the store (first-person ones in the
scope only).

benchmarks/relevance_heldout.py judges recall's relevance on a test set laid out this way; `sizes_source` turns a
fitting set laid out this way into a source of recipe/calibrate_fusion.py (candidate pools, cached).
"""

from __future__ import annotations

import hashlib
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402

from personal_data import PersonalSet, Question, generated  # noqa: E402
from personal_recall import build, pooled_source  # noqa: E402

FIVE = 5


@dataclass
class Store:
    """One store of a layout: its label (how many facts it holds), its facts and questions (a PersonalSet, questions
    renumbered to its facts) and its asks: (question index, asked in its scope)."""

    label: str
    ps: PersonalSet
    asks: list[tuple[int, bool]]


def _asks(ps: PersonalSet, users: set[str], *, store_wide: bool) -> list[tuple[int, bool]]:
    """(question index, in its person's scope) for the questions of `users`; third-person ones also store-wide when
    `store_wide`."""
    out = []
    for qi, q in enumerate(ps.questions):
        if q.user in users:
            out.append((qi, True))
            if store_wide and not q.first_person:
                out.append((qi, False))
    return out


def only(ps: PersonalSet, keep: list[int]) -> PersonalSet:
    """The facts `keep` of ps (renumbered) and every question of their users: a question whose fact is not kept
    becomes unanswerable."""
    new = {old: i for i, old in enumerate(keep)}
    users = {ps.facts[i].user for i in keep}
    qs = [Question(q.text, q.user, new.get(q.fact) if q.fact is not None else None, q.category, q.first_person,
                   q.part) for q in ps.questions if q.user in users]
    return PersonalSet([ps.facts[i] for i in keep], qs)


def with_others(ps: PersonalSet, n_total: int, seeds: Sequence[int] = (0, 1)) -> PersonalSet:
    """ps beside facts of other people (personal_data's generated people of `seeds`) up to n_total facts; their
    questions are not asked."""
    others = [f for seed in seeds for f in generated(seed).facts]
    if n_total - len(ps.facts) > len(others):
        raise ValueError(f"{n_total} facts need more generated people than seeds {list(seeds)} hold.")
    return PersonalSet(list(ps.facts) + others[:n_total - len(ps.facts)], list(ps.questions))


def layout(ps: PersonalSet, *, group: int | None = None, large: Sequence[int] = (1000,),
           seed_tag: str = "heldout", other_seeds: Sequence[int] = (0, 1), few: Sequence[int] = (FIVE,),
           groups: bool = True) -> list[Store]:
    """Every store of the layout (module docstring) for the people of `ps`: stores of each size in `few` drawn
    from a person's facts (5: the module docstring's), groups of `group` people (None: all of them in one group;
    `groups` False: none), each also beside other people's facts up to every size in `large`."""
    users = ps.users()
    by_user = {u: [i for i, f in enumerate(ps.facts) if f.user == u] for u in users}
    out = []
    for u in users:
        for n in few:
            draw = random.Random(f"{seed_tag}-{u}" if n == FIVE else f"{seed_tag}-{u}-{n}")
            small = only(ps, sorted(draw.sample(by_user[u], n)))
            out.append(Store(str(n), small, _asks(small, {u}, store_wide=False)))
        alone = only(ps, by_user[u])
        out.append(Store(str(len(alone.facts)), alone, _asks(alone, {u}, store_wide=False)))
    step = group or len(users)
    for g in range(0, len(users) if groups else 0, step):
        members = users[g:g + step]
        together = only(ps, [i for u in members for i in by_user[u]])
        out.append(Store(str(len(together.facts)), together, _asks(together, set(members), store_wide=True)))
        for n in large:
            big = with_others(together, n, other_seeds)
            out.append(Store(str(n), big, _asks(big, set(members), store_wide=True)))
    return out


def sizes_source(embedder: object, ps: PersonalSet, name: str, *, group: int = 15,
                 large: Sequence[int] = (1000, 2000), few: Sequence[int] = (FIVE,), cache_dir: Path | None = None,
                 log: Callable[[str], None] = lambda s: None) -> dict[str, dict]:
    """Source `name` in recipe/calibrate_fusion.py's load_data format: the layout of `ps` (groups of `group`,
    beside generated people of seeds 2 to 5, apart from the seeds the held-out test uses), every ask's
    hybrid candidate pool gathered in the scope it is asked in. Answerable asks are the source's queries;
    unanswerable ones (the person's own, and in the five-fact stores the questions whose fact is left out) its
    "foreign" pools. Marked "ranking": False: the source joins the relevance fit only, not the choice of the
    ranking rule. Cached by the embedder's fingerprint and the set's digest."""
    import dev_pools as dp

    stores = layout(ps, group=group, large=large, seed_tag="fit", other_seeds=(2, 3, 4, 5), few=few)
    docs: dict[tuple[str | None, str], int] = {}  # (user, text) -> the source's doc index
    for st in stores:
        for f in st.ps.facts:
            docs.setdefault((f.user, f.text), len(docs))
    cache_dir = Path(cache_dir or dp.CACHE_DIR)
    fp = hashlib.sha1(embedder.fingerprint.encode("utf-8")).hexdigest()[:12]
    key = f"{group}-{list(large)}" + ("" if tuple(few) == (FIVE,) else f"-few{list(few)}")  # old caches stay valid
    tag = hashlib.sha1(key.encode()).hexdigest()[:8]
    path = cache_dir / f"{name}-{fp}-{dp.POOL_MAX}{dp.POOL_FORMAT}-{ps.digest()}-{tag}.json.gz"
    if path.is_file():
        cached = dp.load_json_gz(path)
    else:
        t0 = time.perf_counter()
        wrapped = dp.QueryCachingEmbedder(embedder)
        wrapped.warm([q.text for q in ps.questions])
        cached = {"pools": [], "foreign": [], "asks": [], "labels": [], "foreign_labels": []}
        with tempfile.TemporaryDirectory(prefix="personal_sizes_") as tmp:
            for n, st in enumerate(stores):
                store, ids = build(Path(tmp) / f"s{n}.db", wrapped, st.ps)
                try:
                    index = {fid: docs[(f.user, f.text)] for fid, f in zip(ids, st.ps.facts)}
                    for qi, scoped in st.asks:
                        q = st.ps.questions[qi]
                        view = store.scope(user=q.user) if scoped else store
                        pool = dp.pool_of(view, q.text, index, wrapped).to_json()
                        label = f"{st.label} {'scoped' if scoped else 'all'}"
                        if q.fact is None:
                            cached["foreign"].append(pool)
                            cached["foreign_labels"].append(label)
                        else:
                            cached["pools"].append(pool)
                            f = st.ps.facts[q.fact]
                            cached["asks"].append([q.text, docs[(f.user, f.text)]])
                            cached["labels"].append(label)
                finally:
                    store.close()
        dp.save_json_gz(path, cached)
        log(f"{name}: {len(cached['pools'])} answerable and {len(cached['foreign'])} unanswerable asks in "
            f"{len(stores)} stores pooled in {time.perf_counter() - t0:.1f}s")
    gold = np.array([g for _, g in cached["asks"]], dtype=np.int64)
    src = dp.DevSource(name, [t for t, _ in cached["asks"]], list(cached["labels"]),
                       [text for (_, text) in docs], gold)
    return {name: {**pooled_source(src, cached["pools"], cached["foreign"], f"{name} (unanswerable questions)"),
                   "foreign_shapes": list(cached["foreign_labels"]), "ranking": False}}
