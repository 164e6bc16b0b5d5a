"""A small Qwen3 target + DFlash drafter pair, trained here and shipped in ``assets/``.

``load_pair(path=None, device="cpu")`` -> (target, drafter, tokenizer) in plain PyTorch (see
:mod:`.modeling`). For SGLang: ``--model-path TARGET_DIR --speculative-algorithm DFLASH
--speculative-draft-model-path DRAFTER_DIR``. The recipe: :mod:`.corpus` (CPU) then :mod:`.train`
(GPU); ``assets/MODEL_CARD.md`` has the numbers.
"""

from pathlib import Path

ASSETS_DIR = Path(__file__).parent / "assets"
TARGET_DIR = ASSETS_DIR / "target"
DRAFTER_DIR = ASSETS_DIR / "drafter"
HELDOUT_PROMPTS = ASSETS_DIR / "heldout_prompts.json"


def load_pair(path=None, device="cpu", dtype=None):
    """(target, drafter, tokenizer); imports torch lazily. dtype defaults to float32."""
    import torch

    from .modeling import load_pair as _load_pair

    return _load_pair(path, device, dtype or torch.float32)


def heldout_prompts(path=None) -> list[str]:
    """The held-out prompt texts (for accept-length measurements), in their fixed order."""
    import json

    p = Path(path) / "heldout_prompts.json" if path is not None else HELDOUT_PROMPTS
    return [x["prompt"] for x in json.loads(p.read_text())]


__all__ = [
    "ASSETS_DIR",
    "TARGET_DIR",
    "DRAFTER_DIR",
    "HELDOUT_PROMPTS",
    "load_pair",
    "heldout_prompts",
]
