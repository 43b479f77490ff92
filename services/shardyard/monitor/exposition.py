"""Prometheus text exposition (format 0.0.4) of plain metric families: the monitor's ``/metrics`` at cluster scale.

prometheus-client builds a ``Sample`` (a named tuple with a dict of labels) for every sample and writes each through
generic name validation and escaping: about 17 µs a sample, so most of a second for the ~47,000 samples of a
1,000-node cluster with 8 GPUs a node, every scrape. A ``Family`` keeps its samples as two columns instead, the label
values of each sample (``keys``) and the values, and ``render`` writes each distinct value once per scrape and each
``keys`` list's label sets once per scrape: the five GPU families share one list of (gpu, model, node). The text is
``generate_latest``'s (labels sorted by name, Go's float format), which a test holds it to; ``Family.metric()`` gives
prometheus-client's object, for a ``CollectorRegistry`` and whatever else reads one.
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Kind = Literal["gauge", "counter"]
Key = tuple[str, ...]
"""A sample's label values, in its family's ``labels`` order."""


class Family:
    """One gauge or counter family: sample ``i`` has the label values ``keys[i]`` and the value ``values[i]``."""

    __slots__ = ("documentation", "keys", "kind", "labels", "name", "values")

    def __init__(self, name: str, documentation: str, labels: Sequence[str] = (), *, kind: Kind = "gauge") -> None:
        self.name = name
        """Without the ``_total`` a counter's samples carry."""
        self.documentation = documentation
        self.kind: Kind = kind
        self.labels = tuple(labels)
        self.keys: list[Key] = []
        self.values: list[float] = []

    @classmethod
    def columns(
        cls, name: str, documentation: str, labels: Sequence[str], keys: list[Key], values: list[float]
    ) -> "Family":
        """A family made whole from its columns; ``keys`` may be another family's too (label sets written once)."""
        assert len(keys) == len(values), f"{name}: {len(keys)} label sets for {len(values)} values"
        family = cls(name, documentation, labels)
        family.keys, family.values = keys, values
        return family

    def add(self, key: Key, value: float) -> None:
        self.keys.append(key)
        self.values.append(value)

    def metric(self) -> Metric:
        """The same family as prometheus-client's object."""
        kind = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        metric = kind(self.name, self.documentation, labels=self.labels)
        for key, value in zip(self.keys, self.values, strict=True):
            metric.add_metric(key, value)
        return metric


class FamiliesCollector(Collector):
    """A registry's view of families made afresh at each collection (a histogram passes through as it is)."""

    def __init__(self, families: Callable[[], Iterable[Family | Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for family in self._families():
            yield family.metric() if isinstance(family, Family) else family


def render(families: Iterable[Family | Metric]) -> str:
    """The text exposition of ``families``, in order; a prometheus-client ``Metric`` (a histogram, say) is written by
    prometheus-client itself."""
    out: list[str] = []
    texts = _Texts()
    label_sets: dict[tuple[int, tuple[str, ...]], tuple[list[Key], list[str]]] = {}
    """Per (``keys`` list, label names): each sample's ``{name="value",...}``, written once per scrape. The list is
    kept with them, so that no other list takes its id (its name here) while the scrape lasts."""
    for family in families:
        if not isinstance(family, Family):
            out.append(generate_latest(_Only(family)).decode())
            continue
        name = f"{family.name}_total" if family.kind == "counter" else family.name
        documentation = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {documentation}\n# TYPE {name} {family.kind}\n")
        if not family.labels:
            out.append("".join([f"{name} {texts[value]}\n" for value in family.values]))
            continue
        seen = label_sets.get((id(family.keys), family.labels))
        if seen is None:
            seen = label_sets[id(family.keys), family.labels] = (family.keys, _label_sets(family.labels, family.keys))
        written = seen[1]
        out.append(
            "".join([f"{name}{labels} {texts[value]}\n" for labels, value in zip(written, family.values, strict=True)])
        )
    return "".join(out)


def _label_sets(labels: tuple[str, ...], keys: list[Key]) -> list[str]:
    order = sorted(range(len(labels)), key=labels.__getitem__)
    form = "{" + ",".join(f'{labels[i]}="%s"' for i in order) + "}"
    if order == sorted(order):  # declared in name order, as the big families are: no reordering per sample
        written = [form % key for key in keys]
    else:
        written = [form % tuple([key[i] for i in order]) for key in keys]
    # A label value needs escaping only if it holds a backslash, a double quote or a newline; counting them over the
    # whole text is one pass in C instead of a test per value.
    text = "".join(written)
    if "\\" in text or "\n" in text or text.count('"') != 2 * len(labels) * len(keys):
        written = [form % tuple([_escape(key[i]) for i in order]) for key in keys]
    return written


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Texts(dict[float, str]):
    """Each distinct value formatted once per scrape (GPUs share memory sizes; 0 and 1 are everywhere). Equal numbers
    share a text: an int as its float, -0.0 as 0.0 should it come first (the same number to Prometheus)."""

    def __missing__(self, value: float) -> str:
        text = self[value] = floatToGoString(value)
        return text


class _Only(Collector):
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self.metric
