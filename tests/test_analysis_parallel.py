"""How the report writes its figures fast: in forked processes (analysis.forked), the same files as
written in one process, a child's error as the one line the command gives for it, no process left behind, no
fork in a process with other threads; and log axes labelled in plain numbers, not in mathtext."""

import errno
import io
import math
import multiprocessing
import struct
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from xml.etree import ElementTree

import matplotlib
import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from analysis import forked, plots
from analysis.cli import main
from analysis.load import read_csv

BATCH_SIZES = [2, 4, 8, 16, 32, 64, 128, 256]


def _steps_csv(folder: Path) -> Path:
    """Two optimizers, two sparsities, timed: a steps, a sparsity and a time figure per optimizer (six
    figures)."""
    rows = []
    for optimizer, b_crit in (("sgd", 30), ("momentum", 60)):
        for sparsity, s_min in ((0.0, 60), (0.9, 90)):
            for b in BATCH_SIZES:
                rows.append({"workload": "w", "optimizer": optimizer, "sparsity": sparsity, "batch_size": b,
                             "goal_error": 0.1, "steps_to_result": float(round(s_min * (1 + b_crit / b))),
                             "trials_total": 4, "trials_reached": 4, "study_key": f"{optimizer}-{sparsity}-{b}",
                             "seconds_per_step": 0.0004 * (1 + b / 64) * math.sqrt(1 + sparsity)})
    path = folder / "steps.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _report(csv: Path, output: Path) -> dict[str, bytes]:
    main(["report", "--csv", str(csv), "--bootstrap", "0", "--output", str(output), "--svg"])
    return {p.name: p.read_bytes() for p in sorted((output.parent / f"{output.stem}_figures").iterdir())}


