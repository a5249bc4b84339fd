import pytest
from tests.test_reconcile_property import World, run_steps
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.kube]

def test_dbg(kube):
    w = World(kube)
    try:
        run_steps(w, [("allocate","node-a",0),("tick",9),("handover",0,False),("deliver","node-a")])
    finally:
        w.close()
