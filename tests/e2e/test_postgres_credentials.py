"""A shared study on PostgreSQL with a password-protected role: the password is in no
output, file or worker command line, and the study is reopened with the password kept in
AUTOTUNE_STORAGE or PGPASSWORD (issue 29)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY_SPACE

from autotune.output.export import FORMATS

ROLE = "autotune_secret"
SPACE = TINY_SPACE.replace("budget: {n_trials: 3}", "budget: {n_trials: 2}")


def _postgres_role(password: str) -> tuple[str, str]:
    """A fresh role with ``password`` owning a fresh database on the CI's server: its URL
    with the password and without."""
    admin = os.environ.get("AUTOTUNE_TEST_POSTGRES")
    if not admin:
        pytest.skip("set AUTOTUNE_TEST_POSTGRES (.ci/run starts a server) to run this")
    import sqlalchemy

    engine = sqlalchemy.create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {ROLE} WITH (FORCE)"))
        conn.execute(sqlalchemy.text(f"DROP ROLE IF EXISTS {ROLE}"))
        conn.execute(sqlalchemy.text(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{password}'"))
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {ROLE} OWNER {ROLE}"))
    engine.dispose()
    url = sqlalchemy.make_url(admin)
    where = f"{url.host}:{url.port or 5432}/{ROLE}"
    return (
        f"postgresql+psycopg2://{ROLE}:{password}@{where}",
        f"postgresql+psycopg2://{ROLE}@{where}",
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOTUNE_STORAGE", "PGPASSWORD")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _autotune(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _command_lines(skip: int) -> dict[int, str]:
    """Every process's command line but ``skip``'s (the run the user typed)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != skip:
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                pass
    return out


def _password_needed(url: str) -> bool:
    """Whether the server refuses the role without its password (the CI's does)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect():
            return False
    except sqlalchemy.exc.OperationalError:
        return True
    finally:
        engine.dispose()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_a_password_in_the_storage_url_leaks_nowhere(write_space, tmp_path):
    secret = f"Hush{secrets.token_hex(8)}"
    url, bare = _postgres_role(secret)
    space = write_space(SPACE)
    logs = tmp_path / "logs"
    logs.mkdir()
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "autotune", "run", str(space), "--storage", url]
    cmd += ["--jobs", "2", "--out", str(runs)]
    with open(logs / "out", "w") as out, open(logs / "err", "w") as err:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=out, stderr=err)
        workers, leaked, seen = set(), {}, {}
        deadline = time.monotonic() + 300
        while proc.poll() is None:
            assert time.monotonic() < deadline, "autotune run did not finish"
            lines = _command_lines(skip=proc.pid)
            for pid, line in lines.items():
                # Seen in two polls in a row: a child between its fork and its exec has
                # the typed command line for a moment (the suite saw one, 2026-12-07);
                # a process that keeps the password in its argv keeps it.
                if secret in line and seen.get(pid) == line:
                    leaked[pid] = line.replace("\0", " ")
                args = line.split("\0")
                if "--worker-index" in args and str(space) in args:
                    workers.add(args[args.index("--worker-index") + 1])
            seen = {pid: line for pid, line in lines.items() if secret in line}
            time.sleep(0.05)
    stdout, stderr = (logs / "out").read_text(), (logs / "err").read_text()
    assert proc.returncode == 0, stdout + stderr
    assert workers == {"0", "1"}  # both workers were seen while they ran...
    assert leaked == {}  # ...and no process but the one typed had the password in argv
    assert f"{ROLE}:***@" in stdout  # each worker's first line, redacted
    assert "recommended (trial #" in stdout

    # Reopened with the password where the user keeps it: AUTOTUNE_STORAGE...
    shown = _autotune("show", str(space), cwd=tmp_path, AUTOTUNE_STORAGE=url)
    assert shown.returncode == 0 and "recommended (trial #" in shown.stdout, shown.stderr
    report = _autotune(
        "report", str(space), "--no-profile", "--out", str(runs), cwd=tmp_path, AUTOTUNE_STORAGE=url
    )
    assert report.returncode == 0, report.stderr
    assert f"{ROLE}:***@" in (runs / "space/report/index.html").read_text()
    assert f"{ROLE}:***@" in (runs / "space/report/report.json").read_text()
    # every export format, from the study (one interpreter: `autotune export` each)
    outs = {fmt: tmp_path / f"export.{fmt}" for fmt in FORMATS}
    calls = [["export", str(space), "-f", fmt, "-o", str(out)] for fmt, out in outs.items()]
    best = runs / "space/best_config.yaml"
    calls.append(["export", str(best), "-f", "json", "-o", str(tmp_path / "best.json")])
    code = f"from autotune.cli import main\nfor a in {calls!r}:\n    assert main(a) == 0, a"
    exported = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_env(AUTOTUNE_STORAGE=url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exported.returncode == 0, exported.stderr
    assert all(out.read_text() for out in outs.values())
    # ...or PGPASSWORD, read by libpq, with a URL without a password
    pg = _autotune("show", str(space), "--storage", bare, cwd=tmp_path, PGPASSWORD=secret)
    assert pg.returncode == 0 and "recommended (trial #" in pg.stdout, pg.stderr
    if _password_needed(bare):  # so the password above was really asked for
        refused = _autotune("show", str(space), "--storage", bare, cwd=tmp_path)
        assert refused.returncode == 1 and "autotune: error:" in refused.stderr
    for done in [shown, report, exported, pg]:
        assert done.returncode == 0, done.stderr
        assert secret not in done.stdout + done.stderr

    assert f"{ROLE}:***@" in best.read_text()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "spec.json" for p in files)  # the trial folders are among them
    holding = [str(p) for p in files if secret.encode() in p.read_bytes()]
    assert holding == []
