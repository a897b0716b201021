"""Tests for the byte-level BPE tokenizer: round trips, a worked example, training, files, HF import."""

from __future__ import annotations

import json

import pytest
import regex
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evermind_memory.errors import InvalidInput, TokenizerError
from evermind_memory.lm.tokenizer import BPETokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.",
    "def encode(self, text):\n    return [self.vocab[t] for t in text.split()]\n",
    "Ada prefers green tea. Ada's brother prefers black coffee, and they're both right.",
    "日本語のテキストも大丈夫です。中文文本也可以。한국어 텍스트.",
    "Emoji: 😀😀 🎉 👍🏽 — naïve café résumé, 1234567 + 89 = 1234656\t\t\n\n",
] * 3

GPT2_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, 256 + 4 + 120)


def gpt2_byte_to_char() -> dict[int, str]:
    """GPT-2's bytes_to_unicode, written out again here so the test does not trust the module's copy."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = list(bs)
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    return {b: chr(c) for b, c in zip(bs, cs)}


def reference_encode(tokenizer: BPETokenizer, text: str) -> list[int]:
    """Naive BPE from the tokenizer's own tables: merge the lowest-rank pair everywhere, repeat."""
    d = tokenizer.to_dict()
    ranks = {(a, b): (r, out) for r, (a, b, out) in enumerate(d["merges"])}
    ids_out: list[int] = []
    for piece in GPT2_PATTERN.findall(text):
        ids = list(piece.encode("utf-8", "surrogatepass"))  # trained tokenizer: byte id = byte value
        while len(ids) > 1:
            pairs = [(ranks[p][0], p) for p in zip(ids, ids[1:]) if p in ranks]
            if not pairs:
                break
            rank, (a, b) = min(pairs)
            merged, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and ids[i] == a and ids[i + 1] == b:
                    merged.append(ranks[a, b][1])
                    i += 2
                else:
                    merged.append(ids[i])
                    i += 1
            ids = merged
        ids_out.extend(ids)
    return ids_out


def reference_train(texts: list[str], n_merges: int, min_frequency: int) -> list[list[int]]:
    """Naive BPE training: recount every pair after each merge; ties go to the smallest pair."""
    counts: dict[str, int] = {}
    for t in texts:
        for w in GPT2_PATTERN.findall(t):
            counts[w] = counts.get(w, 0) + 1
    words = [(list(w.encode("utf-8", "surrogatepass")), f) for w, f in counts.items()]
    merges = []
    for m in range(n_merges):
        pairs: dict[tuple[int, int], int] = {}
        for ids, f in words:
            for p in zip(ids, ids[1:]):
                pairs[p] = pairs.get(p, 0) + f
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < min_frequency:
            break
        new = 256 + m
        merges.append([best[0], best[1], new])
        for k, (ids, f) in enumerate(words):
            out, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            words[k] = (out, f)
    return merges


# ------------------------------------------------------------------ worked example


def test_worked_example_aaabdaaabac():
    # Pairs in "aaabdaaabac": aa x4 -> merge 256 = (a, a). Then "Z a b d Z a b a c" (Z = aa): (Z, a) and
    # (a, b) both occur twice; the tie goes to the smaller pair (97, 98) -> 257 = ab. Then "Z Y d Z Y a c"
    # (Y = ab): (Z, Y) twice -> 258 = aaab. The specials follow: 259..262.
    t = BPETokenizer.train(["aaabdaaabac"], 256 + 3 + 4)
    d = t.to_dict()
    assert d["merges"] == [[97, 97, 256], [97, 98, 257], [256, 257, 258]]
    assert d["tokens"][256:259] == ["aa", "ab", "aaab"]
    assert t.encode("aaabdaaabac") == [258, 100, 258, 97, 99]
    assert (t.bos_id, t.eos_id, t.pad_id, t.unk_id) == (259, 260, 261, 262)
    assert len(t) == t.vocab_size == 263
    assert t.encode("aaab", add_bos=True, add_eos=True) == [259, 258, 260]
    assert t.decode([259, 258, 100, 260]) == "aaabd"
    assert t.decode([259, 258, 260], skip_special=False) == "<bos>aaab<eos>"


def test_training_stops_when_no_pair_is_frequent_enough():
    t = BPETokenizer.train(["abcd"], 1000)  # every pair occurs once; min_frequency defaults to 2
    assert len(t) == 256 + 4
    t1 = BPETokenizer.train(["abcd"], 1000, min_frequency=1)
    assert len(t1) == 256 + 3 + 4
    assert t1.encode("abcd") == [258]


