"""``make test`` runs ``--dist loadgroup``: a test marked ``xdist_group`` must carry its group in
the node id the scheduler reads (tests/conftest.py, ``_xdist_groups``), or every module fixture
of a grouped file is built once per worker."""

import pytest

pytestmark = pytest.mark.xdist_group("xdist-groups-check")


def test_a_grouped_test_carries_its_group_in_the_id_the_scheduler_reads(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("only under --dist loadgroup (make test)")
    assert request.node.nodeid.endswith("@xdist-groups-check")
