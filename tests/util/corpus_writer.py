"""Writes a fuzz corpus: one NAME.bin file per entry of a {name: bytes} mapping, in a directory
whose other files are removed first (files named crash-* excepted: they are findings to keep)."""
import os


def write_corpus(out_dir, corpus):
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):
        if not name.startswith("crash-"):
            os.remove(os.path.join(out_dir, name))
    for name, data in sorted(corpus.items()):
        with open(os.path.join(out_dir, name + ".bin"), "wb") as f:
            f.write(data)