@pytest.fixture
def reproducible_svg(monkeypatch):
    """SVG files that depend on their figure only: no date, no random ids."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    with matplotlib.rc_context({"svg.hashsalt": "test"}):
        yield


def _png_size(data: bytes) -> tuple[int, int] | int:
    """A PNG's width and height; another file's length."""
    return struct.unpack(">II", data[16:24]) if data[:4] == b"\x89PNG" else len(data)


def _cpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(forked, "available_cpus", lambda: count)


class _CountingPool(ProcessPoolExecutor):
    """The pool, counting the figures handed to it."""

    submitted = 0
    pids: set[int] = set()

    def submit(self, *args, **kwargs):
        _CountingPool.submitted += 1
        future = super().submit(*args, **kwargs)
        _CountingPool.pids.update(self._processes or {})
        return future


def test_figures_written_in_parallel_are_those_written_in_one_process(tmp_path, monkeypatch, reproducible_svg):
    if not forked.forking_is_safe():
        pytest.skip("this test process has other threads: figures are never forked here")
    csv = _steps_csv(tmp_path)
    _cpus(monkeypatch, 1)
    serial = _report(csv, tmp_path / "serial" / "report.md")
    monkeypatch.setattr(forked, "ProcessPoolExecutor", _CountingPool)
    monkeypatch.setattr(_CountingPool, "submitted", 0)
    monkeypatch.setattr(_CountingPool, "pids", set())
    _cpus(monkeypatch, 2)
    parallel = _report(csv, tmp_path / "parallel" / "report.md")
    assert len(serial) == 12 and {Path(name).suffix for name in serial} == {".png", ".svg"}
    assert list(parallel) == list(serial)
    # The same pictures: byte for byte when this test runs alone; after other tests in the same process a few
    # PNGs differed in bytes (matplotlib's caches of fonts and text, filled differently by then), so what is
    # compared is what a reader sees: the same size and, pixel for pixel, at most a trace of difference (0.37 %
    # of one figure's pixels in one full run: the edges of a few glyphs; a missing line or a moved label is more).
    for name in serial:
        if name.endswith(".png"):
            assert _png_size(parallel[name]) == _png_size(serial[name]), name
            one, other = (matplotlib.image.imread(io.BytesIO(data)) for data in (serial[name], parallel[name]))
            assert np.mean(np.abs(one - other) > 0.1) < 0.01, (name, np.mean(np.abs(one - other) > 0.1))
        else:
            assert abs(len(parallel[name]) - len(serial[name])) <= 0.01 * len(serial[name]), name
            assert ElementTree.fromstring(parallel[name]).tag.endswith("svg"), name
    # every figure went to a child: after the start, the time figures, steps and sparsity comparison per optimizer
    assert _CountingPool.submitted == 1 + 2 + 2 * 2
    assert [p for p in multiprocessing.active_children() if p.pid in _CountingPool.pids] == []  # gone with the command


def _disk_full(figure, paths: list[Path]) -> None:
    raise OSError(errno.ENOSPC, "No space left on device", str(paths[0]))


def _error_line(tmp_path: Path, capsys, folder: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--csv", str(_steps_csv(tmp_path)), "--bootstrap", "0",
              "--output", str(tmp_path / folder / "report.md")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edps-analyze: error: "), lines
    return lines[0].replace(folder, "FOLDER")


def test_a_figure_that_cannot_be_written_is_the_commands_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plots, "_write", _disk_full)
    _cpus(monkeypatch, 1)
    serial = _error_line(tmp_path, capsys, "serial")
    monkeypatch.setattr(forked, "ProcessPoolExecutor", _CountingPool)
    monkeypatch.setattr(_CountingPool, "submitted", 0)
    monkeypatch.setattr(_CountingPool, "pids", set())
    _cpus(monkeypatch, 2)
    assert _error_line(tmp_path, capsys, "parallel") == serial
    assert "no space left" in serial and "report_figures/time_w_momentum.png" in serial
    assert _CountingPool.submitted or not forked.forking_is_safe()  # the error came from a child
    assert [p for p in multiprocessing.active_children() if p.pid in _CountingPool.pids] == []


def test_a_process_with_other_threads_writes_its_figures_itself(tmp_path, monkeypatch):
    def no_pool(*args, **kwargs):
        raise AssertionError("forked a process with other threads")

    monkeypatch.setattr(forked, "ProcessPoolExecutor", no_pool)
    _cpus(monkeypatch, 2)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="a store's thread")
    other.start()
    try:
        assert not forked.forking_is_safe()
        files = _report(_steps_csv(tmp_path), tmp_path / "report.md")
    finally:
        stop.set()
        other.join()
    assert len(files) == 12 and all(files.values())


def test_log_axes_are_labelled_in_plain_numbers(tmp_path):
    studies = read_csv(_steps_csv(tmp_path))
    figure = plots.draw_steps(studies, "w", "sgd")
    figure.draw_without_rendering()
    axis = figure.axes[0]
    labels = [t.get_text() for t in axis.get_xticklabels() + axis.get_yticklabels() if t.get_text()]
    assert {"4", "16", "64", "256"} <= set(labels), labels
    assert not [label for label in labels if "$" in label], labels  # no mathtext
    assert [plots._plain_number(v) for v in (1024.0, 0.5, 0.03125, 0.2, 2.0 ** 30)] == \
        ["1024", "0.5", "0.03125", "0.2", "1.074e+09"]


@settings(max_examples=25, deadline=None)
@given(base=st.sampled_from([2, 10]), low=st.floats(-12, 12), decades=st.floats(0.05, 12), y_low=st.floats(-5, 5),
       y_decades=st.floats(0.05, 3), inverted=st.booleans())
# a view that ends a hair beyond a decade on a long axis: matplotlib still draws that decade's tick
@example(base=10, low=-2 + 8.7e-10, decades=10.0, y_low=0.0, y_decades=1.0, inverted=False)
def test_log_axes_make_only_the_ticks_they_draw_and_look_the_same(base, low, decades, y_low, y_decades, inverted):
    """plots.InView: a log axis makes ticks only within its view, and the figure's pixels are those of the same
    axes with matplotlib's own locators (every tick and label that was drawn still is), at any view."""
    import matplotlib.pyplot as plt

    pixels, counts = [], []
    for in_view in (True, False):
        figure, axis = plt.subplots(figsize=(4, 3), dpi=60)
        axis.plot([1, 2], [1, 2])
        plots._log_scale(axis, "x", base)
        plots._log_scale(axis, "y", base)
        if not in_view:  # matplotlib's locators, as its log scale set them
            for ticks in (axis.xaxis, axis.yaxis):
                ticks.set_major_locator(ticks.get_major_locator().locator)
                ticks.set_minor_locator(ticks.get_minor_locator().locator)
        x = sorted((base ** low, base ** (low + decades)), reverse=inverted)
        axis.set_xlim(*x)
        axis.set_ylim(10.0 ** y_low, 10.0 ** (y_low + y_decades))
        figure.canvas.draw()
        pixels.append(np.asarray(figure.canvas.buffer_rgba()).copy())
        counts.append(len(axis.xaxis.get_major_ticks()) + len(axis.yaxis.get_minor_ticks()))
        plt.close(figure)
    np.testing.assert_array_equal(pixels[0], pixels[1])
    assert counts[0] <= counts[1]