# ------------------------------------------------------------------ round trips


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=())))
def test_any_str_round_trips(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < len(tok) for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, add_bos=True, add_eos=True)) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00",
        "a\x00b\x00\x00",
        "😀👍🏽🇯🇵 family: 👨‍👩‍👧",
        "日本語のテキスト 中文 한국어",
        "\ud800",  # lone high surrogate
        "\udfff",  # lone low surrogate
        "x\ud83d\ude00y",  # a surrogate *pair* as two code points, which is not the same str as 😀
        "\udc80\udcff",  # what os.fsdecode makes of undecodable bytes
        "<bos><eos><pad><unk>",
        " \t\n\r\x0b\x0c\x1c\u2028\u3000 ",
        "\ufffd\uffff\U0010ffff",
    ],
)
def test_explicit_round_trips(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_special_strings_in_text_are_plain_bytes(tok):
    ids = tok.encode("<eos> <bos>")
    assert not set(ids) & set(tok.special_tokens.values())


def test_surrogate_pair_code_points_differ_from_the_emoji(tok):
    assert tok.encode("\ud83d\ude00") != tok.encode("😀")
    assert tok.decode(tok.encode("\ud83d\ude00")) == "\ud83d\ude00"


@given(st.binary(max_size=64))
def test_decode_of_arbitrary_bytes_never_raises(tok, data):
    # Trained tokenizer: id b is the single byte b, so any byte string is a valid id sequence.
    text = tok.decode(list(data))
    assert isinstance(text, str)
    if b"\xed" not in data:  # no surrogate encodings: the rule is exactly Python's "replace"
        assert text == data.decode("utf-8", "replace")


@given(st.lists(st.integers(0, 256 + 4 + 120 - 1), max_size=50))
def test_decode_of_arbitrary_ids_never_raises(tok, ids):
    assert isinstance(tok.decode(ids), str)
    assert isinstance(tok.decode(ids, skip_special=False), str)


def test_decode_rule_for_invalid_bytes(tok):
    assert tok.decode([0xED, 0xA0, 0x80]) == "\ud800"  # surrogate-pass sequence round-trips
    assert tok.decode([0xFF]) == "\ufffd"
    assert tok.decode([0x41, 0xE4, 0xB8]) == "A\ufffd"  # truncated 3-byte sequence: one replacement
    assert tok.decode([0xE4, 0xB8, 0xAD]) == "中"


def test_decode_accepts_numpy_ids(tok):
    np = pytest.importorskip("numpy")
    ids = tok.encode("the fox 😀")
    assert tok.decode(np.array(ids, dtype=np.int64)) == "the fox 😀"


def test_decode_refuses_ids_outside_the_vocabulary(tok):
    with pytest.raises(InvalidInput, match=r"expected ids in \[0, 380\), got 380"):
        tok.decode([1, 380])
    with pytest.raises(InvalidInput, match="got -1"):
        tok.decode([-1])
    with pytest.raises(InvalidInput, match="got 'a'"):
        tok.decode(["a"])


def test_encode_batch_matches_encode(tok):
    texts = [*CORPUS[:5], "", "\ud800 x", "zzz"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, add_eos=True) == [tok.encode(t, add_eos=True) for t in texts]
    with pytest.raises(InvalidInput, match="got a single str"):
        tok.encode_batch("abc")


def test_encode_refuses_non_str(tok):
    with pytest.raises(InvalidInput, match="expected a str, got bytes"):
        tok.encode(b"abc")


@pytest.fixture(scope="module")
def ab_tok() -> BPETokenizer:
    texts = ["ab" * 40, "aab" * 30, "bba" * 20, "a" * 70, "the then there" * 5]
    return BPETokenizer.train(texts, 256 + 4 + 40, min_frequency=1)


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet="ab", max_size=40)
    | st.text(alphabet="ab", min_size=513, max_size=1200)  # pre-tokens over 512 bytes take the heap path
    | st.text(alphabet="the ", max_size=200)
)
@example("a" * 513)
@example("b" + "ab" * 300)
def test_encode_matches_naive_bpe_including_long_words(ab_tok, text):
    assert ab_tok.encode(text) == reference_encode(ab_tok, text)


