#!/usr/bin/env python3
"""Model directories for serving a real engine on the lent H200 without weights.

Run with the release venv's python (it has `tokenizers`):
    python make_models.py RECIPE_MODELS_DIR TARGET_DIR DRAFTER_DIR

The engine loads random weights (`--load-format dummy`), but a serving engine
started as the unit starts it (no `--skip-tokenizer-init`) and SGLang's serving
benchmark both need a tokenizer. This writes the recipe's tiny configs (the same
files `k26ops rehearse` uses) plus a byte-level BPE tokenizer trained here on a
few hundred KB of the interpreter's own standard library, with <pad>/<s>/</s> at
ids 0/1/2 (the configs' pad/bos/eos) and the drafter's mask token appended; the
drafter config's mask_token_id is set to the id the tokenizer gave it.
Device only: nothing here is a k26ops code path.
"""

import json
import shutil
import sys
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def corpus(limit=600_000):
    """Text from the standard library's own sources (always on the machine)."""
    total = 0
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = p.read_text(errors="replace")
        total += len(text)
        yield text
        if total > limit:
            return


def tokenizer(vocab, mask_token):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - 1,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens([mask_token])
    return tok


def main(recipe_models, target, drafter):
    recipe_models, target, drafter = Path(recipe_models), Path(target), Path(drafter)
    tcfg = json.loads((recipe_models / "tiny-qwen3/config.json").read_text())
    dcfg = json.loads((recipe_models / "tiny-qwen3-dflash/config.json").read_text())
    mask = dcfg["dflash_config"]["mask_token"]
    tok = tokenizer(tcfg["vocab_size"], mask)
    assert [tok.token_to_id(t) for t in ("<pad>", "<s>", "</s>")] == [0, 1, 2]
    mask_id = tok.token_to_id(mask)
    assert mask_id < tcfg["vocab_size"], (mask_id, tcfg["vocab_size"])
    dcfg["dflash_config"]["mask_token_id"] = mask_id
    for d, cfg in ((target, tcfg), (drafter, dcfg)):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": "<s>",
                    "eos_token": "</s>",
                    "pad_token": "<pad>",
                    "model_max_length": tcfg["max_position_embeddings"],
                },
                indent=2,
            )
            + "\n"
        )
        (d / "special_tokens_map.json").write_text(
            json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}) + "\n"
        )
    print(
        json.dumps(
            {"vocab": tok.get_vocab_size(), "mask_token_id": mask_id, "target": str(target), "drafter": str(drafter)}
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