def _dies(figure: int, paths: list[Path]) -> None:
    import os

    if figure == 1:
        os._exit(9)  # as the kernel's out-of-memory killer would end it: no word to the parent
    paths[0].write_text(str(figure))


def test_a_forked_process_that_dies_is_the_commands_one_line_error(tmp_path, monkeypatch):
    from edps_mlflow.errors import EdpsError

    if not forked.forking_is_safe():
        pytest.skip("this test process has other threads: nothing is forked here")
    monkeypatch.setattr(forked, "ProcessPoolExecutor", _CountingPool)
    monkeypatch.setattr(_CountingPool, "pids", set())
    for pause in (0.0, 1.0):  # the next figure handed over at once, or after the child has died
        with pytest.raises(EdpsError, match="ended abruptly"):
            with forked.writing_in_parallel(workers=2):
                for figure in (0, 1, 2):
                    forked.save(_dies, figure, [tmp_path / f"{figure}.txt"])
                    time.sleep(pause)
    assert [p for p in multiprocessing.active_children() if p.pid in _CountingPool.pids] == []
    with forked.writing_in_parallel(workers=2):  # the next block forks afresh
        for figure in (0, 2):
            forked.save(_dies, figure, [tmp_path / f"again-{figure}.txt"])
    assert [(tmp_path / f"again-{figure}.txt").read_text() for figure in (0, 2)] == ["0", "2"]


def _legend_beside(figure_legend: bool = False, far_text: bool = False):
    """A figure like the report's: its legend beside the axes, beyond the figure's edge (or a legend of the
    figure's own, or a text further out than the writer's margin)."""
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.0, 3.5))
    for k in range(3):
        axis.plot([1, 2, 4, 8], [8 - k, 4, 2 + k, 1], "o-", label=f"a line with a long label, number {k}")
    axis.set_title("a title\non two lines")
    if figure_legend:
        figure.legend(loc="upper left", bbox_to_anchor=(0.92, 0.9))
    else:
        axis.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    if far_text:
        figure.text(1.0 + 1.5 * plots.DRAW_MARGIN / 6.0, 0.5, "far out")
    plt.close(figure)
    return figure


@pytest.mark.parametrize("case", ["legend beside the axes", "a figure's own legend", "a text beyond the margin"])
def test_a_figure_is_written_whole_and_cropped_as_tight_would(tmp_path, case):
    """The PNG from one draw in a margin, cropped to its ink, holds what savefig's bbox_inches="tight" holds,
    in the same size to within the pad (the crop is the ink, "tight" the boxes of the texts, taller than their
    glyphs); figures it cannot
    move, or whose ink reaches the margin's end, are written the old way, whole; the SVG gets the same box."""
    import matplotlib.image

    options = {"figure_legend": case == "a figure's own legend", "far_text": case == "a text beyond the margin"}
    plots._write(_legend_beside(**options), [tmp_path / "one.png", tmp_path / "one.svg"])
    _legend_beside(**options).savefig(tmp_path / "tight.png", dpi=plots.PNG_DPI, bbox_inches="tight")
    written, tight = (matplotlib.image.imread(tmp_path / name) for name in ("one.png", "tight.png"))
    assert abs(written.shape[0] - tight.shape[0]) <= 10 and abs(written.shape[1] - tight.shape[1]) <= 10, \
        (written.shape, tight.shape)
    # Nothing cut: the ink reaches into the pad on no side (the pad is 0.1 inch: 15 pixels).
    ink = np.any(written[:, :, :3] < 0.99, axis=2)
    rows, columns = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    assert rows[0] >= 10 and columns[0] >= 10, (rows[0], columns[0])
    assert written.shape[0] - rows[-1] > 10 and written.shape[1] - columns[-1] > 10
    svg = (tmp_path / "one.svg").read_text()
    width_pt = float(svg.split('width="', 1)[1].split("pt", 1)[0])
    assert abs(width_pt / 72 * plots.PNG_DPI - written.shape[1]) <= 10, (width_pt, written.shape)


