"""The tpu_aot tests' time limit: `make test` runs them at nice 19 beside the rest of the suite, where a compile that
takes 3-4 minutes of CPU alone can wait far longer than pytest.ini's 900 s for the cores (one did, at 956 s)."""
import pytest

AOT_TIMEOUT_S = 3000  # still inside CI's 90 minutes for the whole run


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("tpu_aot") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(AOT_TIMEOUT_S))
