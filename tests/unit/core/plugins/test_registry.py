"""Plugin loading (``afd_core.plugins.manager``) and the registry built from the hooks.

Entry points are faked (objects with ``name``, ``value``, ``dist`` and ``load``), plugins
are plain objects with ``@hookimpl`` methods; nothing here imports vLLM or torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoints
from types import SimpleNamespace
from typing import Any

import pytest

from afd_core import hookimpl
from afd_core.errors import AFDConfigError, AFDInstallError
from afd_core.plugins import builtin_hooks
from afd_core.plugins import manager as plugins
from afd_core.plugins.manager import get_plugin_manager, load_plugins, reset_plugins
from afd_core.plugins.registry import AFDRegistry, get_registry, reset_registry
from afd_core.plugins.specs import ConnectorSpec, ModelSpec, WorkerSpec


class Provides:
    """A plugin object that returns the given specs from the three registry hooks."""

    def __init__(
        self,
        connectors: list[ConnectorSpec] | None = None,
        workers: list[WorkerSpec] | None = None,
        models: list[ModelSpec] | None = None,
    ) -> None:
        self._connectors = connectors or []
        self._workers = workers or []
        self._models = models or []

    @hookimpl
    def afd_connectors(self) -> list[ConnectorSpec]:
        return self._connectors

    @hookimpl
    def afd_workers(self) -> list[WorkerSpec]:
        return self._workers

    @hookimpl
    def afd_models(self) -> list[ModelSpec]:
        return self._models


def connector(name: str, target: str = "missing_module:Cls") -> ConnectorSpec:
    return ConnectorSpec(name=name, target=target, platforms=("cpu",))


def worker(role: str = "attention", platform: str = "cpu") -> WorkerSpec:
    return WorkerSpec(
        role=role,  # type: ignore[arg-type]
        platform=platform,  # type: ignore[arg-type]
        target=f"missing_module:{role}_{platform}",
        distribution=f"afd-{role}",
    )


@dataclass
class FakeEntryPoint:
    """Duck-types importlib.metadata.EntryPoint for AFDPluginManager.register_entry_point."""

    name: str
    dist_name: str
    load_result: Callable[[], Any]
    value: str = "fake_plugin.hooks"

    @property
    def dist(self) -> SimpleNamespace:
        return SimpleNamespace(name=self.dist_name)

    def load(self) -> Any:
        return self.load_result()


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts with no plugin loaded and no installed entry point visible."""
    monkeypatch.delenv("AFD_PLUGINS", raising=False)
    fake_installed(monkeypatch, [])
    reset_plugins()
    reset_registry()
    yield
    reset_plugins()
    reset_registry()


def fake_installed(monkeypatch: pytest.MonkeyPatch, eps: list[FakeEntryPoint]) -> list[str]:
    """Make ``eps`` the installed ``afd`` entry points; returns a log of queried groups."""
    queried: list[str] = []

    def entry_points(*, group: str) -> EntryPoints:
        queried.append(group)
        return EntryPoints(eps)  # type: ignore[arg-type]

    monkeypatch.setattr(plugins, "entry_points", entry_points)
    return queried


def registry_of(*plugin_objects: object) -> AFDRegistry:
    pm = get_plugin_manager()
    for i, obj in enumerate(plugin_objects):
        pm.register(obj, name=f"plugin{i}")
    return AFDRegistry.from_plugin_manager(pm)


# Registry contents ------------------------------------------------------------------------


def test_registry_collects_connectors_workers_and_models_of_every_plugin() -> None:
    registry = registry_of(
        Provides(connectors=[connector("A")], workers=[worker("attention", "cpu")]),
        Provides(
            connectors=[connector("B")],
            workers=[worker("ffn", "cuda")],
            models=[ModelSpec("Qwen3MoeForCausalLM", "pkg.models:Wrapper")],
        ),
    )
    assert set(registry.connectors) == {"A", "B"}
    assert set(registry.workers) == {("attention", "cpu"), ("ffn", "cuda")}
    assert registry.models["Qwen3MoeForCausalLM"].target == "pkg.models:Wrapper"
    assert registry.connector("B") is registry.connectors["B"]
    assert registry.worker("ffn", "cuda").distribution == "afd-ffn"


def test_registry_mappings_are_read_only() -> None:
    registry = registry_of(Provides(connectors=[connector("A")]))
    with pytest.raises(TypeError):
        registry.connectors["B"] = connector("B")  # type: ignore[index]


