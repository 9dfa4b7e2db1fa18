"""A causal-LM ``transformers.Trainer`` on real English text of varied length.

The function a space names (``workload: ../examples/hf_causal_lm.py:make_trainer``) returns
the Trainer a user would train with: a random-init Llama of about 1.1M parameters, a
byte-level BPE tokenizer trained in memory, ``DataCollatorForLanguageModeling(mlm=False)``
(it pads each batch and masks the padding out of the labels), batch 8 x 4 accumulation
steps, a cosine schedule. The text is real English that ships with Python: the paragraphs
of the standard library's docstrings, 8 to 256 tokens each (most short: a long tail), so
padding is a large share of a random batch and ``group_by_length`` can pay. Nothing is
downloaded.

    autotune run search_spaces/hf_causal_lm.yaml
    autotune export autotune-runs/hf_causal_lm/best_config.yaml --format hf
"""

from __future__ import annotations

import importlib
import random
import sys
import tempfile

VOCAB = 1024


def paragraphs(n: int, seed: int = 0) -> list[str]:
    """``n`` paragraphs of English from the standard library's docstrings: each module's
    own and those of what it defines (not what it imported: what a module holds of other
    modules' objects depends on what the process imported before, so a process that
    imports torch first read other text, 2026-12-06)."""
    found: list[str] = []
    skip = {"antigravity", "this", "idlelib", "turtledemo", "tkinter", "turtle"}
    skip |= {"inspect", "typing"}  # what they define grows as other libraries use them
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in skip:
            continue
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001  (a module that cannot import here has no text)
            continue
        own = [v for v in vars(module).values() if getattr(v, "__module__", None) == name]
        for obj in [module, *own]:
            doc = getattr(obj, "__doc__", None) if callable(obj) or obj is module else None
            for para in (doc if isinstance(doc, str) else "").split("\n\n"):
                words = para.split()
                if len(words) >= 6 and sum(w.isalpha() for w in words) > len(words) / 2:
                    found.append(" ".join(words))
        if len(set(found)) >= 4 * n:
            break
    unique = sorted(set(found))
    random.Random(seed).shuffle(unique)
    return unique[:n]


def tokenizer(texts: list[str]):
    """A byte-level BPE of :data:`VOCAB` ids trained on ``texts`` ([PAD] 0, [EOS] 1)."""
    import tokenizers
    import transformers

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=VOCAB, special_tokens=["[PAD]", "[EOS]"])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, pad_token="[PAD]", eos_token="[EOS]"
    )


def dataset(tok, texts: list[str], longest: int = 256):
    """The texts tokenized (truncated at ``longest``), 8 tokens or more."""
    import datasets

    ds = datasets.Dataset.from_dict({"text": texts})
    ds = ds.map(lambda b: tok(b["text"], truncation=True, max_length=longest), batched=True)
    ds = ds.filter(lambda s: len(s["input_ids"]) >= 8)
    return ds.remove_columns(["text"])


def make_trainer(n: int = 1024, hidden: int = 128, layers: int = 4, output_dir: str | None = None):
    """The Trainer as a user would write it."""
    import transformers

    texts = paragraphs(n)
    tok = tokenizer(texts)
    config = transformers.LlamaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    args = transformers.TrainingArguments(
        output_dir=output_dir or tempfile.mkdtemp(prefix="hf-causal-lm-"),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=4,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    return transformers.Trainer(
        model=transformers.LlamaForCausalLM(config),
        args=args,
        train_dataset=dataset(tok, texts),
        data_collator=transformers.DataCollatorForLanguageModeling(tok, mlm=False),
        processing_class=tok,
    )
