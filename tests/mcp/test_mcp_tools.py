"""Every MCP tool through an in-process client: results, provenance, output budget, paging, errors, threads."""

from __future__ import annotations

import json

import anyio
import pytest
from mcp import Client
from mcp_types import Implementation

from evermind_memory import MemoryStore
from evermind_memory.mcp import build_server
from evermind_memory.mcp.server import NOTICE
from mcp_helpers import error_text, payload
from poisoned_embedder import PoisonedEmbedder

pytestmark = pytest.mark.anyio

READ_TOOLS = {"recall", "get_memory", "list_memories", "memory_history"}
WRITE_TOOLS = {"remember", "remember_conversation", "update_memory", "forget", "mark_useful"}


def client(store, name: str = "pytest-agent") -> Client:
    return Client(build_server(store), raise_exceptions=True, client_info=Implementation(name=name, version="1"))


async def test_tools_carry_annotations_and_schemas(store):
    async with client(store) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert set(tools) == READ_TOOLS | WRITE_TOOLS
    hints = {name: (t.annotations.read_only_hint, t.annotations.destructive_hint, t.annotations.idempotent_hint)
             for name, t in tools.items()}
    assert hints == {
        "recall": (True, False, True), "get_memory": (True, False, True), "list_memories": (True, False, True),
        "memory_history": (True, False, True), "remember": (False, False, False),
        "remember_conversation": (False, False, False), "update_memory": (False, True, True),
                     "forget": (False, True, True), "mark_useful": (False, False, True),
    }
    for t in tools.values():
        assert t.output_schema["type"] == "object" and t.description and t.annotations.title
        assert all(p.get("description") for p in t.input_schema["properties"].values()), t.name
    recall = tools["recall"].input_schema["properties"]
    assert recall["k"]["maximum"] == 50 and recall["max_chars"]["default"] == 4000
    assert recall["mode"]["enum"] == ["hybrid", "vector", "lexical"]


async def test_remember_then_recall_with_provenance(store):
    async with client(store) as c:
        ada = payload(await c.call_tool("remember", {"text": "Ada prefers green tea", "tags": {"person": "ada"}}))
        bob = payload(await c.call_tool("remember", {"text": "Bob drinks black coffee", "source": "chat 12"}))
        assert ada["source"] == "mcp:pytest-agent" and ada["tags"] == {"person": "ada"}  # default provenance
        assert bob["source"] == "chat 12"
        out = payload(await c.call_tool("recall", {"query": "what does Ada drink?", "k": 2}))
        assert out["notice"] == NOTICE and out["omitted"] == 0 and out["mode"] == "hybrid"
        top = out["memories"][0]
        assert top["id"] == ada["id"] and top["text"] == "Ada prefers green tea" and top["truncated"] is False
        assert top["source"] == "mcp:pytest-agent" and top["created_at"].endswith("+00:00") and top["score"] > 0
        assert 0.0 < top["relevance"] < 1.0  # the shipped model has a fitted rule: hybrid hits carry relevance
        above = payload(await c.call_tool("recall", {"query": "what does Ada drink?", "k": 2,
                                                     "min_relevance": top["relevance"] + 1e-3}))
        assert ada["id"] not in [m["id"] for m in above["memories"]]
        assert all(m["relevance"] >= top["relevance"] + 1e-3 for m in above["memories"])
        reranked = payload(await c.call_tool("recall", {"query": "what does Ada drink?", "k": 2, "rerank": True}))
        assert {m["id"] for m in reranked["memories"]} == {m["id"] for m in out["memories"]}
        assert reranked["memories"][0]["score"] >= reranked["memories"][1]["score"]
        only_bob = payload(await c.call_tool("recall",
                                             {"query": "drink", "tags": {"person": "ada"}, "mode": "lexical"}))
        assert [m["id"] for m in only_bob["memories"]] == []  # tags filter exactly: "drink" alone is Bob's word
        lexical = payload(await c.call_tool("recall", {"query": "coffee", "mode": "lexical", "min_score": 0.0}))
        assert [m["id"] for m in lexical["memories"]] == [bob["id"]]
    assert store.get(ada["id"]).source == "mcp:pytest-agent"  # what the tool said is what the store holds


