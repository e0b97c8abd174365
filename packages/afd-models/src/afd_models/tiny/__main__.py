"""``python -m afd_models.tiny OUT_DIR [--seed N] [--family F | --model NAME ...]``: build
tiny models (the family ``tiny`` by default; ``wide``: the CUDA suites' wider shapes).

Exit status 0 when every model was built sharp and FFN-dependent enough, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from afd_models.tiny.generate import TinyModelError, generate_tiny_models
from afd_models.tiny.specs import FAMILIES, VARIANTS


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, build the models, print one summary line each."""
    parser = argparse.ArgumentParser(
        prog="python -m afd_models.tiny",
        description="Build the tiny random MoE checkpoints used by the AFD CPU tests.",
    )
    parser.add_argument("out_dir", type=Path, help="each model goes into OUT_DIR/<name>")
    parser.add_argument("--seed", type=int, default=0, help="weight and tokenizer seed")
    parser.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        default="tiny",
        help="build every model of this family, its variants included (default: tiny)",
    )
    parser.add_argument(
        "--model",
        action="append",
        choices=sorted(
            name for family in (*FAMILIES.values(), *VARIANTS.values()) for name in family
        ),
        help="build only this model, of any family (repeatable; overrides --family)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        names = args.model or [*FAMILIES[args.family], *VARIANTS.get(args.family, {})]
        reports = generate_tiny_models(args.out_dir, args.seed, names)
    except TinyModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for report in reports:
        print(report.summary())
    print(f"total {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
