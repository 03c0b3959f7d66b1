"""Reading a language model's text (engine/models/text_data.py): a file in chunks or a str,
by characters or UTF-8 bytes, into the narrowest id dtype; and the errors that name the file."""
import numpy as np
import pytest

from engine.models import text_data
from engine.models.tokenizer import ByteTokenizer, Vocabulary

TEXT = "héllo wörld — ünïcode ✓\nsecond line: 12345 £€\n" * 7


def test_a_file_read_in_small_chunks_gives_the_ids_of_the_whole_text(tmp_path, monkeypatch):
    # Check that reading in 7-byte chunks (so multi-byte characters straddle chunk ends)
    # gives the ids Vocabulary(text).encode(text) gives for the whole text.
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    monkeypatch.setattr(text_data, "CHUNK", 7)
    got = text_data.file_ids(path)
    want = Vocabulary(TEXT).encode(TEXT)
    assert isinstance(got.tokenizer, Vocabulary) and got.tokenizer.chars == Vocabulary(TEXT).chars
    np.testing.assert_array_equal(got.ids, want)
    assert got.ids.dtype == np.uint8  # fewer than 256 distinct characters
    assert str(path) in got.source and f"{len(TEXT.encode()):,} bytes" in got.source


def test_byte_tokenizer_reads_the_files_bytes(tmp_path):
    # Check that tokenizer="byte" gives the file's bytes as ids, even for bytes that are
    # not UTF-8.
    raw = bytes(range(256)) * 3
    path = tmp_path / "b.bin"
    path.write_bytes(raw)
    got = text_data.file_ids(path, "byte")
    assert isinstance(got.tokenizer, ByteTokenizer)
    np.testing.assert_array_equal(got.ids, np.frombuffer(raw, np.uint8))


def test_a_str_encodes_as_the_vocabulary_does():
    # Check text_ids on a str: the ids equal the Vocabulary's own (one-character-at-a-time)
    # encoding, and bytes equal str.encode("utf-8").
    got = text_data.text_ids(TEXT)
    np.testing.assert_array_equal(got.ids, Vocabulary(TEXT).encode(TEXT))
    got = text_data.text_ids(TEXT, "byte")
    assert bytes(got.ids.tolist()) == TEXT.encode("utf-8")


def test_encode_names_characters_outside_the_vocabulary():
    # Check that the vectorised encode rejects a character the vocabulary lacks, by name,
    # including one that sorts past its last character.
    tok = Vocabulary("abc")
    with pytest.raises(ValueError, match="'z'"):
        text_data.encode(tok, "abz")
    with pytest.raises(ValueError, match="'B'"):
        text_data.encode(tok, "aBc")


def test_id_dtype_is_the_narrowest_that_holds_the_vocabulary():
    # Check uint8 up to 256 ids, uint16 up to 65536, then uint32.
    assert [text_data.id_dtype(n) for n in (1, 256, 257, 65536, 65537)] == \
        [np.uint8, np.uint8, np.uint16, np.uint16, np.uint32]


def test_ids_of_a_wide_vocabulary_round_trip():
    # Check a text of more than 256 distinct characters: uint16 ids that decode back.
    text = "".join(chr(0x4E00 + i) for i in range(300)) * 2
    got = text_data.text_ids(text)
    assert got.ids.dtype == np.uint16
    assert got.tokenizer.decode(got.ids.tolist()) == text


@pytest.mark.parametrize("make,msg", [
    (lambda p: p, "No such file"),
    (lambda p: (p.mkdir(), p)[1], "is a directory"),
    (lambda p: (p.write_bytes(b""), p)[1], "the file is empty"),
    (lambda p: (p.write_bytes(b"ok \xff\xfe text"), p)[1], r"not UTF-8 text \(byte 3"),
])
def test_unreadable_texts_are_refused_naming_the_file(tmp_path, make, msg):
    # Check a missing file, a directory, an empty file and bytes that are not UTF-8 (with
    # the char tokenizer) each raise an error naming the file and what is wrong.
    path = make(tmp_path / "x.txt")
    with pytest.raises((ValueError, OSError), match=msg) as e:
        text_data.file_ids(path)
    assert str(path) in str(e.value)


def test_not_utf8_suggests_the_byte_tokenizer(tmp_path):
    # Check the message for a binary file says what reads it.
    path = tmp_path / "x.bin"
    path.write_bytes(b"\x80\x81")
    with pytest.raises(ValueError, match="--tokenizer byte"):
        text_data.file_ids(path)


def test_unknown_tokenizer_is_refused():
    with pytest.raises(ValueError, match="tokenizer"):
        text_data.text_ids("abc", "word")
