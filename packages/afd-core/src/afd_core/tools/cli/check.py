"""``afd check CONFIG``: validate an AFD config with the vLLM plugin's own parser.

``CONFIG`` is a JSON object given inline or the path to a JSON file. The object is either
the AFD settings themselves (``{"role": "ffn", ...}``) or a whole ``additional_config``
holding them under ``"afd"`` (``{"afd": {...}, ...}``); the two cannot be confused because
``"afd"`` is not a valid AFD setting. Connector names are checked against the registry of
the installed plugins; what needs a full vLLM config (the role's worker class, the plugins'
``afd_validate`` hooks) is left to vLLM start-up. Prints the resolved config and the
rank map and exits 0; on any problem prints ``error: <one line>`` to stderr and exits 2.

For an expert-routed connector it also prints which FFN rank holds which routed experts;
the expert count comes from ``--model DIR`` (its ``config.json``) or ``--num-experts N``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from afd_core.config import AFDConfig, connector_class, parse_afd_config
from afd_core.config.coercion import show
from afd_core.errors import AFDError
from afd_core.placement import ExpertPlacement
from afd_core.tools.cli._inputs import EXIT_INVALID, model_dir_problem

#: ``config.json`` keys that hold the number of routed experts (Qwen3-MoE, DeepSeek).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


class _CheckError(AFDError):
    """A problem with the ``afd check`` input itself (unreadable file, bad JSON)."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``check`` to the ``afd`` subcommands and return its parser."""
    parser = subparsers.add_parser(
        "check",
        help="validate an AFD config and print the resolved rank map",
        description=(
            "Validate an AFD config as the vLLM plugin does and print the resolved config "
            "and rank map. CONFIG_JSON_OR_FILE is inline JSON or a JSON file holding either "
            'the "afd" settings or a whole additional_config with an "afd" key.'
        ),
    )
    parser.add_argument(
        "config",
        metavar="CONFIG_JSON_OR_FILE",
        help='a JSON object (the "afd" settings or a whole additional_config) or a JSON file',
    )
    experts = parser.add_mutually_exclusive_group()
    experts.add_argument(
        "--model",
        metavar="DIR",
        help="model directory (its config.json gives the routed expert count)",
    )
    experts.add_argument(
        "--num-experts", type=int, metavar="N", help="the model's number of routed experts"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Validate ``args.config``; print the result (exit 0) or the error (exit 2)."""
    problem = None if args.model is None else model_dir_problem(Path(args.model), "--model")
    if problem is None and args.num_experts is not None and args.num_experts < 1:
        problem = f"--num-experts must be at least 1, got {args.num_experts}"
    if problem is not None:
        print(f"error: afd check: {problem}", file=sys.stderr)
        return EXIT_INVALID
    try:
        config = parse_afd_config(_afd_settings(_load_json(args.config)))
        placement = _placement(config, args)
    except AFDError as exc:
        # Plugin errors may quote multi-line text; the contract here is one line.
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_INVALID
    print(describe(config, placement))
    return 0


def _placement(config: AFDConfig, args: argparse.Namespace) -> ExpertPlacement | None:
    """The expert blocks to print (expert-routed connectors with a known expert count)."""
    if config.expert_placement is None:
        return None
    count = args.num_experts
    if args.model is not None:
        count = _expert_count(Path(args.model))
    if count is None:
        return None
    return ExpertPlacement(count, config.num_ffn_ranks, config.expert_placement)


def _expert_count(model: Path) -> int:
    document = _load_json(str(model / "config.json"))
    text_config = document.get("text_config", document) if isinstance(document, dict) else {}
    for key in EXPERT_COUNT_KEYS:
        if isinstance(text_config.get(key), int):
            return int(text_config[key])
    raise _CheckError(
        f"afd check: {model / 'config.json'} names no routed expert count "
        f"({', '.join(EXPERT_COUNT_KEYS)}); pass --num-experts"
    )


def describe(config: AFDConfig, placement: ExpertPlacement | None = None) -> str:
    """The resolved config (every field) and its rank map, as ``afd check`` prints them.

    With ``placement`` (expert-routed) also which FFN rank holds which experts.
    """
    lines = [f"AFD config is valid ({config.role} role)."]
    for f in fields(config):
        value = getattr(config, f.name)
        if f.name == "connector_extra_config":
            value = dict(value)
        shown = json.dumps(value)
        if f.name == "role_rank" and value is None:
            shown += " (derived from vLLM's data-parallel rank)"
        lines.append(f"  {f.name}: {shown}")
    topology = config.topology
    if config.role_rank is not None:
        world = topology.world_rank(config.role, config.role_rank)
        lines.append(f"This process: {config.role} rank {config.role_rank} (world {world})")
    lines.append(_describe_connector(config.connector))
    lines.append(topology.describe(announced=not config.async_dp))
    lines.append(_describe_stages(config))
    if placement is not None:
        lines.append(placement.describe())
    elif config.splits_experts:
        lines.append(
            "routed experts: split over the FFN ranks in contiguous blocks; pass --model DIR "
            "or --num-experts N to see which FFN rank holds which"
        )
    return "\n".join(lines)


def _describe_connector(name: str) -> str:
    """What the connector is, where it runs, and its pattern's gate rule and capabilities."""
    from afd_core.plugins.registry import get_registry

    spec = get_registry().connectors[name]  # parse_afd_config found it there
    cls = connector_class(spec)
    pattern, caps = cls.pattern_type, cls.capabilities
    lines = [f"Connector {name}: {spec.description or '(no description)'}"]
    lines.append(f"  platforms: {', '.join(spec.platforms)}")
    lines.append(f"  pattern: {pattern.name or pattern.__name__}")
    if pattern.gate_on_attention is not None:
        required = str(pattern.gate_on_attention).lower()
        lines.append(f"  requires compute_gate_on_attention {required}: it {pattern.gate_reason}")
    carries = [
        f"CUDA graphs: {'yes' if caps.cuda_graphs else 'no'}",
        f"two stages: {'yes' if caps.two_stages else 'no'}",
        f"attention TP: {'yes' if caps.attention_tp else 'no'}",
    ]
    lines.append(f"  carries: {'; '.join(carries)}")
    return "\n".join(lines)


def _describe_stages(config: AFDConfig) -> str:
    """How many stages a step runs, and when it splits."""
    if config.num_stages == 1:
        return "stages: one per step"
    return (
        "stages: 2 per step: a scheduled batch splits at the request boundary nearest half "
        f"its tokens once it has {config.stage_decode_token_threshold} tokens (decodes only) "
        f"or {config.stage_prefill_token_threshold} (with a prefill); smaller batches run as "
        "one stage. While one stage's layer is on "
        "its FFN round trip, the other stage computes its attention"
    )


def _load_json(argument: str) -> Any:
    """Parse ``argument`` as inline JSON when it starts with ``{`` or ``[``, else as a file."""
    if argument.lstrip().startswith(("{", "[")):
        source, text = "the CONFIG argument", argument
    else:
        path = Path(argument)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise _CheckError(
                f"afd check: cannot read {argument!r} ({exc.strerror or exc}); pass a JSON "
                "object or the path to a JSON file"
            ) from exc
        source = repr(argument)
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise _CheckError(
            f"afd check: {source} is not valid JSON ({exc.msg} at line {exc.lineno} "
            f"column {exc.colno}); fix the JSON"
        ) from exc


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object without repeated keys (plain ``json.loads`` keeps the last silently)."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise _CheckError(
                f"afd check: key {key!r} appears twice in one JSON object (set to "
                f"{show(document[key], with_type=False)} and {show(value, with_type=False)}); "
                "keep one"
            )
        document[key] = value
    return document


def _afd_settings(document: Any) -> Any:
    """The AFD settings inside ``document`` (a whole additional_config or the settings)."""
    if not isinstance(document, dict):
        raise _CheckError(
            f"afd check: the config must be a JSON object, got {type(document).__name__}; "
            'write {"role": ..., "connector": ...} or {"afd": {...}}'
        )
    return document.get("afd", document)
