"""Tokenizers of the toy pairs, built with the ``tokenizers`` library from the generated text's vocabulary.

* :func:`text_tokenizer`: word level (lower-cased; words and punctuation split by ``Whitespace``), wrapped in
  ``PreTrainedTokenizerFast`` with ``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2. No token is added around a
  prompt, so ``tokenizer(article + " Summary:")`` is exactly the prefix of a training sequence.
* :func:`whisper_tokenizer`: a byte-level BPE ``WhisperTokenizer`` (the class the hub Whisper checkpoints
  load as) whose merges make every vocabulary word, with its leading space, one token; Whisper's special
  tokens follow the BPE ids in Whisper's order (:data:`WHISPER_SPECIAL_TOKENS`), so ``<|en|>`` directly
  follows ``<|startoftranscript|>`` as ``WhisperTokenizer.prefix_tokens`` assumes.
* :func:`bpe_tokenizer`: a byte-level BPE trained on the toy text itself, for the text draft that does not share
  the target's tokenizer (``draft-bpe``, :mod:`pipeline.toy.train_text`); with :data:`BPE_VOCAB_SIZE` the
  frequent template words are single tokens and most names and numbers are split into pieces.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

TEXT_SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
BPE_SPECIAL_TOKENS = ("<pad>", "<eos>")   # byte-level: every string has tokens, so no <unk>
# 2 special tokens + the 256 byte symbols + 442 merges. Trained on the toy train split (6000 examples), this keeps
# the template words, the cue (" Summary", ":"), the punctuation (" .", " ,"), the cities, jobs, objects, verbs and
# days as single tokens and splits nearly all first names and numbers and about half the last names: 145 of the
# 266 words of the word-level tokenizer are one token with their leading space, and a highlights line takes 1.29
# BPE tokens per word (test split; :func:`bpe_stats`). 650 gave 46 % and 1.43, 750 62 % and 1.17, 900 96 % and 1.00.
BPE_VOCAB_SIZE = 700

WHISPER_SPECIAL_TOKENS = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>",
                          "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>")


def text_tokenizer(words: Sequence[str]):
    """A word-level ``PreTrainedTokenizerFast`` over ``words`` (ids in order after the 3 special tokens)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(TEXT_SPECIAL_TOKENS)}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with single spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left", model_max_length=1024)


def whisper_tokenizer(words: Sequence[str]):
    """A ``WhisperTokenizer`` whose BPE holds every ``" " + word`` of ``words`` as a single token.

    Transcripts are tokenized with a leading space (as Whisper's are), e.g. ``" red fox"``. The result has
    ``len(tokenizer) == bpe_size + len(WHISPER_SPECIAL_TOKENS)`` and no timestamp tokens.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import WhisperTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # Enough merges for every word to become one token: at most len(word) merges each.
    budget = len(alphabet) + sum(len(w) + 1 for w in words)
    trainer = trainers.BpeTrainer(vocab_size=budget, min_frequency=1, initial_alphabet=alphabet,
                                  show_progress=False, special_tokens=[])
    bpe.train_from_iterator([" " + w for w in words for _ in range(2)], trainer=trainer)
    state = bpe.model
    vocab = bpe.get_vocab()
    import json

    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
              for m in json.loads(bpe.to_str())["model"]["merges"]]
    del state
    tok = WhisperTokenizer(vocab=dict(sorted(vocab.items(), key=lambda kv: kv[1])), merges=merges,
                           add_prefix_space=False)
    tok.add_special_tokens({"additional_special_tokens": list(WHISPER_SPECIAL_TOKENS[1:])})
    tok.pad_token = "<|endoftext|>"
    tok.set_prefix_tokens(predict_timestamps=False)
    return tok


def bpe_tokenizer(texts: Iterable[str], vocab_size: int = BPE_VOCAB_SIZE):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts``, at most ``vocab_size`` tokens in all.

    ``<pad>`` = 0 and ``<eos>`` = 1, then the 256 byte symbols (``ByteLevel.alphabet()``, so any string encodes),
    then the merges in the order learnt. The ``ByteLevel`` pre-tokenizer (no prefix space added, GPT-2's split)
    keeps a word's leading space on it (``" fox"`` is one pre-token), and its decoder restores the bytes, so
    ``decode(encode(s)) == s`` for any ``s``; nothing is added around a prompt, so
    ``tokenizer(article + " Summary:")`` is the prefix of a training sequence. Padding is on the left, as
    :func:`text_tokenizer`'s. Deterministic: the same texts (in any order) give the same vocabulary and merges
    (the trainer picks the most frequent pair, ties by the lower pair of ids, and the byte symbols' ids are fixed).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(BPE_SPECIAL_TOKENS) + len(alphabet):
        raise ValueError(f"bpe_tokenizer: vocab_size must hold the {len(BPE_SPECIAL_TOKENS)} special tokens and the "
                         f"{len(alphabet)} byte symbols; got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, initial_alphabet=alphabet,
                                  special_tokens=list(BPE_SPECIAL_TOKENS), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left",
                                   model_max_length=1024, clean_up_tokenization_spaces=False)


def bpe_stats(tokenizer, words: Sequence[str], texts: Sequence[str]) -> dict:
    """How finely ``tokenizer`` splits the word-level tokenizer's ``words``: ``single_token_words`` (how many of
    them, with their leading space, are one token), ``single_token_share`` (that over ``len(words)``) and
    ``tokens_per_word`` (tokens of ``texts``, each tokenized with a leading space, per whitespace-separated word:
    for the toy text, per word-level token)."""
    single = sum(len(tokenizer(" " + w, add_special_tokens=False).input_ids) == 1 for w in words)
    n_tokens = sum(len(tokenizer(" " + t, add_special_tokens=False).input_ids) for t in texts)
    n_words = sum(len(t.split()) for t in texts)
    return {"vocab_size": len(tokenizer), "words": len(words), "single_token_words": single,
            "single_token_share": single / len(words), "tokens_per_word": n_tokens / max(1, n_words)}
