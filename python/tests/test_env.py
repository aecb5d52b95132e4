"""The client's environment against the runners': a mismatch is refused, naming both."""

from __future__ import annotations

import pytest

import kestrel
from kestrel import _env


def test_another_python_on_the_client_is_refused_at_submit_naming_both(client, monkeypatch):
    real = _env.fingerprint()
    monkeypatch.setattr(_env, "fingerprint", lambda: {**real, "python": "2.7.18"})
    # Refused by submit and map themselves, before any task exists.
    with pytest.raises(kestrel.EnvironmentMismatch) as info:
        client.submit(pow, 2, 2)
    message = str(info.value)
    assert "the client has Python 2.7.18" in message
    assert f"runs Python {real['python']} with cloudpickle {real['cloudpickle']}" in message
    assert "--python PATH" in message
    with pytest.raises(kestrel.EnvironmentMismatch, match="the client has Python 2.7.18"):
        client.map(pow, range(10), range(10))


def test_another_cloudpickle_is_refused_at_submit(client, monkeypatch):
    real = _env.fingerprint()
    monkeypatch.setattr(_env, "fingerprint", lambda: {**real, "cloudpickle": "0.1"})
    with pytest.raises(kestrel.EnvironmentMismatch, match="with cloudpickle 0.1;"):
        client.submit(pow, 2, 2)


def test_another_module_version_is_refused(client, monkeypatch):
    monkeypatch.setattr(_env, "modules_of", lambda f: [("pytest", "0.0.1")])
    with pytest.raises(kestrel.EnvironmentMismatch, match="module pytest 0.0.1 on the client"):
        client.submit(pow, 2, 2).result(30)


def test_the_fingerprint_names_versioned_modules_a_function_uses():
    def uses_pytest():
        return pytest.__version__

    assert ("pytest", pytest.__version__) in _env.modules_of(uses_pytest)
