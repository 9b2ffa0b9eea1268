"""No piece of a password printed. A tracking URI whose user information is not validly percent-encoded (RFC
3986) is refused before any connection, in one line that quotes none of it; and no line of any command quotes
any part of the user information, whatever it holds: generated passwords over every character class, against
unreachable hosts, a real `mlflow server` with basic auth and the machine's PostgreSQL (docs/reliability.md)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import socket
import string
import subprocess
from urllib.parse import quote, unquote

import pytest
from conftest import _free_port, edps_here
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.exceptions import MlflowException
from mlflow.server.auth.client import AuthServiceClient
from mlflow.tracking import MlflowClient
from test_authenticated_server import ADMIN, PASSWORD, auth_server  # noqa: F401 - a fixture
from test_sweep import _postgres_available

import analysis.cli

# Every three consecutive characters of a generated password or user name hold a marker, a character that our
# lines never hold, so that a piece of it found in a line is a leak, not our own words.
MARKERS = "QZßЖ€"
USER = "edpsQZ"
_ENCODINGS = st.sampled_from(["%41", "%2F", "%40", "%25", "%E2%82%AC", "%", "%4", "%zz", "%G1"])
_ASCII = st.one_of(st.sampled_from(string.ascii_letters + string.digits + "-._~!$&'()*+,;="),
                   st.sampled_from(string.punctuation + " \t\n"), _ENCODINGS)
_ANY = st.one_of(_ASCII, st.characters(min_codepoint=0xA0, max_codepoint=0x1F600, categories=("L", "N", "S")))


def _passwords(markers: str, tokens: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    segment = st.tuples(st.sampled_from(markers), st.lists(tokens, max_size=2)).map(lambda s: s[0] + "".join(s[1]))
    return st.lists(segment, min_size=3, max_size=8).map("".join)


# ASCII ones (often valid as typed, and sendable by HTTP basic authentication), and any.
PASSWORDS = st.one_of(_passwords("QZ", _ASCII), _passwords(MARKERS, _ANY))


def _valid(text: str) -> bool:
    """RFC 3986 userinfo without ':', written out character by character (the oracle of uris.userinfo_fault)."""
    allowed = set(string.ascii_letters + string.digits + "-._~" + "!$&'()*+,;=")
    at = 0
    while at < len(text):
        if text[at] == "%":
            if not all(c in string.hexdigits for c in text[at + 1:at + 3]) or len(text[at + 1:at + 3]) < 2:
                return False
            at += 3
        elif text[at] in allowed:
            at += 1
        else:
            return False
    return True


def assert_no_piece(printed: str, *secrets: str) -> None:
    """No piece of three characters of a secret (as typed or percent-decoded) that holds a marker, and no
    character named by its position (a codec's message)."""
    for spelling in {spelling for secret in secrets for spelling in (secret, unquote(secret))}:
        for start in range(len(spelling) - 2):
            piece = spelling[start:start + 3]
            assert not (set(piece) & set(MARKERS)) or piece not in printed, (piece, printed)
    assert re.search(r"position \d|codec", printed) is None, printed


def edps_analyze_here(args: list[str]) -> tuple[int, str]:
    printed = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            analysis.cli.main(args)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, printed.getvalue()


@given(user=PASSWORDS, password=PASSWORDS, scheme=st.sampled_from(["http", "postgresql+psycopg2", "mysql"]))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_user_information_that_is_not_validly_encoded_is_refused_in_words(user, password, scheme):
    from edps_mlflow.uris import (
        userinfo_fault,  # not on main: the tests below show what it changes
    )

    user = user.replace(":", "")  # the first ':' ends the user name
    uri = f"{scheme}://{user}:{password}@db.example:5432/mlflow"
    fault = userinfo_fault(uri)
    assert (fault is None) == (_valid(user) and _valid(password.replace(":", ""))), (uri, fault)
    assert userinfo_fault(f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@db.example/x") is None
    if fault is not None:
        assert fault.startswith(f"the {'password' if _valid(user) else 'user name'} in the tracking URI has ")
        assert fault.endswith(f": {scheme}://***:***@db.example:5432/mlflow")
        assert_no_piece(fault, user, password)


@pytest.mark.parametrize("uri", ["sqlite:////tmp/a@b/mlflow.db", "file:///tmp/x@y", "http://host:5000/x",
                                 "http://user@host", "https://u:p%40ss@host/x", "postgresql://u:@/db", "mlruns",
                                 "postgresql://u:pa:ss@host/db"])
def test_uris_without_faults(uri):
    from edps_mlflow.uris import userinfo_fault

    assert userinfo_fault(uri) is None


@pytest.fixture
def listening():
    """A port that listens and must see no connection: a refused URI reaches no store."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server.getsockname()[1]
    with pytest.raises(BlockingIOError):
        server.accept()
    server.close()


TINY = ["--trials", "1", "--max-steps", "20", "--check-interval", "10"]


@pytest.mark.parametrize("scheme", ["http", "postgresql+psycopg2"])
@pytest.mark.parametrize("command,environment", [
    (["study", "--bs", "64", *TINY], {}), (["study", "--bs", "64", *TINY], {"MLFLOW_RUN_ID": "0" * 32}),
    (["sweep", "--batch-sizes", "64", *TINY], {}), (["status"], {}), (["doctor"], {}), (["analyze"], {}),
    (["analyze", "--tracking-uri"], {})])
def test_every_entry_refuses_before_any_connection(command, environment, scheme, listening, tmp_path, monkeypatch):
    """The password of the issue: an '@' and a '/' that a driver would cut into a host name and a path. Each
    command, the MLproject's entry point (`mlflow run` sets MLFLOW_RUN_ID) and edps-analyze's --tracking-uri."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    uri = f"{scheme}://{USER}:ZVy08@127/ZQ@127.0.0.1:{listening}/db"
    if command[0] == "analyze":
        csv = ["--csv", os.path.join(os.path.dirname(__file__), "fixtures", "synthetic_steps.csv"), "--log-to-mlflow"]
        given = [uri] if command[1:] else []
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///unused.db" if given else uri)
        code, printed = edps_analyze_here(["fit", *command[1:], *given, *csv])
    else:
        code, printed = edps_here(command, uri, **environment)
    prefix = "edps-analyze: error: " if command[0] == "analyze" else "edps: error: "
    assert code == 2 and printed.count("\n") == 1, printed
    assert printed.startswith(f"{prefix}the password in the tracking URI has a character that must be "
                              f"percent-encoded (@ as %40, / as %2F"), printed
    assert printed.strip().endswith(f"{scheme}://***:***@127.0.0.1:{listening}/db"), printed
    assert_no_piece(printed, USER, "ZVy08@127/ZQ")


def check_commands(password: str, stores: list[str]) -> None:
    """What `edps status` printed against each store, and `edps-analyze fit --tracking-uri` against the first,
    with the password as typed (refused unless valid) and percent-encoded; each checked for pieces of it."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"  # put back after the test, as all of the environment
    done = []
    for secret in (password, quote(password, safe="")):
        uris = [store.format(user=USER, password=secret) for store in stores]
        done += [edps_here(["status"], uri) for uri in uris] + [edps_analyze_here(["fit", "--tracking-uri", uris[0]])]
    for code, printed in done:
        assert code in (0, 2) and "Traceback" not in printed, printed
        assert_no_piece(printed, USER, password)


@given(password=PASSWORDS)
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_piece_of_any_password_is_printed_by_unreachable_stores(password, tmp_path):
    """The client fails: a port that refuses, a host that does not resolve, a character that HTTP basic
    authentication cannot send (also a password of MLFLOW_TRACKING_PASSWORD)."""
    os.chdir(tmp_path)
    closed = f"127.0.0.1:{_free_port()}"
    check_commands(password, [f"http://{{user}}:{{password}}@{closed}",
                                   "http://{user}:{password}@edps-nowhere.invalid:5000",
                                   "postgresql+psycopg2://{user}:{password}@edps-nowhere.invalid:5432/mlflow"])
    code, printed = edps_here(["status"], f"http://{closed}", MLFLOW_TRACKING_USERNAME=USER,
                              MLFLOW_TRACKING_PASSWORD=password)
    assert code == 2, printed
    assert_no_piece(printed, USER, password)


@pytest.fixture(scope="module")
def postgres_role():
    """A role of the machine's PostgreSQL with a database of its own, migrated, and a connection of the role's
    own, by which it sets its password."""
    reason = _postgres_available()
    if reason:
        pytest.skip(reason)
    subprocess.run(["pg_ctlcluster", "15", "main", "start"], capture_output=True, check=False)
    sql = (f'DROP DATABASE IF EXISTS edps_secrets; DROP ROLE IF EXISTS "{USER}"; '
           f'CREATE ROLE "{USER}" LOGIN PASSWORD \'start\'; CREATE DATABASE edps_secrets OWNER "{USER}";')
    done = subprocess.run(["su", "postgres", "-c", "psql -q -v ON_ERROR_STOP=1"], input=sql, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    import psycopg2

    connection = psycopg2.connect(host="127.0.0.1", user=USER, password="start", dbname="edps_secrets")
    connection.autocommit = True
    MlflowClient(f"postgresql+psycopg2://{USER}:start@127.0.0.1:5432/edps_secrets").search_experiments()
    yield connection
    connection.close()


# The characters a driver cuts a URI at, or HTTP basic authentication cannot send ('密': not latin-1).
NASTY = ["@", "/", ":", "%", "#", "?", " ", "ü", "密"]


@pytest.mark.slow
def test_no_piece_of_a_nasty_password_is_printed_by_stores_that_check_it(
        auth_server, postgres_role, tmp_path, monkeypatch):  # noqa: F811 - the fixture imported above
    """Each password set on a real `mlflow server` with basic auth and on a PostgreSQL role: percent-encoded, it
    works (on HTTP where basic authentication can send it, else a line in our words; the store is empty); a wrong
    one is refused by the store; no line names the password or the user."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    stores = [auth_server.replace("http://", "http://{user}:{password}@"),
              "postgresql+psycopg2://{user}:{password}@127.0.0.1:5432/edps_secrets"]
    for character in NASTY:
        password = f"QZ{character}Vy08{character}ZQ-pass"
        with monkeypatch.context() as admin:
            admin.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
            admin.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
            users = AuthServiceClient(auth_server)
            with contextlib.suppress(MlflowException):
                users.create_user(USER, "initial-QZ-password")
            users.update_user_password(USER, password)
        postgres_role.cursor().execute("ALTER ROLE CURRENT_USER PASSWORD %s", (password,))
        reached = "the tracking store holds no study runs yet"  # the store answered: the password worked
        # The server reads basic authentication as UTF-8, the client sends latin-1: 'ü' is refused, '密' not sent.
        http = (reached if password.isascii() else "error code 401" if max(map(ord, password)) < 256 else
                "basic authentication sends latin-1 characters only")
        for store, outcome, refusal in zip(stores, (http, reached),
                                           ("error code 401", "the store refused the user name or password")):
            code, printed = edps_here(["status"], store.format(user=USER, password=quote(password, safe="")))
            assert code == 2 and outcome in printed, printed
            assert_no_piece(printed, USER, password)
            code, printed = edps_here(["status"], store.format(user=USER, password=quote(password + "Q", safe="")))
            assert code == 2 and (refusal if outcome == reached else outcome) in printed, printed
            assert_no_piece(printed, USER, password + "Q")


def test_a_database_store_without_its_driver_says_what_to_install(tmp_path, monkeypatch):
    """`postgresql://` is SQLAlchemy's psycopg (version 3), not installed here: the line names the package."""
    monkeypatch.chdir(tmp_path)
    pytest.importorskip("psycopg2")
    if importlib.util.find_spec("psycopg") is not None:
        pytest.skip("psycopg is installed here")
    uri = f"postgresql://{USER}:QZ-pass@127.0.0.1:{_free_port()}/mlflow"
    code, printed = edps_here(["status"], uri)
    assert code == 2 and printed.count("\n") == 1, printed
    assert "pip install 'psycopg[binary]'" in printed and "postgresql+psycopg2://" in printed, printed
    code, printed = edps_analyze_here(["fit", "--tracking-uri", uri])
    assert code == 2 and "pip install 'psycopg[binary]'" in printed, printed
