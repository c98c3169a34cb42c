"""Reading a Prometheus exposition in tests: every sample by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Samples", "samples", "value"]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, by name and sorted labels."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float | None:
    """One sample's value, None when the exposition does not have it."""
    return found.get((name, tuple(sorted(labels.items()))))
