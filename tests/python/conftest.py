import pytest

from ember.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(shards=2) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    import ember
    return ember.Client(cluster.addresses)