def test_building_the_registry_imports_no_connector_or_worker_class() -> None:
    registry = registry_of(
        Provides(
            connectors=[connector("Lazy", "afd_test_not_installed.conn:Lazy")],
            workers=[worker()],
        )
    )
    assert "afd_test_not_installed" not in sys.modules
    with pytest.raises(AFDInstallError, match="afd_test_not_installed"):
        registry.connector("Lazy").load()


def test_unknown_connector_lists_registered_names_sorted_and_says_to_install() -> None:
    registry = registry_of(Provides(connectors=[connector("Zeta"), connector("Alpha")]))
    with pytest.raises(AFDConfigError) as err:
        registry.connector("Nope")
    message = str(err.value)
    assert "'Nope'" in message
    assert "Alpha, Zeta" in message
    assert "install the package that provides it" in message


def test_same_connector_name_from_two_plugins_names_both_plugins() -> None:
    with pytest.raises(AFDInstallError) as err:
        registry_of(
            Provides(connectors=[connector("Dup")]), Provides(connectors=[connector("Dup")])
        )
    assert "'Dup'" in str(err.value)
    assert "plugin0" in str(err.value)
    assert "plugin1" in str(err.value)


def test_same_worker_role_and_platform_from_two_plugins_is_rejected() -> None:
    with pytest.raises(AFDInstallError, match=r"\('ffn', 'cpu'\).*plugin0.*plugin1"):
        registry_of(Provides(workers=[worker("ffn")]), Provides(workers=[worker("ffn")]))


def test_same_model_architecture_from_two_plugins_is_rejected() -> None:
    spec = ModelSpec("DeepseekV3ForCausalLM", "a:B")
    with pytest.raises(AFDInstallError, match=r"DeepseekV3ForCausalLM.*plugin0.*plugin1"):
        registry_of(Provides(models=[spec]), Provides(models=[spec]))


def test_one_worker_per_platform_of_the_same_role_is_not_a_clash() -> None:
    registry = registry_of(
        Provides(workers=[worker("ffn", "cpu")]), Provides(workers=[worker("ffn", "cuda")])
    )
    assert registry.worker("ffn", "cpu").platform == "cpu"
    assert registry.worker("ffn", "cuda").platform == "cuda"


@pytest.mark.parametrize(
    ("role", "platform", "command"),
    [
        ("attention", "cpu", "pip install 'afd-attention[cpu]'"),
        ("ffn", "cuda", "pip install 'afd-ffn[cuda]'"),
        ("ffn", "npu", "pip install afd-ffn"),
    ],
)
def test_missing_worker_names_the_package_to_install(
    role: str, platform: str, command: str
) -> None:
    registry = registry_of(Provides())
    with pytest.raises(AFDInstallError) as err:
        registry.worker(role, platform)  # type: ignore[arg-type]
    assert f"no {role} worker" in str(err.value)
    assert command in str(err.value)


def test_missing_worker_mentions_the_platforms_that_are_installed() -> None:
    registry = registry_of(Provides(workers=[worker("attention", "cuda")]))
    with pytest.raises(AFDInstallError, match="installed attention workers: cuda"):
        registry.worker("attention", "cpu")


def test_hook_that_returns_no_list_is_an_install_error_naming_the_plugin() -> None:
    class Broken:
        @hookimpl
        def afd_connectors(self) -> Any:
            return connector("NotInAList")

    with pytest.raises(AFDInstallError, match=r"afd_connectors.*plugin0.*must return a list"):
        registry_of(Broken())


def test_worker_for_an_unknown_platform_is_rejected() -> None:
    with pytest.raises(AFDInstallError, match=r"'gpu'.*platforms are cpu, cuda, npu"):
        registry_of(Provides(workers=[worker("attention", "gpu")]))


def test_worker_for_an_unknown_role_is_rejected() -> None:
    with pytest.raises(AFDInstallError, match=r"'expert'.*roles are attention, ffn"):
        registry_of(Provides(workers=[worker("expert", "cpu")]))


def test_builtin_hooks_register_the_gloo_connector_on_every_platform() -> None:
    registry = registry_of(builtin_hooks)
    spec = registry.connector("P2pGlooAFDConnector")
    assert spec.target == "afd_core.connectors.gloo:P2pGlooAFDConnector"
    assert spec.platforms == ("cpu", "cuda", "npu")
    cls = spec.load()
    assert not cls.capabilities.cuda_graphs and cls.capabilities.two_stages
    assert not cls.pattern_type.in_band() and cls.pattern_type.expert_placement is None


