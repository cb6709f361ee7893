"""Goldens for GGUF Unigram tokenizers (`tokenizer.ggml.model = "t5"`, llama.cpp's UGM: T5,
mT5, Flan-T5).

No real T5 vocabulary is reachable offline, so a small SentencePiece Unigram model is trained
here with `sentencepiece` (T5's settings: `nmt_nfkc` normalization and its precompiled
charsmap, a dummy prefix, extra whitespace removed; `<pad>` 0, `</s>` 1, `<unk>` 2, no BOS) on
the seeded corpus below, and written as a vocabulary-only GGUF the way llama.cpp's
`convert_hf_to_gguf.py` T5Model.set_vocab writes one (pieces, scores, token types from
SentencePieceProcessor, `add_space_prefix`, `remove_extra_whitespaces`,
`precompiled_charsmap`, the special ids; T5's `add_eos_token` true) to
mlx-tokenizers/tests/fixtures/gguf/t5-ugm.gguf.

The expected ids are transformers' tokenizer for this model (`SpmConverter.
build_tokenizer_from_spm_proto` on the trained proto, with T5TokenizerFast's special tokens
`</s>`, `<unk>`, `<pad>`) over the texts below, checked here to equal SentencePiece's own
`encode` (what llama.cpp's UGM tokenizer reproduces) on every text that spells no special
token; SentencePiece reads those as plain text, transformers (and mlx-lm) as the tokens. The
decoded text is transformers' `decode(ids, skip_special_tokens=True)`, equal to SentencePiece's
`decode` where no `<unk>` is involved (SentencePiece writes ` ⁇ ` for it). Written to
mlx-tokenizers/tests/goldens/gguf_ugm.json. Run with `cargo xtask goldens gguf_ugm`.
"""

import io
import json
import os
import random

import gguf
import sentencepiece as spm

FIXTURE = "mlx-tokenizers/tests/fixtures/gguf/t5-ugm.gguf"
OUT = "mlx-tokenizers/tests/goldens/gguf_ugm.json"

WORDS = (
    "the quick brown fox jumps over lazy dog translate English to German summarize this "
    "article question answer context model tokenizer unigram sentence piece vocabulary "
    "running runner runs ran walking walked walks talking talked national nation nations "
    "international internationalization über schön café naïve résumé Ångström "
    "Straße größer 東京 日本語 中文 한국어 3.14159 2026 1,000 — – “quoted” ‘single’ "
    "hello world HELLO World ﬁne ＦＵＬＬ width ① ② ㍻ ｶﾀｶﾅ"
).split()

TEXTS = [
    "",
    " ",
    "   ",
    "Hello world",
    " Hello world",
    "Hello  world   again  ",
    "translate English to German: The house is wonderful.",
    "summarize: the quick brown fox jumps over the lazy dog",
    "über schön café naïve résumé Ångström Straße",
    "東京 日本語のテキスト 中文字符 한국어",
    "ﬁne ＦＵＬＬ width ① ② ㍻ ｶﾀｶﾅ",
    "tabs\tand\nnewlines\r\nhere",
    "digits 1234567890 3.14159 1,000,000",
    "unknown chars 🦙🔥 ☃ ⚡ ∑∫",
    "internationalization internationally",
    "“quoted” ‘single’ — dash – dash",
    "</s> <pad> <unk> as text",
    "a" * 50,
    "x\u00a0y\u2009z\u3000w",
    "control\x00chars\x07here",
]


def corpus():
    rng = random.Random(20261204)
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 12)
        lines.append(" ".join(rng.choice(WORDS) for _ in range(n)))
    return lines


def main():
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_writer=model,
        model_type="unigram",
        vocab_size=200,
        hard_vocab_limit=False,
        character_coverage=1.0,
        normalization_rule_name="nmt_nfkc",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        num_threads=1,
        seed_sentencepiece_size=100000,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    proto_bytes = model.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=proto_bytes)

    os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(proto_bytes)
    assert proto.trainer_spec.model_type == 1
    ns = proto.normalizer_spec

    # T5Model.set_vocab's pieces, scores and types.
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.IdToPiece(i))
        scores.append(sp.GetScore(i))
        if sp.IsUnknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.IsControl(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.IsUnused(i):
            types.append(gguf.TokenType.UNUSED)
        elif sp.IsByte(i):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)

    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    w = gguf.GGUFWriter(FIXTURE, "t5")
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(ns.add_dummy_prefix)
    w.add_remove_extra_whitespaces(ns.remove_extra_whitespaces)
    w.add_precompiled_charsmap(ns.precompiled_charsmap)
    # SpecialVocab from T5's files: pad, eos, unk; T5's tokenizer adds `</s>`.
    w.add_pad_token_id(sp.pad_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(False)
    w.add_add_eos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()

    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import SpmConverter

    hf = SpmConverter.build_tokenizer_from_spm_proto(proto, [(p.piece, p.score) for p in proto.pieces])
    specials = [sp.IdToPiece(i) for i in (sp.eos_id(), sp.unk_id(), sp.pad_id())]
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    cases = []
    for text in TEXTS:
        ids = hf.encode(text, add_special_tokens=False).ids
        if not any(t in text for t in specials):
            assert ids == sp.encode(text), (text, ids, sp.encode(text))
            if sp.unk_id() not in ids:
                assert hf.decode(ids, skip_special_tokens=True) == sp.decode(ids), text
        cases.append({
            "text": text,
            "ids_plain": ids,
            "ids": ids + [sp.eos_id()],
            "decoded": hf.decode(ids, skip_special_tokens=True),
        })
    golden = {
        "source": "sentencepiece %s Unigram model trained by this script; transformers' "
        "SpmConverter.build_tokenizer_from_spm_proto, equal to SentencePieceProcessor.encode" % spm.__version__,
        "vocab_size": sp.vocab_size(),
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {FIXTURE} ({os.path.getsize(FIXTURE)} bytes) and {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
