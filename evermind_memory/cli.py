"""The `evermind` command: remember, recall and maintain a memory store from a shell or a script.

Every subcommand takes `--db PATH` (default: the user data directory) and `--json` (machine-readable
output). Our errors become one `evermind: error: ...` line on stderr and exit status 1, in one place (`main`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from .errors import EvermindError, InvalidInput

READ_COMMANDS = {"recall", "get", "list", "history", "export", "info"}


def default_db_path() -> Path:
    """`<user data dir>/evermind/memory.db` (platformdirs)."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("evermind")) / "memory.db"


def _tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the subcommand (SUPPRESS keeps the main parser's value)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db", type=Path, default=argparse.SUPPRESS, help="store file (default: user data dir)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts")
    p.add_argument("--model", type=Path, default=argparse.SUPPRESS, help="EvermindLM checkpoint to embed with")
    p.add_argument("--tokenizer", type=Path, default=argparse.SUPPRESS, help="BPE tokenizer JSON for --model")
    p.add_argument("--durability", choices=("normal", "full"), default=argparse.SUPPRESS,
                   help="synchronous=NORMAL (default) or FULL (survives power loss)")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `evermind` (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(prog="evermind", description="Local memory with semantic recall.",
                                     parents=[_common()])
    parser.set_defaults(db=None, json=False, model=None, tokenizer=None, durability="normal")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        # a fresh copy per subcommand: parents share Action objects, and set_defaults above must not leak here
        return sub.add_parser(name, help=help_text, description=help_text, parents=[_common()])

    p = add("remember", "store a fact ('-' reads it from stdin)")
    p.add_argument("text")
    p.add_argument("--tag", type=_tag, action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--source")

    p = add("recall", "find the facts that best match a query")
    p.add_argument("query")
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--tag", type=_tag, action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--mode", choices=("hybrid", "vector", "lexical"), default="hybrid")
    p.add_argument("--fusion", choices=("score", "rrf"), default="score")
    p.add_argument("--min-score", type=float, default=None)

    p = add("get", "show one fact")
    p.add_argument("id")

    p = add("forget", "remove facts by id, or every fact with the given tags/source")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument("--tag", type=_tag, action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--source")

    p = add("feedback", "say whether a recalled fact answered a query (adaptation learns from it)")
    p.add_argument("query")
    p.add_argument("id")
    p.add_argument("--not-useful", action="store_true", help="the fact did not answer the query")

    p = add("list", "list facts in the order they were remembered")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--tag", type=_tag, action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--source")

    p = add("history", "every change of a fact")
    p.add_argument("id")

    add("check", "check the store's integrity (exit status 1 when something is wrong)")
    p = add("reembed", "re-embed facts made by another embedder")
    p.add_argument("--force", action="store_true", help="re-embed every fact")
    add("rebuild", "rebuild the vector index from SQLite")

    p = add("export", "write every fact as JSON lines (no vectors)")
    p.add_argument("path", type=Path)
    p = add("import", "add the facts of a JSON lines export")
    p.add_argument("path", type=Path)
    p = add("backup", "write a consistent copy of the database")
    p.add_argument("dest", type=Path)
    add("info", "show sizes, identity and settings of the store")

    p = add("adapt", "fit a LoRA adapter on the stored memories, gate it and swap it in (or roll back, or list)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the policy's)")
    p.add_argument("--lr", type=float, default=None, help="learning rate")
    p.add_argument("--rank", type=int, default=None, help="LoRA rank")
    p.add_argument("--max-cpu-seconds", type=float, default=None, help="training CPU budget")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--rollback", metavar="ID", default=None, help="serve adapter ID (or 'base') again instead")
    p.add_argument("--history", action="store_true", help="list the adapters written for this store")

    p = add("demo", "run a short demonstration in a scratch store")
    p.add_argument("--keep", action="store_true", help="keep the demo store")
    return parser


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _embedder(args: argparse.Namespace, given: Any) -> Any:
    if given is not None:
        return given
    if args.model is None and args.tokenizer is None:
        return None
    if args.model is None or args.tokenizer is None:
        raise InvalidInput("--model and --tokenizer go together: pass both, or neither for the shipped model.")
    from .embedder import LMEmbedder
    from .lm.model import EvermindLM
    from .lm.tokenizer import BPETokenizer

    return LMEmbedder(EvermindLM.load(args.model), BPETokenizer.load(args.tokenizer))


def _open(args: argparse.Namespace, embedder: Any):
    from .store import MemoryStore

    path = args.db if args.db is not None else default_db_path()
    if args.command in READ_COMMANDS:
        if not path.exists():
            raise InvalidInput(f"no store at {path} yet; `evermind remember TEXT` creates one.")
        return MemoryStore(path, embedder, read_only=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    return MemoryStore(path, embedder, durability=args.durability)


def _fact_line(fact: Any) -> str:
    tags = " ".join(f"{k}={v}" for k, v in sorted(fact.tags.items()))
    extra = f"  [{tags}]" if tags else ""
    source = f"  (from {fact.source})" if fact.source else ""
    return f"{fact.id}  {fact.text}{extra}{source}"


def _run(args: argparse.Namespace, store: Any, out) -> int:
    cmd = args.command
    emit_json = args.json

    def emit(obj: Any, human: Sequence[str]) -> None:
        if emit_json:
            print(json.dumps(_jsonable(obj), ensure_ascii=False), file=out)
        else:
            for line in human:
                print(line, file=out)

    if cmd == "remember":
        text = sys.stdin.read().rstrip("\n") if args.text == "-" else args.text
        fid = store.remember(text, tags=dict(args.tag) or None, source=args.source)
        store.flush()  # embedded and indexed before we exit; a bad vector is an error here, not a silent gap
        emit({"id": fid}, [fid])
    elif cmd == "recall":
        hits = store.recall(args.query, k=args.k, tags=dict(args.tag) or None, mode=args.mode,
                            min_score=args.min_score, fusion=args.fusion)
        emit(hits, [f"{h.score:7.3f}  {_fact_line(h)}" for h in hits])
    elif cmd == "get":
        fact = store.get(args.id)
        emit(fact, [_fact_line(fact), f"created {fact.created_at.isoformat()}  updated {fact.updated_at.isoformat()}"])
    elif cmd == "forget":
        if args.ids and (args.tag or args.source):
            raise InvalidInput("forget takes ids or --tag/--source, not both.")
        if args.ids:
            for fid in args.ids:
                store.forget(fid)
            count = len(args.ids)
        else:
            count = store.forget_where(tags=dict(args.tag) or None, source=args.source)
        emit({"forgotten": count}, [f"forgot {count} fact{'s' * (count != 1)}"])
    elif cmd == "feedback":
        store.feedback(args.query, args.id, useful=not args.not_useful)
        verdict = "not useful" if args.not_useful else "useful"
        emit({"id": args.id, "useful": not args.not_useful}, [f"noted: {args.id} {verdict} for {args.query!r}"])
    elif cmd == "list":
        facts = store.list(limit=args.limit, offset=args.offset, tags=dict(args.tag) or None, source=args.source)
        emit(facts, [_fact_line(f) for f in facts])
    elif cmd == "history":
        changes = store.history(args.id)
        emit(changes, [f"{c.seq:>8}  {c.at.isoformat()}  {c.op:<8}  {c.text if c.text is not None else ''}" for c in changes])
    elif cmd == "check":
        report = store.check()
        emit(report, [("ok" if report.ok else "PROBLEMS") + f": {report.facts} facts, {report.indexed} indexed"]
             + [f"  - {p}" for p in report.problems])
        return 0 if report.ok else 1
    elif cmd == "reembed":
        count = store.reembed(force=args.force)
        emit({"reembedded": count}, [f"re-embedded {count} facts"])
    elif cmd == "rebuild":
        count = store.rebuild_index()
        emit({"indexed": count}, [f"index rebuilt with {count} vectors"])
    elif cmd == "export":
        count = store.export(args.path)
        emit({"exported": count, "path": str(args.path)}, [f"exported {count} facts to {args.path}"])
    elif cmd == "import":
        count = store.import_(args.path)
        emit({"imported": count}, [f"imported {count} facts"])
    elif cmd == "backup":
        dest = store.backup(args.dest)
        emit({"backup": str(dest)}, [f"backed up to {dest}"])
    elif cmd == "info":
        info = store.info()
        emit(info, [f"{k:>22}: {v}" for k, v in info.items()])
    elif cmd == "adapt":
        _adapt(args, store, emit)
    return 0


def _adapt(args: argparse.Namespace, store: Any, emit) -> None:
    """`evermind adapt`: one synchronous round, a rollback, or the adapter history."""
    if args.history:
        entries = store.adapter_history()
        emit(entries, [f"{'*' if e['active'] else ' '} {e['id']}  {e.get('status', '?'):<10} {e.get('created_at', '')}  "
                       f"{e.get('fingerprint', '')}" for e in entries] or ["no adapters yet"])
        return
    if args.rollback is not None:
        report = store.rollback_adapter(args.rollback)
    else:
        from .adaptation import AdaptationPolicy

        chosen = {"steps": args.steps, "lr": args.lr, "rank": args.rank, "max_cpu_seconds": args.max_cpu_seconds,
                  "seed": args.seed}
        report = store.adapt_now(AdaptationPolicy(**{k: v for k, v in chosen.items() if v is not None}))
    lines = [f"{report.kind}: {report.status}" + (f" (adapter {report.adapter_id})" if report.adapter_id else "")
             + (f": {report.reason}" if report.reason else ""),
             f"  fingerprint {report.fingerprint_before} -> {store.fingerprint}"]
    if report.gate is not None:
        lines.append(f"  gate: {report.gate.reason}")
    lines.append(f"  seconds: train {report.train_seconds:.2f}, gate {report.gate_seconds:.2f}, re-embed "
                 f"{report.reembed_seconds:.2f}, index {report.index_seconds:.2f}, swap {report.swap_seconds:.2f}")
    emit(report.to_dict(), lines)


def main(argv: Sequence[str] | None = None, *, embedder: Any = None, out=None) -> int:
    """Run the `evermind` command.

    Args:
        argv: arguments (default: sys.argv[1:]).
        embedder: an embedder to use instead of --model/--tokenizer or the shipped model (for programs/tests).
        out: where to print (default: stdout).
    Returns:
        the exit status (0 ok, 1 error or failed check, 2 usage error).
    """
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            try:
                from .demo import run_demo
            except ImportError:
                raise EvermindError("the demo is not available in this build of evermind_memory.") from None
            return int(run_demo(args) or 0)
        emb = _embedder(args, embedder)
        with _open(args, emb) as store:
            return _run(args, store, out)
    except EvermindError as exc:
        print(f"evermind: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"evermind: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
