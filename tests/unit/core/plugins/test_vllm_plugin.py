"""The ``vllm.general_plugins`` entry point, with fakes in place of vLLM (never imported).

The fake vLLM modules provide exactly what ``afd_core.vllm_plugin`` and
``afd_core.platform`` use: ``vllm.__version__``, ``vllm.platforms.current_platform`` and
``vllm.model_executor.models.ModelRegistry``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from afd_core import hookimpl, vllm_plugin
from afd_core.assembly import P2pBlock
from afd_core.config import AFDConfig
from afd_core.connector import Connector
from afd_core.errors import AFDConfigError, AFDInstallError
from afd_core.platform import current_platform_name, platform_name
from afd_core.plugins.manager import get_plugin_manager, reset_plugins
from afd_core.plugins.registry import AFDRegistry, reset_registry
from afd_core.plugins.specs import ConnectorSpec, ModelSpec, WorkerSpec
from afd_core.vllm_plugin import (
    HOOK_SENTINEL,
    apply_afd_config,
    check_vllm_version,
    install_config_hook,
    install_request_refusal,
    register,
    resolve_worker_cls,
)

HERE = __name__
STOCK_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"


class FakeAttentionWorker:
    """Stands in for the registered attention worker."""


class FakeFFNWorker:
    """Stands in for the registered FFN worker."""


class CustomAttentionWorker(FakeAttentionWorker):
    """A user's subclass of the registered attention worker."""


class UnrelatedWorker:
    """A worker class that has nothing to do with AFD."""


class FakeConnector(Connector):
    """Only its (default, empty) extra-config parser is used."""

    name = "FakeConnector"
    pattern_type = P2pBlock


WORKERS = {
    ("attention", "cpu"): WorkerSpec(
        "attention", "cpu", f"{HERE}:FakeAttentionWorker", "afd-attention"
    ),
    ("ffn", "cpu"): WorkerSpec("ffn", "cpu", f"{HERE}:FakeFFNWorker", "afd-ffn"),
}
REGISTRY = AFDRegistry(
    connectors=MappingProxyType(
        {
            "FakeConnector": ConnectorSpec("FakeConnector", f"{HERE}:FakeConnector", ("cpu",)),
            "CudaOnly": ConnectorSpec("CudaOnly", f"{HERE}:FakeConnector", ("cuda",)),
        }
    ),
    workers=MappingProxyType(WORKERS),
    models=MappingProxyType({}),
)


def afd_config(role: str = "attention") -> AFDConfig:
    return AFDConfig(role=role, connector="FakeConnector")  # type: ignore[arg-type]


def vllm_config(
    worker_cls: str = "auto", afd: dict[str, Any] | None = None, ubatches: int = 1
) -> SimpleNamespace:
    return SimpleNamespace(
        additional_config={} if afd is None else {"afd": afd},
        parallel_config=SimpleNamespace(
            worker_cls=worker_cls, use_ubatching=ubatches > 1, num_ubatches=ubatches
        ),
        cache_config=SimpleNamespace(enable_prefix_caching=True),
    )


class Validator:
    """A plugin that records afd_validate calls and can reject the deployment."""

    def __init__(self, reject: bool = False) -> None:
        self.calls: list[tuple[AFDConfig, Any]] = []
        self.reject = reject

    @hookimpl
    def afd_validate(self, config: AFDConfig, vllm_config: Any) -> None:
        self.calls.append((config, vllm_config))
        if self.reject:
            raise AFDConfigError("AFD config: this plugin does not support that")


