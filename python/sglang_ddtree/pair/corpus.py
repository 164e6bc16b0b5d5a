"""Data step of the pair recipe (runs on the CPU): corpus, split, tokenizer, token arrays.

Corpus: every ``*.py`` file of the running interpreter's standard library (PSF license), found
under ``sysconfig.get_paths()['stdlib']`` minus ``site-packages``/``dist-packages`` and the
machine-specific ``_sysconfigdata*`` module; files that are not valid UTF-8 are skipped.

Split, by file: ``h = sha256(relative path)``, first 8 bytes as an integer; ``h % 100 < 5`` is
held out (about 5% of files; reported numbers), ``5 <= h % 100 < 7`` is validation (checkpoint
selection and monitoring during training), everything else trains. Documents are ``"# {relpath}\\n" + text``;
about one in ten (another hash slice) is wrapped in the chat template instead (user: the header and
first 12 lines, assistant: the rest), so ``/v1/chat/completions`` answers with code. Documents are
joined with ``<|endoftext|>``.

Writes into ``--out`` (default ``.pair-data``, git-ignored):

* ``tokenizer/``: the trained byte-level BPE as Hugging Face files (see :mod:`.tokenizer`);
* ``train.npy``, ``val.npy``, ``heldout.npy``: uint16 token streams;
* ``heldout_sample.npy``: uint16 ``[16, 512]``, a fixed held-out subset (the tests recompute the
  target's loss on it);
* ``heldout_prompts.json``: 64 held-out code snippets (text) used as prompts for accept lengths;
* ``meta.json``: interpreter, file and token counts.

Usage: ``PYTHONPATH=python python3 -m sglang_ddtree.pair.corpus --out .pair-data``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from .tokenizer import EOS_TOKEN, PairTokenizer, apply_chat_template, save_hf_tokenizer
from .tokenizer import train_tokenizer as _train_bpe

HELDOUT_PERCENT = 5
VAL_PERCENT = 2
CHAT_EVERY = 10
CHAT_USER_LINES = 12
VOCAB_SIZE = 4096
SAMPLE_SHAPE = (16, 512)
NUM_PROMPTS = 64
SEED = 1234


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _hash(relpath: str) -> int:
    return int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")


def split_of(relpath: str) -> str:
    """'heldout', 'val' or 'train', decided by the file's relative path alone."""
    h = _hash(relpath) % 100
    if h < HELDOUT_PERCENT:
        return "heldout"
    return "val" if h < HELDOUT_PERCENT + VAL_PERCENT else "train"


def is_chat_doc(relpath: str) -> bool:
    return (_hash(relpath) >> 32) % CHAT_EVERY == 0


def list_files(root: Path | None = None) -> list[tuple[str, str]]:
    """Sorted (relative posix path, text) of the stdlib's Python files."""
    root = root or stdlib_root()
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        parts = rel.split("/")
        if "site-packages" in parts or "dist-packages" in parts or "__pycache__" in parts:
            continue
        if parts[-1].startswith("_sysconfigdata"):
            continue
        try:
            text = p.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        if text.strip() and "\x00" not in text:
            out.append((rel, text))
    return out


def make_document(relpath: str, text: str) -> str:
    """The training text of one file (without the trailing <|endoftext|>)."""
    header = f"# {relpath}\n"
    lines = text.splitlines(keepends=True)
    if is_chat_doc(relpath) and len(lines) >= 2 * CHAT_USER_LINES:
        user = header + "".join(lines[:CHAT_USER_LINES])
        reply = "".join(lines[CHAT_USER_LINES:])
        prompt = apply_chat_template([{"role": "user", "content": user.rstrip("\n")}])
        return prompt + reply + "<|im_end|>\n"
    return header + text


