"""The `evermind` command: remember, recall and maintain a memory store from a shell or a script, or serve it
to agents over MCP (`evermind mcp`).

Every subcommand takes `--db PATH` (a file, or a postgresql:// URL; default: $EVERMIND_DB, else the user data
directory) and `--json`
(results as JSON on stdout; errors as one JSON object on stderr). Errors are handled in one place (`main`)
and mapped to the exit codes in EXIT_CODES. Importing this module loads no numpy, model or store code: a
command imports what it needs when it runs, so `--help` and `--version` start at interpreter speed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Sequence

from .cli_parser import (  # noqa: F401  (re-exported: tests and docs read them as cli.*)
    DB_ENV, EXIT_CODES, EXIT_DAMAGED, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_LOCKED, EXIT_MODEL, EXIT_NOT_FOUND,
    EXIT_OK, EXIT_OS, EXIT_SIGPIPE, EXIT_USAGE, MODEL_FREE_COMMANDS, READ_COMMANDS, SCOPE_LEVELS, UsageError,
    build_parser, default_db_path,
)
from .errors import (
    CheckpointError, EmbedderMismatch, EmbedderOutputInvalid, EvermindError, FactNotFound, InvalidInput, StoreCorrupt,
    StoreLocked, TokenizerError,
)


def exit_code(exc: BaseException) -> int:
    """The exit status for an error (see EXIT_CODES)."""
    if isinstance(exc, FactNotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, StoreCorrupt):
        return EXIT_DAMAGED
    if isinstance(exc, StoreLocked):
        return EXIT_LOCKED
    if isinstance(exc, (EmbedderMismatch, EmbedderOutputInvalid, CheckpointError, TokenizerError)):
        return EXIT_MODEL
    if isinstance(exc, (InvalidInput, UsageError)):
        return EXIT_USAGE
    if isinstance(exc, OSError):
        return EXIT_OS
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_FAILED



def _scores(hit: Any) -> str:
    """A hit's score, and beside it its calibrated relevance (hybrid recall with a fitted rule): the number that
    means the same in every store."""
    return f"{hit.score:7.3f}" + ("" if hit.relevance is None else f"  rel {hit.relevance:.2f}")


def _why(hit: Any) -> list[str]:
    """recall --explain's line under a hit: its relevance and how its score was made (none without --explain)."""
    e = hit.explain
    if e is None:
        return []
    rel = "" if hit.relevance is None else f"relevance {hit.relevance:.3f}; "
    bm25 = "-" if e.bm25 is None else f"{e.bm25:.3f} (#{e.lexical_rank})"
    cos = "-" if e.cosine is None else f"{e.cosine:.3f}" + ("" if e.vector_rank is None else f" (#{e.vector_rank})")
    reranked = "" if e.word_match is None else f"; reranked, word match {e.word_match:.3f}"
    return [f"         {rel}{e.rule}: lexical {e.lexical:.3f} + vector {e.vector:.3f}; bm25 {bm25}, cosine {cos}"
            f"{reranked}"]


def _jsonable(value: Any) -> Any:
    import dataclasses  # here, not at the top: with inspect and ast it is a third of this module's import time
    from datetime import datetime

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
        return None  # the store's default (the shipped model)
    if args.model is None or args.tokenizer is None:
        raise InvalidInput("--model and --tokenizer go together: pass both, or neither for the shipped model.")
    from .embedder.loader import load_embedder

    return load_embedder(args.model, args.tokenizer)


def _open(args: argparse.Namespace, embedder: Any):
    from .store import MemoryStore

    path = args.db if args.db is not None else default_db_path()
    if args.command in READ_COMMANDS or getattr(args, "read_only", False):
        if not isinstance(path, str) and not path.exists():
            import shlex

            given = "" if args.db is None else f" --db {shlex.quote(str(path))}"
            raise InvalidInput(f"no store at {path} yet; `evermind{given} remember TEXT` creates one.")
        return MemoryStore(path, embedder, read_only=True)
    if not isinstance(path, str):
        if args.command == "check" and not path.exists():  # a mistyped path must not pass as a new, empty store
            raise InvalidInput(f"no store at {path} to check.")
        path.parent.mkdir(parents=True, exist_ok=True)
    return MemoryStore(path, embedder, durability=args.durability)


