"""mesh_from_config over given devices: the mesh a policy samples on when each host plays alone (its own devices)."""
import jax
import ml_collections
import pytest

from rmsweb_jax.models.from_config import host_mesh_shape, mesh_from_config


def _config(shape) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"mesh": {"shape": shape}})


def test_the_mesh_lays_the_config_shape_over_the_given_devices_only():
    devices = jax.devices()[4:8]
    mesh = mesh_from_config(_config((1, -1, 1)), devices)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 1}
    assert list(mesh.devices.flat) == devices
    assert dict(mesh_from_config(_config((1, -1, 1))).shape)["fsdp"] == jax.device_count() == 8


def test_a_shape_that_does_not_fit_the_given_devices_is_refused_with_what_would():
    with pytest.raises(ValueError, match=r"needs 8 devices, but 4 are given; write -1"):
        mesh_from_config(_config((1, 8, 1)), jax.devices()[:4])
    with pytest.raises(ValueError, match=r"3 devices \(over the 3 devices given\) are not divisible by 2"):
        mesh_from_config(_config((2, -1, 1)), jax.devices()[:3])


def test_one_given_device_needs_no_mesh():
    assert mesh_from_config(_config((1, -1, 1)), jax.devices()[:1]) is None


def test_a_host_samples_on_the_tensor_axis_that_fits_it_and_fsdp_over_the_rest():
    assert host_mesh_shape((1, 16, 2), 4) == (1, 2, 2)   # 8B on v5p: a host holds whole tensor groups
    assert host_mesh_shape((1, 8, 8), 4) == (1, 1, 4)    # tensor 8 over 4-chip hosts: the host's 4
    assert host_mesh_shape((2, 8, 1), 4) == (1, 4, 1)    # no data axis on one host's copy
    assert host_mesh_shape((1, 2, 6), 4) == (1, 2, 2)    # the largest divisor of 6 that divides 4
    assert host_mesh_shape((1, 2, 2), 1) == (1, 1, 1)
