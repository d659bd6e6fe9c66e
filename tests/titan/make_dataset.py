"""Writes a local stand-in for TorchTitan's ``c4_test`` dataset (tests/assets/c4_test,
which the torchtitan wheel does not ship): JSON lines with a "text" field, one line
per paragraph of Python's own bundled documentation (``pydoc_data.topics``), in a
fixed order, so every run and every machine reads the same English text.

    python tests/titan/make_dataset.py OUT_DIR    # writes OUT_DIR/data.json
"""

import json
import os
import pydoc_data.topics
import sys


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    n = 0
    with open(os.path.join(out_dir, "data.json"), "w") as f:
        for key in sorted(pydoc_data.topics.topics):
            for para in pydoc_data.topics.topics[key].split("\n\n"):
                text = " ".join(para.split())
                if len(text) >= 200:
                    f.write(json.dumps({"text": text}) + "\n")
                    n += 1
    print(f"{n} documents in {out_dir}/data.json")


if __name__ == "__main__":
    main(sys.argv[1])
