"""``python -m afd_models.tiny OUT_DIR [--seed N] [--model NAME ...]``: build tiny models.

Exit status 0 when every model was built sharp and FFN-dependent enough, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from afd_models.tiny.generate import TinyModelError, generate_tiny_models
from afd_models.tiny.specs import TINY_MODELS


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, build the models, print one summary line each."""
    parser = argparse.ArgumentParser(
        prog="python -m afd_models.tiny",
        description="Build the tiny random MoE checkpoints used by the AFD CPU tests.",
    )
    parser.add_argument("out_dir", type=Path, help="each model goes into OUT_DIR/<name>")
    parser.add_argument("--seed", type=int, default=0, help="weight and tokenizer seed")
    parser.add_argument(
        "--model",
        action="append",
        choices=sorted(TINY_MODELS),
        help="build only this model (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        reports = generate_tiny_models(args.out_dir, args.seed, args.model)
    except TinyModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for report in reports:
        print(report.summary())
    print(f"total {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
