"""Tokenizers of the toy pairs, built with the ``tokenizers`` library from the generated text's vocabulary.

* :func:`text_tokenizer`: word level (lower-cased; words and punctuation split by ``Whitespace``), wrapped in
  ``PreTrainedTokenizerFast`` with ``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2. No token is added around a
  prompt, so ``tokenizer(article + " Summary:")`` is exactly the prefix of a training sequence.
* :func:`whisper_tokenizer`: a byte-level BPE ``WhisperTokenizer`` (the class the hub Whisper checkpoints
  load as) whose merges make every vocabulary word, with its leading space, one token; Whisper's special
  tokens follow the BPE ids in Whisper's order (:data:`WHISPER_SPECIAL_TOKENS`), so ``<|en|>`` directly
  follows ``<|startoftranscript|>`` as ``WhisperTokenizer.prefix_tokens`` assumes.
"""

from __future__ import annotations

from collections.abc import Sequence

TEXT_SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")

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
