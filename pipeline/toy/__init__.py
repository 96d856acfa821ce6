"""Toy tasks and trained toy draft/target pairs, made locally with no network.

The default pipeline must produce numbers that mean something on a machine that can reach neither the
Hugging Face Hub nor any dataset host. This package generates data with the shape of the paper's two tasks
and trains small pairs on it:

* :mod:`pipeline.toy.text_data`: "news articles" with facts and distractors and a "highlights" line that
  copies the key facts; JSONL ``{id, article, highlights}`` as CNN/DailyMail (scored with the same ROUGE).
* :mod:`pipeline.toy.speech_synth` and :mod:`pipeline.toy.speech_data`: random word sequences rendered
  as 16 kHz mono audio (each word its own sequence of formant tones and noise bursts, with speaker, speed and
  noise variation), written as WAV files and a JSONL manifest ``{id, file, text}`` as LibriSpeech (scored
  with the same WER).
* :mod:`pipeline.toy.vocab`: the tokenizers (a word-level one for text, a byte-level BPE
  ``WhisperTokenizer`` with Whisper's special tokens for speech).
* :mod:`pipeline.toy.train_text`: a GPT-2 target and a much cheaper GPT-2 draft.
* :mod:`pipeline.toy.train_speech`: a small Whisper target (with an auxiliary CTC loss on its encoder) and
  a distil-Whisper-style draft (the target's encoder, one decoder layer).
* :mod:`pipeline.toy.cost`: per-token cost of a draft against its target (FLOPs and measured time).

Everything is seeded: the same seed gives byte-identical data files.
"""