async def test_output_stays_within_max_chars_and_long_texts_read_on(store):
    words = " ".join(f"word{i}" for i in range(6000))  # ~51,000 characters
    async with client(store) as c:
        ids = [payload(await c.call_tool("remember", {"text": f"budget fact {i}: {words[: 3000]}"}))["id"]
               for i in range(6)]
        long_id = payload(await c.call_tool("remember", {"text": words}))["id"]
        result = await c.call_tool("recall", {"query": "budget fact", "k": 6, "mode": "lexical", "max_chars": 4000})
        out = payload(result)
        assert len(result.content[0].text) <= 4000
        assert 1 <= len(out["memories"]) < 6 and out["omitted"] == 6 - len(out["memories"])
        assert {m["id"] for m in out["memories"]} <= set(ids)
        last = out["memories"][-1]
        if last["truncated"]:
            assert last["text_chars"] > len(last["text"])
        # a text longer than one answer is read in pieces with text_offset
        pieces, offset = [], 0
        while offset < len(words):
            got = payload(await c.call_tool("get_memory",
                                            {"ids": [long_id], "max_chars": 10_000, "text_offset": offset}))
            memory = got["memories"][0]
            assert memory["text_offset"] == offset and memory["text_chars"] == len(words) and memory["text"]
            pieces.append(memory["text"])
            offset += len(memory["text"])
        assert "".join(pieces) == words and len(pieces) >= 6
        # several ids that do not fit together: the rest are named, not dropped
        got = payload(await c.call_tool("get_memory", {"ids": [long_id, *ids], "max_chars": 5000}))
        assert [m["id"] for m in got["memories"]] == [long_id] and got["memories"][0]["truncated"]
        assert got["omitted_ids"] == ids and got["missing"] == []


async def test_list_pages_with_a_cursor_that_survives_forgets(store):
    async with client(store) as c:
        ids = [payload(await c.call_tool("remember", {"text": f"listed fact {i}", "tags": {"batch": "a"}}))["id"]
               for i in range(7)]
        await c.call_tool("remember", {"text": "another batch", "tags": {"batch": "b"}})
        first = payload(await c.call_tool("list_memories", {"limit": 3, "tags": {"batch": "a"}}))
        assert [m["id"] for m in first["memories"]] == ids[:3] and first["next_cursor"]
        payload(await c.call_tool("forget", {"ids": [ids[1], ids[3]]}))  # one already shown, one not yet
        second = payload(await c.call_tool("list_memories", {"limit": 3, "tags": {"batch": "a"},
                                                             "cursor": first["next_cursor"]}))
        assert [m["id"] for m in second["memories"]] == ids[4:7] and second["next_cursor"] is None
        everything = payload(await c.call_tool("list_memories", {"limit": 100}))
        assert len(everything["memories"]) == 6 and everything["next_cursor"] is None
        wrong_scope = await c.call_tool("list_memories", {"tags": {"batch": "b"}, "cursor": first["next_cursor"]})
        assert "InvalidInput: the cursor was returned for other arguments" in error_text(wrong_scope)


async def test_update_forget_and_history(store):
    async with client(store) as c:
        fid = payload(await c.call_tool("remember", {"text": "The meeting is on Monday", "tags": {"t": "1"}}))["id"]
        updated = payload(await c.call_tool("update_memory", {"id": fid, "text": "The meeting moved to Tuesday"}))
        assert updated["memory"]["text"] == "The meeting moved to Tuesday" and updated["memory"]["tags"] == {"t": "1"}
        merged = payload(await c.call_tool("update_memory", {"id": fid, "tags": {"n": 2, "t": None}}))
        assert merged["memory"]["tags"] == {"n": 2}  # merged in by default; null removes a tag
        assert "replace_tags: true" in error_text(await c.call_tool("update_memory", {"id": fid, "tags": {}}))
        retagged = payload(await c.call_tool("update_memory", {"id": fid, "tags": {}, "replace_tags": True}))
        assert retagged["memory"]["tags"] == {} and retagged["memory"]["text"] == "The meeting moved to Tuesday"
        hit = payload(await c.call_tool("recall", {"query": "when is the meeting", "k": 1}))["memories"][0]
        assert hit["id"] == fid and "Tuesday" in hit["text"]
        gone = payload(await c.call_tool("forget", {"ids": [fid, fid, "0" * 32]}))
        assert gone == {"forgotten": [fid], "not_found": ["0" * 32]}
        again = payload(await c.call_tool("forget", {"ids": [fid]}))  # idempotent: nothing left to forget
        assert again == {"forgotten": [], "not_found": [fid]}
        history = payload(await c.call_tool("memory_history", {"id": fid}))
        assert [ch["op"] for ch in history["changes"]] == ["remember", "update", "update", "update", "forget"]
        assert history["changes"][0]["text"] == "The meeting is on Monday" and history["changes"][-1]["text"] is None
        page = payload(await c.call_tool("memory_history", {"id": fid, "limit": 3}))
        rest = payload(await c.call_tool("memory_history", {"id": fid, "limit": 3, "cursor": page["next_cursor"]}))
        assert [ch["seq"] for ch in page["changes"] + rest["changes"]] == [ch["seq"] for ch in history["changes"]]
        assert "FactNotFound: get() found no fact" in error_text(await c.call_tool("get_memory", {"ids": [fid]}))
        kept = payload(await c.call_tool("remember", {"text": "kept"}))["id"]
        both = payload(await c.call_tool("get_memory", {"ids": [kept, fid]}))  # some found: the rest in missing
        assert [m["id"] for m in both["memories"]] == [kept] and both["missing"] == [fid]