@pytest.fixture(autouse=True)
def no_installed_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only plugins a test registers itself take part."""
    monkeypatch.setenv("AFD_PLUGINS", "")
    reset_plugins()
    reset_registry()
    yield
    reset_plugins()
    reset_registry()


# Version check ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu"])
def test_supported_vllm_versions_are_accepted(version: str) -> None:
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.1", "0.32.1", "0.32.0rc1", "dev"])
def test_other_vllm_versions_are_rejected_naming_found_and_supported(version: str) -> None:
    with pytest.raises(AFDInstallError) as err:
        check_vllm_version(version)
    assert f"found vLLM {version}" in str(err.value)
    assert "supports vLLM 0.32.0" in str(err.value)


# Platform names ---------------------------------------------------------------------------


def fake_platform(device_type: str, cpu: bool = False, cuda_alike: bool = False) -> Any:
    return SimpleNamespace(
        device_type=device_type, is_cpu=lambda: cpu, is_cuda_alike=lambda: cuda_alike
    )


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        (fake_platform("cpu", cpu=True), "cpu"),
        (fake_platform("cuda", cuda_alike=True), "cuda"),
        (fake_platform("npu"), "npu"),
    ],
)
def test_platform_name_maps_vllm_platforms(platform: Any, expected: str) -> None:
    assert platform_name(platform) == expected


def test_unsupported_platform_is_an_install_error() -> None:
    with pytest.raises(AFDInstallError, match="'tpu'"):
        platform_name(fake_platform("tpu"))


def test_current_platform_name_without_vllm_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("vllm", "vllm.platforms"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(AFDInstallError, match=r"cannot import vLLM.*afd-core\[cpu\]"):
        current_platform_name()


# Worker resolution ------------------------------------------------------------------------


def test_auto_worker_resolves_to_the_role_worker_as_a_dotted_name() -> None:
    resolved = resolve_worker_cls(afd_config("ffn"), "cpu", STOCK_WORKER, True, REGISTRY)
    assert resolved == f"{HERE}.FakeFFNWorker"


def test_explicit_registered_worker_is_kept() -> None:
    explicit = f"{HERE}.FakeAttentionWorker"
    assert resolve_worker_cls(afd_config(), "cpu", explicit, False, REGISTRY) == explicit


def test_explicit_subclass_of_the_registered_worker_is_kept() -> None:
    explicit = f"{HERE}.CustomAttentionWorker"
    assert resolve_worker_cls(afd_config(), "cpu", explicit, False, REGISTRY) == explicit


@pytest.mark.parametrize(
    "explicit", [f"{HERE}.UnrelatedWorker", f"{HERE}.FakeFFNWorker", STOCK_WORKER.split(".")[-1]]
)
def test_explicit_other_worker_is_rejected_naming_role_platform_and_expected(
    explicit: str,
) -> None:
    with pytest.raises(AFDConfigError) as err:
        resolve_worker_cls(afd_config("attention"), "cpu", explicit, False, REGISTRY)
    message = str(err.value)
    assert explicit in message
    assert "attention role on cpu" in message
    assert f"{HERE}.FakeAttentionWorker" in message


@pytest.mark.parametrize("was_auto", [True, False])
def test_no_worker_for_role_and_platform_names_the_package(was_auto: bool) -> None:
    with pytest.raises(AFDInstallError, match=r"pip install 'afd-ffn\[cuda\]'"):
        resolve_worker_cls(afd_config("ffn"), "cuda", STOCK_WORKER, was_auto, REGISTRY)


# Applying an AFD config -------------------------------------------------------------------


def apply(config: AFDConfig, cfg: SimpleNamespace, was_auto: bool = True) -> None:
    apply_afd_config(
        config, cfg, was_auto=was_auto, platform="cpu", registry=REGISTRY, pm=get_plugin_manager()
    )


def test_ffn_role_gets_its_worker_and_no_prefix_caching() -> None:
    cfg = vllm_config(STOCK_WORKER)
    apply(afd_config("ffn"), cfg)
    assert cfg.parallel_config.worker_cls == f"{HERE}.FakeFFNWorker"
    assert cfg.cache_config.enable_prefix_caching is False


def test_a_hybrid_models_ffn_role_drops_what_vllm_derived_from_prefix_caching() -> None:
    cfg = vllm_config(STOCK_WORKER)
    cfg.cache_config = SimpleNamespace(
        enable_prefix_caching=True, mamba_cache_mode="align", mamba_block_size=16
    )
    cfg.model_config = SimpleNamespace(max_model_len=256)
    apply(afd_config("ffn"), cfg)
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.cache_config.mamba_cache_mode == "none"
    assert cfg.cache_config.mamba_block_size == 256  # what vLLM sets without prefix caching


def test_attention_role_keeps_prefix_caching() -> None:
    cfg = vllm_config(STOCK_WORKER)
    apply(afd_config("attention"), cfg)
    assert cfg.parallel_config.worker_cls == f"{HERE}.FakeAttentionWorker"
    assert cfg.cache_config.enable_prefix_caching is True


def test_every_afd_validate_implementation_sees_the_resolved_config() -> None:
    first, second = Validator(), Validator()
    get_plugin_manager().register(first, name="first")
    get_plugin_manager().register(second, name="second")
    cfg = vllm_config(STOCK_WORKER)
    config = afd_config("ffn")
    apply(config, cfg)
    for validator in (first, second):
        assert len(validator.calls) == 1
        seen_config, seen_vllm_config = validator.calls[0]
        assert seen_config is config
        assert seen_vllm_config.parallel_config.worker_cls == f"{HERE}.FakeFFNWorker"


def test_a_connector_for_another_platform_is_refused_naming_both() -> None:
    config = AFDConfig(role="ffn", connector="CudaOnly")
    with pytest.raises(AFDConfigError) as err:
        apply(config, vllm_config(STOCK_WORKER))
    assert "connector 'CudaOnly' runs on cuda, not on cpu" in str(err.value)


def test_afd_validate_rejection_propagates() -> None:
    get_plugin_manager().register(Validator(reject=True), name="strict")
    with pytest.raises(AFDConfigError, match="does not support that"):
        apply(afd_config(), vllm_config(STOCK_WORKER))


# The platform config hook -----------------------------------------------------------------


def make_platform_class() -> type:
    """A platform class like vLLM's: a classmethod hook that resolves 'auto' itself."""

    class FakeCpuPlatform:
        device_type = "cpu"
        calls = 0

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            """vLLM's own checks."""
            cls.calls += 1
            if vllm_config.parallel_config.worker_cls == "auto":
                vllm_config.parallel_config.worker_cls = STOCK_WORKER
            # vLLM's CPU platform switches DBO off, with a warning.
            vllm_config.parallel_config.use_ubatching = False

        @classmethod
        def validate_request(cls, processed_inputs: Any, params: Any) -> None:
            """Every request is fine (vLLM's default)."""

        def is_cpu(self) -> bool:
            return True

        def is_cuda_alike(self) -> bool:
            return False

    return FakeCpuPlatform


