"""sdlib.store.provenance.device_uuid: which physical GPU ran an engine (recorded per engine start, beside the
device's name), read from the torch an engine process has already imported; None without CUDA or torch."""

from __future__ import annotations

import sys
import types

from sdlib.store.provenance import device_uuid


def _fake_torch(available: bool, uuid=None):
    props = types.SimpleNamespace(uuid=uuid)
    cuda = types.SimpleNamespace(is_available=lambda: available, get_device_properties=lambda i: props)
    return types.SimpleNamespace(cuda=cuda)


def test_the_uuid_of_device_0_where_cuda_is_there(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(True, "5a1c0f3e-0000-1111-2222-333344445555"))
    assert device_uuid() == "5a1c0f3e-0000-1111-2222-333344445555"


def test_none_without_cuda_or_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(False, "GPU-x"))
    assert device_uuid() is None
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(True, None))  # a torch whose properties lack it
    assert device_uuid() is None
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # and no nvidia-smi
    assert device_uuid() is None


def test_without_torch_nvidia_smi_names_the_card_as_torch_does(monkeypatch, tmp_path):
    """The serving supervisor never imports torch: nvidia-smi's UUID, without its GPU- prefix (torch's form)."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho GPU-5a1c0f3e-0000-1111-2222-333344445555\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert device_uuid() == "5a1c0f3e-0000-1111-2222-333344445555"
    smi.write_text("#!/bin/sh\nexit 9\n")  # a broken nvidia-smi prints nothing
    assert device_uuid() is None
