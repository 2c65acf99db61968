"""The estimator's additions to the GPU catalog (tessera.common.gpus): what a GPU costs.

Prices (`PRICES`) are known for the four rented types of the Espresso paper only, in the currency of
their source; a cluster's own prices (GpuPool.price_per_hour) replace them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.common.gpus import lookup


@dataclass(frozen=True)
class Price:
    """What one GPU costs per hour, in `currency` (ISO 4217 code), and where the figure comes from."""

    per_hour: float
    currency: str
    source: str


# The only public prices among the seeds: Espresso's rented GPUs ("Espresso: Cost-Efficient Large Model
# Training by Exploiting GPU Heterogeneity in the Cloud", IEEE INFOCOM 2025, Table I; the same figures
# as its artifact's gpu_config.json, shared/data/espresso/), JuChi Cloud (matpool.com)
# in yuan per GPU-hour. Cloud list prices move and differ by provider; a cluster states its own.
_ESPRESSO = "Espresso Table I (JuChi Cloud rental, matpool.com)"
PRICES: dict[str, Price] = {
    "RTX-A6000-48GB": Price(6.0, "CNY", _ESPRESSO),
    "A30-24GB": Price(4.0, "CNY", _ESPRESSO),
    "RTX-3090-24GB": Price(2.5, "CNY", _ESPRESSO),
    "RTX-A4000-16GB": Price(2.0, "CNY", _ESPRESSO),
}


def price(name: str) -> Price | None:
    """The catalog's price of one GPU of this type per hour, None when no public figure is known."""
    return PRICES.get(lookup(name).name)