def test_long_word_without_spaces_round_trips(tok):
    # 100k characters in one pre-token: must not go quadratic (no timing assertion; it takes ~1 s).
    text = "ab" * 50_000
    assert tok.decode(tok.encode(text)) == text
    text = "日本語" * 20_000
    assert tok.decode(tok.encode(text)) == text


# ------------------------------------------------------------------ training


def test_training_is_deterministic(tok):
    again = BPETokenizer.train(CORPUS, 256 + 4 + 120)
    assert again.to_dict() == tok.to_dict()
    assert again.digest() == tok.digest()
    other = BPETokenizer.train(CORPUS[:2], 256 + 4 + 120)
    assert other.digest() != tok.digest()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(exclude_categories=()), max_size=30), max_size=5))
def test_training_on_any_text_gives_a_round_tripping_tokenizer(texts):
    t = BPETokenizer.train(texts, 256 + 4 + 20, min_frequency=1)
    for text in texts:
        assert t.decode(t.encode(text)) == text


def test_incremental_training_matches_naive_recount():
    merges = BPETokenizer.train(CORPUS, 256 + 4 + 150).to_dict()["merges"]
    assert merges == reference_train(CORPUS, 150, 2)


def test_trained_vocabulary_layout(tok):
    d = tok.to_dict()
    assert len(tok) == 256 + len(d["merges"]) + 4 == 380
    assert d["tokens"][:256] == [gpt2_byte_to_char()[b] for b in range(256)]
    assert tok.special_tokens == {"<bos>": 376, "<eos>": 377, "<pad>": 378, "<unk>": 379}
    assert len(tok.encode(" the fox")) < len(" the fox")


