"""A plain Hugging Face ``Trainer`` as the workload: sentence classification on synthetic text.

The function a space names (``workload: ../examples/hf_trainer.py:make_trainer``) returns
the ``transformers.Trainer`` you would train with; autotune builds it in each trial
process and takes the model, the dataset, the collator, the loss (``compute_loss``) and the
optimizer from it, and the baseline from its ``TrainingArguments`` (here a batch of 16,
two accumulation steps). Everything is built here, nothing downloaded: a word-level
tokenizer over a 32-word vocabulary, a random-init 2-layer BERT, and 512 sentences of 4
to 64 words whose label says whether "good" occurs more often than "bad" (a rule the
model starts learning within a few steps). The tokenized ``datasets.Dataset`` keeps its
variable lengths: ``DataCollatorWithPadding`` pads each batch, so tokens/s counts the real
tokens of the attention mask and ``length_grouping`` (``group_by_length``) can pay.

    autotune run search_spaces/hf_trainer.yaml
    autotune export autotune-runs/hf_trainer/best_config.yaml --format hf
"""

from __future__ import annotations

import random
import tempfile

WORDS = ["good", "bad"] + [f"w{i}" for i in range(30)]


def sentences(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """``n`` sentences of 4-64 words (most short: a long tail) and their labels."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        words = rng.choices(WORDS, k=min(64, 4 + int(rng.expovariate(1 / 14))))
        texts.append(" ".join(words))
        labels.append(int(words.count("good") > words.count("bad")))
    return texts, labels


def tokenizer():
    """A word-level tokenizer over :data:`WORDS` ([PAD] is id 0), built in memory."""
    import tokenizers
    import transformers

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A", special_tokens=[("[CLS]", 2)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]"
    )


def dataset(tok, n: int = 512):
    """The sentences as a tokenized ``datasets.Dataset`` in torch format (text kept: the
    Trainer drops the columns the model does not take)."""
    import datasets

    texts, labels = sentences(n)
    ds = datasets.Dataset.from_dict({"text": texts, "label": labels})
    ds = ds.map(lambda batch: tok(batch["text"]), batched=True)
    ds.set_format(
        "torch", columns=["input_ids", "attention_mask", "label"], output_all_columns=True
    )
    return ds


def make_trainer(n: int = 512, hidden: int = 64, layers: int = 2, output_dir: str | None = None):
    """The Trainer as a user would write it."""
    import transformers

    tok = tokenizer()
    config = transformers.BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        num_labels=2,
        pad_token_id=tok.pad_token_id,
    )
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=output_dir or tempfile.mkdtemp(prefix="hf-trainer-"),
        per_device_train_batch_size=16,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        weight_decay=0.01,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    return transformers.Trainer(
        model=model,
        args=args,
        train_dataset=dataset(tok, n),
        data_collator=transformers.DataCollatorWithPadding(tok),
        processing_class=tok,
    )
