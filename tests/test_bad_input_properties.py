"""Generated bad input: every invalid option value or environment setting is refused with exit code 2
and exactly one line on stderr, no traceback, and nothing written to the tracking store; every valid
spelling of a value gives the same spec (and keys) as its canonical spelling.

The commands run in this process (``EDPS_TRAINING_ENVIRONMENT=1``: no re-exec) for speed. Valid study
and sweep options are checked by catching the spec that the command hands to ``run_study`` /
``run_sweep``, so no test here trains.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

import analysis.cli
import edps_mlflow.cli
from edps_mlflow.config import PROBE_NAMES, StudySpec
from edps_mlflow.optimizers import optimizer_names

FIXTURES = Path(__file__).parent / "fixtures"
PROPERTY = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
TRIED: Counter = Counter()  # invalid inputs tried, by category (printed with -s)


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    print("\ninvalid inputs tried: " + ", ".join(f"{k} {v}" for k, v in sorted(TRIED.items())))


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A tracking store that must never come into existence, and no re-exec of the command."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(name, raising=False)
    directory = Path(tempfile.mkdtemp(dir=tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{directory / 'mlflow.db'}")
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")
    monkeypatch.chdir(directory)
    return directory / "mlflow.db"


def refused(main, argv: list[str], capsys, prefix: str, category: str) -> str:
    """Run ``main(argv)``; assert one clean error line and exit code 2; return the line."""
    TRIED[category] += 1
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert exit_info.value.code == 2, (argv, captured.err)
    assert len(lines) == 1 and lines[0].startswith(prefix), (argv, captured.err)
    assert "Traceback" not in captured.err + captured.out, argv
    return lines[0]


def edps_refused(argv: list[str], capsys, category: str = "CLI options") -> str:
    return refused(edps_mlflow.cli.main, argv, capsys, "edps: error: ", category)


# ---- invalid values, by option ----------------------------------------------------------------
GARBAGE = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                  min_size=1, max_size=12).filter(
    lambda t: not _is_number(t) and t.strip().lower() not in ("", "default", "workload", "none"))
NON_FINITE = st.sampled_from(["nan", "inf", "-inf", "NaN", "1e400", "-1e400"])


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


BAD_STUDY_OPTIONS = st.one_of(
    st.tuples(st.just("--bs"), st.one_of(st.integers(max_value=0), st.integers(min_value=1619, max_value=2**70))
              .map(str) | GARBAGE | NON_FINITE | st.just("1.5")),
    st.tuples(st.just("--sparsity"), st.one_of(
        st.floats(max_value=-1e-12).map(repr), st.floats(min_value=1.0).map(repr), NON_FINITE, GARBAGE)),
    st.tuples(st.just("--goal-error"), st.one_of(
        st.floats(max_value=0.0).map(repr), st.floats(min_value=1.0).map(repr), NON_FINITE, GARBAGE)),
    st.tuples(st.just("--max-steps"), st.one_of(
        st.sampled_from(["nan", "inf", "1e19", "-5", "0", "10.5", "1000000001", "1e400"]),
        st.integers(max_value=0).map(str), st.integers(min_value=10**9 + 1, max_value=2**80).map(str), GARBAGE)),
    st.tuples(st.just("--check-interval"), st.one_of(
        st.integers(max_value=0).map(str), st.integers(min_value=10**9 + 1, max_value=2**70).map(str),
        st.sampled_from(["0.5", "nan", "-inf"]), GARBAGE)),
    st.tuples(st.just("--trials"), st.one_of(
        st.integers(max_value=0).map(str), st.integers(min_value=100_001, max_value=2**70).map(str),
        st.sampled_from(["2.5", "inf"]), GARBAGE)),
    st.tuples(st.just("--seed"), st.one_of(
        st.integers(max_value=-1).map(str), st.integers(min_value=2**32, max_value=2**66).map(str),
        st.sampled_from(["1e3", "nan"]), GARBAGE)),
    st.tuples(st.just("--probes"), st.text(alphabet="abcdefghijklmnopqrstuvwxyz_,", min_size=1, max_size=20).filter(
        lambda t: any(p.strip() and p.strip() not in PROBE_NAMES for p in t.split(",")))),
    st.tuples(st.just("--probe-interval"), st.one_of(st.integers(max_value=0).map(str), GARBAGE)),
    st.tuples(st.just("--log-interval"), st.one_of(NON_FINITE, st.just("0"), st.just("-1"), GARBAGE)),
    st.tuples(st.just("--workers"), st.one_of(st.integers(max_value=0).map(str), GARBAGE)),
    st.tuples(st.just("--optimizer"), GARBAGE.filter(lambda t: t not in optimizer_names())),
    st.tuples(st.just("--full-trials"), GARBAGE.filter(
        lambda t: t.strip().lower() not in ("1", "0", "true", "false", "t", "f", "yes", "no", "y", "n", "on", "off"))),
    st.tuples(st.just("--experiment"), st.sampled_from(["", " ", "\t"])),
)


@PROPERTY
@given(option=BAD_STUDY_OPTIONS)
def test_invalid_study_options_are_refused_in_one_line(option, store, capsys):
    edps_refused(["study", *option], capsys)
    assert not store.exists()


BAD_SWEEP_OPTIONS = st.one_of(
    st.tuples(st.just("--batch-sizes"), st.one_of(
        st.sampled_from(["0..4", "3..64", "16,16", "-4", "16,,32", "1..2**10", "64..2", "4096", "0", "1e3",
                         "1..99999999999999999999999", "2...8", ",", "16;32"]),
        st.lists(st.integers(min_value=-2**40, max_value=0), min_size=1, max_size=4).map(
            lambda xs: ",".join(map(str, xs))),
        GARBAGE)),
    st.tuples(st.just("--sparsities"), st.one_of(
        st.lists(st.one_of(st.floats(max_value=-1e-12), st.floats(min_value=1.0), st.just(math.nan)),
                 min_size=1, max_size=3).map(lambda xs: ",".join(map(repr, xs))),
        st.sampled_from(["", "0,-0.0", "0,0", "0.5,,0.9", "nan", "inf", "1e400", "0;0.5"]), GARBAGE)),
    st.tuples(st.just("--optimizers"), st.sampled_from(["", "sgd,sgd", "sgd,lbfgs", ",", "SGD"])),
    st.tuples(st.just("--executor"), GARBAGE.filter(lambda t: t not in ("local", "ray"))),
    st.tuples(st.just("--max-steps"), st.sampled_from(["nan", "inf", "1e19", "-5", "5"])),
    st.tuples(st.just("--seed"), st.integers(min_value=2**32, max_value=2**64).map(str)),
)


@PROPERTY
@given(option=BAD_SWEEP_OPTIONS)
def test_invalid_sweep_options_are_refused_in_one_line(option, store, capsys):
    arguments = ["sweep", *option] if option[0] == "--batch-sizes" else ["sweep", "--batch-sizes", "16", *option]
    edps_refused(arguments, capsys)
    assert not store.exists()


# ---- valid spellings give the canonical spec --------------------------------------------------
def _captured_spec(monkeypatch, argv: list[str]):
    """The spec the command would run, without running it."""
    import edps_mlflow.study
    import edps_mlflow.sweep

    seen = []
    monkeypatch.setattr(edps_mlflow.study, "run_study", lambda spec, options: seen.append(spec))
    monkeypatch.setattr(edps_mlflow.sweep, "run_sweep", lambda spec, options: seen.append(spec))
    edps_mlflow.cli.main(argv)
    assert len(seen) == 1
    return seen[0]


def _spellings(value: int) -> st.SearchStrategy[str]:
    options = [str(value), f"{value}.0", f" {value} ", f"{value:e}"]
    if value % 1000 == 0:
        options.append(f"{value // 1000}e3")
    return st.sampled_from(options)


@PROPERTY
@given(data=st.data(), sparsity=st.sampled_from([0.0, 0.5, 0.9, 0.25]),
       max_steps=st.sampled_from([100, 1000, 3000, 20_000]), check_interval=st.sampled_from([10, 50, 100]),
       seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_spellings_of_a_study_give_the_canonical_spec(data, sparsity, max_steps, check_interval, seed, store,
                                                        monkeypatch):
    sparsity_text = data.draw(st.sampled_from(
        [repr(sparsity), f"{sparsity:e}", f"{sparsity}0", f"{-sparsity!r}" if sparsity == 0 else repr(sparsity)]))
    argv = ["study", "--bs", "64", "--sparsity", sparsity_text, "--max-steps", data.draw(_spellings(max_steps)),
            "--check-interval", data.draw(_spellings(check_interval)), "--seed", str(seed),
            "--goal-error", data.draw(st.sampled_from(["0.05", "5e-2", "0.050", ".05"]))]
    spec = _captured_spec(monkeypatch, argv)
    canonical = StudySpec.build("digits-simple-cnn", "sgd", sparsity, 64, None, 0.05, max_steps, check_interval, seed)
    assert spec == canonical and spec.study_key == canonical.study_key
    assert math.copysign(1.0, spec.sparsity) == 1.0  # -0.0 became 0.0
    assert not store.exists()


@PROPERTY
@given(sparsities=st.lists(st.sampled_from(["0", "-0.0", "0.5", "5e-1", "0.9", "9e-1"]), min_size=1, max_size=3),
       max_steps=st.sampled_from(["1000", "1e3", "1000.0"]))
def test_spellings_of_a_sweep_give_the_canonical_spec(sparsities, max_steps, store, monkeypatch, capsys):
    from edps_mlflow.sweep import SweepSpec

    values = [float(s) + 0.0 for s in sparsities]
    argv = ["sweep", "--batch-sizes", "16,64", "--sparsities", ",".join(sparsities), "--max-steps", max_steps]
    if len(set(values)) < len(values):
        edps_refused(argv, capsys)  # one value spelled twice is refused, not run twice
        return
    spec = _captured_spec(monkeypatch, argv)
    canonical = SweepSpec.build("digits-simple-cnn", ("sgd",), (16, 64), tuple(values), None, None, 1000)
    assert spec == canonical and spec.sweep_key == canonical.sweep_key


# ---- edps-analyze options ---------------------------------------------------------------------
STEPS_CSV = str(FIXTURES / "synthetic_steps.csv")
BAD_ANALYSIS_OPTIONS = st.one_of(
    st.tuples(st.just("--tolerance"), st.one_of(
        st.floats(max_value=0.0).map(repr), st.floats(min_value=10.0).map(repr), NON_FINITE, GARBAGE)),
    st.tuples(st.just("--bootstrap"), st.one_of(
        st.integers(max_value=-1).map(str), st.integers(min_value=100_001, max_value=2**70).map(str), GARBAGE,
        st.just("1.5"))),
    st.tuples(st.just("--seed"), st.one_of(
        st.integers(max_value=-1).map(str), st.integers(min_value=2**32, max_value=2**70).map(str), GARBAGE)),
    st.tuples(st.just("--sparsity"), st.one_of(
        st.floats(max_value=-1e-12).map(repr), st.floats(min_value=1.0).map(repr), NON_FINITE, GARBAGE)),
    st.tuples(st.just("--format"), GARBAGE.filter(lambda t: t not in ("table", "csv", "json"))),
)


@PROPERTY
@given(option=BAD_ANALYSIS_OPTIONS, command=st.sampled_from(["fit", "report"]))
def test_invalid_analysis_options_are_refused_in_one_line(option, command, store, capsys):
    if command == "report" and option[0] == "--format":
        return
    refused(analysis.cli.main, [command, "--csv", STEPS_CSV, *option], capsys, "edps-analyze: error: ",
            "CLI options")
    assert not store.exists() and not (store.parent / "report.md").exists()


@PROPERTY
@given(tolerance=st.one_of(st.floats(max_value=0.0).map(repr), NON_FINITE, GARBAGE))
def test_invalid_plot_tolerance_is_refused(tolerance, store, capsys):
    refused(analysis.cli.main, ["plot", "--csv", STEPS_CSV, "--out-dir", str(store.parent / "fig"),
                                "--tolerance", tolerance], capsys, "edps-analyze: error: ", "CLI options")
    assert not (store.parent / "fig").exists()


BAD_COST_OPTIONS = st.one_of(
    st.tuples(st.just("--bandwidth"), st.one_of(st.floats(max_value=0.0).map(repr), NON_FINITE, GARBAGE)),
    st.tuples(st.just("--latency"), st.one_of(st.floats(max_value=-1e-12).map(repr), NON_FINITE, GARBAGE)),
    st.tuples(st.just("--devices"), st.one_of(
        st.integers(max_value=0).map(str), st.floats(min_value=1.1, max_value=100).map(repr), GARBAGE,
        st.lists(st.integers(1, 64), min_size=1, max_size=4).map(lambda v: ",".join(map(str, v + v[:1]))))),
)


@PROPERTY
@given(option=BAD_COST_OPTIONS, command=st.sampled_from(["time", "report"]))
def test_invalid_cost_model_options_are_refused_in_one_line(option, command, store, capsys):
    refused(analysis.cli.main, [command, "--csv", STEPS_CSV, "--out-dir" if command == "time" else "--output",
                                str(store.parent / ("fig" if command == "time" else "report.md")), *option],
            capsys, "edps-analyze: error: ", "CLI options")
    assert not (store.parent / "fig").exists() and not (store.parent / "report.md").exists()


# ---- environment variables ------------------------------------------------------------------
TINY_STUDY = ["study", "--bs", "64", "--trials", "1", "--max-steps", "20", "--check-interval", "10"]
TINY_SWEEP = ["sweep", "--batch-sizes", "64", "--trials", "1", "--max-steps", "20", "--check-interval", "10"]


@pytest.mark.parametrize("argv", [
    ["study", "--workload", "mnist-simple-cnn", "--bs", "64"], ["data", "list"], ["data", "download", "mnist"]])
def test_data_dir_that_is_a_file(argv, store, monkeypatch, capsys):
    not_a_directory = store.parent / "data.txt"
    not_a_directory.write_text("not a directory")
    monkeypatch.setenv("EDPS_DATA_DIR", str(not_a_directory))
    line = edps_refused(argv, capsys, "env vars")
    assert f"EDPS_DATA_DIR {not_a_directory} is not a directory" in line
    assert not store.exists()


@pytest.mark.parametrize("mirror", ["not a url", "ftp://mirror.example/mnist", "file:///etc", "//x/y"])
def test_data_mirror_that_is_not_a_url(mirror, store, monkeypatch, capsys):
    monkeypatch.setenv("EDPS_DATA_MIRROR", mirror)
    line = edps_refused(["data", "download", "mnist", "--data-dir", str(store.parent / "data")], capsys, "env vars")
    assert "EDPS_DATA_MIRROR must be an http:// or https:// URL" in line
    assert not (store.parent / "data" / "mnist").exists()


STORE_COMMANDS = [
    (edps_mlflow.cli.main, ["status", "--experiment", "x"], "edps: error: "),
    (edps_mlflow.cli.main, TINY_STUDY, "edps: error: "),
    (edps_mlflow.cli.main, TINY_SWEEP, "edps: error: "),
    (analysis.cli.main, ["fit", "--experiment", "x"], "edps-analyze: error: "),
]


@pytest.mark.parametrize("uri", ["foo://x", "file:///nowhere/mlruns", "http://127.0.0.1:1", "postgresql://u:p@127.0.0.1:1/db"])
@pytest.mark.parametrize("main,argv,prefix", STORE_COMMANDS)
def test_tracking_uri_that_cannot_work(uri, main, argv, prefix, store, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # An unreachable server must fail fast, not after MLflow's minutes of retries.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    line = refused(main, argv, capsys, prefix, "URIs")
    assert "tracking store" in line and "u:p@" not in line


@pytest.mark.parametrize("main,argv,prefix", [c for c in STORE_COMMANDS if c[1][0] in ("status", "fit")]
                         + [(edps_mlflow.cli.main, ["doctor"], "edps: error: ")])
def test_readers_do_not_create_a_missing_store(main, argv, prefix, store, capsys):
    line = refused(main, argv, capsys, prefix, "URIs")
    assert "no tracking store at" in line and not store.exists()
    assert "MLFLOW_TRACKING_URI, or edps-analyze's --tracking-uri," in line  # edps has no --tracking-uri


@pytest.mark.parametrize("argv", [TINY_STUDY, TINY_SWEEP])
def test_experiment_name_of_a_deleted_experiment(argv, store, monkeypatch, capsys):
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    client.delete_experiment(client.create_experiment("gone"))
    runs_before = len(client.search_runs([e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)],
                                         run_view_type=ViewType.ALL))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "gone")
    capsys.readouterr()  # MLflow's own log lines while this test created the store
    line = edps_refused(argv, capsys, "env vars")
    assert "experiment 'gone' is deleted" in line
    after = client.search_runs([e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)],
                               run_view_type=ViewType.ALL)
    assert len(after) == runs_before == 0
