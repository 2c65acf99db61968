"""The GPU catalog's newer parts (common/gpus.py): each resolves by its canonical name and aliases, a
near miss gets a did-you-mean, and the FP8 rates are where the parts have FP8 tensor cores."""

from __future__ import annotations

import pytest

from tessera.common.gpus import CATALOG, FP8_TFLOPS, UnknownGpuError, from_nvml, lookup

NEW = {
    "H100-96GB": ("H100-96GB", "h100_96gb", "H100 96GB", "h10096"),
    "H20-96GB": ("H20-96GB", "H20", "h20", "h20_96gb"),
    "L40S-48GB": ("L40S-48GB", "L40S", "l40s"),
    "MI300X-192GB": ("MI300X-192GB", "MI300X", "mi300x", "mi300x 192gb"),
    "H100-NVL-94GB": ("H100-NVL-94GB", "H100NVL", "h100 nvl", "h100_nvl_94gb"),
}


@pytest.mark.parametrize("canonical", sorted(NEW))
def test_each_new_type_resolves_by_its_aliases(canonical: str) -> None:
    for spelling in NEW[canonical]:
        assert lookup(spelling).name == canonical, spelling


@pytest.mark.parametrize("typo, meant", [("H20-96G", "H20-96GB"), ("MI300", "MI300X-192GB"),
                                         ("L40-S", "L40S-48GB"), ("H100-96", "H100-96GB")])
def test_did_you_mean(typo: str, meant: str) -> None:
    try:
        got = lookup(typo).name
    except UnknownGpuError as exc:
        assert f"did you mean {meant!r}?" in str(exc), str(exc)
    else:
        assert got == meant
    with pytest.raises(UnknownGpuError, match="known: "):
        lookup("B200")


def test_the_new_rows() -> None:
    h20, mi = CATALOG["H20-96GB"], CATALOG["MI300X-192GB"]
    assert (h20.memory_gb, h20.tflops_fp16, h20.bandwidth_gbps, h20.tflops_fp8) == (96, 148, 4000, 296)
    assert (mi.memory_gb, mi.tflops_fp16, mi.bandwidth_gbps, mi.nvlink_gbps, mi.tflops_fp8) == \
        (192, 1307.4, 5300, 896, 2614.9)
    assert CATALOG["L40S-48GB"].tflops_fp8 == 733 and CATALOG["L40S-48GB"].nvlink_gbps == 0
    assert not CATALOG["H100-96GB"].confirmed  # no public source for the "96GB HBM2e" part


def test_fp8_only_where_there_are_fp8_tensor_cores() -> None:
    for name, g in CATALOG.items():
        hopper_or_newer = name.startswith(("H100", "H200", "H20-", "L4", "L40S", "RTX-4090", "MI300X"))
        assert (g.tflops_fp8 > 0) == hopper_or_newer, name
        if g.tflops_fp8:
            assert name in FP8_TFLOPS and g.tflops_fp8 >= g.tflops_fp16, name


def test_nvml_names_of_the_new_parts() -> None:
    assert from_nvml("NVIDIA H20", 96 * 1024**3)[0].name == "H20-96GB"  # type: ignore[union-attr]
    assert from_nvml("NVIDIA H200", 141 * 10**9)[0].name == "H200-141GB"  # type: ignore[union-attr]
    assert from_nvml("NVIDIA H100 80GB HBM3", 80 * 10**9)[0].name == "H100-80GB"  # type: ignore[union-attr]


def test_a_long_name_is_unknown_at_once_and_quoted_in_part() -> None:
    """Names come from requests: each distinct one used to stay in lookup's cache (an audit held
    400 MB with 100 names of 4 MB), and the whole name came back in the error."""
    with pytest.raises(UnknownGpuError) as err:
        lookup(" " * 4_000_000 + "H100")
    assert len(str(err.value)) < 2_000 and "4,000,004 characters" in str(err.value)
    assert lookup("  H100  ").name == lookup("H100").name  # short padded names still resolve
