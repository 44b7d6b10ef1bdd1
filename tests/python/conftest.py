import pytest

from ember.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(shards=2) as c:
        yield c


@pytest.fixture(scope="module", params=["servers", "inproc"])
def client(request):
    """Every test that takes a client runs twice: against two ember-server
    processes, and against two shards in this process (Client(inproc=2))."""
    import ember
    if request.param == "servers":
        return ember.Client(request.getfixturevalue("cluster").addresses)
    return ember.Client(inproc=2)
