"""The small parsers: gfx names, HSA_OVERRIDE_GFX_VERSION, KFD properties, visibility lists."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocmforge_supervisor.hardware import gfx_target_name, parse_gfx_override
from rocmforge_supervisor.hardware._amdgpu_ids import marketing_name
from rocmforge_supervisor.hardware._sysfs import PropertiesError, parse_properties
from rocmforge_supervisor.hardware._visible import visible_order

from .conftest import FIXTURES

# The RX 7900 XTX example of the reference, as the kernel prints it.
NAVI31_PROPERTIES = """cpu_cores_count 0
simd_count 192
mem_banks_count 1
caches_count 206
io_links_count 1
p2p_links_count 5
cpu_core_id_base 0
simd_id_base 2147488032
max_waves_per_simd 16
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 32
array_count 12
simd_arrays_per_engine 2
cu_per_simd_array 8
simd_per_cu 2
max_slots_scratch_cu 32
gfx_target_version 110000
vendor_id 4098
device_id 29772
location_id 34304
domain 0
drm_render_minor 128
hive_id 0
num_sdma_engines 2
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 6
num_cp_queues 8
max_engine_clk_fcompute 2482
local_mem_size 0
fw_version 2140
capability 671588992
debug_prop 1495
sdma_fw_version 20
unique_id 11673270660693242239
num_xcc 1
max_engine_clk_ccompute 2400
"""


@pytest.mark.parametrize(
    ("version", "name"),
    [
        (110000, "gfx1100"),
        (110001, "gfx1101"),
        (110003, "gfx1103"),
        (110501, "gfx1151"),
        (110500, "gfx1150"),
        (90010, "gfx90a"),
        (90012, "gfx90c"),
        (90402, "gfx942"),
        (100300, "gfx1030"),
        (120001, "gfx1201"),
        (90000, "gfx900"),
    ],
)
def test_gfx_target_names(version: int, name: str) -> None:
    assert gfx_target_name(version) == name


@pytest.mark.parametrize("version", [0, -1, 101600, 90016, 91700])
def test_gfx_target_rejects_unnameable(version: int) -> None:
    with pytest.raises(ValueError):
        gfx_target_name(version)


@given(major=st.integers(1, 63), minor=st.integers(0, 15), stepping=st.integers(0, 15))
def test_gfx_name_round_trips(major: int, minor: int, stepping: int) -> None:
    name = gfx_target_name(major * 10000 + minor * 100 + stepping)
    m = re.fullmatch(r"gfx(\d+)([0-9a-f])([0-9a-f])", name)
    assert m is not None
    assert (int(m[1]), int(m[2], 16), int(m[3], 16)) == (major, minor, stepping)


@pytest.mark.parametrize(
    ("raw", "version"), [("11.0.0", 110000), ("10.3.0", 100300), ("9.0.10", 90010), (" 11.5.1 ", 110501)]
)
def test_override_parses_like_the_thunk(raw: str, version: int) -> None:
    assert parse_gfx_override(raw) == version


@pytest.mark.parametrize("raw", ["11", "11.0", "11.0.0x", "gfx1100", "64.0.0", "11.0.16", "", "a.b.c"])
def test_override_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match=r"HSA_OVERRIDE_GFX_VERSION|gfx_target_version"):
        parse_gfx_override(raw)


def test_properties_parse_the_kernel_example() -> None:
    props = parse_properties(NAVI31_PROPERTIES)
    assert props["gfx_target_version"] == 110000
    assert props["unique_id"] == 11673270660693242239
    assert props["location_id"] == 34304
    assert len(props) == 38


def test_properties_corruption_keeps_what_was_read() -> None:
    text = NAVI31_PROPERTIES[:200] + "\x00\x00garbage"
    with pytest.raises(PropertiesError) as info:
        parse_properties(text)
    assert info.value.partial["simd_count"] == 192
    assert "location_id" not in info.value.partial
    with pytest.raises(PropertiesError, match="empty"):
        parse_properties("\n")
    with pytest.raises(PropertiesError, match="line 2"):
        parse_properties("simd_count 1\nsimd_count -1\n")


UUIDS = ["GPU-8b2f3a1c2d4e5f61", "GPU-5c6d7e8f9a0b1c2d", None, "GPU-8b2f00000000aaaa"]


@pytest.mark.parametrize(
    ("spec", "order"),
    [
        (None, None),
        ("", []),
        ("  ", []),
        ("1,0", [1, 0]),
        ("2", [2]),
        ("0,0,1", [0]),  # a repeated token ends the list
        ("0,9,1", [0]),  # so does an out-of-range one
        ("0,x,1", [0]),
        ("0x3", [3]),
        ("gpu-5c6d", [1]),  # UUID prefix, case-insensitive
        ("GPU-8b2f,1", []),  # ambiguous prefix: ends the list at once
        ("GPU-8b2f3a,3", [0, 3]),
        ("3,2,1,0,1", [3, 2, 1, 0]),
    ],
)
def test_visible_order_follows_rocr(spec: str | None, order: list[int] | None) -> None:
    assert visible_order(spec, UUIDS) == order


def test_marketing_names_from_libdrm_table() -> None:
    root = FIXTURES / "rx7900xtx"
    assert marketing_name(root, 0x744C, 0xC8) == "AMD Radeon RX 7900 XTX"
    assert marketing_name(root, 0x744C, 0xCC) == "AMD Radeon RX 7900 XT"
    assert marketing_name(root, 0x744C, None) is None  # three names for one id: no guess
    assert marketing_name(root, 0x1234, 0x00) is None
    assert marketing_name(FIXTURES / "no_gpu", 0x744C, 0xC8) is None  # no table there
