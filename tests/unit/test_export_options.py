"""`ExportOptions` checks its values itself: a Python caller is refused what the command line is."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from prensa.cli import app
from prensa.export.pipeline import ExportFormat, ExportOptions
from prensa.options import InvalidSetting


@pytest.mark.parametrize(("changes", "field"), [
    ({"dtype": "bf16"}, "dtype"),
    ({"dtype": "fp16", "quantize_int8": True}, "quantize_int8"),
    ({"format": ExportFormat.TENSORRT, "quantize_int8": True}, "quantize_int8"),
    ({"max_length": 0}, "max_length"),
    ({"trt_opt_batch": 0}, "trt_opt_batch"),
])
def test_python_callers_are_refused_by_field(changes, field):
    with pytest.raises(InvalidSetting) as refused:
        ExportOptions("model", Path("out"), **changes)
    assert refused.value.name == field


def test_a_profile_past_its_own_batch_is_refused():
    with pytest.raises(ValueError, match="--trt-opt-batch"):
        ExportOptions("model", Path("out"), trt_opt_batch=32, trt_max_batch=16)


def test_the_dtype_default_follows_the_format():
    assert ExportOptions("model", Path("out")).served_dtype == "fp32"
    assert ExportOptions("model", Path("out"), format=ExportFormat.TENSORRT).served_dtype == "fp16"


@pytest.mark.parametrize(("flags", "named"), [
    (["--dtype", "bf16"], "--dtype"), (["--quantize", "int4"], "--quantize"),
    (["--dtype", "fp16", "--quantize", "int8"], "--quantize"),
])
def test_the_command_names_the_flag_it_refuses(tmp_path, flags, named):
    result = CliRunner().invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "out"), *flags])
    assert result.exit_code == 2 and named in result.output, result.output
    assert not (tmp_path / "out").exists()
