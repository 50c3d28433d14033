"""Backend names resolve predictably and unavailable ones fail with a reason."""

import pytest
import torch

from wc_kernels import _backend


def test_reference_always_resolves():
    assert _backend.resolve("op", "reference", torch.device("cpu"), ("reference",)) == "reference"


def test_auto_falls_back_to_reference(monkeypatch):
    monkeypatch.setattr(_backend, "native_built", lambda: False)
    impl = ("reference", "triton", "native")
    assert _backend.resolve("op", "auto", torch.device("cpu"), impl) == "reference"


def test_auto_prefers_native_on_cpu_when_built(monkeypatch):
    monkeypatch.setattr(_backend, "native_built", lambda: True)
    impl = ("reference", "triton", "native")
    assert _backend.resolve("op", "auto", torch.device("cpu"), impl) == "native"


def test_unavailable_backend_raises_with_reason(monkeypatch):
    monkeypatch.setattr(_backend, "native_built", lambda: False)
    with pytest.raises(RuntimeError, match="native extension wc_kernels._native is not built"):
        _backend.resolve("op", "native", torch.device("cpu"), ("reference", "native"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        _backend.resolve("op", "triton", torch.device("cpu"), ("reference", "triton"))


def test_unknown_or_unimplemented_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        _backend.resolve("op", "cuda", torch.device("cpu"), ("reference",))
    with pytest.raises(ValueError, match="has no 'triton' backend"):
        _backend.resolve("op", "triton", torch.device("cpu"), ("reference",))