# Loading entry points ---------------------------------------------------------------------


def plugin_entry(name: str, dist: str, *connector_names: str) -> FakeEntryPoint:
    plugin = Provides(connectors=[connector(n) for n in connector_names])
    return FakeEntryPoint(name=name, dist_name=dist, load_result=lambda: plugin)


def test_get_registry_loads_every_installed_plugin_when_afd_plugins_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queried = fake_installed(
        monkeypatch, [plugin_entry("one", "pkg-one", "A"), plugin_entry("two", "pkg-two", "B")]
    )
    assert set(get_registry().connectors) == {"A", "B"}
    assert queried == ["afd"]


def test_afd_plugins_loads_only_the_named_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_installed(
        monkeypatch, [plugin_entry("one", "pkg-one", "A"), plugin_entry("two", "pkg-two", "B")]
    )
    monkeypatch.setenv("AFD_PLUGINS", " two ,")
    assert set(get_registry().connectors) == {"B"}


def test_empty_afd_plugins_loads_no_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_installed(monkeypatch, [plugin_entry("one", "pkg-one", "A")])
    monkeypatch.setenv("AFD_PLUGINS", "")
    assert dict(get_registry().connectors) == {}


def test_afd_plugins_naming_an_absent_entry_point_is_an_install_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_installed(monkeypatch, [plugin_entry("one", "pkg-one", "A")])
    monkeypatch.setenv("AFD_PLUGINS", "one,typo")
    with pytest.raises(AFDInstallError, match=r"AFD_PLUGINS names typo.*installed: one"):
        load_plugins()


def test_plugin_that_fails_to_import_names_entry_point_and_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail() -> Any:
        raise ModuleNotFoundError("No module named 'torch_npu'")

    fake_installed(monkeypatch, [FakeEntryPoint("npu_conn", "afd-connectors-npu", fail)])
    with pytest.raises(AFDInstallError) as err:
        get_registry()
    message = str(err.value)
    assert "'npu_conn'" in message
    assert "'afd-connectors-npu'" in message
    assert "torch_npu" in message


def test_plugin_with_a_misspelled_hook_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    class Typo:
        @hookimpl
        def afd_conectors(self) -> list[ConnectorSpec]:
            return []

    fake_installed(monkeypatch, [FakeEntryPoint("typo", "pkg-typo", Typo)])
    with pytest.raises(AFDInstallError, match=r"'typo'.*'pkg-typo'.*afd_conectors"):
        load_plugins()
    assert get_plugin_manager().get_plugin("typo") is None


def test_plugin_with_a_wrong_hook_signature_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    class WrongArgs:
        @hookimpl
        def afd_validate(self, config: Any, vllm_config: Any, extra: Any) -> None:
            """Asks for an argument the spec does not provide."""

    fake_installed(monkeypatch, [FakeEntryPoint("wrong", "pkg-wrong", WrongArgs)])
    with pytest.raises(AFDInstallError, match=r"'wrong'.*does not fit the AFD hooks"):
        load_plugins()


def test_same_entry_point_name_in_two_distributions_names_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_installed(
        monkeypatch, [plugin_entry("conn", "pkg-old", "A"), plugin_entry("conn", "pkg-new", "B")]
    )
    with pytest.raises(AFDInstallError, match=r"'conn'.*'pkg-old'.*'pkg-new'"):
        load_plugins()


def test_connector_clash_between_installed_plugins_names_both_distributions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_installed(
        monkeypatch, [plugin_entry("one", "pkg-one", "Dup"), plugin_entry("two", "pkg-two", "Dup")]
    )
    with pytest.raises(AFDInstallError, match=r"'Dup'.*'pkg-one'.*'pkg-two'"):
        get_registry()


def test_load_plugins_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    plugin = Provides(connectors=[connector("A")])

    def load() -> Provides:
        loads.append("one")
        return plugin

    queried = fake_installed(monkeypatch, [FakeEntryPoint("one", "pkg-one", load)])
    load_plugins()
    load_plugins()
    assert loads == ["one"]
    assert queried == ["afd"]


def test_get_registry_is_cached_until_reset_registry() -> None:
    first = get_registry()
    get_plugin_manager().register(Provides(connectors=[connector("Late")]), name="late")
    assert get_registry() is first
    reset_registry()
    assert "Late" in get_registry().connectors
