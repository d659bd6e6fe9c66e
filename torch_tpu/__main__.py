"""python -m torch_tpu cache {info,clear}: manage the persistent compilation cache."""

import argparse
import os
import sys

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # no plugin load needed for the cache

import torch_tpu  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_tpu")
    commands = parser.add_subparsers(dest="command", required=True)
    cache = commands.add_parser("cache", help="the persistent compilation cache (TORCH_TPU_CACHE_DIR)")
    cache.add_argument("action", choices=["info", "clear"])
    args = parser.parse_args(argv)
    if args.action == "info":
        info = torch_tpu.cache_info()
        if not info["enabled"]:
            print("compilation cache: disabled (TORCH_TPU_CACHE_DIR=off)")
            return 0
        print(f"compilation cache: {info['dir']}")
        print(f"  entries: {info['entries']}")
        size, limit = info["bytes"] / 2**20, info["limit_bytes"] / 2**20
        print(f"  size:    {size:.1f} MiB of {limit:.0f} MiB (TORCH_TPU_CACHE_LIMIT)")
    else:
        print(f"removed {torch_tpu.cache_clear()} entries from {torch_tpu.cache_info()['dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