async def test_mark_useful_records_feedback_for_adaptation(store):
    async with client(store) as c:
        fid = payload(await c.call_tool("remember", {"text": "The wifi password is on the fridge"}))["id"]
        assert payload(await c.call_tool("mark_useful", {"query": "router login", "id": fid})) == \
            {"id": fid, "query": "router login", "useful": True}
        assert store.info()["feedback"] == 1
        payload(await c.call_tool("mark_useful", {"query": "router login", "id": fid, "useful": False}))
        stats = json.loads((await c.read_resource("memory://stats")).contents[0].text)
    assert stats["facts"] == 1 and stats["feedback"] >= 1 and "path" not in stats and stats["read_only"] is False


BAD_CALLS = [  # every refusal is the store's own error, or one InvalidInput sentence per argument
    ("remember", {"text": ""},
     "InvalidInput: remember() argument text: expected at least 1 character, got \"\" (string)."),
    ("remember", {"text": "a\x00b"}, "InvalidInput: text must not contain NUL"),
    ("remember", {"text": "x", "tags": {"bad key!": "v"}}, "InvalidInput: tags keys must match"),
    ("remember", {"text": "x", "tags": {"k": [1]}},
     "InvalidInput: remember() argument tags['k']: expected str, int, float or bool, got [1] (array)."),
    ("remember", {"text": "x", "tags": {"user": "ada"}}, "InvalidInput: tags key 'user' names a scope level"),
    ("recall", {"query": "x", "where": {"user": "ada"}}, "`evermind mcp --user ada` for an MCP server"),
    ("remember", {"text": "x", "tags": {"k": 2**60}}, "InvalidInput: tags['k'] expects an int within"),
    ("remember", {"text": "x" * 100_001}, "argument text: expected at most 100000 characters"),
    ("remember", {}, "InvalidInput: remember() is missing the argument text."),
    ("remember", {"text": "x", "tag": {"k": "v"}}, "InvalidInput: remember() got the unknown argument 'tag'; it takes"),
    ("recall", {"query": "x", "k": 0}, "InvalidInput: recall() argument k: expected a number >= 1, got 0 (integer)."),
    ("recall", {"query": "x", "k": 51}, "argument k: expected a number <= 50, got 51 (integer)"),
    ("recall", {"query": "x", "k": True}, "argument k: expected an integer, got the boolean true."),
    ("recall", {"query": "x", "k": "three"}, "argument k: expected an integer, got \"three\" (string)."),
    ("recall", {"query": "x", "mode": "fuzzy"}, "argument mode: expected 'hybrid', 'vector' or 'lexical', got"),
    ("recall", {"query": "x", "min_score": "NaN"}, "argument min_score: expected a finite number"),
    ("recall", {"query": "x", "max_chars": 10}, "argument max_chars: expected a number >= 1000"),
    ("recall", {"query": "x", "tags": {"a": None}}, "argument tags['a']: expected str, int, float or bool, got null."),
    ("recall", {"query": "   "}, "InvalidInput: query expected some non-blank text"),
    ("get_memory", {"ids": []}, "argument ids: expected at least 1 item, got [] (array)."),
    ("get_memory", {"ids": ["x" * 129]}, "argument ids[0]: expected at most 128 characters"),
    ("get_memory", {"ids": ["0" * 32]}, "FactNotFound: get() found no fact with id '" + "0" * 32 + "'"),
    ("get_memory", {"ids": ["0" * 32, "1" * 32]}, "Nor any of the other ids: '" + "1" * 32 + "'."),
    ("update_memory", {"id": "0" * 32}, "update_memory expected text or tags"),
    ("update_memory", {"id": "0" * 32, "text": "new"}, "FactNotFound: update() found no fact"),
    ("forget", {"ids": []}, "argument ids: expected at least 1 item"),
    ("forget", {"ids": "abc"}, "argument ids: expected a list, got \"abc\" (string)."),
    # checked before any forget
    ("forget", {"ids": ["FID", "bad\x00id"]}, "InvalidInput: fact id must not contain NUL"),
    ("list_memories", {"cursor": "not-a-cursor"}, "InvalidInput: the cursor is not one this server returned"),
    ("list_memories", {"limit": 101}, "argument limit: expected a number <= 100"),
    ("memory_history", {"id": "0" * 32}, "FactNotFound: history() found no fact"),
    ("mark_useful", {"query": "q", "id": "0" * 32}, "FactNotFound: feedback() found no fact"),
    ("mark_useful", {"query": "q", "id": "0" * 32, "useful": "maybe"}, "argument useful: expected true or false"),
    ("no_such_tool", {}, "Unknown tool"),
]


