"""Prometheus text exposition -> plain metric families: the *parse* step, kept apart.

This is the only module that imports ``prometheus_client.parser``. Everything after it
(``collector.sources.triton.map_metrics``) consumes the neutral ``MetricFamily`` below.
``parse_exposition`` is the reference: ``collector.sources.fast_exposition`` (the fast
parser from bytes, for the wanted families, with per-target caches) is tested against
it, and hands back to it the rare page its caches cannot follow.

Naming contract, whatever parser sits behind ``parse_exposition``:

- ``MetricFamily.name`` is the name on the ``# TYPE`` line. A counter family is named
  without a ``_total`` suffix; Triton's counters (``nv_inference_count``) have none.
- ``ExpositionSample.suffix`` says which series of the family a sample is: ``""`` for
  the value itself (a counter's or gauge's value, a summary's quantile), or
  ``"_count"``, ``"_sum"``, ``"_bucket"``, ``"_created"``, ``"_gcount"``, ``"_gsum"``.
  ``prometheus_client`` renames every counter sample to ``<family>_total`` (its
  OpenMetrics-style internal form) even when the text had no suffix; the suffix field
  hides that quirk from the mapper.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from collector.errors import ParseError

__all__ = ["ExpositionSample", "MetricFamily", "parse_exposition"]

# Longest first, so "_gcount" is not read as "_count" of a family ending in "_g".
_SUFFIXES = ("_created", "_bucket", "_gcount", "_count", "_total", "_gsum", "_sum")
_EXCERPT_CHARS = 160


@dataclass(frozen=True)
class ExpositionSample:
    suffix: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class MetricFamily:
    name: str
    type: str  # "counter", "gauge", "summary", "histogram", "unknown", ...
    samples: tuple[ExpositionSample, ...]


def parse_exposition(text: str) -> dict[str, MetricFamily]:
    """Parse Prometheus text format into families keyed by family name.

    A family that appears more than once in the text (legal for untyped lines, and what
    a buggy exporter may emit) is merged, samples in text order. Raises ``ParseError``
    naming the offending line when the text is not valid exposition.
    """
    collected: dict[str, tuple[str, list[ExpositionSample]]] = {}
    try:
        # The parser is a generator: errors surface while iterating, so the whole loop
        # sits inside the try.
        for metric in text_string_to_metric_families(text):
            typ, samples = collected.setdefault(metric.name, (metric.type, []))
            for sample in metric.samples:
                samples.append(
                    ExpositionSample(
                        suffix=_suffix_of(metric.name, sample.name),
                        labels=dict(sample.labels),
                        value=float(sample.value),
                    )
                )
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        # prometheus_client reports most problems as ValueError with the bad text in
        # the message; the other types come from its lax tokenizer on odd input.
        detail = " ".join(str(exc).split())[:_EXCERPT_CHARS]
        raise ParseError(f"invalid Prometheus exposition: {detail}") from exc
    return {
        name: MetricFamily(name=name, type=typ, samples=tuple(samples))
        for name, (typ, samples) in collected.items()
    }


def _suffix_of(family: str, sample: str) -> str:
    if sample == family:
        return ""
    tail = sample[len(family) :] if sample.startswith(family) else ""
    for suffix in _SUFFIXES:
        if tail == suffix:
            # A counter's value sample, renamed "<family>_total" by the parser, is the
            # family's value, not a separate series.
            return "" if suffix == "_total" else suffix
    # Cannot happen with prometheus_client (a sample joins a family only by one of the
    # suffixes above); keep the raw tail so nothing is silently taken for the value.
    return tail or sample
