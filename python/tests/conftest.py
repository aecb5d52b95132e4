"""Fixtures: real local clusters (a server and workers as processes of this interpreter)."""

from __future__ import annotations

import pytest

import kestrel


@pytest.fixture(scope="session")
def cluster():
    with kestrel.LocalCluster(workers=2, slots=2) as c:
        yield c


@pytest.fixture
def client(cluster):
    with kestrel.Client(cluster) as c:
        yield c