async def test_bad_input_is_an_error_result_and_the_server_carries_on(store):
    async with client(store) as c:
        fid = payload(await c.call_tool("remember", {"text": "still here"}))["id"]
        for tool, args, expected in BAD_CALLS:
            args = {k: [fid if x == "FID" else x for x in v] if k == "ids" and isinstance(v, list) else v
                    for k, v in args.items()}
            text = error_text(await c.call_tool(tool, args))
            assert expected in text, (tool, args, text)
            assert "validation error" not in text and "pydantic" not in text, text
        assert payload(await c.call_tool("get_memory", {"ids": [fid]}))["memories"][0]["text"] == "still here"
    assert len(store) == 1  # no bad call stored anything


async def test_read_only_server_offers_only_reading_tools(db):
    with MemoryStore(db) as writer:
        fid = writer.remember("read-only servers can still recall")
    with MemoryStore(db, read_only=True) as reader:
        async with client(reader) as c:
            assert {t.name for t in (await c.list_tools()).tools} == READ_TOOLS
            assert "read-only" in c.instructions and "remember" not in c.instructions
            hit = payload(await c.call_tool("recall", {"query": "recall servers"}))["memories"][0]
            assert hit["id"] == fid
            assert "Unknown tool" in error_text(await c.call_tool("remember", {"text": "no"}))


