"""A word-level tokenizer for the demo model, built locally (no hub access).

``vllm serve`` needs a tokenizer to accept text. A WordLevel model (lower-cased,
whitespace-split) is trained on text that ships with Python (the standard library's
sources), sized to the model's vocabulary, and saved next to the weights with the files
``AutoTokenizer.from_pretrained`` reads. Every vocabulary word encodes to exactly one token,
so prompts of an exact token length are words joined by spaces.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)
_CORPUS_FILES = 200


def has_tokenizer(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in TOKENIZER_FILES)


def _corpus() -> Iterator[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py"))[:_CORPUS_FILES]:
        yield path.read_text(encoding="utf-8", errors="replace")


def write_tokenizer(model_dir: Path, vocab_size: int) -> None:
    """Train and save the tokenizer files into ``model_dir`` (deterministic output)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
    )
    tokenizer.save(str(model_dir / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1024, **special}
    _write_json(model_dir / "tokenizer_config.json", config)
    _write_json(model_dir / "special_tokens_map.json", special)
    _write_json(model_dir / "generation_config.json", {"bos_token_id": 1, "eos_token_id": 2})


def vocabulary(model_dir: Path) -> list[str]:
    """The plain words of the vocabulary (no special tokens), in id order."""
    data = json.loads((model_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    words = sorted(vocab, key=vocab.__getitem__)
    return [w for w in words if w not in SPECIAL_TOKENS and w.isalnum() and w.islower()]


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
