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
import sys
from pathlib import Path
from typing import Any, Sequence

from . import __version__
from .errors import (
    CheckpointError, EmbedderMismatch, EmbedderOutputInvalid, EvermindError, FactNotFound, InvalidInput, StoreCorrupt,
    StoreLocked, TokenizerError,
)

DB_ENV = "EVERMIND_DB"
# opened read-only: they run beside a writer
READ_COMMANDS = {"recall", "get", "list", "history", "export", "info", "count", "stats", "duplicates"}
# Commands whose work needs no embedding model. Today MemoryStore() still loads and probes the model when it
# opens; once the store loads it lazily these commands start without it (the CLI itself never forces it).
MODEL_FREE_COMMANDS = {"get", "list", "history", "forget", "feedback", "check", "rebuild", "export", "backup", "info",
                       "count", "sweep", "compact", "stats", "clear"}
SCOPE_LEVELS = ("namespace", "user", "agent", "run")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_LOCKED, EXIT_MODEL, EXIT_OS = 0, 1, 2, 3, 4, 5, 6
EXIT_DAMAGED = 7
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "failure: `check` found problems, or an error not listed below",
    EXIT_USAGE: "usage: a bad command line or argument value (InvalidInput), or no store at --db for a read",
    EXIT_NOT_FOUND: "not found: no fact with that id (FactNotFound)",
    EXIT_LOCKED: "busy: another process held the store's write lock past the busy timeout, or runs the same job "
                 "(StoreLocked); retry later",
    EXIT_MODEL: "model: the embedder or a model file failed (EmbedderMismatch, EmbedderOutputInvalid, "
                "CheckpointError, TokenizerError)",
    EXIT_OS: "system: the operating system refused a file operation (StorageError, OSError: permissions, disk "
             "full, ...)",
    EXIT_DAMAGED: "damaged: the store's files are damaged (StoreCorrupt); `evermind repair PATH` keeps every "
                  "readable fact",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


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


