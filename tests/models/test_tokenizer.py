"""The language models' tokenizers and their checkpoint entries (engine/models/tokenizer.py)."""
import numpy as np
import pytest

from engine.models.tokenizer import (ByteTokenizer, Vocabulary, tokenizer_from_meta,
                                     tokenizer_meta)


def test_byte_tokenizer_encodes_utf8_bytes():
    # Check that ids are the UTF-8 bytes, so a non-ASCII character takes several ids.
    tok = ByteTokenizer()
    ids = tok.encode("aé€")
    assert ids.dtype == np.int64
    assert ids.tolist() == [0x61, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]
    assert tok.decode(ids) == "aé€"
    assert len(tok) == 256


def test_byte_tokenizer_decodes_a_cut_character_as_replacement():
    # Check that a sample ending inside a multi-byte character decodes, with U+FFFD.
    assert ByteTokenizer().decode([0x61, 0xE2, 0x82]) == "a\ufffd"


@pytest.mark.parametrize("ids,err", [([256], ValueError), ([-1], ValueError), ([1.0], TypeError),
                                     ("ab", TypeError), ([True], TypeError)])
def test_byte_tokenizer_rejects_bad_ids(ids, err):
    # Check that an id outside [0, 256) or not an integer is named, never wrapped.
    with pytest.raises(err, match=r"ids"):
        ByteTokenizer().decode(ids)


def test_vocabulary_round_trip_and_unknown_character():
    # Check that the char vocabulary is the sorted distinct characters and names unknown ones.
    v = Vocabulary("hello")
    assert v.chars == "ehlo"
    assert v.decode(v.encode("hole")) == "hole"
    with pytest.raises(ValueError, match="'z'"):
        v.encode("hz")


@pytest.mark.parametrize("tok", [Vocabulary("abc\n"), ByteTokenizer()])
def test_meta_round_trip(tok):
    # Check that a stored entry rebuilds a tokenizer that encodes and decodes the same.
    again = tokenizer_from_meta(tokenizer_meta(tok))
    assert type(again) is type(tok)
    assert len(again) == len(tok)
    assert again.encode("cab\n").tolist() == tok.encode("cab\n").tolist()


@pytest.mark.parametrize("meta,err", [
    ([], TypeError), ({"kind": "bpe"}, ValueError), ({"kind": "char"}, ValueError),
    ({"kind": "char", "chars": ""}, ValueError), ({"kind": "char", "chars": "ba"}, ValueError),
    ({"kind": "char", "chars": "aa"}, ValueError), ({"kind": "char", "chars": 3}, ValueError)])
def test_meta_rejects_damaged_entries(meta, err):
    # Check that a hostile or damaged stored entry is refused with the entry named.
    with pytest.raises(err, match="tokenizer"):
        tokenizer_from_meta(meta)


def test_meta_rejects_unknown_object():
    with pytest.raises(TypeError, match="tokenizer"):
        tokenizer_meta("abc")