def _encode_stream(tok: PairTokenizer, docs: list[str]) -> np.ndarray:
    ids: list[int] = []
    for doc_ids in tok.encode_batch(docs):
        ids.extend(doc_ids)
        ids.append(tok.eos_token_id)
    arr = np.asarray(ids, dtype=np.uint16)
    assert int(arr.max()) < tok.vocab_size
    return arr


def _prompts(tok: PairTokenizer, files: list[tuple[str, str]], n: int) -> list[dict]:
    """`n` snippets of held-out files (codec tables excluded): whole lines from a random line
    on, 64..192 tokens."""
    rng = random.Random(SEED)
    order = sorted(files, key=lambda f: _hash(f[0]))
    out = []
    for rel, text in order:
        if rel.startswith("encodings/"):  # codec tables: trivially predictable, would inflate
            continue
        lines = text.splitlines(keepends=True)
        if len(lines) < 40:
            continue
        start = rng.randrange(len(lines) // 10, len(lines) - 30)
        snippet, ntok = "", 0
        for line in lines[start:]:
            snippet += line
            ntok = len(tok.encode(snippet))
            if ntok >= 64:
                break
        if not 64 <= ntok <= 192 or len(snippet.strip()) < 80:
            continue
        out.append({"path": rel, "line": start + 1, "prompt": snippet})
        if len(out) == n:
            break
    return out


def prepare(out_dir: str | Path, root: Path | None = None, vocab_size: int = VOCAB_SIZE) -> dict:
    t0 = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = list_files(root)
    train = [(r, t) for r, t in files if split_of(r) == "train"]
    val = [(r, t) for r, t in files if split_of(r) == "val"]
    held = [(r, t) for r, t in files if split_of(r) == "heldout"]
    train_docs = [make_document(r, t) for r, t in train]
    val_docs = [make_document(r, t) for r, t in val]
    held_docs = [make_document(r, t) for r, t in held]

    bpe = _train_bpe(train_docs, vocab_size=vocab_size)
    save_hf_tokenizer(bpe, out / "tokenizer")
    tok = PairTokenizer(out / "tokenizer")

    train_ids = _encode_stream(tok, train_docs)
    val_ids = _encode_stream(tok, val_docs)
    held_ids = _encode_stream(tok, held_docs)
    np.save(out / "train.npy", train_ids)
    np.save(out / "val.npy", val_ids)
    np.save(out / "heldout.npy", held_ids)

    rows, cols = SAMPLE_SHAPE
    stride = (len(held_ids) - cols) // rows
    sample = np.stack([held_ids[i * stride : i * stride + cols] for i in range(rows)])
    np.save(out / "heldout_sample.npy", sample)

    prompts = _prompts(tok, held, NUM_PROMPTS)
    (out / "heldout_prompts.json").write_text(json.dumps(prompts, indent=1) + "\n")

    meta = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "stdlib": str(root or stdlib_root()),
        "split": f"h = sha256(relpath)[:8] % 100: h < {HELDOUT_PERCENT} heldout, "
        f"h < {HELDOUT_PERCENT + VAL_PERCENT} val, else train",
        "files": {"train": len(train), "val": len(val), "heldout": len(held)},
        "bytes": {
            "train": sum(len(d.encode()) for d in train_docs),
            "val": sum(len(d.encode()) for d in val_docs),
            "heldout": sum(len(d.encode()) for d in held_docs),
        },
        "tokens": {
            "train": int(len(train_ids)),
            "val": int(len(val_ids)),
            "heldout": int(len(held_ids)),
        },
        "vocab_size": tok.vocab_size,
        "eos": EOS_TOKEN,
        "num_prompts": len(prompts),
        "sha256": {
            name: hashlib.sha256((out / name).read_bytes()).hexdigest()
            for name in ["tokenizer/tokenizer.json", "train.npy", "val.npy", "heldout.npy"]
        },
        "seconds": round(time.time() - t0, 1),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".pair-data")
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args(argv)
    meta = prepare(args.out, vocab_size=args.vocab_size)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