def test_custom_special_tokens():
    t = BPETokenizer.train(CORPUS, 300, special_tokens=("<s>", "</s>", "<p>", "<u>", "<sep>"))
    assert (t.bos_id, t.eos_id, t.pad_id, t.unk_id) == (295, 296, 297, 298)
    assert t.special_tokens["<sep>"] == 299


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab_size": 259}, r"expected vocab_size >= 256 byte tokens \+ 4 special tokens = 260, got vocab_size=259"),
        ({"vocab_size": 300, "special_tokens": ("<a>", "<b>")}, "at least 4 distinct non-empty special tokens"),
        ({"vocab_size": 300, "special_tokens": ("<a>", "<a>", "<b>", "<c>")}, "at least 4 distinct"),
        ({"vocab_size": 300, "min_frequency": 0}, "expected min_frequency >= 1"),
    ],
)
def test_train_refuses_bad_arguments(kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        BPETokenizer.train(CORPUS, **kwargs)


def test_train_refuses_a_single_str_or_non_str_texts():
    with pytest.raises(InvalidInput, match="got a single str; wrap it in a list"):
        BPETokenizer.train("some text", 300)
    with pytest.raises(InvalidInput, match="text 1 is bytes"):
        BPETokenizer.train(["ok", b"bytes"], 300)


# ------------------------------------------------------------------ serialisation


def test_to_dict_from_dict_round_trip(tok):
    d = tok.to_dict()
    assert d["format"] == "evermind-bpe 1"
    again = BPETokenizer.from_dict(json.loads(json.dumps(d)))
    assert again.to_dict() == d
    assert again.digest() == tok.digest()
    assert again.encode(CORPUS[3]) == tok.encode(CORPUS[3])


def test_save_load_round_trip(tok, tmp_path):
    path = tmp_path / "tok.json"
    tok.save(path)
    loaded = BPETokenizer.load(path)
    assert loaded.to_dict() == tok.to_dict()
    assert loaded.digest() == tok.digest()
    for text in CORPUS[:5]:
        assert loaded.encode(text) == tok.encode(text)
    assert [p.name for p in tmp_path.iterdir()] == ["tok.json"]  # no temp file left behind


def test_digest_changes_with_any_table(tok):
    d = tok.to_dict()
    assert len(tok.digest()) == 64
    renamed = dict(d, special_tokens={**d["special_tokens"]}, roles={**d["roles"], "unk": "<pad>"})
    assert BPETokenizer.from_dict(renamed).digest() != tok.digest()
    fewer = BPETokenizer.train(CORPUS, 256 + 4 + 119)
    assert fewer.digest() != tok.digest()


def _write(tmp_path, content: bytes | str):
    path = tmp_path / "bad.json"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def test_load_refuses_truncated_json(tok, tmp_path):
    good = json.dumps(tok.to_dict())
    with pytest.raises(TokenizerError, match="not valid UTF-8 JSON.*corrupt or truncated"):
        BPETokenizer.load(_write(tmp_path, good[: len(good) // 2]))


def test_load_refuses_non_utf8(tmp_path):
    with pytest.raises(TokenizerError, match="not valid UTF-8 JSON"):
        BPETokenizer.load(_write(tmp_path, b"\xff\xfe{}"))


def test_load_refuses_wrong_format(tok, tmp_path):
    d = dict(tok.to_dict(), format="evermind-bpe 2")
    with pytest.raises(TokenizerError, match="unknown tokenizer format 'evermind-bpe 2'; expected 'evermind-bpe 1'"):
        BPETokenizer.load(_write(tmp_path, json.dumps(d)))
    with pytest.raises(TokenizerError, match="unknown tokenizer format None"):
        BPETokenizer.load(_write(tmp_path, json.dumps({"vocab": {}, "merges": []})))
    with pytest.raises(TokenizerError, match="expected a tokenizer dict"):
        BPETokenizer.load(_write(tmp_path, "[1, 2, 3]"))


def test_load_refuses_oversized_file(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(64 * 1024 * 1024 + 1)  # sparse: costs no disk
    with pytest.raises(TokenizerError, match="is 67108865 bytes; expected at most 67108864 bytes"):
        BPETokenizer.load(path)


def test_load_refuses_missing_file(tmp_path):
    with pytest.raises(TokenizerError, match="cannot read tokenizer file"):
        BPETokenizer.load(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d["merges"][0].__setitem__(2, 300), "should give token 300"),
        (lambda d: d["merges"].append([1, 2]), r"expected \[left id, right id, result id\]"),
        (lambda d: d["merges"].append(d["merges"][0]), "repeats the pair"),
        (lambda d: d["merges"].append([0, 1, 99999]), r"expected \[left id, right id, result id\] in \[0, 380\)"),
        (lambda d: d["tokens"].__setitem__(65, "\u4e2d"), "not in GPT-2 byte-to-unicode form"),
        # characters below 256 that are not GPT-2's stand-ins for bytes (a raw space, a NUL)
        (lambda d: d["tokens"].__setitem__(65, "a b"), "not in GPT-2 byte-to-unicode form"),
        (lambda d: d["tokens"].__setitem__(65, "\x00"), "not in GPT-2 byte-to-unicode form"),
        (lambda d: d["merges"].append([True, 1, 2]), r"expected \[left id, right id, result id\]"),
        (lambda d: d["tokens"].__setitem__(65, ""), "expected a non-empty str"),
        (lambda d: d["tokens"].__setitem__(65, "B"), r"256 bytes; 1 are missing \(first: 0x41\)"),
        (lambda d: d["tokens"].__setitem__(376, "x"), "its entry must be null"),
        (lambda d: d["special_tokens"].__setitem__("<bos>", 377), "two special tokens share an id"),
        (lambda d: d["special_tokens"].__setitem__("<bos>", 1000), r"expected an int in \[0, 380\)"),
        (lambda d: d["roles"].__setitem__("bos", "<nope>"), "role bos names '<nope>', which is not a special token"),
        (lambda d: d["roles"].pop("pad"), "roles must map exactly"),
        (lambda d: d.pop("tokens"), "'tokens' must be a list"),
        (lambda d: d.__setitem__("merges", {}), "'merges' must be a list"),
        (lambda d: d.__setitem__("pre_tokenizer", "gpt4"), "unknown pre_tokenizer 'gpt4'"),
    ],
)
def test_load_refuses_inconsistent_tables(tok, tmp_path, damage, message):
    d = tok.to_dict()
    damage(d)
    with pytest.raises(TokenizerError, match=message):
        BPETokenizer.load(_write(tmp_path, json.dumps(d)))


# ------------------------------------------------------------------ Hugging Face import

HF_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("in", "g")]  # -> ids 256..260


def write_hf_json(tmp_path, *, merges_as_lists: bool = False, model_type: str = "BPE", extra_vocab=None):
    b2c = gpt2_byte_to_char()
    vocab = {b2c[b]: b for b in range(256)}
    for left, right in HF_MERGES:
        vocab[left + right] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)  # GPT-2 keeps its one special token in the vocab too: id 261
    vocab.update(extra_vocab or {})
    merges = [list(m) if merges_as_lists else " ".join(m) for m in HF_MERGES]
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": 261, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": True, "special": True},
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": model_type, "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("merges_as_lists", [False, True])
def test_hf_import_gives_hand_computed_ids(tmp_path, merges_as_lists):
    t = BPETokenizer.from_hf_tokenizer_json(write_hf_json(tmp_path, merges_as_lists=merges_as_lists))
    # "the": t h e -> (h, e) is the only merge -> [t, he]. " thing": Ġ t h i n g -> (Ġ, t) rank 0, then
    # (i, n) rank 3, then (in, g) rank 4 -> [Ġt, h, ing]. " the": (Ġ, t), (h, e), (Ġt, he) -> [Ġthe].
    assert t.encode("the thing the") == [116, 257, 256, 104, 260, 258]
    assert t.decode([116, 257, 256, 104, 260, 258]) == "the thing the"
    # bos and eos share GPT-2's <|endoftext|>; pad and unk are missing, so they get the next ids.
    assert (t.bos_id, t.eos_id, t.pad_id, t.unk_id) == (261, 261, 262, 263)
    assert len(t) == 264
    assert t.decode([261, 258, 261]) == " the"
    assert t.decode([261, 258], skip_special=False) == "<|endoftext|> the"
    text = "naïve 😀 \ud800 the end"
    assert t.decode(t.encode(text)) == text