async def test_concurrent_calls_from_two_clients(store):
    """The SDK runs each call on a worker thread: 2 clients x 10 remembers and 10 recalls, all at once."""
    results: dict[str, list] = {"a": [], "b": []}

    async def agent(name: str) -> None:
        async with client(store, name) as c:
            async def one(i: int) -> None:
                results[name].append(payload(await c.call_tool("remember", {"text": f"{name} concurrent fact {i}"})))
                payload(await c.call_tool("recall", {"query": f"concurrent fact {i}", "k": 3}))

            async with anyio.create_task_group() as tg:
                for i in range(10):
                    tg.start_soon(one, i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(agent, "a")
        tg.start_soon(agent, "b")
    ids = [r["id"] for rs in results.values() for r in rs]
    assert len(set(ids)) == 20 and len(store) == 20
    assert {store.get(r["id"]).source for r in results["b"]} == {"mcp:b"}
    hits = store.recall("a concurrent fact 7", k=20, mode="lexical")
    assert {"a concurrent fact 7", "b concurrent fact 7"} <= {h.text for h in hits}


async def test_a_fact_that_could_not_be_embedded_is_a_warning_not_a_failed_recall(db):
    from evermind_memory.embedder import default_embedder

    with MemoryStore(db, PoisonedEmbedder(default_embedder())) as store:
        async with client(store) as c:
            bad = payload(await c.call_tool("remember", {"text": "a poison fact about tea"}))["id"]
            out = payload(await c.call_tool("recall", {"query": "tea"}))
            assert "non-finite" in out["warning"] and "lexical recall only" in out["warning"]
            assert bad in [m["id"] for m in out["memories"]]  # hybrid still finds it by its words
            assert "warning" not in payload(await c.call_tool("recall", {"query": "tea"}))  # reported once


async def test_where_filters_ttl_dedup_and_a_scoped_server(store):
    async with client(store) as c:
        ada = payload(await c.call_tool("remember",
                                        {"text": "Ada prefers green tea", "tags": {"person": "ada", "n": 3}}))
        payload(await c.call_tool("remember", {"text": "Bob prefers green tea too", "tags": {"person": "bob", "n": 1}}))
        again = payload(await c.call_tool("remember",
                                          {"text": "ada prefers green tea.", "tags": {"person": "ada", "n": 3},
                                                       "dedup": True}))
        assert again["id"] == ada["id"] and again["duplicate"] is True and ada["duplicate"] is False
        # a new fact said in the past is not a duplicate (its old created_at once made it look like one)
        past = payload(await c.call_tool("remember", {"text": "Carol planted the apple tree", "dedup": True,
                                                      "at": "2026-01-01T00:00:00Z"}))
        assert past["duplicate"] is False and store.get(past["id"]).text == "Carol planted the apple tree"
        out = payload(await c.call_tool("recall", {"query": "green tea", "where": {"n": {"$gte": 2}}}))
        assert [m["id"] for m in out["memories"]] == [ada["id"]] and out["memories"][0]["tags"]["n"] == 3
        page = payload(await c.call_tool("list_memories", {"where": {"$or": [{"n": 1}, {"person": "carol"}]}}))
        assert [m["text"] for m in page["memories"]] == ["Bob prefers green tea too"]
        short = payload(await c.call_tool("remember", {"text": "a passing note", "ttl_seconds": 3600}))
        got = payload(await c.call_tool("get_memory", {"ids": [short["id"]]}))["memories"][0]
        assert got["expires_at"] is not None
        bad = error_text(await c.call_tool("recall", {"query": "tea", "where": {"n": {"$gt": True}}}))
        assert "InvalidInput: where[\"n\"]: $gt expects" in bad and "bools have no order" in bad
    async with client(store.scope(user="ada")) as c:  # one server per user: it never sees another's memories
        mine = payload(await c.call_tool("remember", {"text": "Ada's private note about tea"}))
        out = payload(await c.call_tool("recall", {"query": "green tea", "k": 10}))
        assert [m["id"] for m in out["memories"]] == [mine["id"]]
        assert "FactNotFound" in error_text(await c.call_tool("update_memory", {"id": ada["id"], "text": "taken over"}))
    store.scope(user="bob").remember("Bob's note about tea", pinned=True)
    async with client(store) as c:  # an unscoped server says whose each memory is
        out = payload(await c.call_tool("recall", {"query": "note about tea", "k": 10}))
        whose = {m["text"]: (m["scope"], m["pinned"]) for m in out["memories"]}
        assert whose["Ada's private note about tea"] == ({"user": "ada"}, False)
        assert whose["Bob's note about tea"] == ({"user": "bob"}, True)
        listed = payload(await c.call_tool("list_memories", {}))["memories"]
        assert {m["id"]: m["scope"] for m in listed}[ada["id"]] == {}


async def test_a_conversation_remembered_and_recalled_with_its_context(store):
    async with client(store) as c:
        out = payload(await c.call_tool("remember_conversation", {"session": "chat-9", "turns": [
            {"speaker": "Assistant", "text": "Any plans for the weekend?", "at": "2026-11-28T18:00:00+00:00"},
            {"speaker": "Ada", "text": "I'm going climbing in the Peak District."},
            {"speaker": "Assistant", "text": "Have fun, and take care on the rocks."}]}))
        assert out["session"] == "chat-9" and len(out["ids"]) == 3
        first = payload(await c.call_tool("get_memory", {"ids": [out["ids"][0]]}))["memories"][0]
        assert first["created_at"].startswith("2026-11-28T18:00:00") and first["tags"]["turn"] == 0
        hits = payload(await c.call_tool("recall", {"query": "climbing in the Peak District", "k": 1,
                                                    "mode": "lexical", "context": 1}))["memories"]
        assert hits[0]["id"] == out["ids"][1]
        assert [t["id"] for t in hits[0]["context"]] == out["ids"] and [t["turn"]
                                                                        for t in hits[0]["context"]] == [0, 1, 2]
        plain = payload(await c.call_tool("recall", {"query": "climbing", "k": 1, "mode": "lexical"}))["memories"]
        assert "context" not in plain[0]
