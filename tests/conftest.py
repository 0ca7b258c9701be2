"""Shared fixtures."""
import pytest


@pytest.fixture
def pid_dir(tmp_path):
    """A folder where ranks record their process ids."""
    return str(tmp_path)
