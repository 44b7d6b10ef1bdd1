import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ember_cluster import Cluster  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    with Cluster(shards=2) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    import ember
    return ember.Client(cluster.addresses)
