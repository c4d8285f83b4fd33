"""The GitHub workflows a user copies (``.github/workflows/``): valid against GitHub's schema,
running what the README and ``ci/check.sh -h`` say, and checked by ``ci/check.sh``'s lint step."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
CHECK_JSONSCHEMA = shutil.which("check-jsonschema", path=os.path.dirname(sys.executable))


def _load(name: str) -> dict:
    return YAML(typ="safe").load((WORKFLOWS / name).read_text())  # YAML 1.2: `on` is a string


def _validate(*paths: Path) -> subprocess.CompletedProcess:
    assert CHECK_JSONSCHEMA is not None, "check-jsonschema (the test extra) is not installed"
    return subprocess.run(
        [CHECK_JSONSCHEMA, "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_shipped_workflows_are_valid():
    paths = sorted(WORKFLOWS.glob("*.yml"))
    assert [path.name for path in paths] == ["ci.yml", "nightly-gpu.yml"]
    done = _validate(*paths)
    assert done.returncode == 0, done.stdout + done.stderr


BREAKAGES = {
    "steps-misspelt": (("    steps:", "    step:"), "'step' was unexpected"),
    "runs-on-misspelt": (
        ("runs-on: ubuntu", "runs_on: ubuntu"),
        "'runs-on' is a required property",
    ),
    "unknown-event": (("  push:\n", "  pushed:\n"), "$.on: {'pushed': None, 'pull_request': None}"),
}


def test_a_broken_workflow_is_refused(tmp_path):
    text = (WORKFLOWS / "ci.yml").read_text()
    for name, ((old, new), _) in BREAKAGES.items():
        assert old in text
        (tmp_path / f"{name}.yml").write_text(text.replace(old, new, 1))
    done = _validate(*sorted(tmp_path.glob("*.yml")))
    assert done.returncode == 1, done.stdout + done.stderr
    for name, (_, message) in BREAKAGES.items():
        assert f"{name}.yml::" in done.stdout and message in done.stdout, (name, done.stdout)


def test_ci_runs_the_readmes_first_command_on_every_push_and_python():
    workflow = _load("ci.yml")
    assert "push" in workflow["on"]
    (job,) = workflow["jobs"].values()
    assert job["strategy"]["matrix"]["python-version"] == ["3.10", "3.11", "3.12", "3.13"]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs == ["ci/check.sh --ci-all"]
    assert "\nci/check.sh --ci-all      # set up .venv" in (ROOT / "README.md").read_text()
    setup = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/setup"))
    assert setup["with"]["python-version"] == "${{ matrix.python-version }}"


def test_the_nightly_runs_on_a_gpu_box_and_keeps_its_reports():
    workflow = _load("nightly-gpu.yml")
    assert [entry["cron"] for entry in workflow["on"]["schedule"]] == ["17 2 * * *"]
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "gpu"]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs == ["ci/check.sh --ci-all --cuda --nightly"]
    uploads = [step for step in job["steps"] if step.get("uses", "").startswith("actions/upload")]
    assert [step["with"]["path"] for step in uploads] == ["reports/nightly.xml", "reports/"]
    assert all(step["if"] == "${{ !cancelled() }}" for step in uploads)  # also after a failure
    help_text = subprocess.run(
        ["bash", str(ROOT / "ci" / "check.sh"), "-h"], capture_output=True, text=True
    ).stdout
    assert "JUnit XML and a one-page summary\n              written to reports/" in help_text


def test_check_sh_fails_on_a_broken_workflow(tmp_path):
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    repo = tmp_path / "repo"
    for name in listing.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    (repo / ".venv").symlink_to(sys.prefix)  # ci/check.sh --no-build uses .venv as it is
    ci = repo / ".github" / "workflows" / "ci.yml"
    ci.write_text(ci.read_text().replace("    steps:", "    step:", 1))
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    done = subprocess.run(
        ["bash", "ci/check.sh", "--no-build", "--no-test"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "+ check-jsonschema --builtin-schema vendor.github-workflows" in done.stdout
    assert "'step' was unexpected" in done.stdout
    assert "check passed." not in done.stdout
