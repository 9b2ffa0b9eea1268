"""What a report's figures show a reader: whole figures (nothing cut at their edges), log axes labelled in plain
numbers; a figure that cannot be written is the command's one-line error; Ctrl-C leaves no report behind."""

import errno
import math
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from analysis import plots
from analysis.cli import main
from analysis.csv_io import read_csv

BATCH_SIZES = [2, 4, 8, 16, 32, 64, 128, 256]


def _steps_csv(folder: Path, copies: int = 1) -> Path:
    """Two optimizers (times ``copies``, under other names), two sparsities, timed: a steps, a sparsity and a
    time figure per optimizer."""
    rows = []
    for copy in range(copies):
        for optimizer, b_crit in (("sgd", 30), ("momentum", 60)):
            for sparsity, s_min in ((0.0, 60), (0.9, 90)):
                for b in BATCH_SIZES:
                    rows.append({"workload": "w", "optimizer": f"{optimizer}{'-' + str(copy) if copy else ''}",
                                 "sparsity": sparsity, "batch_size": b, "goal_error": 0.1,
                                 "steps_to_result": float(round(s_min * (1 + b_crit / b))), "trials_total": 4,
                                 "trials_reached": 4, "study_key": f"{optimizer}-{sparsity}-{b}-{copy}",
                                 "seconds_per_step": 0.0004 * (1 + b / 64) * math.sqrt(1 + sparsity)})
    path = folder / "steps.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_the_report_writes_whole_figures(tmp_path):
    output = tmp_path / "report.md"
    main(["report", "--csv", str(_steps_csv(tmp_path)), "--bootstrap", "0", "--output", str(output), "--svg"])
    names = sorted(p.name for p in (tmp_path / "report_figures").iterdir())
    assert names == sorted(f"{kind}_w_{optimizer}.{suffix}" for kind in ("steps", "sparsity", "time")
                           for optimizer in ("momentum", "sgd") for suffix in ("png", "svg"))
    for name in names:
        if name.endswith(".png"):
            pixels = matplotlib.image.imread(tmp_path / "report_figures" / name)
            ink = np.any(pixels[:, :, :3] < 0.99, axis=2)
            # the legend beside the axes, the labels and the titles inside the file: blank edges all round
            assert not (ink[0].any() or ink[-1].any() or ink[:, 0].any() or ink[:, -1].any()), name
            assert f"report_figures/{name}" in output.read_text()


def test_log_axes_are_labelled_in_plain_numbers(tmp_path):
    figure = plots.draw_steps(read_csv(_steps_csv(tmp_path)), "w", "sgd")
    figure.draw_without_rendering()
    axis = figure.axes[0]
    labels = [t.get_text() for t in axis.get_xticklabels() + axis.get_yticklabels() if t.get_text()]
    assert {"4", "16", "64", "256"} <= set(labels), labels
    assert not [label for label in labels if "$" in label], labels  # no mathtext
    assert [plots._plain_number(v) for v in (1024.0, 0.5, 0.03125, 0.2, 2.0 ** 30)] == \
        ["1024", "0.5", "0.03125", "0.2", "1.074e+09"]


def test_a_figure_that_cannot_be_written_is_the_commands_one_line_error(tmp_path, monkeypatch, capsys):
    def disk_full(figure, paths: list[Path]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(paths[0]))

    monkeypatch.setattr(plots, "_write", disk_full)
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--csv", str(_steps_csv(tmp_path)), "--bootstrap", "0", "--output",
              str(tmp_path / "out" / "report.md")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edps-analyze: error: "), lines
    assert "no space left" in lines[0] and "report_figures/" in lines[0] and ".png" in lines[0], lines
    assert not (tmp_path / "out" / "report.md").exists()


def test_ctrl_c_during_a_report_ends_it_and_writes_no_report(tmp_path):
    """`edps-analyze report` interrupted from the terminal (SIGINT to its process group) while it writes its
    figures: it ends (exit 130) and writes no report file."""
    import os
    import signal
    import subprocess
    import sys
    import time

    output = tmp_path / "out" / "report.md"
    output.parent.mkdir()
    process = subprocess.Popen([sys.executable, "-c", "from analysis.cli import main; main()", "report", "--csv",
                                str(_steps_csv(tmp_path, copies=10)), "--bootstrap", "0", "--output", str(output)],
                               start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # 60 figures: seconds between the first and the report, so a test process starved on a loaded machine
    # (CI once saw it finish between poll() and killpg with 18) still interrupts it mid-way
    figures = output.parent / "report_figures"
    deadline = time.monotonic() + 60
    while not (figures.is_dir() and any(figures.iterdir())) and process.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, f"the report ended (code {process.poll()}) before it could be interrupted"
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130 and "interrupted" in err, err
    assert not output.exists()