def _scoped(args: argparse.Namespace, store: Any) -> Any:
    """The store, or its view for --namespace/--user/--agent/--run."""
    levels = {level: getattr(args, level) for level in SCOPE_LEVELS if getattr(args, level) is not None}
    return store.scope(**levels) if levels else store


# commands that look after the whole store: a scope option would be ignored (migrate copied every tenant's facts
# under --user) or refused in Python's words (MemoryStore's owner-only methods)
WHOLE_STORE_COMMANDS = {"backup", "check", "compact", "rebuild", "reembed", "repair", "migrate"}


def _export_to_stream(store: Any, out: Any) -> int:
    """`export -`: the store's export (atomic, to a private temp file) copied to `out`; how many facts."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="evermind-export-") as tmp:
        path = os.path.join(tmp, "facts.jsonl")
        count = store.export(path)
        with open(path, encoding="utf-8") as fh:
            shutil.copyfileobj(fh, out)
    out.flush()
    return count


def _import_from_stdin(store: Any) -> int:
    """`import -`: standard input spooled to a private temp file, then imported as a file (one transaction)."""
    import shutil
    import tempfile

    stream = getattr(sys.stdin, "buffer", None)
    with tempfile.TemporaryDirectory(prefix="evermind-import-") as tmp:
        path = os.path.join(tmp, "stdin.jsonl")
        with open(path, "wb" if stream is not None else "w") as fh:
            shutil.copyfileobj(stream if stream is not None else sys.stdin, fh)
        return int(store.import_(path))


def _typed_tag_hint(args: argparse.Namespace, found: int) -> None:
    """When --tag KEY=VALUE matched nothing and VALUE reads as a number or true/false, say on stderr that --tag
    values are text and how to match a typed one (human output shows 2 and "2" alike)."""
    if found or getattr(args, "json", False):
        return
    for key, value in getattr(args, "tag", None) or []:
        try:
            typed = json.loads(value.lower() if value.lower() in ("true", "false") else value)
        except ValueError:
            continue
        if isinstance(typed, (bool, int, float)):
            print(f"evermind: --tag values are text: {key}={value} matches the text {value!r} only; for the "
                  f"{type(typed).__name__} use --where '{json.dumps({key: typed})}'.", file=sys.stderr)


def _exists(store: Any, fact_id: str) -> bool:
    """Whether `store` (a scope view or not) reaches a live fact `fact_id` (InvalidInput for a malformed id)."""
    try:
        store.get(fact_id)
    except FactNotFound:
        return False
    return True


def _filter_args(args: argparse.Namespace) -> dict:
    """tags/where/source/since/until of a command that has `filters()`."""
    out = {"tags": dict(args.tag) or None, "where": args.where, "source": args.source}
    if hasattr(args, "since"):
        out.update(since=args.since, until=args.until)
    return out


# C0 and C1 controls, DEL, and the bidirectional overrides: shown escaped in human output, so a stored newline
# keeps a fact on one line and stored text cannot send escape sequences to the terminal (--json is exact)
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_CONTROLS.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})
_CONTROLS.update({c: f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]})


def _shown(text: object) -> str:
    """Text for a human line: controls escaped (see _CONTROLS)."""
    return str(text).translate(_CONTROLS)


def _fact_line(fact: Any) -> str:
    tags = " ".join(f"{k}={v}" for k, v in sorted(fact.tags.items()))
    extra = f"  [{tags}]" if tags else ""
    source = f"  (from {fact.source})" if fact.source else ""
    return _shown(f"{fact.id}  {fact.text}{extra}{source}")


def _text_arg(text: str | None, argv: Sequence[str]) -> str | None:
    """A text argument; "-" reads stdin, which must be UTF-8 (the advice for anything else is a shell's: the
    user's own command line behind iconv)."""
    if text != "-":
        return text
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream without bytes underneath (a program's own sys.stdin)
        return sys.stdin.read().rstrip("\n")
    data = stream.read()
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        import shlex

        raise InvalidInput(
            f"stdin is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} (Latin-1 or another "
            f"legacy encoding?). Convert it first, e.g. `iconv -f latin1 -t utf-8 FILE | evermind {shlex.join(argv)}`."
        ) from None
    return decoded.removeprefix("\ufeff").rstrip("\r\n")


def _check_argv(argv: Sequence[str]) -> None:
    """Refuse command-line arguments that are not UTF-8: Python hands their bytes over as lone surrogates, which
    the store would refuse with advice for Python programs, not for a shell."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            byte = ord(arg[exc.start]) - 0xDC00 if 0xDC80 <= ord(arg[exc.start]) <= 0xDCFF else None
            what = f"the byte 0x{byte:02x}" if byte is not None else f"the character U+{ord(arg[exc.start]):04X}"
            raise InvalidInput(
                f"argument {i + 1} ({arg[:exc.start]!r:.40}...) is not UTF-8 text: {what} at position {exc.start} "
                "(Latin-1 or another legacy encoding?). Convert it first, e.g. "
                "`evermind remember \"$(printf '%s' \"$TEXT\" | iconv -f latin1 -t utf-8)\"`, or pass it on "
                "stdin through iconv: `iconv -f latin1 -t utf-8 FILE | evermind remember -`."
            ) from None


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
        fields = {"tags": {**dict(args.tag), **(args.tags or {})} or None, "source": args.source, "id": args.id,
                  "ttl": args.ttl, "expires_at": args.expires_at, "pinned": args.pinned, "at": args.at}
        text = _text_arg(args.text, args.argv)
        if args.dedup:
            from ._remember import remember_deduped

            fid, duplicate = remember_deduped(store, text, **fields)
        else:
            fid, duplicate = store.remember(text, **fields), False
        store.flush()  # embedded and indexed before we exit; a bad vector is an error here, not a silent gap
        emit({"id": fid, "duplicate": duplicate}, [fid])  # stdout: the id alone, for $(evermind remember ...)
        if duplicate and not emit_json:
            print(f"evermind: {fid} says this already; nothing new was stored (--dedup).", file=sys.stderr)
    elif cmd == "recall":
        if args.now is not None and not args.time_words:
            raise InvalidInput("--now is the time --time-words counts from; add --time-words.")
        if args.min_relevance is not None and args.mode != "hybrid":
            raise InvalidInput(f"--min-relevance judges hybrid recall (the default mode), not --mode {args.mode}; "
                               "use --min-score there.")
        hits = store.recall(args.query, k=args.k, mode=args.mode, min_score=args.min_score, fusion=args.fusion,
                            recency=args.recency, min_relevance=args.min_relevance, explain=args.explain,
                            context=args.context, time_words=args.time_words, now=args.now, rerank=args.rerank,
                            **_filter_args(args))
        _typed_tag_hint(args, len(hits))
        emit(hits, [line for h in hits for line in [f"{_scores(h)}  {_fact_line(h)}", *_why(h),
                                                    *(f"         | {_shown(f.text)}" for f in h.context)]])
    elif cmd == "get":
        fact = store.get(args.id)
        emit(fact, [_fact_line(fact), f"created {fact.created_at.isoformat()}  updated {fact.updated_at.isoformat()}"])
    elif cmd == "update":  # tags merge by default, as in Python and MCP; --replace-tags / --clear-tags replace
        patch = {**dict(args.tag), **(args.tags or {}), **{key: None for key in args.untag}}
        if args.clear_tags and patch:
            raise InvalidInput("update takes --clear-tags (remove every tag) or --tag/--tags/--untag, not both.")
        if args.replace_tags and args.untag:
            raise InvalidInput("update --replace-tags keeps only the tags given; --untag has nothing to remove there.")
        replace = args.clear_tags or args.replace_tags
        fact = store.update(args.id, _text_arg(args.text, args.argv), tags=patch if (patch or replace) else None,
                            source=args.source, replace_tags=replace)
        emit(fact, [_fact_line(fact)])
    elif cmd == "forget":
        chosen = {k: v for k, v in _filter_args(args).items() if v}
        if args.ids and chosen:
            raise InvalidInput("forget takes ids or --tag/--where/--source/--since/--until, not both.")
        if not args.ids and not chosen:
            raise InvalidInput("forget takes fact ids or --tag/--where/--source/--since/--until; `evermind clear "
                               "--yes` forgets every fact.")
        if args.ids:  # every id is checked before any is forgotten: a typo forgets nothing
            ids = list(dict.fromkeys(args.ids))
            missing = [fid for fid in ids if not _exists(store, fid)]
            if missing:
                raise FactNotFound(f"forget found no fact with id {', '.join(map(repr, missing))} here (forgotten, "
                                   "expired, or in another scope); nothing was forgotten.")
            for fid in ids:
                store.forget(fid)
            count = len(ids)
        else:
            count = store.forget_where(**chosen)
        emit({"forgotten": count}, [f"forgot {count} fact{'s' * (count != 1)}"])
    elif cmd == "supersede":
        fid = store.supersede(args.id, _text_arg(args.text, args.argv))
        emit({"id": fid, "replaces": args.id}, [fid])
    elif cmd == "clear":
        if not args.yes:
            raise InvalidInput("clear forgets every fact of the scope given (of the whole store without --user, "
                               "--agent, --run or --namespace); add --yes if you mean it.")
        count = store.clear(confirm=args.yes)
        emit({"forgotten": count}, [f"forgot {count} fact{'s' * (count != 1)}"])
    elif cmd == "count":
        count = store.count(**_filter_args(args))
        emit({"count": count}, [str(count)])
        _typed_tag_hint(args, count)
    elif cmd == "feedback":
        store.feedback(args.query, args.id, useful=not args.not_useful)
        verdict = "not useful" if args.not_useful else "useful"
        emit({"id": args.id, "useful": not args.not_useful}, [f"noted: {args.id} {verdict} for {args.query!r}"])
    elif cmd == "list":
        facts = store.list(limit=args.limit, offset=args.offset, **_filter_args(args))
        emit(facts, [_fact_line(f) for f in facts])
        _typed_tag_hint(args, len(facts))
    elif cmd == "history":
        changes = store.history(args.id)
        emit(changes,
             [f"{c.seq:>8}  {c.at.isoformat()}  {c.op:<8}  {_shown(c.text) if c.text is not None else ''}"
              for c in changes])
    elif cmd == "check":
        report = store.check()
        emit(report, [("ok" if report.ok else "PROBLEMS") + f": {report.facts} facts, {report.indexed} indexed"]
             + [f"  - {p}" for p in report.problems])
        return EXIT_OK if report.ok else EXIT_FAILED
    elif cmd == "repair":
        report = store
        emit(report, [f"{report.mode}: {report.facts} facts, {report.indexed} indexed; {report.fixed} fixed, "
                      f"{report.quarantined} quarantined, {report.restored} restored from the change log, "
                      f"{report.vectors_cleared} vectors embedded again"]
             + ([f"  damaged files kept in {report.kept_aside}"] if report.kept_aside else [])
             + [f"  - {note}" for note in report.notes[:10]]
             + [f"  still wrong: {p}" for p in report.problems_after])
        return EXIT_OK if report.ok else EXIT_FAILED
    elif cmd == "reembed":
        count = store.reembed(force=args.force)
        emit({"reembedded": count}, [f"re-embedded {count} facts"])
    elif cmd == "rebuild":
        count = store.rebuild_index()
        emit({"indexed": count}, [f"index rebuilt with {count} vectors"])
    elif cmd == "export":
        if str(args.path) == "-":  # the facts on stdout, the summary on stderr
            count = _export_to_stream(store, out)
            print(json.dumps({"exported": count}) if emit_json else f"exported {count} facts", file=sys.stderr)
        else:
            if args.path.exists() and not args.force:
                raise InvalidInput(f"export: {args.path} exists; pass --force to replace it, or give another path.")
            count = store.export(args.path)
            emit({"exported": count, "path": str(args.path)}, [f"exported {count} facts to {args.path}"])
    elif cmd == "import":
        count = _import_from_stdin(store) if str(args.path) == "-" else store.import_(args.path)
        emit({"imported": count}, [f"imported {count} facts"])
    elif cmd == "backup":
        dest = store.backup(args.dest)
        emit({"backup": str(dest)}, [f"backed up to {dest}"])
    elif cmd == "info":
        info = store.info()
        emit(info, [f"{k:>22}: {v}" for k, v in info.items()])
    elif cmd in ("stats", "compact"):
        if cmd == "compact":
            if not 0 <= args.keep_history_days <= 36_525:
                raise InvalidInput(f"--keep-history-days expects 0 to 36525, got {args.keep_history_days}.")
            stats = store.compact(keep_history=args.keep_history_days * 86_400, vacuum=not args.no_vacuum)
        else:
            stats = store.stats()
        emit(stats, [f"{k:>12}: {v}" for k, v in _jsonable(stats).items()])
    elif cmd == "sweep":
        count = store.sweep()
        emit({"swept": count}, [f"swept {count} expired fact{'s' * (count != 1)}"])
    elif cmd == "duplicates":
        pairs = store.duplicates(limit=args.limit, **_filter_args(args))
        emit(pairs, [f"{p.drop} repeats {p.keep} (cosine {p.cosine:.2f}, overlap {p.overlap:.2f}: {p.reason})\n"
                     f"    new: {p.drop_text}\n    old: {p.keep_text}" for p in pairs] or ["no duplicates found"])
    elif cmd == "adapt":
        _adapt(args, store, emit)
    return EXIT_OK


def _adapt(args: argparse.Namespace, store: Any, emit) -> None:
    """`evermind adapt`: one synchronous round, a rollback, or the adapter history."""
    if args.history:
        entries = store.adapter_history()
        emit(entries,
             [f"{'*' if e['active'] else ' '} {e['id']}  {e.get('status', '?'):<10} {e.get('created_at', '')}  "
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


def _mcp(args: argparse.Namespace, embedder: Any) -> int:
    """`evermind mcp`: check the transport options, open the store, serve until the client or a signal stops it."""
    from importlib.util import find_spec

    if find_spec("mcp") is None:
        from ._extras import install_command

        raise EvermindError(f"`evermind mcp` needs the MCP SDK, an optional extra: `{install_command('mcp')}`.")
    from .mcp import build_server, http_config, serve_http, serve_stdio

    config = None
    if args.http is not None:  # refuse a bad address or a missing token before opening anything
        config = http_config(args.http, token_file=args.token_file, allow_hosts=args.allow_host,
                             allow_origins=args.allow_origin, requests_per_minute=args.max_requests_per_minute)
    elif args.token_file is not None or args.allow_host or args.allow_origin:
        raise InvalidInput("--token-file, --allow-host and --allow-origin apply to --http; stdio needs none of them.")
    signalled = False
    with _open(args, embedder) as store:
        server = build_server(_scoped(args, store))
        if config is None:
            if sys.stdin.isatty():  # typed at a prompt: say what it is waiting for rather than hang silently
                print("evermind mcp: serving MCP on stdin/stdout for a host that starts this command (Claude "
                      "Desktop, an agent framework: docs/mcp.md); Ctrl-C stops it. --http HOST:PORT serves over "
                      "HTTP instead.", file=sys.stderr, flush=True)
            signalled = serve_stdio(server)
        else:
            serve_http(server, config)
    if signalled:  # the store is closed; a thread blocked on stdin would keep the process alive forever
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)
    return EXIT_OK


def _program() -> str:
    """How to run this command again as the user ran it: `evermind` when that name finds this program on PATH,
    else the path they ran (`.venv/bin/evermind`), or this interpreter with -m for `python -m evermind_memory`."""
    import shlex
    import shutil

    ran = sys.argv[0] if sys.argv else ""
    if os.path.basename(ran) == "evermind":
        found = shutil.which("evermind")
        try:
            if found is not None and os.path.samefile(found, ran):
                return "evermind"
        except OSError:
            pass
        return shlex.quote(ran)
    if os.path.basename(ran) == "__main__.py" and os.path.basename(os.path.dirname(ran)) == __package__:
        return f"{shlex.quote(sys.executable)} -m {__package__}"
    return "evermind"  # a program calling main() itself: the command's own name


def _report(exc: BaseException, as_json: bool) -> int:
    """Print one error (a line, or a JSON object with --json) on stderr; return its exit code. A command the
    message quotes (`evermind repair PATH`) is written the way this one was run, so it runs as printed."""
    code = exit_code(exc)
    name = type(exc).__name__
    message = "interrupted" if isinstance(exc, KeyboardInterrupt) else (str(exc) or name)
    program = _program()
    if program != "evermind":  # a command starts after a backtick, or after a pipe inside one (`iconv ... | evermind`)
        message = re.sub(r"(`|`[^`]*\| )evermind ", lambda m: f"{m.group(1)}{program} ", message)
    if as_json:
        print(json.dumps({"error": name, "message": message, "exit_code": code}, ensure_ascii=False), file=sys.stderr)
    else:
        if isinstance(exc, UsageError):
            print(exc.usage, file=sys.stderr)
        print(f"evermind: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None, *, embedder: Any = None, out=None) -> int:
    """Run the `evermind` command.

    Args:
        argv: arguments (default: sys.argv[1:]).
        embedder: an embedder to use instead of --model/--tokenizer or the shipped model (for programs/tests).
        out: where to print results (default: stdout); errors go to stderr.
    Returns:
        the exit status (EXIT_CODES).
    """
    out = out or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
        as_json = args.json
        _check_argv(argv)
        args.argv = argv  # (for advice that repeats the user's own command line)
        if getattr(args, "store", None) is not None:  # `evermind repair PATH` / `evermind check PATH`
            if args.db is not None and str(args.db) != str(args.store):
                raise InvalidInput(f"`evermind {args.command}` got two stores, --db {args.db} and {args.store}; "
                                   "give one.")
            args.db = args.store
        scoped = [f"--{level}" for level in SCOPE_LEVELS if getattr(args, level, None) is not None]
        if args.command in WHOLE_STORE_COMMANDS and scoped:
            raise InvalidInput(f"`evermind {args.command}` works on the whole store, every scope in it; drop "
                               f"{' '.join(scoped)}.")
        if args.command == "demo":
            try:
                from .demo import run_demo
            except ModuleNotFoundError as exc:
                if exc.name != f"{__package__}.demo":
                    raise  # a dependency is missing (numpy...): said below, with how to install it
                raise EvermindError("the demo is not available in this build of evermind_memory.") from None
            return int(run_demo(args, out=out) or 0)
        if args.command == "migrate":  # store to store: no model, nothing opened as a MemoryStore
            from .store.backend import migrate

            report = migrate(str(args.source), str(args.dest))
            if as_json:
                print(json.dumps(report.to_dict()), file=out)
            else:
                print(f"copied {report.source} -> {report.dest} in {report.seconds:.1f} s; verified:", file=out)
                for table, rows in report.rows.items():
                    print(f"  {table:<14} {rows:>9} rows  sha256 {report.checksums[table][:16]}", file=out)
                print(f"  adapters       {report.adapters:>9}", file=out)
            return EXIT_OK
        emb = _embedder(args, embedder)
        if args.command == "mcp":
            return _mcp(args, emb)
        if args.command == "repair":  # a damaged store may not open: repair works on its files
            from .store import repair_store

            path = args.db if args.db is not None else default_db_path()
            return _run(args, repair_store(path, emb, durability=args.durability), out)
        with _open(args, emb) as store:
            return _run(args, _scoped(args, store), out)
    except BrokenPipeError:  # `evermind list | head`: the reader has gone, as with any Unix tool: quietly
        try:  # and nothing more reaches the closed pipe when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is not a file (a test's StringIO)
            pass
        return EXIT_SIGPIPE
    except (EvermindError, UsageError, OSError, KeyboardInterrupt) as exc:
        return _report(exc, as_json)
    except Exception as exc:  # noqa: BLE001 (a bug of ours: one line, not a traceback; EVERMIND_DEBUG=1 shows it)
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing and missing.partition(".")[0] != __package__:  # run from a checkout without installing
            return _report(EvermindError(
                f"{missing} is not installed, and evermind_memory needs it: install the package with its "
                "dependencies (in a checkout: python3 -m venv .venv && .venv/bin/pip install -e . ; then run "
                ".venv/bin/evermind)."), as_json)
        if os.environ.get("EVERMIND_DEBUG"):
            raise
        return _report(EvermindError(f"internal error ({type(exc).__name__}: {exc}); please report it (run with "
                                     "EVERMIND_DEBUG=1 for the traceback)."), as_json)


if __name__ == "__main__":
    sys.exit(main())
