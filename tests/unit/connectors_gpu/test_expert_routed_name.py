"""The expert-routed connector's names: ``ExpertRoutedAFDConnector``, and its name until
0.3, ``DeepEPM2NAFDConnector``, registered for the same class (existing configs start)."""

from __future__ import annotations

from afd_connectors_gpu.expert_routed import ExpertRoutedAFDConnector
from afd_core.plugins.registry import get_registry


def test_the_former_name_loads_the_same_connector_class() -> None:
    registry = get_registry()
    current = registry.connector("ExpertRoutedAFDConnector")
    former = registry.connector("DeepEPM2NAFDConnector")
    assert current.load() is former.load() is ExpertRoutedAFDConnector
    assert former.platforms == current.platforms
    assert "Former name of ExpertRoutedAFDConnector" in former.description