def test_hf_import_roles_can_be_named(tmp_path):
    t = BPETokenizer.from_hf_tokenizer_json(write_hf_json(tmp_path), pad="<|endoftext|>")
    assert t.pad_id == 261
    with pytest.raises(InvalidInput, match=r"not a special token of .*it has \['<\|endoftext\|>'\]"):
        BPETokenizer.from_hf_tokenizer_json(write_hf_json(tmp_path), bos="<s>")


def test_hf_import_survives_save_and_load(tmp_path):
    t = BPETokenizer.from_hf_tokenizer_json(write_hf_json(tmp_path))
    t.save(tmp_path / "ours.json")
    loaded = BPETokenizer.load(tmp_path / "ours.json")
    assert loaded.digest() == t.digest()
    assert loaded.encode("the thing the") == [116, 257, 256, 104, 260, 258]


def test_hf_import_refuses_other_models(tmp_path):
    with pytest.raises(TokenizerError, match="holds a 'WordPiece' model; only BPE"):
        BPETokenizer.from_hf_tokenizer_json(write_hf_json(tmp_path, model_type="WordPiece"))
    with pytest.raises(TokenizerError, match="not in GPT-2 byte-to-unicode form"):
        BPETokenizer.from_hf_tokenizer_json(write_hf_json(tmp_path, extra_vocab={"▁the": 262}))
    with pytest.raises(TokenizerError, match="not in GPT-2 byte-to-unicode form"):  # a raw space: below 256, not one
        BPETokenizer.from_hf_tokenizer_json(write_hf_json(tmp_path, extra_vocab={"a b": 262}))
    with pytest.raises(TokenizerError, match="ids must run from 0 without gaps; id 262 is missing"):
        BPETokenizer.from_hf_tokenizer_json(write_hf_json(tmp_path, extra_vocab={"zz": 263}))
    with pytest.raises(TokenizerError, match="has no 'model' object"):
        BPETokenizer.from_hf_tokenizer_json(_write(tmp_path, "{}"))


HF_TEXTS = [
    "the thing the",
    "thing" * 40,
    "thing" * 200,  # over 512 bytes: the heap path
    "the" * 30 + " " + "ing" * 25,
    "Then: the things' thing, nothing!\n\n  the  end 123 4567",
    "naïve 😀 日本 the",
]


def test_hf_import_matches_the_tokenizers_library(hf_pair):
    ours, theirs = hf_pair
    for text in HF_TEXTS:
        assert ours.encode(text) == theirs.encode(text).ids, text
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text).ids)


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    path = write_hf_json(tmp_path_factory.mktemp("hf"))
    return BPETokenizer.from_hf_tokenizer_json(path), tokenizers.Tokenizer.from_file(str(path))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="thing \n", max_size=120) | st.text(alphabet="thing", min_size=513, max_size=1000))
def test_hf_import_matches_the_tokenizers_library_on_random_text(hf_pair, text):
    ours, theirs = hf_pair
    assert ours.encode(text) == theirs.encode(text).ids