def test_config_hook_changes_nothing_when_afd_is_off() -> None:
    platform_cls = make_platform_class()
    install_config_hook(platform_cls)
    cfg = vllm_config("auto")
    platform_cls.check_and_update_config(cfg)
    assert platform_cls.calls == 1
    assert cfg.parallel_config.worker_cls == STOCK_WORKER
    assert cfg.cache_config.enable_prefix_caching is True


def test_config_hook_is_installed_once_per_class() -> None:
    platform_cls = make_platform_class()
    install_config_hook(platform_cls)
    wrapped = platform_cls.__dict__["check_and_update_config"]
    install_config_hook(platform_cls)
    assert platform_cls.__dict__["check_and_update_config"] is wrapped
    assert getattr(platform_cls.check_and_update_config, HOOK_SENTINEL)
    platform_cls.check_and_update_config(vllm_config())
    assert platform_cls.calls == 1


def test_platform_without_a_config_hook_is_an_install_error() -> None:
    with pytest.raises(AFDInstallError, match="has no check_and_update_config"):
        install_config_hook(type("OddPlatform", (), {}))


def test_config_hook_that_cannot_be_replaced_is_an_install_error() -> None:
    class Frozen(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            raise TypeError(f"cannot set {name!r}")

    platform_cls = Frozen("FrozenPlatform", (make_platform_class(),), {})
    with pytest.raises(AFDInstallError, match=r"cannot wrap FrozenPlatform.*cannot set"):
        install_config_hook(platform_cls)


def test_config_hook_whose_replacement_is_ignored_is_an_install_error() -> None:
    class Ignoring(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            """Drops every assignment without a word."""

    platform_cls = Ignoring("IgnoringPlatform", (make_platform_class(),), {})
    with pytest.raises(AFDInstallError, match="had no effect"):
        install_config_hook(platform_cls)


def test_the_ffn_request_refusal_raises_vllms_validation_error_and_leaves_the_hook() -> None:
    exceptions = pytest.importorskip("vllm.exceptions", reason="needs vLLM's error classes")

    class Platform:
        @classmethod
        def validate_request(cls, processed_inputs: Any, params: Any) -> None:
            """vLLM's default: every request is fine."""

    install_request_refusal(Platform)
    install_request_refusal(Platform)  # idempotent
    with pytest.raises(exceptions.VLLMValidationError, match="attention role's server"):
        Platform.validate_request({"type": "token"}, None)
    # vLLM maps a VLLMValidationError to HTTP 400 (a client error, not a crash).
    assert issubclass(exceptions.VLLMValidationError, exceptions.VLLMClientError)
    assert Platform.validate_request.__wrapped__.__func__.__doc__.startswith("vLLM's default")


# register() against a fake vLLM ----------------------------------------------------------


class FakeModelRegistry:
    def __init__(self) -> None:
        self.models: dict[str, str] = {}

    def register_model(self, arch: str, target: str) -> None:
        self.models[arch] = target


class RolePackagesPlugin:
    """What afd-attention/afd-ffn/afd-models would contribute, as fakes."""

    @hookimpl
    def afd_connectors(self) -> list[ConnectorSpec]:
        return [ConnectorSpec("FakeConnector", f"{HERE}:FakeConnector", ("cpu",))]

    @hookimpl
    def afd_workers(self) -> list[WorkerSpec]:
        return list(WORKERS.values())

    @hookimpl
    def afd_models(self) -> list[ModelSpec]:
        return [ModelSpec("Qwen3MoeForCausalLM", "afd_models.qwen3_moe:AFDQwen3MoeForCausalLM")]


def install_fake_vllm(monkeypatch: pytest.MonkeyPatch, version: str) -> SimpleNamespace:
    """Put a fake ``vllm`` package into sys.modules; returns its moving parts."""
    platform_cls = make_platform_class()
    model_registry = FakeModelRegistry()
    modules = {
        "vllm": {"__version__": version},
        "vllm.platforms": {"current_platform": platform_cls()},
        "vllm.model_executor": {},
        "vllm.model_executor.models": {"ModelRegistry": model_registry},
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    # The AMX request needs torch (absent here): record that register() makes it.
    amx_requests: list[None] = []
    monkeypatch.setattr(
        vllm_plugin, "request_amx_tile_permission", lambda: amx_requests.append(None)
    )
    # The frontend's environment and exit hook belong to a real server process.
    frontends: list[None] = []
    monkeypatch.setattr(vllm_plugin, "become_frontend", lambda: frontends.append(None))
    monkeypatch.setattr(vllm_plugin, "watch_frontend", lambda: False)
    return SimpleNamespace(
        platform_cls=platform_cls,
        model_registry=model_registry,
        amx_requests=amx_requests,
        frontends=frontends,
    )


def test_register_rejects_other_vllm_versions_before_touching_vllm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install_fake_vllm(monkeypatch, "0.31.1")
    get_plugin_manager().register(RolePackagesPlugin(), name="test")
    with pytest.raises(AFDInstallError, match=r"found vLLM 0\.31\.1"):
        register()
    assert fake.model_registry.models == {}
    assert not hasattr(fake.platform_cls.check_and_update_config, HOOK_SENTINEL)


def test_register_registers_models_and_wraps_the_platform_hook_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install_fake_vllm(monkeypatch, "0.32.0+cpu")
    get_plugin_manager().register(RolePackagesPlugin(), name="test")
    register()
    register()
    assert fake.model_registry.models == {
        "Qwen3MoeForCausalLM": "afd_models.qwen3_moe:AFDQwen3MoeForCausalLM"
    }
    assert len(fake.amx_requests) == 2  # every CPU process asks for AMX tile state
    cfg = vllm_config("auto", afd={"role": "ffn", "connector": "FakeConnector"})
    fake.platform_cls.check_and_update_config(cfg)
    assert fake.platform_cls.calls == 1
    assert cfg.parallel_config.worker_cls == f"{HERE}.FakeFFNWorker"
    assert cfg.cache_config.enable_prefix_caching is False
    assert len(fake.frontends) == 1  # this process is the FFN server's frontend
    assert getattr(fake.platform_cls.validate_request, HOOK_SENTINEL)  # and refuses requests


def test_registered_hook_leaves_a_non_afd_deployment_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install_fake_vllm(monkeypatch, "0.32.0")
    get_plugin_manager().register(RolePackagesPlugin(), name="test")
    register()
    cfg = vllm_config("auto")
    fake.platform_cls.check_and_update_config(cfg)
    assert cfg.parallel_config.worker_cls == STOCK_WORKER
    assert cfg.cache_config.enable_prefix_caching is True
    assert fake.frontends == []
    assert not hasattr(fake.platform_cls.validate_request, HOOK_SENTINEL)


def test_registered_hook_rejects_an_invalid_afd_config(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install_fake_vllm(monkeypatch, "0.32.0")
    get_plugin_manager().register(RolePackagesPlugin(), name="test")
    register()
    cfg = vllm_config("auto", afd={"role": "ffn", "connector": "NoSuchConnector"})
    with pytest.raises(AFDConfigError, match=r"NoSuchConnector.*FakeConnector"):
        fake.platform_cls.check_and_update_config(cfg)


def test_registered_hook_rejects_an_explicit_foreign_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install_fake_vllm(monkeypatch, "0.32.0")
    get_plugin_manager().register(RolePackagesPlugin(), name="test")
    register()
    cfg = vllm_config(
        f"{HERE}.UnrelatedWorker", afd={"role": "attention", "connector": "FakeConnector"}
    )
    with pytest.raises(AFDConfigError, match=r"UnrelatedWorker.*attention role on cpu"):
        fake.platform_cls.check_and_update_config(cfg)


@pytest.mark.parametrize("num_stages", [1, 2])
def test_vllms_dbo_given_to_an_afd_deployment_is_refused_pointing_at_num_stages(
    monkeypatch: pytest.MonkeyPatch, num_stages: int
) -> None:
    fake = install_fake_vllm(monkeypatch, "0.32.0")
    get_plugin_manager().register(RolePackagesPlugin(), name="test")
    register()
    afd = {"role": "attention", "connector": "FakeConnector", "num_stages": num_stages}
    cfg = vllm_config("auto", afd=afd, ubatches=2)
    with pytest.raises(AFDConfigError) as info:
        fake.platform_cls.check_and_update_config(cfg)
    message = str(info.value)
    assert "--enable-dbo" in message and f"(num_stages {num_stages})" in message
    assert message.endswith('set "num_stages": 2 in the AFD config of both roles instead')
    assert fake.platform_cls.calls == 1  # refused although vLLM's own hook switched DBO off