@pytest.mark.parametrize("how", ["the parent alone killed", "Ctrl-C"])
def test_a_report_stopped_midway_leaves_no_figure_writer_behind(tmp_path, how):
    """`edps-analyze report` killed outright (SIGKILL of the parent alone: it cannot stop its pool) or
    interrupted from the terminal (SIGINT to its process group) while its forked writers work: the writers end
    too, within a few seconds, and no report file is written."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    # The optimizers twice over under other names: twelve figures, so that the writers work for a few seconds.
    studies = pd.read_csv(_steps_csv(tmp_path))
    csv = tmp_path / "many.csv"
    pd.concat([studies.assign(optimizer=studies["optimizer"] + f"-{copy}", study_key=studies["study_key"] + f"-{copy}")
               for copy in range(2)]).to_csv(csv, index=False)
    output = tmp_path / "out" / "report.md"
    # On every CPU: a test process is pinned to one (conftest), and with one a report forks no writer.
    command = [sys.executable, "-c", "import os; os.sched_setaffinity(0, range(os.cpu_count())); "
               "from analysis.cli import main; main()", "report", "--csv", str(csv), "--bootstrap", "0",
               "--output", str(output)]
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: a report writes its figures itself")
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    parent = psutil.Process(process.pid)
    writers: list[psutil.Process] = []
    figures = output.parent / "report_figures"
    deadline = time.monotonic() + 60
    # The writers are forked as the report starts; it is stopped once they have written a figure.
    while not (writers and figures.is_dir() and any(figures.iterdir())) and process.poll() is None \
            and time.monotonic() < deadline:
        writers = parent.children(recursive=True)
        time.sleep(0.01)
    assert writers, f"the report ended (code {process.poll()}) before any figure writer was seen"
    if how == "Ctrl-C":
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.kill()
    process.wait(30)
    _, alive = psutil.wait_procs(writers, timeout=10)
    assert alive == [], [w.pid for w in alive]
    assert not output.exists()
    if how == "Ctrl-C":
        assert process.returncode != 0


_CTRL_C_BETWEEN_FORKS = """
import os, signal, sys
from concurrent.futures import process
from pathlib import Path
from analysis import forked

spawn = process.ProcessPoolExecutor._spawn_process
def spawn_then_ctrl_c(executor):  # the pool forks its children one by one, then starts the thread that ends them
    spawn(executor)
    os.kill(os.getpid(), signal.SIGINT)
process.ProcessPoolExecutor._spawn_process = spawn_then_ctrl_c

def write(figure, paths):
    paths[0].write_text(str(figure))

try:
    with forked.writing_in_parallel(workers=2):
        for figure in range(4):
            forked.save(write, figure, [Path(sys.argv[1]) / f"{figure}.txt"])
except KeyboardInterrupt:
    print("interrupted")
    sys.exit(130)
print("not interrupted")
"""


def test_ctrl_c_while_the_writers_are_forked_ends_the_command(tmp_path):
    """Ctrl-C between two forks of the pool's children, before the pool's thread has started (the moment the
    group's SIGINT met in CI): the command ends, with its writers. Raised there, the interrupt left children that
    nobody told to end, and the command waited for them at exit for ever."""
    import subprocess
    import sys

    import psutil

    process = subprocess.Popen([sys.executable, "-c", _CTRL_C_BETWEEN_FORKS, str(tmp_path)], start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        writers = psutil.Process(process.pid).children(recursive=True)
        process.kill()
        for writer in writers:
            writer.kill()
        pytest.fail(f"the interrupted command did not end ({len(writers)} writers left)")
    assert (process.returncode, out.strip()) == (130, "interrupted"), err


_REPORT_AND_ITS_IMPORTS = """
import os, sys
os.sched_setaffinity(0, range(os.cpu_count()))
from analysis.cli import main
try:
    main(sys.argv[1:])
except SystemExit as end:
    if end.code:
        raise
print("matplotlib" in sys.modules)
"""


def test_a_report_draws_in_its_forked_processes_and_never_imports_matplotlib(tmp_path):
    """`edps-analyze report` as a command runs it: its figures' processes are forked before it reads the
    store, import the plotting modules themselves, and draw and write every figure; the command itself never
    imports matplotlib (a third of a second, and its memory)."""
    import os
    import subprocess
    import sys

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: a report draws its figures itself")
    output = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-c", _REPORT_AND_ITS_IMPORTS, "report", "--csv", str(_steps_csv(tmp_path)),
                           "--bootstrap", "20", "--output", str(output)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False", done.stdout
    written = sorted(p.name for p in (tmp_path / "report_figures").iterdir())
    assert written == sorted(f"{kind}_w_{optimizer}.png" for kind in ("steps", "sparsity", "time")
                             for optimizer in ("momentum", "sgd")), written
    page = output.read_text()
    assert page.count("src='data:image/png;base64,") == len(written)
