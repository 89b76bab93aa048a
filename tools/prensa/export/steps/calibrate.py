"""Calibration: calibration.json, the int8/uint8 embedding ranges of a dense export, measured on
the written export through its manifest, so it runs once the manifest is assembled."""

from __future__ import annotations

from prensa.export.formats import calibration
from prensa.export.run import ExportRun
from prensa.layouts import of_manifest
from prensa.manifest import Manifest


def applies(manifest: Manifest) -> bool:
    """When the export serves dense vectors: the ranges are theirs."""
    return of_manifest(manifest).dense


def apply(run: ExportRun, manifest: Manifest) -> None:
    """calibration.json for a dense export whose graph passed its check, when asked or cheap; the
    report's line says how it was made, or why there is none."""
    options = run.options
    if not run.report.ok:
        run.add_figures({calibration.FIGURE: "skipped: the graph failed its check"})
        return
    skipped = calibration.skip_reason(
        options.calibrate, calibration.graph_parameters(options.out / manifest.onnx_file)
    )
    if skipped:
        run.add_figures({calibration.FIGURE: skipped})
        return
    with run.step(f"Calibrating int8 embedding ranges on {calibration.CORPUS_TEXTS} texts"):
        try:
            result = calibration.calibrate(options.out, manifest, run.tokenizer)
        except calibration.CalibrationUnavailable as exc:
            run.add_figures({calibration.FIGURE: f"skipped: {exc}"})
            return
        manifest.calibration_file = calibration.write_calibration(options.out, result, manifest)
        run.add_figures({calibration.FIGURE: calibration.describe(result)})