class UsageError(Exception):
    """A command line argparse refused (raised instead of argparse's own exit, so --json can report it)."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's hook: raise, and let main() report it
        raise UsageError(message, self.format_usage().rstrip())


def _is_url(text: str) -> bool:
    return text.startswith(("postgresql://", "postgres://"))


def default_db_path() -> Path | str:
    """$EVERMIND_DB if set (a file path or a postgresql:// URL), else `<user data dir>/evermind/memory.db`."""
    if os.environ.get(DB_ENV):
        return _db(os.environ[DB_ENV])
    from platformdirs import user_data_dir

    return Path(user_data_dir("evermind")) / "memory.db"


def _path(text: str) -> Path:
    """A path argument, `~` expanded (a host's MCP config passes arguments without a shell)."""
    return Path(text).expanduser()


def _db(text: str) -> Path | str:
    """A store argument: a file path (`~` expanded), or a PostgreSQL URL kept as it is."""
    return text if _is_url(text) else _path(text)


def _tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _json_object(text: str) -> dict:
    """A JSON object argument (--where, --tags)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"user\": \"ada\"}}', got {text!r:.60} "
                                         f"({exc})")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"user\": \"ada\"}}', got {text!r:.60}")
    return value


def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the subcommand (SUPPRESS keeps the main parser's value)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db", type=_db, default=argparse.SUPPRESS, metavar="PATH",
                   help=f"store file or postgresql:// URL (default: ${DB_ENV}, else the user data directory)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print results as JSON (errors: one JSON object on stderr)")
    p.add_argument("--model", type=_path, default=argparse.SUPPRESS, metavar="PATH",
                   help="model file (.evlm, EvermindLM or sequence backbone) to embed with (default: the shipped "
                        "model)")
    p.add_argument("--tokenizer", type=_path, default=argparse.SUPPRESS, metavar="PATH",
                   help="BPE tokenizer JSON that goes with --model")
    p.add_argument("--durability", choices=("normal", "full"), default=argparse.SUPPRESS,
                   help="normal (default): survives application crashes; full: also power loss, slower commits")
    for level in SCOPE_LEVELS:
        p.add_argument(f"--{level}", default=argparse.SUPPRESS, metavar=level.upper(),
                       help=f"work in this {level}'s scope only (see store.scope())")
    return p


def _epilog() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `evermind` (exposed for docs and tests)."""
    parser = _Parser(prog="evermind", description="Local memory with semantic recall.", parents=[_common()],
                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"evermind {__version__}",
                        help="print the version and exit")
    parser.set_defaults(db=None, json=False, model=None, tokenizer=None, durability="normal", namespace=None, user=None,
                        agent=None, run=None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="what to do (COMMAND -h: its options)")

    # Parents share Action objects: the subcommands get a copy other than the main parser's, so its set_defaults
    # above does not leak into them; they share that one copy (none sets defaults; 27 copies cost ~7 ms, issue 19).
    common = _common()

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common])

    def tags(p: argparse.ArgumentParser, help_text: str) -> None:
        p.add_argument("--tag", type=_tag, action="append", default=[], metavar="KEY=VALUE", help=help_text)

    def filters(p: argparse.ArgumentParser, *, source: bool = True, times: bool = True) -> None:
        tags(p, "only facts carrying this tag (repeatable: all must match)")
        p.add_argument("--where", type=_json_object, default=None, metavar="JSON",
                       help='a filter over tags, source and times, e.g. \'{"n": {"$gte": 2}}\' '
                            '(docs/filters-and-scopes.md)')
        if source:
            p.add_argument("--source", help="only facts from this source")
        if times:
            p.add_argument("--since", default=None, metavar="TIME", help="created at or after (ISO 8601 with offset)")
            p.add_argument("--until", default=None, metavar="TIME", help="created at or before (ISO 8601 with offset)")

    p = add("remember", "store a fact")
    p.add_argument("text", help="the fact ('-' reads it from stdin)")
    tags(p, "a label (repeatable; the value is text)")
    p.add_argument("--tags", type=_json_object, default=None, metavar="JSON",
                   help='labels as JSON, values str, number or bool: \'{"priority": 2, "done": false}\'')
    p.add_argument("--source", help="provenance: who or what said it")
    p.add_argument("--id", default=None, help="your own id: a fact with it is replaced (upsert, history kept)")
    p.add_argument("--ttl", type=float, default=None, metavar="SECONDS", help="expire after this many seconds")
    p.add_argument("--expires-at", default=None, metavar="TIME", help="expire at this time (ISO 8601 with offset)")
    p.add_argument("--pinned", action="store_true", help="keep until forgotten (no expiry, no recency decay)")
    p.add_argument("--dedup", action="store_true", help="if it repeats a stored fact, print that id, store nothing")
    p.add_argument("--at", default=None, metavar="TIME",
                   help="when it was said (ISO 8601 with offset, not in the future; default now)")

    p = add("recall", "find the facts that best match a query")
    p.add_argument("query", help="what to look for")
    p.add_argument("-k", type=int, default=5, help="at most this many facts (default 5)")
    filters(p)
    p.add_argument("--recency", type=float, default=None, metavar="SECONDS",
                   help="weight scores by 0.5 ** (age / SECONDS), age since the fact last changed (default: off)")
    p.add_argument("--mode", choices=("hybrid", "vector", "lexical"), default="hybrid",
                   help="hybrid (default): words and meaning; vector: meaning; lexical: words (needs no model)")
    p.add_argument("--fusion", choices=("score", "rrf"), default="score",
                   help="how hybrid mode fuses its two rankings (default: score)")
    p.add_argument("--min-score", type=float, default=None, help="drop facts scoring below this")
    p.add_argument("--min-relevance", type=float, default=None, metavar="P",
                   help="(hybrid) drop facts whose calibrated relevance, 0..1, is below P (on documents 0.1 keeps "
                        "~94%% of right answers; on short personal facts 0.2 keeps ~89%%)")
    p.add_argument("--explain", action="store_true",
                   help="(hybrid) show each fact's relevance and the lexical and vector parts of its score")
    p.add_argument("--context", type=int, default=0, metavar="N",
                   help="for a conversation turn, also show the N turns before and after it in its session")
    p.add_argument("--time-words", action="store_true",
                   help="read the query's time words ('yesterday', 'last week', 'in May') and put facts from then "
                        "first")
    p.add_argument("--now", default=None, metavar="TIME", help="with --time-words: count from this time (ISO 8601)")
    p.add_argument("--rerank", action="store_true",
                   help="(hybrid) reorder the best 30 by reading the query's words against each fact's words: helps "
                        "short personal facts, can cost on manuals (default: off)")

    p = add("get", "show one fact")
    p.add_argument("id", help="the fact's id")

    p = add("update", "change a fact's text, tags or source (its history keeps the old version)")
    p.add_argument("id", help="the fact's id")
    p.add_argument("text", nargs="?", default=None, help="the new text ('-' reads stdin); omit to keep the text")
    tags(p, "set this tag, keeping the others (repeatable; the value is text)")
    p.add_argument("--tags", type=_json_object, default=None, metavar="JSON",
                   help='tags to set as JSON, values str, number or bool; null removes one: \'{"n": 3, "draft": '
                        'null}\'')
    p.add_argument("--untag", action="append", default=[], metavar="KEY", help="remove this tag (repeatable)")
    p.add_argument("--replace-tags", action="store_true",
                   help="the tags given replace all the old ones instead of being merged in (none given: remove all)")
    p.add_argument("--clear-tags", action="store_true", help="remove every tag (the same as --replace-tags alone)")
    p.add_argument("--source", help="the new source")

    p = add("forget", "remove facts by id, or every fact matching --tag/--where/--source/--since/--until")
    p.add_argument("ids", nargs="*", metavar="ID", help="ids of the facts to remove")
    filters(p)

    p = add("supersede", "replace a fact by a new one; both histories record the link")
    p.add_argument("id", help="the fact replaced")
    p.add_argument("text", help="the new fact ('-' reads it from stdin)")

    p = add("clear", "forget every fact (of the scope given, else of the store)")
    p.add_argument("--yes", action="store_true", help="required: confirms that every fact goes")

    p = add("count", "count the facts that match (all of them with no filter)")
    filters(p)

    p = add("feedback", "say whether a recalled fact answered a query (adaptation learns from it)")
    p.add_argument("query", help="the query as it was recalled")
    p.add_argument("id", help="the fact judged")
    p.add_argument("--not-useful", action="store_true", help="the fact did not answer the query")

    p = add("list", "list facts in the order they were remembered")
    p.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    p.add_argument("--offset", type=int, default=0, help="skip this many first")
    filters(p)

    p = add("history", "every change of a fact")
    p.add_argument("id", help="the fact's id")

    for name, help_text in (("check", "check the store's integrity (exit status 1 when something is wrong)"),
                            ("repair", "repair a damaged store: keep every readable fact, quarantine the rest, "
                                       "rebuild the indexes (the damaged files are kept aside)")):
        p = add(name, help_text)  # `evermind repair PATH`, as the damaged-store errors print it; --db PATH works too
        p.add_argument("store", nargs="?", type=_db, default=None, metavar="PATH",
                       help="the store file or postgresql:// URL (the same as --db PATH)")
    p = add("reembed", "re-embed facts made by another embedder")
    p.add_argument("--force", action="store_true", help="re-embed every fact")
    add("rebuild", "rebuild the vector index from the vectors in SQLite")

    p = add("export", "write every fact as JSON lines (no vectors)")
    p.add_argument("path", type=_path, help="the JSON lines file to write")
    p = add("import", "add the facts of a JSON lines export")
    p.add_argument("path", type=_path, help="the JSON lines file to read")
    p = add("backup", "write a consistent copy of the database (safe while others use it)")
    p.add_argument("dest", type=_path, help="the copy's path (must not exist)")
    add("info", "show sizes, identity and settings of the store")
    add("stats", "show what the store holds and its size on disk")
    add("sweep", "delete expired facts now (their history stays)")
    p = add("compact", "sweep, prune the history of long-forgotten facts, VACUUM and rebuild the index")
    p.add_argument("--keep-history-days", type=float, default=30.0, metavar="DAYS",
                   help="keep the history of facts forgotten less than this long ago (default 30; 0: none)")
    p.add_argument("--no-vacuum", action="store_true", help="leave the free pages inside the file (faster)")
    p = add("duplicates", "list pairs of facts of which the newer repeats the older")
    p.add_argument("--limit", type=int, default=100, help="at most this many pairs (default 100)")
    filters(p, times=False)

    p = add("adapt", "fit a LoRA adapter on the stored memories, gate it and swap it in (or roll back, or list)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the policy's)")
    p.add_argument("--lr", type=float, default=None, help="learning rate")
    p.add_argument("--rank", type=int, default=None, help="LoRA rank")
    p.add_argument("--max-cpu-seconds", type=float, default=None, help="training CPU budget")
    p.add_argument("--seed", type=int, default=None, help="random seed of the training round")
    p.add_argument("--rollback", metavar="ID", default=None, help="serve adapter ID (or 'base') again instead")
    p.add_argument("--history", action="store_true", help="list the adapters written for this store")

    p = add("mcp", "serve the store to agents as an MCP server (stdio by default; needs the 'mcp' extra)")
    p.add_argument("--http", metavar="[HOST:]PORT", default=None,
                   help="serve streamable HTTP at http://HOST:PORT/mcp instead (HOST defaults to 127.0.0.1; "
                        "any other address needs a token)")
    p.add_argument("--read-only", action="store_true",
                   help="open the store read-only and offer only the reading tools")
    p.add_argument("--token-file", type=_path, default=None, metavar="PATH",
                   help="file holding the bearer token HTTP clients must send (default: $EVERMIND_MCP_TOKEN)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a Host name clients may use besides the bound address and loopback (repeatable)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a browser Origin allowed besides loopback ones, e.g. https://app.example (repeatable)")
    p.add_argument("--max-requests-per-minute", type=int, default=1200, metavar="N",
                   help="HTTP requests per minute before 429 answers (default 1200)")

    p = add("migrate", "copy a whole store (facts, history, vectors, feedback, adapters) into a new, empty one and "
                       "verify counts and checksums: an SQLite file to PostgreSQL, or back")
    p.add_argument("--from", dest="source", type=_db, required=True, metavar="SOURCE",
                   help="the store to copy: a file path or a postgresql:// URL")
    p.add_argument("--to", dest="dest", type=_db, required=True, metavar="DEST",
                   help="the new store: a postgresql:// URL (a database or schema with no store), or a new file")

    p = add("demo", "run a short demonstration in a scratch store")
    p.add_argument("--keep", action="store_true", help="keep the demo store as ./evermind-demo.db")
    return parser


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
    return [f"         {rel}{e.rule}: lexical {e.lexical:.3f} + vector {e.vector:.3f}; bm25 {bm25}, cosine {cos}"]


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


