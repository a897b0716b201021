"""The command line of `evermind`: its arguments, the values they parse to, and its exit codes. Split from
`cli.py` (which runs the commands) so that the parser reads as one piece; like it, importing this loads no numpy,
model or store code."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from . import __version__

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
EXIT_SIGPIPE = 141  # 128 + SIGPIPE, what a Unix tool whose reader left (`| head`) ends with
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
    EXIT_SIGPIPE: "the reader of the output left (`| head`): nothing is printed",
}



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
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"priority\": 2}}', got {text!r:.60} "
                                         f"({exc})")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"priority\": 2}}', got {text!r:.60}")
    return value


def _common() -> _Parser:
    """Options accepted before or after the subcommand (SUPPRESS keeps the main parser's value)."""
    p = _Parser(add_help=False)
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
                   help="weight scores by 0.5 ** (age / SECONDS), age since the fact last changed, before the rerank "
                        "of short notes rescales them (default: off)")
    p.add_argument("--mode", choices=("hybrid", "vector", "lexical"), default="hybrid",
                   help="hybrid (default): words and meaning; vector: meaning; lexical: words (needs no model)")
    p.add_argument("--fusion", choices=("score", "rrf"), default="score",
                   help="how hybrid mode fuses its two rankings (default: score)")
    p.add_argument("--min-score", type=float, default=None,
                   help="drop facts scoring below this (hybrid: the fused score, before the rerank of short notes "
                        "rescales what is shown; --explain shows it)")
    p.add_argument("--min-relevance", type=float, default=None, metavar="P",
                   help="(hybrid) drop facts whose calibrated relevance, 0..1, is below P (on documents 0.1 keeps "
                        "~95%% of right answers; on short personal facts 0.2 keeps ~89%%)")
    p.add_argument("--explain", action="store_true",
                   help="(hybrid) show each fact's relevance and the lexical and vector parts of its score")
    p.add_argument("--context", type=int, default=0, metavar="N",
                   help="for a conversation turn, also show the N turns before and after it in its session")
    p.add_argument("--time-words", action="store_true",
                   help="read the query's time words ('yesterday', 'last week', 'in May') and put facts from then "
                        "first")
    p.add_argument("--now", default=None, metavar="TIME", help="with --time-words: count from this time (ISO 8601)")
    p.add_argument("--rerank", action=argparse.BooleanOptionalAction, default=None,
                   help="(hybrid) reorder the best 30 by reading the query's words against each fact's words: helps "
                        "short personal facts, can cost on manuals (default: only when the hits are short notes)")

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
    p.add_argument("path", type=_path, help="the JSON lines file to write ('-': standard output)")
    p.add_argument("--force", action="store_true", help="replace the file if it exists")
    p = add("import", "add the facts of a JSON lines export")
    p.add_argument("path", type=_path, help="the JSON lines file to read ('-': standard input)")
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
