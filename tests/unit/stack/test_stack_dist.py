"""The stack reads wheel metadata with `packaging`: the forms real `Requires-Dist` lines take, and bad input named."""

from __future__ import annotations

import pytest

from sm120check.stack import dist


def test_a_toolkit_component_line_keeps_its_extra_and_its_prefix_pin() -> None:
    req = dist.requirement("nvidia-cuda-nvcc==13.2.86.*; platform_system == 'Linux' and extra == 'nvcc'")
    assert (req.name, req.specifier.text, req.specifier.exact()) == ("nvidia-cuda-nvcc", "==13.2.86.*", "13.2.86")
    assert not req.applies() and req.applies(["nvcc"])
    assert req.specifier.contains("13.2.86.1")


def test_a_range_is_shown_as_the_metadata_wrote_it() -> None:
    req = dist.requirement("cuda-bindings>=13.0.3,<14")
    assert req.specifier.text == ">=13.0.3,<14" and req.specifier.exact() is None
    assert req.specifier.contains("13.2.0") and not req.specifier.contains("14.0.0")


def test_a_pinned_pre_release_is_held_against_a_range() -> None:
    assert dist.requirement("flashinfer-python>=0.5").specifier.contains("0.5.24.dev0")


def test_a_url_requirement_is_left_to_pip() -> None:
    with pytest.raises(ValueError, match="names a URL"):
        dist.requirement("torch @ https://example.invalid/torch.whl")


def test_a_bad_version_names_the_value_and_the_form_to_write() -> None:
    with pytest.raises(ValueError, match=r"'thirteen' is not a PEP 440 version \(such as 2\.14\.1"):
        dist.version("thirteen")


def test_a_bad_specifier_names_the_line() -> None:
    with pytest.raises(ValueError, match=r"'torch>=two' is not a PEP 508 requirement"):
        dist.requirement("torch>=two")


def test_public_and_minor_read_the_version_as_written() -> None:
    assert dist.public("0.6.1+cu130") == "0.6.1" and dist.minor("13.2.86") == (13, 2) and dist.minor("13") == (13, 0)