def _filter_args(args: argparse.Namespace) -> dict:
    """tags/where/source/since/until of a command that has `filters()`."""
    out = {"tags": dict(args.tag) or None, "where": args.where, "source": args.source}
    if hasattr(args, "since"):
        out.update(since=args.since, until=args.until)
    return out


def _fact_line(fact: Any) -> str:
    tags = " ".join(f"{k}={v}" for k, v in sorted(fact.tags.items()))
    extra = f"  [{tags}]" if tags else ""
    source = f"  (from {fact.source})" if fact.source else ""
    return f"{fact.id}  {fact.text}{extra}{source}"


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
        fid = store.remember(_text_arg(args.text, args.argv), tags={**dict(args.tag), **(args.tags or {})} or None,
                             source=args.source, id=args.id, ttl=args.ttl, expires_at=args.expires_at,
                             pinned=args.pinned, dedup=args.dedup, at=args.at)
        store.flush()  # embedded and indexed before we exit; a bad vector is an error here, not a silent gap
        emit({"id": fid}, [fid])
    elif cmd == "recall":
        hits = store.recall(args.query, k=args.k, mode=args.mode, min_score=args.min_score, fusion=args.fusion,
                            recency=args.recency, min_relevance=args.min_relevance, explain=args.explain,
                            context=args.context, time_words=args.time_words, now=args.now, rerank=args.rerank,
                            **_filter_args(args))
        emit(hits, [line for h in hits for line in [f"{_scores(h)}  {_fact_line(h)}", *_why(h),
                                                    *(f"         | {f.text}" for f in h.context)]])
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
        if args.ids:
            for fid in args.ids:
                store.forget(fid)
            count = len(args.ids)
        else:
            count = store.forget_where(**chosen)
        emit({"forgotten": count}, [f"forgot {count} fact{'s' * (count != 1)}"])
    elif cmd == "supersede":
        fid = store.supersede(args.id, _text_arg(args.text, args.argv))
        emit({"id": fid, "replaces": args.id}, [fid])
    elif cmd == "clear":
        count = store.clear(confirm=args.yes)
        emit({"forgotten": count}, [f"forgot {count} fact{'s' * (count != 1)}"])
    elif cmd == "count":
        count = store.count(**_filter_args(args))
        emit({"count": count}, [str(count)])
    elif cmd == "feedback":
        store.feedback(args.query, args.id, useful=not args.not_useful)
        verdict = "not useful" if args.not_useful else "useful"
        emit({"id": args.id, "useful": not args.not_useful}, [f"noted: {args.id} {verdict} for {args.query!r}"])
    elif cmd == "list":
        facts = store.list(limit=args.limit, offset=args.offset, **_filter_args(args))
        emit(facts, [_fact_line(f) for f in facts])
    elif cmd == "history":
        changes = store.history(args.id)
        emit(changes,
             [f"{c.seq:>8}  {c.at.isoformat()}  {c.op:<8}  {c.text if c.text is not None else ''}" for c in changes])
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
            signalled = serve_stdio(server)
        else:
            serve_http(server, config)
    if signalled:  # the store is closed; a thread blocked on stdin would keep the process alive forever
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)
    return EXIT_OK


def _report(exc: BaseException, as_json: bool) -> int:
    """Print one error (a line, or a JSON object with --json) on stderr; return its exit code."""
    code = exit_code(exc)
    name = type(exc).__name__
    message = "interrupted" if isinstance(exc, KeyboardInterrupt) else (str(exc) or name)
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
        if args.command == "demo":
            try:
                from .demo import run_demo
            except ImportError:
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
    except (EvermindError, UsageError, OSError, KeyboardInterrupt) as exc:
        return _report(exc, as_json)
    except Exception as exc:  # noqa: BLE001 (a bug of ours: one line, not a traceback; EVERMIND_DEBUG=1 shows it)
        if os.environ.get("EVERMIND_DEBUG"):
            raise
        return _report(EvermindError(f"internal error ({type(exc).__name__}: {exc}); please report it (run with "
                                     "EVERMIND_DEBUG=1 for the traceback)."), as_json)


if __name__ == "__main__":
    sys.exit(main())
